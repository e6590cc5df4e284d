"""The agent profiling itself into Pyroscope with ``pyroscope-io`` (``service.telemetry.self_profiling``),
so that its users can see where its own CPU goes: BCC's ring-buffer polls, the correlators,
symbolization, the encoders.

pyroscope-io samples the agent's Python threads from a native thread (py-spy, reading the
agent's own memory: no ptrace, no capability) and pushes a CPU profile every 10 s, and at
stop, to ``{endpoint}/push.v1.PusherService/Push`` as application ``otelbpf-agent``, tagged
``host`` and ``version``. Only the thread holding the GIL is sampled (``gil_only``), on CPU
(``oncpu``): measured here at 100 Hz, 0.9% of a core for an idle process with nine threads,
against 8.5% when every thread's stack is read each time. So work done without the GIL
(BCC's compile inside LLVM, other ctypes calls, numpy kernels) is not in the profile.

The endpoint defaults to the pyroscope exporter's, and so do its credentials (basic auth,
bearer token, tenant, headers); an explicit endpoint takes the credentials of the pyroscope
exporter with the same endpoint, if any. pyroscope-io sends from its own thread with its own
queue and does not report its failures: they do not reach the agent's drop counters.

pyroscope-io is process-wide: one self-profiler per process. Its native library is loaded
only when self-profiling is on.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, cast

from otelbpf.base.secrets import redact_urls
from otelbpf.config import Config, ExporterConfig, PyroscopeExporterConfig

log = logging.getLogger(__name__)

APPLICATION = "otelbpf-agent"


@dataclass(frozen=True)
class Target:
    """Where the agent's own profile goes, and with which credentials."""

    endpoint: str
    basic_auth: tuple[str, str] | None = None
    tenant_id: str = ""
    headers: dict[str, str] = field(default_factory=dict)


def target(endpoint: str | None, exporters: Mapping[str, ExporterConfig]) -> Target:
    """``endpoint``, or the first pyroscope exporter's; with that exporter's credentials."""
    pyroscopes = [
        (c.endpoint, c) for c in exporters.values() if isinstance(c, PyroscopeExporterConfig) and c.endpoint is not None
    ]
    if endpoint is None:
        if not pyroscopes:
            raise ValueError("self_profiling has no endpoint and the profiles pipeline has no pyroscope exporter")
        endpoint = pyroscopes[0][0]
    same = next((c for url, c in pyroscopes if url.rstrip("/") == endpoint.rstrip("/")), None)
    if same is None:
        return Target(endpoint)
    headers = dict(same.headers)
    if same.bearer_token is not None:
        headers["Authorization"] = f"Bearer {same.bearer_token}"
    auth = (same.basic_auth.username, same.basic_auth.password) if same.basic_auth is not None else None
    return Target(endpoint, auth, same.tenant_id or "", headers)


class SelfProfiler:
    """Starts and stops pyroscope-io's sampler for this process."""

    def __init__(self, where: Target, sample_rate: int) -> None:
        self.target = where
        self.sample_rate = sample_rate
        self.running = False

    def tags(self) -> dict[str, str]:
        from otelbpf import __version__

        return {"host": socket.gethostname(), "version": __version__}

    def start(self) -> None:
        user, password = self.target.basic_auth or ("", "")
        _pyroscope().configure(
            application_name=APPLICATION,
            server_address=self.target.endpoint,
            sample_rate=self.sample_rate,
            basic_auth_username=user,
            basic_auth_password=password,
            tenant_id=self.target.tenant_id,
            http_headers=dict(self.target.headers),
            tags=self.tags(),
            oncpu=True,
            gil_only=True,
        )
        self.running = True
        shown = redact_urls(self.target.endpoint, every_query_value=True)  # its userinfo is a credential
        log.info("self-profiling into %s as %s at %d Hz", shown, APPLICATION, self.sample_rate)

    def stop(self) -> None:
        """Push what was sampled since the last upload, then end the sampler."""
        if not self.running:
            return
        self.running = False
        if not _pyroscope().shutdown():
            log.warning("self-profiling: pyroscope-io did not shut down cleanly")


def self_profiler(config: Config) -> SelfProfiler | None:
    """The agent's own profiler, when ``service.telemetry.self_profiling`` is on."""
    cfg = config.service.telemetry.self_profiling
    if not cfg.enabled:
        return None
    return SelfProfiler(target(cfg.endpoint, dict(config.pipeline_exporters("profiles"))), cfg.sample_rate)


class _Pyroscope(Protocol):
    """The two calls this module makes into pyroscope-io (which ships no type hints)."""

    def configure(
        self,
        *,
        application_name: str,
        server_address: str,
        sample_rate: int,
        basic_auth_username: str,
        basic_auth_password: str,
        tenant_id: str,
        http_headers: dict[str, str],
        tags: dict[str, str],
        oncpu: bool,
        gil_only: bool,
    ) -> None: ...

    def shutdown(self) -> bool: ...


def _pyroscope() -> _Pyroscope:
    import pyroscope  # type: ignore[import-untyped]

    # pyroscope-io is untyped (Any): the Protocol spells out the calls made above, checked at the call sites.
    return cast(_Pyroscope, pyroscope)
