"""A real ASGI server (uvicorn, as FastAPI and vLLM's OpenAI server run) for end-to-end tests,
in its own process: ``python -m harness.asgi_apps PORT``. Prints ``ready`` once it listens.

- ``POST /generate``: server-sent events, ``len(TOKENS)`` token events ``GAP_S`` apart, the first
  ``GAP_S`` after the request, in chunked encoding as uvicorn writes a streamed body;
- ``GET /health``: 200 ``ok`` with a ``Content-Length``;
- anything else: 404 ``not found``.
"""

from __future__ import annotations

import asyncio
import socket
import sys

import uvicorn

TOKENS = ["The", " answer", " is", " forty", "-two"]
GAP_S = 0.05
#: The least a streamed response lasts after its request: every token waits its gap.
STREAM_S = len(TOKENS) * GAP_S


async def app(scope: dict, receive, send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body"):
        pass
    path, method = scope["path"], scope["method"]
    if path == "/generate" and method == "POST":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for token in TOKENS:
            await asyncio.sleep(GAP_S)
            await send({"type": "http.response.body", "body": b"data: %s\n\n" % token.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    status, body = (200, b"ok") if path == "/health" else (404, b"not found")
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    port = int(sys.argv[1])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    print("ready", flush=True)  # connections wait in the backlog until uvicorn accepts them
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
