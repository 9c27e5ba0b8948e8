"""Shared fixtures: one scripted OpenAI-compatible endpoint on 127.0.0.1 per test session (per worker).

Every test starts from an unpredictable `random` state (`fresh_random_state`), as a fresh process does:
AReaL 1.0.4 seeds Python's `random` with `config.seed` before it picks free ports at random, so code that
runs after a seeded test in this process would otherwise pick the ports a trainer it starts is about to
bind. For the same reason two AReaL runs of one config started at once pick the same ports: the tests
that start AReaL's processes (`AREAL_PROCESS_GROUPS`) run in groups, each group on one pytest-xdist
worker, handed out before the other tests (`GroupsFirstScheduling`, with `--dist loadgroup`), and hold their
group's lock file while they run (`one_areal_run_per_seed`), which also keeps two suites run side by side
on one machine apart. A test that takes much memory (a whole training run, a vLLM server) says how much
(`@pytest.mark.memory(gib=...)`) and waits until the suites' other such tests leave it that much.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# The suite runs on CPUs, where compiling AReaL's logprob gathering (torch.compile) only costs time in each
# fresh process tree that trains in-process (bench/RESULTS.md, "The vLLM CPU server"), as in the CPU
# recipes' workers (configs/smoke_cpu.yaml).
os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
# Each pytest process (every xdist worker: not inherited from the controller) keeps its own record of the
# training runs alive (lifecycle/reaper.py), which the runs it starts inherit: the suite's groups of
# AReaL runs use different seeds, and a pre-flight check on another worker must not see them.
LIVE_RUNS_DIR = tempfile.mkdtemp(prefix="tau2-live-runs-")
os.environ["TAU2_LIVE_RUNS_DIR"] = LIVE_RUNS_DIR
# A suite started in the background by a non-interactive shell (`nohup ... &`) inherits SIGINT ignored, and
# so would every process it starts: the tests that interrupt a run (the server watchdog, eval.evaluate's
# resume) need Ctrl-C to act as it does in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from examples.tau2.runtime.process import setup_runtime  # noqa: E402

setup_runtime()  # as every entry point does before importing tau2: its import-time DEBUG lines stay quiet

from bench.standalone_actor import DISTRIBUTED_ENV  # noqa: E402
from examples.tau2.cpu.scripted_endpoint import EndpointThread  # noqa: E402
from examples.tau2.tau2_agent import Tau2AgentWorkflow  # noqa: E402
from examples.tau2.tau2_utils import EpisodeResult  # noqa: E402

AREAL_PROCESS_GROUPS = {
    "tests/cpu/test_smoke_faults.py": "areal-processes",     # whole smoke runs: trainer, proxy servers, vLLM
    "tests/test_tau2_train.py": "areal-processes",           # the training entry's workers
    "tests/test_proxy_integration.py": "areal-processes",    # AReaL's proxy rollout servers
    "tests/lifecycle/test_recover.py": "areal-processes",     # a trainer whose server dies
    ("tests/lifecycle/test_reaper.py::"
     "test_the_reaper_stops_the_workers_of_a_killed_controller"): "areal-processes",  # a killed controller
    "tests/sft/test_train.py": "areal-processes",            # AReaL's SFT trainer under torchrun
    # the GPU bench's trainers on a CPU: a whole run's memory; here it never makes the SLURM run wait for it
    ("tests/bench/test_bench_tree_gpu.py::test_the_gpu_bench_runs_both_modes_on_a_cpu_and_the_tree_computes_"
     "fewer_tokens"): "areal-processes",
    # the requeue run and the failed start through SLURM: seeds and clusters of their own
    "tests/slurm/test_smoke_on_slurm.py": "areal-slurm",
}
"""The tests that start AReaL's own processes (a module's path, or one test's id) and their xdist group (see
the module docstring); a test's own entry wins over its module's. Each group uses seeds of its own, so the
groups may run at once. Every whole training run (and every test that takes as much memory) is in one of the
two groups: at most two run at once, which is what 24 GiB holds (`MEMORY_RESERVE_GIB`), the SLURM requeue
run, the longest, never waits for memory, and the third worker runs the other tests meanwhile."""


def areal_group_of_node(nodeid: str) -> str | None:
    """The group of a test id such as `tests/cpu/test_smoke_faults.py::test_x[a]`: its own entry in
    `AREAL_PROCESS_GROUPS`, else its module's."""
    test = nodeid.split("[", 1)[0]
    return AREAL_PROCESS_GROUPS.get(test) or AREAL_PROCESS_GROUPS.get(test.split("::", 1)[0])


