"""Loading a configuration: read the file (or take the built-in default), parse it safely,
substitute ``${env:...}``, apply ``--receivers`` and the standard variables, validate, and
report every problem at once in one ``ConfigError``."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import ValidationError

from otelbpf.config.env import overlay
from otelbpf.config.errors import ConfigError, Findings
from otelbpf.config.messages import describe, format_issue
from otelbpf.config.model import Config
from otelbpf.config.parse import MAX_CONFIG_BYTES, parse_yaml
from otelbpf.config.selection import choose_receivers
from otelbpf.config.substitution import substitute

DEFAULT_CONFIG_YAML = """\
receivers:
  cuda:
    libraries: [cudart, cuda]
    search_paths:
      - /usr/local/cuda*/lib64/libcudart.so*
      - /usr/lib/x86_64-linux-gnu/libcudart.so*
      - /opt/conda/lib/libcudart.so*
      - /opt/conda/envs/*/lib/libcudart.so*
      - /opt/conda/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so*
      - /usr/local/lib/python3*/dist-packages/nvidia/cuda_runtime/lib/libcudart.so*
      - /usr/local/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so*
      # CUDA 13 wheels (PyTorch cu130 loads its runtime from nvidia/cu13/lib)
      - /opt/conda/lib/python3*/site-packages/nvidia/cu1[3-9]/lib/libcudart.so*
      - /usr/local/lib/python3*/dist-packages/nvidia/cu1[3-9]/lib/libcudart.so*
      - /usr/local/lib/python3*/site-packages/nvidia/cu1[3-9]/lib/libcudart.so*
      - /usr/lib/x86_64-linux-gnu/libcuda.so*
      - /usr/lib/aarch64-linux-gnu/libcuda.so*
      - /usr/lib64/libcuda.so*
      - /usr/local/nvidia/lib64/libcuda.so*
    launch_sample_every: 0
    launch_errors: false
    min_span_duration: 0us
    ring_buffer_size: 16MiB
    top_kernels: 20
    max_spans_per_second: 20000
    symbol_names: 65536
    symbol_tables: 128
  http:
    processes: gpu
    ports: []
    payload_size: 4KiB
    ring_buffer_size: 16MiB
    capture_headers: []
    redact_headers: []
    max_spans_per_second: 20000
  profiling:
    sample_rate: 99
    interval: 10s
    python: true
    max_python_frames: 64
    cuda_memory: true
    stack_map_entries: 16384
    sample_map_entries: 16384
    code_map_entries: 16384
    live_allocations: 262144
    symbol_tables: 128
  nccl:
    search_paths:
      - /usr/lib/x86_64-linux-gnu/libnccl.so*
      - /usr/lib/aarch64-linux-gnu/libnccl.so*
      - /usr/lib64/libnccl.so*
      - /usr/local/cuda*/lib64/libnccl.so*
      - /opt/conda/lib/libnccl.so*
      - /opt/conda/envs/*/lib/libnccl.so*
      - /opt/conda/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so*
      - /usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so*
      - /usr/local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so*
    ring_buffer_size: 1MiB
    straggler_threshold: 1ms
    completion_timeout: 30s
    max_spans_per_second: 20000
  ibverbs:
    search_paths:
      - /usr/lib/x86_64-linux-gnu/libibverbs.so*
      - /usr/lib/aarch64-linux-gnu/libibverbs.so*
      - /usr/lib64/libibverbs.so*
      - /usr/lib/libibverbs.so*
      - /opt/conda/lib/libibverbs.so*
      - /opt/conda/envs/*/lib/libibverbs.so*
    data_path: true
    slow_completion: 1ms
    max_queue_pairs: 16384
    ring_buffer_size: 1MiB
    max_spans_per_second: 20000
processors:
  batch:
    timeout: 1s
    send_batch_size: 512
    max_queue_size: 8192
  resource:
    attributes: {}
exporters:
  file:
    directory: ./otelbpf-out
    rotate_size: 64MiB
    file_mode: "0600"
    dir_mode: "0700"
targets:
  pids: []
service:
  pipelines:
    traces:
      receivers: [cuda, http, nccl, ibverbs]
      processors: [batch, resource]
      exporters: [file]
    metrics:
      receivers: [cuda, http, nccl, ibverbs]
      processors: [batch, resource]
      exporters: [file]
    profiles:
      receivers: [profiling]
      processors: [resource]
      exporters: [file]
  telemetry:
    metrics_interval: 10s
    drain_interval: 50ms
    log_level: info
"""
"""The built-in configuration, used when no file is given; ``config/otelbpf.yaml`` is the
same configuration with every option documented (a test keeps them equal)."""

DEFAULT_SOURCE = "<built-in default>"


def load_config(
    path: str | os.PathLike[str] | None, env: Mapping[str, str] = os.environ, receivers: str | None = None
) -> Config:
    """The configuration from the YAML file at ``path``, or the built-in default when ``path``
    is None; ``env`` supplies ``${env:...}`` substitutions and the ``OTEL_*`` variables.
    ``receivers`` (``--receivers``), else ``OTELBPF_RECEIVERS`` in ``env``: a comma-separated
    choice of receivers that replaces the pipelines' (see ``choose_receivers``).
    Raises ConfigError listing every problem."""
    chosen = receivers if receivers is not None else env.get("OTELBPF_RECEIVERS") or None
    if path is None:
        return _build(DEFAULT_CONFIG_YAML, DEFAULT_SOURCE, env, from_file=False, receivers=chosen)
    source = os.fspath(path)
    try:
        with open(source, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # never more: it may be /dev/zero or 60 MB
        text = raw.decode("utf-8")
    except FileNotFoundError:
        example = "see config/otelbpf.yaml for a documented example"
        raise ConfigError(source, [f"{source}: no such file; {example}"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, [f"{source}: cannot read: {exc}"]) from None
    return _build(text, source, env, from_file=True, receivers=chosen)


def load_config_text(text: str, *, source: str = "<string>", env: Mapping[str, str] = os.environ) -> Config:
    """Like ``load_config`` for a file whose contents are ``text``; ``source`` names it in errors."""
    return _build(text, source, env, from_file=True)


def _build(text: str, source: str, env: Mapping[str, str], *, from_file: bool, receivers: str | None = None) -> Config:
    data, root = parse_yaml(text, source)
    found = Findings()
    data = substitute(data, (), env, found)
    if receivers is not None:
        choose_receivers(data, receivers, found)
    overlay(data, env, found, from_file=from_file)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        reported = [p for p, _ in found.issues if p is not None]
        for error in exc.errors():
            path = tuple(error["loc"])
            if any(path[: len(p)] == p for p in reported):
                continue  # a value already reported (an unset ${env:VAR}) fails again: say it once
            origin = found.origins.get(path)
            found.issues.append((path, describe(error) + (f" (value from {origin})" if origin else "")))
    else:
        if not found.issues:
            return config
    file_root = root if from_file else None  # positions in the built-in default would only confuse
    lines = [format_issue(path, message, source, file_root, found.origins) for path, message in found.issues]
    raise ConfigError(source, list(dict.fromkeys(lines)))
