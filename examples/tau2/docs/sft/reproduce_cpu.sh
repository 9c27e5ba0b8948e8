#!/usr/bin/env bash
# The CPU SFT measurement of docs/sft/README.md, end to end (most of its time is SFT):
#   1. the scripted oracle plays every mock task (2 trials) against the scripted `user-scenario` user: an eval dir
#   2. sft.data exports its successful trajectories (6 distinct rows) with a manifest
#   3. sft.train trains the random tiny Qwen3 on them with AReaL's SFTTrainer (configs/sft_cpu.yaml)
#   4. the untrained and the fine-tuned policy are each served by vLLM (CPU) and evaluated with eval.evaluate on
#      all 9 mock tasks: 4 trials at temperature 1, and greedy
#   5. eval.compare: SFT minus untrained with a paired bootstrap interval, per temperature
# Usage: bash examples/tau2/docs/sft/reproduce_cpu.sh [WORK_DIR] [extra sft.train overrides...]
set -euo pipefail
cd "$(dirname "$0")/../../../.."
WORK=${1:-/tmp/tau2-sft-demo}
shift || true
PY=.venv/bin/python
VLLM_PY=${TAU2_VLLM_PYTHON:-.venv-vllm/bin/python}
USER_PORT=${USER_PORT:-18765}
POLICY_PORT=${POLICY_PORT:-18766}
mkdir -p "$WORK"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

wait_http() {  # url, seconds
  for _ in $(seq "$2"); do curl -sf "$1" >/dev/null && return 0; sleep 1; done
  echo "no answer from $1" >&2; return 1
}

$PY -m examples.tau2.cpu.scripted_endpoint --port "$USER_PORT" >"$WORK/endpoint.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$USER_PORT/health" 120
SCRIPTED="http://127.0.0.1:$USER_PORT/v1"

# 1-2. Oracle trajectories, exported.
$PY -m examples.tau2.eval.evaluate --policy-base-url "$SCRIPTED" --policy-model oracle \
  --user-base-url "$SCRIPTED" --user-model user-scenario --domains mock --split all --trials 2 \
  --output-dir "$WORK/eval-oracle"
TOKENIZER=$($PY -c "from examples.tau2.cpu.tiny_model import tokenizer_dir; print(tokenizer_dir())")
$PY -m examples.tau2.sft.data --from "$WORK/eval-oracle" --out "$WORK/oracle.jsonl" --tokenizer "$TOKENIZER"

# 3. SFT (the summary's last JSON object names the checkpoint and the untrained start).
$PY -m examples.tau2.sft.train --config examples/tau2/sft.yaml +configs=sft_cpu \
  "train_dataset.path=$WORK/oracle.jsonl" "cluster.fileroot=$WORK/fileroot" \
  "cluster.name_resolve.nfs_record_root=$WORK/fileroot/name_resolve" "$@" | tee "$WORK/sft.out"
SUMMARY=$(find "$WORK/fileroot/logs" -name sft_summary.json | head -1)
UNTRAINED=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['model'])" "$SUMMARY")
TRAINED=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['checkpoint'])" "$SUMMARY")

# 4. Serve each policy with vLLM's OpenAI server on CPU and evaluate it.
evaluate() {  # name, model dir
  env -u PYTHONPATH -u VIRTUAL_ENV VLLM_CPU_KVCACHE_SPACE=1 "$VLLM_PY" -m vllm.entrypoints.openai.api_server \
    --model "$2" --served-model-name "$1" --dtype float32 --enforce-eager --block-size 32 \
    --max-model-len 4096 --max-num-seqs 8 --enable-auto-tool-choice --tool-call-parser hermes \
    --host 127.0.0.1 --port "$POLICY_PORT" >"$WORK/vllm-$1.log" 2>&1 &
  local pid=$!
  PIDS+=($pid)
  wait_http "http://127.0.0.1:$POLICY_PORT/health" 600
  for t in 1.0 0.0; do
    local k=4; [ "$t" = 0.0 ] && k=1
    $PY -m examples.tau2.eval.evaluate --policy-base-url "http://127.0.0.1:$POLICY_PORT/v1" --policy-model "$1" \
      --user-base-url "$SCRIPTED" --user-model user-scenario --domains mock --split all --trials "$k" \
      --temperature "$t" --max-completion-tokens 64 --concurrency 4 --output-dir "$WORK/eval-$1-t$t"
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
evaluate tiny-untrained "$UNTRAINED"
evaluate tiny-sft "$TRAINED"
for d in "$WORK"/eval-tiny-*; do echo "== $d"; sed -n '/^| domain/,/^$/p' "$d/results.md"; done
# 5. The difference with a paired bootstrap interval over tasks, at each temperature.
for t in 1.0 0.0; do
  $PY -m examples.tau2.eval.compare compare "$WORK/eval-tiny-sft-t$t" "$WORK/eval-tiny-untrained-t$t" \
    --labels sft untrained --output-dir "$WORK/compare-t$t"
done
