#!/usr/bin/env bash
# The demo's "training job": processes that use CUDA, run under `otelbpf run -- ...`.
#  1. cuda_workload on the CUDA 13 STAND-IN runtime and driver built from examples/cuda (calls
#     succeed: real copies, fake device memory, plausible sync waits; kernel handles made by
#     __cudaGetKernel, and a runtime that calls the driver, as CUDA 13 does on a GPU), two
#     threads, pageable host buffers, a small leak;
#  2. an nvcc 13 program (plain, templated, functor and lambda kernels) on NVIDIA's REAL
#     libcudart.so.13 from the toolkit: with no GPU every call returns 35
#     (cudaErrorInsufficientDriver); the launches are still counted and named;
#  3. NVIDIA's REAL libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel, driven from Python.
set -euo pipefail
cd "$(dirname "$0")/.."
build/examples/cuda_workload --lib build/examples/fakecudart13/libcudart.so.13 --cuda13 \
  --driver-lib build/examples/fakecuda/libcuda.so.1 --iterations 40 --threads 2 --async --leak 2 \
  --alloc-bytes 4194304 --h2d-bytes 4194304 --d2h-bytes 1048576 > /dev/null
if [[ -x build/examples/nvcc/nvcc_launches ]]; then
  build/examples/nvcc/nvcc_launches --launches 500 --ex-launches 20 > /dev/null
fi
"${OTELBPF_VENV:-.venv}/bin/python" examples/cuda/real_cudart.py --iterations 20 > /dev/null
