"""A rank's place in its job, from the environment its launcher gave it.

An agent attached after ``ncclCommInitRank`` never sees a communicator's rank or size. The
launcher told the process, though, and ``/proc/PID/environ`` still says it: torchrun sets
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``GROUP_RANK`` and ``TORCHELASTIC_RUN_ID``; Open MPI
``OMPI_COMM_WORLD_RANK``/``_SIZE``; Slurm ``SLURM_PROCID``/``SLURM_NTASKS``. These describe the
*world*: the default process group, the communicator PyTorch builds over all ranks.

The job key tells two jobs on one host apart (both have a rank 0): the launcher's run or job
id where it sets one, the rendezvous address otherwise, and the parent process last (ranks
started by one launcher share it).
"""

from __future__ import annotations

from dataclasses import dataclass

#: (rank variable, size variable), in the order they are trusted: what PyTorch itself reads first.
_RANK_VARS = (
    ("RANK", "WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
)
_WANTED = frozenset(
    {
        *(v for pair in _RANK_VARS for v in pair),
        "LOCAL_RANK",
        "GROUP_RANK",
        "TORCHELASTIC_RUN_ID",
        "MASTER_ADDR",
        "MASTER_PORT",
        "SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "OMPI_MCA_ess_base_jobid",
        "PMIX_NAMESPACE",
    }
)


@dataclass(frozen=True)
class Launch:
    rank: int
    world_size: int  # -1: not given
    source: str  # the variable the rank came from, as "env:RANK"
    job: str  # tells this job's ranks from another job's on the same host
    local_rank: int = -1


def parse(env: dict[str, str], ppid: int) -> Launch | None:
    """The rank and job from a process's environment; None when no launcher variable is set
    (or it is not a number)."""
    for rank_var, size_var in _RANK_VARS:
        rank, size = _number(env.get(rank_var)), _number(env.get(size_var))
        if rank is None or rank < 0 or (size is not None and rank >= size):
            continue
        local = _number(env.get("LOCAL_RANK"))  # not a number: as if not given
        return Launch(
            rank, -1 if size is None else size, f"env:{rank_var}", _job(env, ppid), -1 if local is None else local
        )
    return None


def read(pid: int) -> Launch | None:
    """``parse`` of /proc/PID/environ (None when the process is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        name = key.decode(errors="replace")
        if sep and name in _WANTED:
            env[name] = value.decode(errors="replace")
    try:
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
    except (ValueError, IndexError):
        ppid = 0
    return parse(env, ppid)


def _number(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _job(env: dict[str, str], ppid: int) -> str:
    if env.get("TORCHELASTIC_RUN_ID"):
        return f"torchelastic:{env['TORCHELASTIC_RUN_ID']}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')}"
    for var in ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"):
        if env.get(var):
            return f"{var}:{env[var]}"
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return f"rendezvous:{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    return f"parent:{ppid}"
