#!/usr/bin/env bash
# Both venvs the test suite needs, built side by side (they are independent, and a first install is
# mostly one core's work each): .venv (scripts/install.sh) and .venv-vllm (scripts/install_vllm_cpu.sh,
# the CPU smoke test's inference server). Each is idempotent. A failure of either exits 1 once both have
# finished, below that install's own message. Env vars: those of the two scripts.
# Side by side against one after the other: bench/bench_install.py.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/scripts/install.sh" & main=$!
bash "$repo/scripts/install_vllm_cpu.sh" & vllm=$!
failed=0
wait "$main" || failed=1
wait "$vllm" || failed=1
(( failed == 0 )) || { echo "install_all.sh: an install failed (its error is above)" >&2; exit 1; }
