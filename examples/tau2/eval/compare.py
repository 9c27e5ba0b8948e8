"""Aggregate several tau2 evaluations, or compare two, per domain and k (reads eval.evaluate output dirs).

    python -m examples.tau2.eval.compare aggregate runs/eval-a-1 runs/eval-a-2 runs/eval-a-3 \\
        --output-dir runs/eval-a-agg
    python -m examples.tau2.eval.compare compare runs/eval-a runs/eval-b --output-dir runs/a-vs-b

aggregate  runs of one configuration: pass^k and pass@k per domain and k as mean ± sd over the runs
           (sample standard deviation, n - 1). The runs' recorded settings (run.json) must be equal;
           --allow-different-settings accepts other models or episode settings (they are listed in
           the output), but domains, split, tasks and trials must always match.
compare    A vs B: the difference A - B of pass^k and pass@k per domain and k over the tasks both runs
           evaluated, with a *paired* percentile bootstrap interval: tasks are paired by task id and
           resampled with replacement together (each resample keeps both runs' estimates of the same
           tasks); overall resamples within each domain (stratified). Domains, split and trials (k)
           must match; other setting differences are listed.

Both recompute the metrics from trials.jsonl (rejected trials excluded, as in eval.evaluate), print
Markdown, and with --output-dir also write aggregate.{md,json,png} or compare.{md,json,png}. The eval
dirs are only read.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from examples.tau2.eval.evaluate import (
    RUN_FILE,
    TRIALS_FILE,
    TRUST_KEY,
    settings_differences,
    upgrade_settings,
)
from examples.tau2.eval.metrics import (
    DEFAULT_BOOTSTRAP,
    OVERALL,
    BootstrapConfig,
    Interval,
    TaskCounts,
    TaskTrust,
    TrialRecord,
    compute_report,
    format_interval,
    format_share,
    markdown_table,
    percentile_interval,
    resampled_means,
    task_counts,
    task_values,
)
from examples.tau2.runtime.charts import new_figure, save_png
from examples.tau2.runtime.files import dump_json, write_atomic

logger = logging.getLogger("tau2_areal.compare")

SHAPE_KEYS = ("domains", "split", "tasks", "trials", "success_threshold")
"""Settings every aggregated run must share (compare needs all but `tasks`: it pairs tasks by id)."""
GRADER_KEY = "tau2"
"""The tau2 release that scored a run: runs scored by different releases are never compared (their
evaluators disagree on some tasks, see docs/regraded_tasks.md), whatever the flags."""
NOTED_KEYS = ("versions",)
"""Settings whose differences are only noted, never refused."""
PAIRED_METHOD = (
    "paired percentile bootstrap over tasks (tasks paired by id and resampled with replacement "
    "together, each keeping both runs' unbiased estimates); overall is stratified (tasks resampled "
    "within each domain)"
)
UNRECORDED_TRUST = ("No trusted pass^k: some run did not record which tasks pay for doing nothing "
                    "(evaluated before evaluations recorded it); rerun its eval.evaluate command, which "
                    "resumes with every trial scored and records it.")
AGGREGATE_FILES = ("aggregate.md", "aggregate.json", "aggregate.png")
COMPARE_FILES = ("compare.md", "compare.json", "compare.png")


@dataclass(frozen=True)
class EvalRun:
    """One eval.evaluate output directory: its recorded settings and every trial attempt."""

    path: Path
    settings: dict[str, Any]
    records: list[TrialRecord]
    trust: TaskTrust | None = None
    """Which tasks pay for less than the job, as the evaluation recorded them (None: a run recorded
    before evaluations recorded it; resuming it with its command records it)."""

    @property
    def domains(self) -> list[str]:
        return list(self.settings["domains"])

    @property
    def trials(self) -> int:
        return int(self.settings["trials"])

    @property
    def policy_model(self) -> str:
        return str(self.settings.get("policy_model", ""))


def load_run(path: Path) -> EvalRun:
    """Read an eval dir without changing it; raises ValueError with one sentence on bad input."""
    if not path.is_dir():
        raise ValueError(f"{path} is not a directory")
    run_file, trials_file = path / RUN_FILE, path / TRIALS_FILE
    if not run_file.is_file():
        raise ValueError(f"{path} has no {RUN_FILE}: not a eval.evaluate output directory")
    try:
        run = json.loads(run_file.read_text(encoding="utf-8"))
        settings = upgrade_settings(run["settings"])
        trust = TaskTrust.from_json(run[TRUST_KEY]) if TRUST_KEY in run else None
        missing = [k for k in SHAPE_KEYS if k not in settings]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{run_file} is not a eval.evaluate run file ({e})") from None
    if missing:
        raise ValueError(f"{run_file} lacks the settings {', '.join(missing)}")
    if not trials_file.is_file():
        raise ValueError(f"{path} has no {TRIALS_FILE}: the evaluation never finished a trial")
    data = trials_file.read_bytes()
    complete = data.rfind(b"\n") + 1
    if complete < len(data):  # a run still writing, or interrupted mid-line: eval.evaluate drops it too
        logger.warning("%s: ignoring a half-written last line", trials_file)
    records = []
    for n, line in enumerate(data[:complete].splitlines(), 1):
        try:
            records.append(TrialRecord.from_json(json.loads(line)))
        except (ValueError, TypeError) as e:
            raise ValueError(f"line {n} of {trials_file} is not a trial record ({e})") from None
    if not any(r.scored for r in records):
        raise ValueError(f"{path} has no scored trial")
    return EvalRun(path=path, settings=settings, records=records, trust=trust)


def _differences(first: EvalRun, other: EvalRun) -> dict[str, list[str]]:
    """Top-level setting -> `key was X, now Y` lines, for the settings of `other` that differ from `first`."""
    out = {}
    for key in sorted(set(first.settings) | set(other.settings)):
        diffs = settings_differences(first.settings.get(key), other.settings.get(key), f"{key}.")
        if diffs:
            out[key] = diffs
    return out


def _check_same_grader(first: EvalRun, other: EvalRun) -> None:
    graders = first.settings.get(GRADER_KEY), other.settings.get(GRADER_KEY)
    if graders[0] != graders[1]:
        raise ValueError(f"{first.path} was scored by {graders[0]} and {other.path} by {graders[1]}: their "
                         "evaluators grade some tasks differently (docs/regraded_tasks.md), so their "
                         "numbers are not comparable; evaluate both on one tau2 release")


def _check_distinct(runs: Sequence[EvalRun]) -> None:
    seen: dict[Path, Path] = {}
    for run in runs:
        real = run.path.resolve()
        if real in seen:
            raise ValueError(f"{seen[real]} and {run.path} are the same directory")
        seen[real] = run.path


# ---------------------------------------------------------------- aggregate: mean ± sd over runs


@dataclass(frozen=True)
class Spread:
    """One value over runs: mean and sample standard deviation (n - 1) of the runs that have it."""

    mean: float | None
    sd: float | None
    """None with fewer than two values."""
    runs: int
    values: list[float | None]
    """Each run's value, in input order (None: that run has no task with >= k valid trials)."""


