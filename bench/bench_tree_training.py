"""Prefix-shared (tree) training against the layouts it replaces, side by side on the same rows.

Three trainer layouts, each AReaL's own actor in this process (float32, one CPU process):
  fsdp-one-seq   FSDP, one row per micro-batch (the embedded default before archon)
  archon-packed  archon, rows packed side by side (block-diagonal causal mask)
  archon-tree    archon, rows packed into a prefix trie (cpu/archon_tree_cpu.py)
on two kinds of rows: batches recorded from a real smoke run (`TAU2_RECORD_BATCHES=DIR bash
examples/tau2/tau2_rl.sh smoke`), and synthetic airline-shaped GRPO groups rendered with the real Qwen3
chat template, τ²'s airline policy and tools. For each: tokens the trainer computes per step, seconds
per step (recompute logprobs + one PPO update), and equivalence with fsdp-one-seq on the same batch
and weights (per-token logprobs, loss, gradient norm).

    .venv/bin/python bench/bench_tree_training.py --smoke-batches /tmp/smoke-batches
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from areal.utils import stats_tracker  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from bench.standalone_actor import (  # noqa: E402
    Layout,
    Row,
    airline_rows,
    batch_of,
    build_actor,
    count_computed_tokens,
    rows_from_batch_file,
    single_process_group,
)
from examples.tau2.cpu.tiny_model import TinyModelRecipe, ensure_tiny_model  # noqa: E402

LOSS = "ppo_actor/update/actor_loss/avg"
GRAD_NORM = "ppo_actor/update/grad_norm"


def measure(layout: Layout, model: Path, rows: list[Row], max_tokens_per_mb: int, update: bool) -> dict:
    with single_process_group():
        return _measure(layout, model, rows, max_tokens_per_mb, update)


def _measure(layout: Layout, model: Path, rows: list[Row], max_tokens_per_mb: int, update: bool) -> dict:
    actor = build_actor(layout, model, max_tokens_per_mb=max_tokens_per_mb)
    computed = count_computed_tokens(actor)
    try:
        t = time.perf_counter()
        logprobs = actor.compute_logp(batch_of(rows))
        logp_s = time.perf_counter() - t
        stats_tracker.export(reset=True)
        t = time.perf_counter()
        if update:
            actor.ppo_update(batch_of(rows))
        update_s = time.perf_counter() - t if update else math.nan
        stats = stats_tracker.export(reset=True)
    finally:
        actor.destroy()
        gc.collect()
    return dict(layout=layout.value, tokens_computed=computed[0], logp_s=logp_s, update_s=update_s,
                step_s=logp_s + update_s if update else logp_s, loss=stats.get(LOSS, math.nan),
                grad_norm=stats.get(GRAD_NORM, math.nan),
                logprobs=[lp.reshape(-1)[:len(r.input_ids) - 1]
                          for lp, r in zip(logprobs, rows, strict=True)])


def compare(result: dict, reference: dict, rows: list[Row]) -> dict:
    """Differences on the generated tokens (the ones the loss reads)."""
    abs_diff, rel_diff = 0.0, 0.0
    for ours, theirs, row in zip(result["logprobs"], reference["logprobs"], rows, strict=True):
        n = len(row.input_ids)
        gen = slice(n - 1 - row.n_generated, n - 1)
        d = (ours[gen] - theirs[gen]).abs()
        abs_diff = max(abs_diff, float(d.max()))
        rel_diff = max(rel_diff, float((d / theirs[gen].abs().clamp_min(1e-6)).max()))
    rel = lambda a, b: abs(a - b) / max(abs(b), 1e-12)  # noqa: E731
    return dict(logprob_max_abs=abs_diff, logprob_max_rel=rel_diff,
                loss_rel=rel(result["loss"], reference["loss"]),
                grad_norm_rel=rel(result["grad_norm"], reference["grad_norm"]))


def bench_rows(name: str, rows: list[Row], model: Path, per_mb: dict[Layout, int],
               update: bool = True) -> list[dict]:
    """`per_mb`: the layouts to run (the first is the reference), each with its max_tokens_per_mb."""
    in_rows = sum(len(r.input_ids) for r in rows)
    print(f"\n## {name}: {len(rows)} rows, {in_rows} tokens in rows, "
          f"{sum(r.n_generated for r in rows)} generated", flush=True)
    results = [measure(layout, model, rows, tokens, update) for layout, tokens in per_mb.items()]
    reference = results[0]
    table = []
    for r in results:
        row = dict(rows=name, layout=r["layout"], tokens_in_rows=in_rows,
                   tokens_computed=r["tokens_computed"],
                   tokens_vs_fsdp=reference["tokens_computed"] / r["tokens_computed"],
                   logp_s=round(r["logp_s"], 2), update_s=round(r["update_s"], 2),
                   step_s=round(r["step_s"], 2), speedup_vs_fsdp=reference["step_s"] / r["step_s"],
                   loss=r["loss"], grad_norm=r["grad_norm"], **compare(r, reference, rows))
        table.append(row)
        print(f"{row['layout']:>14}: computed {row['tokens_computed']:>7} tokens "
              f"({row['tokens_vs_fsdp']:.1f}x fewer than fsdp-one-seq), step {row['step_s']:.1f} s "
              f"(logp {row['logp_s']:.1f} + update {row['update_s']:.1f}; {row['speedup_vs_fsdp']:.2f}x), "
              f"logprob max |d| {row['logprob_max_abs']:.1e} (rel {row['logprob_max_rel']:.1e}), "
              f"loss rel {row['loss_rel']:.1e}, grad norm rel {row['grad_norm_rel']:.1e}", flush=True)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke-batches", type=Path, help="folder of batch-<n>.pt from a smoke run")
    parser.add_argument("--smoke-steps", type=int, default=2, help="recorded batches to run (from the first)")
    parser.add_argument("--airline-episodes", type=int, default=8)
    parser.add_argument("--airline-turns", type=int, default=2)
    parser.add_argument("--airline-update", action="store_true",
                        help="also time a PPO update on the airline rows (minutes per layout on 2 cores)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "tree_training.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    tables: list[dict] = []
    # The smoke's tiny model (random weights) twice as wide: archon pads each micro-batch to AReaL's page
    # size, 2 MiB / hidden / 4 bytes (8,192 tokens at the smoke's hidden 64, whose 5 GB of logits and their
    # gradient do not fit beside anything else in 24 GiB; 4,096 here); a rope cache for airline prompts.
    model = ensure_tiny_model(TinyModelRecipe(hidden_size=128, intermediate_size=256,
                                              max_position_embeddings=32768))
    if args.smoke_batches:
        for path in sorted(args.smoke_batches.glob("batch-*.pt"))[:args.smoke_steps]:
            rows = rows_from_batch_file(path)
            tables += bench_rows(f"smoke {path.stem}", rows, model,
                                 {Layout.fsdp_one_sequence: 8192, Layout.archon_packed: 4096,
                                  Layout.archon_tree: 8192})
    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = airline_rows(tokenizer, n_episodes=args.airline_episodes, n_turns=args.airline_turns)
    longest = max(len(r.input_ids) for r in rows)
    per_row = 128 * math.ceil(longest / 128)
    name = f"airline {args.airline_episodes} episodes x {args.airline_turns} turns"
    # Archon packed needs a micro-batch of at least one ~5k-token row, padded to 8k: left out here for
    # memory (its token count is the rows' own, padded); AReaL builds each tree padded to the cap (and a
    # dense mask of its square) before the CPU path trims it: a cap above the group's distinct tokens.
    tables += bench_rows(name, rows, model, {Layout.fsdp_one_sequence: per_row, Layout.archon_tree: 16384},
                         update=args.airline_update)
    args.out.write_text(json.dumps(tables, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
