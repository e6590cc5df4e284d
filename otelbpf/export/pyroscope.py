"""Profiles to Grafana Pyroscope, over its push API or the legacy ingest endpoint.

- ``push``: ``POST {endpoint}/push.v1.PusherService/Push``, a Connect-protocol unary call
  with a binary protobuf ``push.v1.PushRequest`` body (``Content-Type: application/proto``):
  one series per profile, its labels (``__name__``, ``service_name``, ...) and the gzipped
  pprof as ``raw_profile``.
- ``ingest``: ``POST {endpoint}/ingest?name=<service>{labels}&from=&until=&format=pprof``
  with the gzipped pprof as the body (the server names the profile from its sample types).

Auth: basic (``basic_auth``) or ``Authorization: Bearer``; ``X-Scope-OrgID`` carries the
tenant. Sending happens on one thread from a bounded queue: when it is full the oldest
profile is dropped and counted (``otelbpf.export.dropped{signal=profiles}``). Connection
errors, 429 and 5xx are retried with exponential back-off (``Retry-After`` honoured) until
``retry.max_elapsed_time``; other 4xx are not (the request is wrong) and are counted as
failures.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
import urllib.parse
import uuid
from collections import deque
from collections.abc import Sequence

import requests

from otelbpf.base.health import Health
from otelbpf.base.threadname import name_os_thread
from otelbpf.config import PyroscopeExporterConfig, to_seconds
from otelbpf.export.profile_export import ProfileRecord
from otelbpf.export.proto.push.v1 import push_pb2

log = logging.getLogger(__name__)

PUSH_PATH = "/push.v1.PusherService/Push"
INGEST_PATH = "/ingest"
SPY_NAME = "otelbpf"


class _Permanent(Exception):
    """The server refused the request for good (a 4xx other than 429)."""


class _Retry(Exception):
    def __init__(self, message: str, after_s: float | None = None) -> None:
        super().__init__(message)
        self.after_s = after_s


def push_request(records: Sequence[ProfileRecord]) -> bytes:
    """A serialized ``push.v1.PushRequest`` with one series per record."""
    req = push_pb2.PushRequest()
    for r in records:
        series = req.series.add()
        labels = {"__name__": r.name, "__delta__": "false", "pyroscope_spy": SPY_NAME, **r.labels}
        for name in sorted(labels):
            series.labels.add(name=name, value=labels[name])
        series.samples.add(raw_profile=r.pprof, ID=str(uuid.uuid4()))
    data: bytes = req.SerializeToString()
    return data


def ingest_name(r: ProfileRecord) -> str:
    """``service{k=v,...}``, the ingest API's application name with labels."""
    labels = {k: v for k, v in r.labels.items() if k != "service_name"}
    body = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return f"{r.labels.get('service_name', 'unknown')}{{{body}}}"