def spread(values: Sequence[float | None]) -> Spread:
    present = [v for v in values if v is not None]
    mean = sum(present) / len(present) if present else None
    sd = None
    if len(present) >= 2:
        sd = math.sqrt(sum((v - mean) ** 2 for v in present) / (len(present) - 1))  # type: ignore[operator]
    return Spread(mean=mean, sd=sd, runs=len(present), values=list(values))


@dataclass
class AggregateGroup:
    """One domain, or all tasks (`name == "overall"`), over the runs."""

    name: str
    tasks: int
    pass_hat_k: dict[int, Spread]
    pass_at_k: dict[int, Spread]
    trusted_pass_hat_k: dict[int, Spread] | None = None
    """pass^k on the tasks that pay only for the job done; None when some run did not record which."""
    stall_share: Spread | None = None
    """The share of each run's successes on tasks a do-nothing agent passes."""


@dataclass(frozen=True)
class RunSummary:
    path: str
    policy_model: str
    num_valid_trials: int
    num_rejected_trials: int
    tasks_without_valid_trial: int


@dataclass
class Aggregate:
    runs: list[RunSummary]
    split: str
    max_k: int
    domains: dict[str, AggregateGroup]
    overall: AggregateGroup
    differing_settings: list[str]
    """`run N: key was X, now Y` against run 1, for settings that may differ."""

    def groups(self) -> list[AggregateGroup]:
        return [*self.domains.values(), self.overall]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def aggregate(runs: Sequence[EvalRun], allow_different_settings: bool = False) -> Aggregate:
    """pass^k and pass@k per domain and k, mean ± sd over runs of one configuration."""
    if len(runs) < 2:
        raise ValueError("aggregate needs at least two eval dirs (mean ± sd over runs)")
    _check_distinct(runs)
    first = runs[0]
    noted: list[str] = []
    for i, run in enumerate(runs[1:], 2):
        _check_same_grader(first, run)
        diffs = _differences(first, run)
        shape = [d for key in SHAPE_KEYS for d in diffs.get(key, [])]
        if shape:
            raise ValueError(f"{run.path} is not a run of the same tasks as {first.path}: {'; '.join(shape)}")
        refused = [d for key, lines in diffs.items() if key not in NOTED_KEYS for d in lines]
        if refused and not allow_different_settings:
            raise ValueError(
                f"{run.path} was run with other settings than {first.path} ({'; '.join(refused)}); "
                "pass --allow-different-settings to aggregate them anyway"
            )
        noted += [f"run {i}: {d}" for lines in diffs.values() for d in lines]
    max_k, domains = first.trials, first.domains
    reports = [compute_report(run.records, max_k=max_k, bootstrap=None, trust=run.trust) for run in runs]
    known = all(run.trust is not None for run in runs)

    def group(name: str, tasks: int) -> AggregateGroup:
        groups = [rep.overall if name == OVERALL else rep.domains.get(name) for rep in reports]
        trusted = [g.trusted if g else None for g in groups]
        ks = range(1, max_k + 1)
        return AggregateGroup(
            name=name, tasks=tasks,
            pass_hat_k={k: spread([g.pass_hat_k[k] if g else None for g in groups]) for k in ks},
            pass_at_k={k: spread([g.pass_at_k[k] if g else None for g in groups]) for k in ks},
            trusted_pass_hat_k={k: spread([t.pass_hat_k[k] if t else None for t in trusted]) for k in ks}
            if known else None,
            stall_share=spread([t.stall_share if t else None for t in trusted]) if known else None,
        )

    per_domain = {d: group(d, len(first.settings["tasks"][d])) for d in domains}
    return Aggregate(
        runs=[RunSummary(str(run.path), run.policy_model, rep.overall.num_valid_trials,
                         rep.overall.num_rejected_trials, rep.overall.tasks_without_valid_trial)
              for run, rep in zip(runs, reports, strict=True)],
        split=str(first.settings["split"]), max_k=max_k, domains=per_domain,
        overall=group(OVERALL, sum(g.tasks for g in per_domain.values())), differing_settings=noted,
    )


