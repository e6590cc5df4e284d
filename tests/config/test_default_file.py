"""otelbpf/config/otelbpf.yaml and the models agree: every option of every component model is
written in the file with the model's default, and the file loads to exactly those defaults.

Components the default pipelines use (every receiver, every processor, the file exporter) are
live YAML; the other exporters (otlp, otlphttp and pyroscope have no default endpoint, prometheus
opens a port) are shown as commented-out examples, which are read here uncommented. No root needed."""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel

from otelbpf.config import (
    DEFAULT_CONFIG_PATH,
    DEFAULT_CONFIG_YAML,
    EXPORTER_TYPES,
    PROCESSOR_TYPES,
    TargetsConfig,
    TelemetryConfig,
)
from otelbpf.families.registry import RECEIVER_TYPES, load_config, load_config_text

TEXT = DEFAULT_CONFIG_YAML
RAW: dict[str, Any] = yaml.safe_load(TEXT)
LOADED = load_config(DEFAULT_CONFIG_PATH, env={})


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (``TLSConfig``, ``BasicAuthConfig | None``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        return next((m for a in get_args(annotation) if (m := _section_model(a))), None)
    return None


def disagreements(model: type[BaseModel], written: Mapping[str, Any], path: str) -> list[str]:
    """Every option of ``model`` missing from ``written``, or written with another value than
    the model's default (options without a default, or None, only have to be written)."""
    found = []
    for name, field in model.model_fields.items():
        where = f"{path}.{name}"
        if name not in written:
            found.append(f"{where}: not in the file (default {field.get_default(call_default_factory=True)!r})")
            continue
        nested = _section_model(field.annotation)
        if nested is not None and isinstance(written[name], Mapping):
            found.extend(disagreements(nested, written[name], where))
            continue
        default = field.get_default(call_default_factory=True)
        if field.is_required() or default is None:
            continue
        value = getattr(model.model_validate({name: written[name]}), name)
        if value != default:
            found.append(f"{where}: the file says {written[name]!r}, the model's default is {default!r}")
    return found


def exporter_examples() -> dict[str, Any]:
    """The commented-out exporters under ``exporters:``, uncommented (``  # otlp:`` and the
    lines indented under it); prose comments are left out."""
    section = TEXT[TEXT.index("\nexporters:") : TEXT.index("\ntargets:")]
    lines = [line[4:] for line in section.splitlines() if re.match(r"  # (\S+:|  )", line)]
    return yaml.safe_load("\n".join(lines))


@pytest.mark.parametrize("kind, types_", [("receivers", RECEIVER_TYPES.models()), ("processors", PROCESSOR_TYPES)])
def test_every_receiver_and_processor_is_written_with_its_defaults(kind, types_):
    assert set(RAW[kind]) == set(types_), f"write every registered {kind[:-1]} under {kind}: in {DEFAULT_CONFIG_PATH}"
    for name, model in types_.items():
        assert disagreements(model, RAW[kind][name] or {}, f"{kind}.{name}") == []
        assert getattr(LOADED, kind)[name] == model()


def test_every_exporter_option_is_written_with_its_default():
    written = {**exporter_examples(), **RAW["exporters"]}
    for name, model in EXPORTER_TYPES.items():
        assert name in written, f"exporter {name} is neither configured nor shown as an example"
        assert disagreements(model, written[name], f"exporters.{name}") == []
    assert {name: type(e) for name, e in LOADED.exporters.items()} == {"file": EXPORTER_TYPES["file"]}
    assert LOADED.exporters["file"] == EXPORTER_TYPES["file"]()


def test_targets_and_telemetry_are_written_with_their_defaults():
    assert disagreements(TargetsConfig, RAW["targets"], "targets") == []
    assert disagreements(TelemetryConfig, RAW["service"]["telemetry"], "service.telemetry") == []
    assert (LOADED.targets, LOADED.service.telemetry) == (TargetsConfig(), TelemetryConfig())


def test_the_check_finds_a_missing_option_and_a_changed_default():
    """The comparison above can fail: an option left out or written with another value is named."""
    model = RECEIVER_TYPES.models()["cuda"]
    written = dict(RAW["receivers"]["cuda"])
    del written["top_kernels"]
    written["ring_buffer_size"] = "4MiB"
    assert disagreements(model, written, "receivers.cuda") == [
        "receivers.cuda.ring_buffer_size: the file says '4MiB', the model's default is 'auto'",
        "receivers.cuda.top_kernels: not in the file (default 20)",
    ]


def test_the_built_in_default_is_the_file():
    """Without --config the agent runs the documented file itself (no second copy to drift)."""
    with open(DEFAULT_CONFIG_PATH, encoding="utf-8") as f:
        assert f.read() == DEFAULT_CONFIG_YAML
    assert load_config(None, env={}) == LOADED


def test_the_exporter_examples_are_a_valid_config(tmp_path):
    """The commented-out exporters, uncommented, load (and can be named in a pipeline); their
    TLS files (which must exist) are made in tmp_path."""
    exporters = exporter_examples()
    for body in exporters.values():
        tls = (body or {}).get("tls") or {}
        for key in ("ca_file", "cert_file", "key_file"):
            if key in tls:
                tls[key] = str(tmp_path / key)
                (tmp_path / key).write_text("PEM\n")
    examples = {
        "exporters": exporters,
        "receivers": {"cuda": None},
        "service": {"pipelines": {"traces": {"receivers": ["cuda"], "exporters": ["otlp", "otlphttp", "otlp/tempo"]}}},
    }
    config = load_config_text(yaml.safe_dump(examples), source="examples", env={})

    assert [name for name, _ in config.pipeline_exporters("traces")] == ["otlp", "otlphttp", "otlp/tempo"]
    assert set(config.exporters) == {"otlp", "otlphttp", "pyroscope", "prometheus", "otlp/tempo"}
