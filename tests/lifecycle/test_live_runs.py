"""A second run with the seed of a live one on this machine is refused before it starts, naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest

from examples.tau2.lifecycle import live_runs
from examples.tau2.lifecycle.validate import validate
from tests.tau2_train_support import clean_overrides, load


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    folder = tmp_path / "live-runs"
    monkeypatch.setenv(live_runs.LIVE_RUNS_DIR_ENV, str(folder))
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
    run = live_runs.LiveRun(pid=proc.pid, create_time=proc.create_time(), seed=seed, experiment_name="exp",
                            trial_name="first", fileroot="/tmp/first")
    (folder / f"{proc.pid}.json").write_text(json.dumps(asdict(run)))


def test_a_live_run_of_the_same_seed_is_named(runs_dir, other_controller, tmp_path, endpoint):
    record(runs_dir, other_controller, seed=1)
    config = load(*clean_overrides(tmp_path, endpoint.url), "seed=1").config
    message = live_runs.seed_collision(config)
    assert message.startswith("seed=1: the run exp/first (pid ")
    assert "files in /tmp/first" in message and "seed=2" in message
    assert message in validate(config)  # the pre-flight check refuses it, before anything starts
    assert live_runs.seed_collision(load(*clean_overrides(tmp_path, endpoint.url), "seed=7").config) == ""
    # SLURM workers run on the cluster's nodes: the controller's machine says nothing about their ports
    config.scheduler.type = "slurm"
    assert live_runs.seed_collision(config) == ""


def test_a_dead_runs_record_is_ignored_and_removed(runs_dir, other_controller, tmp_path, endpoint):
    record(runs_dir, other_controller, seed=1)
    other_controller.kill()
    other_controller.wait()
    config = load(*clean_overrides(tmp_path, endpoint.url), "seed=1").config
    assert live_runs.seed_collision(config) == ""
    assert list(runs_dir.iterdir()) == []


def test_a_run_is_recorded_while_it_runs(runs_dir, tmp_path, endpoint):
    config = load(*clean_overrides(tmp_path, endpoint.url), "seed=3").config
    with live_runs.registered(config):
        [run] = live_runs.live_runs()
        assert (run.seed, run.trial_name, run.fileroot) == (3, config.trial_name, config.cluster.fileroot)
        assert live_runs.seed_collision(config) == ""  # itself
    assert live_runs.live_runs() == [] and list(runs_dir.iterdir()) == []


def test_each_pytest_process_records_its_own_runs():
    """Under pytest-xdist the workers inherit the controller's environment: each must replace the folder,
    or a smoke run on one worker fails another worker's pre-flight check of the same seed."""
    import os

    from tests.conftest import LIVE_RUNS_DIR

    assert os.environ[live_runs.LIVE_RUNS_DIR_ENV] == LIVE_RUNS_DIR
    assert live_runs.live_runs_dir() == Path(LIVE_RUNS_DIR)
