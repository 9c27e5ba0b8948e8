"""The oracle check of a domain of one's own (docs/own_domain.md): `eval --oracle --domain-modules M` with no
`--domains` plays M's domains; a task whose ground truth τ² cannot pass makes it exit 1 naming the task and
the criterion; a rerun into the same folder reruns an edited task and resumes the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples.tau2.episode.record import failed_checks
from examples.tau2.eval.evaluate import build_parser, main, plan_from_args
from examples.tau2.eval.inputs import task_keys
from tests.episode.domain_support import TASKS, task, write_domain

REPO = Path(__file__).resolve().parents[2]
POLICY = ["--policy-base-url", "http://127.0.0.1:9/v1", "--policy-model", "m", "--user-base-url",
          "http://127.0.0.1:9/v1", "--user-model", "u"]


def said(info: str) -> dict:
    """Task 4 of the garage: reserve A1 and tell the user `info` (reward basis DB and COMMUNICATE)."""
    t = task("4", [("reserve_spot", {"spot_id": "A1", "plate": "P-7"})], ("DB", "COMMUNICATE"))
    t["evaluation_criteria"]["communicate_info"] = [info]
    return t


def trials(out: Path, name: str = "trials.jsonl") -> list[dict]:
    return [json.loads(line) for line in (out / name).read_text().splitlines()]


def test_an_edited_task_runs_again_and_a_failing_one_is_named(tmp_path, monkeypatch):
    folder = tmp_path / "mod"
    write_domain(folder, "garage_oracle", "garage_oracle", tasks=[*TASKS, said("spot A1")],
                 splits={"test": ["1", "2", "3", "4"]})
    monkeypatch.syspath_prepend(str(folder))
    out = tmp_path / "oracle"
    argv = ["--oracle", "--domain-modules", "garage_oracle", "--trials", "2", "--output-dir", str(out)]
    assert main(argv) == 0
    assert json.loads((out / "run.json").read_text())["settings"]["domains"] == ["garage_oracle"]
    first = trials(out)
    assert len(first) == 8 and {r["tau2_reward"] for r in first} == {1.0}

    # τ² drops commas from the agent's messages before it looks for the info: this task cannot pass.
    (folder / "garage_oracle_tasks.json").write_text(json.dumps([*TASKS, said("spot A1, level 0")]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(REPO)])}
    rerun = subprocess.run([sys.executable, "-m", "examples.tau2.eval.evaluate", *argv], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 1, rerun.stderr[-3000:]
    assert "scored below 1.0 on 1 of 4 tasks" in rerun.stderr
    assert ("garage_oracle task '4' (0.000, trial 0): COMMUNICATE: communicate_info 'spot A1, level 0' "
            "not found in an agent message") in rerun.stderr
    second = trials(out)
    assert [r for r in second if r["task_id"] != "4"] == [r for r in first if r["task_id"] != "4"]
    assert [(r["task_id"], r["tau2_reward"]) for r in second if r["task_id"] == "4"] == [("4", 0.0)] * 2
    assert trials(out, "trials.superseded.jsonl") == [r for r in first if r["task_id"] == "4"]
    assert all(len(list((out / d / "garage_oracle" / "4").glob("*.json"))) == 2
               for d in ("dumps", "dumps.superseded"))
    assert json.loads((out / "results.json").read_text())["report"]["overall"]["success_rate"] == 0.75


def test_domain_modules_without_domains_plan_the_modules_domains(tmp_path, monkeypatch):
    write_domain(tmp_path, "garage_planned", "garage_planned")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = build_parser().parse_args([*POLICY, "--domain-modules", "garage_planned", "--output-dir",
                                      str(tmp_path / "out")])
    assert plan_from_args(args).tasks == {"garage_planned": ["3"]}


def test_a_domains_code_or_data_is_in_every_task_key(tmp_path, monkeypatch):
    """Editing the module's code or the database changes every task's key (so every trial runs again)."""
    module = write_domain(tmp_path, "garage_keyed", "garage_keyed")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = build_parser().parse_args([*POLICY, "--domain-modules", "garage_keyed", "--split", "train",
                                      "--output-dir", str(tmp_path / "out")])
    plan = plan_from_args(args)
    assert plan.inputs == task_keys(plan.tasks, plan.settings())
    assert len(set(plan.inputs["garage_keyed"].values())) == 2
    module.write_text(module.read_text() + "\n# edited\n")
    edited = task_keys(plan.tasks, plan.settings())["garage_keyed"]
    (tmp_path / "garage_keyed_db.json").write_text(json.dumps({"spots": {}}))
    emptied = task_keys(plan.tasks, plan.settings())["garage_keyed"]
    for before, after in [(plan.inputs["garage_keyed"], edited), (edited, emptied)]:
        assert all(before[t] != after[t] for t in before)


@pytest.mark.parametrize(("reward_info", "expected"), [
    ({"reward_basis": ["DB", "ACTION"], "db_check": {"db_match": False},
      "action_checks": [{"action": {"name": "reserve", "arguments": {"spot": "A1"}}, "action_match": False},
                        {"action": {"name": "free_spots", "arguments": {}}, "action_match": True}]},
     ["DB: db_match false (the end state differs from the ground truth's)",
      "ACTION: reserve(spot='A1') missing"]),
    ({"reward_basis": ["ENV_ASSERTION", "NL_ASSERTION"],
      "env_assertions": [{"env_assertion": {"func_name": "has_plate", "arguments": {"plate": "P-7"},
                                            "assert_value": True}, "met": False}],
      "nl_assertions": [{"nl_assertion": "The agent apologises.", "met": False}]},
     ["ENV_ASSERTION: has_plate(plate='P-7') is not True", "NL_ASSERTION: 'The agent apologises.' not met"]),
    ({"reward_basis": None, "info": {"note": "Simulation terminated prematurely"}},
     ["Simulation terminated prematurely"]),
])
def test_failed_checks_name_each_broken_criterion(reward_info, expected):
    assert failed_checks(reward_info) == expected
