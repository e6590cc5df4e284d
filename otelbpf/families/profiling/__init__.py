"""The ``profiling`` probe family.

CPU samples and CUDA memory by stack (perf events and uprobes, bpf/profile.c): pprof profiles.
"""
