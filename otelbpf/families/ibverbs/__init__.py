"""The ``ibverbs`` probe family.

RDMA queue pairs and their data path (uprobes, bpf/ibverbs.c): per-QP metrics, lifecycle and
slow-completion spans.
"""
