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
    with pytest.raises(ValueError, match="is not a loguru level"):
        setup_runtime("LOUD")
    setup_runtime("ERROR")
