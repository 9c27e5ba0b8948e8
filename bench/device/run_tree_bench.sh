#!/usr/bin/env bash
# On a lent GPU machine, from the checkout's root: the tree bench in one call (bench/device/README.md).
#   bash bench/device/run_tree_bench.sh [SHAPE (default 1.7b)] [bench_tree_gpu.py run ARGS...]
# Needs, carried: .bench-wheels (fetch_wheels.sh) and .bench-rows (bench_tree_gpu.py rows).
set -euo pipefail
shape="${1:-1.7b}"
shift || true
out="${OUT:-/tmp/out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/bench-site .bench-wheels/*.whl
PYTHONPATH="/tmp/bench-site:$PWD" PYTHONUNBUFFERED=1 python3 bench/device/stand_ins.py bench/bench_tree_gpu.py run \
  --rows .bench-rows --shape "$shape" --out "$out/tree_bench_$shape.json" "$@" 2>&1 | tee "$out/tree_bench_$shape.log" \
  | grep -E "^tree |^\||^archon step|^logprobs|Error|Traceback|out of memory"
