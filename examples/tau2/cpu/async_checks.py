"""The smoke run's checks of asynchronous training, read from what the run recorded (`smoke.RECORDS_DIR`).

With `rollout.max_head_offpolicyness` > 0 episodes run while the trainer trains and the weights are swapped
under them (`training/rollout_controller.py`). What the run kept: each trained batch (`batches/`, by the
actor: tokens, the rollout's logprobs and version labels, the trainer's recomputed logprobs), each scored
group's episodes (`rows/`, by the rollout workers: the turns each took, its rows, its failed requests) and
each version's weights (`weights/v<N>`; version 0 is the initial policy). From them, per run:

1. Version truth: every trained token's rollout logprob against its logprob recomputed, by Hugging Face
   transformers, under the weights of the version it is labelled with: each ratio within 1 ± tolerance.
   Its power: the tokens of a version that a later one also trains, scored under that later version's
   weights too, and how many of them a wrong label would have failed.
2. Trainer fidelity: the trainer's own recomputed logprob of every token of the version it trains against
   the rollout's (the check a synchronous run makes on every token).
3. Really asynchronous: episodes whose rows carry two versions (it spanned a swap), rows whose tokens do
   (a completion the swap interrupted, resumed under the new weights), batches holding two versions.
4. Staleness: no trained token older than the batch's version minus `max_head_offpolicyness`.
5. Rows are turns taken: each batch is exactly the rows of the groups it trains, each episode's rows exactly
   the completions its agent received (its own record, `Tau2AgentWorkflow.run_turns`).
6. Swaps cost nothing: no policy request of the run failed and no episode was rejected for the policy
   endpoint (a resumed run's: since it started; the killed run's own failures are not the swaps').

A synchronous run (`max_head_offpolicyness` 0) gets 1, 2, 4, 5 and 6; an asynchronous one fails 3 when
nothing of it happened, rather than passing for want of a swap.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from examples.tau2.training.group_workflow import row_digest
from examples.tau2.training.rollout_controller import GroupVersions

BATCHES, ROWS, WEIGHTS = "batches", "rows", "weights"


@dataclass
class VersionTruth:
    """The tokens labelled with one version, against that version's weights."""

    version: int
    tokens: int = 0
    max_gap: float = 0.0
    """max |rollout logprob - recomputed logprob|."""
    later_tokens: int = 0
    """Of them, those a later version's batch trained: also scored under that version's weights."""
    later_fail: int = 0
    """Of those, the ones whose ratio under the later weights is outside the band: what a wrong label
    would show."""


@dataclass
class StepFacts:
    """One trained batch."""

    version: int
    rows: int
    versions: dict[int, int]
    """Version label -> generated tokens of the batch."""
    rows_of_two_versions: int
    on_policy_tokens: int
    trainer_max_gap: float
    """max |trainer - rollout logprob| over the tokens of the batch's own version (nan: none)."""


@dataclass
class AsyncReport:
    """What the records show; `problems` empty means every check held."""

    max_head_offpolicyness: int
    steps: list[StepFacts] = field(default_factory=list)
    versions: list[VersionTruth] = field(default_factory=list)
    episodes: int = 0
    episodes_across_swaps: int = 0
    groups: int = 0
    """Groups scored and kept (not rejected whole); the last ones may be queued, untrained, at the end."""
    groups_trained: int = 0
    rows_trained: int = 0
    rows_matched: int = 0
    policy_failed_attempts: int = 0
    policy_rejections: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def asynchronous(self) -> bool:
        return self.max_head_offpolicyness > 0

    @property
    def interrupted(self) -> int:
        return sum(s.rows_of_two_versions for s in self.steps)

    @property
    def mixed_batches(self) -> int:
        return sum(len(s.versions) > 1 for s in self.steps)

    @property
    def staleness_max(self) -> int:
        return max((s.version - min(s.versions) for s in self.steps if s.versions), default=0)


def load_batches(folder: Path) -> list[dict[str, Any]]:
    return [torch.load(p, weights_only=True) for p in sorted((folder / BATCHES).glob("batch-*.pt"))]


def load_groups(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for p in sorted((folder / ROWS).glob("rows-*.jsonl"))
            for line in p.read_text().splitlines() if line.strip()]


def row_ids(batch: dict[str, Any], i: int) -> list[int]:
    return batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist()


