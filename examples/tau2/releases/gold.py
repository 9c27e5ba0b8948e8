"""One side of the cross-grading: export a tau2 release's ground truth, or grade ground truths with it.

Runs inside one interpreter with one tau2 (both releases are the package `tau2`, so they never meet in
a process); `releases.cross_grade` starts it once per release and passes JSON between them.

- `export`: per task, what a perfect agent does according to this release (the task's gold actions,
  in order, and the facts it must tell the user).
- `grade`: per task and per ground truth, a run of that behaviour in this release's world (the gold
  actions executed as tool calls by this release's environment, from the task's initial state, then
  one message with the facts) scored by this release's evaluator, component by component. The task
  definition and environment are the grader's own, so the question answered is: would this release
  reward an agent that does exactly what the other release calls correct?

Components follow the grader's reward basis: `env` (DB and environment assertions), `action`,
`communicate`. An NL-assertion component (in the basis, with assertions to check) needs an LLM judge and
is reported as `null` (not graded).

    python -m examples.tau2.releases.gold export --domain airline --split base --out gold.json
    python -m examples.tau2.releases.gold grade --domain airline --gold a.json b.json --out grades.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from examples.tau2.runtime.process import setup_runtime

Gold = dict[str, Any]
"""{"calls": [{"requestor", "name", "arguments"}], "say": [facts]} for one task."""


def release_label() -> str:
    from examples.tau2.compat.tau2_release import installed_release

    return installed_release().label


def _tasks(domain: str, split: str, only: list[str] | None = None) -> list[Any]:
    """The split's tasks in tau2's order (`only`: just these of them)."""
    from tau2.registry import registry

    by_id = {t.id: t for t in registry.get_tasks_loader(domain)(None)}
    ids = registry.get_task_splits_loader(domain)()[split]
    return [by_id[i] for i in ids if only is None or i in only]


def export(domain: str, split: str, only: list[str] | None = None) -> dict[str, Gold]:
    out: dict[str, Gold] = {}
    for task in _tasks(domain, split, only):
        criteria = task.evaluation_criteria
        actions = (criteria.actions or []) if criteria else []
        out[task.id] = {
            "calls": [{"requestor": a.requestor, "name": a.name, "arguments": a.arguments} for a in actions],
            "say": [str(s) for s in ((criteria.communicate_info or []) if criteria else [])],
        }
    return out


def gold_messages(domain: str, task: Any, gold: Gold) -> list[Any]:
    """The conversation of an agent that does exactly `gold`, its tool results from this release."""
    from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage
    from tau2.registry import registry

    env = registry.get_env_constructor(domain)()
    initial = task.initial_state
    env.set_state(initialization_data=initial.initialization_data if initial else None,
                  initialization_actions=initial.initialization_actions if initial else None,
                  message_history=[])
    messages: list[Any] = [AssistantMessage(role="assistant", content="Hi! How can I help you today?"),
                           UserMessage(role="user", content="I need help with my request.")]
    for i, call in enumerate(gold["calls"]):
        tool_call = ToolCall(id=f"call_{i}", name=call["name"], arguments=call["arguments"],
                             requestor=call["requestor"])
        speaker = AssistantMessage if call["requestor"] == "assistant" else UserMessage
        messages += [speaker(role=call["requestor"], tool_calls=[tool_call]), env.get_response(tool_call)]
    messages.append(AssistantMessage(role="assistant", content=" ".join(gold["say"]) or "Done."))
    return messages


def grade_one(domain: str, task: Any, gold: Gold) -> dict[str, float | None]:
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.data_model.tasks import RewardType
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    simulation = SimulationRun(id=f"gold-{task.id}", task_id=task.id, start_time="", end_time="",
                               duration=0.0, termination_reason=TerminationReason.AGENT_STOP,
                               messages=gold_messages(domain, task, gold))
    basis = set(task.evaluation_criteria.reward_basis) if task.evaluation_criteria else set()
    wanted = {"env": bool(basis & {RewardType.DB, RewardType.ENV_ASSERTION}),
              "action": RewardType.ACTION in basis, "communicate": RewardType.COMMUNICATE in basis}
    kinds = {"env": EvaluationType.ENV, "action": EvaluationType.ACTION,
             "communicate": EvaluationType.COMMUNICATE}
    components: dict[str, float | None] = {
        name: float(evaluate_simulation(simulation, task, kinds[name], False, domain).reward)
        for name, on in wanted.items() if on
    }
    nl_assertions = getattr(task.evaluation_criteria, "nl_assertions", None)  # absent in 26.3
    if nl_assertions and any(b.value == "NL_ASSERTION" for b in basis):  # a judge is called only then
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
    if args.command == "export":
        result: dict[str, Any] = {"release": release_label(), "domain": args.domain, "split": args.split,
                                  "gold": export(args.domain, args.split, args.tasks)}
    else:
        golds = {}
        for path in args.gold:
            exported = json.loads(path.read_text())
            golds[exported["release"]] = exported["gold"]
        result = {"release": release_label(), "domain": args.domain, "split": args.split,
                  "grades": grade(args.domain, args.split, golds)}
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
