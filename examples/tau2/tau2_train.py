"""Train a tau2-bench agent with AReaL 1.0.4's `PPOTrainer` (single controller: local or SLURM).

    python examples/tau2/tau2_train.py --config examples/tau2/config.yaml [+configs=VARIANT] \
        [key=value ...] [--dry-run]

This process is AReaL's controller: it validates the whole run first (`tau2_validate`), then lets
`PPOTrainer` start SGLang servers, trainer ranks and AReaL's OpenAI-compatible proxy, through which
`Tau2AgentWorkflow` plays each episode. `--dry-run` prints the resolved plan and the problems found,
and starts nothing. `examples/tau2/tau2_rl.sh` wraps the usual invocations.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal.infra.utils.http import DEFAULT_ADMIN_API_KEY
from datasets import Dataset

from examples.tau2 import tau2_dataset
from examples.tau2.tau2_config import ConfigError, LoadedConfig, Tau2PPOConfig, load_config
from examples.tau2.tau2_utils import Tau2EnvConfig
from examples.tau2.tau2_validate import (
    EngineUse,
    engine_uses,
    read_model_shape,
    shared_paths,
    validate,
)

logger = logging.getLogger("tau2_areal.train")

WORKFLOW = "examples.tau2.tau2_agent.Tau2AgentWorkflow"
GROUP_FILTER = "examples.tau2.tau2_filter.drop_uniform_groups"
DRY_RUN_FLAG = "--dry-run"


@dataclass(frozen=True)
class DataPlan:
    train_rows: dict[str, int]
    """Domain -> training rows per epoch (a mix repeats tasks)."""
    train_tasks: dict[str, int]
    valid_rows: dict[str, int]


@dataclass(frozen=True)
class Plan:
    """What the run would start and train on, as `--dry-run` prints it."""

    config_file: Path
    allocation: str
    engines: list[EngineUse]
    gpus_available: int
    scheduler: str
    n_nodes: int
    model: str
    user_simulator: str
    proxy: str
    data: DataPlan | None
    batch_tasks: int
    n_samples: int
    epochs: int
    group_filter: str


def _describe_engine(u: EngineUse) -> str:
    p = u.alloc.parallel
    degrees = (("dp", p.dp_size), ("tp", p.tp_size), ("pp", p.pp_size), ("cp", p.cp_size), ("ep", p.ep_size))
    dims = [f"{name}{size}" for name, size in degrees if size > 1 or name == "dp"]
    if u.role == "rollout":
        return (f"{u.backend:<34} {p.dp_size} {u.alloc.backend} server(s) x {u.gpus_per_instance} GPU(s)"
                f" = {u.gpus} GPUs")
    if u.gpus == 0:
        return f"{u.backend:<34} {' '.join(dims)}, colocated (no GPUs of its own)"
    return f"{u.backend:<34} {' '.join(dims)} = {u.gpus} GPUs"


def _describe_model(config: Tau2PPOConfig) -> str:
    path = config.actor.path
    try:
        shape = read_model_shape(path)
    except ValueError as e:
        return f"{path}: {e}"
    if shape is None:
        return (f"{path}: shape not checked (not a local directory; the workers resolve it) -- give a "
                "local checkpoint to check tp/pp against its heads and layers")
    return (f"{path}: {shape.model_type}, {shape.num_layers} layers, {shape.num_heads} heads, "
            f"{shape.num_kv_heads} kv heads{', tied embeddings' if shape.tied_embeddings else ''} (checked)")


def _data_plan(config: Tau2PPOConfig) -> DataPlan | None:
    econfig = config.econfig
    if econfig.choice_errors():
        return None
    try:
        train = tau2_dataset.train_rows(econfig, config.seed)
        valid = tau2_dataset.valid_rows(econfig) if config.valid_dataset is not None else []
    except (ValueError, KeyError):
        return None  # validate() names the missing split
    tasks = {d: len({r["task_id"] for r in train if r["domain"] == d}) for d in econfig.domain_weights()}
    return DataPlan(tau2_dataset.rows_per_domain(train), tasks, tau2_dataset.rows_per_domain(valid))


def build_plan(loaded: LoadedConfig) -> Plan:
    config = loaded.config
    econfig, agent = config.econfig, config.rollout.agent
    allocation = ""
    if loaded.backends is not None:
        allocation = (f"allocation_mode={loaded.allocation_mode} -> "
                      f"rollout.backend={loaded.backends.rollout}, actor.backend={loaded.backends.train}")
    try:
        engines = engine_uses(config)
    except ValueError:
        engines = []
    user = ("solo mode (no user simulator)" if econfig.solo_mode
            else f"{econfig.user_base_url} model {econfig.user_model}")
    key = "AReaL's public default" if agent.admin_api_key == DEFAULT_ADMIN_API_KEY else "set"
    proxy = (f"mode {agent.mode}, tool parser {agent.tool_call_parser}, reasoning parser "
             f"{agent.reasoning_parser}, export {agent.export_style}, turn_discount {agent.turn_discount}, "
             f"admin key {key}")
    group_filter = ("drop groups whose rows all carry one reward" if econfig.drop_uniform_groups
                    else "off (every group trains)")
    return Plan(
        config_file=loaded.config_file, allocation=allocation, engines=engines,
        gpus_available=config.cluster.n_nodes * config.cluster.n_gpus_per_node,
        scheduler=str(config.scheduler.type), n_nodes=config.cluster.n_nodes,
        model=_describe_model(config), user_simulator=user, proxy=proxy, data=_data_plan(config),
        batch_tasks=config.train_dataset.batch_size, n_samples=config.gconfig.n_samples,
        epochs=config.total_train_epochs, group_filter=group_filter,
    )


def format_plan(plan: Plan, errors: list[str]) -> str:
    lines = [f"tau2 training plan ({plan.config_file})"]
    row = "  {:<16}{}".format
    if plan.allocation:
        lines.append(row("allocation", plan.allocation))
    lines.append(row("scheduler", f"{plan.scheduler}, {plan.n_nodes} node(s), {plan.gpus_available} GPUs"))
    for u in plan.engines:
        lines.append(row(u.role, _describe_engine(u)))
    needed = sum(u.gpus for u in plan.engines)
    lines.append(row("GPUs", f"{needed} of {plan.gpus_available} used"))
    lines.append(row("model", plan.model))
    lines.append(row("user simulator", plan.user_simulator))
    lines.append(row("proxy", plan.proxy))
    if plan.data is None:
        lines.append(row("data", "unavailable (see problems)"))
    else:
        for domain, rows in plan.data.train_rows.items():
            valid = plan.data.valid_rows.get(domain, 0)
            tasks = plan.data.train_tasks[domain]
            lines.append(row("data", f"{domain}: {rows} training rows ({tasks} tasks), "
                                     f"{valid} validation rows"))
        total = sum(plan.data.train_rows.values())
        steps = total // plan.batch_tasks if plan.batch_tasks else 0
        lines.append(row("steps", f"{steps} per epoch x {plan.epochs} epochs = {steps * plan.epochs}"))
    lines.append(row("batch", f"{plan.batch_tasks} tasks x {plan.n_samples} samples = "
                              f"{plan.batch_tasks * plan.n_samples} episodes per step"))
    lines.append(row("group filter", plan.group_filter))
    if errors:
        lines.append(f"problems ({len(errors)}):")
        lines += [f"  - {e}" for e in errors]
    else:
        lines.append("no problems found")
    return "\n".join(lines)


def workflow_kwargs(config: Tau2PPOConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Kwargs of the training and of the evaluation workflow (eval: eval_gconfig's sampling)."""
    episode = config.econfig.episode_config()
    eval_gconfig = config.eval_gconfig or config.gconfig
    evaluation: Tau2EnvConfig = dataclasses.replace(
        episode, temperature=eval_gconfig.temperature, top_p=eval_gconfig.top_p,
        dump_dir=os.path.join(episode.dump_dir, "eval") if episode.dump_dir else "",
    )
    return episode.to_kwargs(), evaluation.to_kwargs()


