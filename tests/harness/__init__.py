"""Test harness shared by the whole suite: a real OTLP collector and the eBPF availability gate."""
