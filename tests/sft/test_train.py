"""The SFT entry: config loading and checks, the dry run on real exported data, and (slow) AReaL's
`SFTTrainer` end to end on CPU with the tiny policy, started as the command line starts it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from examples.tau2.eval import evaluate as tau2_eval
from examples.tau2.sft.data import ExportFilters, build_rows, encode_rows, write_export
from examples.tau2.sft.train import check_config, load_sft_config, main

REPO = Path(__file__).resolve().parents[2]
SFT_YAML = REPO / "examples" / "tau2" / "sft.yaml"


@pytest.fixture(scope="module")
def oracle_data(endpoint_server, tmp_path_factory) -> Path:
    """The oracle's mock trajectories, exported (7 rows)."""
    root = tmp_path_factory.mktemp("sft-entry")
    args = ["--policy-base-url", endpoint_server.url, "--policy-model", "oracle",
            "--output-dir", str(root / "eval"),
            "--user-base-url", endpoint_server.url, "--user-model", "user-scenario", "--domains", "mock",
            "--split", "all", "--trials", "1", "--concurrency", "4"]
    assert tau2_eval.main(args) == 0
    out = root / "oracle.jsonl"
    write_export(build_rows([root / "eval"], ExportFilters()), out)
    return out


def cpu_args(data: Path, *extra: str) -> list[str]:
    return ["--config", str(SFT_YAML), "+configs=sft_cpu", f"train_dataset.path={data}", *extra]


def test_cpu_variant_loads_into_the_sft_schema(oracle_data):
    config, config_file, overrides = load_sft_config(cpu_args(oracle_data))
    assert config_file == SFT_YAML and overrides[0] == "+configs=sft_cpu"
    assert config.on_cpu and config.actor.backend == "fsdp:d1" and config.actor.attn_impl == "sdpa"
    assert config.actor.path == "" and config.tiny_model == {"warmup_steps": 0}
    assert config.train_dataset.path == str(oracle_data) and config.train_dataset.max_length == 4096
    assert check_config(config) == []
    cluster, _, _ = load_sft_config(["--config", str(SFT_YAML), f"train_dataset.path={oracle_data}"])
    assert not cluster.on_cpu and cluster.actor.backend == "archon:d8" and cluster.tiny_model is None
    assert cluster.actor.path == "Qwen/Qwen3-1.7B" and check_config(cluster) == []


def test_dry_run_reports_the_data_as_the_trainer_will_see_it(oracle_data, capsys, tokenizer):
    assert main([*cpu_args(oracle_data), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "backend fsdp:d1 on CPU (CpuSFTTrainer)" in out and "PROBLEM" not in out
    from examples.tau2.sft.data import read_rows

    encoded, _ = encode_rows(tokenizer, read_rows(oracle_data))
    tokens = sum(len(r["input_ids"]) for r in encoded)
    trained = sum(sum(r["loss_mask"]) for r in encoded)
    assert f"7 rows (0 longer than max_length left out), {tokens} tokens of which {trained} trained" in out
    assert "7 step(s) per epoch" in out  # batch_size 1


@pytest.mark.parametrize("extra,problem", [
    (["actor.mb_spec.max_tokens_per_mb=512"], "the longest row of .* more than .*max_tokens_per_mb=512"),
    (["train_dataset.max_length=100"], "every row of .* is longer than max_length=100"),
])
def test_dry_run_finds_data_that_cannot_be_trained(oracle_data, capsys, extra, problem):
    assert main([*cpu_args(oracle_data, *extra), "--dry-run"]) == 1
    assert re.search(f"PROBLEM: {problem}", capsys.readouterr().out)


@pytest.mark.parametrize("extra,problem", [
    (["train_dataset.path=/nonexistent.jsonl"], "train_dataset.path=/nonexistent.jsonl is not a file"),
    (["actor.backend=archon:d1"], "on CPU use fsdp"),
    (["actor.attn_impl=flash_attention_2"], "on CPU use sdpa"),
    (["actor.backend=sglang:d1"], "SFTTrainer trains with fsdp, archon, megatron"),
    (["tiny_model=null"], "actor.path must name the model"),
    (["++tiny_model.colour=red"], "tiny_model: unknown tiny model recipe keys: colour"),
])
def test_bad_configs_are_refused_before_anything_starts(oracle_data, capsys, extra, problem):
    assert main(cpu_args(oracle_data, *extra)) == 1
    err = capsys.readouterr().err
    assert problem in err and "nothing was started" in err


def test_unusable_command_lines_exit_2(capsys, tmp_path):
    assert main([]) == 2 and "usage:" in capsys.readouterr().err
    assert main(["--config", str(tmp_path / "none.yaml")]) == 2
    assert main(["--config", str(SFT_YAML)]) == 2
    assert "missing mandatory value: path" in capsys.readouterr().err


@pytest.mark.memory(gib=5.5)  # the SFT trainer and its worker (5.2 GiB measured)
@pytest.mark.slow
def test_sft_on_cpu_lowers_the_loss_of_exactly_the_trained_tokens(oracle_data, tmp_path):
    """The command line, in a fresh interpreter: AReaL's SFTTrainer (single controller, one FSDP worker)
    trains the random tiny policy on 2 rows for 3 steps; the loss falls, AReaL counts exactly our
    trained tokens, each row is its own micro-batch, and the saved checkpoint differs from the start."""
    rows = oracle_data.read_text().splitlines()[:2]
    data = tmp_path / "two.jsonl"
    data.write_text("\n".join(rows) + "\n")
    root = tmp_path / "fileroot"
    cmd = [sys.executable, "-m", "examples.tau2.sft.train",
           *cpu_args(data, "total_train_epochs=3", "train_dataset.batch_size=2", "actor.optimizer.lr=3e-3",
                     "actor.optimizer.lr_scheduler_type=constant", f"cluster.fileroot={root}",
                     f"cluster.name_resolve.nfs_record_root={root}/nr", "trial_name=test")]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{\n"):])
    loss = summary["loss"]
    assert len(loss) == 3 and loss[0] > loss[1] > loss[2] and loss[0] > 11.0
    stats = [json.loads(line) for line in
             (Path(summary["log_dir"]) / "stats.jsonl").read_text().splitlines()]
    from transformers import AutoTokenizer

    from examples.tau2.sft.data import read_rows

    encoded, _ = encode_rows(AutoTokenizer.from_pretrained(summary["model"]), read_rows(data))
    for s in stats:
        assert s["sft/n_valid_tokens"] == sum(sum(r["loss_mask"]) for r in encoded)
        assert s["sft/n_tokens"] == sum(len(r["input_ids"]) for r in encoded)
        assert s["sft/num_micro_batches"] == 2 and s["sft/n_seqs"] == 2
    import torch
    from safetensors.torch import load_file

    def weights(folder: str) -> dict[str, torch.Tensor]:
        return {k: v for f in Path(folder).glob("*.safetensors") for k, v in load_file(f).items()}

    before, after = weights(summary["model"]), weights(summary["checkpoint"])
    assert before.keys() == after.keys() and before
    assert all(not torch.equal(before[k], after[k]) for k in before)
