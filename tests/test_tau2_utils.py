"""Config validation, reward shaping, a GRPO group's raw rewards (None: rejected) -> training rewards."""

from __future__ import annotations

import dataclasses

import pytest

from examples.tau2.tau2_utils import (
    MIN_GROUP_EPISODES,
    UNIFORM_TOLERANCE,
    DropReason,
    EpisodeResult,
    GroupOutcome,
    GroupRules,
    RewardBaseline,
    TaskRef,
    Tau2EnvConfig,
    Termination,
    score_group,
    shape_reward,
    turn_rewards,
)

OK = dict(user_base_url="http://127.0.0.1:1/v1", user_model="u")
CENTERED = GroupRules(baseline="group_mean")
FILTERED = GroupRules(drop_uniform=True)


@pytest.mark.parametrize("overrides,message", [
    ({"max_steps": 0}, "max_steps and max_errors must be positive"),
    ({"user_base_url": ""}, "user_base_url and user_model must be set"),
    ({"partial_credit_alpha": 1.5}, "partial_credit_alpha must be in [0, 1]"),
    ({"invalid_format_penalty": -1}, "invalid_format_penalty must be >= 0"),
    ({"max_completion_tokens": 0}, "max_completion_tokens must be positive"),
    ({"episode_timeout_s": 0}, "episode_timeout_s and request_timeout_s must be positive"),
    ({"llm_retries": -1}, "llm_retries and retry_backoff_s must be >= 0"),
    ({"max_concurrent_episodes": 0}, "max_concurrent_episodes must be positive"),
    ({"tau2_log_level": "LOUD"}, "tau2_log_level 'LOUD' is not one of TRACE, DEBUG, INFO, SUCCESS, WARNING, "
                                 "ERROR, CRITICAL, OFF"),
    ({"reward_baseline": "best"}, "reward_baseline 'best' is not one of none, group_mean"),
])
def test_each_invalid_setting_is_named(overrides, message):
    cfg = Tau2EnvConfig(**{**OK, **overrides})  # the constructor does not validate: validate() lists all
    assert any(message in e for e in cfg.validate())
    with pytest.raises(ValueError) as info:
        Tau2EnvConfig.from_kwargs({**OK, **overrides})
    assert message in str(info.value)


def test_unknown_keys_are_named():
    with pytest.raises(ValueError, match="unknown tau2 episode config keys: max_stepz"):
        Tau2EnvConfig.from_kwargs({**OK, "max_stepz": 3})


def test_solo_mode_needs_no_user_endpoint_and_kwargs_round_trip():
    cfg = Tau2EnvConfig(solo_mode=True, reward_baseline=RewardBaseline.group_mean)
    kwargs = cfg.to_kwargs()
    assert type(kwargs["reward_baseline"]) is str and type(kwargs["tau2_log_level"]) is str  # plain values
    assert Tau2EnvConfig.from_kwargs(kwargs) == cfg


def test_the_checks_of_derived_fields_are_left_to_their_source():
    """Training fills these from another setting, whose own checks name it (lifecycle.validate)."""
    cfg = Tau2EnvConfig(**OK, max_completion_tokens=0)
    assert cfg.validate() == ["max_completion_tokens must be positive"]
    assert cfg.validate(derived=("max_completion_tokens",)) == []


def test_task_ref_validates_rows():
    assert TaskRef.from_data({"domain": "retail", "task_id": 3}) == TaskRef("retail", "3")
    with pytest.raises(ValueError, match="needs 'domain' and 'task_id'"):
        TaskRef.from_data({"task_id": "1"})


@pytest.mark.parametrize("alpha,penalty,invalid,expected", [
    (0.0, 0.0, False, 0.0),
    (0.5, 0.0, False, 0.25),
    (1.0, 0.0, False, 0.5),
    (0.5, 0.2, True, 0.05),
    (0.0, 0.2, True, -0.2),
])
def test_shape_reward(alpha, penalty, invalid, expected):
    got = shape_reward(0.0, {"DB": 0.0, "COMMUNICATE": 1.0}, partial_credit_alpha=alpha,
                       invalid_format_penalty=penalty, had_invalid_output=invalid)
    assert got == pytest.approx(expected) and type(got) is float


def test_metrics_one_hot_termination():
    fields = {f.name: 0 for f in dataclasses.fields(EpisodeResult)}
    fields.update(domain="airline", task_id="1", reward=1.0, tau2_reward=1.0, reward_breakdown={},
                  termination=Termination.USER_STOP, messages=[], note="", dump_path="")
    m = EpisodeResult(**fields).metrics()
    assert m["termination/user_stop"] == 1.0 and m["termination/agent_stop"] == 0.0


def test_no_baseline_trains_on_the_raw_rewards():
    outcome = score_group([1.0, 0.0, 0.5], GroupRules())
    assert outcome == GroupOutcome((1.0, 0.0, 0.5))
    assert (outcome.kept, outcome.rewards.count(None), outcome.dropped) == (3, 0, None)


def test_group_mean_subtracts_the_mean_of_the_groups_own_episodes():
    # Two groups of one step: each is centered on its own mean only.
    assert score_group([1.0, 0.0, 0.5], CENTERED).rewards == pytest.approx((0.5, -0.5, 0.0))
    assert score_group([0.0, 0.0, 0.3], CENTERED).rewards == pytest.approx((-0.1, -0.1, 0.2))


def test_group_mean_leaves_rejected_episodes_out_of_the_mean():
    outcome = score_group([1.0, None, 0.0, None], CENTERED)
    assert outcome.rewards == (0.5, None, -0.5, None)
    assert (outcome.kept, outcome.rewards.count(None), outcome.dropped) == (2, 2, None)


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
    assert MIN_GROUP_EPISODES == 2
    outcome = score_group(raw, CENTERED)
    assert outcome.dropped is DropReason.TOO_FEW
    assert outcome.kept == sum(r is not None for r in raw) and outcome.rewards.count(None) == raw.count(None)


def test_a_dropped_group_still_gives_each_finished_episode_its_reward():
    """The proxy still receives it before the episode's session is freed; only nothing is trained."""
    assert score_group([1.0, None, None], CENTERED).rewards == (0.0, None, None)
    assert score_group([1.0, None, None], GroupRules()).rewards == (1.0, None, None)
    assert score_group([1.0, 1.0], FILTERED).rewards == (1.0, 1.0)


def test_two_finished_episodes_are_enough():
    outcome = score_group([None, 1.0, None, 0.0], GroupRules())
    assert outcome.dropped is None and outcome.rewards == (None, 1.0, None, 0.0)


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



@pytest.mark.parametrize("turns,discount", [(1, 0.5), (3, 0.5), (4, 1.0), (5, 0.9)])
def test_turn_rewards_chain_as_areal_s_cache_does(turns, discount):
    """The rewards AReaL's own `InteractionCache.apply_reward_discount` gives the same turns, bit for bit."""
    from areal.experimental.openai.cache import InteractionCache
    from areal.experimental.openai.types import InteractionWithTokenLogpReward

    cache = InteractionCache()
    for i in range(turns):  # each turn's prompt extends the last: AReaL's parent lookup finds a chain
        cache[f"c{i}"] = InteractionWithTokenLogpReward(messages=[{"role": "user", "content": str(j)}
                                                                   for j in range(i + 1)])
    cache.set_last_reward(0.75)
    expected = [row.reward for row in cache.apply_reward_discount(discount).values()]
    assert turn_rewards(turns, 0.75, discount) == expected
    assert turn_rewards(0, 1.0, 0.5) == []
