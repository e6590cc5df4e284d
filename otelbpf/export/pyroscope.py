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
import urllib.parse
import uuid
from collections.abc import Sequence

import requests

from otelbpf.base.health import Health
from otelbpf.config import PyroscopeExporterConfig, to_seconds
from otelbpf.export.encoded_profile import ProfileRecord
from otelbpf.export.proto.push.v1 import push_pb2
from otelbpf.export.sender import Permanent, QueuedExporter, QueuedSender, Retry, retry_after

log = logging.getLogger(__name__)

PUSH_PATH = "/push.v1.PusherService/Push"
INGEST_PATH = "/ingest"
SPY_NAME = "otelbpf"


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


class PyroscopeExporter(QueuedExporter[ProfileRecord]):
    def __init__(self, name: str, cfg: PyroscopeExporterConfig, health: Health) -> None:
        if cfg.endpoint is None:
            raise ValueError("pyroscope exporter without endpoint")
        self.name = name
        self.cfg = cfg
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
        self._sender: QueuedSender[ProfileRecord] = QueuedSender(
            name,
            "profiles",
            health,
            self._send,
            retry=cfg.retry,
            max_queue_size=cfg.max_queue_size,
            on_close=self._session.close,
        )

    def _send(self, batch: list[ProfileRecord]) -> None:
        """One profile per request (the sender's batch size is 1)."""
        try:
            for r in batch:
                self._post(r)
        except requests.RequestException as exc:
            raise Retry(str(exc)) from None

    def _post(self, r: ProfileRecord) -> None:
        timeout = to_seconds(self.cfg.timeout)
        if self.cfg.protocol == "push":
            resp = self._session.post(
                self._base + PUSH_PATH,
                data=push_request([r]),
                timeout=timeout,
                headers={"Content-Type": "application/proto", "Connect-Protocol-Version": "1"},
            )
        else:
            query = {
                "name": ingest_name(r),
                "from": str(r.start_ns // 1_000_000_000),
                "until": str(max(r.end_ns // 1_000_000_000, r.start_ns // 1_000_000_000 + 1)),
                "format": "pprof",
                "spyName": SPY_NAME,
            }
            if r.sample_rate:
                query["sampleRate"] = str(r.sample_rate)
            resp = self._session.post(
                f"{self._base}{INGEST_PATH}?{urllib.parse.urlencode(query)}",
                data=r.pprof,
                timeout=timeout,
                headers={"Content-Type": "application/octet-stream"},
            )
        if resp.status_code < 300:
            return
        detail = f"HTTP {resp.status_code}: {resp.text[:200].strip()}"
        if resp.status_code == 429 or resp.status_code >= 500:
            raise Retry(detail, retry_after(resp.headers.get("Retry-After")))
        raise Permanent(detail)