def _fmt_spread(s: Spread, total_runs: int) -> str:
    if s.mean is None:
        return "–"
    text = f"{s.mean:.3f}" + ("" if s.sd is None else f" ± {s.sd:.3f}")
    return text if s.runs == total_runs else f"{text} ({s.runs} runs)"


def format_aggregate(agg: Aggregate) -> str:
    """Markdown: pass^k and pass@k tables (mean ± sd over runs), then one line per run."""
    ks = list(range(1, agg.max_k + 1))
    models = sorted({r.policy_model for r in agg.runs})
    out = [
        f"# tau2 evaluation over {len(agg.runs)} runs: {', '.join(f'`{m}`' for m in models)}",
        "",
        f"- split `{agg.split}` of {', '.join(agg.domains)}; {agg.max_k} trials per task in each run",
        "- each cell: mean ± sample standard deviation (n − 1) over runs of each run's own value; "
        "`(N runs)`: only N runs had a task with at least k valid trials",
    ]
    if agg.differing_settings:
        out.append("- settings that differ from run 1: " + "; ".join(agg.differing_settings))
    for title, attr in (("pass^k (all k trials succeed)", "pass_hat_k"),
                        ("pass@k (at least one of k trials succeeds)", "pass_at_k")):
        symbol = "^" if attr == "pass_hat_k" else "@"
        out += ["", f"### {title}", ""]
        rows = [[g.name, str(g.tasks), *(_fmt_spread(getattr(g, attr)[k], len(agg.runs)) for k in ks)]
                for g in agg.groups()]
        out += markdown_table(["domain", "tasks", *(f"pass{symbol}{k}" for k in ks)], rows)
    if all(g.trusted_pass_hat_k is not None for g in agg.groups()):
        out += ["", "### pass^k on the trusted tasks (those a do-nothing or half-done agent fails)", ""]
        rows = [[g.name, *(_fmt_spread(g.trusted_pass_hat_k[k], len(agg.runs)) for k in ks),  # type: ignore[index]
                 _fmt_spread(g.stall_share, len(agg.runs))] for g in agg.groups()]  # type: ignore[arg-type]
        out += markdown_table(["domain", *(f"pass^{k}" for k in ks),
                               "share of successes that pay for nothing"], rows)
    else:
        out += ["", UNRECORDED_TRUST]
    out += ["", "### Runs", ""]
    rows = [
        [str(i), f"`{r.path}`", f"`{r.policy_model}`",
         *(format_interval(agg.overall.pass_hat_k[k].values[i - 1]) for k in ks),
         str(r.num_valid_trials), str(r.num_rejected_trials), str(r.tasks_without_valid_trial)]
        for i, r in enumerate(agg.runs, 1)
    ]
    out += markdown_table(["run", "dir", "policy", *(f"overall pass^{k}" for k in ks), "valid trials",
                   "rejected trials", "tasks w/o valid trial"], rows)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- compare: A - B, paired bootstrap


