"""What writing the report costs: peak RSS and time of ``diagnose`` and of the whole page over a
folder the file exporter wrote.

    .venv/bin/python bench/report_peak.py DIR [--tree SOURCE_TREE ...] [--out FILE]

``otelbpf run`` writes ``report.html`` in its own process after the agent has stopped, so the
page's peak is the agent's, and a memory limit must allow for it (a folder of up to the file
exporter's ``report_max_input``, 256 MiB of OTLP-JSON). Each stage runs in a fresh interpreter
that reads DIR and reports its peak RSS (``ru_maxrss``) and wall time:

- ``imports``: the modules alone (the floor the others are measured against);
- ``diagnose``: the findings (every CUDA and off-CPU span of the folder held at once);
- ``render``: the whole page (the spans read once, for the findings, the timelines and the AI
  flame graph; every profile merged; the HTML).

``--tree`` (repeatable) names the source trees to import otelbpf from, this one by default:
``git worktree add /tmp/before REV`` and ``--tree /tmp/before --tree .`` measure a change side
by side over the same folder. DIR is any file exporter's folder; ``bench/footprint.py --churn
--keep-workdir`` leaves one of a host under process churn (its ``all/out``). Results: a table on
stdout and bench/results/report_peak-<date>.json; figures in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench/results"

#: Runs in the child: one stage over the folder, then one JSON line.
STAGE = r"""
import json, resource, sys, time
stage, folder = sys.argv[1], sys.argv[2]
t0 = time.monotonic()
from otelbpf.analyze.diagnose import diagnose
from otelbpf.analyze.report import render
out = {}
if stage == "diagnose":
    out["findings"] = len(diagnose(folder, []))
elif stage == "render":
    page, findings, problems = render(folder)
    out.update(findings=len(findings), problems=len(problems), page_mib=round(len(page.encode()) / 2**20, 2))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
out.update(seconds=round(time.monotonic() - t0, 2), peak_rss_mib=round(peak, 1))
import otelbpf
out["otelbpf"] = otelbpf.__file__
print(json.dumps(out))
"""


def folder_size(folder: Path) -> dict[str, float]:
    """MiB of OTLP-JSON (what ``report_max_input`` bounds) and the number of profiles."""
    jsonl = sum(p.stat().st_size for p in folder.glob("*.jsonl") if p.is_file())
    profiles = len(list((folder / "profiles").glob("*.pb.gz"))) if (folder / "profiles").is_dir() else 0
    return {"otlp_json_mib": round(jsonl / 2**20, 1), "profiles": profiles}


def run_stage(stage: str, folder: Path, tree: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", STAGE, stage, str(folder.resolve())],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,  # `-c` puts the working directory first on sys.path
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"report_peak: the {stage} stage failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="a file exporter's folder (traces*.jsonl, metrics.jsonl, profiles/)")
    p.add_argument("--tree", type=Path, action="append", help="source tree to import otelbpf from (repeatable)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if not args.folder.is_dir():
        print(f"report_peak: {args.folder} is not a folder", file=sys.stderr)
        return 2
    result: dict[str, object] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **folder_size(args.folder),
    }
    print(f"{args.folder}: {result['otlp_json_mib']} MiB of OTLP-JSON, {result['profiles']} profiles")
    trees = args.tree or [ROOT]
    result["trees"] = runs = []
    for tree in trees:
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        got: dict[str, object] = {"tree": str(tree), "commit": head.stdout.strip()}
        print(f"{tree} ({got['commit']}):")
        for stage in ("imports", "diagnose", "render"):
            got[stage] = one = run_stage(stage, args.folder, tree.resolve())
            extra = ", ".join(f"{k} {v}" for k, v in one.items() if k not in ("peak_rss_mib", "seconds"))
            print(f"  {stage:9} peak RSS {one['peak_rss_mib']:7.1f} MiB  {one['seconds']:6.1f} s  {extra}")
        runs.append(got)
    out = args.out or RESULTS / f"report_peak-{dt.date.today().isoformat()}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
