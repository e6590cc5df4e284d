"""otelbpf.config.model and the sections: component types and names, pipelines that name
defined components, exporters with a destination, and the checks of single sections."""

from __future__ import annotations

import pytest

from harness.config_text import MINIMAL, errors_of, load, one_error, with_cuda, with_exporter
from otelbpf.config import FileExporterConfig, OtlpExporterConfig
from otelbpf.families.registry import load_config


def test_unknown_exporter_type_lists_the_allowed_types():
    error = one_error(with_exporter("zipkin: {endpoint: x}"))

    assert error == (
        "test.yaml:5:3: exporters.zipkin: unknown exporter type 'zipkin'; "
        "allowed types: file, otlp, otlphttp, prometheus, pyroscope"
    )


def test_named_components_are_validated_by_their_type():
    config = load(
        """\
        receivers: {cuda: }
        exporters:
          file/local: {directory: /var/log/otelbpf}
          otlp/tempo: {endpoint: "tempo:4317"}
        service:
          pipelines:
            traces: {receivers: [cuda], exporters: [file/local, otlp/tempo]}
        """
    )
    assert config.pipeline_exporters("traces") == [
        ("file/local", FileExporterConfig(directory="/var/log/otelbpf")),
        ("otlp/tempo", OtlpExporterConfig(endpoint="tempo:4317")),
    ]

    error = one_error(with_exporter("file/local: {endpoint: x}"))
    assert "exporters.file/local.endpoint: unknown option; allowed: directory, rotate_size" in error


def test_receivers_take_no_instance_name():
    error = one_error(MINIMAL.replace("cuda", "cuda/a"))

    assert "receivers.cuda/a: invalid receiver name 'cuda/a': a probe family is loaded once" in error


def test_pipeline_naming_an_undefined_component():
    text = with_exporter("otlp/tempo: {endpoint: 't:1'}")
    error = one_error(text.replace("exporters: [file]", "exporters: [file, otlp/tmpo]"))

    assert error == (
        "test.yaml:8:51: service.pipelines.traces.exporters[1]: exporter 'otlp/tmpo' is not defined under "
        "exporters (did you mean 'otlp/tempo'?); defined exporters: file, otlp/tempo"
    )


def test_pipelines_must_exist_and_not_be_empty():
    assert one_error(MINIMAL.replace("    traces: {receivers: [cuda], exporters: [file]}\n", "    {}\n")).endswith(
        "service.pipelines: no pipelines: define traces, metrics and/or profiles here"
    )
    assert one_error(MINIMAL.replace("receivers: [cuda]", "receivers: []")).endswith(
        "service.pipelines.traces.receivers: a pipeline needs at least one of its receivers"
    )
    assert errors_of(MINIMAL.replace("traces:", "logs:")) == [
        "test.yaml:7:5: service.pipelines.logs: unknown option; allowed: traces, metrics, profiles",
        "test.yaml:6:3: service.pipelines: no pipelines: define traces, metrics and/or profiles here",
    ]


def test_otlp_exporter_in_use_needs_an_endpoint():
    error = one_error(MINIMAL.replace("  file:\n", "  otlp:\n").replace("[file]", "[otlp]"))

    assert error == (
        "test.yaml:4:3: exporters.otlp.endpoint: no endpoint: set endpoint here or OTEL_EXPORTER_OTLP_ENDPOINT "
        "(the traces pipeline uses this exporter)"
    )


def test_batch_queue_must_hold_a_batch():
    text = MINIMAL + "processors:\n  batch: {send_batch_size: 100, max_queue_size: 10}\n"

    assert "max_queue_size (10) must be at least send_batch_size (100)" in one_error(text)