@dataclass(frozen=True)
class PairedDifference:
    """A - B at one k over the tasks where both runs have >= k valid trials."""

    tasks: int
    a: float | None
    b: float | None
    difference: float | None
    interval: Interval | None

    @property
    def excludes_zero(self) -> bool:
        return self.interval is not None and not self.interval.contains(0.0)


@dataclass
class ComparisonGroup:
    name: str
    common_tasks: int
    """Tasks with a valid trial in both runs: the pairs."""
    only_a: int
    """Tasks with a valid trial in A but not in B (left out), and the reverse below."""
    only_b: int
    pass_hat_k: dict[int, PairedDifference]
    pass_at_k: dict[int, PairedDifference]
    trusted_pass_hat_k: dict[int, PairedDifference] | None = None
    """pass^k on the common tasks that pay only for the job done; None when a run did not record which."""
    stall_share_a: float | None = None
    """The share of A's successes (all its tasks) on tasks a do-nothing agent passes; B's below."""
    stall_share_b: float | None = None


@dataclass
class Comparison:
    label_a: str
    label_b: str
    path_a: str
    path_b: str
    split: str
    max_k: int
    domains: dict[str, ComparisonGroup]
    overall: ComparisonGroup
    bootstrap: BootstrapConfig
    differing_settings: list[str]
    """`key was <A's>, now <B's>` for every setting that differs."""
    interval_method: str = PAIRED_METHOD

    def groups(self) -> list[ComparisonGroup]:
        return [*self.domains.values(), self.overall]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _labels(a: EvalRun, b: EvalRun, labels: Sequence[str] | None) -> tuple[str, str]:
    if labels:
        if len(labels) != 2 or labels[0] == labels[1] or not all(labels):
            raise ValueError(f"--labels needs two different non-empty names, got {list(labels)}")
        return labels[0], labels[1]
    for pair in ((a.policy_model, b.policy_model), (a.path.name, b.path.name)):
        if pair[0] and pair[1] and pair[0] != pair[1]:
            return pair
    return "A", "B"


def _pairs(a: dict[str, TaskCounts], b: dict[str, TaskCounts]) -> tuple[list[str], int, int]:
    """Task ids with a valid trial in both, and how many have one in A only and in B only."""
    in_a = {t for t, c in a.items() if c.n > 0}
    in_b = {t for t, c in b.items() if c.n > 0}
    return sorted(in_a & in_b), len(in_a - in_b), len(in_b - in_a)


