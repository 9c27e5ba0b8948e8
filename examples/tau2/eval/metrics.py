"""Evaluation metrics over repeated trials of tau2 tasks: pass^k, pass@k and episode statistics.

Pure functions over `TrialRecord`s (one per attempted trial); no I/O. Definitions:

* A trial **succeeds** when its tau2 reward is >= `SUCCESS_THRESHOLD` (1 - 1e-6): tau2's reward is a
  product of 0/1 checks, so this means "every check passed", robust to float round-off. The shaped
  training reward (partial credit, format penalty) never decides success.
* **pass^k** (tau2's leaderboard metric): for a task with n valid trials and c successes, the chance
  that k trials drawn without replacement *all* succeed, C(c, k) / C(n, k); averaged over tasks.
* **pass@k**: the chance that *at least one* of k such trials succeeds, 1 - C(n - c, k) / C(n, k).
* **Rejected trials** (infrastructure failures: endpoint down, timeout...) are not scored. They are
  excluded, never counted as failures, and reported. A task therefore can have fewer valid trials n
  than were requested. Each task uses its own n in the formulas above (both are unbiased estimates
  for any n >= k), and a task with n < k is left out of pass^k and pass@k at that k only;
  `tasks_at_k` says how many tasks each value averages over. A task with no valid trial is in no
  average and is counted in `tasks_without_valid_trial`.
* **overall** applies the same formulas to all tasks of all domains together, so every task weighs
  the same (domains with more tasks weigh more); `domain_mean_pass_hat_k` is the plain mean of the
  per-domain values instead.
* **Intervals** (`pass_hat_k_ci`, `pass_at_k_ci`): percentile bootstrap over tasks. The tasks of a
  domain (those with >= k valid trials) are resampled with replacement, each keeping its own unbiased
  per-task estimate (its trials are not resampled); the interval runs from the (1 - confidence)/2 to
  the (1 + confidence)/2 quantile (inverse empirical CDF) of the resampled means. **overall** is
  stratified: each resample draws every domain's tasks within that domain, keeping the domain sizes.
  Resamples come from a fixed seed, so reports are reproducible (tests/bootstrap_support.py
  enumerates every resample of a few tasks exactly; the tests check the Monte-Carlo intervals against
  it).
* **Trusted tasks** (`TaskTrust`, from `tau2_rl.sh check-tasks`): some tasks pay an agent for doing nothing
  (`rewards_nothing`) or for skipping the last write (`rewards_partial`). τ²'s pass^k counts them like
  the others; `trusted` gives pass^k over the other tasks only, and the **stall share**: the share of
  successes that came from tasks a do-nothing agent passes. A policy that learns to stall raises the
  official pass^k and the stall share, not the trusted pass^k.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from examples.tau2.episode.task_check import SUCCESS_THRESHOLD

OVERALL = "overall"
INTERVAL_METHOD = (
    "percentile bootstrap over tasks (tasks resampled with replacement, each keeping its own unbiased "
    "estimate); overall is stratified (tasks resampled within each domain)"
)


def is_success(tau2_reward: float) -> bool:
    return tau2_reward >= SUCCESS_THRESHOLD


def pass_hat_k(n: int, c: int, k: int) -> float:
    """P(k of n trials, drawn without replacement, all succeed) given c successes."""
    _check_counts(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k of n trials, drawn without replacement, succeeds) given c successes."""
    _check_counts(n, c, k)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _check_counts(n: int, c: int, k: int) -> None:
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")


