"""What a run leaves behind or collides with: a dead controller's workers (the reaper stops them), a live
run of the same seed (refused, named), and temporary files outside its folders (none left)."""

from __future__ import annotations

import getpass
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest

from examples.tau2.lifecycle import reaper
from examples.tau2.lifecycle.reaper import discard_on_exit, own_temp_dir, share_temp_dir
from examples.tau2.lifecycle.validate import survey
from tests.tau2_train_support import clean_overrides, load

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# Leftover workers


def _sleeper(*args: str) -> subprocess.Popen:
    """A process whose command line reads like an AReaL worker's, with a child of its own."""
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)")
    return subprocess.Popen([sys.executable, "-c", code, *args])


@pytest.mark.slow
def test_the_reaper_stops_the_workers_of_a_killed_controller(tmp_path):
    """What `kill -9` of AReaL's controller leaves: workers that live on. The reaper (started by the
    controller, in its own session, deaf to SIGTERM) stops them and their children; other trials' workers
    stay."""
    root = str(tmp_path / "root")
    ours = _sleeper("-m", "areal.infra.rpc.rpc_server", "--experiment-name", "e", "--trial-name", "t",
                    "--fileroot", root)
    theirs = _sleeper("-m", "areal.infra.rpc.rpc_server", "--experiment-name", "e", "--trial-name", "other",
                      "--fileroot", root)
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    procs = [ours, theirs, controller]
    try:
        deadline = time.monotonic() + 30
        while len(psutil.Process(ours.pid).children()) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        child = psutil.Process(ours.pid).children()[0]
        watcher = subprocess.Popen(
            [sys.executable, "-m", "examples.tau2.lifecycle.reaper", "reap", "--pid", str(controller.pid),
             "--create-time", repr(psutil.Process(controller.pid).create_time()), "--experiment-name", "e",
             "--trial-name", "t", "--fileroot", root], cwd=REPO, stdout=subprocess.PIPE, text=True)
        procs.append(watcher)
        time.sleep(3)  # the reaper is up and polling
        assert ours.poll() is None
        # `kill` of a process group, or SLURM cancelling a controller's job, reaches the reaper too
        watcher.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert watcher.poll() is None
        controller.kill()
        out, _ = watcher.communicate(timeout=60)
        assert ours.wait(timeout=60) is not None and not child.is_running()
        # the reaper stopped them (not the end of their own 120 s lives, past the waits above)
        assert theirs.poll() is None and "stopped 2 process(es) of e/t" in out, out
    finally:
        for p in procs:
            if p.poll() is None:
                for c in psutil.Process(p.pid).children(recursive=True):
                    c.kill()
                p.kill()
                p.wait()


def test_the_controller_stops_its_reaper_on_the_way_out(tmp_path):
    config = load(f"cluster.fileroot={tmp_path}").config
    with reaper.reaper_running(config) as watcher:
        assert watcher is not None
        time.sleep(1)
        assert watcher.poll() is None
    assert watcher.returncode == 0  # STOP_REAPER: a quiet exit, nothing reaped


# ---------------------------------------------------------------------------------------------
# Live runs: a second run with the seed of a live one on this machine is refused, naming it


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    folder = tmp_path / "live-runs"
    monkeypatch.setenv(reaper.LIVE_RUNS_DIR_ENV, str(folder))
    return folder


