#!/usr/bin/env bash
# The demo's "training job": two processes that use CUDA, run under `otelbpf run -- ...`.
#  1. cuda_workload on the STAND-IN libcudart/libcuda built from examples/cuda (calls succeed:
#     real copies, fake device memory, plausible sync waits), two threads, a small leak;
#  2. NVIDIA's REAL libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel, driven from Python:
#     with no GPU every call returns 35 (cudaErrorInsufficientDriver), which otelbpf reports.
set -euo pipefail
cd "$(dirname "$0")/.."
build/examples/cuda_workload --lib build/examples/fakecudart/libcudart.so.12 \
  --driver-lib build/examples/fakecuda/libcuda.so.1 --iterations 40 --threads 2 --async --leak 2 \
  --alloc-bytes 4194304 --h2d-bytes 4194304 --d2h-bytes 1048576 > /dev/null
.venv/bin/python examples/cuda/real_cudart.py --iterations 20 > /dev/null
