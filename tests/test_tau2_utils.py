"""Config validation, reward shaping, atomic writes, the runtime set-up (tau2 log routing)."""

from __future__ import annotations

import dataclasses

import pytest

from examples.tau2.tau2_utils import (
    EpisodeResult,
    RewardBaseline,
    TaskRef,
    Tau2EnvConfig,
    Termination,
    shape_reward,
)

OK = dict(user_base_url="http://127.0.0.1:1/v1", user_model="u")


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
