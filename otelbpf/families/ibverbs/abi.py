"""The libibverbs ABI as the ibverbs probes read it: struct offsets and the
small opcode "slots" counters are indexed by.

The BPF programs cannot include <infiniband/verbs.h> (a user-space header),
so the offsets of the public structs they read are listed here once and
handed to the compiler as ``-D`` flags; user space reads live contexts
through /proc/PID/mem with the same numbers. These structs are libibverbs'
stable public ABI (x86-64 and aarch64 alike: LP64, natural alignment);
tests/families/ibverbs/test_ibverbs_abi.py compiles a C program against the real
header and checks every entry.
"""

from __future__ import annotations

#: (C struct, member path) -> byte offset. The macro name is the key upper-cased.
OFFSETS: dict[str, tuple[str, str, int]] = {
    # name: (struct, member, offset)
    "ctx_device": ("ibv_context", "device", 0),
    "ctx_poll_cq": ("ibv_context", "ops.poll_cq", 96),
    "ctx_post_send": ("ibv_context", "ops.post_send", 208),
    "ctx_post_recv": ("ibv_context", "ops.post_recv", 216),
    "ctx_abi_compat": ("ibv_context", "abi_compat", 320),
    "device_name": ("ibv_device", "name", 24),
    "vctx_create_qp_ex": ("verbs_context", "create_qp_ex", 264),
    "vctx_sz": ("verbs_context", "sz", 312),
    "vctx_context": ("verbs_context", "context", 320),
    "pd_context": ("ibv_pd", "context", 0),
    "cq_context": ("ibv_cq", "context", 0),
    "qp_context": ("ibv_qp", "context", 0),
    "qp_qp_num": ("ibv_qp", "qp_num", 52),
    "qpinit_cap": ("ibv_qp_init_attr", "cap", 32),
    "qpinit_qp_type": ("ibv_qp_init_attr", "qp_type", 52),
    "qpinit_sq_sig_all": ("ibv_qp_init_attr", "sq_sig_all", 56),
    "qpinitex_cap": ("ibv_qp_init_attr_ex", "cap", 32),
    "qpinitex_qp_type": ("ibv_qp_init_attr_ex", "qp_type", 52),
    "qpinitex_sq_sig_all": ("ibv_qp_init_attr_ex", "sq_sig_all", 56),
    "qpattr_qp_state": ("ibv_qp_attr", "qp_state", 0),
    "qpattr_path_mtu": ("ibv_qp_attr", "path_mtu", 8),
    "qpattr_dest_qp_num": ("ibv_qp_attr", "dest_qp_num", 28),
    "qpattr_dgid": ("ibv_qp_attr", "ah_attr.grh.dgid", 56),
    "qpattr_dlid": ("ibv_qp_attr", "ah_attr.dlid", 80),
    "qpattr_is_global": ("ibv_qp_attr", "ah_attr.is_global", 85),
    "qpattr_ah_port": ("ibv_qp_attr", "ah_attr.port_num", 86),
    "qpattr_port_num": ("ibv_qp_attr", "port_num", 129),
    "sendwr_sg_list": ("ibv_send_wr", "sg_list", 16),
    "sendwr_opcode": ("ibv_send_wr", "opcode", 28),
    "sendwr_send_flags": ("ibv_send_wr", "send_flags", 32),
    "recvwr_sg_list": ("ibv_recv_wr", "sg_list", 16),
    "sge_length": ("ibv_sge", "length", 8),
    "wc_status": ("ibv_wc", "status", 8),
    "wc_qp_num": ("ibv_wc", "qp_num", 28),
    "mr_context": ("ibv_mr", "context", 0),
    "mr_addr": ("ibv_mr", "addr", 16),
    "mr_length": ("ibv_mr", "length", 24),
}

#: struct -> size in bytes.
SIZES: dict[str, int] = {"ibv_sge": 16, "ibv_wc": 48, "ibv_context": 328, "verbs_context": 648}

#: ``ibv_context.abi_compat`` of a context that is embedded in a struct verbs_context.
VERBS_ABI_IS_EXTENDED = 0xFFFFFFFFFFFFFFFF

# enum values used by the probes (verbs.h)
IBV_SEND_SIGNALED = 1 << 1
IBV_QP_STATE = 1 << 0
IBV_QP_PORT = 1 << 5
IBV_QP_AV = 1 << 7
IBV_QP_DEST_QPN = 1 << 20
IBV_WC_RECV = 1 << 7

