"""Communicators created before the probes were attached: who they are, and which
collective is which across ranks.

The agent is usually started after the job (a DaemonSet, a job running for hours), so it
never sees ``ncclCommInitRank``: the probes report such a communicator by its ``ncclComm_t``
pointer, with no id, rank or sequence number (bpf/nccl.c, ``EVF_NCCL_UNKNOWN_COMM``).

**Identity.** Within a process, the pointer. Across the processes of this host, a *group*:
(the job, from the launcher's environment (launch_env.py); the communicator's size; its
ordinal among this process's late communicators of that size, in first-use order). The
size comes from ``ncclCommCount`` when the process called it, else ``WORLD_SIZE`` (the
default process group is the first communicator a PyTorch job uses). The rank comes from
``ncclCommUserRank`` when called, else from the environment when the size is the world's.
The group's id (``nccl.comm.id``) is a hash of those, the same on every host of the job, so
the per-rank signal of ranks on different nodes (``nccl.collective.wait``) meets in one
communicator in Prometheus; never the host name. A job known only by its parent process or
by the process itself (no launcher variable that names the job) is local: its id hashes the
host name too. Rounds (``nccl.seq``) are counted per host from where its agent started, so
sequence numbers are never compared across hosts; the fleet signal needs none.

**Rounds.** NCCL requires every rank to issue a communicator's collectives in the same order,
so collective *k* of one rank meets collective *k* of the others. A rank's first collective
seen is placed once its completion is observed, into the one round (a collective already
seen from other ranks) that it can belong to: same signature (operation, count, datatype,
reduction, root), not yet joined by this rank, and consistent with causality (no rank
observed that round complete before this rank entered it; this rank did not observe its own
complete before another rank entered the round). No such round: a new one. Several: the
placement is ambiguous (a rank running a whole collective ahead of another looks like that);
the collective is not compared, counted (``late_comm_ambiguous``), its span says
``nccl.comm.source=unaligned``, and the next is tried. A completion is only ever used as an
upper bound of the real one, so a late observation (``cudaStreamWaitEvent``: the host learns
at its next compute synchronize) never misplaces a collective; observed after the other ranks
entered the next round, it leaves two rounds open, and is left unplaced.
A library that returns at completion (a blocking wait, a CPU-side backend) is never
synchronized on: once a group has seen three of its collective calls last a millisecond or more
(an enqueue takes microseconds), its ranks' returns are their completions (families/nccl/correlator.py).
Placed once, a rank's later collectives follow in order and are checked the same way; one
that contradicts its round (``late_comm_misaligned``) un-places the rank.

Two processes claiming the same rank in one group (two jobs the environment cannot tell
apart) make the group ``conflicted``: its collectives keep their order but are never compared.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Protocol

from otelbpf.families.nccl.launch_env import Launch

#: What every rank's collective *k* must agree on: (operation, count, datatype, reduction, root).
Signature = tuple[int, ...]

#: Job keys (launch_env.py) that name nothing outside this host: their ids include the host name.
LOCAL_JOBS = ("parent:", "process:")

#: Rounds kept per group: a rank placed further back than this is re-placed.
MAX_ROUNDS = 256


class LateCall(Protocol):
    """What this module reads and sets on a collective (families/nccl/correlator.py's ``_Call``)."""

    pid: int
    enter: int
    completed: int | None
    comm: int
    seq: int
    rank: int
    nranks: int
    rank_source: str
    known: bool
    late: LateComm | None
    round: Round | None
    signature: Signature


@dataclass(eq=False)
class Round:
    seq: int
    signature: Signature
    enters: dict[Hashable, int] = field(default_factory=dict)
    completed: int | None = None  # the earliest completion any member observed


@dataclass(eq=False)
class Group:
    id: int
    rounds: dict[int, Round] = field(default_factory=dict)
    next_seq: int = 1
    ranks: dict[int, int] = field(default_factory=dict)  # rank -> pid
    conflicted: bool = False
    blocking_calls: int = 0  # collective calls that lasted long: the library returns at completion
    departed: set[int] = field(default_factory=set)  # ranks whose process exited


@dataclass(eq=False)
class LateComm:
    """One process's view of one communicator it had before the probes."""

    pointer: int
    rank: int = -1
    rank_source: str = ""
    nranks: int = -1
    group: Group | None = None
    member: Hashable = None
    position: int = 0  # its last round; 0: not placed
    waiting: list[LateCall] = field(default_factory=list)  # collectives entered while not placed, in order

    def joined(self) -> Group:
        """Its group: ``LateComms.identify`` places every communicator it hands out in one."""
        if self.group is None:
            raise RuntimeError(f"late communicator {self.pointer:#x} used before LateComms.identify")
        return self.group


def _late(call: LateCall) -> LateComm:
    """The late communicator of a call ``LateComms.identify`` has seen."""
    if call.late is None:
        raise RuntimeError(f"collective of pid {call.pid} is not on a late communicator (LateComms.identify)")
    return call.late


def _completion(call: LateCall) -> int:
    if call.completed is None:
        raise RuntimeError(f"collective of pid {call.pid} has no completion time yet")
    return call.completed


class LateComms:
    def __init__(self, host: str) -> None:
        self._host = host
        self._groups: dict[tuple[str, int, int], Group] = {}  # (job, size, ordinal) -> group
        self._procs: dict[int, dict[int, LateComm]] = {}
        self._ordinals: dict[tuple[int, str, int], int] = {}  # (pid, job, size) -> ordinals handed out

    def comm(self, pid: int, pointer: int) -> LateComm:
        comms = self._procs.setdefault(pid, {})
        lc = comms.get(pointer)
        if lc is None:
            lc = comms[pointer] = LateComm(pointer)
        return lc

    def learn(self, pid: int, pointer: int, rank: int, nranks: int) -> None:
        """ncclCommUserRank / ncclCommCount returned (-1: not this one)."""
        lc = self.comm(pid, pointer)
        if rank >= 0:
            lc.rank, lc.rank_source = rank, "ncclCommUserRank"
        if nranks > 0:
            lc.nranks = nranks

    def identify(self, call: LateCall, pointer: int, launch: Launch | None, anomalies: Counter[str]) -> LateComm:
        """Fills the call's communicator id, rank and size; places the rank's group at first use."""
        lc = self.comm(call.pid, pointer)
        if lc.group is None:
            self._join(call.pid, lc, launch, anomalies)
        call.comm, call.rank, call.nranks, call.rank_source = lc.joined().id, lc.rank, lc.nranks, lc.rank_source
        call.late = lc
        return lc

    def _join(self, pid: int, lc: LateComm, launch: Launch | None, anomalies: Counter[str]) -> None:
        if lc.nranks < 0 and launch is not None and launch.world_size > 0:
            lc.nranks = launch.world_size
        if lc.rank < 0 and launch is not None and launch.world_size in (lc.nranks, -1):
            lc.rank, lc.rank_source = launch.rank, launch.source
        job = launch.job if launch is not None else f"process:{pid}"  # no launcher: nothing to match
        kind = (job, lc.nranks)
        ordinal = self._ordinals[(pid, *kind)] = self._ordinals.get((pid, *kind), 0) + 1
        key = (*kind, ordinal)
        group = self._groups.get(key)
        if group is None:
            local = launch is None or job.startswith(LOCAL_JOBS)
            digest = hashlib.blake2b(repr((self._host, key) if local else key).encode(), digest_size=8).digest()
            group = self._groups[key] = Group(int.from_bytes(digest, "little"))
        lc.group, lc.member = group, (pid, lc.rank)
        if lc.rank >= 0:
            if lc.rank in group.departed:  # an elastic restart: the same rank under a new pid
                group.departed.discard(lc.rank)
                anomalies["rank_restarted"] += 1
            other = group.ranks.get(lc.rank)
            if other is not None and other != pid:
                group.conflicted = True
                anomalies["duplicate_rank"] += 1
            group.ranks[lc.rank] = pid

    def enter(self, call: LateCall, signature: Signature, anomalies: Counter[str]) -> bool:
        """A collective entered: True when it was placed in a round (its seq is set)."""
        lc = _late(call)
        call.signature = signature
        if lc.position and not lc.waiting:
            if self._follow(lc, call):
                return True
            anomalies["late_comm_misaligned"] += 1
            lc.position = 0
        lc.waiting.append(call)
        return False

    def completed(self, call: LateCall, anomalies: Counter[str]) -> list[LateCall]:
        """Its completion was observed: the round learns it, and a rank not yet placed is
        placed now if it can be. Returns the collectives placed by this (in order)."""
        lc, done = _late(call), _completion(call)
        rnd = call.round
        if rnd is not None:
            if rnd.completed is None or done < rnd.completed:
                rnd.completed = done
            return []
        if call not in lc.waiting or lc.waiting[0] is not call:
            return []  # an earlier one is still unplaced: this one follows it
        group = lc.joined()
        candidates = [
            r
            for r in group.rounds.values()
            if lc.member not in r.enters
            and r.signature == call.signature
            and (r.completed is None or r.completed >= call.enter)
            and max(r.enters.values()) <= done
        ]
        if len(candidates) > 1:
            anomalies["late_comm_ambiguous"] += 1
            lc.waiting.pop(0)
            return []
        rnd = candidates[0] if candidates else self._new_round(group, call.signature)
        self._place(lc, call, rnd)
        rnd.completed = done if rnd.completed is None else min(rnd.completed, done)
        placed = [call]
        lc.waiting.pop(0)
        while lc.waiting:  # entered after it, while the rank was not placed: they follow in order
            nxt = lc.waiting[0]
            if not self._follow(lc, nxt):
                anomalies["late_comm_misaligned"] += 1
                lc.position = 0
                break
            lc.waiting.pop(0)
            placed.append(nxt)
        return placed

    def dropped(self, call: LateCall) -> None:
        """A collective that will never complete (failed, process exited): no longer awaited."""
        lc = call.late
        if lc is not None and call in lc.waiting:
            lc.waiting.remove(call)

    def exited(self, pid: int) -> None:
        for lc in self._procs.pop(pid, {}).values():
            if lc.group is not None and lc.group.ranks.get(lc.rank) == pid:
                del lc.group.ranks[lc.rank]
                lc.group.departed.add(lc.rank)
        for key in [k for k in self._ordinals if k[0] == pid]:
            del self._ordinals[key]

    def _follow(self, lc: LateComm, call: LateCall) -> bool:
        group, seq = lc.joined(), lc.position + 1
        rnd = group.rounds.get(seq)
        if rnd is None:
            if seq != group.next_seq:
                return False  # its round is gone (too far behind)
            rnd = self._new_round(group, call.signature)
        if lc.member in rnd.enters or rnd.signature != call.signature:
            return False
        if rnd.completed is not None and rnd.completed < call.enter:
            return False
        self._place(lc, call, rnd)
        return True

    def _new_round(self, group: Group, signature: Signature) -> Round:
        rnd = group.rounds[group.next_seq] = Round(group.next_seq, signature)
        group.next_seq += 1
        group.rounds.pop(group.next_seq - 1 - MAX_ROUNDS, None)
        return rnd

    @staticmethod
    def _place(lc: LateComm, call: LateCall, rnd: Round) -> None:
        rnd.enters[lc.member] = call.enter
        call.seq, call.round, call.known = rnd.seq, rnd, True
        lc.position = rnd.seq
