"""Train a tau2-bench agent with AReaL 1.0.4's `PPOTrainer` (single controller: local or SLURM).

    python examples/tau2/tau2_train.py --config examples/tau2/config.yaml [+configs=VARIANT] \
        [key=value ...] [--dry-run]

One pre-flight pass checks the whole run first (`lifecycle/validate.py`; `--dry-run` prints its plan).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from examples.tau2.runtime.process import exit_after, exit_on_sigterm, setup_runtime, stop_descendants
from examples.tau2.settings import addons
from examples.tau2.settings.config import (
    DERIVED_EPISODE_FIELDS,
    ConfigError,
    LoadedConfig,
    Tau2PPOConfig,
    load_config,
    pop_dry_run,
)
from examples.tau2.tau2_utils import RewardBaseline, Tau2EnvConfig

logger = logging.getLogger("tau2_areal.train")

WORKFLOW = "examples.tau2.tau2_agent.Tau2AgentWorkflow"


def main(argv: list[str] | None = None) -> int:
    """Load and check the config; print the plan (`--dry-run`) or train. Exit status 0/1/2."""
    from examples.tau2.lifecycle.reaper import cancel_jobs, own_temp_dir, share_temp_dir

    with own_temp_dir():  # the run's temporary files, removed at the end (lifecycle/reaper.py)
        loaded, status = preflight(list(sys.argv[1:] if argv is None else argv))
        if loaded is None:
            return status
        if loaded.config.scheduler.type == "local":
            share_temp_dir()  # the workers run on this machine
        exit_on_sigterm()
        try:
            run(loaded)
        finally:  # AReaL stops its workers on a normal exit; this covers a run that failed half-way
            stop_descendants(logger)
            cancel_jobs(loaded.config, logger)
    return 0


def preflight(argv: list[str], more: Sequence[str] = ()) -> tuple[LoadedConfig | None, int]:
    """Everything `main` checks before it starts anything (`lifecycle.validate.survey`); `--dry-run` prints
    the plan, a run the problems (with `more`: e.g. `tau2_rl.sh slurm --submit`'s own). Returns (the
    config, 0) when the run may start; else (None, the exit status: 0/1 after a dry run, 1 problems, 2
    config or domains)."""
    dry_run, argv = pop_dry_run(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        loaded = load_config(argv)
    except ConfigError as e:
        print(f"tau2_train: {e}", file=sys.stderr)
        return None, 2
    setup_runtime(loaded.config.econfig.tau2_log_level)  # before tau2 is imported: it logs at import
    from examples.tau2.lifecycle.validate import format_plan, survey

    found = survey(loaded)
    for problem in found.domain_problems:
        print(f"tau2_train: {problem}", file=sys.stderr)
    if found.domain_problems:
        return None, 2
    if dry_run:
        print(format_plan(found, found.problems))
        return None, 1 if found.problems else 0
    config = loaded.config
    errors = [*found.problems, *[why for a in addons.enabled(config) if (why := a.unavailable(config))],
              *more]
    report = format_plan(found, errors)
    if errors:
        print(report, file=sys.stderr)
        print(f"tau2_train: {len(errors)} problem(s); nothing was started", file=sys.stderr)
        return None, 1
    logger.info("%s", report)
    return loaded, 0


def run(loaded: LoadedConfig) -> None:
    """Train: `Tau2PPOTrainer` (`training/trainer.py`) starts the servers, trainer ranks and proxies, and
    stops them on exit; a rerun of a killed run resumes from its saved state (`lifecycle/recover.py`)."""
    from examples.tau2.lifecycle.reaper import reaper_running, registered
    from examples.tau2.lifecycle.recover import prepare_resume
    from examples.tau2.lifecycle.validate import apply_tracking_env
    from examples.tau2.training.trainer import Tau2PPOTrainer

    config, train, valid = prepare(loaded)
    apply_tracking_env(config)
    # The reaper stops AReaL's workers if this process is killed (they would outlive it).
    with registered(config), reaper_running(config):
        prepare_resume(config)
        call = train_call(config, with_validation=valid is not None)
        with Tau2PPOTrainer(config, train_dataset=train, valid_dataset=valid) as trainer:
            trainer.train(**call)


def prepare(loaded: LoadedConfig):
    """Everything before PPOTrainer: the shared directories, AReaL's own config loading, the datasets.
    Returns (config, training dataset, validation dataset or None)."""
    from areal.api.cli_args import load_expr_config

    from examples.tau2.lifecycle.validate import shared_paths
    from examples.tau2.settings import dataset as tau2_dataset

    for name, path in shared_paths(loaded.config).items():
        Path(path).mkdir(parents=True, exist_ok=True)
        logger.info("%s: %s", name, path)
    # load_expr_config composes the same argv to the same config, then sets up name resolution and
    # saves config.yaml in the run's log directory.
    config, _ = load_expr_config(loaded.argv, type(loaded.config))
    econfig = config.econfig
    train = tau2_dataset.to_dataset(tau2_dataset.train_rows(econfig, config.seed))
    valid = None
    if config.valid_dataset is not None and econfig.valid_split:
        valid = tau2_dataset.to_dataset(tau2_dataset.valid_rows(econfig))
    return config, train, valid


def train_call(config: Tau2PPOConfig, with_validation: bool) -> dict[str, Any]:
    """The arguments of `PPOTrainer.train`: import strings, so that the workers can rebuild them."""
    train_kwargs, eval_kwargs = workflow_kwargs(config)
    workflow = WORKFLOW
    for addon in addons.enabled(config):  # e.g. the curriculum's: the same episodes, recording outcomes
        workflow, train_kwargs = addon.train_workflow(config, workflow, train_kwargs)
    return {"workflow": workflow, "workflow_kwargs": train_kwargs,
            "eval_workflow": WORKFLOW if with_validation else None,
            "eval_workflow_kwargs": eval_kwargs if with_validation else None}


def workflow_kwargs(config: Tau2PPOConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Kwargs of the training and of the evaluation workflow. Validation samples as `eval_gconfig` says:
    each derived episode setting takes its validation source (`DERIVED_EPISODE_FIELDS`)."""
    episode = config.econfig.episode_config()
    derived = {name: source.value(config, validation=True) for name, source in DERIVED_EPISODE_FIELDS.items()}
    evaluation: Tau2EnvConfig = dataclasses.replace(
        episode, **derived,
        dump_dir=os.path.join(episode.dump_dir, "eval") if episode.dump_dir else "",
        # validation reports raw rewards and drops no uniform group
        reward_baseline=RewardBaseline.none, drop_uniform_groups=False,
    )
    return episode.to_kwargs(), evaluation.to_kwargs()


if __name__ == "__main__":
    # Leave with main's status at once: AReaL can leave non-daemon threads behind (e.g. when its start-up
    # fails), which would keep this process alive after the run.
    exit_after(main)
