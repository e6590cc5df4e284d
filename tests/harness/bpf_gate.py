"""Decide whether tests marked ``bpf`` can run here, and whether skipping them is allowed.

Availability is proven, not guessed: a child Python compiles and loads a trivial program
with BCC, the same path the agent takes. It runs in a child so that a BCC or LLVM crash, or
its compile-time memory, stays out of the pytest process. The answer is computed once per
session. Where eBPF must work (CI, or ``OTELBPF_REQUIRE_BPF=1``) an unavailable kernel is a
failure rather than a quiet skip.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

_CHECK_TIMEOUT_S = 180
_IMPORT_FAILED = 3
_CHECK = f"""
import sys
try:
    from bcc import BPF
except ImportError as error:
    print(error, file=sys.stderr)
    sys.exit({_IMPORT_FAILED})
bpf = BPF(text="int probe(void *ctx) {{ return 0; }}")
bpf.load_func("probe", BPF.KPROBE)
bpf.cleanup()
"""


def bpf_required() -> bool:
    """True where tests marked ``bpf`` must run: ``CI=true`` or ``OTELBPF_REQUIRE_BPF=1``."""
    return os.environ.get("OTELBPF_REQUIRE_BPF") == "1" or os.environ.get("CI", "").lower() == "true"


@functools.cache
def bpf_unavailable_reason() -> str | None:
    """``None`` when BCC can compile and load a program in this environment, else why it cannot."""
    if os.geteuid() != 0:
        return f"loading eBPF programs needs root (running as uid {os.geteuid()}); run pytest with sudo"
    try:
        result = subprocess.run(
            [sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=_CHECK_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return f"compiling a trivial BCC program took over {_CHECK_TIMEOUT_S}s"
    detail = (result.stderr.strip().splitlines() or ["no error output"])[-1]
    if result.returncode == _IMPORT_FAILED:
        return (
            f"{sys.executable} cannot import bcc ({detail}); Debian's python3-bpfcc must be visible "
            "to the venv: run scripts/setup.sh"
        )
    if result.returncode != 0:
        return f"BCC could not compile and load a trivial program (exit {result.returncode}): {detail}"
    return None
