"""The ``torch`` probe family.

PyTorch operators (uprobes on at::_ops::<op>::call, bpf/torch.c): a span per call, call
counts and durations.
"""