def compare(a: EvalRun, b: EvalRun, bootstrap: BootstrapConfig = DEFAULT_BOOTSTRAP,
            labels: Sequence[str] | None = None) -> Comparison:
    """A - B per domain and k over the common tasks, with paired bootstrap intervals."""
    _check_distinct([a, b])
    _check_same_grader(a, b)
    diffs = _differences(a, b)
    shape = [d for key in SHAPE_KEYS if key != "tasks" for d in diffs.get(key, [])]
    if shape:
        raise ValueError(f"{a.path} and {b.path} are not comparable: {'; '.join(shape)}")
    label_a, label_b = _labels(a, b, labels)
    counts_a, counts_b = task_counts(a.records), task_counts(b.records)
    domains = a.domains
    pairs = {}
    for d in domains:
        common, only_a, only_b = _pairs(counts_a.get(d, {}), counts_b.get(d, {}))
        if not common:
            raise ValueError(
                f"no task of {d} has a valid trial in both {a.path} and {b.path} "
                f"({only_a} in A only, {only_b} in B only)"
            )
        pairs[d] = (common, only_a, only_b)
    max_k = a.trials
    groups = {d: ComparisonGroup(d, len(common), only_a, only_b, {}, {})
              for d, (common, only_a, only_b) in pairs.items()}
    overall = ComparisonGroup(OVERALL, sum(g.common_tasks for g in groups.values()),
                              sum(g.only_a for g in groups.values()), sum(g.only_b for g in groups.values()),
                              {}, {})
    def differences(k: int, keep: Any, stream: tuple[int, ...]) -> list[tuple[ComparisonGroup, list[Any]]]:
        """Per group (domains, then overall): A and B's mean, A - B and its paired interval of pass^k and
        pass@k at `k`, over the common tasks `keep(domain, task)` admits with >= k valid trials in both."""
        values_a, values_b = [], []  # per domain: (pairs, 2) arrays of pass^k and pass@k, row i = task i
        for d in domains:
            ids = [t for t in pairs[d][0] if counts_a[d][t].n >= k and counts_b[d][t].n >= k and keep(d, t)]
            values_a.append(task_values([counts_a[d][t] for t in ids], k))
            values_b.append(task_values([counts_b[d][t] for t in ids], k))
        per, total = resampled_means([va - vb for va, vb in zip(values_a, values_b, strict=True)],
                                     bootstrap, (k, *stream))
        strata = [*zip(groups.values(), values_a, values_b, per, strict=True),
                  (overall, np.concatenate(values_a), np.concatenate(values_b), total)]
        return [(group, [PairedDifference(0, None, None, None, None) if samples is None else PairedDifference(
            tasks=len(va), a=float(va[:, column].mean()), b=float(vb[:, column].mean()),
            difference=float((va[:, column] - vb[:, column]).mean()),
            interval=percentile_interval(samples[:, column], bootstrap.confidence)) for column in (0, 1)])
            for group, va, vb, samples in strata]

    trust_a, trust_b = a.trust, b.trust
    for k in range(1, max_k + 1):
        for group, (hat, at) in differences(k, lambda _d, _t: True, ()):
            group.pass_hat_k[k], group.pass_at_k[k] = hat, at
    if trust_a is not None and trust_b is not None:
        reports = [compute_report(run.records, max_k=1, bootstrap=None, trust=run.trust) for run in (a, b)]
        for group in [*groups.values(), overall]:
            shares = [(rep.overall if group.name == OVERALL else rep.domains[group.name]).trusted
                      for rep in reports]
            group.stall_share_a, group.stall_share_b = (t.stall_share if t else None for t in shares)
            group.trusted_pass_hat_k = {}
        for k in range(1, max_k + 1):
            trusted = differences(k, lambda d, t: trust_a.trusted(d, t) and trust_b.trusted(d, t), (1,))
            for group, (hat, _) in trusted:
                group.trusted_pass_hat_k[k] = hat  # type: ignore[index]
    return Comparison(
        label_a=label_a, label_b=label_b, path_a=str(a.path), path_b=str(b.path),
        split=str(a.settings["split"]), max_k=max_k, domains=groups, overall=overall, bootstrap=bootstrap,
        differing_settings=[d for lines in diffs.values() for d in lines],
    )