@pytest.fixture
def other_controller() -> Iterator[psutil.Process]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield psutil.Process(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def record(folder, proc: psutil.Process, seed: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    run = reaper.LiveRun(pid=proc.pid, create_time=proc.create_time(), seed=seed, experiment_name="exp",
                         trial_name="first", fileroot="/tmp/first")
    (folder / f"{proc.pid}.json").write_text(json.dumps(asdict(run)))


def test_a_live_run_of_the_same_seed_is_named(runs_dir, other_controller, tmp_path, endpoint):
    record(runs_dir, other_controller, seed=1)
    loaded = load(*clean_overrides(tmp_path, endpoint.url), "seed=1")
    config = loaded.config
    message = reaper.seed_collision(config)
    assert message.startswith("seed=1: the run exp/first (pid ")
    assert "files in /tmp/first" in message and "seed=2" in message
    assert message in survey(loaded).problems  # the pre-flight check refuses it, before anything starts
    assert reaper.seed_collision(load(*clean_overrides(tmp_path, endpoint.url), "seed=7").config) == ""
    # SLURM workers run on the cluster's nodes: the controller's machine says nothing about their ports
    config.scheduler.type = "slurm"
    assert reaper.seed_collision(config) == ""


def test_a_dead_runs_record_is_ignored_and_removed(runs_dir, other_controller, tmp_path, endpoint):
    record(runs_dir, other_controller, seed=1)
    other_controller.kill()
    other_controller.wait()
    config = load(*clean_overrides(tmp_path, endpoint.url), "seed=1").config
    assert reaper.seed_collision(config) == ""
    assert list(runs_dir.iterdir()) == []


def test_a_run_is_recorded_while_it_runs(runs_dir, tmp_path, endpoint):
    config = load(*clean_overrides(tmp_path, endpoint.url), "seed=3").config
    with reaper.registered(config):
        [run] = reaper.live_runs()
        assert (run.seed, run.trial_name, run.fileroot) == (3, config.trial_name, config.cluster.fileroot)
        assert reaper.seed_collision(config) == ""  # itself
    assert reaper.live_runs() == [] and list(runs_dir.iterdir()) == []


def test_each_pytest_process_records_its_own_runs():
    """Under pytest-xdist the workers inherit the controller's environment: each must replace the folder,
    or a smoke run on one worker fails another worker's pre-flight check of the same seed."""
    from tests.conftest import LIVE_RUNS_DIR

    assert os.environ[reaper.LIVE_RUNS_DIR_ENV] == LIVE_RUNS_DIR
    assert reaper.live_runs_dir() == Path(LIVE_RUNS_DIR)


# ---------------------------------------------------------------------------------------------
# Temporary files: no SwanLab run in `~/.cache/swanlab`, no `vllm_dist_*` file, no `tmp*wandb-*` folder


def test_own_temp_dir_takes_the_temporary_files_a_killed_child_leaves(tmp_path, monkeypatch):
    """What W&B's import and vLLM's rendezvous leave when their process ends without clean-up: gone with the
    block's folder, as is a folder named for removal; the system's temporary folder is as before."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the system's temporary folder, here
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    discarded = tmp_path.parent / f"{tmp_path.name}-swanlab-run"
    discarded.mkdir()
    child = ("import os, tempfile; media = tempfile.TemporaryDirectory('wandb-media'); "
             "open(os.path.join(tempfile.gettempdir(), 'vllm_dist_x'), 'w').close(); os._exit(0)")
    with own_temp_dir() as folder:
        share_temp_dir()
        subprocess.run([sys.executable, "-c", child], check=True, timeout=120)
        tempfile.mkdtemp("wandb-artifacts")  # this process's, left to the block
        discard_on_exit(discarded)
        assert folder.parent == tmp_path and len(list(folder.iterdir())) == 3
        assert os.environ["TMPDIR"] == str(folder) and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(
            tmp_path / f"torchinductor_{getpass.getuser()}")
    assert list(tmp_path.iterdir()) == [] and not discarded.exists()
    assert "TMPDIR" not in os.environ and tempfile.gettempdir() == str(tmp_path)
    with own_temp_dir() as folder:  # children on other machines (SLURM): this process's files only
        assert "TMPDIR" not in os.environ and tempfile.gettempdir() == str(folder)
        share_temp_dir()  # a local run's
        assert os.environ["TMPDIR"] == str(folder)
    assert "TMPDIR" not in os.environ and not folder.exists()

