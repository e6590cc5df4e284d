"""A Pyroscope stand-in for tests: no Pyroscope server installs here, so this receiver takes
what a real one takes, decoded with the official protobufs, and fails on anything else.

- ``POST /push.v1.PusherService/Push`` (Connect unary, ``application/proto``): the body must
  parse as ``push.v1.PushRequest``; every series must carry a ``__name__`` and a
  ``service_name`` label; every ``raw_profile`` must gunzip and parse as a pprof
  ``Profile`` with samples whose value count matches its sample types.
- ``POST /ingest?name=...&format=pprof``: the body must be a gzipped pprof likewise.

Requests are recorded with their headers; ``fail_next(n, status)`` makes the next ``n``
requests answer ``status`` (5xx, 429) for retry tests. A request that does not decode is
answered 400 and recorded in ``errors``.
"""

from __future__ import annotations

import gzip
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from otelbpf.export.proto import profile_pb2
from otelbpf.export.proto.push.v1 import push_pb2


@dataclass
class ReceivedProfile:
    api: str  # push | ingest
    labels: dict[str, str]
    profile: profile_pb2.Profile
    raw: bytes  # the gzipped pprof as sent
    headers: dict[str, str]
    query: dict[str, str] = field(default_factory=dict)

    @property
    def sample_types(self) -> list[tuple[str, str]]:
        s = self.profile.string_table
        return [(s[t.type], s[t.unit]) for t in self.profile.sample_type]


def decode_pprof(raw: bytes) -> profile_pb2.Profile:
    profile = profile_pb2.Profile()
    profile.ParseFromString(gzip.decompress(raw))
    if not profile.string_table or profile.string_table[0] != "":
        raise ValueError("string_table[0] must be empty")
    for sample in profile.sample:
        if len(sample.value) != len(profile.sample_type):
            raise ValueError("a sample's values do not match the sample types")
    return profile


class PyroscopeReceiver:
    def __init__(self) -> None:
        self.profiles: list[ReceivedProfile] = []
        self.requests: list[tuple[str, int]] = []  # (path, status answered)
        self.errors: list[str] = []
        self._fail: list[tuple[int, dict[str, str]]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status, extra = receiver._handle(self.path, dict(self.headers.items()), body)
                self.send_response(status)
                for k, v in extra.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def fail_next(self, count: int, status: int, retry_after: str | None = None) -> None:
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        with self._lock:
            self._fail.extend([(status, headers)] * count)

    def _handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str]]:
        with self._lock:
            if self._fail:
                status, extra = self._fail.pop(0)
                self.requests.append((path, status))
                return status, extra
        try:
            received = self._decode(path, headers, body)
        except Exception as exc:  # anything a real server would refuse
            with self._lock:
                self.errors.append(f"{path}: {exc}")
                self.requests.append((path, 400))
            return 400, {}
        with self._lock:
            self.profiles.extend(received)
            self.requests.append((path, 200))
        return 200, {"Content-Type": "application/proto"}

    def _decode(self, path: str, headers: dict[str, str], body: bytes) -> list[ReceivedProfile]:
        url = urllib.parse.urlsplit(path)
        if url.path == "/push.v1.PusherService/Push":
            if headers.get("Content-Type") != "application/proto":
                raise ValueError(f"Content-Type {headers.get('Content-Type')!r}, want application/proto")
            req = push_pb2.PushRequest()
            req.ParseFromString(body)
            out = []
            for series in req.series:
                labels = {p.name: p.value for p in series.labels}
                if "__name__" not in labels or "service_name" not in labels:
                    raise ValueError(f"series without __name__ or service_name: {labels}")
                for sample in series.samples:
                    out.append(
                        ReceivedProfile("push", labels, decode_pprof(sample.raw_profile), sample.raw_profile, headers)
                    )
            return out
        if url.path == "/ingest":
            query = dict(urllib.parse.parse_qsl(url.query))
            if query.get("format") != "pprof" or "name" not in query:
                raise ValueError(f"ingest query {query}")
            name = query["name"]
            service, _, rest = name.partition("{")
            labels = dict(kv.split("=", 1) for kv in rest.rstrip("}").split(",") if kv)
            labels["service_name"] = service
            return [ReceivedProfile("ingest", labels, decode_pprof(body), body, headers, query)]
        raise ValueError(f"unknown path {url.path}")

    def wait_for(self, predicate, timeout: float = 30, what: str = "profiles"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                value = predicate(self)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(
            f"timed out waiting for {what}; received {len(self.profiles)} profiles, "
            f"requests {self.requests}, errors {self.errors}"
        )

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