def test_ring_buffer_size_must_be_a_power_of_two():
    assert load(with_cuda("ring_buffer_size: 64KiB")).receivers["cuda"].ring_buffer_size == 65536
    error = one_error(with_cuda("ring_buffer_size: 3MiB"))
    assert "must be a power of two from the page size (4KiB) to 1GiB" in error and "got 3MiB" in error
    assert "(or auto)" in error
    assert "(or auto)" in one_error(with_cuda("ring_buffer_size: automatic"))


def test_an_auto_events_ring_is_larger_only_when_launches_become_events_often():
    def ring(options: str, traces: bool = True) -> int:
        return load(with_cuda(options)).receivers["cuda"].events_ring_bytes(traces)

    assert ring("ring_buffer_size: auto") == 4 << 20
    assert ring("launch_sample_every: 1") == ring("launch_sample_every: 15") == 16 << 20
    assert ring("launch_sample_every: 16") == ring("launch_sample_every: 1000") == 4 << 20
    assert ring("launch_sample_every: 1", traces=False) == 4 << 20  # no spans: no launch events
    assert ring("launch_sample_every: 1, ring_buffer_size: 1MiB") == 1 << 20  # a size given is kept


def test_search_paths_must_be_absolute():
    error = one_error(with_cuda("search_paths: [/ok/libcudart.so*, lib/libcudart.so]"))

    assert "receivers.cuda.search_paths[1]: 'lib/libcudart.so' is relative" in error


def test_config_is_immutable():
    config = load_config(None, env={})

    with pytest.raises(ValueError, match="frozen"):
        config.receivers["cuda"].launch_sample_every = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    "pipelines",
    [
        "traces: {receivers: [cuda, cdua], exporters: [file]}",
        "profiles: {receivers: [profiling, cdua], exporters: [file]}",
    ],
)
def test_a_typo_beside_a_defined_receiver_is_the_not_defined_error(pipelines: str):
    """The needs check looked every pipeline receiver up and raised KeyError (a traceback)."""
    text = MINIMAL.replace("  cuda:\n", "  cuda:\n  profiling:\n").replace(
        "traces: {receivers: [cuda], exporters: [file]}", pipelines
    )

    assert one_error(text).endswith(
        "receivers[1]: receiver 'cdua' is not defined under receivers (did you mean 'cuda'?); "
        "defined receivers: cuda, profiling"
    )


def test_a_typo_in_the_profiles_exporters_with_self_profiling_on_is_the_not_defined_error():
    text = MINIMAL.replace("  cuda:\n", "  cuda:\n  profiling:\n").replace(
        "traces: {receivers: [cuda], exporters: [file]}",
        "profiles: {receivers: [profiling], exporters: [file, fiel]}\n  telemetry: {self_profiling: {enabled: true}}",
    )

    assert one_error(text).endswith(
        "exporters[1]: exporter 'fiel' is not defined under exporters (did you mean 'file'?); defined exporters: file"
    )


def test_host_pause_auto_pauses_only_an_agent_without_a_controlling_terminal(monkeypatch) -> None:
    """A DaemonSet's agent has no terminal: it pauses. One started from a terminal does not (a
    job-control shell would take its stopped foreground job's terminal back); true and false win."""
    from otelbpf.config import service

    monkeypatch.setattr(service, "has_controlling_terminal", lambda: False)
    assert service.HostPauseConfig().on() is True
    monkeypatch.setattr(service, "has_controlling_terminal", lambda: True)
    assert service.HostPauseConfig().on() is False
    assert service.HostPauseConfig(enabled=True).on() is True
    monkeypatch.setattr(service, "has_controlling_terminal", lambda: False)
    assert service.HostPauseConfig(enabled=False).on() is False


def test_the_process_here_has_no_controlling_terminal_and_setsid_loses_one() -> None:
    """The check itself, on real processes: a child in a new session (setsid) has no terminal."""
    import subprocess
    import sys

    code = "from otelbpf.base.terminal import has_controlling_terminal as h; print(h())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, start_new_session=True)
    assert out.stdout.strip() == "False", out.stderr
