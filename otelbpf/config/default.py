"""The built-in default configuration: ``otelbpf.yaml`` beside this module, shipped in the
package (package data), every option documented with its default. It is what the agent runs
with when no config file is given, and the example that error messages point to."""

from __future__ import annotations

from importlib import resources

#: Where the documented default lies (in the repository or the installed package).
DEFAULT_CONFIG_PATH = str(resources.files("otelbpf.config").joinpath("otelbpf.yaml"))
#: The built-in configuration, used when no file is given.
DEFAULT_CONFIG_YAML = resources.files("otelbpf.config").joinpath("otelbpf.yaml").read_text(encoding="utf-8")
#: How errors name the built-in configuration.
DEFAULT_SOURCE = "<built-in default>"
#: What a message about a missing or empty file suggests.
EXAMPLE_HINT = f"see {DEFAULT_CONFIG_PATH} for a documented example"
