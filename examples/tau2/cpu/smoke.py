"""The whole RL loop on a CPU in one command: tiny policy, real tau2 episodes, AReaL's PPOTrainer.

    python -m examples.tau2.cpu.smoke [key=value ...]   (= bash examples/tau2/tau2_rl.sh smoke)

The config is config.yaml with the configs/smoke_cpu.yaml variant over it (`smoke_config`).

1. Checks the config (one sentence per problem, before anything starts).
2. Builds or loads the tiny Qwen3 policy (`cpu.tiny_model`, cached) unless `actor.path` is given.
3. Serves the scripted user simulator (`cpu.scripted_endpoint`, model `user-scenario`) at
   `econfig.user_base_url`, so no API key and no second model are needed.
4. Runs AReaL's `PPOTrainer` (as `cpu.trainer.CpuPPOTrainer`): `Tau2AgentWorkflow` episodes through
   AReaL's proxy and a vLLM CPU server, archon training on CPU, disk weight updates into vLLM; asynchronous
   as config.yaml trains (`rollout.max_head_offpolicyness` 2: episodes run on while the trainer trains and
   the weights are swapped under them; 0 is the synchronous form).
5. Checks the result: at least `smoke.min_optimizer_steps` steps trained, the weights changed, every prompt
   equal to the vLLM server's rendering, and what the run recorded (`cpu.async_checks`): every trained
   token of the weights its version label names, the trainer agreeing with the rollout, no token staler than
   allowed, the rows exactly the turns the episodes took, no request failed for a swap, and (asynchronous)
   episodes across swaps, completions interrupted and resumed, batches of two versions. Writes a PNG of the
   curves and `smoke_summary.json` next to AReaL's logs; exits 1 if a check fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import secrets
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from examples.tau2.cpu.async_checks import AsyncReport, check_run, format_report
from examples.tau2.cpu.smoke_config import (
    SmokeConfigError,
    Tau2SmokeConfig,
    check_config,
    finished_state,
    load_smoke_config,
    run_domain_problems,
    user_endpoint_port,
)
from examples.tau2.cpu.tiny_model import TinyModelRecipe, ensure_tiny_model, latest_saved_model, load_info
from examples.tau2.lifecycle.reaper import own_temp_dir, share_temp_dir
from examples.tau2.runtime.charts import new_figure, save_png
from examples.tau2.runtime.console import console_logging
from examples.tau2.runtime.process import (
    exit_after,
    exit_on_sigterm,
    setup_runtime,
    stop_descendants,
)
from examples.tau2.slurm.queue import unreachable

logger = logging.getLogger("tau2_areal.smoke")

PARITY_REQUESTS = "tau2/parity/requests"
PARITY_DIFFERING = "tau2/parity/differing"
"""Per step (`cpu.parity.RecordedParity`): prompts compared with the vLLM server's, and those that
differ."""
PARITY_FIRST_FILE = "first_difference.txt"
ADVANTAGE_MIN, ADVANTAGE_MAX = "ppo_actor/advantages/min", "ppo_actor/advantages/max"
SUMMARY_FILE = "smoke_summary.json"
RECORDS_DIR = "records"
"""Under the run's log folder: what the asynchronous checks read (`cpu/async_checks.py`)."""
PLOT_FILE = "smoke_curves.png"


