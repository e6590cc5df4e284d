"""Long fuzzing campaign over the parsers and encoders that see hostile bytes.

    .venv/bin/python bench/fuzz.py [--targets http1,http2,...] [--runs 1000000]
                                   [--seconds 300] [--out FILE]

Each target of tests/fuzz/targets.py runs in its own process under atheris (libFuzzer,
coverage-guided over otelbpf's and hpack's bytecode), starting from the seeds in targets.py,
until ``--runs`` inputs or ``--seconds``, whichever comes first; one input taking over 2 s is a
hang. Every crash or hang libFuzzer finds is copied into tests/fuzz/corpus/<target>/, which
tests/fuzz/test_corpus.py replays in the normal suite: it is a regression case from then on.
Reports inputs run, inputs per second and findings per target (JSON; ``--out`` keeps it).

Without atheris (it installs from PyPI for CPython 3.11 on x86-64 Linux) the same targets run
on random mutations of the seeds (``--engine mutate``): no coverage guidance, same bookkeeping.

Internal: ``--child TARGET`` is one target's process.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)
sys.path.append(str(ROOT / "tests"))

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

CORPUS = ROOT / "tests" / "fuzz" / "corpus"
#: Seconds one input may take before libFuzzer calls it a hang.
HANG_S = 2


def child_atheris(target: str, argv: list[str]) -> None:
    """One target under libFuzzer (argv: libFuzzer's flags and the corpus directory)."""
    import atheris

    with atheris.instrument_imports(include=["otelbpf", "hpack", "yaml", "fuzz", "harness"]):
        from fuzz.targets import TARGETS
    atheris.Setup([sys.argv[0], *argv], TARGETS[target])
    atheris.Fuzz()


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One random edit of ``data``: flip, insert, delete, duplicate a span, or splice interesting bytes."""
    b = bytearray(data)
    op = rng.randrange(6)
    i = rng.randrange(len(b) + 1)
    if op == 0 and b:
        b[min(i, len(b) - 1)] ^= 1 << rng.randrange(8)
    elif op == 1:
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
    elif op == 2 and b:
        del b[i : i + rng.randrange(1, 16)]
    elif op == 3 and b:
        j = rng.randrange(len(b))
        b[i:i] = b[j : j + rng.randrange(1, 64)]
    elif op == 4:
        b[i:i] = rng.choice(
            [b"-", b"+", b"_", b" ", b"\r\n", b"\0", b"\xff" * 8, b"9" * 40, b"f" * 20, b";", b"/", b"@", b":", b"0x"]
        )
    elif b:
        b[min(i, len(b) - 1)] = rng.choice([0, 0x7F, 0x80, 0xFF, 0x3F, 0x20])
    return bytes(b)


def child_mutate(target: str, runs: int, seconds: float, findings: Path) -> None:
    """One target on random mutations of its seeds; prints libFuzzer's closing line's figures."""
    import signal

    from fuzz.targets import TARGETS, seeds

    fn, pool, rng = TARGETS[target], list(seeds()[target]), random.Random(0)

    def hang(*_):
        raise TimeoutError

    signal.signal(signal.SIGALRM, hang)
    t0, n = time.monotonic(), 0
    while n < runs and time.monotonic() - t0 < seconds:
        data = rng.choice(pool)
        for _ in range(rng.randrange(1, 5)):
            data = mutate(data, rng)
        signal.alarm(HANG_S)
        try:
            fn(data)
        except BaseException as exc:  # noqa: BLE001 - every failure is a finding
            kind = "timeout" if isinstance(exc, TimeoutError) else "crash"
            (findings / f"{kind}-{hashlib.sha1(data).hexdigest()}").write_bytes(data)
        finally:
            signal.alarm(0)
        if len(pool) < 4096 and rng.random() < 0.01:
            pool.append(data)
        n += 1
    print(f"Done {n} runs in {int(time.monotonic() - t0)} second(s)")


def run_target(target: str, engine: str, runs: int, seconds: int) -> dict:
    """One target in its own process; its findings copied into the regression corpus."""
    from fuzz.targets import seeds

    with tempfile.TemporaryDirectory() as tmp:
        work, findings = Path(tmp, "corpus"), Path(tmp, "findings")
        work.mkdir()
        findings.mkdir()
        for i, seed in enumerate(seeds()[target]):
            (work / f"seed{i}").write_bytes(seed)
        if engine == "atheris":
            cmd = [
                sys.executable,
                __file__,
                "--child",
                target,
                "--",
                f"-runs={runs}",
                f"-max_total_time={seconds}",
                f"-timeout={HANG_S}",
                "-rss_limit_mb=2048",
                "-print_final_stats=1",
                f"-artifact_prefix={findings}/",
                "-close_fd_mask=1",
                str(work),
            ]
        else:
            cmd = [
                sys.executable,
                __file__,
                "--child",
                target,
                "--engine",
                "mutate",
                "--runs",
                str(runs),
                "--seconds",
                str(seconds),
                "--findings",
                str(findings),
            ]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
        wall = time.monotonic() - t0
        log = proc.stdout + proc.stderr
        m = re.search(r"Done (\d+) runs in (\d+) second", log)
        stat = re.search(r"stat::number_of_executed_units:\s*(\d+)", log)
        inputs = int(stat.group(1)) if stat else int(m.group(1)) if m else 0
        kept = []
        for f in sorted(findings.iterdir()):
            dest = CORPUS / target
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, dest / f.name)
            kept.append(f.name)
        if proc.returncode and not kept:
            kept.append(f"exit {proc.returncode}: {log[-2000:]}")
    return {
        "target": target,
        "engine": engine,
        "inputs": inputs,
        "seconds": round(wall, 1),
        "inputs_per_s": round(inputs / wall) if wall else 0,
        "findings": kept,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", help="comma-separated (default: every target of tests/fuzz/targets.py)")
    ap.add_argument("--runs", type=int, default=1_000_000, help="inputs per target (at most)")
    ap.add_argument("--seconds", type=int, default=300, help="time per target (at most)")
    ap.add_argument("--engine", choices=("atheris", "mutate"), default=None)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--findings", type=Path, help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    engine = args.engine
    if engine is None:
        try:
            import atheris  # noqa: F401

            engine = "atheris"
        except ImportError:
            engine = "mutate"
    if args.child:
        if engine == "atheris":
            child_atheris(args.child, [a for a in rest if a != "--"])
        else:
            child_mutate(args.child, args.runs, args.seconds, args.findings)
        return
    # Imported here, not before the --child branch: atheris instruments only what is imported
    # inside its block, so a child must not have the targets loaded already.
    from fuzz.targets import TARGETS

    results = []
    for target in (args.targets or ",".join(TARGETS)).split(","):
        results.append(run_target(target, engine, args.runs, args.seconds))
        print(json.dumps(results[-1]), flush=True)
    if args.out:
        args.out.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