def format_comparison(cmp: Comparison) -> str:
    """Markdown: per metric, one row per domain and k with A, B and A − B [interval]."""
    a, b = cmp.label_a, cmp.label_b
    conf = f"{cmp.bootstrap.confidence:.0%}"
    out = [
        f"# tau2 comparison: {a} vs {b}",
        "",
        f"- A = {a}: `{cmp.path_a}`",
        f"- B = {b}: `{cmp.path_b}`",
        f"- split `{cmp.split}` of {', '.join(cmp.domains)}; {cmp.max_k} trials per task",
        "- A − B over the tasks both runs evaluated with at least k valid trials, paired by task id. "
        f"Intervals: {conf} {cmp.interval_method}; {cmp.bootstrap.resamples} resamples, seed "
        f"{cmp.bootstrap.seed}. `*`: the interval excludes 0.",
    ]
    one_sided = [f"{g.name}: {g.only_a} in A only, {g.only_b} in B only" for g in cmp.domains.values()
                 if g.only_a or g.only_b]
    if one_sided:
        out.append("- tasks with valid trials in one run only (left out): " + "; ".join(one_sided))
    if cmp.differing_settings:
        out.append("- settings that differ (was A's, now B's): " + "; ".join(cmp.differing_settings))
    for title, attr, symbol in (("pass^k (all k trials succeed)", "pass_hat_k", "^"),
                                ("pass@k (at least one of k trials succeeds)", "pass_at_k", "@")):
        out += ["", f"### {title}: {a} − {b}", ""]
        out += _difference_table(cmp, [(g.name, getattr(g, attr)) for g in cmp.groups()], symbol, conf)
        if attr == "pass_hat_k":
            out += ["", *_trusted_comparison(cmp, conf)]
    return "\n".join(out) + "\n"


def _difference_table(cmp: Comparison, groups: list[tuple[str, dict[int, PairedDifference]]], symbol: str,
                      conf: str) -> list[str]:
    """One row per group and k: A, B and A − B [interval], `*` when the interval excludes 0."""
    a, b = cmp.label_a, cmp.label_b
    rows = [[name, f"pass{symbol}{k}", str(p.tasks), format_interval(p.a), format_interval(p.b),
             format_interval(p.difference, p.interval, sign=True) + (" *" if p.excludes_zero else "")]
            for name, by_k in groups for k, p in by_k.items()]
    return markdown_table(["domain", "metric", "tasks", a, b, f"{a} − {b} [{conf} interval]"], rows)


def _trusted_comparison(cmp: Comparison, conf: str) -> list[str]:
    """The trusted pass^k's table and each run's stall share, or why there are none."""
    a, b = cmp.label_a, cmp.label_b
    if any(g.trusted_pass_hat_k is None for g in cmp.groups()):
        return [UNRECORDED_TRUST]
    out = [f"### pass^k on the trusted tasks (those a do-nothing or half-done agent fails): {a} − {b}", ""]
    out += _difference_table(cmp, [(g.name, g.trusted_pass_hat_k or {}) for g in cmp.groups()], "^", conf)
    out += ["", "### Share of the successes on tasks a do-nothing agent passes", ""]
    out += markdown_table(["domain", a, b], [
        [g.name, format_share(g.stall_share_a), format_share(g.stall_share_b)] for g in cmp.groups()])
    return out


# ---------------------------------------------------------------- charts


def _offsets(count: int, spread_width: float = 0.3) -> list[float]:
    return [0.0] if count == 1 else [spread_width * (i / (count - 1) - 0.5) for i in range(count)]


def write_aggregate_chart(agg: Aggregate, path: Path) -> None:
    """pass^k against k, mean with ± sd bars, one series per domain and a dashed one for all tasks."""
    ks = np.arange(1, agg.max_k + 1)
    fig, (ax,) = new_figure(6.4, 4.2)
    groups = agg.groups()
    for g, dx in zip(groups, _offsets(len(groups), 0.2), strict=True):
        means = [np.nan if g.pass_hat_k[k].mean is None else g.pass_hat_k[k].mean for k in ks]
        sds = [g.pass_hat_k[k].sd or 0.0 for k in ks]
        style = {"color": "black", "linestyle": "--"} if g.name == OVERALL else {}
        ax.errorbar(ks + dx, means, yerr=sds, marker="o", capsize=3,
                    label="all tasks" if g.name == OVERALL else g.name, **style)
    ax.set(xlabel="k", ylabel="pass^k", ylim=(0.0, 1.02), xticks=ks,
           title=f"pass^k over {len(agg.runs)} runs (mean ± sd)")
    ax.grid(alpha=0.3)
    ax.legend()
    save_png(fig, path)


