"""The Pyroscope exporter against the receiver in harness/pyroscope.py (official push.v1 and
pprof protobufs): both APIs, auth and tenant headers, retries, the bounded queue."""

from __future__ import annotations

import time

import pytest

from harness.pyroscope import PyroscopeReceiver
from otelbpf.base.health import Health
from otelbpf.config import PyroscopeExporterConfig
from otelbpf.correlate.stacks import Frame
from otelbpf.export.encoded_profile import ProfileRecord
from otelbpf.export.pprof import CPU_SAMPLE_TYPES, ProfileBuilder
from otelbpf.export.pyroscope import PyroscopeExporter


def record(service: str = "train", value: int = 3) -> ProfileRecord:
    b = ProfileBuilder(
        CPU_SAMPLE_TYPES,
        time_ns=1_700_000_000_000_000_000,
        duration_ns=10**10,
        period_type=("cpu", "nanoseconds"),
        period=10_101_010,
    )
    labels = {"service_name": service, "host_name": "h", "process_pid": "42"}
    b.add(
        [Frame("leaf", "python", "t.py", 3, 1), Frame("root", "python", "t.py", 9, 8)],
        [value, value * 10_101_010],
        labels,
    )
    return ProfileRecord(
        "process_cpu", "cpu", labels, 42, 1_700_000_000_000_000_000, 1_700_000_010_000_000_000, 99, b.encode()
    )


@pytest.fixture
def receiver():
    r = PyroscopeReceiver()
    yield r
    r.close()


def exporter(receiver: PyroscopeReceiver, health: Health, **cfg) -> PyroscopeExporter:
    retry = cfg.pop("retry", {"initial_interval": "50ms", "max_interval": "100ms", "max_elapsed_time": "5s"})
    return PyroscopeExporter(
        "pyroscope", PyroscopeExporterConfig(endpoint=receiver.endpoint, retry=retry, **cfg), health
    )


def test_push_sends_labels_and_a_decodable_profile_with_basic_auth_and_tenant(receiver):
    health = Health()
    e = exporter(
        receiver, health, basic_auth={"username": "u", "password": "p"}, tenant_id="t1", headers={"X-Extra": "1"}
    )
    e.export([record()])
    e.shutdown(10)
    [p] = receiver.profiles
    assert p.api == "push"
    assert p.labels == {
        "__name__": "process_cpu",
        "__delta__": "false",
        "pyroscope_spy": "otelbpf",
        "service_name": "train",
        "host_name": "h",
        "process_pid": "42",
    }
    assert p.headers["Authorization"] == "Basic dTpw"
    assert p.headers["X-Scope-OrgID"] == "t1" and p.headers["X-Extra"] == "1"
    assert p.headers["Connect-Protocol-Version"] == "1"
    assert p.sample_types == [("samples", "count"), ("cpu", "nanoseconds")]
    assert [list(s.value) for s in p.profile.sample] == [[3, 30_303_030]]
    assert health.get("otelbpf.export.sent", signal="profiles", exporter="pyroscope") == 1


def test_ingest_names_the_service_with_labels_and_bearer_token(receiver):
    e = exporter(receiver, Health(), protocol="ingest", bearer_token="tok")
    e.export([record("svc")])
    e.shutdown(10)
    [p] = receiver.profiles
    assert p.api == "ingest"
    assert p.query["name"] == "svc{host_name=h,process_pid=42}"
    assert p.query["sampleRate"] == "99" and p.query["from"] < p.query["until"]
    assert p.labels["service_name"] == "svc"
    assert p.headers["Authorization"] == "Bearer tok"


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_5xx_and_429_are_retried_until_accepted(receiver, status):
    health = Health()
    receiver.fail_next(3, status)
    e = exporter(receiver, health)
    e.export([record()])
    e.shutdown(10)
    assert [s for _, s in receiver.requests] == [status] * 3 + [200]
    assert len(receiver.profiles) == 1
    assert health.get("otelbpf.export.retries") == 3
    assert health.get("otelbpf.export.failures") == 0


def test_retry_after_is_honoured(receiver):
    receiver.fail_next(1, 429, retry_after="1")
    e = exporter(receiver, Health())
    t0 = time.monotonic()
    e.export([record()])
    e.shutdown(10)
    assert len(receiver.profiles) == 1
    assert time.monotonic() - t0 >= 0.9


def test_a_4xx_is_not_retried_and_counted(receiver):
    health = Health()
    receiver.fail_next(1, 400)
    e = exporter(receiver, health)
    e.export([record()])
    e.shutdown(10)
    assert [s for _, s in receiver.requests] == [400]
    assert health.get("otelbpf.export.failures", signal="profiles", exporter="pyroscope") == 1
    assert health.get("otelbpf.export.dropped", signal="profiles", reason="refused", exporter="pyroscope") == 1


def test_giving_up_after_max_elapsed_time_is_counted(receiver):
    health = Health()
    receiver.fail_next(1000, 503)
    e = exporter(
        receiver, health, retry={"initial_interval": "50ms", "max_interval": "50ms", "max_elapsed_time": "300ms"}
    )
    e.export([record()])
    e.shutdown(5)
    assert not receiver.profiles
    assert health.get("otelbpf.export.dropped", signal="profiles", reason="export_failed", exporter="pyroscope") == 1


def test_a_full_queue_drops_the_oldest_and_counts_them(receiver):
    health = Health()
    receiver.fail_next(1000, 503)  # the sender is stuck retrying the first profile
    e = exporter(
        receiver,
        health,
        max_queue_size=2,
        retry={"initial_interval": "1s", "max_interval": "1s", "max_elapsed_time": "1s"},
    )
    e.export([record(f"s{i}") for i in range(6)])
    time.sleep(0.2)
    assert len(e) <= 2
    e.shutdown(0.5)
    dropped = health.get("otelbpf.export.dropped", signal="profiles", reason="queue_full", exporter="pyroscope")
    assert dropped >= 3
    total = (
        dropped
        + health.get("otelbpf.export.dropped", signal="profiles", reason="shutdown", exporter="pyroscope")
        + health.get("otelbpf.export.dropped", signal="profiles", reason="export_failed", exporter="pyroscope")
    )
    assert total == 6


def test_an_unreachable_server_is_retried_then_dropped():
    health = Health()
    cfg = PyroscopeExporterConfig(
        endpoint="http://127.0.0.1:9",
        timeout="200ms",
        retry={"initial_interval": "50ms", "max_interval": "50ms", "max_elapsed_time": "300ms"},
    )
    e = PyroscopeExporter("p", cfg, health)
    e.export([record()])
    e.shutdown(5)
    assert health.get("otelbpf.export.retries", signal="profiles", exporter="p") >= 1
    assert health.get("otelbpf.export.dropped", signal="profiles", reason="export_failed", exporter="p") == 1
