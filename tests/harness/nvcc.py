"""Real CUDA programs for tests, built here by nvcc (the CUDA 13 toolkit).

nvcc links the CUDA runtime statically unless told ``-cudart shared``; both kinds, and
stripped copies, are what users run. Where the toolkit is missing the tests skip, and
fail under CI=true, where it must be installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data" / "cuda"
STATIC_RUNTIME = DATA / "static_runtime.cu"


def nvcc() -> str:
    found = shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda-13.0/bin/nvcc", "/usr/local/cuda/bin/nvcc") if os.path.exists(p)), None
    )
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("nvcc (CUDA 13 toolkit) is missing: .ci/run must install it (scripts/setup.sh)")
        pytest.skip("no nvcc here")
    return found


def build(source: Path, out: Path, *flags: str) -> Path:
    subprocess.run([nvcc(), *flags, "-o", str(out), str(source)], check=True, capture_output=True, text=True)
    return out


def stripped(program: Path, out: Path) -> Path:
    subprocess.run(["strip", "-o", str(out), str(program)], check=True, capture_output=True, text=True)
    return out


def static_runtime_programs(directory: Path) -> dict[str, Path]:
    """static_runtime.cu built with the static runtime (nvcc's default), a stripped copy,
    and with the shared runtime."""
    static = build(STATIC_RUNTIME, directory / "static_runtime")
    return {
        "static": static,
        "stripped": stripped(static, directory / "static_runtime_stripped"),
        "shared": build(STATIC_RUNTIME, directory / "shared_runtime", "-cudart", "shared"),
    }
