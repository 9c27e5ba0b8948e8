#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment from the pinned lock file.
#
# Idempotent: a stamp records the hash of the lock file and pyproject.toml, so a second run costs ~1 s.
# Env vars: VENV (default .venv), PYTHON (default python3.11), TORCH_INDEX_URL (an index that serves
# the torch==2.13.0 CPU wheel, for machines that do not already have it).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$repo/.venv}"
python="${PYTHON:-python3.11}"
lock="$repo/requirements/cpu.lock"
stamp="$venv/.tau2-areal-installed"
want="$(cat "$lock" "$repo/pyproject.toml" | sha256sum | cut -d' ' -f1)"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi

command -v "$python" >/dev/null || { echo "install.sh: $python not found (AReaL 1.0.4 needs Python 3.11 or 3.12)" >&2; exit 1; }
start=$SECONDS
echo "install.sh: creating $venv from requirements/cpu.lock (first time: ~3-4 min, ~3.5 GB)" >&2
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
extra=()
[[ -n "${TORCH_INDEX_URL:-}" ]] && extra+=(--extra-index-url "$TORCH_INDEX_URL")
# The lock is the complete closure: --no-deps skips the resolver (areal's declared deps never resolve).
"${pip[@]}" install "${extra[@]}" --no-deps -r "$lock" 2> >(grep -v "^WARNING: Location" >&2)
# Make `examples.tau2` importable from anywhere (AReaL's worker processes too): the editable-install
# equivalent, without a build backend.
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$repo" >"$site/tau2_areal.pth"
echo "$want" >"$stamp"
echo "install.sh: done in $((SECONDS - start)) s" >&2
