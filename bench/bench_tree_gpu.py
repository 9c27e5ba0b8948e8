"""The archon training step with prefix sharing (tree training) off and on, side by side, on a GPU.

AReaL 1.0.4's archon PPO actor, world size 1, times `compute_logp` and `ppo_update` on one airline-shaped
PPO step (episodes of τ²'s airline policy and 14 tools rendered with the real Qwen3 chat template, one row
per policy turn, each turn's context shared with the next), tree training off (rows packed side by side)
and on (one prefix trie), and prints for each: tokens in the rows and tokens computed, seconds, tokens per
second, peak memory, MFU, the speed-up, and how far the two modes' logprobs are apart.

On CUDA: Qwen3 shapes (0.6B, 1.7B) with random weights in bfloat16, `attn_type: varlen` off and AReaL's
compiled FlexAttention tree on (config.yaml's cluster path). On a CPU (CI, so that it cannot rot): a tiny
shape in float32, `sdpa` off and the project's CPU tree path on (cpu/archon_tree_cpu.py: FlexAttention has
no backward on a CPU); no MFU there.

The rows need τ² and the tokenizer, which a lent GPU machine lacks: they are rendered here, into a folder
that also holds the tokenizer (12 MB), and carried:

    .venv/bin/python bench/bench_tree_gpu.py rows --out .bench-rows                   # 8 episodes x 8 turns
    python3 bench/bench_tree_gpu.py run --rows .bench-rows --shape 1.7b               # on the GPU machine
    .venv/bin/python bench/bench_tree_gpu.py run --rows .bench-rows --shape tiny      # on a CPU

bench/device/run_tree_bench.sh runs it on a lent GPU machine (the wheels it carries: bench/device/README.md).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ROWS_FILE = "rows.json.gz"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SHAPES = {
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32),
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128),
}
"""Qwen3's published shapes (vocabulary 151,936, tied embeddings), and a tiny one for a CPU."""
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
"""Dense bf16 peak of the GPUs the bench knows (the device's name contains the key)."""


@dataclass(frozen=True)
class ModeResult:
    """One mode's step on the rows: what was computed, how fast, in how much memory."""

    mode: str
    tokens_in_rows: int
    tokens_computed: int
    logp_s: float
    update_s: float
    peak_memory_gib: float | None
    params: int
    mfu: float | None

    @property
    def step_s(self) -> float:
        return self.logp_s + self.update_s

    @property
    def row_tokens_per_s(self) -> float:
        """The rows' tokens per second of a step: what a trainer gets through."""
        return self.tokens_in_rows / self.step_s

    @property
    def computed_tokens_per_s(self) -> float:
        return self.tokens_computed / self.step_s


# ---------------------------------------------------------------------------------------------
# Rows: rendered on a machine with τ² and the tokenizer


def write_rows(out: Path, episodes: int, turns: int, policy_words: int = 0, tools: int = 0) -> Path:
    from transformers import AutoTokenizer

    from bench.standalone_actor import airline_rows
    from examples.tau2.cpu.tiny_model import tokenizer_dir

    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir() / name).is_file():
            shutil.copy(tokenizer_dir() / name, out / name)
    tokenizer = AutoTokenizer.from_pretrained(out)
    rows = airline_rows(tokenizer, n_episodes=episodes, n_turns=turns, policy_words=policy_words,
                        n_tools=tools)
    payload = {"episodes": episodes, "turns": turns, "policy_words": policy_words, "tools": tools,
               "rows": [{"input_ids": r.input_ids, "n_generated": r.n_generated} for r in rows]}
    with gzip.open(out / ROWS_FILE, "wt") as f:
        json.dump(payload, f)
    print(f"wrote {len(rows)} rows ({sum(len(r.input_ids) for r in rows)} tokens) and the tokenizer to {out}")
    return out


def read_rows(folder: Path) -> list:
    from bench.standalone_actor import Row

    with gzip.open(folder / ROWS_FILE, "rt") as f:
        payload = json.load(f)
    return [Row(input_ids=r["input_ids"], n_generated=r["n_generated"]) for r in payload["rows"]]


# ---------------------------------------------------------------------------------------------
# The actor, on CUDA or a CPU


