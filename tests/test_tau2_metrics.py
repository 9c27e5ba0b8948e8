"""pass^k / pass@k and episode statistics, against hand-computed values and brute-force enumeration."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from examples.tau2.tau2_metrics import (
    SUCCESS_THRESHOLD,
    TrialRecord,
    compute_report,
    final_trials,
    format_markdown,
    is_success,
    pass_at_k,
    pass_hat_k,
)


def scored(domain: str, task: str, trial: int, reward: float, **kw) -> TrialRecord:
    kw.setdefault("termination", "user_stop")
    return TrialRecord(domain=domain, task_id=task, trial=trial, seed=trial, tau2_reward=reward,
                       reward=kw.pop("shaped", reward), **kw)


def rejected(domain: str, task: str, trial: int, reason: str = "policy_endpoint") -> TrialRecord:
    return TrialRecord(domain=domain, task_id=task, trial=trial, seed=trial, rejection=reason,
                       rejection_detail="HTTP 500")


def test_estimators_equal_enumeration_over_all_k_subsets():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 8)
        outcomes = [rng.random() < 0.5 for _ in range(n)]
        c = sum(outcomes)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            assert pass_hat_k(n, c, k) == pytest.approx(sum(all(s) for s in subsets) / len(subsets))
            assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


@pytest.mark.parametrize("n,c,k", [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_estimators_reject_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="need 0 <= c <= n"):
        pass_hat_k(n, c, k)
    with pytest.raises(ValueError, match="need 0 <= c <= n"):
        pass_at_k(n, c, k)


def test_success_threshold_tolerates_round_off_only():
    assert SUCCESS_THRESHOLD == 1.0 - 1e-6
    assert is_success(1.0) and is_success(1.0 - 1e-7)
    assert not is_success(1.0 - 1e-5) and not is_success(0.5)


def test_hand_computed_report_with_three_tasks():
    # a: 3/3 successes, b: 1/3, c: 0/3 (one of c's trials has partial reward 0.5: still a failure).
    records = [scored("airline", "a", t, 1.0) for t in range(3)]
    records += [scored("airline", "b", t, r) for t, r in enumerate([1.0, 0.0, 0.0])]
    records += [scored("airline", "c", t, r) for t, r in enumerate([0.5, 0.0, 0.0])]
    g = compute_report(records, max_k=3).domains["airline"]
    assert g.pass_hat_k == pytest.approx({1: 4 / 9, 2: 1 / 3, 3: 1 / 3})
    assert g.pass_at_k == pytest.approx({1: 4 / 9, 2: (1 + 2 / 3) / 3, 3: 2 / 3})
    assert g.tasks_at_k == {1: 3, 2: 3, 3: 3}
    assert (g.num_tasks, g.num_valid_trials, g.num_successes, g.num_rejected_trials) == (3, 9, 4, 0)
    assert g.success_rate == pytest.approx(4 / 9)
    assert g.mean_tau2_reward == pytest.approx(4.5 / 9)


def test_rejected_trials_are_excluded_and_tasks_with_fewer_trials_use_their_own_n():
    records = [
        # task a: trial 1 rejected, then retried and scored; trial 2 rejected twice -> n=2, c=2
        scored("retail", "a", 0, 1.0), rejected("retail", "a", 1), scored("retail", "a", 1, 1.0),
        rejected("retail", "a", 2), rejected("retail", "a", 2, "timeout"),
        # task b: all three valid, one success -> n=3, c=1
        scored("retail", "b", 0, 0.0), scored("retail", "b", 1, 1.0), scored("retail", "b", 2, 0.0),
        # task c: never scored
        rejected("retail", "c", 0, "user_endpoint"),
    ]
    g = compute_report(records, max_k=3).domains["retail"]
    assert g.num_tasks == 3 and g.tasks_without_valid_trial == 1
    assert g.num_valid_trials == 5 and g.num_rejected_trials == 2  # a#2 and c#0
    assert g.rejected_attempts == {"policy_endpoint": 2, "timeout": 1, "user_endpoint": 1}
    assert g.tasks_at_k == {1: 2, 2: 2, 3: 1}
    assert g.pass_hat_k == pytest.approx({1: (1 + 1 / 3) / 2, 2: (1 + 0) / 2, 3: 0.0})
    assert g.pass_at_k == pytest.approx({1: (1 + 1 / 3) / 2, 2: (1 + 2 / 3) / 2, 3: 1.0})
    assert g.success_rate == pytest.approx(3 / 5)  # rejected trials are not failures


def test_a_value_with_no_eligible_task_is_none_not_zero():
    g = compute_report([scored("mock", "a", 0, 1.0), rejected("mock", "a", 1)], max_k=2).overall
    assert g.pass_hat_k == {1: 1.0, 2: None} and g.pass_at_k == {1: 1.0, 2: None}
    assert g.tasks_at_k == {1: 1, 2: 0}


def test_scored_record_wins_over_rejections_in_any_order():
    late_reject = [scored("mock", "a", 0, 1.0), rejected("mock", "a", 0)]
    assert final_trials(late_reject)[("mock", "a", 0)].scored
    assert not final_trials([rejected("mock", "a", 0), rejected("mock", "a", 0, "timeout")])[
        ("mock", "a", 0)].scored


def test_overall_weighs_tasks_and_domain_mean_weighs_domains():
    records = [scored("airline", "a", 0, 1.0)]  # airline: 1 task, pass^1 = 1
    records += [scored("retail", str(i), 0, 0.0) for i in range(3)]  # retail: 3 tasks, pass^1 = 0
    report = compute_report(records, max_k=1)
    assert report.overall.pass_hat_k[1] == pytest.approx(0.25)
    assert report.domain_mean_pass_hat_k[1] == pytest.approx(0.5)
    assert report.overall.num_tasks == 4


def test_episode_statistics():
    records = [
        scored("telecom", "a", 0, 1.0, shaped=0.9, num_agent_turns=4, num_tool_calls=2,
               reward_breakdown={"DB": 1.0, "COMMUNICATE": 1.0}),
        scored("telecom", "a", 1, 0.0, shaped=-0.1, termination="max_steps", num_agent_turns=10,
               num_tool_calls=6, reward_breakdown={"DB": 0.0, "ENV_ASSERTION": 1.0}),
        scored("telecom", "b", 0, 0.0, termination="invalid_output", num_agent_turns=1),
        rejected("telecom", "b", 1),
    ]
    g = compute_report(records, max_k=2).domains["telecom"]
    assert g.terminations == {"invalid_output": 1, "max_steps": 1, "user_stop": 1}
    assert g.mean_agent_turns == pytest.approx(5.0) and g.mean_tool_calls == pytest.approx(8 / 3)
    assert g.mean_reward == pytest.approx(0.8 / 3) and g.mean_tau2_reward == pytest.approx(1 / 3)
    comps = {k: (v.mean, v.count) for k, v in g.reward_components.items()}
    assert comps == {"COMMUNICATE": (1.0, 1), "DB": (0.5, 2), "ENV_ASSERTION": (1.0, 1)}


def test_record_needs_exactly_one_of_reward_and_rejection_and_round_trips_json():
    with pytest.raises(ValueError, match="exactly one"):
        TrialRecord(domain="mock", task_id="a", trial=0, seed=0)
    with pytest.raises(ValueError, match="exactly one"):
        TrialRecord(domain="mock", task_id="a", trial=0, seed=0, tau2_reward=1.0, rejection="timeout")
    r = scored("mock", "a", 2, 1.0, reward_breakdown={"DB": 1.0}, dump_path="/x.json")
    assert TrialRecord.from_json(json.loads(json.dumps(r.to_json()))) == r


def test_max_k_must_be_positive():
    with pytest.raises(ValueError, match="max_k"):
        compute_report([], max_k=0)


def test_markdown_shows_every_group_and_marks_values_over_fewer_tasks():
    records = [scored("airline", "a", t, 1.0) for t in range(2)]
    records += [scored("retail", "b", 0, 1.0), rejected("retail", "b", 1), scored("retail", "c", 0, 0.0),
                scored("retail", "c", 1, 0.0)]
    md = format_markdown(compute_report(records, max_k=2))
    lines = md.splitlines()
    assert "| domain | tasks | pass^1 | pass^2 |" in lines
    assert "| airline | 1 | 1.000 | 1.000 |" in lines
    assert "| retail | 2 | 0.500 | 0.000 (1 tasks) |" in lines
    assert "| overall | 3 | 0.667 | 0.500 (2 tasks) |" in lines
    assert "| mean of domains |  | 0.750 | 0.500 |" in lines
    assert any(line.startswith("| retail | 3 | 1 | policy_endpoint: 1 | 0 |") for line in lines)
    assert f">= {SUCCESS_THRESHOLD!r}" in md
