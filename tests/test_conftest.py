"""The suite's scheduler (`conftest.GroupsFirstScheduling`), driven by pytest-xdist's own scheduling code
with three stand-in workers: every group of tests that start AReaL's processes goes whole to one worker,
before any other test, and every test is sent exactly once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import (
    AREAL_PROCESS_GROUPS,
    GroupsFirstScheduling,
    areal_group_of_node,
    pytest_xdist_make_scheduler,
)

COLLECTION = [
    "tests/compat/test_tau2_cache.py::test_a",
    "tests/cpu/test_smoke_faults.py::test_outage[vllm]",
    "tests/cpu/test_smoke_faults.py::test_outage[user]",
    "tests/eval/test_evaluate.py::test_b",
    "tests/slurm/test_scheduler.py::test_c",
    "tests/slurm/test_smoke_on_slurm.py::test_scancel",
    "tests/slurm/test_smoke_on_slurm.py::test_a_run_that_fails_at_start_is_requeued_twice_then_stops_with_the_cause",
    "tests/test_proxy_integration.py::test_d",
    "tests/test_tau2_agent.py::test_e[a@b]",
    "tests/test_tau2_train.py::test_f",
    "tests/lifecycle/test_recover.py::test_g",
    "tests/lifecycle/test_reaper.py::test_the_reaper_stops_the_workers_of_a_killed_controller",
    "tests/lifecycle/test_reaper.py::test_h",
]


class Worker:
    """What the scheduler uses of pytest-xdist's `WorkerController`: it records the tests sent to it."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[list[int]] = []
        self.shutting_down = False

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(list(indexes))

    def shutdown(self) -> None:
        self.shutting_down = True

    def pending(self, done: set[int]) -> list[int]:
        return [i for unit in self.sent for i in unit if i not in done]


def config(dist: str, reorder: bool = True) -> SimpleNamespace:
    """What the scheduler reads of pytest's config: `-n 3`, `--dist` and `--[no-]loadscope-reorder`."""
    return SimpleNamespace(getvalue={"tx": ["3*popen"], "dist": dist}.get,
                           option=SimpleNamespace(loadscopereorder=reorder))


def group_indexes(group: str) -> list[int]:
    return [i for i, nodeid in enumerate(COLLECTION) if areal_group_of_node(nodeid) == group]


def test_a_group_is_named_by_the_test_s_own_entry_or_its_module_s():
    killed = COLLECTION[11]
    assert areal_group_of_node(killed) == "areal-processes" == AREAL_PROCESS_GROUPS[killed]
    assert areal_group_of_node("tests/lifecycle/test_reaper.py::test_h") is None
    assert areal_group_of_node(COLLECTION[6]) == areal_group_of_node(COLLECTION[5]) == "areal-slurm"
    assert areal_group_of_node("tests/cpu/test_smoke_faults.py::test_outage[vllm]") == "areal-processes"
    assert areal_group_of_node("tests/cpu/test_smoke_faults.pyc::test_x") is None
    assert areal_group_of_node("tests/eval/test_evaluate.py::test_b") is None


@pytest.mark.parametrize("reorder", [True, False], ids=["reorder", "no-reorder"])
def test_each_group_goes_whole_to_one_worker_first_and_every_test_runs_once(reorder):
    scheduler = pytest_xdist_make_scheduler(config("loadgroup", reorder), None)  # type: ignore[arg-type]
    assert isinstance(scheduler, GroupsFirstScheduling)
    workers = [Worker("gw0"), Worker("gw1"), Worker("gw2")]
    for worker in workers:
        scheduler.add_node(worker)  # type: ignore[arg-type]
    for worker in workers:
        scheduler.add_node_collection(worker, COLLECTION)  # type: ignore[arg-type]
    scheduler.schedule()
    groups = [group_indexes(g) for g in ("areal-processes", "areal-slurm")]
    assert [len(g) for g in groups] == [6, 2]
    assert [w.sent[0] for w in workers[:2]] == groups  # the third worker starts on the other tests
    assert not any(i in group for group in groups for i in workers[2].sent[0])

    done: set[int] = set()
    while not all(w.shutting_down for w in workers):  # each worker finishes its tests one at a time
        for worker in workers:
            if pending := worker.pending(done):
                done.add(pending[0])
                scheduler.mark_test_complete(worker, pending[0])  # type: ignore[arg-type]
    sent = [i for w in workers for unit in w.sent for i in unit]
    assert sorted(sent) == list(range(len(COLLECTION)))
    for group in groups:
        assert sum(any(i in group for unit in w.sent for i in unit) for w in workers) == 1


def test_other_dist_modes_keep_pytest_xdist_s_scheduler():
    assert pytest_xdist_make_scheduler(config("load"), None) is None  # type: ignore[arg-type]


def test_the_suite_runs_without_pytest_xdist():
    """The scheduler hook is optional: `-p no:xdist` (one plain process) still collects and runs tests."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
                          "tests/test_tau2_utils.py", "-k", "shape_reward"],
                         cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert " passed" in out.stdout
