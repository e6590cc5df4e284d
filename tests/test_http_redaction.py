"""Redaction end to end (issue 13, rows 9 and 10): a corpus of secrets sent through real HTTP/1.1
and gRPC exchanges that the real agent traces (socket probes, ``log_level: debug``), then every byte
it exported (OTLP-JSON traces and metrics) and logged searched for each secret.

Each secret sits where a client can put one: userinfo in an absolute-form target and in Host and
``:authority``, a path parameter, a query string, credential headers and gRPC metadata (the
always-redacted ones and a configured one, all asked for by ``capture_headers``), a body. A control
value next to them (a header captured and not redacted) must arrive, so the search is not empty."""

from __future__ import annotations

import socket

import grpc
import pytest
import yaml

from harness import grpc_demo
from harness.agent import AgentProcess, wait_until
from test_http_agent import app, free_ports

pytestmark = pytest.mark.bpf

SECRETS = {
    "target-userinfo": "pw-s3cr3t-1",
    "path-parameter": "sess-s3cr3t-2",
    "query": "qry-s3cr3t-3",
    "host-userinfo": "host-s3cr3t-4",
    "authorization": "auth-s3cr3t-5",
    "cookie": "cookie-s3cr3t-6",
    "configured-header": "apikey-s3cr3t-7",
    "body": "body-s3cr3t-8",
    "grpc-authorization": "grpc-auth-s3cr3t-9",
    "grpc-configured": "grpc-key-s3cr3t-10",
    "authority-userinfo": "authority-s3cr3t-11",
    "grpc-path-parameter": "grpc-sess-s3cr3t-12",
}


def _config(tmp, ports: list[int]) -> str:
    doc = {
        "receivers": {
            "http": {
                "processes": "all",
                "ports": ports,
                "capture_headers": ["authorization", "cookie", "x-api-key", "x-request-id"],
                "redact_headers": ["x-api-key"],
            }
        },
        "exporters": {"file": {"directory": str(tmp / "out")}},
        "service": {
            "pipelines": {
                "traces": {"receivers": ["http"], "exporters": ["file"]},
                "metrics": {"receivers": ["http"], "exporters": ["file"]},
            },
            "telemetry": {"metrics_interval": "300ms", "drain_interval": "20ms", "log_level": "debug"},
        },
    }
    path = tmp / "otelbpf.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _http1(port: int) -> None:
    s = SECRETS
    body = s["body"].encode()
    request = (
        f"POST http://alice:{s['target-userinfo']}@127.0.0.1:{port}/cart;jsessionid={s['path-parameter']}/items"
        f"?access_token={s['query']} HTTP/1.1\r\n"
        f"Host: bob:{s['host-userinfo']}@127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {s['authorization']}\r\nCookie: sid={s['cookie']}\r\n"
        f"X-Api-Key: {s['configured-header']}\r\nX-Request-Id: control-visible\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request)
        while sock.recv(65536):
            pass


def _grpc(port: int) -> None:
    s = SECRETS
    with grpc.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.default_authority", f"u:{s['authority-userinfo']}@svc")]
    ) as channel:
        metadata = (
            ("authorization", f"Bearer {s['grpc-authorization']}"),
            ("x-api-key", s["grpc-configured"]),
            ("x-request-id", "control-visible-grpc"),
        )
        assert grpc_demo.unary(channel)(b"hello", metadata=metadata) == b"hello"
        path = f"/demo.Echo/Unary;sid={s['grpc-path-parameter']}"
        with pytest.raises(grpc.RpcError):  # no such method: the server answers UNIMPLEMENTED
            channel.unary_unary(path)(b"x", metadata=metadata)


def test_no_secret_reaches_spans_metrics_or_the_log(tmp_path):
    http_port, grpc_port = free_ports(2)
    out = tmp_path / "out"
    with (
        app("backend", str(http_port)),
        app("grpc", str(grpc_port)),
        AgentProcess(["-c", _config(tmp_path, [http_port, grpc_port])]) as agent,
    ):
        agent.wait_ready()
        _http1(http_port)
        _grpc(grpc_port)

        def exported() -> str:
            return "".join(p.read_text() for p in sorted(out.glob("*.jsonl"))) if out.exists() else ""

        wait_until(
            lambda: (
                'control-visible"' in exported()
                and "control-visible-grpc" in exported()
                and "rpc.server.duration" in exported()
                and "http.server.request.duration" in exported()
            ),
            timeout=30,
        )
        assert agent.stop(timeout=120) == 0, agent.output
    text, log = exported(), agent.output
    assert "jsessionid=REDACTED" in text and "/cart;jsessionid=REDACTED/items" in text  # the spans are there
    assert "DEBUG otelbpf.families.http.redact: loggers that would log payloads held quiet" in log  # debug level on
    leaked = {where: secret for where, secret in SECRETS.items() if secret in text or secret in log}
    assert not leaked, leaked
