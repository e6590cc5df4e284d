"""End to end: TLS through OpenSSL's uprobes (the tls receiver), and GenAI client spans.

Real services in their own processes (harness/tls_apps.py): the OpenAI-compatible streaming
server of test_http_streaming_agent.py served over HTTPS by Python's ``ssl`` (the system's
OpenSSL 3), one server speaking the OpenAI, Anthropic and Gemini wire formats over HTTPS and one
over plain HTTP, and a gateway whose requests call a model upstream. Real clients: this
process (unwatched: the servers' side), and a watched runner process that makes requests with
urllib, runs ``curl`` and ``openssl s_client``, and loads a library that exports ``SSL_read``
but is not OpenSSL. One agent (``--pid`` on them all) and the real OTLP collector (rotel).
Expected values come from what the services plant (harness/streaming_apps.py: FIRST_S, GAP_S,
TOKENS; the request's max_tokens as the prompt tokens).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap

import pytest
import yaml

from harness.agent import REPO, AgentProcess
from harness.otlp import OtlpCollector
from harness.streaming_apps import FIRST_S, GAP_S, TOKENS
from harness.tls_apps import make_cert, tgi_stream, triton_stream

pytestmark = pytest.mark.bpf

SLACK = 0.25
#: A library named like OpenSSL's that is not: its SSL_read writes a fixed string.
FAKE_LIBSSL_C = textwrap.dedent(
    """
    #include <string.h>
    int SSL_read(void *ssl, void *buf, int num)
    {
        (void)ssl;
        if (num > 5)
            num = 5;
        memcpy(buf, "fake!", num);
        return num;
    }
    int SSL_write(void *ssl, const void *buf, int num) { (void)ssl; (void)buf; return num; }
    """
)

#: An HTTPS client on a libssl loaded by path (a wheel's bundled copy), with dlopen: no headers
#: needed. It waits for a line on stdin after the load, so that the test can wait for the probes.
DLOPEN_CLIENT_C = textwrap.dedent(
    r"""
    #include <dlfcn.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include <arpa/inet.h>
    #include <netinet/in.h>
    #include <sys/socket.h>
    typedef void *(*none_fn)(void);
    typedef void *(*one_fn)(void *);
    int main(int argc, char **argv)
    {
        void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        if (!lib)
            return 2;
        char line[8];
        if (!fgets(line, sizeof(line), stdin))
            return 6;
        none_fn method = (none_fn)dlsym(lib, "TLS_client_method");
        one_fn ctx_new = (one_fn)dlsym(lib, "SSL_CTX_new"), ssl_new = (one_fn)dlsym(lib, "SSL_new");
        int (*set_fd)(void *, int) = (int (*)(void *, int))dlsym(lib, "SSL_set_fd");
        int (*handshake)(void *) = (int (*)(void *))dlsym(lib, "SSL_connect");
        int (*ssl_write)(void *, const void *, int) = (int (*)(void *, const void *, int))dlsym(lib, "SSL_write");
        int (*ssl_read)(void *, void *, int) = (int (*)(void *, void *, int))dlsym(lib, "SSL_read");
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
        inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
        if (connect(s, (struct sockaddr *)&a, sizeof(a)))
            return 3;
        void *ssl = ssl_new(ctx_new(method()));
        set_fd(ssl, s);
        if (handshake(ssl) != 1)
            return 4;
        const char *body = "{\"model\": \"wheel-model\", \"max_tokens\": 2}";
        char req[512], buf[4096];
        int n = snprintf(req, sizeof(req),
                         "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                         strlen(body), body);
        ssl_write(ssl, req, n);
        int total = 0, got;
        while ((got = ssl_read(ssl, buf, sizeof(buf))) > 0)
            total += got;
        return total > 0 ? 0 : 5;
    }
    """
)

#: The runner: executes each line of Python it reads, answers ``done`` or ``error: ...``.
RUNNER = textwrap.dedent(
    """
    import sys, traceback
    print("ready", flush=True)
    g = {}
    for line in sys.stdin:
        try:
            exec(line, g)
            print("done", flush=True)
        except Exception as exc:
            print("error: " + repr(exc).replace(chr(10), " "), flush=True)
    """
)


def free_ports(n: int) -> list[int]:
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@contextlib.contextmanager
def service(*args: str):
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.tls_apps", *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO / "tests",
        env={**os.environ, "PYTHONPATH": str(REPO / "tests")},
    )
    try:
        assert proc.stdout.readline().startswith("ready"), f"{args[0]} service did not start"
        yield proc
    finally:
        proc.kill()
        proc.wait()


class Runner:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO
        )
        assert self.proc.stdout.readline().startswith("ready")

    def run(self, code: str) -> None:
        assert "\n" not in code
        self.proc.stdin.write(code + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        assert answer == "done", answer

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = make_cert(tmp)
    sse_port, tls_port, plain_port, gw_port, grpc_port, h2_port, async_port = free_ports(7)
    with OtlpCollector() as collector:
        doc = {
            "receivers": {
                "http": {
                    "processes": "all",
                    "ports": [sse_port, tls_port, plain_port, gw_port, grpc_port, h2_port, async_port],
                },
                "tls": {"processes": "all"},
            },
            "processors": {"batch": {"timeout": "100ms"}},
            "exporters": {"otlp": {"endpoint": collector.grpc_endpoint, "timeout": "2s"}},
            "service": {
                "pipelines": {
                    p: {"receivers": ["http", "tls"], "processors": ["batch"], "exporters": ["otlp"]}
                    for p in ("traces", "metrics")
                },
                "telemetry": {"metrics_interval": "300ms", "drain_interval": "20ms"},
            },
        }
        (tmp / "otelbpf.yaml").write_text(yaml.safe_dump(doc))
        runner = Runner()
        runner.run("import json, os, socket, ssl, subprocess, urllib.request, ctypes")
        runner.run(f"ctx = ssl.create_default_context(cafile={str(cert)!r})")
        try:
            with (
                service("sse-tls", str(sse_port), str(cert), str(key)) as sse,
                service("providers", str(tls_port), str(cert), str(key)) as tls_srv,
                service("providers", str(plain_port)) as plain_srv,
                service("gateway", str(gw_port), f"https://127.0.0.1:{tls_port}", str(cert)) as gateway,
                service("grpc-gen", str(grpc_port)) as grpc_gen,
                service("h2-tls", str(h2_port), str(cert), str(key)) as h2_srv,
                service("async-tls", str(async_port), str(cert), str(key)) as async_srv,
                AgentProcess(
                    [
                        "-c",
                        str(tmp / "otelbpf.yaml"),
                        *(
                            a
                            for p in (sse, tls_srv, plain_srv, gateway, grpc_gen, h2_srv, async_srv, runner.proc)
                            for a in ("--pid", str(p.pid))
                        ),
                    ]
                ) as agent,
            ):
                agent.wait_ready()
                ports = {
                    "sse": sse_port,
                    "tls": tls_port,
                    "plain": plain_port,
                    "gateway": gw_port,
                    "grpc": grpc_port,
                    "h2": h2_port,
                    "async": async_port,
                }
                pids = {
                    "sse": sse.pid,
                    "tls": tls_srv.pid,
                    "gateway": gateway.pid,
                    "grpc": grpc_gen.pid,
                    "h2": h2_srv.pid,
                    "async": async_srv.pid,
                    "runner": runner.proc.pid,
                }
                yield collector, agent, runner, ports, pids, tmp, cert
                assert agent.proc.poll() is None, agent.output
                assert agent.stop(timeout=120) == 0, agent.output
        finally:
            runner.close()


def spans_of(c, pid: int, kind: str) -> list:
    return [
        s
        for s in c.spans()
        if s.scope_name == "otelbpf.http" and s.kind == f"SPAN_KIND_{kind}" and s.attributes.get("process.pid") == pid
    ]


def self_metric(c, name: str, **filters) -> int:
    return int(sum(p.value for p in c.latest_points(name, **filters)))


def test_https_streaming_server_gives_spans_ttft_and_tokens_as_plain_http(stack):
    """The issue's case: 5 of 5 streamed completions over HTTPS, TTFT as planted, tokens counted."""
    c, _agent, _runner, ports, pids, _tmp, cert = stack
    context = ssl.create_default_context(cafile=str(cert))
    for _ in range(5):
        conn = http.client.HTTPSConnection("127.0.0.1", ports["sse"], timeout=10, context=context)
        body = {"messages": [{"role": "user", "content": "secret-prompt"}], "model": "tiny-llm", "stream": True}
        conn.request("POST", "/v1/chat/completions", body=json.dumps({**body, "max_tokens": 7}))
        assert b"[DONE]" in conn.getresponse().read()
        conn.close()
    spans = c.wait_for(lambda: len(spans_of(c, pids["sse"], "SERVER")) >= 5 and spans_of(c, pids["sse"], "SERVER"))
    assert len(spans) == 5
    for s in spans:
        a = s.attributes
        assert (a["url.scheme"], a["url.path"], a["http.response.status_code"]) == (
            "https",
            "/v1/chat/completions",
            200,
        )
        assert (a["gen_ai.provider.name"], a["gen_ai.request.model"], a["gen_ai.response.model"]) == (
            "openai",
            "tiny-llm",
            "tiny-llm-served",
        )
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (7, len(TOKENS))
        assert FIRST_S <= a["otelbpf.http.response.time_to_first_event"] < FIRST_S + SLACK
        assert GAP_S * 0.9 <= a["otelbpf.http.response.event_gap.max"] < GAP_S + SLACK
        assert a["server.port"] == ports["sse"] and a["client.address"] == "127.0.0.1"
    everything = repr([(s.attributes, s.status_message) for s in c.spans()])
    assert "secret-prompt" not in everything and "forty" not in everything
    f = {"process.pid": pids["sse"], "gen_ai.request.model": "tiny-llm"}
    [ttft] = c.wait_for(
        lambda: [p for p in c.latest_points("gen_ai.server.time_to_first_token", **f) if p.count == 5],
        what="time to first token of 5",
    )
    assert FIRST_S * 5 <= ttft.sum < (FIRST_S + SLACK) * 5
    [tpot] = c.latest_points("gen_ai.server.time_per_output_token", **f)
    assert tpot.count == 5 and GAP_S * 0.9 * 5 <= tpot.sum < (GAP_S + SLACK) * 5


def test_curl_https_client_and_server_spans(stack):
    """curl (OpenSSL through its own BIO: send/recv) as a watched client: both ends, one trace."""
    c, _agent, runner, ports, pids, _tmp, cert = stack
    body = json.dumps({"model": "curl-model", "max_tokens": 3, "messages": []})
    runner.run(
        f"subprocess.run(['curl', '-sS', '--cacert', {str(cert)!r}, '-o', '/dev/null', '-H', "
        f"'Content-Type: application/json', '-d', {body!r}, "
        f"'https://127.0.0.1:{ports['tls']}/v1/messages'], check=True)"
    )

    def found():
        clients = [
            s
            for s in c.spans()
            if s.kind == "SPAN_KIND_CLIENT" and s.attributes.get("gen_ai.request.model") == "curl-model"
        ]
        servers = [
            s for s in spans_of(c, pids["tls"], "SERVER") if s.attributes.get("gen_ai.request.model") == "curl-model"
        ]
        return clients and servers and (clients, servers)

    [client], [server] = c.wait_for(found, what="curl's client span and the server's")
    assert client.attributes["url.scheme"] == "https" and client.attributes["server.port"] == ports["tls"]
    assert client.attributes["gen_ai.provider.name"] == "anthropic"
    assert client.attributes["gen_ai.usage.output_tokens"] == len(TOKENS)
    assert server.trace_id == client.trace_id  # the two ends of one connection on this host


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_genai_client_spans_and_metrics_for_three_providers(stack, scheme):
    c, _agent, runner, ports, pids, _tmp, _cert = stack
    port = ports["tls" if scheme == "https" else "plain"]
    model = f"{scheme}-model"
    calls = [
        ("/v1/chat/completions", {"model": model + "-openai", "max_tokens": 4, "messages": []}, "openai", "chat"),
        ("/v1/messages", {"model": model + "-anthropic", "max_tokens": 4, "messages": []}, "anthropic", "chat"),
    ]
    for stream in (False, True):
        for path, body, _p, _o in calls:
            runner.run(
                f"urllib.request.urlopen(urllib.request.Request('{scheme}://127.0.0.1:{port}{path}', "
                f"data={json.dumps({**body, 'stream': stream}).encode()!r}), "
                f"context=ctx if {scheme == 'https'} else None, "
                "timeout=10).read()"
            )
        gemini = f"/v1beta/models/{model}-gemini:" + ("streamGenerateContent?alt=sse" if stream else "generateContent")
        runner.run(
            f"urllib.request.urlopen(urllib.request.Request('{scheme}://127.0.0.1:{port}{gemini}', "
            f'data=b\'{{"generationConfig": {{"maxOutputTokens": 4}}}}\'), '
            f"context=ctx if {scheme == 'https'} else None, "
            "timeout=10).read()"
        )

    def mine():
        return [
            s
            for s in spans_of(c, pids["runner"], "CLIENT")
            if str(s.attributes.get("gen_ai.request.model", "")).startswith(model)
        ]

    spans = c.wait_for(lambda: len(mine()) >= 6 and mine(), what="6 GenAI client spans")
    assert len(spans) == 6
    by = {
        (
            s.attributes["gen_ai.provider.name"],
            "stream" if "otelbpf.http.response.events" in s.attributes else "json",
        ): s
        for s in spans
    }
    assert set(by) == {(p, k) for p in ("openai", "anthropic", "gcp.gemini") for k in ("json", "stream")}
    for (provider, how), s in by.items():
        a = s.attributes
        suffix = {"openai": "-openai", "anthropic": "-anthropic", "gcp.gemini": "-gemini"}[provider]
        assert a["gen_ai.request.model"] == model + suffix and a["gen_ai.response.model"] == model + suffix + "-served"
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (4, len(TOKENS)), (provider, how)
        assert a["gen_ai.operation.name"] == ("generate_content" if provider == "gcp.gemini" else "chat")
        assert (a.get("url.scheme") == "https") == (scheme == "https")
        if how == "stream":
            assert FIRST_S <= a["otelbpf.http.response.time_to_first_event"] < FIRST_S + SLACK
    f = {
        "process.pid": pids["runner"],
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": model + "-anthropic",
    }
    [duration] = c.wait_for(
        lambda: [p for p in c.latest_points("gen_ai.client.operation.duration", **f) if p.count == 2],
        what="gen_ai.client.operation.duration",
    )
    assert duration.attributes["gen_ai.response.model"] == model + "-anthropic-served"
    usage = {p.attributes["gen_ai.token.type"]: p for p in c.latest_points("gen_ai.client.token.usage", **f)}
    assert (usage["input"].count, usage["input"].sum, usage["output"].count, usage["output"].sum) == (2, 8, 2, 10)
    [first] = c.latest_points("gen_ai.client.operation.time_to_first_chunk", **f)
    assert first.count == 1 and FIRST_S <= first.sum < FIRST_S + SLACK


def test_a_model_call_made_while_serving_is_a_child_of_that_request(stack):
    """An application serving /ask calls a hosted model (HTTPS) on the same thread: its GenAI
    client span is a child of the /ask server span."""
    c, _agent, _runner, ports, pids, _tmp, _cert = stack
    conn = http.client.HTTPConnection("127.0.0.1", ports["gateway"], timeout=10)
    conn.request("GET", "/ask")
    assert conn.getresponse().read() == b"answered"
    conn.close()
    [server] = c.wait_for(lambda: spans_of(c, pids["gateway"], "SERVER"), what="the /ask span")
    [client] = c.wait_for(lambda: spans_of(c, pids["gateway"], "CLIENT"), what="the model call")
    assert client.attributes["gen_ai.request.model"] == "claude-gw" and client.attributes["url.scheme"] == "https"
    assert client.parent_span_id == server.span_id and client.trace_id == server.trace_id


def test_bad_input_counted_without_crash(stack):
    """A library that exports SSL_read but is not OpenSSL is not probed (counted); reads that
    return nothing (a non-blocking read with no data), a truncated TLS record and a TLS 1.2
    renegotiation in the middle of a connection are counted or parsed through, and the agent
    and every service go on."""
    c, agent, runner, ports, pids, tmp, cert = stack
    fake_dir = tmp / "fake"
    fake_dir.mkdir()
    (fake_dir / "fake.c").write_text(FAKE_LIBSSL_C)
    lib = fake_dir / "libssl.so.3"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(fake_dir / "fake.c")], check=True)
    runner.run(
        f"fake = ctypes.CDLL({str(lib)!r}); b = ctypes.create_string_buffer(8); assert fake.SSL_read(None, b, 8) == 5"
    )
    # nothing to read: SSL_read returns -1 (want read)
    runner.run(
        f"s = ctx.wrap_socket(socket.create_connection(('127.0.0.1', {ports['tls']})), server_hostname='127.0.0.1'); "
        "s.setblocking(False)"
    )
    runner.run("exec('try:\\n s.recv(10)\\nexcept ssl.SSLWantReadError:\\n pass')")
    # a truncated application-data record on the same connection, then EOF: the server's SSL_read fails
    runner.run(
        "raw = socket.socket(fileno=os.dup(s.fileno())); "
        "raw.send(b'\\x17\\x03\\x03\\x00\\x40' + b'x' * 10); raw.close(); s.close()"
    )
    # renegotiation (TLS 1.2, s_client's R command), then a request on the renegotiated connection
    body = json.dumps({"model": "reneg-model", "max_tokens": 2})
    request = f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    runner.run(
        f"p = subprocess.Popen(['openssl', 's_client', '-connect', '127.0.0.1:{ports['tls']}', '-tls1_2', '-CAfile', "
        f"{str(cert)!r}], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)"
    )
    runner.run("import time; p.stdin.write(b'R\\n'); p.stdin.flush(); time.sleep(0.5)")
    runner.run(
        f"p.stdin.write({request.encode()!r}); p.stdin.flush(); time.sleep(1); p.stdin.close(); out = p.stdout.read()"
    )
    runner.run("p.wait(); assert b'RENEGOTIATING' in out and b'reneg-model-served' in out, out")
    [reneg] = c.wait_for(
        lambda: [
            s for s in spans_of(c, pids["tls"], "SERVER") if s.attributes.get("gen_ai.request.model") == "reneg-model"
        ],
        what="the request after the renegotiation",
    )
    assert (reneg.attributes["url.scheme"], reneg.attributes["gen_ai.usage.output_tokens"]) == ("https", len(TOKENS))
    c.wait_for(
        lambda: self_metric(c, "otelbpf.tls.libraries.rejected", reason="not_openssl") >= 1,
        what="the rejected library counted",
    )
    assert "does not export OpenSSL's functions" in agent.output
    c.wait_for(lambda: self_metric(c, "otelbpf.tls.calls", outcome="no_data") >= 1, what="reads with no data counted")
    assert agent.proc.poll() is None, agent.output
    # the services still answer, and are still traced
    context = ssl.create_default_context(cafile=str(cert))
    conn = http.client.HTTPSConnection("127.0.0.1", ports["tls"], timeout=10, context=context)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({"model": "after-bad-input", "max_tokens": 1}))
    assert conn.getresponse().read()
    conn.close()
    c.wait_for(
        lambda: [
            s
            for s in spans_of(c, pids["tls"], "SERVER")
            if s.attributes.get("gen_ai.request.model") == "after-bad-input"
        ],
        what="a span after the bad input",
    )


