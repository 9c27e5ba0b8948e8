"""One side of the cross-grading: export a tau2 release's ground truth, or grade ground truths with it.

Runs inside one interpreter with one tau2 (both releases are the package `tau2`, so they never meet in
a process); `releases.cross_grade` starts it once per release and passes JSON between them.

- `export`: per task, what a perfect agent does according to this release (the task's gold actions,
  in order, and the facts it must tell the user).
- `grade`: per task and per ground truth, that behaviour replayed in this release's world (the task
  check's replay, then one message with the facts) and scored by this release's evaluator, component
  by component of its reward basis: `env` (DB and environment assertions), `action`, `communicate`, and
  `nl_assertion` reported as `null` (it needs an LLM judge). Would this release reward an agent that
  does exactly what the other release calls correct?

    python -m examples.tau2.releases.gold export --domain airline --split base --out gold.json
    python -m examples.tau2.releases.gold grade --domain airline --gold a.json b.json --out grades.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from examples.tau2.compat.tau2_judge import needs_judge
from examples.tau2.compat.tau2_release import installed_release
from examples.tau2.episode import task_check
from examples.tau2.episode.record import communicate_info, gold_calls
from examples.tau2.runtime.process import setup_runtime

Gold = dict[str, Any]
"""{"calls": [{"requestor", "name", "arguments"}], "say": [facts]} for one task."""


def _tasks(domain: str, split: str, only: list[str] | None = None) -> list[Any]:
    """The split's tasks in tau2's order (`only`: just these of them)."""
    from examples.tau2.episode import domain as tau2_domain

    return [tau2_domain.get_task(domain, t) for t in tau2_domain.task_ids(domain, split)
            if only is None or t in only]


def export(domain: str, split: str, only: list[str] | None = None) -> dict[str, Gold]:
    return {task.id: {"calls": [{"requestor": a.requestor, "name": a.name, "arguments": a.arguments}
                                for a in gold_calls(task)],
                      "say": communicate_info(task)}
            for task in _tasks(domain, split, only)}


def grade_one(domain: str, task: Any, gold: Gold) -> dict[str, float | None]:
    """An agent that does exactly `gold` (the task check's replay, its tool results from this release, then
    one message with the facts), scored by this release's evaluator per component of the reward basis."""
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.data_model.tasks import RewardType
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    replayed = task_check.replay(domain, task, [SimpleNamespace(**call) for call in gold["calls"]])
    messages = [*replayed.messages, task_check.say(" ".join(gold["say"]) or "Done.")]
    simulation = SimulationRun(id=f"gold-{task.id}", task_id=task.id, start_time="", end_time="",
                               duration=0.0, termination_reason=TerminationReason.AGENT_STOP,
                               messages=messages)
    basis = set(task.evaluation_criteria.reward_basis) if task.evaluation_criteria else set()
    kinds = {"env": ({RewardType.DB, RewardType.ENV_ASSERTION}, EvaluationType.ENV),
             "action": ({RewardType.ACTION}, EvaluationType.ACTION),
             "communicate": ({RewardType.COMMUNICATE}, EvaluationType.COMMUNICATE)}
    components: dict[str, float | None] = {
        name: float(evaluate_simulation(simulation, task, kind, False, domain).reward)
        for name, (types, kind) in kinds.items() if basis & types}
    if needs_judge(task):  # NL assertions in the basis (tau2 1.0.x only): graded by an LLM, not here
        components["nl_assertion"] = None
    return components


def grade(domain: str, split: str, golds: dict[str, dict[str, Gold]]) -> dict[str, dict[str, Any]]:
    """Source release -> task id -> components (or "missing" when this release lacks the task)."""
    tasks = {t.id: t for t in _tasks(domain, split)}
    return {source: {tid: grade_one(domain, tasks[tid], g) if tid in tasks else "missing"
                     for tid, g in by_task.items()}
            for source, by_task in golds.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["export", "grade"])
    parser.add_argument("--domain", required=True)
    parser.add_argument("--split", default="base")
    parser.add_argument("--tasks", nargs="*", default=None, help="export: only these task ids of the split")
    parser.add_argument("--gold", type=Path, nargs="*", default=[], help="grade: files written by export")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    setup_runtime("ERROR")
    result: dict[str, Any] = {"release": installed_release().label, "domain": args.domain,
                              "split": args.split}
    if args.command == "export":
        result["gold"] = export(args.domain, args.split, args.tasks)
    else:
        exported = [json.loads(path.read_text()) for path in args.gold]
        result["grades"] = grade(args.domain, args.split, {e["release"]: e["gold"] for e in exported})
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
