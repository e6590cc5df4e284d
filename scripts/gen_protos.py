#!/usr/bin/env python3
"""Regenerate the protobuf modules in otelbpf/export/proto/ from the vendored official files.

    .venv/bin/python scripts/gen_protos.py          # rewrite the *_pb2.py files
    .venv/bin/python scripts/gen_protos.py --check  # exit 1 if they are out of date

Sources (vendored unmodified, Apache-2.0):
  profile.proto                  google/pprof proto/profile.proto
  push/v1/push.proto             grafana/pyroscope api/push/v1/push.proto
  types/v1/types.proto           grafana/pyroscope api/types/v1/types.proto

Two mechanical steps happen on the way to protoc, neither touching the wire format:
- Pyroscope's files annotate fields and methods with gnostic OpenAPI options (documentation
  for its HTTP API); those imports and options are removed, so gnostic's own protos are not
  needed.
- protoc names Python modules after proto import paths, and ``types.v1`` would shadow the
  standard library's ``types``: the generated imports are made absolute under
  ``otelbpf.export.proto``.
Needs grpcio-tools (a test extra).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parents[1] / "otelbpf" / "export" / "proto"
SOURCES = ["profile.proto", "push/v1/push.proto", "types/v1/types.proto"]
PACKAGE = "otelbpf.export.proto"

_GNOSTIC_IMPORT = re.compile(r'^import "gnostic/[^"]*";\n', re.M)
_GNOSTIC_OPTION = re.compile(r"^\s*option \(gnostic\.[^;]*;\n", re.M)
_GNOSTIC_FIELD_OPTION = re.compile(r"\s*\[\(gnostic\.[^\]]*\]")


def strip_gnostic(text: str) -> str:
    """The proto without gnostic OpenAPI annotations (no effect on messages or services)."""
    text = _GNOSTIC_IMPORT.sub("", text)
    text = _GNOSTIC_OPTION.sub("", text)
    return _GNOSTIC_FIELD_OPTION.sub("", text)


def _absolute_imports(code: str) -> str:
    return re.sub(r"^from (push|types)\.v1 import", rf"from {PACKAGE}.\1.v1 import", code, flags=re.M)


def generate(out: Path) -> None:
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        for name in SOURCES:
            target = src / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(strip_gnostic((PROTO_DIR / name).read_text()))
        gen = Path(tmp) / "gen"
        gen.mkdir()
        args = ["protoc", f"-I{src}", f"--python_out={gen}", *(str(src / n) for n in SOURCES)]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed (see above)")
        for name in SOURCES:
            module = Path(name).with_name(Path(name).stem + "_pb2.py")
            target = out / module
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(_absolute_imports((gen / module).read_text()))


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp))
            stale = [
                str(p.relative_to(tmp))
                for p in Path(tmp).rglob("*_pb2.py")
                if p.read_text() != (PROTO_DIR / p.relative_to(tmp)).read_text()
            ]
        if stale:
            print(f"out of date: {', '.join(stale)}; run scripts/gen_protos.py", file=sys.stderr)
            return 1
        return 0
    generate(PROTO_DIR)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
