"""Same-host links: the client span at one end of a connection is the parent of
the server span at the other end.

Both ends of a loopback (or same-host) connection are traced; the client
registers the span of each request it writes under the connection's client
address (its own ip:port), the server's port and, for HTTP/2, the stream id.
The server looks itself up under the same key seen from its side (its peer's
address, its own port) at the time the request arrived, so the two
processes' spans join one trace without any header being injected. The
server's IP is left out of the key: a listener bound to 0.0.0.0 does not
know which of its addresses a client used, and a client address and port
are unique per server port on a host anyway.
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from dataclasses import dataclass

from opentelemetry.trace import SpanContext

Address = tuple[str, int]
Key = tuple[Address, int, int]  # client address, server port, HTTP/2 stream (0 for HTTP/1)

#: Finished client requests stay findable this long (event time): the server
#: side of the same request may be processed a little later.
RETENTION_NS = 30 * 10**9
#: ... and at most this many per connection (the most recent): a keep-alive connection carrying
#: 20k requests/s would otherwise hold 600k. The server end looks for one in flight: a recent one.
MAX_PER_CONNECTION = 4096


@dataclass(slots=True)
class ClientRequest:
    start_ns: int
    context: SpanContext
    key: Key
    end_ns: int | None = None


class PeerLinks:
    def __init__(self, retention_ns: int = RETENTION_NS) -> None:
        self._retention = retention_ns
        self._by_key: dict[Key, deque[ClientRequest]] = {}
        #: (end, key) of each request ended: the keys a sweep must look at, soonest ended first.
        self._ended: list[tuple[int, Key]] = []
        self._lock = threading.Lock()
        self._adds = 0

    def add(self, client: Address, server_port: int, stream: int, start_ns: int, context: SpanContext) -> ClientRequest:
        key = (client, server_port, stream)
        entry = ClientRequest(start_ns, context, key)
        with self._lock:
            q = self._by_key.get(key)
            if q is None:
                q = self._by_key[key] = deque(maxlen=MAX_PER_CONNECTION)
            while q and q[0].end_ns is not None and q[0].end_ns < start_ns - self._retention:
                q.popleft()
            q.append(entry)
            self._adds += 1
            if self._adds % 1024 == 0:
                self._sweep(start_ns - self._retention)
        return entry

    def _sweep(self, horizon: int) -> None:
        """Drop connections whose requests all ended before ``horizon``. Only keys with a request
        that ended before it can qualify, so only those are looked at (HTTP/2 has a key per stream:
        scanning every key held over the retention window would cost that many per sweep)."""
        ended, by_key = self._ended, self._by_key
        candidates = set()
        while ended and ended[0][0] < horizon:
            candidates.add(heapq.heappop(ended)[1])
        for key in candidates:
            q = by_key.get(key)
            if q is not None and all(e.end_ns is not None and e.end_ns < horizon for e in q):
                del by_key[key]

    def end(self, entry: ClientRequest, end_ns: int) -> None:
        with self._lock:
            entry.end_ns = end_ns
            heapq.heappush(self._ended, (end_ns, entry.key))

    def find(self, client: Address, server_port: int, stream: int, ts_ns: int) -> SpanContext | None:
        """The client request on this connection that was in flight at ``ts_ns``."""
        with self._lock:
            q = self._by_key.get((client, server_port, stream))
            if not q:
                return None
            for entry in reversed(q):
                if entry.start_ns <= ts_ns and (entry.end_ns is None or ts_ns <= entry.end_ns):
                    return entry.context
        return None