@dataclass
class SmokeResult:
    """What the run showed; `problems` empty means it passed."""

    steps: int
    training: AsyncReport
    """What the run recorded, checked (`cpu.async_checks`): versions, asynchrony, staleness, rows."""
    parity_requests: list[int]
    """Per step: policy requests whose proxy prompt was compared with the vLLM server's own."""
    parity_differing: list[int]
    """Per step: of those, the ones whose token ids differ (must be 0)."""
    rows_trained: list[int]
    """Per step: training rows (one per policy completion, `export_style: individual`)."""
    tokens_trained: list[int]
    """Per step: generated tokens the loss is computed on."""
    tokens_in_rows: list[int]
    """Per step: tokens of the training rows (each row holds its whole conversation so far)."""
    tokens_computed: list[int]
    """Per step: tokens the trainer ran through the model (with prefix sharing: the packed trees)."""
    trainer: str
    reward: list[float]
    weights_changed: int
    weights_total: int
    weight_rel_change: float
    """||w_final - w_initial|| / ||w_initial|| over all tensors."""
    advantage_max_abs: list[float]
    """Per step: the largest |advantage| trained on; 0 when every group's episodes had one reward, so the
    policy gradient was 0 (with weight decay 0, the weights then must not change)."""
    checkpoint: str
    episode_dumps: int
    timings_s: dict[str, float]
    paths: dict[str, str]
    problems: list[str] = field(default_factory=list)
    placement: list[str] = field(default_factory=list)
    view_command: str = ""
    """The command that builds the trajectory browser over the run's dumps (docs/view.md)."""
    """Under `scheduler.type=slurm`: which SLURM job ran which role on which node."""

    @property
    def ok(self) -> bool:
        return not self.problems


# ---------------------------------------------------------------------------------------------
# Results


