#!/usr/bin/env bash
# The README's demo command: set up this host (idempotent), build the example workloads, run
# otelbpf on the embedded default configuration (OTLP-JSON files in ./otelbpf-out, no external
# service) around a small CUDA job, then summarise what it recorded.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash examples/build.sh
rm -rf otelbpf-out
echo "demo: running examples/demo_job.sh under otelbpf (watching it and its children)"
.venv/bin/otelbpf run -- examples/demo_job.sh
echo
echo "demo: what otelbpf recorded (otelbpf summary otelbpf-out):"
echo
.venv/bin/otelbpf summary otelbpf-out
echo "demo: why the GPU would sit idle (otelbpf diagnose otelbpf-out):"
echo
.venv/bin/otelbpf diagnose otelbpf-out || [[ $? -eq 1 ]]  # 1: there are findings
echo
echo "demo: the report (findings, timelines, flame graphs; opens offline): otelbpf-out/report.html"
echo "demo: raw OTLP-JSON lines are in otelbpf-out/ (traces.jsonl, metrics.jsonl)"
echo "demo: pprof profiles (CPU, CUDA memory by stack) are in otelbpf-out/profiles/:"
echo "      go tool pprof -top otelbpf-out/profiles/cuda_workload-*-cuda_memory-*.pb.gz"
