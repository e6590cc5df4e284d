"""The ``sched`` probe family.

Why threads are off the CPU (sched tracepoints, bpf/sched.c): off-CPU time, run-queue
latency, off_cpu spans.
"""
