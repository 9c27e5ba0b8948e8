"""Logging set-up: τ²'s loguru quietened to a chosen level, and our loggers on the console.

`setup_runtime` is the one explicit process set-up (every entry point and `Tau2AgentWorkflow` call
it); importing the package changes nothing else.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

import yaml

from examples.tau2.tau2_utils import Choice, Tau2LogLevel

_tau2_log_handler: int | None = None
_tau2_log_level: str | None = None


def console_logging(*loggers: logging.Logger) -> None:
    """These loggers' lines on stderr. AReaL's `getLogger` replaces the root logger and its manager,
    so handlers on the root do not reliably reach loggers created before; each gets its own."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    for lg in loggers:
        if not lg.handlers:
            lg.addHandler(handler)
        lg.setLevel(logging.INFO)
        lg.propagate = False


def setup_runtime(tau2_log_level: str = "ERROR") -> None:
    """The process set-up every entry point and `Tau2AgentWorkflow` run first. Idempotent.

    tau2 logs through loguru at DEBUG (~800 lines per episode, ~30 when its registry is imported).
    This replaces loguru's default stderr handler with one that passes tau2's records only at
    `tau2_log_level` or above ("OFF": none) and everything else as before. Entry points call it before
    they import tau2, so that its import-time lines are filtered too. And `yaml.dump` writes a setting's
    `Choice` as its string: AReaL records the run's config with it (else a Python tag per enum value).
    """
    global _tau2_log_handler, _tau2_log_level
    yaml.add_multi_representer(Choice, lambda dumper, value: dumper.represent_str(value.value))
    problem = Tau2LogLevel.problem("tau2_log_level", tau2_log_level)
    if problem:
        raise ValueError(problem)
    level = str(tau2_log_level)
    if level == _tau2_log_level:
        return
    from loguru import logger as loguru_logger

    if _tau2_log_handler is None:
        with contextlib.suppress(ValueError):  # loguru's default handler, unless someone removed it
            loguru_logger.remove(0)
    else:
        loguru_logger.remove(_tau2_log_handler)
    others = os.environ.get("LOGURU_LEVEL", "DEBUG")  # what loguru's default handler passes
    _tau2_log_handler = loguru_logger.add(
        sys.stderr, level="TRACE", filter={"": others, "tau2": False if level == "OFF" else level}
    )
    _tau2_log_level = level
