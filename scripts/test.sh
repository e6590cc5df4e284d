#!/usr/bin/env bash
# The project's test command: set the host up (scripts/setup.sh --test: what the demo needs, plus
# the test tools and extras), build the example C libraries, then run the
# tiers, fastest first:
#   1. guard rails: the import-linter layers contract, ruff and mypy (all configured in pyproject.toml);
#   2. the unit tier: `pytest -m "not bpf and not heavy"` (no root, no eBPF, seconds);
#   3. the heavy tier: `pytest -m "heavy and not bpf"` (fuzzing, wheel and manifest builds,
#      memory bounds: no eBPF, but seconds per test);
#   4. the BPF tier: `pytest -m bpf` (real probes on real processes), with its 25 slowest tests
#      listed so CI logs show where the time goes.
# Every tier runs even when an earlier one failed; the exit status is non-zero if any failed.
#   scripts/test.sh                # = pytest -q, per tier
#   scripts/test.sh -k doctor -x   # any pytest arguments replace the default -q, in every tier
# Under CI=true, tests marked `bpf` must run: OTELBPF_REQUIRE_BPF=1 makes them fail instead of skip.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT"

if [[ $(id -u) -ne 0 ]]; then  # the BPF tier loads programs; setup.sh installs packages
  command -v sudo >/dev/null || { echo "test: must run as root" >&2; exit 1; }
  echo "test: not root: running again under sudo"
  exec sudo --preserve-env=CI,OTELBPF_VENV,OTELBPF_BIN_DIR -- bash "$(readlink -f "$0")" "$@"
fi

scripts/setup.sh --test  # the demo's set-up, plus the test tools and the test extras

if [[ -f examples/build.sh ]]; then
  echo "test: building the example C libraries (examples/build.sh)"
  bash examples/build.sh
fi

if [[ ${CI:-} == true ]]; then
  export OTELBPF_REQUIRE_BPF=1
  echo "test: CI=true, so tests marked bpf fail instead of skipping (OTELBPF_REQUIRE_BPF=1)"
fi

(($#)) || set -- -q
failed=()

echo "test: guard rails: import-linter (one-way layers), ruff (lint, format), mypy (types)"
.venv/bin/lint-imports || failed+=("import-linter")
.venv/bin/ruff check otelbpf tests bench || failed+=("ruff check")
.venv/bin/ruff format --check otelbpf tests bench || failed+=("ruff format (run: .venv/bin/ruff format otelbpf tests bench)")
.venv/bin/mypy || failed+=("mypy")

# A tier that collects nothing (exit 5: the arguments selected only other tiers' tests)
# is not a failure; all of them collecting nothing is.
empty=0
run_tier() {
  local name=$1 rc=0
  shift
  echo "test: $name tier: pytest $*"
  .venv/bin/python -m pytest "$@" || rc=$?
  if ((rc == 5)); then
    empty=$((empty + 1))
  elif ((rc != 0)); then
    failed+=("$name tier (pytest exit $rc)")
  fi
}

run_tier unit -m "not bpf and not heavy" "$@"
run_tier heavy -m "heavy and not bpf" --durations=10 "$@"
run_tier bpf -m bpf --durations=25 "$@"

if ((empty == 3)); then
  echo "test: ERROR: pytest collected no tests in any tier (exit 5); check the arguments and tests/" >&2
  exit 5
fi
if ((${#failed[@]})); then
  printf 'test: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "test: all tiers passed"
