"""``otelbpf mcp``: the diagnosis as MCP tools, over stdio or streamable HTTP.

Read-only by construction: the tools read one output folder chosen at start, or a running
agent's live state (``--live``, mcp/live.py), never a path a caller names (a profile is named
by its file name, checked against the folder's list), and nothing runs a command. Every list
is cut at ``limit`` (at most ``MAX_LIMIT``); a bad argument, an unknown id, or a folder that
cannot be read comes back as a tool error that says what is there, and the server goes on
serving.

HTTP binds to 127.0.0.1 unless told otherwise, with the SDK's DNS-rebinding check on
localhost, and every request must carry ``Authorization: Bearer <token>``: the token comes
from ``OTELBPF_MCP_TOKEN`` or a file, and the server refuses to start without one.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field

from otelbpf.live.endpoint import EndpointError
from otelbpf.mcp import live, tools
from otelbpf.mcp.folder import Folder, FolderError, JsonObject

MAX_LIMIT = 200
TOKEN_ENV = "OTELBPF_MCP_TOKEN"
#: A token shorter than this is refused: it would be guessable.
MIN_TOKEN_CHARS = 16

Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT, description=f"most items to return (1..{MAX_LIMIT})")]
Pid = Annotated[int | None, Field(ge=0, le=1 << 22, description="only this process (default: all)")]
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)


_Tool = TypeVar("_Tool", bound=Callable[..., Any])


class TokenError(Exception):
    """No usable bearer token for the HTTP transport."""


def build(source: Folder | live.LiveSource) -> MCPServer:
    """The server with its tools over an output folder, or over a running agent's live state."""
    is_live = isinstance(source, live.LiveSource)
    # The source as its own type, for the tools that differ between the two.
    live_source = source if isinstance(source, live.LiveSource) else None
    folder = source if isinstance(source, Folder) else None
    what = (
        f"the live state of the running otelbpf agent ({source.path}): its last metrics and last spans"
        if is_live
        else f"telemetry otelbpf wrote to {source.path}: spans, metrics and pprof profiles"
    )
    server = MCPServer(
        "otelbpf",
        version="0.1.0",
        log_level="WARNING",
        instructions=f"CUDA, NCCL and HTTP activity from {what}. Every answer cites the span ids, trace ids, "
        "metric points or profile samples it rests on (`evidence`).",
    )

    async def answer(call: Callable[..., JsonObject], *args: Any, with_data: bool = True) -> JsonObject:
        def work() -> JsonObject:
            try:
                return call(source.load(), *args) if with_data else call(*args)
            except (FolderError, EndpointError, tools.ToolInputError) as exc:
                raise ToolError(str(exc)) from None

        return await anyio.to_thread.run_sync(work)

    def tool(fn: _Tool) -> _Tool:
        # structured_output=False: the answers go out as JSON text, with no output schema. (The SDK infers
        # one from a dict[str, Any] return annotation, which a bare ``dict`` did not give it.)
        return server.tool(annotations=READ_ONLY, structured_output=False)(fn)

    @tool
    async def list_processes(limit: Limit = 50) -> JsonObject:
        """Processes in the folder, GPU processes first: service, pid, command line, spans by scope,
        kernel launches, their profile files."""
        return await answer(lambda d: tools.list_processes(d, source.profile_files(), limit))

    @tool
    async def gpu_summary(pid: Pid = None) -> JsonObject:
        """Per GPU process: launches and calls by API function, bytes copied by direction and by pinned or
        pageable host memory, sync waits, device memory high-water, CUDA errors, its slowest calls."""
        return await answer(tools.gpu_summary, pid)

    @tool
    async def top_kernels(pid: Pid = None, limit: Limit = 20) -> JsonObject:
        """Kernels by launches (demangled names), per process."""
        return await answer(tools.top_kernels, pid, limit)

    @tool
    async def findings(limit: Limit = 20) -> JsonObject:
        """Why the GPU sits idle (`otelbpf diagnose`): causes ranked by estimated cost, with the fix and
        the spans that show each."""
        if live_source is not None:
            return await answer(lambda: live.findings(live_source.snapshot(), limit), with_data=False)
        assert folder is not None  # one or the other
        return await answer(lambda d: tools.findings(folder, d, limit))

    @tool
    async def stragglers(
        threshold_ms: Annotated[float, Field(ge=0, le=60_000)] = 1.0,
        min_share: Annotated[float, Field(ge=0, le=1)] = 0.3,
        limit: Limit = 20,
    ) -> JsonObject:
        """NCCL ranks that enter collectives last (`otelbpf stragglers`): persistent stragglers, their class
        (compute, host or communication slow), and the collectives where each entered latest. Live: the
        agent's own detector's counts (``threshold_ms`` and ``min_share`` apply to folders)."""
        if live_source is not None:
            return await answer(lambda: _live_ranks(live_source, limit), with_data=False)
        assert folder is not None  # one or the other
        return await answer(lambda d: tools.stragglers_report(folder, d, threshold_ms, min_share, limit))

    @tool
    async def slow_requests(
        limit: Limit = 10,
        min_duration_ms: Annotated[float, Field(ge=0)] = 0.0,
        route: Annotated[str | None, Field(max_length=256)] = None,
    ) -> JsonObject:
        """The slowest HTTP/gRPC server requests, each with its CUDA children and the share of its time
        spent in CUDA calls. ``route``: keep routes containing this text."""
        return await answer(tools.slow_requests, limit, min_duration_ms, route)

    @tool
    async def trace(trace_id: Annotated[str, Field(min_length=1, max_length=64)], limit: Limit = 100) -> JsonObject:
        """Every span of one trace, in start order, with its depth in the tree."""
        return await answer(tools.trace, trace_id, limit)

    @tool
    async def flamegraph_top(
        profile: Annotated[str, Field(min_length=1, max_length=256)],
        n: Limit = 20,
        sample_type: Annotated[str | None, Field(max_length=64)] = None,
    ) -> JsonObject:
        """The heaviest functions of one pprof profile (a file name from list_processes' `profiles`): total
        and self value, and the samples that weigh most in each."""
        if folder is None:
            raise ToolError("profiles are not in the live state: run this server over an output folder")
        return await answer(tools.flamegraph_top, folder, profile, n, sample_type, with_data=False)

    @tool
    async def compare_ranks(
        a: Annotated[int, Field(ge=0, le=1 << 20)],
        b: Annotated[int, Field(ge=0, le=1 << 20)],
        comm: Annotated[str | None, Field(max_length=32)] = None,
        limit: Limit = 10,
    ) -> JsonObject:
        """Two NCCL ranks side by side on each communicator they share: who entered later how often, the
        entry gap, durations, GPU wait and host phases, and the collectives with the widest gap."""
        return await answer(tools.compare_ranks, a, b, comm, limit)

    return server