class VersionedPolicies:
    """Each version's weights as a Hugging Face causal LM, loaded once, kept while used."""

    def __init__(self, folder: Path, initial: Path, temperature: float):
        self.folder, self.initial, self.temperature = folder / WEIGHTS, initial, temperature
        self._models: dict[int, Any] = {}

    def path(self, version: int) -> Path:
        return self.initial if version == 0 else self.folder / f"v{version}"

    def model(self, version: int) -> Any:
        if version not in self._models:
            from transformers import AutoModelForCausalLM
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()

            path = self.path(version)
            if not path.is_dir():
                raise FileNotFoundError(f"the weights of version {version} were not kept ({path})")
            self._models = {version: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()}
        return self._models[version]

    @torch.no_grad()
    def logprobs(self, version: int, ids: list[int], positions: list[int]) -> torch.Tensor:
        """log p(ids[p] | ids[:p]) at each of `positions` under `version`'s weights, at the run's
        temperature (vLLM's processed logprobs, what the rollout recorded)."""
        model = self.model(version)
        hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
        logits = model.lm_head(hidden[[p - 1 for p in positions]]).float() / self.temperature
        return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids)[positions].unsqueeze(1))[:, 0]


def check_version_truth(batches: list[dict[str, Any]], policies: VersionedPolicies,
                        tolerance: float) -> tuple[list[VersionTruth], list[str]]:
    """Check 1, with its power: every token under its label's weights, and each token of an older version
    also under the weights of the batch that trains it. Done weights by weights (one model in memory)."""
    low, high = math.log1p(-tolerance), math.log1p(tolerance)  # the band of log ratios
    work: list[tuple[int, int, dict[str, Any], int, list[int]]] = []  # weights, label, batch, row, positions
    for batch in batches:
        generated = batch["loss_mask"].bool()
        for i in range(batch["input_ids"].shape[0]):
            labels = batch["versions"][i]
            for label in sorted(set(labels[generated[i]].tolist())):
                positions = [int(p) for p in torch.nonzero(generated[i] & (labels == label))[:, 0]]
                work.append((int(label), int(label), batch, i, positions))
                if batch["version"] > label and policies.path(batch["version"]).is_dir():
                    work.append((int(batch["version"]), int(label), batch, i, positions))
    truths = {label: VersionTruth(label) for _, label, *_ in work}
    problems = []
    for weights, label, batch, i, positions in sorted(work, key=lambda w: w[0]):
        gap = (policies.logprobs(weights, row_ids(batch, i), positions).double()
               - batch["logprobs"][i, positions].double())
        outside = int(((gap < low) | (gap > high)).sum())
        truth = truths[label]
        if weights == label:
            truth.tokens += len(positions)
            truth.max_gap = max(truth.max_gap, float(gap.abs().max()))
            if outside:
                problems.append(f"{outside} token(s) labelled version {label} in batch {batch['version']} "
                                f"(row {i}) are not of that version's weights (|log ratio| up to "
                                f"{float(gap.abs().max()):.3g})")
        else:
            truth.later_tokens += len(positions)
            truth.later_fail += outside
    return [truths[v] for v in sorted(truths)], problems[:5]


def step_facts(batch: dict[str, Any]) -> StepFacts:
    generated = batch["loss_mask"].bool()
    labels = batch["versions"]
    seen = labels[generated]
    group = GroupVersions.of(labels, batch["loss_mask"])  # the batch's rows, as the controller reads a group
    on = generated.clone()
    on[:, 0] = False
    on &= labels == batch["version"]
    # prox_logp[:, p - 1] is the trainer's logprob of the token at p (AReaL's shifted layout)
    gaps = (batch["prox_logp"][:, :-1] - batch["logprobs"][:, 1:])[on[:, 1:]].double()
    return StepFacts(version=int(batch["version"]), rows=group.rows,
                     versions={int(v): int((seen == v).sum()) for v in seen.unique()},
                     rows_of_two_versions=group.rows_of_two_versions, on_policy_tokens=int(on.sum()),
                     trainer_max_gap=float(gaps.abs().max()) if gaps.numel() else math.nan)


def match_rows(batches: list[dict[str, Any]],
               groups: list[dict[str, Any]]) -> tuple[int, int, int, list[str]]:
    """Check 5: (rows trained, rows matched to the turns their episodes took, groups matched, problems)."""
    kept: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    problems = []
    for group in groups:
        for episode in group["episodes"]:
            ids = [r[0] for r in episode["rows"]]
            if episode["rejected"] is None and group["kept"] and ids != episode["taken"]:
                problems.append(f"group {group['group']}: an episode's rows {ids} are not the turns it took "
                                f"{episode['taken']}")
        if group["kept"]:
            key = tuple(sorted(r[1] for e in group["episodes"] for r in e["rows"]))
            kept.setdefault(key, []).append(group)
    trained = matched = groups_matched = 0
    for batch in batches:
        start = 0
        for size in batch["group_rows"]:
            digests = tuple(sorted(row_digest(row_ids(batch, i)) for i in range(start, start + size)))
            start += size
            trained += size
            if kept.get(digests):
                kept[digests].pop()
                matched += size
                groups_matched += 1
            else:
                problems.append(f"batch {batch['version']}: a group of {size} rows that is no kept group's "
                                "turns")
    return trained, matched, groups_matched, problems[:5]


