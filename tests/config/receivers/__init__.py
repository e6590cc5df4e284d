"""Tests of otelbpf.config.receivers: one module per probe family's options."""