def train_call(config: Tau2PPOConfig, with_validation: bool) -> dict[str, Any]:
    """The arguments of `PPOTrainer.train`: import strings, so that the workers can rebuild them."""
    train_kwargs, eval_kwargs = workflow_kwargs(config)
    return {
        "workflow": WORKFLOW,
        "workflow_kwargs": train_kwargs,
        "eval_workflow": WORKFLOW if with_validation else None,
        "eval_workflow_kwargs": eval_kwargs if with_validation else None,
        "dynamic_filter_fn": GROUP_FILTER if config.econfig.drop_uniform_groups else None,
    }


def prepare(loaded: LoadedConfig) -> tuple[Tau2PPOConfig, Dataset, Dataset | None]:
    """Everything before PPOTrainer: the shared directories, AReaL's own config loading, the datasets."""
    from areal.api.cli_args import load_expr_config

    for name, path in shared_paths(loaded.config).items():
        Path(path).mkdir(parents=True, exist_ok=True)
        logger.info("%s: %s", name, path)
    # load_expr_config composes the same argv to the same config, then sets up name resolution and
    # saves config.yaml in the run's log directory.
    config, _ = load_expr_config(loaded.argv, Tau2PPOConfig)
    econfig = config.econfig
    train = tau2_dataset.to_dataset(tau2_dataset.train_rows(econfig, config.seed))
    valid = None
    if config.valid_dataset is not None and econfig.valid_split:
        valid = tau2_dataset.to_dataset(tau2_dataset.valid_rows(econfig))
    return config, train, valid


def run(loaded: LoadedConfig) -> None:
    """Train: PPOTrainer starts the servers, trainer ranks and proxies, and stops them on exit."""
    from areal import PPOTrainer

    config, train, valid = prepare(loaded)
    with PPOTrainer(config, train_dataset=train, valid_dataset=valid) as trainer:
        trainer.train(**train_call(config, with_validation=valid is not None))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    dry_run = DRY_RUN_FLAG in argv
    argv = [a for a in argv if a != DRY_RUN_FLAG]
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        loaded = load_config(argv)
    except ConfigError as e:
        print(f"tau2_train: {e}", file=sys.stderr)
        return 2
    errors = validate(loaded.config)
    report = format_plan(build_plan(loaded), errors)
    if dry_run:
        print(report)
        return 1 if errors else 0
    if errors:
        print(report, file=sys.stderr)
        print(f"tau2_train: {len(errors)} problem(s); nothing was started", file=sys.stderr)
        return 1
    logger.info("%s", report)
    run(loaded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
