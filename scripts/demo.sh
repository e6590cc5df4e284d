#!/usr/bin/env bash
# The README's demo command: set up this host (idempotent), build the example workloads, run
# otelbpf on the embedded default configuration (OTLP-JSON files in ./otelbpf-out, no external
# service) around a small CUDA job, then summarise what it recorded.
# The set-up is the demo's only (scripts/setup.sh, no test tools); it puts `otelbpf` on the PATH,
# so what follows, and every command in the README's "Using it", is typed as shown.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) -ne 0 ]]; then  # the agent loads BPF programs; the set-up installs packages
  command -v sudo >/dev/null || { echo "demo: must run as root" >&2; exit 1; }
  echo "demo: not root: running again under sudo"
  exec sudo --preserve-env=OTELBPF_VENV,OTELBPF_BIN_DIR -- bash "$(readlink -f "$0")" "$@"
fi
bash scripts/setup.sh
bash examples/build.sh
rm -rf otelbpf-out
otelbpf=${OTELBPF_BIN_DIR:-/usr/local/bin}/otelbpf  # the set-up's link: also where PATH lacks its folder
echo "demo: running examples/demo_job.sh under otelbpf (watching it and its children)"
"$otelbpf" run -- examples/demo_job.sh
echo
echo "demo: what otelbpf recorded (otelbpf summary otelbpf-out):"
echo
"$otelbpf" summary otelbpf-out
echo "demo: why the GPU would sit idle (otelbpf diagnose otelbpf-out):"
echo
"$otelbpf" diagnose otelbpf-out || [[ $? -eq 1 ]]  # 1: there are findings
echo
echo "demo: the report (findings, timelines, flame graphs; opens offline): otelbpf-out/report.html"
echo "demo: raw OTLP-JSON lines are in otelbpf-out/ (traces.jsonl, metrics.jsonl)"
echo "demo: pprof profiles (CPU, CUDA memory by stack) are in otelbpf-out/profiles/:"
echo "      go tool pprof -top otelbpf-out/profiles/cuda_workload-*-cuda_memory-*.pb.gz   (Go: apt-get install golang-go)"
echo "demo: otelbpf is on the PATH now: try the README's \"Using it\" commands (otelbpf doctor, otelbpf top, ...)"
