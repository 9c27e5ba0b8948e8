"""The CPU substitutes behind PPOTrainer: the vLLM server command, its environment, the stats file."""

from __future__ import annotations

import json
import logging
import os
import sys

from areal.api.cli_args import vLLMConfig

from examples.tau2.cpu import trainer as cpu_trainer
from examples.tau2.cpu.trainer import (
    LAUNCHER_MODULE,
    REPO,
    JsonlStatsLogger,
    vllm_server_command,
    vllm_server_env,
)


def test_server_command_is_areals_run_by_the_vllm_venv_through_the_launcher(vllm_env):
    cfg = vLLMConfig(model="/m", dtype="float32", enforce_eager=True, block_size=32,
                     worker_extension_cls="examples.tau2.cpu.vllm_cpu_worker.CpuReloadWorkerExtension")
    args = vLLMConfig.build_args(cfg, 1, 1, host="127.0.0.1", port=1234)
    cmd = vllm_server_command(args)
    areal_cmd = vLLMConfig.build_cmd_from_args(args)
    assert cmd[:3] == [sys.executable, "-m", LAUNCHER_MODULE]
    assert cmd[3:] == areal_cmd[3:]  # every flag AReaL builds, unchanged
    assert "--worker-extension-cls" in cmd and "--block-size" in cmd


def test_server_env_keeps_the_main_venv_off_the_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", f"{REPO}:/somewhere/.venv/lib/python3.11/site-packages")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    env = vllm_server_env()
    assert env["PYTHONPATH"] == str(REPO)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert os.environ["PYTHONPATH"].endswith("site-packages")  # the caller's environment is untouched


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_stats_logger_appends_each_step_as_a_json_line(tmp_path):
    from examples.tau2.cpu.smoke_config import load_smoke_config

    config, _, _ = load_smoke_config([f"cluster.fileroot={tmp_path}"])

    class Spec:
        total_train_epochs, steps_per_epoch, total_train_steps = 1, 2, 2

    stats_logger = JsonlStatsLogger(config, Spec())  # opens wandb and swanlab runs (disabled): closed below
    collect = _Collect()
    cpu_trainer.logger.addHandler(collect)
    cpu_trainer.logger.setLevel(logging.INFO)
    try:
        stats_logger.commit(0, 0, 0, {"a/avg": 1.5, "a__count": 3, "ppo_actor/n_seqs": 9})
        cpu_trainer.logger.removeHandler(collect)
        stats_logger.commit(0, 1, 1, [{"a/avg": 2.0}])
    finally:
        cpu_trainer.logger.removeHandler(collect)
        stats_logger.close()
    rows = [json.loads(line) for line in stats_logger.jsonl_path.read_text().splitlines()]
    assert collect.lines == ["step 1 done: rows 9"]
    assert rows == [{"epoch": 0, "step": 0, "global_step": 0, "a/avg": 1.5, "ppo_actor/n_seqs": 9.0},
                    {"epoch": 0, "step": 1, "global_step": 1, "a/avg": 2.0}]
    assert stats_logger.jsonl_path.name == cpu_trainer.STATS_FILE
    assert str(stats_logger.jsonl_path).startswith(str(tmp_path))