def read_stats(path: Path) -> list[dict[str, float]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _series(stats: list[dict[str, float]], *keys: str) -> list[float]:
    """Per step, the first of `keys` present (NaN when none is)."""
    return [next((float(s[k]) for k in keys if k in s), math.nan) for s in stats]


def compare_weights(initial_dir: Path, final_dir: Path) -> tuple[int, int, float]:
    """(tensors changed, tensors compared, relative L2 change) between two safetensors checkpoints."""
    import torch
    from safetensors.torch import load_file

    def load(d: Path) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for f in sorted(d.glob("*.safetensors")):
            out.update(load_file(f))
        return out

    before, after = load(initial_dir), load(final_dir)
    common = sorted(set(before) & set(after))
    if not common:
        raise ValueError(f"no common tensors between {initial_dir} and {final_dir}")
    changed = sum(not torch.equal(before[k].float(), after[k].float()) for k in common)
    diff = math.sqrt(sum(float((after[k].float() - before[k].float()).pow(2).sum()) for k in common))
    norm = math.sqrt(sum(float(before[k].float().pow(2).sum()) for k in common))
    return changed, len(common), diff / max(norm, 1e-12)



def plot_curves(stats: list[dict[str, float]], training: AsyncReport, path: Path, tolerance: float,
                domain: str = "mock") -> None:
    """Reward, loss, entropy and the trainer's agreement with the rollout (with its band) per step."""
    steps = [int(s["global_step"]) + 1 for s in stats]
    gaps = {s.version + 1: s.trainer_max_gap for s in training.steps}
    panels = [
        ("reward (mean over rows)", _series(stats, "ppo_actor/task_reward/avg", "rollout/reward")),
        ("actor loss", _series(stats, "ppo_actor/update/actor_loss/avg")),
        ("entropy", _series(stats, "ppo_actor/update/entropy/avg")),
        ("max |trainer - rollout logprob|", [gaps.get(step, math.nan) for step in steps]),
    ]
    fig, axes = new_figure(4 * len(panels), 3.2, panels=len(panels), dpi=100)
    for ax, (title, values) in zip(axes, panels, strict=True):
        ax.plot(steps, values, marker="o")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_xticks(steps)
        ax.grid(alpha=0.3)
    gap_ax = axes[-1]
    gap_ax.set_yscale("log")
    gap_ax.axhspan(1e-9, -math.log1p(-tolerance), color="tab:green", alpha=0.15, label="pass band")
    gap_ax.legend(loc="upper right")
    fig.suptitle(f"tau2 smoke run on CPU (tiny Qwen3, {domain} domain)")
    save_png(fig, path)


def evaluate_run(config: Tau2SmokeConfig, stats: list[dict[str, float]], initial_model: Path,
                 timings: dict[str, float], paths: dict[str, str], training: AsyncReport) -> SmokeResult:
    checkpoint = latest_saved_model(config.saver)
    changed, total, rel = (0, 0, 0.0)
    problems = []
    advantages = [max(abs(lo), abs(hi)) for lo, hi in zip(_series(stats, ADVANTAGE_MIN),
                                                          _series(stats, ADVANTAGE_MAX), strict=True)]
    signal = [i + 1 for i, a in enumerate(advantages) if a != 0.0]  # nan (unknown) counts as signal
    if checkpoint is None:
        problems.append("no checkpoint was saved")
    else:
        changed, total, rel = compare_weights(initial_model, checkpoint)
        if changed == 0 and signal:
            problems.append(f"the trained weights equal the initial weights, though step(s) {signal} "
                            "trained on nonzero advantages")
        if changed and not signal and config.actor.optimizer.weight_decay == 0:
            problems.append("the weights changed though every advantage was 0 (every group's episodes had "
                            "one reward) and weight decay is 0: something other than the policy gradient "
                            "moved them")
    if len(stats) < config.smoke.min_optimizer_steps:
        problems.append(f"{len(stats)} optimizer steps ran, fewer than {config.smoke.min_optimizer_steps}")
    problems += training.problems
    parity_requests = [int(x) if not math.isnan(x) else 0 for x in _series(stats, PARITY_REQUESTS)]
    parity_differing = [int(x) if not math.isnan(x) else 0 for x in _series(stats, PARITY_DIFFERING)]
    if config.smoke.check_parity:
        unchecked = [i + 1 for i, n in enumerate(parity_requests) if n == 0]
        if unchecked:
            problems.append(f"no policy prompt was compared with the vLLM server's at step(s) {unchecked}")
        if any(parity_differing):
            first = Path(paths.get("parity", "")) / PARITY_FIRST_FILE
            problems.append(f"the proxy's prompt differs from the vLLM server's in {sum(parity_differing)} "
                            f"of {sum(parity_requests)} requests"
                            + (f"; first: {first.read_text()}" if first.is_file() else ""))
    from examples.tau2.cpu.trainer import TREE_TOKEN_RATIO

    tree = config.actor.enable_tree_training
    in_rows = [int(x) if not math.isnan(x) else 0 for x in _series(stats, "ppo_actor/n_tokens")]
    tree_ratio = _series(stats, TREE_TOKEN_RATIO)
    if tree and (not tree_ratio or any(math.isnan(x) for x in tree_ratio)):
        problems.append("tree training is on but the trainer reported no packed trees")
    computed = ([n if math.isnan(r) else round(n * r) for n, r in zip(in_rows, tree_ratio, strict=True)]
                if tree and len(tree_ratio) == len(in_rows) else list(in_rows))
    trainer = (f"{config.actor.backend.split(':')[0]}, prefix sharing (tree training) "
               f"{'on' if tree else 'off'}")
    dump_dir = Path(config.econfig.dump_dir) if config.econfig.dump_dir else None
    dumps = len(list(dump_dir.glob("**/*.json"))) if dump_dir and dump_dir.is_dir() else 0
    return SmokeResult(
        steps=len(stats), training=training,
        parity_requests=parity_requests, parity_differing=parity_differing,
        rows_trained=[int(x) if not math.isnan(x) else 0 for x in _series(stats, "ppo_actor/n_seqs")],
        tokens_trained=[int(x) if not math.isnan(x) else 0 for x in
                        _series(stats, "ppo_actor/update/n_valid_tokens")],
        tokens_in_rows=in_rows, tokens_computed=computed, trainer=trainer,
        reward=_series(stats, "ppo_actor/task_reward/avg", "rollout/reward"),
        weights_changed=changed, weights_total=total, weight_rel_change=rel, advantage_max_abs=advantages,
        checkpoint=str(checkpoint or ""), episode_dumps=dumps, timings_s=timings, paths=paths,
        problems=problems,
    )


def format_result(r: SmokeResult, tol: float) -> str:
    lines = ["", "=" * 78, "tau2 CPU smoke run: " + ("PASSED" if r.ok else "FAILED"), "=" * 78]
    lines.append(f"trainer: {r.trainer}")
    facts = {s.version + 1: s for s in r.training.steps}
    lines.append(f"{'step':>4} {'reward':>8} {'rows':>5} {'tokens':>7} {'row tok':>8} {'computed':>8} "
                 f"{'tokens by version':>20} {'resumed':>8} {'trainer |gap|':>13} {'parity':>9}")
    for i in range(r.steps):
        step = facts.get(i + 1)
        versions = ", ".join(f"v{v} {n}" for v, n in sorted(step.versions.items())) if step else "-"
        resumed = step.rows_of_two_versions if step else "-"
        gap = f"{step.trainer_max_gap:.1e}" if step and step.on_policy_tokens else "-"
        lines.append(f"{i + 1:>4} {r.reward[i]:>8.3f} {r.rows_trained[i]:>5} {r.tokens_trained[i]:>7} "
                     f"{r.tokens_in_rows[i]:>8} {r.tokens_computed[i]:>8} {versions:>20} {resumed!s:>8} "
                     f"{gap:>13} {r.parity_requests[i] - r.parity_differing[i]:>4}/{r.parity_requests[i]:<4}")
    lines.append("tokens: generated (the loss's); row tok: in the training rows; computed: run through "
                 "the model (prefix sharing computes each shared prefix once); tokens by version: the "
                 "generated tokens of each policy version")
    lines.append("resumed: rows whose completion a weight swap interrupted; trainer |gap|: max |trainer - "
                 f"rollout logprob| on the tokens of the step's own version, within log(1 + {tol})")
    lines.append("parity: policy prompts whose token ids equal the vLLM server's own rendering of the same "
                 "request (POST /tokenize) / prompts compared")
    lines += format_report(r.training, tol)
    lines.append(f"weights: {r.weights_changed}/{r.weights_total} tensors changed, "
                 f"relative change {r.weight_rel_change:.2e}")
    if r.advantage_max_abs and not any(a != 0.0 for a in r.advantage_max_abs):
        lines.append("no step had a reward signal: every group's episodes had one reward, so the policy "
                     "gradient was 0 and the weights (checked) stayed as they were; more episodes per group "
                     "(gconfig.n_samples) or steps make a mixed group likelier")
    lines.append(f"episode dumps: {r.episode_dumps}")
    if r.view_command:
        lines.append(f"browse them: {r.view_command}")
    lines += [f"slurm: {line}" for line in r.placement]
    lines.append("timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in r.timings_s.items()))
    for name, p in r.paths.items():
        lines.append(f"{name:>12}: {p}")
    lines.append(f"{'checkpoint':>12}: {r.checkpoint}")
    for p in r.problems:
        lines.append(f"PROBLEM: {p}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Run


def forget_finished_run(config: Tau2SmokeConfig) -> None:
    """Remove the trial's saved state if it is that of a finished run (`finished_state`): a smoke run
    always trains. An interrupted save is repaired first, as `prepare_resume` would."""
    from examples.tau2.lifecycle.recover import previous, recover_paths, repair, staged

    paths = recover_paths(config)
    if paths.save_root.is_dir() and (repaired := repair(paths)):
        logger.warning("recover state: %s", repaired)
    if not finished_state(config):
        return
    logger.info("the run saved in %s had finished: starting a new one", paths.save_root)
    for live in paths.swapped:
        for p in (live, staged(live), previous(live)):
            shutil.rmtree(p, ignore_errors=True)


def run(config_file: Path, overrides: list[str], config: Tau2SmokeConfig) -> SmokeResult:
    from areal.api.cli_args import load_expr_config
    from areal.utils.stats_logger import StatsLogger

    from examples.tau2.cpu import trainer as cpu_trainer
    from examples.tau2.cpu.scripted_endpoint import EndpointThread
    from examples.tau2.lifecycle.reaper import reaper_running, registered
    from examples.tau2.lifecycle.recover import prepare_resume
    from examples.tau2.lifecycle.validate import shared_paths
    from examples.tau2.settings import dataset as tau2_dataset
    from examples.tau2.slurm.scheduler import describe_jobs
    from examples.tau2.tau2_train import train_call
    from examples.tau2.training import trainer as tau2_trainer

    console_logging(cpu_trainer.logger, tau2_trainer.logger)
    timings: dict[str, float] = {}
    start, started = time.perf_counter(), time.time()
    model_dir = Path(config.actor.path) if config.actor.path else None
    if model_dir is None:
        logger.info("the tiny policy (cpu/tiny_model.py): built on a recipe's first run, then loaded from "
                    "its cache in about a second")
        recipe = TinyModelRecipe.from_dict(config.smoke.tiny_model)
        model_dir = ensure_tiny_model(recipe, config.smoke.cache_dir or None)
        info = load_info(model_dir)
        logger.info("tiny policy %s: %.1f M parameters, warm-up loss %.2f -> %.2f, greedy exact %.0f%%",
                    model_dir, info.num_parameters / 1e6, info.warmup_first_loss,
                    info.warmup_final_loss, 100 * info.warmup_greedy_exact)
    timings["tiny_model"] = time.perf_counter() - start

    argv = ["--config", str(config_file), *overrides, f"actor.path={model_dir}",
            f"rollout.agent.admin_api_key={secrets.token_hex(16)}"]
    for path in shared_paths(config).values():
        Path(path).mkdir(parents=True, exist_ok=True)
    config, _ = load_expr_config(argv, Tau2SmokeConfig)
    log_dir = Path(StatsLogger.get_log_path(config.stats_logger))
    stats_path = log_dir / cpu_trainer.STATS_FILE
    # A rerun of a killed run resumes (recover.mode auto); a finished one starts over.
    forget_finished_run(config)
    record_dir = log_dir / RECORDS_DIR
    if prepare_resume(config, stats_path) is None:
        stats_path.unlink(missing_ok=True)  # a previous run of the same trial
        shutil.rmtree(record_dir, ignore_errors=True)
    rows = tau2_dataset.train_rows(config.econfig, config.seed)
    port = user_endpoint_port(config.econfig.user_base_url)
    serve = config.smoke.serve_user_simulator
    # The reaper stops AReaL's workers if this process is killed (they would outlive it).
    with registered(config), reaper_running(config), (
            EndpointThread(port=port) if serve else contextlib.nullcontext()):
        logger.info("scripted user simulator (%s) at %s", config.econfig.user_model,
                    config.econfig.user_base_url)
        t = time.perf_counter()
        parity_dir = log_dir / "parity"
        if config.smoke.check_parity:  # the proxy records every prompt it renders; each step compares them
            shutil.rmtree(parity_dir, ignore_errors=True)  # a previous run's, already compared
        with cpu_trainer.CpuPPOTrainer(config, train_dataset=tau2_dataset.to_dataset(rows),
                                       parity_record_dir=str(parity_dir) if config.smoke.check_parity else "",
                                       record_dir=str(record_dir)) as trainer:
            timings["startup"] = time.perf_counter() - t
            placement = describe_jobs(trainer.scheduler)
            for line in placement:
                logger.info("%s", line)
            t = time.perf_counter()
            trainer.train(**train_call(config, with_validation=False))
            timings["train"] = time.perf_counter() - t
            if trainer.parity is not None and trainer.parity.first:
                (parity_dir / PARITY_FIRST_FILE).write_text(trainer.parity.first)
    stats = read_stats(stats_path)
    paths = {"logs": str(log_dir), "stats": str(stats_path), "dumps": config.econfig.dump_dir,
             "plot": str(log_dir / PLOT_FILE), "summary": str(log_dir / SUMMARY_FILE),
             "records": str(record_dir)}
    if config.smoke.check_parity:
        paths["parity"] = str(parity_dir)
    t = time.perf_counter()
    training = check_run(record_dir, model_dir, max_head_offpolicyness=config.rollout.max_head_offpolicyness,
                         temperature=config.actor.temperature, tolerance=config.smoke.logprob_ratio_tolerance,
                         since=started)
    timings["checks"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - start
    if stats:
        plot_curves(stats, training, log_dir / PLOT_FILE, config.smoke.logprob_ratio_tolerance,
                    str(config.econfig.domain))
    per_step = config.train_dataset.batch_size * config.gconfig.n_samples
    view = (f"bash examples/tau2/tau2_rl.sh view {config.econfig.dump_dir} --out {log_dir / 'view'} "
            f"--episodes-per-step {per_step}") if config.econfig.dump_dir else ""
    result = dataclasses.replace(evaluate_run(config, stats, model_dir, timings, paths, training),
                                 placement=placement, view_command=view)
    (log_dir / SUMMARY_FILE).write_text(json.dumps(dataclasses.asdict(result), indent=2))
    return result


def log_progress() -> None:
    """Progress of this project's loggers on stderr, by object (AReaL's `getLogger` replaces the manager).
    The trainers' join in `run`, which imports them: a refusal need not wait for those imports."""
    from examples.tau2 import tau2_utils
    from examples.tau2.cpu import tiny_model
    from examples.tau2.lifecycle import recover as tau2_recover
    from examples.tau2.lifecycle import watchdog

    console_logging(logger, tau2_utils.logger, tiny_model.logger, tau2_recover.logger, watchdog.logger,
                    logging.getLogger("tau2_areal.slurm"))


def preflight(argv: list[str],
              more: Sequence[str] = ()) -> tuple[tuple[Tau2SmokeConfig, Path, list[str]] | None, int]:
    """Everything `main` checks before it starts anything (with `more`: `smoke --submit`'s own problems,
    slurm/controller_job.py). Returns ((config, its file, the overrides), 0) when the run may start; else
    (None, the exit status: 1 problems, 2 config)."""
    setup_runtime()  # counting the epochs on the domain's tasks imports tau2, which logs at import
    try:
        config, config_file, overrides = load_smoke_config(argv)
    except SmokeConfigError as e:
        print(f"smoke: {e}", file=sys.stderr)
        return None, 2
    if config.scheduler.type == "slurm" and (problem := unreachable()):
        print(f"smoke: {problem}", file=sys.stderr)  # first: the other checks take seconds to import
        return None, 1
    setup_runtime(config.econfig.tau2_log_level)
    log_progress()
    if domain_problems := run_domain_problems(config.econfig):
        for e in domain_problems:
            print(f"smoke: {e}", file=sys.stderr)
        return None, 2
    errors = [*check_config(config), *more]
    if errors:
        for e in errors:
            print(f"smoke: {e}", file=sys.stderr)
        print(f"smoke: {len(errors)} problem(s); nothing was started", file=sys.stderr)
        return None, 1
    return (config, config_file, overrides), 0


def main(argv: list[str] | None = None) -> int:
    with own_temp_dir():  # the run's temporary files, removed at the end (lifecycle/reaper.py)
        loaded, status = preflight(list(sys.argv[1:] if argv is None else argv))
        if loaded is None:
            return status
        config, config_file, overrides = loaded
        if config.scheduler.type == "local":
            share_temp_dir()  # the workers and the vLLM server run on this machine
        exit_on_sigterm()
        try:
            result = run(config_file, overrides, config)
        finally:  # AReaL stops its workers on a normal exit; this covers a run that failed half-way
            from examples.tau2.lifecycle.reaper import cancel_jobs

            stop_descendants(logger)
            cancel_jobs(config, logger)
    print(format_result(result, config.smoke.logprob_ratio_tolerance), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    exit_after(main)
