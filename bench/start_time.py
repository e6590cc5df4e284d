"""Start to "otelbpf running" with and without the program cache, side by side.

For each config (footprint's ``default`` and ``all``), rounds alternate three starts of
`otelbpf run` (host mode, SIGTERM once running):

- ``off``: ``service.program_cache.directory: ""``, a compile at every start (the agent
  before the cache);
- ``cold``: an empty cache directory: a compile, and the entry kept (what the first start
  on a node costs);
- ``warm``: the directory the cold start filled: the skeleton compiled, the programs
  loaded from the entry.

Medians of the wall time from Popen to the "otelbpf running" line, and of the agent's own
"compiled in" (program build, compile or cache load, verifier, automatic attaches). The
agents run as an installed one does, with Python's bytecode cached (PYTHONDONTWRITEBYTECODE,
if set here, is not passed on: it would add ~0.4 s of compiling 130 modules to every start),
and each start waits until the previous agent's probes are released.

    sudo .venv/bin/python bench/start_time.py [--configs default,all] [--rounds 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_launch import machine  # noqa: E402
from footprint import FAKE_CUDART, AgentRun, config_for, free_port, load  # noqa: E402

MODES = ("off", "cold", "warm")


def one(name: str, mode: str, workdir: Path, lib: Path, port: int) -> dict:
    cfg = config_for(name, workdir, lib, port)
    doc = yaml.safe_load(cfg.read_text())
    cache = workdir / f"cache-{name}"
    if mode == "cold":
        shutil.rmtree(cache, ignore_errors=True)
    doc["service"]["program_cache"] = {"directory": "" if mode == "off" else str(cache)}
    cfg.write_text(yaml.safe_dump(doc, sort_keys=False))
    agent = AgentRun(name, cfg, workdir / name)
    agent.wait_running()
    start, compile_s, cached = agent.start_s, agent.compile_s(), agent.from_cache()
    agent.stop()
    _wait_released(agent.lines)
    if cached != (mode == "warm"):
        raise SystemExit(f"{name} {mode}: programs from the cache: {cached}\n" + "\n".join(agent.lines[-20:]))
    return {"mode": mode, "to_running_s": round(start, 2), "compiled_in_s": compile_s}


def _wait_released(lines: list[str], timeout_s: float = 120) -> None:
    """Until the process releasing the stopped agent's probes has exited: releasing a uprobe
    holds the kernel's trace event mutex, which the next start's attaches wait for."""
    m = next(
        (re.search(r"in the background \(pid (\d+)\)", ln) for ln in lines if "in the background (pid" in ln), None
    )
    deadline = time.monotonic() + timeout_s
    while m and os.path.exists(f"/proc/{m.group(1)}") and time.monotonic() < deadline:
        time.sleep(0.1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="default,all")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # the agents' environment (AgentRun copies it)
    if not FAKE_CUDART.exists():
        sys.exit(f"{FAKE_CUDART} is missing: run `bash examples/build.sh`")
    workdir = Path(tempfile.mkdtemp(prefix="otelbpf-start-"))
    lib = workdir / "lib" / "libcudart.so.12"
    lib.parent.mkdir()
    shutil.copy2(FAKE_CUDART, lib)
    res: dict = {"date": dt.date.today().isoformat(), "machine": machine(), "load_average_before": load(), "runs": []}
    try:
        for name in a.configs.split(","):
            rows = []
            port = free_port()  # one per config: the traced ports are part of the program text
            one(name, "cold", workdir, lib, port)  # the first start of all pays the imports' disk reads
            for r in range(a.rounds):
                for mode in MODES:
                    rows.append(one(name, mode, workdir, lib, port))
                    print(f"{name} round {r + 1} {mode}: {rows[-1]}", file=sys.stderr, flush=True)
                    time.sleep(1.0)
            summary = {
                mode: {
                    "to_running_s": statistics.median(x["to_running_s"] for x in rows if x["mode"] == mode),
                    "compiled_in_s": statistics.median(x["compiled_in_s"] or 0 for x in rows if x["mode"] == mode),
                }
                for mode in MODES
            }
            res["runs"].append({"config": name, "rounds": rows, "median": summary})
            print(f"{name}: {json.dumps(summary)}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