def model_folder(rows_dir: Path, shape: str, work: Path, longest: int) -> Path:
    """A Hugging Face folder: Qwen3 `shape`'s config (random weights: AReaL's `init_from_scratch` on CUDA;
    saved here on a CPU, where the actor loads weights) and the carried tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = work / f"qwen3-{shape}"
    folder.mkdir(parents=True, exist_ok=True)
    config = Qwen3Config(vocab_size=151936, tie_word_embeddings=True, rope_theta=1_000_000.0,
                         max_position_embeddings=max(40960, 1024 * math.ceil(longest / 1024)),
                         bos_token_id=151643, eos_token_id=151645, torch_dtype="bfloat16", **SHAPES[shape])
    if torch.cuda.is_available():
        config.save_pretrained(folder)
    else:
        torch.manual_seed(0)
        Qwen3ForCausalLM(config).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (rows_dir / name).is_file():
            shutil.copy(rows_dir / name, folder / name)
    return folder


def build_cuda_actor(folder: Path, tree: bool, max_tokens_per_mb: int, compile_: bool):
    from areal.api import FinetuneSpec
    from areal.api.cli_args import ArchonEngineConfig, MicroBatchSpec, OptimizerConfig, PPOActorConfig
    from areal.experimental.engine.archon_engine import ArchonPPOActor

    config = PPOActorConfig(
        experiment_name="bench", trial_name="tree", path=str(folder), init_from_scratch=True,
        dtype="bfloat16", backend="archon:d1", enable_tree_training=tree,
        mb_spec=MicroBatchSpec(max_tokens_per_mb=max_tokens_per_mb),
        optimizer=OptimizerConfig(type="adam", lr=1e-6, lr_scheduler_type="constant", gradient_clipping=1.0),
        archon=ArchonEngineConfig(attn_type="varlen", enable_compile=compile_), gradient_checkpointing=False,
        ppo_n_minibatches=1, prox_logp_method="recompute", use_decoupled_loss=True,
    )
    actor = ArchonPPOActor(config)
    actor.create_process_group()
    actor.initialize(addr=None,
                     ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=64, train_batch_size=8))
    return actor


def n_params(actor) -> int:
    seen: set[int] = set()
    total = 0
    for part in actor.model_parts:
        for p in part.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
    return total


def peak_flops() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def measure(mode: str, rows: list, folder: Path, max_tokens_per_mb: int, iters: int, warmup: int,
            compile_: bool) -> tuple[ModeResult, list]:
    """`mode` off|on: (its result, the logprobs of its first `compute_logp`)."""
    import torch

    from bench.standalone_actor import Layout, batch_of, build_actor, count_computed_tokens

    cuda = torch.cuda.is_available()
    tree = mode == "on"
    if cuda:
        actor = build_cuda_actor(folder, tree, max_tokens_per_mb, compile_)
        torch.cuda.reset_peak_memory_stats()
    else:
        actor = build_actor(Layout.archon_tree if tree else Layout.archon_packed, folder,
                            max_tokens_per_mb=max_tokens_per_mb)
    device = "cuda" if cuda else "cpu"
    computed = count_computed_tokens(actor)

    def timed(fn):
        batch = [{k: v.to(device) for k, v in row.items()} for row in batch_of(rows)]
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn(batch)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start, out

    try:
        logp_times, update_times, first_logprobs = [], [], None
        for i in range(warmup + iters):  # the first steps compile and warm the allocator
            seconds, logprobs = timed(actor.compute_logp)
            if first_logprobs is None:
                first_logprobs = [lp.detach().float().cpu().reshape(-1) for lp in logprobs]
            update_s, _ = timed(actor.ppo_update)
            if i >= warmup:
                logp_times.append(seconds)
                update_times.append(update_s)
        params = n_params(actor)
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    finally:
        actor.destroy()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    logp_s, update_s = min(logp_times), min(update_times)
    tokens = computed[0]
    flops = peak_flops()
    # 2 FLOPs per parameter per token forward, 6 forward and backward (attention's own FLOPs left out)
    mfu = (2 + 6) * params * tokens / (logp_s + update_s) / flops if flops else None
    in_rows = sum(len(r.input_ids) for r in rows)
    result = ModeResult(mode, in_rows, tokens, logp_s, update_s, peak, params, mfu)
    return result, first_logprobs


def logprob_gap(rows: list, a: list, b: list) -> float:
    """Largest |difference| of two modes' logprobs on the generated tokens (those the loss reads)."""
    gap = 0.0
    for row, x, y in zip(rows, a, b, strict=True):
        n = len(row.input_ids)
        gen = slice(n - 1 - row.n_generated, n - 1)
        gap = max(gap, float((x[gen] - y[gen]).abs().max()))
    return gap