def write_comparison_chart(cmp: Comparison, path: Path) -> None:
    """A − B against k with interval bars, one series per domain and one for all tasks; pass^k and pass@k
    side by side."""
    ks = np.arange(1, cmp.max_k + 1)
    fig, axes = new_figure(10.0, 4.2, panels=2)
    groups = cmp.groups()
    for ax, attr, symbol in ((axes[0], "pass_hat_k", "^"), (axes[1], "pass_at_k", "@")):
        for g, dx in zip(groups, _offsets(len(groups)), strict=True):
            points = [getattr(g, attr)[k] for k in ks]
            diff = np.array([np.nan if p.difference is None else p.difference for p in points])
            low = np.array([np.nan if p.interval is None else p.interval.low for p in points])
            high = np.array([np.nan if p.interval is None else p.interval.high for p in points])
            style = {"color": "black", "marker": "s"} if g.name == OVERALL else {"marker": "o"}
            ax.errorbar(ks + dx, diff, yerr=np.nan_to_num([diff - low, high - diff]), linestyle="none",
                        capsize=3, label="all tasks" if g.name == OVERALL else g.name, **style)
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set(xlabel="k", ylabel=f"pass{symbol}k: {cmp.label_a} − {cmp.label_b}", xticks=ks,
               title=f"pass{symbol}k difference")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"{cmp.label_a} − {cmp.label_b}: paired {cmp.bootstrap.confidence:.0%} bootstrap intervals")
    save_png(fig, path)


# ---------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m examples.tau2.eval.compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    agg = sub.add_parser("aggregate", help="mean ± sd over several runs of one configuration")
    agg.add_argument("runs", nargs="+", type=Path, metavar="EVAL_DIR")
    agg.add_argument("--allow-different-settings", action="store_true",
                     help="aggregate runs whose models or episode settings differ (listed in the output)")
    agg.add_argument("--output-dir", type=Path, help=f"write {', '.join(AGGREGATE_FILES)} here")
    cmp = sub.add_parser("compare", help="A vs B per domain with a paired bootstrap interval")
    cmp.add_argument("a", type=Path, metavar="A_DIR")
    cmp.add_argument("b", type=Path, metavar="B_DIR")
    cmp.add_argument("--labels", nargs=2, metavar=("A", "B"),
                     help="names of A and B (default: their policy models, else their directory names)")
    cmp.add_argument("--resamples", type=int, default=BootstrapConfig.resamples,
                     help="bootstrap resamples (default %(default)s)")
    cmp.add_argument("--confidence", type=float, default=BootstrapConfig.confidence,
                     help="confidence level (default %(default)s)")
    cmp.add_argument("--seed", type=int, default=BootstrapConfig.seed,
                     help="bootstrap seed (default %(default)s)")
    cmp.add_argument("--output-dir", type=Path, help=f"write {', '.join(COMPARE_FILES)} here")
    agg.set_defaults(subparser=agg)
    cmp.set_defaults(subparser=cmp)
    return p


def run_command(args: argparse.Namespace) -> str:
    """Do what the parsed command line asks; returns the Markdown. Raises ValueError on bad input."""
    if args.command == "aggregate":
        agg = aggregate([load_run(p) for p in args.runs], args.allow_different_settings)
        markdown, result, chart = format_aggregate(agg), agg.to_json(), write_aggregate_chart
        names, obj = AGGREGATE_FILES, agg
    else:
        bootstrap = BootstrapConfig(resamples=args.resamples, confidence=args.confidence, seed=args.seed)
        cmp = compare(load_run(args.a), load_run(args.b), bootstrap, args.labels)
        markdown, result, chart = format_comparison(cmp), cmp.to_json(), write_comparison_chart
        names, obj = COMPARE_FILES, cmp
    if args.output_dir is not None:
        if args.output_dir.exists() and not args.output_dir.is_dir():
            raise ValueError(f"--output-dir {args.output_dir} is not a directory")
        args.output_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(args.output_dir / names[0], markdown)
        dump_json(args.output_dir / names[1], result)
        chart(obj, args.output_dir / names[2])  # type: ignore[arg-type]
    return markdown


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        markdown = run_command(args)
    except ValueError as e:
        args.subparser.error(str(e))
    sys.stdout.write(markdown)
    if args.output_dir is not None:
        files = AGGREGATE_FILES if args.command == "aggregate" else COMPARE_FILES
        print(f"\nwrote {', '.join(files)} in {args.output_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
