"""The process: τ²'s loguru quietened on purpose (everyone else's records untouched), and a command leaves
with its own exit code and error, at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from examples.tau2.runtime.process import setup_runtime


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
        from examples.tau2.runtime.process import exit_after
        def main():
            {body}
        exit_after(main)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == code
    assert stderr in done.stderr
    if code == 1 and "Error" in stderr:
        assert "Traceback (most recent call last)" in done.stderr


def test_sigterm_runs_the_commands_clean_up_and_exits_143():
    """`kill`, or SLURM cancelling the controller's job: the `finally` blocks run (workers stopped, jobs
    cancelled), and the status says SIGTERM."""
    script = textwrap.dedent("""
        import os, signal, time
        from examples.tau2.runtime.process import exit_on_sigterm
        exit_on_sigterm()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)
        finally:
            print("cleaned up", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 143 and done.stdout == "cleaned up\n"


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
