"""Coverage-guided fuzzing, briefly, in the heavy tier: each target of targets.py for ~2 s under
atheris (libFuzzer over otelbpf's, hpack's and PyYAML's bytecode), from its seeds, in a process
of its own (libFuzzer ends the process it runs in). A crash, a broken invariant or an input over
2 s fails the test, and the input is printed: keep it under tests/fuzz/corpus/<target>/.
bench/fuzz.py runs the same targets for millions of inputs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.targets import TARGETS, seeds

pytest.importorskip("atheris")

TESTS = Path(__file__).resolve().parents[1]
SECONDS = 2

CHILD = """
import sys
sys.path[:0] = [{tests!r}, {repo!r}]
import atheris
with atheris.instrument_imports(include=["otelbpf", "hpack", "yaml", "fuzz", "harness"]):
    from fuzz.targets import TARGETS
atheris.Setup([sys.argv[0], *sys.argv[2:]], TARGETS[sys.argv[1]])
atheris.Fuzz()
"""


@pytest.mark.heavy
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_target_under_atheris(target: str, tmp_path: Path):
    corpus, findings = tmp_path / "corpus", tmp_path / "findings"
    corpus.mkdir()
    findings.mkdir()
    for i, seed in enumerate(seeds()[target]):
        (corpus / f"seed{i}").write_bytes(seed)
    flags = [f"-max_total_time={SECONDS}", "-timeout=2", "-rss_limit_mb=2048", "-print_final_stats=1"]
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD.format(tests=str(TESTS), repo=str(TESTS.parent)),
            target,
            *flags,
            f"-artifact_prefix={findings}/",
            "-close_fd_mask=1",
            str(corpus),
        ],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=120,
    )

    found = {p.name: p.read_bytes() for p in findings.iterdir()}
    assert out.returncode == 0 and not found, f"{found!r}\n{out.stderr[-4000:]}"
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", out.stderr)
    assert runs and int(runs.group(1)) > len(seeds()[target]), out.stderr[-2000:]
    print(f"atheris {target}: {runs.group(1)} inputs in {SECONDS} s")
