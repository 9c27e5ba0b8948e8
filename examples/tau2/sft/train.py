"""Supervised fine-tuning of a tau2 policy on exported trajectories, with AReaL 1.0.4's `SFTTrainer`.

    python -m examples.tau2.sft.train --config examples/tau2/sft.yaml train_dataset.path=data/sft.jsonl \
        [+configs=sft_cpu] [key=value ...] [--dry-run]

The data is a JSONL from `sft.data` (OpenAI messages + the tool schemas the policy saw). Each row is
rendered with the chat template of `tokenizer_path` and trained as one sequence whose loss covers every
assistant turn the policy generated (`sft.data.encode_conversation`), as `input_ids` / `loss_mask`
rows for AReaL's SFT engines (fsdp, archon or megatron, chosen by `actor.backend`). The config is AReaL's
`SFTConfig` (`sft.yaml`; the keys it shares with the RL config.yaml mean the same), plus `tiny_model`
for CPU runs. With `cluster.n_gpus_per_node: 0` (configs/sft_cpu.yaml) the trainer is
`cpu.sft_trainer.CpuSFTTrainer` (one sequence per micro-batch on CPU); otherwise AReaL's own.

`--dry-run` loads the config and tokenizes the data (row and token counts, the longest row against
`max_length` and `mb_spec.max_tokens_per_mb`), prints the plan and the problems found, and starts
nothing. At the end of a run, `sft_summary.json` in AReaL's log folder names the checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal.api.cli_args import SFTConfig

from examples.tau2.cpu.smoke_config import compose_config
from examples.tau2.cpu.tiny_model import latest_saved_model
from examples.tau2.runtime.console import console_logging
from examples.tau2.runtime.process import exit_after, setup_runtime, stop_descendants
from examples.tau2.settings.config import ConfigError, pop_dry_run, split_config_argv
from examples.tau2.tau2_utils import first_line

logger = logging.getLogger("tau2_areal.sft")

SUMMARY_FILE = "sft_summary.json"
USAGE = "usage: python -m examples.tau2.sft.train --config FILE [key=value ...] [--dry-run]"
BACKENDS = ("fsdp", "archon", "megatron")


@dataclass
class Tau2SFTConfig(SFTConfig):
    """AReaL's SFT config plus the tiny CPU policy to start from when `actor.path` is empty."""

    tiny_model: dict[str, Any] | None = None
    """`TinyModelRecipe` fields (cpu/tiny_model.py); null: `actor.path` must name the model."""
    tiny_model_cache_dir: str = ""
    """Where tiny models are cached; empty: ~/.cache/tau2-areal/tiny-qwen3."""

    @property
    def on_cpu(self) -> bool:
        return self.cluster.n_gpus_per_node == 0


class SFTConfigError(ConfigError):
    """The command line or the YAML cannot become an SFT config; the message is one sentence."""


def load_sft_config(argv: list[str]) -> tuple[Tau2SFTConfig, Path, list[str]]:
    """(config, config file, overrides), composed as AReaL composes it, without side effects."""
    config_file, overrides = split_config_argv(argv, USAGE, SFTConfigError)
    return compose_config(config_file, overrides, Tau2SFTConfig, SFTConfigError), config_file, overrides


def check_config(config: Tau2SFTConfig) -> list[str]:
    """Every problem the config has on its own, one sentence each; reads nothing but paths."""
    from areal.api.alloc_mode import ModelAllocation

    from examples.tau2.cpu.tiny_model import TinyModelRecipe

    errors = []
    for name, dataset in (("train_dataset", config.train_dataset), ("valid_dataset", config.valid_dataset)):
        if dataset is not None and not Path(dataset.path).is_file():
            errors.append(f"{name}.path={dataset.path} is not a file (export one with "
                          "python -m examples.tau2.sft.data)")
    try:
        backend = ModelAllocation.from_str(config.actor.backend, name="actor").backend
    except Exception as e:
        errors.append(f"actor.backend={config.actor.backend}: {first_line(e)}")
        backend = ""
    if backend and backend not in BACKENDS:
        errors.append(f"actor.backend={config.actor.backend}: SFTTrainer trains with {', '.join(BACKENDS)}")
    if not config.actor.path:
        if config.tiny_model is None:
            errors.append("actor.path must name the model to fine-tune (or set tiny_model for a CPU run)")
        else:
            try:
                TinyModelRecipe.from_dict(config.tiny_model)
            except (ValueError, TypeError) as e:
                errors.append(f"tiny_model: {e}")
    if config.on_cpu:
        if backend and backend != "fsdp":
            errors.append(f"actor.backend={config.actor.backend}: on CPU use fsdp (archon's attention "
                          "needs CUDA for packed rows, megatron needs CUDA)")
        if config.actor.attn_impl != "sdpa":
            errors.append(f"actor.attn_impl={config.actor.attn_impl}: on CPU use sdpa")
    if config.total_train_epochs < 1:
        errors.append("total_train_epochs must be >= 1")
    if config.train_dataset.batch_size < 1:
        errors.append("train_dataset.batch_size must be >= 1")
    if config.scheduler.type not in ("local", "slurm") and not os.environ.get("AREAL_SPMD_MODE"):
        errors.append(f"scheduler.type={config.scheduler.type}: use local or slurm (single controller), "
                      "or launch under torchrun with AREAL_SPMD_MODE=1")
    for name, value in shared_paths(config).items():
        if not value:
            errors.append(f"{name} must be set")
    return errors


