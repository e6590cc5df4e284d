"""The ibverbs probes read the real libibverbs ABI (no BPF here).

Every struct offset the BPF programs and the resolver use is checked against Debian's
<infiniband/verbs.h> by compiling a C program, and the symbol version the probes attach to is
checked to be the one programs actually call: what dlvsym(..., "IBVERBS_1.1") returns, as
NCCL does, and what the dynamic linker gives a program linked against -libverbs.
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest

from otelbpf.base.events import IbvFunc
from otelbpf.families.ibverbs import abi
from otelbpf.families.ibverbs.probes import ibverbs_family, provider_name
from otelbpf.sensor import elf

VERBS_H = Path("/usr/include/infiniband/verbs.h")
LIBIBVERBS = Path("/usr/lib/x86_64-linux-gnu/libibverbs.so.1")

needs_headers = pytest.mark.skipif(
    not VERBS_H.exists(), reason="libibverbs-dev is not installed (scripts/setup.sh --test)"
)
needs_lib = pytest.mark.skipif(not LIBIBVERBS.exists(), reason="libibverbs1 is not installed (scripts/setup.sh --test)")


def _compile_and_run(tmp_path: Path, body: str) -> str:
    src = tmp_path / "probe.c"
    src.write_text(
        "#include <infiniband/verbs.h>\n#include <stddef.h>\n#include <stdio.h>\n"
        f"int main(void) {{\n{body}\nreturn 0;\n}}\n"
    )
    exe = tmp_path / "probe"
    subprocess.run(["gcc", str(src), "-o", str(exe)], check=True, capture_output=True)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout


@needs_headers
def test_offsets_sizes_and_enums_match_the_installed_header(tmp_path):
    lines = []
    for name, (struct, member, _off) in abi.OFFSETS.items():
        lines.append(f'printf("{name} %zu\\n", offsetof(struct {struct}, {member}));')
    for struct in abi.SIZES:
        lines.append(f'printf("sizeof_{struct} %zu\\n", sizeof(struct {struct}));')
    enums = {
        "IBV_SEND_SIGNALED": abi.IBV_SEND_SIGNALED,
        "IBV_QP_STATE": abi.IBV_QP_STATE,
        "IBV_QP_PORT": abi.IBV_QP_PORT,
        "IBV_QP_AV": abi.IBV_QP_AV,
        "IBV_QP_DEST_QPN": abi.IBV_QP_DEST_QPN,
        "IBV_WC_RECV": abi.IBV_WC_RECV,
        "IBV_WC_RETRY_EXC_ERR": abi.WC_STATUS.index("RETRY_EXC_ERR"),
        "IBV_WC_TM_RNDV_INCOMPLETE": len(abi.WC_STATUS) - 1,
        "IBV_QPS_ERR": abi.QP_STATES.index("ERR"),
        "IBV_QPT_RC": 2,
        "IBV_WR_RDMA_READ": 4,
        "IBV_WR_ATOMIC_WRITE": 15,
        "IBV_MTU_4096": 5,
    }
    for name in enums:
        lines.append(f'printf("{name} %d\\n", (int){name});')
    got = dict(line.split() for line in _compile_and_run(tmp_path, "\n".join(lines)).splitlines())
    assert {n: int(got[n]) for n in abi.OFFSETS} == {n: off for n, (_s, _m, off) in abi.OFFSETS.items()}
    assert {s: int(got[f"sizeof_{s}"]) for s in abi.SIZES} == abi.SIZES
    assert {n: int(got[n]) for n in enums} == enums
    assert abi.MTU_BYTES[enums["IBV_MTU_4096"]] == 4096


@needs_lib
def test_probes_go_on_the_default_version_that_callers_reach():
    """Each probed symbol: the newest version's site, at the address dlvsym("IBVERBS_1.1") gives."""
    family = ibverbs_family(slow_completion_ns=10**6)
    (kind,) = family.libraries
    real = str(LIBIBVERBS.resolve())
    sites = elf.resolve(real, kind.symbols)
    # Loaded here, to compare with what the dynamic linker hands callers.
    lib = ctypes.CDLL(real)
    libdl = ctypes.CDLL("libdl.so.2")
    libdl.dlvsym.restype = ctypes.c_void_p
    libdl.dlvsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    base = _load_base(real)
    chosen = {}
    for spec in kind.probes:
        selected = spec.select(sites.get(spec.symbol, []))
        assert len(selected) == 1, spec.symbol
        chosen[spec.symbol] = selected[0]
    assert {
        s: chosen[s].version
        for s in (
            "ibv_open_device",
            "ibv_create_qp",
            "ibv_modify_qp",
            "ibv_reg_mr",
            "ibv_dereg_mr",
            "ibv_destroy_qp",
            "ibv_create_cq",
            "ibv_close_device",
        )
    } == dict.fromkeys(
        (
            "ibv_open_device",
            "ibv_create_qp",
            "ibv_modify_qp",
            "ibv_reg_mr",
            "ibv_dereg_mr",
            "ibv_destroy_qp",
            "ibv_create_cq",
            "ibv_close_device",
        ),
        "IBVERBS_1.1",
    )
    assert chosen["ibv_reg_mr_iova2"].version == "IBVERBS_1.8"
    assert chosen["ibv_reg_dmabuf_mr"].version == "IBVERBS_1.12"
    for symbol, site in chosen.items():
        addr = libdl.dlvsym(ctypes.c_void_p(lib._handle), symbol.encode(), site.version.encode())
        assert addr - base == site.vaddr, symbol
        # The compat version exists at another address for the classic calls, and is not probed.
        others = [s for s in sites.get(symbol, []) if s.vaddr != site.vaddr]
        assert all(s.version == "IBVERBS_1.0" for s in others), symbol
    # ibv_post_send & co. are inline: libibverbs exports no such symbol to probe.
    assert not elf.has_any(real, ["ibv_post_send", "ibv_post_recv", "ibv_poll_cq", "ibv_create_qp_ex"])
    assert set(chosen) == {f.name for f in IbvFunc} - {"ibv_create_qp_ex"}


def _load_base(path: str) -> int:
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[5] == path and int(parts[2], 16) == 0:
            return int(parts[0].split("-")[0], 16)
    raise AssertionError(f"{path} is not mapped")


def test_provider_names_from_file_names():
    assert provider_name("/usr/lib/x86_64-linux-gnu/libibverbs/libmlx5-rdmav34.so") == "mlx5"
    assert provider_name("/usr/lib/x86_64-linux-gnu/libmlx5.so.1.24.44.0") == "mlx5"
    assert provider_name("/opt/x/librxe-rdmav25.so") == "rxe"
    assert provider_name("/build/libfakeverbs-rdmav34.so") == "fakeverbs"