def test_grpc_generation_streams_timed_and_tokens_counted(stack):
    """Triton's ModelStreamInfer: model from the request, response model and id, one token per
    response with outputs (the final empty one not), TTFT as planted; a TGI-style GenerateStream:
    timed, its messages counted as estimated tokens."""
    c, _agent, _runner, ports, pids, _tmp, _cert = stack
    assert triton_stream(ports["grpc"], "trt-llm") == len(TOKENS) + 1
    assert tgi_stream(ports["grpc"]) == len(TOKENS)

    def by_name():
        return {s.name: s for s in spans_of(c, pids["grpc"], "SERVER")}

    spans = c.wait_for(lambda: len(by_name()) == 2 and by_name(), what="the two gRPC streams")
    triton = spans["inference.GRPCInferenceService/ModelStreamInfer"].attributes
    assert (triton["gen_ai.provider.name"], triton["gen_ai.operation.name"]) == ("triton", "text_completion")
    assert (triton["gen_ai.request.model"], triton["gen_ai.response.model"], triton["gen_ai.response.id"]) == (
        "trt-llm",
        "trt-llm-served",
        "req-1",
    )
    assert triton["gen_ai.usage.output_tokens"] == len(TOKENS)
    assert triton["otelbpf.gen_ai.usage.output_tokens.estimated"] is True
    tgi = spans["generate.v2.TextGeneration/GenerateStream"].attributes
    assert (tgi["gen_ai.provider.name"], tgi["gen_ai.usage.output_tokens"]) == ("generate.v2", len(TOKENS))
    assert "gen_ai.request.model" not in tgi
    f = {"process.pid": pids["grpc"], "gen_ai.provider.name": "triton"}
    [ttft] = c.wait_for(lambda: c.latest_points("gen_ai.server.time_to_first_token", **f), what="Triton's TTFT")
    assert ttft.count == 1 and FIRST_S <= ttft.sum < FIRST_S + SLACK
    [tpot] = c.latest_points("gen_ai.server.time_per_output_token", **f)
    assert GAP_S * 0.9 <= tpot.sum < GAP_S + SLACK