def shared_paths(config: Tau2SFTConfig) -> dict[str, str]:
    """Directories AReaL's schedulers require to exist (created before the run)."""
    paths = {"cluster.fileroot": config.cluster.fileroot}
    if config.cluster.name_resolve.type == "nfs":
        paths["cluster.name_resolve.nfs_record_root"] = config.cluster.name_resolve.nfs_record_root
    return paths


@dataclass
class DataReport:
    """What the data becomes for training."""

    path: str
    rows: int
    too_long: int
    tokens: int
    trained_tokens: int
    longest: int


@dataclass
class SFTData:
    train: list[dict[str, list[int]]]
    valid: list[dict[str, list[int]]] | None
    reports: list[DataReport] = field(default_factory=list)


def tokenizer_path(config: Tau2SFTConfig) -> str:
    """The tokenizer's location; the tiny model's tokenizer when the tiny model is not built yet."""
    if config.tokenizer_path:
        return config.tokenizer_path
    if not config.actor.path and config.tiny_model is not None:
        from examples.tau2.cpu.tiny_model import tokenizer_dir

        return str(tokenizer_dir())
    return config.actor.path


def load_data(config: Tau2SFTConfig, tokenizer: Any) -> SFTData:
    """Tokenized train (and valid) rows; raises ValueError when the data cannot be trained on."""
    from examples.tau2.sft.data import encode_rows, read_rows

    def one(dataset) -> tuple[list[dict[str, list[int]]], DataReport]:
        rows = read_rows(Path(dataset.path))
        encoded, too_long = encode_rows(tokenizer, rows, dataset.max_length)
        report = DataReport(path=dataset.path, rows=len(encoded), too_long=too_long,
                            tokens=sum(len(r["input_ids"]) for r in encoded),
                            trained_tokens=sum(sum(r["loss_mask"]) for r in encoded),
                            longest=max((len(r["input_ids"]) for r in encoded), default=0))
        if not encoded:
            raise ValueError(f"every row of {dataset.path} is longer than max_length={dataset.max_length}")
        limit = config.actor.mb_spec.max_tokens_per_mb
        if limit is not None and report.longest > limit:
            raise ValueError(f"the longest row of {dataset.path} has {report.longest} tokens, more than "
                             f"actor.mb_spec.max_tokens_per_mb={limit}")
        return encoded, report

    train, train_report = one(config.train_dataset)
    valid, reports = None, [train_report]
    if config.valid_dataset is not None:
        valid, valid_report = one(config.valid_dataset)
        reports.append(valid_report)
    return SFTData(train, valid, reports)


