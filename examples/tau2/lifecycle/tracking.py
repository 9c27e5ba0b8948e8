"""Experiment tracking: AReaL's `stats_logger` (console, TensorBoard, W&B, SwanLab, Trackio) as configured.

AReaL 1.0.4's `StatsLogger` runs in the controller (this process) and, at every step, writes the step's
stats (`rollout/tau2/*`, `curriculum/*`, AReaL's own) to each enabled tracker:

    stats_logger.tensorboard.path   a directory: TensorBoard event files (tensorboardX)
    stats_logger.wandb.mode         online | offline | disabled; run files in
                                    <fileroot>/logs/<user>/<experiment>/<trial>/wandb
    stats_logger.swanlab.mode, stats_logger.trackio.mode

One trap: for any W&B mode but `disabled` AReaL calls `wandb.login()`, which raises "No API key
configured" without a key even in offline mode unless WANDB_MODE=offline is in the environment.
`apply_tracking_env` sets it (when unset) for `mode: offline`; `check_tracking` reports a WANDB_MODE that
contradicts the config.
"""

from __future__ import annotations

import getpass
import logging
import os
from typing import Any

logger = logging.getLogger("tau2_areal.tracking")

WANDB_MODE_ENV = "WANDB_MODE"


def wandb_dir(config: Any) -> str:
    """Where W&B writes its run directories (AReaL passes its log directory as `dir`)."""
    sl = config.stats_logger
    return os.path.join(sl.fileroot, "logs", getpass.getuser(), sl.experiment_name, sl.trial_name, "wandb")


def apply_tracking_env(config: Any, environ: dict[str, str] | None = None) -> None:
    """Set WANDB_MODE=offline for `stats_logger.wandb.mode: offline` unless the user set WANDB_MODE."""
    env = os.environ if environ is None else environ
    if config.stats_logger.wandb.mode == "offline" and WANDB_MODE_ENV not in env:
        env[WANDB_MODE_ENV] = "offline"
        logger.info("stats_logger.wandb.mode=offline: set %s=offline for wandb.login()", WANDB_MODE_ENV)


def check_tracking(config: Any, environ: dict[str, str] | None = None) -> list[str]:
    """Pre-flight checks of `stats_logger`, one sentence each."""
    env = os.environ if environ is None else environ
    errors = []
    mode = config.stats_logger.wandb.mode
    given = env.get(WANDB_MODE_ENV)
    if mode != "disabled" and given is not None and given != mode:
        errors.append(f"stats_logger.wandb.mode={mode} but {WANDB_MODE_ENV}={given} in the environment; "
                      f"unset {WANDB_MODE_ENV} or make them agree")
    path = config.stats_logger.tensorboard.path
    if path is not None and not str(path).strip():
        errors.append("stats_logger.tensorboard.path is empty; give a directory or null (no TensorBoard)")
    return errors


def describe_tracking(config: Any) -> str:
    """One line for the `--dry-run` plan."""
    sl = config.stats_logger
    parts = ["console"]
    if sl.tensorboard.path:
        parts.append(f"TensorBoard in {sl.tensorboard.path}")
    if sl.wandb.mode != "disabled":
        project = sl.wandb.project or sl.experiment_name
        parts.append(f"W&B {sl.wandb.mode} (project {project}, files in {wandb_dir(config)})")
    for name in ("swanlab", "trackio"):
        mode = getattr(sl, name).mode
        if mode != "disabled":
            parts.append(f"{name} {mode}")
    return ", ".join(parts)
