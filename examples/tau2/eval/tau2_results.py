"""tau2's own results files from an evaluation, so that tau2's tools read them (`tau2 view`,
`tau2 evaluate-trajs`, `tau2 submit prepare|validate|verify-trajs`).

One `tau2.data_model.simulation.Results` per domain, built with tau2's data model and saved with its
`save`: the evaluated tasks, every scored trial as a `SimulationRun` (tau2's messages and `RewardInfo`,
recorded per episode in its dump, `EpisodeResult.tau2_run`) and an `Info` that says how the episodes ran.
Rejected trials have no simulation: they are left out, and `eval.evaluate` names them in `run.json`.
The files are rebuilt from the trials on disk after every session, so a resumed run stays consistent.

`Info` has no field for the release that graded the episodes: tau2 records the git commit of its own
source in `git_commit`, and a packaged tau2 has none, so the release's label goes there instead.
"""

from __future__ import annotations

import datetime
import json
import os
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from examples.tau2.compat.tau2_release import installed_release
from examples.tau2.eval.metrics import TrialRecord, final_trials

if TYPE_CHECKING:
    from tau2.data_model.simulation import Info, Results, SimulationRun

    from examples.tau2.eval.plan import EvalPlan

RESULTS_DIR = "tau2_results"
"""Folder of the output directory holding `<domain>_results.json`."""

_TERMINATIONS = {"context_exceeded": "max_steps", "invalid_output": "agent_error", "truncated": "agent_error"}
"""The project's terminations that tau2 names otherwise (as the workflow ends such episodes)."""


@dataclass(frozen=True)
class LeftOut:
    """A planned trial with no simulation in tau2's files, and why."""

    domain: str
    task_id: str
    trial: int
    reason: str


@dataclass(frozen=True)
class Tau2Files:
    """What was written: domain -> results file, and the trials left out of them."""

    files: dict[str, str]
    left_out: list[LeftOut]

    def to_json(self) -> dict[str, Any]:
        return {"files": self.files, "left_out": [asdict(x) for x in self.left_out]}


def results_path(output_dir: Path, domain: str) -> Path:
    return output_dir / RESULTS_DIR / f"{domain}_results.json"


def simulation_id(domain: str, task_id: str, trial: int, seed: int) -> str:
    """Stable across rebuilds: the same trial keeps its id when the files are written again."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"tau2-eval/{domain}/{task_id}/{trial}/{seed}"))


def simulation_from_dump(dump: dict[str, Any], record: TrialRecord) -> SimulationRun:
    """A scored trial's `SimulationRun`: tau2's own, as the episode recorded it (`tau2_run`), with its
    messages and the trial's index and id. Dumps written before episodes recorded it give one rebuilt
    from the trial record (timing from the dump's file, the reward without per-check details)."""
    from tau2.data_model.simulation import SimulationRun

    fields = dump.get("tau2_run") or _rebuilt_run(dump, record)
    return SimulationRun.model_validate({
        **fields, "id": simulation_id(record.domain, record.task_id, record.trial, record.seed),
        "task_id": record.task_id, "trial": record.trial, "seed": record.seed, "messages": dump["messages"],
    })


def _rebuilt_run(dump: dict[str, Any], record: TrialRecord) -> dict[str, Any]:
    from tau2.data_model.simulation import RewardInfo

    end = datetime.datetime.fromtimestamp(os.path.getmtime(record.dump_path))
    reward = RewardInfo(
        reward=float(record.tau2_reward),  # type: ignore[arg-type]  # scored
        reward_breakdown=dict(record.reward_breakdown) or None,
        nl_assertions=dump.get("nl_assertions") or None,
        info={"note": "rebuilt from the trial record: the episode's dump predates its tau2 reward info"},
    )
    return {
        "start_time": (end - datetime.timedelta(seconds=record.wall_s)).isoformat(),
        "end_time": end.isoformat(), "duration": record.wall_s,
        "termination_reason": _TERMINATIONS.get(record.termination, record.termination),
        "reward_info": reward.model_dump(mode="json"),
    }


def run_info(plan: EvalPlan, domain: str) -> Info:
    """tau2's `Info` for one domain of the evaluation. The agent is tau2's `LLMAgent` (solo:
    `LLMSoloAgent`) with its policy served at `--policy-base-url`, which tau2 names `llm_agent`
    (`llm_agent_solo`); tau2's re-grading reads solo mode from these names."""
    from tau2.data_model.simulation import AgentInfo, Info, UserInfo

    from examples.tau2.episode import domain as tau2_domain

    env = plan.env
    agent_args = {"api_base": plan.policy_base_url, "temperature": env.temperature, "top_p": env.top_p,
                  "max_completion_tokens": env.max_completion_tokens}
    if env.policy_seed:
        agent_args["seed"] = "derived from the trial's seed, the task and the request's index"
    if env.solo_mode:
        user = UserInfo(implementation="dummy_user")
    else:
        user = UserInfo(implementation="user_simulator", llm=env.user_model,
                        llm_args={**env.user_llm_args, "api_base": env.user_base_url})
    return Info(
        git_commit=installed_release().label,
        num_trials=plan.trials, max_steps=env.max_steps, max_errors=env.max_errors,
        user_info=user,
        agent_info=AgentInfo(implementation="llm_agent_solo" if env.solo_mode else "llm_agent",
                             llm=plan.policy_model, llm_args=agent_args),
        environment_info=tau2_domain.make_environment(domain, solo_mode=env.solo_mode).get_info(),
        seed=plan.seed_base,
    )


def build_results(plan: EvalPlan, domain: str,
                  records: Iterable[TrialRecord]) -> tuple[Results, list[LeftOut]]:
    """tau2's `Results` of one domain from its trial records (each trial's final state), and the
    planned trials it leaves out."""
    from tau2.data_model.simulation import Results

    from examples.tau2.episode import domain as tau2_domain

    finals = final_trials(r for r in records if r.domain == domain)
    simulations, left_out = [], []
    for task_id in plan.tasks[domain]:
        for trial in range(plan.trials):
            record = finals.get((domain, task_id, trial))
            if record is None:
                left_out.append(LeftOut(domain, task_id, trial, "not run"))
            elif not record.scored:
                left_out.append(LeftOut(domain, task_id, trial, f"rejected: {record.rejection}"))
            elif not record.dump_path or not Path(record.dump_path).is_file():
                left_out.append(LeftOut(domain, task_id, trial, "its episode dump is missing"))
            else:
                dump = json.loads(Path(record.dump_path).read_text(encoding="utf-8"))
                simulations.append(simulation_from_dump(dump, record))
    results = Results(
        info=run_info(plan, domain),
        tasks=[tau2_domain.get_task(domain, t) for t in plan.tasks[domain]],
        simulations=simulations,
    )
    return results, left_out


def write_results(plan: EvalPlan, records: list[TrialRecord]) -> Tau2Files:
    """Write every domain's results file with tau2's `Results.save` (atomically: a reader never sees a
    half-written file)."""
    files, left_out = {}, []
    for domain in plan.tasks:
        results, missing = build_results(plan, domain, records)
        path = results_path(plan.output_dir, domain)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.tmp")
        results.save(staging)
        os.replace(staging, path)
        files[domain] = str(path)
        left_out += missing
    return Tau2Files(files, left_out)
