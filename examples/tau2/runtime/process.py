"""The process: its logging set-up (`setup_runtime`, the one explicit set-up: importing the package changes
nothing), and how a command leaves (with its exit code at once, and without leaving a child process behind).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

import yaml

from examples.tau2.tau2_utils import Choice, Tau2LogLevel

_tau2_log_handler: int | None = None
_tau2_log_level: str | None = None


def setup_runtime(tau2_log_level: str = "ERROR") -> None:
    """The process set-up every entry point and `Tau2AgentWorkflow` run first (before importing tau2, whose
    import logs too). Idempotent. tau2 logs through loguru at DEBUG (~800 lines per episode): loguru's
    default handler is replaced by one passing tau2's records only at `tau2_log_level` or above ("OFF":
    none). And `yaml.dump` writes a `Choice` as its string (AReaL records the run's config with it)."""
    global _tau2_log_handler, _tau2_log_level
    yaml.add_multi_representer(Choice, lambda dumper, value: dumper.represent_str(value.value))
    if problem := Tau2LogLevel.problem("tau2_log_level", tau2_log_level):
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
    _tau2_log_handler = loguru_logger.add(  # to the stderr of the moment, as loguru's default handler
        lambda message: sys.stderr.write(message), level="TRACE",
        filter={"": others, "tau2": False if level == "OFF" else level})
    _tau2_log_level = level


def exit_after(main: Callable[[], int]) -> NoReturn:
    """Run a command's `main` and leave with its exit code at once: AReaL can leave non-daemon threads
    behind (e.g. when its start-up fails), which would keep the process alive forever."""
    code = 1
    try:
        code = main()
    except SystemExit as e:  # argparse and sys.exit: what the interpreter would have printed and returned
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:  # os._exit skips the interpreter's own report: print the traceback here
        traceback.print_exc()
    finally:
        hard_exit(code)


def record_stats(values: dict[str, float], prefix: str = "tau2/") -> None:
    """Scalars into AReaL's stats tracker (under rollout/ or eval-rollout/), each key after `prefix`; outside
    an AReaL rollout (evaluation, tests) there is nothing to record into."""
    try:
        from areal.infra import workflow_context
        from areal.utils import stats_tracker

        stats_tracker.get(workflow_context.stat_scope()).scalar(**{prefix + k: v for k, v in values.items()})
    except Exception as e:
        logging.getLogger("tau2_areal").debug("stats not recorded: %s", e)


def hard_exit(code: int) -> NoReturn:
    """Flush stdout and stderr, then leave at once: no atexit handlers, no waiting on leftover threads."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def stop_descendants(log: logging.Logger | None = None, timeout_s: float = 15.0) -> list[int]:
    """Terminate (then kill) every process this one started, directly or not (AReaL's workers, proxies and
    servers: for a run that fails half-way through start-up); returns their pids, logged to `log`."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for c in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            c.terminate()
    _, alive = psutil.wait_procs(children, timeout=timeout_s)
    for c in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            c.kill()
    pids = [c.pid for c in children]
    if pids and log is not None:
        log.info("stopped %d leftover process(es): %s", len(pids), pids)
    return pids


ON_SIGTERM: list[Callable[[], None]] = []
"""Called first on SIGTERM, before a clean-up SLURM may cut short (slurm/controller_job.py notes it)."""


def exit_on_sigterm() -> None:
    """Turn SIGTERM (what `kill` sends, and SLURM to a job it cancels or requeues) into `SystemExit(143)` in
    the main thread, so that the run's clean-up runs as on any other exit."""

    def leave(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
        for hook in ON_SIGTERM:
            try:
                hook()
            except Exception:  # noqa: BLE001 - a note must not keep the run from stopping
                logging.getLogger(__name__).exception("a SIGTERM hook failed")
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)