def test_a_wheel_s_bundled_libssl_at_any_path_is_found_and_traced(stack):
    """A copy of libssl named as auditwheel names it, in a folder of its own, loaded with dlopen by
    a C client the runner starts: found at its open, probed, and the client's HTTPS call traced."""
    c, agent, runner, ports, pids, tmp, _cert = stack
    folder = tmp / "site-packages" / "pkg.libs"
    folder.mkdir(parents=True)
    lib = folder / "libssl-1a2b3c4d.so.3"
    shutil.copy("/usr/lib/x86_64-linux-gnu/libssl.so.3", lib)
    (folder / "client.c").write_text(DLOPEN_CLIENT_C)
    subprocess.run(["gcc", "-O1", "-o", str(folder / "client"), str(folder / "client.c"), "-ldl"], check=True)
    runner.run(
        f"w = subprocess.Popen([{str(folder / 'client')!r}, {str(lib)!r}, '{ports['tls']}'], stdin=subprocess.PIPE)"
    )
    agent.wait_attached(lib)
    runner.run("w.stdin.write(b'go\\n'); w.stdin.close(); assert w.wait(timeout=20) == 0")
    [client] = c.wait_for(
        lambda: [
            s
            for s in c.spans()
            if s.kind == "SPAN_KIND_CLIENT" and s.attributes.get("gen_ai.request.model") == "wheel-model"
        ],
        what="the bundled copy's client span",
    )
    a = client.attributes
    assert (a["url.scheme"], a["server.port"], a["gen_ai.provider.name"]) == ("https", ports["tls"], "anthropic")
    assert a["gen_ai.usage.output_tokens"] == len(TOKENS) and a["process.pid"] != pids["runner"]