@dataclass(frozen=True)
class TrialRecord:
    """One attempt at one trial of one task: either scored, or rejected (`rejection` is set)."""

    domain: str
    task_id: str
    trial: int
    seed: int
    tau2_reward: float | None = None
    reward: float | None = None
    """The shaped training reward (equals tau2_reward unless shaping is configured)."""
    reward_breakdown: dict[str, float] = field(default_factory=dict)
    termination: str = ""
    num_agent_turns: int = 0
    num_tool_calls: int = 0
    num_invalid_tool_calls: int = 0
    wall_s: float = 0.0
    dump_path: str = ""
    note: str = ""
    rejection: str = ""
    """A `RejectReason` value for a rejected attempt, empty for a scored one."""
    rejection_detail: str = ""
    failed_checks: list[str] = field(default_factory=list)
    """The criteria τ² failed a scored trial on, one phrase each (`eval.oracle.failed_checks`)."""
    inputs: str = ""
    """The key of what the trial depended on (`eval.inputs`): a resume keeps the trial only while it holds."""

    def __post_init__(self) -> None:
        if bool(self.rejection) == (self.tau2_reward is not None):
            raise ValueError(
                f"trial {self.domain}/{self.task_id}#{self.trial} must have exactly one of a tau2 reward "
                "and a rejection reason"
            )

    @property
    def scored(self) -> bool:
        return not self.rejection

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.domain, self.task_id, self.trial)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TrialRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def final_trials(records: Iterable[TrialRecord]) -> dict[tuple[str, str, int], TrialRecord]:
    """The state of each trial: its scored record if it has one, else its last rejected attempt."""
    out: dict[tuple[str, str, int], TrialRecord] = {}
    for r in records:
        prev = out.get(r.key)
        if prev is None or r.scored or not prev.scored:
            out[r.key] = r
    return out


@dataclass(frozen=True)
class TaskCounts:
    """One task's valid trials `n` and successes `c` (rejected trials excluded)."""

    n: int
    c: int


def task_counts(records: Iterable[TrialRecord]) -> dict[str, dict[str, TaskCounts]]:
    """domain -> task id -> counts, for every task with a recorded attempt (n is 0 when none is valid)."""
    outcomes: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for r in final_trials(records).values():
        per_task = outcomes[r.domain][r.task_id]
        if r.scored:
            per_task.append(is_success(r.tau2_reward))  # type: ignore[arg-type]
    return {
        d: {t: TaskCounts(len(o), sum(o)) for t, o in sorted(tasks.items())}
        for d, tasks in sorted(outcomes.items())
    }


@dataclass(frozen=True)
class Interval:
    """A confidence interval [low, high]."""

    low: float
    high: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


