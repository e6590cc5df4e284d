"""What each kind of loss means, and the option that fixes it.

The agent counts every record it could not keep, by reason (``otelbpf.events.lost{reason}``
in the kernel, ``otelbpf.events.dropped{reason}`` in user space). A count alone does not tell
a user that ``pid-32123`` and ``kernel names: 0.0%`` in ``otelbpf summary`` came from a full
string ring, nor what to change; ``explain`` does, in the words the status line of
``otelbpf run``, its last line and ``otelbpf summary`` all use."""

from __future__ import annotations

#: reason -> (what filled up or went missing, what to do about it). Reasons are those the
#: agent exports (agent.py's ``_KERNEL_DROP_REASONS``, ``Stat`` names for the rest).
LOSS_CAUSES: dict[str, tuple[str, str]] = {
    "ring_buffer_full": (
        "the events ring filled before the agent drained it",
        "raise receivers.cuda.ring_buffer_size (e.g. 16MiB), or sample fewer launches (launch_sample_every)",
    ),
    "string_ring_full": (
        "the string ring (library opens, process names, execs) filled: processes and kernels "
        "may show as pid-N or unnamed",
        "raise service.telemetry.string_ring_size (e.g. 1MiB)",
    ),
    "inflight_map_full": (
        "more CUDA calls in flight at once than the agent tracks (16,384)",
        "watch fewer processes (--pid, or run -- COMMAND)",
    ),
    "launch_map_full": (
        "more distinct (process, function, kernel) launch keys than the launch map holds",
        "watch fewer processes (--pid, or run -- COMMAND)",
    ),
    "socket_ring_full": (
        "the http receiver's payload ring filled",
        "raise receivers.http.ring_buffer_size (e.g. 64MiB), or lower receivers.http.payload_size",
    ),
    "socket_map_full": (
        "more open sockets than the http receiver tracks",
        "trace fewer processes (receivers.http.processes: gpu) or ports (receivers.http.ports)",
    ),
    "ibv_map_full": (
        "more RDMA queue pairs or requests in flight than the ibverbs receiver tracks",
        "raise receivers.ibverbs.max_queue_pairs",
    ),
    "ibv_truncated": (
        "work-request chains, SGE lists or polled batches longer than the probe reads",
        "none: the rest of each is counted, not read (see the README's RDMA limits)",
    ),
    "torch_unwound": ("torch operators left by an exception", "none: their spans end at the next operator"),
    "torch_depth": ("torch operators nested deeper than the probe tracks", "none: the inner ones are not traced"),
    "cuda_call_unplaced": (
        "a CUDA call whose shared probe program was not reached",
        "none known: report it with `otelbpf doctor`'s output",
    ),
    "processing_queue_full": (
        "the processing thread fell behind the drain",
        "raise service.telemetry.processing_queue_size, or give the agent more CPU",
    ),
}


def explain(reason: str) -> str:
    """``reason: what happened; fix: what to change`` for a loss reason, or the bare reason."""
    cause = LOSS_CAUSES.get(reason)
    return f"{reason}: {cause[0]}; fix: {cause[1]}" if cause else reason
