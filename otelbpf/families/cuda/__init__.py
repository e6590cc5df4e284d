"""The ``cuda`` probe family.

CUDA runtime and driver API calls (uprobes, bpf/cuda.c): spans and metrics.
"""
