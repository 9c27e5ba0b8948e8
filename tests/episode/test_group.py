"""episode/group.py: a GRPO group's raw rewards (None: rejected) -> training rewards, drops and stats."""

from __future__ import annotations

import pytest

from examples.tau2.episode.group import (
    MIN_GROUP_EPISODES,
    UNIFORM_TOLERANCE,
    DropReason,
    GroupOutcome,
    GroupRules,
    score_group,
)
from examples.tau2.tau2_utils import Tau2EnvConfig

CENTERED = GroupRules(baseline="group_mean")
FILTERED = GroupRules(drop_uniform=True)


def test_no_baseline_trains_on_the_raw_rewards():
    outcome = score_group([1.0, 0.0, 0.5], GroupRules())
    assert outcome == GroupOutcome((1.0, 0.0, 0.5))
    assert (outcome.kept, outcome.rejected, outcome.dropped) == (3, 0, None)


def test_group_mean_subtracts_the_mean_of_the_groups_own_episodes():
    # Two groups of one step: each is centered on its own mean only.
    assert score_group([1.0, 0.0, 0.5], CENTERED).rewards == pytest.approx((0.5, -0.5, 0.0))
    assert score_group([0.0, 0.0, 0.3], CENTERED).rewards == pytest.approx((-0.1, -0.1, 0.2))


def test_group_mean_leaves_rejected_episodes_out_of_the_mean():
    outcome = score_group([1.0, None, 0.0, None], CENTERED)
    assert outcome.rewards == (0.5, None, -0.5, None)
    assert (outcome.kept, outcome.rejected, outcome.dropped) == (2, 2, None)


def test_a_uniform_group_contributes_nothing_under_group_mean():
    assert score_group([1.0] * 4, CENTERED).rewards == (0.0,) * 4
    assert score_group([-0.1] * 4, CENTERED).rewards == pytest.approx((0.0,) * 4)


@pytest.mark.parametrize("raw", [
    [1.0, None, None, None],   # one episode left: nothing to compare it with
    [None, None],               # all rejected
    [0.3],                      # a group of one
    [],
])
def test_fewer_than_two_finished_episodes_drop_the_group(raw):
    assert MIN_GROUP_EPISODES == GroupRules().min_episodes == 2
    outcome = score_group(raw, CENTERED)
    assert outcome.dropped is DropReason.TOO_FEW
    assert outcome.kept == sum(r is not None for r in raw) and outcome.rejected == raw.count(None)


def test_a_dropped_group_still_gives_each_finished_episode_its_reward():
    """The proxy still receives it before the episode's session is freed; only nothing is trained."""
    assert score_group([1.0, None, None], CENTERED).rewards == (0.0, None, None)
    assert score_group([1.0, None, None], GroupRules()).rewards == (1.0, None, None)
    assert score_group([1.0, 1.0], FILTERED).rewards == (1.0, 1.0)


def test_two_finished_episodes_are_enough():
    outcome = score_group([None, 1.0, None, 0.0], GroupRules())
    assert outcome.dropped is None and outcome.rewards == (None, 1.0, None, 0.0)


def test_a_smaller_minimum_keeps_a_single_episode():
    assert score_group([None, 0.4], GroupRules(min_episodes=1)).dropped is None


@pytest.mark.parametrize(("raw", "dropped"), [
    ([0.0, 0.0, 0.0, 0.0], True),          # every episode failed
    ([1.0, 1.0, 1.0, 1.0], True),          # every episode succeeded
    ([-0.1, -0.1, -0.1], True),            # every episode penalised alike
    ([0.0, None, 0.0, None], True),        # uniform among the finished ones
    ([1.0, 1.0 + UNIFORM_TOLERANCE / 2], True),  # float noise is not signal
    ([1.0, 1.0 + 10 * UNIFORM_TOLERANCE], False),
    ([0.0, 0.0, 1.0, 1.0], False),         # some succeeded: signal
    ([1.0, None, 0.0, None], False),
])
def test_uniform_groups_are_dropped_when_asked(raw, dropped):
    assert score_group(raw, FILTERED).dropped is (DropReason.UNIFORM if dropped else None)
    centered = GroupRules(baseline="group_mean", drop_uniform=True)  # the same groups, on centered rewards
    assert score_group(raw, centered).dropped is (DropReason.UNIFORM if dropped else None)
    assert score_group(raw, GroupRules()).dropped is None  # off: uniform groups train


def test_too_few_is_decided_before_uniform():
    assert score_group([1.0, None], FILTERED).dropped is DropReason.TOO_FEW


def test_stats_name_kept_rejected_and_why_a_group_was_dropped():
    assert score_group([1.0, None, 0.0, 1.0], FILTERED).stats() == {
        "tau2/group/kept_episodes": 3.0, "tau2/group/rejected_episodes": 1.0,
        "tau2/group/dropped": 0.0, "tau2/group/dropped_uniform": 0.0}
    assert score_group([None, 1.0, None, None], FILTERED).stats() == {
        "tau2/group/kept_episodes": 1.0, "tau2/group/rejected_episodes": 3.0,
        "tau2/group/dropped": 1.0, "tau2/group/dropped_uniform": 0.0}
    assert score_group([0.0, None, 0.0, 0.0], FILTERED).stats() == {
        "tau2/group/kept_episodes": 3.0, "tau2/group/rejected_episodes": 1.0,
        "tau2/group/dropped": 0.0, "tau2/group/dropped_uniform": 1.0}


def test_rules_and_the_episode_config_refuse_what_cannot_be_scored():
    with pytest.raises(ValueError, match="min_episodes must be >= 1"):
        GroupRules(min_episodes=0)
    with pytest.raises(ValueError, match="baseline 'mean' is not one of none, group_mean"):
        GroupRules(baseline="mean")  # type: ignore[arg-type]
    assert "reward_baseline 'mean' is not one of none, group_mean" in Tau2EnvConfig(
        user_base_url="u", user_model="m", reward_baseline="mean").validate()