def format_table(results: list[ModeResult], gap: float, device: str, shape: str) -> str:
    off = next(r for r in results if r.mode == "off")
    lines = [f"archon step on {device}, Qwen3 {shape} shape ({off.params / 1e6:.1f} M parameters), "
             f"{off.tokens_in_rows} tokens in the rows",
             "| tree | tokens computed | compute_logp s | ppo_update s | step s | row tokens/s | peak GiB "
             "| MFU | speed-up |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        peak = f"{r.peak_memory_gib:.1f}" if r.peak_memory_gib is not None else "–"
        mfu = f"{100 * r.mfu:.1f} %" if r.mfu is not None else "–"
        lines.append(f"| {r.mode} | {r.tokens_computed:,} | {r.logp_s:.2f} | {r.update_s:.2f} | "
                     f"{r.step_s:.2f} | {r.row_tokens_per_s:,.0f} | {peak} | {mfu} | "
                     f"{off.step_s / r.step_s:.2f}x |")
    lines.append(f"logprobs on the generated tokens, on vs off: max |Δ| {gap:.2e}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict:
    import torch

    from bench.standalone_actor import single_process_group

    rows = read_rows(args.rows)[: args.max_rows or None]
    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if cuda else "CPU"
    folder = model_folder(args.rows, args.shape, args.work, max(len(r.input_ids) for r in rows))
    results, logprobs = [], []
    with single_process_group(backend="nccl" if cuda else "gloo"):
        for mode in ("off", "on"):
            result, first = measure(mode, rows, folder, args.max_tokens_per_mb, args.iters, args.warmup,
                                    not args.no_compile)
            print(f"tree {mode}: {json.dumps(asdict(result))}", flush=True)
            results.append(result)
            logprobs.append(first)
    gap = logprob_gap(rows, *logprobs)
    print(format_table(results, gap, device, args.shape), flush=True)
    report = {"device": device, "shape": args.shape, "rows": len(rows), "iters": args.iters,
              "warmup": args.warmup, "max_tokens_per_mb": args.max_tokens_per_mb,
              "compile": not args.no_compile,
              "torch": torch.__version__, "logprob_max_abs_gap": gap,
              "results": [{**asdict(r), "step_s": r.step_s, "row_tokens_per_s": r.row_tokens_per_s,
                           "computed_tokens_per_s": r.computed_tokens_per_s} for r in results],
              "speedup": results[0].step_s / results[1].step_s}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rows = sub.add_parser("rows", help="render airline-shaped rows and copy the tokenizer into a folder")
    rows.add_argument("--out", type=Path, required=True)
    rows.add_argument("--episodes", type=int, default=8)
    rows.add_argument("--turns", type=int, default=8)
    rows.add_argument("--policy-words", type=int, default=0, help="shorten the policy (0: all of it)")
    rows.add_argument("--tools", type=int, default=0, help="the first N tools only (0: all 14)")
    bench = sub.add_parser("run", help="time the step with tree training off and on")
    bench.add_argument("--rows", type=Path, required=True)
    bench.add_argument("--shape", choices=sorted(SHAPES), default="1.7b")
    bench.add_argument("--max-rows", type=int, default=0, help="the first N rows only (0: all)")
    bench.add_argument("--max-tokens-per-mb", type=int, default=32768)
    bench.add_argument("--iters", type=int, default=2)
    bench.add_argument("--warmup", type=int, default=1)
    bench.add_argument("--no-compile", action="store_true", help="CUDA: archon without torch.compile")
    bench.add_argument("--work", type=Path,
                       default=Path(os.environ.get("TMPDIR", "/tmp")) / "tau2-tree-bench")
    bench.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.command == "rows":
        write_rows(args.out, args.episodes, args.turns, args.policy_words, args.tools)
        return None
    return run(args)


if __name__ == "__main__":
    main()
