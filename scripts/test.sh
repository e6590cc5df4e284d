#!/usr/bin/env bash
# The project's test command: set the host up, build the example C libraries, run pytest.
#   scripts/test.sh                # = pytest -q
#   scripts/test.sh -k doctor -x   # any pytest arguments replace the default -q
# Under CI=true, tests marked `bpf` must run: OTELBPF_REQUIRE_BPF=1 makes them fail instead of skip.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT"

scripts/setup.sh

if [[ -f examples/build.sh ]]; then
  echo "test: building the example C libraries (examples/build.sh)"
  bash examples/build.sh
fi

if [[ ${CI:-} == true ]]; then
  export OTELBPF_REQUIRE_BPF=1
  echo "test: CI=true, so tests marked bpf fail instead of skipping (OTELBPF_REQUIRE_BPF=1)"
fi

(($#)) || set -- -q
rc=0
.venv/bin/python -m pytest "$@" || rc=$?
if ((rc == 5)); then
  echo "test: ERROR: pytest collected no tests (exit 5); check the arguments and tests/" >&2
fi
exit "$rc"
