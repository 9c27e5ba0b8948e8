"""The comparison behind the cached-against-stock equivalence tests (`equivalence.py`): an exception is a
result only where both sides raise the same on-purpose tau2 error, and equal outcomes must also be the
ones tau2 fixes on its own."""

from __future__ import annotations

import pytest
from tau2.data_model.simulation import RewardInfo

from examples.tau2.compat import tau2_cache, tau2_judge
from examples.tau2.episode import domain as tau2_domain
from tests.compat.equivalence import assert_meaningful, assert_same_as_stock, compare, is_on_purpose, simulate


def _reward(value: float) -> RewardInfo:
    return RewardInfo(reward=value, reward_breakdown={"DB": value})


def _replay_mismatch(stamp: str) -> ValueError:
    """As tau2's `Environment.set_state` words it, with the tool message's own timestamp."""
    return ValueError(f"Tool call:\nid='c0' name='get_reservation_details'\n\nReturned:\ntimestamp: {stamp} "
                      "content='{}'\n\nExpected:\ncontent='{\"id\": \"XEHM4C\"}'")


@pytest.mark.parametrize("cached,stock", [(ValueError("boom"), _reward(1.0)),
                                          (_reward(0.0), ValueError("boom")),
                                          (_replay_mismatch("a"), _reward(1.0))])
def test_one_side_raising_fails_and_shows_both(cached, stock):
    with pytest.raises(AssertionError, match=r"(?s)only one side raised: cached (raised|returned reward) .*; "
                                             r"stock (raised|returned reward) "):
        compare(cached, stock)


def test_both_raising_the_same_on_purpose_tau2_error_is_a_result():
    outcome = compare(_replay_mismatch("2025-01-01T00:00:00"), _replay_mismatch("2025-01-01T00:00:09"))
    assert isinstance(outcome, str) and outcome.startswith("ValueError: Tool call:\n")
    assert "timestamp: ..." in outcome
    missing = ValueError("Task task_2 not found")
    assert compare(missing, ValueError("Task task_2 not found")) == "ValueError: Task task_2 not found"
    no_judge = tau2_judge.NoJudge("tau2 asked its NL-assertion judge (gpt-4.1) for a verdict, but no judge "
                                  "is set for this episode")
    assert compare(no_judge, tau2_judge.NoJudge(str(no_judge))).startswith("NoJudge: tau2 asked")


@pytest.mark.parametrize("error", [RuntimeError("evaluator broke"), KeyError("reward_basis"),
                                   ValueError("Unknown evaluation type: all"),
                                   tau2_judge.BadVerdict("Tool call:\nnot a verdict")])
def test_both_raising_an_error_tau2_does_not_raise_on_purpose_fails(error):
    assert not is_on_purpose(error)
    with pytest.raises(AssertionError, match="both raised an error tau2 does not raise on purpose"):
        compare(error, type(error)(*error.args))


def test_both_raising_different_errors_fails():
    with pytest.raises(AssertionError, match="the two sides raised differently"):
        compare(_replay_mismatch("a"), ValueError("Tool call:\nanother call"))
    with pytest.raises(AssertionError, match="the two sides raised differently"):
        compare(tau2_judge.NoJudge("tau2 asked its NL-assertion judge (m) x"),
                RuntimeError("tau2 asked its NL-assertion judge (m) x"))


def test_rewards_must_agree_in_every_field():
    same = compare(_reward(1.0), _reward(1.0))
    assert isinstance(same, RewardInfo) and same.reward == 1.0
    with pytest.raises(AssertionError, match=r"cached returned reward 1.0 .*; stock returned reward 0.0"):
        compare(_reward(1.0), _reward(0.0))
    with pytest.raises(AssertionError):
        compare(_reward(1.0), RewardInfo(reward=1.0, reward_breakdown={"DB": 1.0}, info={"env": "other"}))


GOOD = {"1/ground_truth": 1.0, "1/drop_last": 0.0, "1/max_steps": 0.0,
        "2/ground_truth": 1.0, "2/alter_last": 1.0, "2/max_steps": 0.0}


def test_meaningful_outcomes_pass():
    assert_meaningful(GOOD)


@pytest.mark.parametrize("rewards,message", [
    ({k: "RuntimeError: evaluator broke" for k in GOOD}, "raised instead of being scored"),
    ({**GOOD, "2/drop_last": "ValueError: Tool call:\n..."}, "raised instead of being scored"),
    ({k: 1.0 for k in GOOD}, "cut short at max steps that passed"),
    ({k: 0.0 for k in GOOD}, "ground truths that did not pass"),
    ({**GOOD, "2/ground_truth": 0.0}, "ground truths that did not pass"),
    ({k: v for k, v in GOOD.items() if not k.endswith("ground_truth")}, "no ground-truth variant"),
    ({"1/ground_truth": 1.0, "1/repeat_last": 1.0}, "not both outcomes"),
], ids=["all-raised", "one-raised", "all-pass", "all-fail", "one-ground-truth-fails", "no-ground-truth",
        "only-passes"])
def test_outcomes_an_evaluator_broken_on_both_sides_would_give_fail(rewards, message):
    with pytest.raises(AssertionError, match=message):
        assert_meaningful(rewards)


def _raise(*args: object, **kwargs: object) -> RewardInfo:
    raise RuntimeError("evaluator broke")


def test_scoring_a_trajectory_fails_when_the_evaluator_breaks_on_either_side_or_both(monkeypatch):
    task = tau2_domain.get_task("mock", "create_task_1")
    sim = simulate("mock", task, list(task.evaluation_criteria.actions))
    assert assert_same_as_stock("mock", task, sim).reward == 1.0
    with monkeypatch.context() as patch:
        patch.setattr(tau2_cache, "evaluate_all", _raise)  # the cached side only
        with pytest.raises(AssertionError, match="only one side raised: cached raised RuntimeError: "
                                                 "evaluator broke; stock returned reward 1.0"):
            assert_same_as_stock("mock", task, sim)
    monkeypatch.setattr(tau2_domain, "evaluate", _raise)
    with pytest.raises(AssertionError, match="both raised an error tau2 does not raise on purpose"):
        assert_same_as_stock("mock", task, sim)
