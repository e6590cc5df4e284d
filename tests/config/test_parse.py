"""otelbpf.config.parse: YAML errors with file, line and column; duplicate keys; empty,
missing and non-mapping files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.config_text import MINIMAL, one_error
from otelbpf.config import ConfigError
from otelbpf.families.registry import load_config


def test_yaml_syntax_error_shows_file_line_and_column(tmp_path: Path):
    path = tmp_path / "broken.yaml"
    path.write_text("receivers:\n  cuda: {libraries: [cudart\nservice: {}\n")

    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})

    assert re.fullmatch(rf"{re.escape(str(path))}:3:8: invalid YAML: .+", caught.value.errors[0])


def test_duplicate_keys_are_refused():
    error = one_error(MINIMAL + "receivers: {}\n")

    assert error == "test.yaml:8:1: invalid YAML: duplicate key 'receivers' (first written on line 1)"


def test_empty_missing_and_non_mapping_files(tmp_path: Path):
    assert "the file is empty" in one_error("")
    assert "the top level must be a mapping" in one_error("- cuda\n")
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.yaml", env={})
