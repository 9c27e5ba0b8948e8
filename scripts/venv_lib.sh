# Shared by install.sh and install_vllm_cpu.sh: build a venv from an exactly pinned lock, once.

# The hash a venv's stamp records: of the lock and any other files the install depends on, and of this
# file, which says how every venv is installed (a change here rebuilds them once).
files_hash() {
  cat "$@" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1
}

# uv, pinned, from the package registry like everything else, in a small venv of its own (TAU2_UV_VENV,
# default .venv-uv):
# it installs a lock in seconds where pip takes a minute or more (bench/RESULTS.md, "Installing").
# TAU2_INSTALLER=pip uses pip only; pip is also what runs when uv cannot be had or fails.
UV_VERSION="0.13.9"

# uv_bin PYTHON: the uv binary, installed on first use (once, however many installs ask at a time), or
# nothing when it cannot be had.
uv_bin() {
  local python="$1" repo boot
  [[ "${TAU2_INSTALLER:-uv}" == pip ]] && return 0
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  boot="${TAU2_UV_VENV:-$repo/.venv-uv}"
  (
    flock 9
    [[ "$("$boot/bin/uv" --version 2>/dev/null)" == "uv $UV_VERSION"* ]] && exit 0
    "$python" -m venv "$boot" && "$boot/bin/python" -m pip --disable-pip-version-check -q install \
      "uv==$UV_VERSION" 2> >(grep -v "^WARNING: Location" >&2)
  ) 9>"$boot.lock" >&2 || { echo "venv_lib: uv==$UV_VERSION could not be installed; using pip" >&2; return 0; }
  echo "$boot/bin/uv"
}

# uv_options PYTHON: pip's own configuration on this machine (`pip config list`: its files and PIP_*
# variables) as uv options, one per line: the same indexes, local wheels and constraints, chosen among as
# pip does (the best match across indexes), and TORCH_INDEX_URL.
uv_options() {
  "$1" - <<'PY'
import os, shlex, subprocess, sys
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}
seen = []
for line in out.splitlines():
    key, _, value = line.partition("=")
    name = key.rsplit(".", 1)[-1]
    if name in flags:
        for v in shlex.split(value.strip().strip("'\"")) or []:
            if (flags[name], v) not in seen:
                seen.append((flags[name], v))
if os.environ.get("TORCH_INDEX_URL"):
    seen.append(("--extra-index-url", os.environ["TORCH_INDEX_URL"]))
print("--index-strategy\nunsafe-best-match")
for flag, value in seen:
    print(f"{flag}\n{value}")
PY
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
  local uv installer=pip
  uv="$(uv_bin "$python")"
  if [[ -n "$uv" ]]; then
    local -a options
    mapfile -t options < <(uv_options "$python")
    [[ -x "$venv/bin/python" ]] || "$uv" venv -q --seed -p "$python" "$venv" >&2
    # --compile-bytecode: what pip does by default and uv does not. Without it every process compiles each
    # module it imports, and where PYTHONDONTWRITEBYTECODE is set (many CI and container images) it does so
    # again in every process (what it costs: bench/RESULTS.md, "Compiled bytecode in the venvs").
    if "$uv" pip install -q -p "$venv/bin/python" --no-deps --compile-bytecode -r "$lock" "${options[@]}" >&2
    then
      installer=uv
    else
      echo "$name: uv could not install ${lock#"$repo"/} (its error is above); trying pip" >&2
    fi
  fi
  [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
  local pip=("$venv/bin/python" -m pip --disable-pip-version-check -q) extra=()
  [[ -n "${TORCH_INDEX_URL:-}" ]] && extra+=(--extra-index-url "$TORCH_INDEX_URL")
  if [[ "$installer" == pip ]] && ! "${pip[@]}" install "${extra[@]}" --no-deps -r "$lock" \
    2> >(grep -v "^WARNING: Location" >&2); then
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
  VENV_INSTALLER="$installer"
}
