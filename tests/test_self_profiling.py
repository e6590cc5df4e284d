"""The agent profiling itself into Pyroscope with pyroscope-io: where the profile goes and with
which credentials (config), what pyroscope-io really pushes (a local HTTP server records it:
``POST /push.v1.PusherService/Push``, a gzipped ``push.v1.PushRequest`` whose raw profiles
are pprof), first from a small program, then from the real agent (BPF)."""

from __future__ import annotations

import gzip
import socket
import subprocess
import sys
import textwrap
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from harness.agent import REPO, AgentProcess
from otelbpf import __version__
from otelbpf.config import ConfigError
from otelbpf.export.proto import profile_pb2
from otelbpf.export.proto.push.v1 import push_pb2
from otelbpf.export.self_profiling import APPLICATION, Target, self_profiler, target
from otelbpf.families.registry import load_config_text

# --- where it goes ------------------------------------------------------------------------------


def config(self_profiling: str, exporters: str = "{file: {}}", names: str = "file"):
    return load_config_text(f"""\
receivers: {{profiling: {{cuda_memory: false}}}}
exporters: {exporters}
service:
  pipelines: {{profiles: {{receivers: [profiling], exporters: [{names}]}}}}
  telemetry: {{self_profiling: {self_profiling}}}
""")


PYRO = (
    '{pyroscope: {endpoint: "http://p:4040/", tenant_id: t1, basic_auth: {username: u, password: pw}, '
    'headers: {X-A: "1"}}, pyroscope/b: {endpoint: "http://b:4040", bearer_token: tok}}'
)


def test_off_by_default():
    assert config("{}").service.telemetry.self_profiling.enabled is False
    assert self_profiler(config("{}")) is None


def test_the_pyroscope_exporters_endpoint_and_credentials_by_default():
    p = self_profiler(config("{enabled: true, sample_rate: 49}", PYRO, "pyroscope, pyroscope/b"))
    assert p is not None and p.sample_rate == 49
    assert p.target == Target("http://p:4040/", ("u", "pw"), "t1", {"X-A": "1"})


def test_an_explicit_endpoint_takes_the_credentials_of_the_exporter_with_that_endpoint_only():
    exporters = dict(config("{}", PYRO, "pyroscope, pyroscope/b").pipeline_exporters("profiles"))
    assert target("http://b:4040/", exporters) == Target("http://b:4040/", None, "", {"Authorization": "Bearer tok"})
    assert target("http://other:4040", exporters) == Target("http://other:4040")


def test_the_start_is_logged_without_the_endpoints_userinfo(monkeypatch, caplog):
    from otelbpf.export import self_profiling

    class Stub:
        def configure(self, **kwargs: object) -> None:
            pass

    monkeypatch.setattr(self_profiling, "_pyroscope", Stub)
    with caplog.at_level("INFO", logger=self_profiling.__name__):
        self_profiling.SelfProfiler(Target("https://u:s3cr3t@p:4040/?k=t0k3n", None, "", {}), 100).start()
    assert "self-profiling into https://u:REDACTED@p:4040/?k=REDACTED" in caplog.text
    assert "s3cr3t" not in caplog.text and "t0k3n" not in caplog.text


def test_enabled_without_any_pyroscope_is_a_config_error():
    with pytest.raises(ConfigError, match="self_profiling.endpoint: self_profiling is enabled with no endpoint"):
        config("{enabled: true}")
    with pytest.raises(ConfigError, match="self_profiling.endpoint: 'ftp://x' is not an http"):
        config("{enabled: true, endpoint: 'ftp://x'}")
    with pytest.raises(ConfigError, match="sample_rate"):
        config("{enabled: true, endpoint: 'http://x:4040', sample_rate: 0}")


# --- what pyroscope-io pushes -------------------------------------------------------------------


