#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment from the pinned lock file.
#
# Idempotent: a stamp records the hash of the lock file and pyproject.toml, so a second run costs ~1 s.
# First-time time and size: examples/tau2/docs/troubleshooting.md.
# Env vars: VENV (default .venv), PYTHON (default python3.11),
# TORCH_INDEX_URL (an index that serves the torch==2.13.0 CPU wheel, for machines without it).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/venv_lib.sh"
venv="${VENV:-$repo/.venv}"
lock="$repo/requirements/cpu.lock"
stamp="$venv/.tau2-areal-installed"
want="$(files_hash "$lock" "$repo/pyproject.toml")"
[[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && exit 0

venv_from_lock install.sh "$venv" "$lock"
# Refuse known-malicious or incompatible versions (litellm) before the venv counts as installed.
"$venv/bin/python" -m examples.tau2.runtime.pins "$lock" || exit 1
echo "$want" >"$stamp"
echo "install.sh: done in $VENV_INSTALL_SECONDS s" >&2
