#!/usr/bin/env bash
# The project's test command: installs (idempotent) and runs the test suite on three pytest-xdist
# workers (the tests that start AReaL's processes run as one unit per seed: tests/conftest.py says why).
# Three, not one per core: the SLURM requeue run, the longest unit, mostly waits (for SLURM, for its jobs
# to start), and a third worker uses those cores (bench/RESULTS.md, "The test suite (`scripts/test.sh`)").
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow" -k replay`; `-n 0` runs
# everything in this one process.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/scripts/install_all.sh"  # .venv and .venv-vllm (the CPU smoke test's server), side by side
cd "$repo"
# The SLURM tests' daemons (Debian's slurm-wlm and munge): installed once here, as root; for another user
# those tests are skipped and say why.
# The trajectory browser's tests drive Debian's `chromium` (tests/eval/test_view.py): installed once here, as
# root, when missing; for another user those tests are skipped and say why.
if [[ "$(id -u)" == 0 ]]; then
  .venv/bin/python -m examples.tau2.slurm.local_cluster install
  if [[ ! -x /usr/bin/chromium ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
  fi
fi
.venv/bin/ruff check examples tests bench
# The tiny policies the whole smoke runs train (one per domain: `mock`, and the SLURM runs' `library`), built
# here once with the cores free. Built by the first run that needs one, under the suite's load, a build
# took ~10 min and overran that run's own SLURM time limit (bench/RESULTS.md, "The test suite").
PYTHONPATH="examples/tau2/docs/own_domain${PYTHONPATH:+:$PYTHONPATH}" .venv/bin/python - <<'EOF'
from examples.tau2.cpu.smoke_config import load_smoke_config
from examples.tau2.cpu.tiny_model import TinyModelRecipe, ensure_tiny_model
from examples.tau2.runtime.process import setup_runtime

setup_runtime()
library = ["econfig.domain=library", "econfig.domain_modules=[library_desk]", "econfig.train_split=train"]
for overrides in ([], library):
    ensure_tiny_model(TinyModelRecipe.from_dict(load_smoke_config(overrides)[0].smoke.tiny_model))
EOF
.venv/bin/lint-imports  # the layering: pyproject.toml's [tool.importlinter]
# The workers share the cores, each with processes of its own (trainers, vLLM servers, tiny-model builds):
# OpenMP threads that spin while they wait would take the cores from the other workers' (bench/RESULTS.md,
# "OpenMP threads that wait"). A value of the caller's own stands.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
exec .venv/bin/python -m pytest -n 3 --dist loadgroup "$@"