def test_http2_over_tls_curl_and_an_h2_server(stack):
    """curl --http2 (ALPN h2: OpenSSL carries the preface and frames) against an h2 server on
    Python's ssl: HTTP/2 client and server spans with the completion's GenAI attributes."""
    c, _agent, runner, ports, pids, _tmp, cert = stack
    body = json.dumps({"model": "h2-model", "max_tokens": 3})
    runner.run(
        f"subprocess.run(['curl', '-sS', '--http2', '--cacert', {str(cert)!r}, '-o', '/dev/null', '-H', "
        f"'Content-Type: application/json', '-d', {body!r}, "
        f"'https://127.0.0.1:{ports['h2']}/v1/chat/completions'], check=True)"
    )

    def found():
        both = [s for s in c.spans() if s.attributes.get("gen_ai.request.model") == "h2-model"]
        return len(both) == 2 and both

    spans = c.wait_for(found, what="the HTTP/2 client and server spans")
    by_kind = {s.kind: s.attributes for s in spans}
    assert set(by_kind) == {"SPAN_KIND_CLIENT", "SPAN_KIND_SERVER"}
    for a in by_kind.values():
        assert (a["network.protocol.version"], a["url.scheme"], a["http.response.status_code"]) == ("2", "https", 200)
        assert (a["gen_ai.response.model"], a["gen_ai.usage.output_tokens"]) == ("h2-model-served", len(TOKENS))
    assert by_kind["SPAN_KIND_SERVER"]["process.pid"] == pids["h2"]


