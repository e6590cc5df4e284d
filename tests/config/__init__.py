"""Tests of otelbpf.config, mirroring the package (a package so that its module names, like
test_model, never clash with other folders' tests)."""