@dataclass
class Push:
    path: str
    headers: dict[str, str]  # names in lower case
    labels: dict[str, str]
    profiles: list[profile_pb2.Profile]

    def functions(self) -> set[tuple[str, str]]:
        """(function, file) of every location of every profile."""
        out = set()
        for p in self.profiles:
            s = p.string_table
            out |= {(s[f.name], s[f.filename]) for f in p.function}
        return out


class PushRecorder:
    """Records every push; a body that does not decode as pyroscope-io's format fails the test."""

    def __init__(self) -> None:
        self.pushes: list[Push] = []
        self.errors: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    owner.pushes.extend(owner.decode(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    self.send_response(200)
                except Exception as exc:  # noqa: BLE001 - what a real server would refuse, kept for the test
                    owner.errors.append(f"{self.path}: {exc!r}")
                    self.send_response(400)
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @staticmethod
    def decode(path: str, headers: dict[str, str], body: bytes) -> list[Push]:
        if path != "/push.v1.PusherService/Push":
            raise ValueError(f"unexpected path {path}")
        if headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        request = push_pb2.PushRequest.FromString(body)
        out = []
        for series in request.series:
            profiles = []
            for sample in series.samples:
                raw = sample.raw_profile
                profiles.append(profile_pb2.Profile.FromString(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw))
            out.append(Push(path, headers, {label.name: label.value for label in series.labels}, profiles))
        return out

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def recorder():
    r = PushRecorder()
    yield r
    r.close()


def check_agent_push(push: Push) -> None:
    assert push.labels["service_name"] == APPLICATION
    assert push.labels["host"] == socket.gethostname() and push.labels["version"] == __version__
    assert push.labels["__name__"] == "process_cpu"
    for p in push.profiles:
        s = p.string_table
        assert [(s[t.type], s[t.unit]) for t in p.sample_type] == [("cpu", "nanoseconds")]
        assert p.sample and all(len(x.value) == 1 for x in p.sample)


def test_a_program_profiled_by_self_profiler_pushes_pprof_naming_its_functions(recorder):
    program = textwrap.dedent(f"""
        import time
        from otelbpf.export.self_profiling import SelfProfiler, Target

        def burn_in_the_agent():
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                sum(range(1000))

        p = SelfProfiler(Target({recorder.endpoint!r}, ("u", "pw"), "t1", {{"X-A": "1"}}), 100)
        p.start()
        burn_in_the_agent()
        p.stop()
    """)
    subprocess.run([sys.executable, "-c", program], check=True, timeout=60, cwd=REPO)
    assert not recorder.errors, recorder.errors
    assert recorder.pushes
    for push in recorder.pushes:
        check_agent_push(push)
        assert push.headers["authorization"] == "Basic dTpwdw==" and push.headers["x-scope-orgid"] == "t1"
        assert push.headers["x-a"] == "1"
    assert "burn_in_the_agent" in {f for push in recorder.pushes for f, _ in push.functions()}


@pytest.mark.bpf
def test_the_agent_profiles_itself_into_pyroscope(recorder, built, tmp_path):
    doc = {
        "receivers": {"profiling": {"cuda_memory": False, "interval": "1s"}},
        "exporters": {"file": {"directory": str(tmp_path / "out")}},
        "service": {
            "pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["file"]}},
            "telemetry": {"self_profiling": {"enabled": True, "endpoint": recorder.endpoint}},
        },
    }
    cfg = tmp_path / "otelbpf.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    hot = REPO / "examples" / "profiling" / "hot.py"
    with AgentProcess(["-c", str(cfg), "--", sys.executable, str(hot), "2"]) as agent:
        assert agent.wait(timeout=120) == 0, agent.output
    assert not recorder.errors, recorder.errors
    assert recorder.pushes, agent.output
    for push in recorder.pushes:
        check_agent_push(push)
    package = str(REPO / "otelbpf")
    own = {(f, file) for push in recorder.pushes for f, file in push.functions() if file.startswith(package)}
    assert own, sorted({f for push in recorder.pushes for f in push.functions()})[:40]
