"""The CI-sized smoke run end to end, with faults: `kill -9` of the controller and a rerun that resumes
and then passes every check of a smoke run, and the vLLM server dying under the trainer. Both run
AReaL's whole loop; see TRAINING.md "When things fail" for what they measured.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from examples.tau2.compat.areal_cpu import vllm_python
from examples.tau2.cpu.smoke import SUMMARY_FILE
from tests.cpu.smoke_support import CI_OVERRIDES, check_passing_run, format_result_for_log

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 1200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(root: Path, *overrides: str, user_port: int | None = None) -> list[str]:
    return [sys.executable, "-m", "examples.tau2.cpu.smoke", f"cluster.fileroot={root}",
            f"cluster.name_resolve.nfs_record_root={root}/name_resolve",
            f"econfig.user_base_url=http://127.0.0.1:{user_port or _free_port()}/v1", *CI_OVERRIDES,
            *overrides]


def _ours(root: Path) -> list[psutil.Process]:
    """Every process whose command line names the run's directory (workers, shells, the reaper)."""
    return [p for p in psutil.process_iter(["cmdline"]) if str(root) in " ".join(p.info["cmdline"] or [])]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _kill_all(proc: subprocess.Popen, root: Path) -> None:
    """Whatever is left of a run: its process group, and anything naming its directory (and children)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for p in _ours(root):
        with contextlib.suppress(psutil.Error):
            for q in [*p.children(recursive=True), p]:
                with contextlib.suppress(psutil.Error):
                    q.kill()


def _wait_for(predicate, proc: subprocess.Popen, log: Path, timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"the run ended (rc {proc.returncode}) before {what}:\n{log.read_text()[-5000:]}")
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"no {what} within {timeout_s:.0f} s:\n{log.read_text()[-5000:]}")
        time.sleep(0.2)
    return time.monotonic() - start


def _stats_steps(root: Path) -> list[int]:
    stats = next(root.glob("logs/**/stats.jsonl"), None)
    if stats is None:
        return []
    return [json.loads(line)["global_step"] for line in stats.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 300)
def test_a_run_killed_mid_step_resumes_and_passes_every_smoke_check(tmp_path):
    """The controller is SIGKILLed (alone: not its process group) while step 2 rolls out, right after step
    1's state is saved. Its workers do not die with it; the reaper stops them. The same command then
    resumes at step 2, logs each step's stats once, and the run as a whole passes every check a smoke run
    promises (step 1 trained from a fresh start, step 2 from the resumed state)."""
    assert vllm_python()
    cmd = _command(tmp_path)
    info = tmp_path / "checkpoints"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    with first_log.open("w") as out:
        first = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        waited = _wait_for(lambda: any(info.glob("*/*/*/recover_info/step_info.json")), first, first_log,
                           RUN_TIMEOUT_S, "saved state of step 1")
        workers = [p for p in psutil.Process(first.pid).children(recursive=True)
                   if "examples.tau2.training.recover" not in " ".join(_cmdline(p))]
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        killed_at = time.monotonic()
        alive_after_kill = [p for p in workers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        deadline = killed_at + 60
        while _ours(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        reaped_s = time.monotonic() - killed_at
        leftover = [p.info["cmdline"] for p in _ours(tmp_path)]
        print(f"kill -9 after {waited:.0f} s; {len(workers)} worker processes, {len(alive_after_kill)} alive "
              f"right after the kill, all gone {reaped_s:.1f} s later")
        assert workers and not leftover, leftover
        assert _stats_steps(tmp_path) == [0]  # step 1's stats are committed before its state is saved

        start = time.monotonic()
        with second_log.open("w") as out:
            second = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        try:
            second.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail("the resumed run did not finish:\n" + second_log.read_text()[-5000:])
        finally:
            _kill_all(second, tmp_path)
        resumed_s = time.monotonic() - start
        print(f"resumed run: {resumed_s:.0f} s")
    finally:
        _kill_all(first, tmp_path)
    out = second_log.read_text()
    assert second.returncode == 0, out[-8000:]
    assert "Recovering from StepInfo(epoch=0, epoch_step=1, global_step=1" in out, out[-5000:]
    assert re.search(r"resuming: the state saved after step 1 is in .*; training continues at step 2", out)
    assert _stats_steps(tmp_path) == [0, 1]  # each step once: step 1 from the killed run, step 2 resumed
    summary = json.loads(next(tmp_path.glob(f"logs/**/{SUMMARY_FILE}")).read_text())
    print(format_result_for_log(summary, resumed_s))
    assert summary["steps"] == 2
    check_passing_run(summary, tmp_path)
    dumps = tmp_path / "tau2_dumps"
    stems = {p.with_suffix("") for p in dumps.rglob("*") if p.is_file()}
    assert all(s.with_suffix(".json").is_file() and s.with_suffix(".txt").is_file() for s in stems)
    assert not list(dumps.rglob("*.tmp"))
    assert not _ours(tmp_path)


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


USER_OUTAGE_S = 30


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_user_simulator_outage_then_vllm_server_death(tmp_path):
    """One run, two faults. (1) The user simulator is gone for USER_OUTAGE_S after step 1: the episodes
    that need it are rejected (`user_endpoint`, logged and counted), the step waits and completes once it
    is back. (2) The vLLM server (its whole process tree) is killed during step 3: the watchdog stops the
    run with a message naming the server, and nothing is left running."""
    assert vllm_python()
    port = _free_port()
    user = _start_user_simulator(port)
    cmd = _command(tmp_path, "total_train_steps=3", "++smoke.serve_user_simulator=false", user_port=port)
    log = tmp_path / "run.log"
    with log.open("w") as out:
        run = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server_tree: list[psutil.Process] = []
    try:
        _wait_for(lambda: len(_stats_steps(tmp_path)) >= 1, run, log, RUN_TIMEOUT_S, "step 1")
        user.kill()
        user.wait()
        down = time.monotonic()
        time.sleep(USER_OUTAGE_S)
        user = _start_user_simulator(port)
        waited = _wait_for(lambda: len(_stats_steps(tmp_path)) >= 2, run, log, RUN_TIMEOUT_S, "step 2")
        step2_s = time.monotonic() - down
        rejected = len(re.findall(r"^tau2 \S+ rejected \(user_endpoint\)", log.read_text(), re.M))
        print(f"user simulator down {USER_OUTAGE_S} s: {rejected} episodes rejected (user_endpoint); step 2 "
              f"committed {step2_s:.0f} s after the outage began ({waited:.0f} s after it ended)")
        assert rejected > 0
        stats = json.loads(next(tmp_path.glob("logs/**/stats.jsonl")).read_text().splitlines()[1])
        assert stats.get("rollout/tau2/rejected/user_endpoint", 0) > 0, sorted(stats)

        server = next(p for p in psutil.Process(run.pid).children(recursive=True)
                      if "examples.tau2.compat.vllm_cpu_server" in " ".join(_cmdline(p)))
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
        assert run.returncode != 0 and len(_stats_steps(tmp_path)) == 2
        assert re.search(r"the inference server at \S+ has refused connections for \d+ s \(it died\); rerun "
                         "the same command to resume", out), out[-5000:]
        assert stopped_s < 240
        deadline = time.monotonic() + 30
        while _ours(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _ours(tmp_path)
        assert not [p for p in server_tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        _kill_all(run, tmp_path)
        user.kill()
        user.wait()
        for p in server_tree:
            with contextlib.suppress(psutil.Error):
                p.kill()