def format_plan(config: Tau2SFTConfig, data: SFTData | None, errors: list[str]) -> str:
    a = config.actor
    lines = [
        f"tau2 SFT {config.experiment_name}/{config.trial_name}",
        f"  model: {a.path or '<tiny model ' + json.dumps(config.tiny_model) + '>'} ({a.dtype}), "
        f"backend {a.backend}{' on CPU (CpuSFTTrainer)' if config.on_cpu else ''}, scheduler "
        f"{config.scheduler.type}",
        f"  optimizer: {a.optimizer.type} lr {a.optimizer.lr} ({a.optimizer.lr_scheduler_type}), "
        f"{config.total_train_epochs} epochs, {config.train_dataset.batch_size} rows per step",
    ]
    for r in data.reports if data else []:
        steps = -(-r.rows // config.train_dataset.batch_size)
        lines.append(f"  data {r.path}: {r.rows} rows ({r.too_long} longer than max_length left out), "
                     f"{r.tokens} tokens of which {r.trained_tokens} trained, longest {r.longest}; "
                     f"{steps} step(s) per epoch")
    lines.append(f"  checkpoints and logs under {config.cluster.fileroot}")
    lines += [f"PROBLEM: {e}" for e in errors]
    return "\n".join(lines)


def to_dataset(rows: list[dict[str, list[int]]]):
    from datasets import Dataset

    return Dataset.from_list(rows)



def run(config_file: Path, overrides: list[str], config: Tau2SFTConfig) -> dict[str, Any]:
    """Train; returns the summary (also written to `sft_summary.json` in AReaL's log folder)."""
    from areal.api.cli_args import load_expr_config
    from areal.utils.stats_logger import StatsLogger
    from transformers import AutoTokenizer

    start = time.perf_counter()
    argv = ["--config", str(config_file), *overrides]
    if not config.actor.path:
        from examples.tau2.cpu.tiny_model import TinyModelRecipe, ensure_tiny_model

        model = ensure_tiny_model(TinyModelRecipe.from_dict(config.tiny_model or {}),
                                  config.tiny_model_cache_dir or None)
        logger.info("starting from the tiny policy %s", model)
        argv.append(f"actor.path={model}")
    for path in shared_paths(config).values():
        Path(path).mkdir(parents=True, exist_ok=True)
    # AReaL's loader composes the same argv, sets up name resolution and saves the config in the log dir.
    config, _ = load_expr_config(argv, Tau2SFTConfig)
    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path)
    data = load_data(config, tokenizer)
    logger.info("%s", format_plan(config, data, []))
    if config.on_cpu:
        from examples.tau2.cpu import sft_trainer
        from examples.tau2.cpu.sft_trainer import CpuSFTTrainer as trainer_cls

        console_logging(sft_trainer.logger)
    else:
        from areal import SFTTrainer as trainer_cls
    valid = to_dataset(data.valid) if data.valid is not None else None
    t = time.perf_counter()
    with trainer_cls(config, train_dataset=to_dataset(data.train), valid_dataset=valid) as trainer:
        startup_s = time.perf_counter() - t
        t = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - t
    log_dir = Path(StatsLogger.get_log_path(config.stats_logger))
    checkpoint = latest_saved_model(config.saver)
    summary = {
        "model": config.actor.path, "backend": config.actor.backend,
        "data": [dataclasses.asdict(r) for r in data.reports],
        "checkpoint": str(checkpoint or ""), "log_dir": str(log_dir),
        "timings_s": {"startup": round(startup_s, 1), "train": round(train_s, 1),
                      "total": round(time.perf_counter() - start, 1)},
    }
    stats_file = log_dir / "stats.jsonl"
    if stats_file.is_file():
        from examples.tau2.cpu.sft_trainer import LOSS_KEY

        steps = [json.loads(line) for line in stats_file.read_text().splitlines() if line.strip()]
        summary["loss"] = [s.get(LOSS_KEY) for s in steps]
    (log_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 trained (or a clean dry run), 1 problems found, 2 unusable command line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    dry_run, argv = pop_dry_run(argv)
    try:
        config, config_file, overrides = load_sft_config(argv)
    except SFTConfigError as e:
        print(f"sft.train: {e}", file=sys.stderr)
        return 2
    setup_runtime()
    from examples.tau2.cpu import tiny_model

    console_logging(logger, tiny_model.logger)
    errors = check_config(config)
    data = None
    if not errors and dry_run:
        from transformers import AutoTokenizer

        try:
            data = load_data(config, AutoTokenizer.from_pretrained(tokenizer_path(config)))
        except (OSError, ValueError) as e:
            errors.append(first_line(e))
    if dry_run or errors:
        print(format_plan(config, data, errors), file=sys.stdout if dry_run else sys.stderr)
        if errors and not dry_run:
            print(f"sft.train: {len(errors)} problem(s); nothing was started", file=sys.stderr)
        return 1 if errors else 0
    try:
        summary = run(config_file, overrides, config)
    finally:
        stop_descendants(logger)
    print(json.dumps(summary, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    # Run this module's `main` under its importable name: AReaL sends the config to its workers as a
    # dataclass named by module path, which must not be `__main__`.
    from examples.tau2.sft.train import main as _main

    exit_after(_main)