@dataclass(frozen=True)
class BootstrapConfig:
    """Percentile bootstrap settings: resamples, confidence level and the seed of every draw."""

    resamples: int = 10_000
    confidence: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        if self.resamples < 1:
            raise ValueError(f"bootstrap resamples must be >= 1, got {self.resamples}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if self.seed < 0:
            raise ValueError(f"bootstrap seed must be >= 0, got {self.seed}")

    def rng(self, *stream: int) -> np.random.Generator:
        """The generator of one named stream of draws, independent of the order streams are used in."""
        return np.random.default_rng([self.seed, *stream])


DEFAULT_BOOTSTRAP = BootstrapConfig()
_BLOCK_CELLS = 1 << 21  # resampled indices drawn at once (bounds memory for large task sets)


def resampled_means(
    strata: Sequence[np.ndarray], config: BootstrapConfig, stream: Sequence[int] = ()
) -> tuple[list[np.ndarray | None], np.ndarray | None]:
    """Bootstrap distributions of the mean of each stratum and of all rows together (stratified).

    Each stratum is an (n_d, m) array: one row per task, one column per statistic (all columns share
    the same resamples). Every resample draws n_d rows with replacement within each stratum. Returns
    (one (B, m) array per stratum, None for an empty one) and the (B, m) array of the mean over all
    resampled rows (None when every stratum is empty).
    """
    per: list[np.ndarray | None] = []
    total: np.ndarray | None = None
    rows = 0
    for index, stratum in enumerate(strata):
        values = np.asarray(stratum, dtype=float)
        n = len(values)
        if n == 0:
            per.append(None)
            continue
        rng = config.rng(*stream, index)
        block = max(1, _BLOCK_CELLS // n)
        sums = np.concatenate([
            values[rng.integers(0, n, size=(min(block, config.resamples - start), n))].sum(axis=1)
            for start in range(0, config.resamples, block)
        ])
        per.append(sums / n)
        total = sums if total is None else total + sums
        rows += n
    return per, None if total is None else total / rows


def percentile_interval(samples: np.ndarray, confidence: float) -> Interval:
    """The (1 -+ confidence)/2 quantiles of a bootstrap distribution (inverse empirical CDF)."""
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(np.asarray(samples, dtype=float), [alpha, 1.0 - alpha], method="inverted_cdf")
    return Interval(float(low), float(high))


@dataclass
class ComponentStats:
    """One tau2 reward component (DB, COMMUNICATE, ACTION, ENV_ASSERTION...) over valid trials."""

    mean: float
    count: int
    """Trials whose task scores this component (tasks differ in their reward basis)."""


@dataclass(frozen=True)
class TaskTrust:
    """Per domain, the tasks whose reward pays for less than the job (`episode.task_check.PAYING_FLAGS`)."""

    rewards_nothing: dict[str, frozenset[str]]
    """Tasks a do-nothing agent passes."""
    rewards_partial: dict[str, frozenset[str]]
    """Tasks an agent passes that skips the last state-changing action."""

    def trusted(self, domain: str, task_id: str) -> bool:
        """Whether the task pays only for the job done."""
        return not (task_id in self.rewards_nothing.get(domain, ()) or
                    task_id in self.rewards_partial.get(domain, ()))

    def free(self, domain: str, task_id: str) -> bool:
        """Whether a do-nothing agent passes the task."""
        return task_id in self.rewards_nothing.get(domain, ())

    def to_json(self) -> dict[str, dict[str, list[str]]]:
        return {"rewards_nothing": {d: sorted(ids) for d, ids in self.rewards_nothing.items()},
                "rewards_partial": {d: sorted(ids) for d, ids in self.rewards_partial.items()}}

    @classmethod
    def from_json(cls, d: dict[str, dict[str, list[str]]]) -> TaskTrust:
        return cls({k: frozenset(v) for k, v in d["rewards_nothing"].items()},
                   {k: frozenset(v) for k, v in d["rewards_partial"].items()})


@dataclass
class TrustedMetrics:
    """A group's scores on the tasks that pay only for the job done, and where its successes came from."""

    tasks: int
    """Scored tasks that pay only for the job done."""
    pass_hat_k: dict[int, float | None]
    tasks_at_k: dict[int, int]
    free_tasks: int
    """Scored tasks a do-nothing agent passes."""
    successes: int
    """All successful valid trials (of every task)."""
    free_successes: int
    """Those on the tasks a do-nothing agent passes."""
    pass_hat_k_ci: dict[int, Interval | None] = field(default_factory=dict)

    @property
    def stall_share(self) -> float | None:
        """Of the successes, the share on tasks a do-nothing agent passes (None: no success)."""
        return self.free_successes / self.successes if self.successes else None


@dataclass
class GroupMetrics:
    """Metrics of one domain, or of all domains together (`name == "overall"`)."""

    name: str
    num_tasks: int
    """Tasks with at least one recorded attempt."""
    tasks_without_valid_trial: int
    num_valid_trials: int
    num_successes: int
    num_rejected_trials: int
    """Trials with no valid attempt (only rejections): excluded from every number above and below."""
    rejected_attempts: dict[str, int]
    """Every rejected attempt by reason, including those a later attempt replaced."""
    pass_hat_k: dict[int, float | None]
    pass_at_k: dict[int, float | None]
    tasks_at_k: dict[int, int]
    """How many tasks (those with >= k valid trials) each pass^k / pass@k value averages over."""
    success_rate: float | None
    """Successful / valid trials (weights tasks by their valid trials; pass^1 weighs tasks equally)."""
    mean_tau2_reward: float | None
    mean_reward: float | None
    mean_agent_turns: float | None
    mean_tool_calls: float | None
    terminations: dict[str, int]
    reward_components: dict[str, ComponentStats]
    pass_hat_k_ci: dict[int, Interval | None] = field(default_factory=dict)
    """Bootstrap confidence interval of each pass^k value (empty when intervals were not computed)."""
    pass_at_k_ci: dict[int, Interval | None] = field(default_factory=dict)
    trusted: TrustedMetrics | None = None
    """The same on the tasks that pay only for the job done; None: which those are is not known."""


@dataclass
class EvalReport:
    max_k: int
    domains: dict[str, GroupMetrics]
    overall: GroupMetrics
    domain_mean_pass_hat_k: dict[int, float | None]
    success_threshold: float = SUCCESS_THRESHOLD
    bootstrap: BootstrapConfig | None = None
    """How the intervals were computed; None: no intervals."""
    interval_method: str = ""

    def groups(self) -> list[GroupMetrics]:
        return [*self.domains.values(), self.overall]

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for group, data in zip(self.groups(), [*out["domains"].values(), out["overall"]], strict=True):
            if group.trusted is not None:
                data["trusted"]["stall_share"] = group.trusted.stall_share
        return out


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _pass_values(counts: Sequence[tuple[int, int]], max_k: int
                 ) -> tuple[dict[int, float | None], dict[int, float | None], dict[int, int]]:
    """pass^k, pass@k and the tasks each averages over, k = 1..max_k, from per-task (n, c)."""
    hat: dict[int, float | None] = {}
    at: dict[int, float | None] = {}
    tasks_at: dict[int, int] = {}
    for k in range(1, max_k + 1):
        eligible = [(n, c) for n, c in counts if n >= k]
        tasks_at[k] = len(eligible)
        hat[k] = _mean([pass_hat_k(n, c, k) for n, c in eligible])
        at[k] = _mean([pass_at_k(n, c, k) for n, c in eligible])
    return hat, at, tasks_at


def _trusted(per_task: dict[tuple[str, str], list[bool]], max_k: int, trust: TaskTrust) -> TrustedMetrics:
    kept = [(len(o), sum(o)) for (d, t), o in per_task.items() if trust.trusted(d, t)]
    hat, _, tasks_at = _pass_values(kept, max_k)
    free = [o for (d, t), o in per_task.items() if trust.free(d, t)]
    return TrustedMetrics(tasks=sum(n > 0 for n, _ in kept), pass_hat_k=hat, tasks_at_k=tasks_at,
                          free_tasks=sum(bool(o) for o in free),
                          successes=sum(sum(o) for o in per_task.values()),
                          free_successes=sum(sum(o) for o in free))


def _group(name: str, attempts: list[TrialRecord], finals: list[TrialRecord], max_k: int,
           trust: TaskTrust | None) -> GroupMetrics:
    valid = [r for r in finals if r.scored]
    per_task: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for r in finals:  # every task with an attempt, even one with no valid trial
        outcomes = per_task[(r.domain, r.task_id)]
        if r.scored:
            outcomes.append(is_success(r.tau2_reward))  # type: ignore[arg-type]
    counts = [(len(o), sum(o)) for o in per_task.values()]
    hat, at, tasks_at = _pass_values(counts, max_k)
    components: dict[str, list[float]] = defaultdict(list)
    for r in valid:
        for comp, value in r.reward_breakdown.items():
            components[comp].append(float(value))
    return GroupMetrics(
        name=name,
        num_tasks=len(per_task),
        tasks_without_valid_trial=sum(n == 0 for n, _ in counts),
        num_valid_trials=len(valid),
        num_successes=sum(c for _, c in counts),
        num_rejected_trials=len(finals) - len(valid),
        rejected_attempts=dict(sorted(Counter(r.rejection for r in attempts if not r.scored).items())),
        pass_hat_k=hat,
        pass_at_k=at,
        tasks_at_k=tasks_at,
        success_rate=_mean([float(is_success(r.tau2_reward)) for r in valid]),  # type: ignore[arg-type]
        mean_tau2_reward=_mean([r.tau2_reward for r in valid]),  # type: ignore[misc]
        mean_reward=_mean([r.reward for r in valid if r.reward is not None]),
        mean_agent_turns=_mean([r.num_agent_turns for r in valid]),
        mean_tool_calls=_mean([r.num_tool_calls for r in valid]),
        terminations=dict(sorted(Counter(r.termination for r in valid).items())),
        reward_components={c: ComponentStats(sum(v) / len(v), len(v)) for c, v in sorted(components.items())},
        trusted=None if trust is None else _trusted(per_task, max_k, trust),
    )


def task_values(counts: Iterable[TaskCounts], k: int) -> np.ndarray:
    """(tasks, 2) array of the per-task pass^k and pass@k estimates of the tasks with n >= k."""
    rows = [(pass_hat_k(t.n, t.c, k), pass_at_k(t.n, t.c, k)) for t in counts if t.n >= k]
    return np.array(rows, dtype=float).reshape(-1, 2)


def _add_intervals(report: EvalReport, counts: dict[str, dict[str, TaskCounts]],
                   config: BootstrapConfig, trust: TaskTrust | None) -> None:
    """Fill every group's pass^k / pass@k intervals: per domain, and stratified over domains; and those of
    the trusted pass^k (its own stream of draws)."""
    names = list(report.domains)
    for k in range(1, report.max_k + 1):
        if trust is not None:
            kept = [task_values([c for t, c in counts[d].items() if trust.trusted(d, t)], k) for d in names]
            per, total = resampled_means(kept, config, (k, 1))
            for group, samples in [*zip(report.domains.values(), per, strict=True), (report.overall, total)]:
                if group.trusted is not None:
                    group.trusted.pass_hat_k_ci[k] = (None if samples is None else
                                                      percentile_interval(samples[:, 0], config.confidence))
        per, total = resampled_means([task_values(counts[d].values(), k) for d in names], config, (k,))
        for group, samples in [*zip(report.domains.values(), per, strict=True), (report.overall, total)]:
            hat = at = None
            if samples is not None:
                hat = percentile_interval(samples[:, 0], config.confidence)
                at = percentile_interval(samples[:, 1], config.confidence)
            group.pass_hat_k_ci[k] = hat
            group.pass_at_k_ci[k] = at
    report.bootstrap = config
    report.interval_method = INTERVAL_METHOD


def compute_report(records: Iterable[TrialRecord], max_k: int,
                   bootstrap: BootstrapConfig | None = DEFAULT_BOOTSTRAP,
                   trust: TaskTrust | None = None) -> EvalReport:
    """Per-domain and overall metrics for k = 1..max_k from every recorded attempt, with bootstrap
    intervals (`bootstrap=None`: without), and with `trust` the same on the trusted tasks."""
    if max_k < 1:
        raise ValueError(f"max_k must be >= 1, got {max_k}")
    attempts = list(records)
    finals = sorted(final_trials(attempts).values(), key=lambda r: r.key)  # finish order must not matter
    domains = sorted({r.domain for r in attempts})
    per_domain = {
        d: _group(d, [r for r in attempts if r.domain == d], [r for r in finals if r.domain == d], max_k,
                  trust)
        for d in domains
    }
    domain_mean: dict[int, float | None] = {}
    for k in range(1, max_k + 1):
        values = [g.pass_hat_k[k] for g in per_domain.values()]
        domain_mean[k] = None if not values or None in values else _mean(values)  # type: ignore[arg-type]
    report = EvalReport(
        max_k=max_k,
        domains=per_domain,
        overall=_group(OVERALL, attempts, finals, max_k, trust),
        domain_mean_pass_hat_k=domain_mean,
    )
    if bootstrap is not None:
        _add_intervals(report, task_counts(attempts), bootstrap, trust)
    return report


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def format_interval(value: float | None, interval: Interval | None = None, digits: int = 3,
                    sign: bool = False) -> str:
    """`0.620 [0.550, 0.700]`; just the value when there is no interval."""
    spec = f"{'+' if sign else ''}.{digits}f"
    if value is None:
        return "–"
    text = format(value, spec)
    return text if interval is None else f"{text} [{interval.low:{spec}}, {interval.high:{spec}}]"


def _k_cells(values: dict[int, float | None], cis: dict[int, Interval | None], tasks_at_k: dict[int, int],
             scored_tasks: int) -> list[str]:
    # A value over fewer tasks than the group has (some had < k valid trials) says so.
    return [
        format_interval(v, cis.get(k))
        + ("" if tasks_at_k[k] == scored_tasks else f" ({tasks_at_k[k]} tasks)")
        for k, v in values.items()
    ]


TRUSTED_TITLE = "### pass^k on the trusted tasks (those a do-nothing or half-done agent fails)"
TRUSTED_NOTE = ("τ²'s pass^k above counts every task; here the tasks `tau2_rl.sh check-tasks` finds paying "
                "for doing nothing or half the job are left out. The last column: how many of all the "
                "successes came from the tasks a do-nothing agent passes.")


def format_share(share: float | None) -> str:
    """`38 %`; `–` when there is no success to share out."""
    return "–" if share is None else f"{share:.0%}".replace("%", " %")


def stall_warning(group: GroupMetrics) -> str:
    """A sentence when the group's successes come mostly from tasks that pay for doing nothing: its trusted
    pass^1 is under half its official pass^1. Empty otherwise."""
    t = group.trusted
    official, trusted = group.pass_hat_k.get(1), None if t is None else t.pass_hat_k.get(1)
    if t is None or not official or trusted is None or trusted >= official / 2:
        return ""
    return (f"{group.name}: pass^1 is {official:.3f} on all tasks but {trusted:.3f} on the {t.tasks} trusted "
            f"ones, and {t.free_successes} of its {t.successes} successes ({format_share(t.stall_share)}) "
            "came from tasks a do-nothing agent passes: the policy stalls more than it works")


def interval_note(config: BootstrapConfig) -> str:
    """One sentence on how the intervals were computed."""
    return (f"Intervals: {config.confidence:.0%} {INTERVAL_METHOD}; {config.resamples} resamples, "
            f"seed {config.seed}.")


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def format_markdown(report: EvalReport) -> str:
    """The report as Markdown tables (pass^k, pass@k, episode statistics, reward components)."""
    ks = list(range(1, report.max_k + 1))
    groups = report.groups()
    out = [
        f"Success: tau2 reward >= {report.success_threshold!r}. Rejected trials (infrastructure "
        "failures) are excluded, never counted as failures. A value marked `(N tasks)` averages only "
        "the tasks with at least k valid trials.",
    ]
    if report.bootstrap is not None:
        out += ["", interval_note(report.bootstrap)]
    for warning in filter(None, map(stall_warning, groups)):
        out += ["", f"**Stalling:** {warning}."]
    out += ["", "### pass^k (all k trials succeed)", ""]
    rows = []
    for g in groups:
        scored = g.num_tasks - g.tasks_without_valid_trial
        rows.append([g.name, str(scored), *_k_cells(g.pass_hat_k, g.pass_hat_k_ci, g.tasks_at_k, scored)])
    if len(report.domains) > 1:
        rows.append(["mean of domains", "", *(_fmt(report.domain_mean_pass_hat_k[k]) for k in ks)])
    out += markdown_table(["domain", "tasks", *(f"pass^{k}" for k in ks)], rows)
    trusted = [(g.name, g.trusted) for g in groups if g.trusted is not None]
    if trusted:
        out += ["", TRUSTED_TITLE, "", TRUSTED_NOTE, ""]
        rows = [[name, str(t.tasks), *_k_cells(t.pass_hat_k, t.pass_hat_k_ci, t.tasks_at_k, t.tasks),
                 f"{t.free_successes} of {t.successes} ({format_share(t.stall_share)})"]
                for name, t in trusted]
        out += markdown_table(["domain", "tasks", *(f"pass^{k}" for k in ks),
                               "successes on tasks that pay for nothing"], rows)
    out += ["", "### pass@k (at least one of k trials succeeds)", ""]
    rows = []
    for g in groups:
        scored = g.num_tasks - g.tasks_without_valid_trial
        rows.append([g.name, str(scored), *_k_cells(g.pass_at_k, g.pass_at_k_ci, g.tasks_at_k, scored)])
    out += markdown_table(["domain", "tasks", *(f"pass@{k}" for k in ks)], rows)
    out += ["", "### Episodes", ""]
    rows = []
    for g in groups:
        rejected = ", ".join(f"{r}: {n}" for r, n in g.rejected_attempts.items()) or "0"
        rows.append([
            g.name, str(g.num_valid_trials), str(g.num_rejected_trials), rejected,
            str(g.tasks_without_valid_trial), _fmt(g.success_rate), _fmt(g.mean_tau2_reward),
            _fmt(g.mean_reward), _fmt(g.mean_agent_turns, 1), _fmt(g.mean_tool_calls, 1),
            ", ".join(f"{t}: {n}" for t, n in g.terminations.items()) or "–",
        ])
    out += markdown_table(
        ["domain", "valid trials", "rejected trials", "rejected attempts", "tasks w/o valid trial",
         "success rate", "mean tau2 reward", "mean reward", "policy turns", "tool calls", "terminations"],
        rows,
    )
    components = sorted({c for g in groups for c in g.reward_components})
    if components:
        out += ["", "### tau2 reward components (mean over valid trials that score them; trials)", ""]
        rows = []
        for g in groups:
            cells = []
            for c in components:
                s = g.reward_components.get(c)
                cells.append("–" if s is None else f"{s.mean:.3f} ({s.count})")
            rows.append([g.name, *cells])
        out += markdown_table(["domain", *components], rows)
    return "\n".join(out) + "\n"