#: Counters are indexed by small "slots" (an array of 16 per QP in the kernel).
SLOTS = 16
#: enum ibv_wr_opcode value -> name; the slot is the value (ATOMIC_WRITE, 15, is mapped
#: to 13). Receives have a slot of their own.
WR_NAMES = {
    0: "RDMA_WRITE",
    1: "RDMA_WRITE_WITH_IMM",
    2: "SEND",
    3: "SEND_WITH_IMM",
    4: "RDMA_READ",
    5: "ATOMIC_CMP_AND_SWP",
    6: "ATOMIC_FETCH_AND_ADD",
    7: "LOCAL_INV",
    8: "BIND_MW",
    9: "SEND_WITH_INV",
    10: "TSO",
    11: "DRIVER1",
    13: "ATOMIC_WRITE",
    14: "RECV",
    15: "OTHER",
}
WR_SLOT_ATOMIC_WRITE = 13
WR_SLOT_RECV = 14
SLOT_OTHER = 15
#: enum ibv_wc_opcode value -> slot: 0..9 as they are, RECV (128) -> 10,
#: RECV_RDMA_WITH_IMM (129) -> 11, tag-matching (130..134) -> 12, driver-specific -> 13.
WC_NAMES = {
    0: "SEND",
    1: "RDMA_WRITE",
    2: "RDMA_READ",
    3: "COMP_SWAP",
    4: "FETCH_ADD",
    5: "BIND_MW",
    6: "LOCAL_INV",
    7: "TSO",
    9: "ATOMIC_WRITE",
    10: "RECV",
    11: "RECV_RDMA_WITH_IMM",
    12: "TM",
    13: "DRIVER",
    15: "OTHER",
}
#: enum ibv_wc_status value -> name (IBV_WC_ dropped).
WC_STATUS = (
    "SUCCESS",
    "LOC_LEN_ERR",
    "LOC_QP_OP_ERR",
    "LOC_EEC_OP_ERR",
    "LOC_PROT_ERR",
    "WR_FLUSH_ERR",
    "MW_BIND_ERR",
    "BAD_RESP_ERR",
    "LOC_ACCESS_ERR",
    "REM_INV_REQ_ERR",
    "REM_ACCESS_ERR",
    "REM_OP_ERR",
    "RETRY_EXC_ERR",
    "RNR_RETRY_EXC_ERR",
    "LOC_RDD_VIOL_ERR",
    "REM_INV_RD_REQ_ERR",
    "REM_ABORT_ERR",
    "INV_EECN_ERR",
    "INV_EEC_STATE_ERR",
    "FATAL_ERR",
    "RESP_TIMEOUT_ERR",
    "GENERAL_ERR",
    "TM_ERR",
    "TM_RNDV_INCOMPLETE",
)
#: enum ibv_qp_state value -> name.
QP_STATES = ("RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR", "UNKNOWN")
#: enum ibv_qp_type value -> name.
QP_TYPES = {2: "RC", 3: "UC", 4: "UD", 8: "RAW_PACKET", 9: "XRC_SEND", 10: "XRC_RECV", 0xFF: "DRIVER"}
#: enum ibv_mtu value -> bytes.
MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}


def wc_status_name(status: int) -> str:
    return WC_STATUS[status] if 0 <= status < len(WC_STATUS) else f"STATUS_{status}"


def cflags() -> list[str]:
    """``-DIBV_<NAME>=<offset>`` for every entry, plus sizes and enum values."""
    flags = [f"-DIBV_{name.upper()}={off}" for name, (_s, _m, off) in OFFSETS.items()]
    flags += [f"-DIBV_SIZEOF_{name.upper()}={size}" for name, size in SIZES.items()]
    flags += [
        f"-DIBV_SEND_SIGNALED_BIT={IBV_SEND_SIGNALED}",
        f"-DIBV_MASK_STATE={IBV_QP_STATE}",
        f"-DIBV_MASK_PORT={IBV_QP_PORT}",
        f"-DIBV_MASK_AV={IBV_QP_AV}",
        f"-DIBV_MASK_DEST_QPN={IBV_QP_DEST_QPN}",
        f"-DIBV_WC_RECV_BIT={IBV_WC_RECV}",
        f"-DIBV_SLOTS={SLOTS}",
        f"-DIBV_WR_SLOT_RECV={WR_SLOT_RECV}",
        f"-DIBV_WR_SLOT_ATOMIC_WRITE={WR_SLOT_ATOMIC_WRITE}",
        f"-DIBV_SLOT_OTHER={SLOT_OTHER}",
    ]
    return flags