def _live_ranks(source: live.LiveSource, limit: int) -> JsonObject:
    snap = source.snapshot()
    out = live.ranks(snap, limit)
    tools.cite_late_entries(live.to_data(snap), out["ranks"])
    return out


def read_token(token_file: str | None) -> str:
    """The bearer token: from ``token_file`` (owner-only) or ``OTELBPF_MCP_TOKEN``."""
    if token_file:
        try:
            st = os.stat(token_file)
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise TokenError(f"token file {token_file}: {exc.strerror}") from None
        if st.st_mode & 0o077:
            raise TokenError(f"token file {token_file} is readable by others (chmod 600 it)")
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise TokenError(f"the HTTP transport needs a bearer token: set {TOKEN_ENV} or pass --token-file")
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenError(f"the bearer token is shorter than {MIN_TOKEN_CHARS} characters")
    return token


class BearerAuth:
    """ASGI middleware: a request without ``Authorization: Bearer <token>`` gets 401."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self._expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or ()).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"text/plain"), (b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": b"a bearer token is required\n"})
                return
        await self.app(scope, receive, send)


def http_app(server: MCPServer, token: str, host: str) -> Any:
    return BearerAuth(server.streamable_http_app(host=host), token)


def serve(
    directory: str | None,
    *,
    transport: str,
    host: str = "127.0.0.1",
    port: int = 8765,
    token_file: str | None = None,
    max_bytes: int = 1 << 30,
    live_socket: str | None = None,
) -> None:
    """Over ``directory``, or, with ``directory`` None, over the agent at ``live_socket`` (None:
    the newest in the run directory)."""
    server = build(Folder(directory, max_bytes=max_bytes) if directory is not None else live.LiveSource(live_socket))
    if transport == "stdio":
        server.run("stdio")
        return
    token = read_token(token_file)
    import uvicorn

    uvicorn.run(http_app(server, token, host), host=host, port=port, log_level="warning")
