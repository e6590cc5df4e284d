"""The ``nccl`` probe family.

NCCL communicators and collectives (uprobes, bpf/nccl.c): spans per collective, metrics,
straggler findings.
"""