def test_asyncio_tls_memory_bios_are_traced_without_addresses(stack):
    """asyncio's TLS (uvicorn's: OpenSSL with memory BIOs, no syscall inside an SSL call): the
    connection is keyed by its SSL object; spans, TTFT and the model as over a socket BIO, no
    peer address (none can be known from the calls)."""
    c, _agent, _runner, ports, pids, _tmp, cert = stack
    context = ssl.create_default_context(cafile=str(cert))
    conn = http.client.HTTPSConnection("127.0.0.1", ports["async"], timeout=10, context=context)
    for _ in range(2):  # keep-alive: two requests on one connection
        conn.request("POST", "/v1/chat/completions", body=json.dumps({"model": "async-model", "stream": True}))
        assert b"[DONE]" in conn.getresponse().read()
    conn.close()
    spans = c.wait_for(lambda: len(spans_of(c, pids["async"], "SERVER")) == 2 and spans_of(c, pids["async"], "SERVER"))
    for s in spans:
        a = s.attributes
        assert (a["url.scheme"], a["gen_ai.request.model"], a["gen_ai.response.model"]) == (
            "https",
            "async-model",
            "async-model-served",
        )
        assert FIRST_S <= a["otelbpf.http.response.time_to_first_event"] < FIRST_S + SLACK
        assert a["gen_ai.usage.output_tokens"] == len(TOKENS) and "client.address" not in a
    c.wait_for(lambda: self_metric(c, "otelbpf.tls.calls", outcome="no_fd") >= 4, what="records without an fd counted")


def test_partial_reads_one_byte_at_a_time_are_reassembled(stack):
    """A client reading its response one byte per SSL_read (most served from OpenSSL's buffer,
    with no syscall: the fd remembered per SSL object): one client span, the body read whole."""
    c, _agent, runner, ports, pids, _tmp, _cert = stack
    body = json.dumps({"model": "partial-model", "max_tokens": 3})
    request = f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    runner.run(
        f"p2 = ctx.wrap_socket(socket.create_connection(('127.0.0.1', {ports['tls']})), server_hostname='127.0.0.1'); "
        f"p2.sendall({request.encode()!r}); got = b''"
    )
    runner.run(
        "exec('while True:\\n b = p2.recv(1)\\n if not b: break\\n got += b'); p2.close(); assert got.endswith(b'}')"
    )
    [client] = c.wait_for(
        lambda: [
            s
            for s in spans_of(c, pids["runner"], "CLIENT")
            if s.attributes.get("gen_ai.request.model") == "partial-model"
        ],
        what="the client span read byte by byte",
    )
    a = client.attributes
    assert (a["http.response.status_code"], a["gen_ai.usage.output_tokens"], a["server.port"]) == (
        200,
        len(TOKENS),
        ports["tls"],
    )