def check_run(folder: Path, initial_model: Path, *, max_head_offpolicyness: int, temperature: float,
              tolerance: float, since: float = 0.0) -> AsyncReport:
    """Every check of the module docstring on the records in `folder`; check 6 on the groups recorded from
    `since` (epoch seconds) on."""
    report = AsyncReport(max_head_offpolicyness)
    batches, groups = load_batches(folder), load_groups(folder)
    if not batches:
        report.problems.append(f"no trained batch was recorded in {folder / BATCHES}")
        return report
    report.steps = [step_facts(b) for b in batches]
    report.versions, problems = check_version_truth(batches, VersionedPolicies(folder, initial_model,
                                                                              temperature), tolerance)
    report.problems += problems
    band = -math.log1p(-tolerance)
    unfaithful = [f"step {s.version + 1}: {s.trainer_max_gap:.3g}" for s in report.steps
                  if s.on_policy_tokens and not s.trainer_max_gap <= band]
    if unfaithful:
        report.problems.append("the trainer's logprobs of the tokens of the version it trains differ from "
                               f"the rollout's beyond 1 ± {tolerance}: {', '.join(unfaithful)}")
    if not any(s.on_policy_tokens for s in report.steps):
        report.problems.append("no step trained a token of its own version: the trainer's fidelity is "
                               "unchecked")
    if report.staleness_max > max_head_offpolicyness:
        report.problems.append(f"a trained token is {report.staleness_max} versions old, more than "
                               f"rollout.max_head_offpolicyness={max_head_offpolicyness}")
    episodes = [e for g in groups for e in g["episodes"]]
    report.groups = sum(g["kept"] for g in groups)
    report.episodes = sum(e["rejected"] is None for e in episodes)
    report.episodes_across_swaps = sum(len({r[2] for r in e["rows"]} | {r[3] for r in e["rows"]}) > 1
                                       for e in episodes)
    recent = [e for g in groups if g["time"] >= since for e in g["episodes"]]
    report.policy_failed_attempts = sum(e["policy_failed_attempts"] for e in recent)
    report.policy_rejections = Counter(e["rejected"] for e in recent)["policy_endpoint"]
    report.rows_trained, report.rows_matched, report.groups_trained, problems = match_rows(batches, groups)
    report.problems += problems
    if report.policy_failed_attempts or report.policy_rejections:
        report.problems.append(f"{report.policy_failed_attempts} policy request(s) failed and "
                               f"{report.policy_rejections} episode(s) were rejected for the policy endpoint")
    if report.asynchronous:
        seen = (("episode that spans a weight swap", report.episodes_across_swaps),
                ("completion interrupted by a swap and resumed", report.interrupted),
                ("batch training rows of two versions", report.mixed_batches))
        missing = [what for what, n in seen if not n]
        if missing:
            report.problems.append(f"the run was asynchronous in name only: no {', no '.join(missing)}")
    return report


def format_report(r: AsyncReport, tolerance: float) -> list[str]:
    """The report in lines: the mode, then one line per check (the smoke run prints the per-step table)."""
    mode = (f"asynchronous (rollout.max_head_offpolicyness {r.max_head_offpolicyness})" if r.asynchronous
            else "synchronous (rollout.max_head_offpolicyness 0)")
    lines = [f"training: {mode}"]
    for v in r.versions:
        power = (f"; under version >{v.version}'s weights {v.later_fail} of {v.later_tokens} would fail"
                 if v.later_tokens else "")
        lines.append(f"version truth v{v.version}: {v.tokens} tokens, max |log ratio| {v.max_gap:.1e} "
                     f"against their own version's weights{power}")
    lines.append("versions: every token's ratio exp(rollout - recomputed logprob under its labelled "
                 f"version's weights) within 1 ± {tolerance}; staleness max {r.staleness_max} (limit "
                 f"{r.max_head_offpolicyness})")
    lines.append(f"asynchrony: {r.episodes_across_swaps} of {r.episodes} episodes span a swap, "
                 f"{r.interrupted} completions interrupted and resumed, {r.mixed_batches} of {len(r.steps)} "
                 "batches hold two versions")
    lines.append(f"rows: {r.rows_matched} of {r.rows_trained} trained rows are turns their episodes took "
                 f"({r.groups_trained} of {r.groups} kept groups trained, the rest still queued at the end); "
                 "swaps: "
                 f"{r.policy_failed_attempts} policy requests failed, {r.policy_rejections} episodes "
                 "rejected for the policy endpoint")
    return lines
