"""Config validation, reward shaping, atomic writes, the runtime set-up (tau2 log routing)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

from examples.tau2.tau2_utils import (
    EpisodeResult,
    TaskRef,
    Tau2EnvConfig,
    Termination,
    setup_runtime,
    shape_reward,
    write_atomic,
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
    ({"tau2_log_level": "LOUD"}, "is not a loguru level"),
])
def test_each_invalid_setting_is_named(overrides, message):
    cfg = Tau2EnvConfig(**{**OK, **overrides})  # construction never raises: all problems are listed
    assert any(message in e for e in cfg.validate())
    with pytest.raises(ValueError) as info:
        Tau2EnvConfig.from_kwargs({**OK, **overrides})
    assert message in str(info.value)


def test_unknown_keys_are_named():
    with pytest.raises(ValueError, match="unknown tau2 episode config keys: max_stepz"):
        Tau2EnvConfig.from_kwargs({**OK, "max_stepz": 3})


def test_solo_mode_needs_no_user_endpoint_and_kwargs_round_trip():
    cfg = Tau2EnvConfig(solo_mode=True)
    assert Tau2EnvConfig.from_kwargs(cfg.to_kwargs()) == cfg


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


def test_write_atomic_replaces_whole_file(tmp_path):
    p = tmp_path / "a" / "b.txt"
    write_atomic(p, "one")
    write_atomic(p, "two")
    assert p.read_text() == "two" and [f.name for f in p.parent.iterdir()] == ["b.txt"]
    umask = os.umask(0)
    os.umask(umask)
    assert p.stat().st_mode & 0o777 == 0o666 & ~umask


def test_setup_runtime_filters_tau2_records_only(capfd):
    """tau2's loguru records pass at the chosen level; other loguru users keep loguru's default."""
    from loguru import logger

    tau2_logger = logger.patch(lambda r: r.update(name="tau2.registry"))
    other = logger.patch(lambda r: r.update(name="somebody.else"))
    setup_runtime("WARNING")
    tau2_logger.debug("hidden-debug")
    tau2_logger.warning("shown-warning")
    other.debug("other-debug")
    setup_runtime("OFF")
    tau2_logger.error("hidden-error")
    setup_runtime("OFF")  # idempotent: still one handler
    other.info("other-once")
    err = capfd.readouterr().err
    assert "shown-warning" in err and "hidden-debug" not in err and "hidden-error" not in err
    assert "other-debug" in err and err.count("other-once") == 1
    with pytest.raises(ValueError, match="is not a loguru level"):
        setup_runtime("LOUD")
    setup_runtime("ERROR")


@pytest.mark.parametrize("body,code,stderr", [
    ("return 3", 3, ""),
    ("raise ValueError('bad config: lr')", 1, "ValueError: bad config: lr"),
    ("raise SystemExit('usage: learn ...')", 1, "usage: learn ..."),
    ("raise SystemExit(2)", 2, ""),
    ("raise SystemExit(None)", 0, ""),
])
def test_exit_after_keeps_the_exit_code_and_the_error(body, code, stderr):
    """A command's exception is printed, not swallowed by the immediate exit."""
    script = textwrap.dedent(f"""
        from examples.tau2.tau2_utils import exit_after
        def main():
            {body}
        exit_after(main)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == code
    assert stderr in done.stderr
    if code == 1 and "Error" in stderr:
        assert "Traceback (most recent call last)" in done.stderr
