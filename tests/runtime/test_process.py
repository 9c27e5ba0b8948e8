"""A command leaves with its own exit code and error, at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


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