class PyroscopeExporter:
    def __init__(self, name: str, cfg: PyroscopeExporterConfig, health: Health) -> None:
        if cfg.endpoint is None:
            raise ValueError("pyroscope exporter without endpoint")
        self.name = name
        self.cfg = cfg
        self._health = health
        self._base = cfg.endpoint.rstrip("/")
        self._session = requests.Session()
        self._session.headers.update(cfg.headers)
        if cfg.basic_auth is not None:
            token = f"{cfg.basic_auth.username}:{cfg.basic_auth.password}".encode()
            self._session.headers["Authorization"] = "Basic " + base64.b64encode(token).decode()
        elif cfg.bearer_token is not None:
            self._session.headers["Authorization"] = f"Bearer {cfg.bearer_token}"
        if cfg.tenant_id:
            self._session.headers["X-Scope-OrgID"] = cfg.tenant_id
        self._queue: deque[ProfileRecord] = deque()
        self._cv = threading.Condition()
        self._closing = False
        self._deadline = float("inf")  # when closing: give up sending after this
        self._thread = threading.Thread(target=self._run, name=f"otelbpf-{name}", daemon=True)
        self._thread.start()

    # -- queue ---------------------------------------------------------------

    def export(self, records: Sequence[ProfileRecord]) -> None:
        dropped = 0
        with self._cv:
            for r in records:
                if len(self._queue) >= self.cfg.max_queue_size:
                    self._queue.popleft()
                    dropped += 1
                self._queue.append(r)
            self._cv.notify()
        if dropped:
            self._health.add(
                "otelbpf.export.dropped", dropped, signal="profiles", reason="queue_full", exporter=self.name
            )

    def __len__(self) -> int:
        return len(self._queue)

    def _run(self) -> None:
        name_os_thread(f"otelbpf-{self.name}"[:15])
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    return
                record = self._queue.popleft()
            self._send_with_retries(record)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Send what is queued for at most ``timeout_s``; what is left is dropped and counted."""
        with self._cv:
            self._closing = True
            self._deadline = time.monotonic() + timeout_s
            self._cv.notify()
        self._thread.join(timeout_s + 1)
        with self._cv:
            left = len(self._queue)
            self._queue.clear()
        if left:
            self._health.add("otelbpf.export.dropped", left, signal="profiles", reason="shutdown", exporter=self.name)
        self._session.close()

    # -- sending -------------------------------------------------------------

    def _send_with_retries(self, record: ProfileRecord) -> None:
        retry = self.cfg.retry
        delay = to_seconds(retry.initial_interval)
        give_up = time.monotonic() + to_seconds(retry.max_elapsed_time)
        while True:
            try:
                self._send(record)
                self._health.add("otelbpf.export.sent", 1, signal="profiles", exporter=self.name)
                return
            except _Permanent as exc:
                log.warning("pyroscope exporter %s: profile refused: %s", self.name, exc)
                reason = "refused"
            except (_Retry, requests.RequestException) as exc:
                wait = getattr(exc, "after_s", None) or delay
                now = time.monotonic()
                if now + wait < min(give_up, self._deadline):
                    self._health.add("otelbpf.export.retries", 1, signal="profiles", exporter=self.name)
                    log.info("pyroscope exporter %s: %s; retrying in %.1fs", self.name, exc, wait)
                    self._sleep(wait)
                    delay = min(delay * 2, to_seconds(retry.max_interval))
                    continue
                log.warning("pyroscope exporter %s: giving up on a profile: %s", self.name, exc)
                reason = "export_failed"
            self._health.add("otelbpf.export.failures", 1, signal="profiles", exporter=self.name)
            self._health.add("otelbpf.export.dropped", 1, signal="profiles", reason=reason, exporter=self.name)
            return

    def _sleep(self, seconds: float) -> None:
        with self._cv:
            self._cv.wait_for(lambda: time.monotonic() >= self._deadline, timeout=seconds)

    def _send(self, r: ProfileRecord) -> None:
        timeout = to_seconds(self.cfg.timeout)
        if self.cfg.protocol == "push":
            resp = self._session.post(
                self._base + PUSH_PATH, data=push_request([r]), timeout=timeout,
                headers={"Content-Type": "application/proto", "Connect-Protocol-Version": "1"},
            )
        else:
            query = {
                "name": ingest_name(r), "from": str(r.start_ns // 1_000_000_000),
                "until": str(max(r.end_ns // 1_000_000_000, r.start_ns // 1_000_000_000 + 1)),
                "format": "pprof", "spyName": SPY_NAME,
            }
            if r.sample_rate:
                query["sampleRate"] = str(r.sample_rate)
            resp = self._session.post(
                f"{self._base}{INGEST_PATH}?{urllib.parse.urlencode(query)}", data=r.pprof, timeout=timeout,
                headers={"Content-Type": "application/octet-stream"},
            )
        if resp.status_code < 300:
            return
        detail = f"HTTP {resp.status_code}: {resp.text[:200].strip()}"
        if resp.status_code == 429 or resp.status_code >= 500:
            raise _Retry(detail, _retry_after(resp.headers.get("Retry-After")))
        raise _Permanent(detail)


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        return None
