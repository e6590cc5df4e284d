"""The generated protobuf modules are what scripts/gen_protos.py makes of the vendored protos."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.agent import REPO


def test_generated_modules_are_up_to_date():
    pytest.importorskip("grpc_tools", reason="grpcio-tools (a test extra) regenerates the modules")
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_protos.py"), "--check"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr


def test_gnostic_annotations_are_stripped_and_nothing_else():
    sys.path.insert(0, str(REPO / "scripts"))
    from gen_protos import strip_gnostic

    text = (REPO / "otelbpf" / "export" / "proto" / "push" / "v1" / "push.proto").read_text()
    stripped = strip_gnostic(text)
    assert "gnostic" not in stripped
    assert "bytes raw_profile = 1;" in stripped and "string ID = 2;" in stripped
    assert "rpc Push(PushRequest) returns (PushResponse) {" in stripped