def pytest_sessionfinish(session: pytest.Session) -> None:
    shutil.rmtree(LIVE_RUNS_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def one_areal_run_per_seed(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test of an `AREAL_PROCESS_GROUPS` group holds its group's lock file while it runs: within one
    suite `GroupsFirstScheduling` already runs a group on one worker; the lock keeps apart the runs of
    suites started side by side, or with another `--dist`."""
    group = areal_group_of_node(request.node.nodeid)
    if group is None:
        yield
        return
    with (Path(tempfile.gettempdir()) / f"tau2-areal-tests-{group}-{os.getuid()}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class GroupsFirstScheduling(LoadGroupScheduling):
    """`--dist loadgroup`, with the groups taken from `AREAL_PROCESS_GROUPS` by test id and handed out
    first. pytest-xdist 3.8 marks a grouped test by renaming `item._nodeid`, which pytest 9 no longer
    reads, so its own groups never form and grouped tests go to both workers (where they would wait on
    each other's lock). The groups are the suite's longest units, so they start first and the short tests
    fill the other worker around them."""

    def _split_scope(self, nodeid: str) -> str:
        return areal_group_of_node(nodeid) or super()._split_scope(nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        for group in reversed(sorted(set(AREAL_PROCESS_GROUPS.values()))):
            if group in self.workqueue:
                self.workqueue.move_to_end(group, last=False)
        super()._assign_work_unit(node)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: the suite also runs with `-p no:xdist`
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadGroupScheduling | None:
    return GroupsFirstScheduling(config, log) if config.getvalue("dist") == "loadgroup" else None


MEMORY_RESERVE_GIB = 3.5
"""What the tests marked `memory` leave of the machine's memory to the rest: the pytest workers, the tests
around them. A whole smoke run peaks near 10 GiB (bench/RESULTS.md, "Memory of a smoke run"): on 24 GiB two
run at once, never three (with three at once the kernel's OOM killer took a trainer)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


@contextlib.contextmanager
def memory_reserved(gib: float, budget_gib: float, ledger: Path) -> Iterator[None]:
    """Hold `gib` in `ledger` (this process's entry, shared by every pytest process of this user) until the
    block ends; wait while the live holders' and `gib` would pass `budget_gib` (a lone holder may)."""
    lock = ledger.with_suffix(".lock")

    def update(change: Any) -> bool:
        with lock.open("w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            held = json.loads(ledger.read_text()) if ledger.is_file() else {}
            held = {pid: g for pid, g in held.items() if _alive(int(pid))}
            done = change(held)
            ledger.write_text(json.dumps(held))
            return done

    def take(held: dict[str, float]) -> bool:
        if held and sum(held.values()) + gib > budget_gib:
            return False
        held[str(os.getpid())] = gib
        return True

    while not update(take):
        time.sleep(2)
    try:
        yield
    finally:
        update(lambda held: held.pop(str(os.getpid()), None))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout's: the wait is not the test's time
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    marker = item.get_closest_marker("memory")
    if marker is None:
        yield
        return
    total_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    ledger = Path(tempfile.gettempdir()) / f"tau2-areal-tests-memory-{os.getuid()}.json"
    with memory_reserved(marker.kwargs["gib"], total_gib - MEMORY_RESERVE_GIB, ledger):
        yield


@pytest.fixture(autouse=True)
def fresh_random_state() -> None:
    """Reseed Python's `random` from the OS, as a fresh process starts (see the module docstring)."""
    random.seed()


def open_tracking_runs() -> list[str]:
    """Experiment-tracking runs open in this process. AReaL's `StatsLogger` calls `wandb.init` and
    `swanlab.init` (even when disabled) and only its `close()` finishes them; a run left open changes what
    later tests in the same process get from `wandb.login` and `wandb.init`."""
    import sys

    found = []
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        found.append("wandb")
        wandb.finish()
    if "swanlab" in sys.modules:
        from swanlab.data.run import get_run

        if get_run() is not None:
            found.append("swanlab")
            sys.modules["swanlab"].finish()
    return found


def distributed_state() -> dict[str, str | None]:
    """What a later test or process would inherit from torch.distributed in this one: whether its default
    group is initialized, and the env:// rendezvous variables (`standalone_actor.DISTRIBUTED_ENV`)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    state: dict[str, str | None] = {key: os.environ.get(key) for key in DISTRIBUTED_ENV}
    state["torch.distributed group"] = "initialized" if dist is not None and dist.is_initialized() else None
    return state


def restore_distributed_state(before: dict[str, str | None]) -> None:
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_initialized() and before["torch.distributed group"] is None:
        dist.destroy_process_group()
    for key in DISTRIBUTED_ENV:
        if before[key] is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before[key]  # type: ignore[assignment]


@pytest.fixture(autouse=True)
def no_process_state_left_behind() -> Iterator[None]:
    """Fail a test that leaves process-wide state behind for the tests after it on this worker (and undo
    it, so that the next test starts clean): an open wandb or swanlab run, an initialized torch.distributed
    group or the rendezvous variables that make every later subprocess rank 0 of a finished group."""
    before = distributed_state()
    yield
    leaked = [f"a {run} run open (close AReaL's StatsLogger: close())" for run in open_tracking_runs()]
    after = distributed_state()
    leaked += [f"{key}={after[key]!r} (was {before[key]!r})" for key in after if after[key] != before[key]]
    restore_distributed_state(before)
    if leaked:
        pytest.fail("the test left process-wide state behind: " + "; ".join(leaked))


@pytest.fixture(scope="session")
def endpoint_server() -> Iterator[EndpointThread]:
    with EndpointThread() as ep:
        yield ep


@pytest.fixture
def endpoint(endpoint_server: EndpointThread) -> EndpointThread:
    """The session's scripted endpoint, its request counters and outages reset for this test."""
    endpoint_server.endpoint.reset()
    return endpoint_server


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """The real Qwen3 tokenizer and chat template (cpu/tiny_model.tokenizer_dir), loaded once a worker."""
    from transformers import AutoTokenizer

    from examples.tau2.cpu.tiny_model import tokenizer_dir

    return AutoTokenizer.from_pretrained(tokenizer_dir())


@pytest.fixture
def vllm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A smoke config's checks need a vLLM interpreter to exist; any executable will do (not for a run)."""
    from examples.tau2.cpu.smoke_config import VLLM_PYTHON_ENV

    monkeypatch.setenv(VLLM_PYTHON_ENV, sys.executable)


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_workflow(endpoint: EndpointThread, policy: str = "oracle", **overrides: Any) -> Tau2AgentWorkflow:
    """A workflow against the scripted endpoint, with fast retries so failure tests stay short."""
    kwargs: dict[str, Any] = dict(
        user_base_url=endpoint.url, user_model="user", agent_model=policy,
        llm_retries=2, retry_backoff_s=0.01, request_timeout_s=10.0, episode_timeout_s=120.0,
    )
    kwargs.update(overrides)
    return Tau2AgentWorkflow(**kwargs)


def run_one(wf: Tau2AgentWorkflow, endpoint: EndpointThread, domain: str, task_id: str,
            **data: Any) -> EpisodeResult:
    async def go() -> EpisodeResult:
        try:
            return await wf.run_episode({"domain": domain, "task_id": task_id, **data},
                                        base_url=endpoint.url, api_key="sk-test-policy-key")
        finally:
            await wf.aclose()

    return asyncio.run(go())
