"""The CI-sized smoke run end to end on this machine (the local scheduler), with faults: the user simulator
gone for a while, then the vLLM server dying under the trainer; then the same command again, which resumes
and passes every check of a smoke run (asynchronous: the resumed run's proxies label its tokens with the
recovered version, as the version check proves token by token). It runs AReaL's whole loop; see TRAINING.md
"When things fail" for what it measured. `kill -9` of the controller and the rerun that resumes, through
SLURM: tests/slurm/test_smoke_on_slurm.py; the local scheduler's reaper has its own test
(tests/lifecycle/test_reaper.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from examples.tau2.cpu.smoke import SUMMARY_FILE
from examples.tau2.cpu.smoke_config import vllm_python
from examples.tau2.cpu.tiny_model import default_cache_dir
from tests.cpu.smoke_support import (
    REPO,
    RUN_TIMEOUT_S,
    check_passing_run,
    cmdline,
    format_result_for_log,
    free_port,
    kill_all,
    processes_of,
    smoke_command,
    stats_rows,
    stats_steps,
    wait_for,
)


def _start_user_simulator(port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "examples.tau2.cpu.scripted_endpoint", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "the user simulator did not start"
            time.sleep(0.2)


USER_REJECTED = re.compile(r"^tau2 \S+ rejected \(user_endpoint\)", re.M)
PROXIES_UP = re.compile(r"RolloutController INFO: Proxy workers: \[")  # AReaL's last start-up line


@pytest.mark.memory(gib=10)  # a whole smoke run (tests/conftest.py)
@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 300)
def test_user_simulator_outage_then_vllm_server_death_then_the_rerun_resumes_and_passes(tmp_path):
    """One run, two faults. (1) The user simulator is gone as step 1's episodes begin, until episodes that
    need it are rejected (`user_endpoint`, logged and counted): the step waits and completes once it is
    back. (2) The vLLM server (its whole process tree) is killed as the next step begins: the watchdog
    stops the run with a message naming the server, and nothing is left running. No evaluation rollout
    (no validation set). With a home and a temporary folder of its own, even stopped so, it leaves nothing
    there (AReaL's trainer and stats logger, its workers, the vLLM server) but torch's compile cache.
    (3) The same command again resumes after the saved step, trains the rest asynchronously and passes
    every check; each step once, the resumed steps' tokens of the recovered version and after (AReaL 1.0.4's
    proxies would label them 0: the version check fails on such a label)."""
    assert vllm_python()
    port = free_port()
    user = _start_user_simulator(port)
    cmd = smoke_command(tmp_path, "total_train_steps=3", "++smoke.serve_user_simulator=false",
                        f"smoke.cache_dir={default_cache_dir()}", user_port=port)  # the suite's policy
    log, home = tmp_path / "run.log", tmp_path / "home"
    home.mkdir()
    # short: vLLM's sockets go in the run's folder inside it, and a socket's path takes at most 107 bytes
    temp = Path(tempfile.mkdtemp(prefix="tau2-lt-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR")}
    with log.open("w") as out:
        run = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                               env={**env, "HOME": str(home), "TMPDIR": str(temp)})
    server_tree: list[psutil.Process] = []
    try:
        wait_for(lambda: PROXIES_UP.search(log.read_text()), run, log, RUN_TIMEOUT_S, "the proxy servers")
        user.kill()
        user.wait()
        down = time.monotonic()
        wait_for(lambda: USER_REJECTED.search(log.read_text()), run, log, RUN_TIMEOUT_S,
                 "an episode rejected for the missing user simulator")
        outage_s = time.monotonic() - down
        step = len(stats_steps(tmp_path)) + 1  # step 1, unless it ended before the outage reached it
        user = _start_user_simulator(port)
        waited = wait_for(lambda: len(stats_steps(tmp_path)) >= step, run, log, RUN_TIMEOUT_S, f"step {step}")
        step_s = time.monotonic() - down
        rejected = len(USER_REJECTED.findall(log.read_text()))
        print(f"user simulator down {outage_s:.0f} s: {rejected} episodes rejected (user_endpoint); step "
              f"{step} committed {step_s:.0f} s after the outage began ({waited:.0f} s after it ended)")
        stats = stats_rows(tmp_path)[step - 1]
        assert rejected > 0 and stats.get("rollout/tau2/rejected/user_endpoint", 0) > 0, sorted(stats)

        server = next(p for p in psutil.Process(run.pid).children(recursive=True)
                      if "examples.tau2.cpu.vllm_cpu_server" in " ".join(cmdline(p)))
        server_tree = [server, *server.children(recursive=True)]
        for p in server_tree:
            p.kill()
        killed = time.monotonic()
        try:
            run.wait(timeout=600)
        except subprocess.TimeoutExpired:
            pytest.fail("the run did not stop after its vLLM server died:\n" + log.read_text()[-5000:])
        stopped_s = time.monotonic() - killed
        out = log.read_text()
        print(f"vLLM server killed: the run exited with {run.returncode} after {stopped_s:.0f} s")
        assert run.returncode != 0 and len(stats_steps(tmp_path)) == step
        assert "eval-rollout" not in out  # no validation set: no evaluation workers or proxies
        assert re.search(r"the inference server at \S+ has refused connections for \d+ s \(it died\); rerun "
                         "the same command to resume", out), out[-5000:]  # the watchdog, not a timeout
        deadline = time.monotonic() + 30
        while processes_of(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not processes_of(tmp_path)
        assert not [p for p in server_tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        left = {str(p.relative_to(temp)) for p in temp.rglob("*")}
        left = {p for p in left if not p.startswith("torchinductor_")}
        left |= {f"~/{p.relative_to(home)}" for p in home.rglob("*") if str(p.relative_to(home)).startswith(
            ".cache/swanlab/run-")}
        assert left == set(), sorted(left)[:20]

        with log.open("a") as out:
            rerun = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, timeout=RUN_TIMEOUT_S,
                                   env={**env, "HOME": str(home), "TMPDIR": str(temp)})
        out = log.read_text()
        assert rerun.returncode == 0 and "tau2 CPU smoke run: PASSED" in out, out[-6000:]
        assert stats_steps(tmp_path) == [0, 1, 2]  # each step once
        summary = json.loads(next(tmp_path.glob(f"logs/**/{SUMMARY_FILE}")).read_text())
        print(format_result_for_log(summary))
        check_passing_run(summary, tmp_path)
        resumed = summary["training"]["steps"][step:]
        assert resumed and all(min(map(int, s["versions"])) >= s["version"] - 1 for s in resumed), resumed
    finally:
        kill_all(run, tmp_path)  # first: a run still alive could write into its folder again
        shutil.rmtree(temp, ignore_errors=True)
        user.kill()
        user.wait()
        for p in server_tree:
            with contextlib.suppress(psutil.Error):
                p.kill()
