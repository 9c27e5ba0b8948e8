"""`SFTTrainer` on a machine without a GPU: AReaL 1.0.4's own SFT loop, with one CPU-capable part.

AReaL's `SFTTrainer` picks its engine class by name in `_create_actor` (private, overridden here; a row of
`training/trainer.py`'s table). On CPU the FSDP engine runs the model with `sdpa` attention, which
has no varlen kernel, so every sequence packed after the first into one micro-batch would attend to
its neighbours (the trap `cpu.trainer.OneSequencePerMicroBatchActor` documents for PPO, where it was
measured). `OneSequencePerMicroBatchLMEngine` asks AReaL's own splitter for one micro-batch per
sequence instead; everything else (data loading, the packed SFT loss on `loss_mask`, optimizer,
saver, stats) is AReaL's. Each step's stats also go to `stats.jsonl` in AReaL's log folder.
"""

from __future__ import annotations

import logging

from areal.api.cli_args import TrainEngineConfig
from areal.engine import FSDPLMEngine
from areal.trainer.sft_trainer import SFTTrainer
from areal.utils.environ import is_single_controller

from examples.tau2.compat import require_areal
from examples.tau2.cpu.trainer import JsonlStatsLogger, OneSequencePerMicroBatch

logger = logging.getLogger("tau2_areal.sft_trainer")

STATS_FILE = "stats.jsonl"
LOSS_KEY = "sft/loss/avg"
"""AReaL's per-step mean token loss (negative log-likelihood of the trained tokens)."""
STEP_SUMMARY = {"loss": LOSS_KEY, "ppl": "sft/ppl/avg", "tokens": "sft/n_valid_tokens",
                "grad_norm": "sft/grad_norm"}


class OneSequencePerMicroBatchLMEngine(OneSequencePerMicroBatch, FSDPLMEngine):
    """AReaL's FSDP SFT engine with every micro-batch holding exactly one sequence."""


class SftStatsLogger(JsonlStatsLogger):
    """The PPO runs' `stats.jsonl` logger, with the SFT step's one-line summary."""

    summary_keys = STEP_SUMMARY
    step_label = "SFT step"
    log = logger


class CpuSFTTrainer(SFTTrainer):
    """`SFTTrainer` with the FSDP engine above (single controller or SPMD)."""

    def __init__(self, config, train_dataset, valid_dataset=None):
        require_areal("CpuSFTTrainer (examples/tau2/cpu/sft_trainer.py)")
        super().__init__(config, train_dataset=train_dataset, valid_dataset=valid_dataset)
        # Recovery is not used on CPU (it would have loaded the logger's state above).
        self.stats_logger = SftStatsLogger(config, self.stats_logger.ft_spec)
        self.stats_logger.jsonl_path.unlink(missing_ok=True)  # a previous run of the same trial

    def _create_actor(self, actor_config: TrainEngineConfig):
        if self.actor_alloc.backend != "fsdp":
            return super()._create_actor(actor_config)
        cls = OneSequencePerMicroBatchLMEngine
        actor = (cls.as_controller(actor_config, self.scheduler) if is_single_controller()
                 else cls(config=actor_config))
        actor.create_process_group(parallel_strategy=self.actor_alloc.parallel)
        return actor
