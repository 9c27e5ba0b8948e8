"""τ²'s loguru quietened on purpose, everyone else's records untouched."""

from __future__ import annotations

import pytest

from examples.tau2.runtime.logs import setup_runtime


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
    with pytest.raises(ValueError, match="^tau2_log_level 'LOUD' is not one of TRACE, DEBUG, INFO, SUCCESS, "
                                         "WARNING, ERROR, CRITICAL, OFF$"):
        setup_runtime("LOUD")
    setup_runtime("ERROR")


def test_setup_runtime_lets_yaml_write_a_choice_as_its_string():
    """AReaL records the run's config with `yaml.dump`: an enumerated setting reads as the YAML gave it."""
    import yaml

    from examples.tau2.tau2_utils import RewardBaseline, Tau2LogLevel

    setup_runtime("ERROR")
    assert yaml.dump({"reward_baseline": RewardBaseline.group_mean, "levels": {Tau2LogLevel.INFO: 1.0}}) == (
        "levels:\n  INFO: 1.0\nreward_baseline: group_mean\n")
