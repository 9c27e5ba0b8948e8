"""`Tau2SlurmScheduler` against a real SLURM, one test per AReaL 1.0.4 defect it fixes (slurm/scheduler.py).

Each test runs the scenario through the project's scheduler and shows the fixed behaviour, then through
AReaL's stock `SlurmScheduler` and shows the defect: when AReaL fixes one, its half fails and names the
override that can go. Real rpc workers start where a test needs one to answer (~5-10 s each).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from areal.api import Job
from areal.api.cli_args import SchedulingStrategy
from areal.infra.scheduler.exceptions import WorkerCreationError, WorkerFailedError, WorkerTimeoutError
from areal.infra.scheduler.slurm import SlurmScheduler

from examples.tau2.cpu.smoke_config import load_smoke_config
from examples.tau2.lifecycle.reaper import cancel_jobs
from examples.tau2.lifecycle.watchdog import WorkerJobEnded
from examples.tau2.slurm import queue
from examples.tau2.slurm import scheduler as slurm_scheduler
from examples.tau2.slurm.registry import JobRegistry, job_name_prefix
from examples.tau2.slurm.scheduler import (
    PENDING_LIMIT_ENV,
    START_TIMEOUT_ENV,
    Tau2SlurmScheduler,
    WorkerJobCannotStart,
    _ForkInterpreter,
    worker_interpreter,
)
from tests.slurm.support import REPO, STAND_IN_LOG_ENV, install_stand_in, slurm, wait_until
from tests.tau2_train_support import trainer_without_areal_init

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    with slurm(nodes=1, cpus=4) as c:
        yield c


def load(tmp_path: Path, *overrides: str):
    """The smoke config (workers natively: `container_type: none`) under `tmp_path`, scheduler.type=slurm."""
    (tmp_path / "nr").mkdir(parents=True, exist_ok=True)
    config, _, _ = load_smoke_config([
        f"cluster.fileroot={tmp_path}", f"cluster.name_resolve.nfs_record_root={tmp_path}/nr",
        "scheduler.type=slurm", f"trial_name=t{time.monotonic_ns()}", *overrides])
    return config


STOCK = ("cluster.n_gpus_per_node=8",)
"""What the stock scheduler needs to submit anything: it divides by n_gpus_per_node (the specs ask no GPU)."""


def actor_job(config, replicas: int = 1) -> Job:
    return Job(replicas=replicas, tasks=[config.actor.scheduling_spec[0]], role="actor",
               scheduling_strategy=SchedulingStrategy())


def active_jobs(cluster) -> list[str]:
    return cluster.active_jobs()


def stock(config, **kwargs) -> SlurmScheduler:
    """AReaL's own scheduler, as `PPOTrainer._init_scheduler` builds it (plus the given arguments)."""
    return SlurmScheduler(exp_config=config, **kwargs)


def script_of(scheduler, config, replicas: int = 1) -> str:
    spec = config.actor.scheduling_spec[0]
    specs = scheduler._prepare_worker_specs("actor", replicas, [spec])
    return scheduler._generate_sbatch_script("actor", replicas, 1, 0, spec.cpu, spec.mem * 1024, specs,
                                             None, None)


# ---------------------------------------------------------------------------------------------
# 1-3 and 6: a native worker starts, with the spec's environment and the controller's interpreter, on a
# cluster without GPUs


def test_a_native_worker_starts_with_its_environment_and_this_interpreter(cluster, tmp_path, monkeypatch):
    env_file = tmp_path / "worker.env"
    config = load(tmp_path, "++actor.scheduling_spec.0.env_vars.TAU2_TEST_VALUE=two words",
                  f"++actor.scheduling_spec.0.additional_bash_cmds=['env > {env_file}']")
    assert config.cluster.n_gpus_per_node == 0
    # The job's PATH finds a python3 without AReaL (or none): the worker must not depend on it.
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    scheduler = Tau2SlurmScheduler(config)
    scheduler.create_workers(actor_job(config))
    try:
        (worker,) = scheduler.get_workers("actor", timeout=120)
        assert worker.worker_ports
    finally:
        scheduler.delete_workers()
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    assert env["TAU2_TEST_VALUE"] == "two words"
    assert env["AREAL_PROXY_WARN_ONCE"] == "1" and env["OMP_NUM_THREADS"] == "2"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(Path.cwd())  # the controller's sys.path, natively
    script = (Path(scheduler.role_log("actor")).with_name("actor.sh")).read_text()
    assert "singularity" not in script and f"{sys.executable} -m areal.infra.rpc.rpc_server" in script
    assert not active_jobs(cluster)


def test_stock_areal_ignores_the_container_settings_env_vars_and_interpreter(cluster, tmp_path):
    config = load(tmp_path, *STOCK, "++actor.scheduling_spec.0.env_vars.TAU2_TEST_VALUE=x")
    script = script_of(stock(config, container_type="none"), config)
    # container_type=none in the spec, yet the stock scheduler (built by PPOTrainer from the config) wraps
    # every worker in singularity; the spec's variables only ever travel as --env; python3 from PATH.
    assert "singularity exec" in script_of(stock(config), config)
    assert "export" not in script and "TAU2_TEST_VALUE" not in script
    assert "python3 -m areal.infra.rpc.rpc_server" in script
    ours = script_of(Tau2SlurmScheduler(config), config)
    assert "singularity" not in ours and "export TAU2_TEST_VALUE=x" in ours


def test_stock_areal_divides_by_zero_on_a_cluster_without_gpus(cluster, tmp_path):
    config = load(tmp_path)
    with pytest.raises(ZeroDivisionError):
        stock(config).create_workers(actor_job(config))
    assert not active_jobs(cluster)


# ---------------------------------------------------------------------------------------------
# 1 and 2 with a container: the stand-in singularity checks and runs the command line


def test_apptainer_mode_binds_the_mount_passes_quoted_env_and_keeps_the_images_pythonpath(cluster, tmp_path,
                                                                                          monkeypatch):
    image = tmp_path / "areal-tau2.sif"
    image.write_text("a stand-in image")
    log = tmp_path / "singularity.jsonl"
    bin_dir = install_stand_in(tmp_path / "bin")
    # Inside the "container", python3 is the venv's (the image's interpreter in a real one).
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setenv(STAND_IN_LOG_ENV, str(log))
    config = load(tmp_path, "actor.scheduling_spec.0.container_type=apptainer",
                  f"++actor.scheduling_spec.0.image={image}",
                  f"++actor.scheduling_spec.0.mount={tmp_path}:{tmp_path}",
                  "++actor.scheduling_spec.0.env_vars.TAU2_TEST_VALUE=two words",
                  f"++actor.scheduling_spec.0.env_vars.PYTHONPATH={REPO}")
    scheduler = Tau2SlurmScheduler(config)
    scheduler.create_workers(actor_job(config))
    try:
        scheduler.get_workers("actor", timeout=120)
        # AReaL forks the proxies from the rollout workers; inside a container, with the image's python3
        assert scheduler.fork_workers("proxy", "actor") == ["proxy/0"]
        assert len(scheduler.get_workers("proxy")) == 1
        (proxy,) = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                    if {"--role", "proxy", str(tmp_path)} <= set(p.info["cmdline"] or [])]
        assert proxy[0] == "python3"  # not the controller's sys.executable, absent from an image
    finally:
        scheduler.delete_workers()
    (call,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert call["image"] == str(image) and call["binds"] == [f"{tmp_path}:{tmp_path}"]
    assert call["env"]["TAU2_TEST_VALUE"] == "two words" and call["env"]["PYTHONPATH"] == str(REPO)
    assert call["cmd"][:2] == ["bash", "-c"]
    assert call["cmd"][2].startswith("python3 -m areal.infra.rpc.rpc_server")
    assert worker_interpreter(config.actor.scheduling_spec[0]) == "python3"  # forks run the image's too
    assert not active_jobs(cluster)


def test_forked_workers_run_the_workers_interpreter():
    sent = []

    class Session:
        def post(self, url, json=None, **kwargs):
            sent.append((url, json))

        closed = False

    wrapped = _ForkInterpreter(Session(), "python3")
    wrapped.post("http://h:1/fork", json={"raw_cmd": ["/controller/venv/bin/python", "-m", "m"], "role": "r"})
    wrapped.post("http://h:1/alloc_ports", json={"count": 1})
    assert sent == [("http://h:1/fork", {"raw_cmd": ["python3", "-m", "m"], "role": "r"}),
                    ("http://h:1/alloc_ports", {"count": 1})]
    assert wrapped.closed is False  # everything else is the session's own


# ---------------------------------------------------------------------------------------------
# 4: a worker that dies at start


def test_a_worker_that_dies_at_start_fails_the_wait_within_seconds(cluster, tmp_path):
    config = load(tmp_path, "actor.scheduling_spec.0.cmd=python3 -m no_such_module")
    scheduler = Tau2SlurmScheduler(config)
    scheduler.create_workers(actor_job(config))
    start = time.monotonic()
    with pytest.raises(WorkerFailedError) as failed:
        scheduler.get_workers("actor", timeout=300)
    took = time.monotonic() - start
    scheduler.delete_workers()
    message = str(failed.value)
    assert JobRegistry.of_trial(str(tmp_path), config.experiment_name, config.trial_name).entries() == {}
    assert "is FAILED (NonZeroExitCode) on n1: the actor workers are gone (log " in message, message
    assert "No module named no_such_module" in message and "SLURM job" in message
    # the job's state, checked every second, failed the wait: AReaL's 300 s timeout says "timed out"
    print(f"dead worker: the wait failed {took:.1f} s after submission")


def test_stock_areal_waits_out_its_timeout_for_a_worker_that_died(cluster, tmp_path):
    config = load(tmp_path, *STOCK, "actor.scheduling_spec.0.cmd=python3 -m no_such_module")
    scheduler = stock(config, container_type="none", startup_timeout=10, health_check_interval=1)
    scheduler.create_workers(actor_job(config))
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError):
        scheduler.get_workers("actor")
    assert time.monotonic() - start >= 10  # the whole timeout, although the job ended at once
    (job,) = queue.jobs_named(job_name_prefix(config.experiment_name, config.trial_name))
    assert job.state == "COMPLETED"  # the exit status of `tee`, not of the worker
    scheduler.delete_workers()


# ---------------------------------------------------------------------------------------------
# 5: a busy queue is waited for; a job that can never start is not


def hold_the_node(cluster) -> int:
    """A job on every CPU of the node: the next one pends (Resources) until it ends."""
    holder = int(cluster.run("sbatch", "--parsable", "-c", "4", "-o", "/dev/null", "--wrap",
                             "sleep 600").strip())
    wait_until(lambda: queue.query_jobs([holder])[holder].running, 30, "the holder to run")
    return holder


class Said(logging.Handler):
    """The lines of the project's SLURM logger (it does not propagate to pytest's caplog)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_pending_job_is_waited_for_and_its_start_up_timeout_counts_once_it_runs(cluster, tmp_path,
                                                                                  monkeypatch):
    """The node is busy for 25 s, the start-up timeout 20 s: the wait lasts past it, says so every 5 s here
    (every minute by default), and the worker answers once its job runs."""
    monkeypatch.setenv(START_TIMEOUT_ENV, "20")
    monkeypatch.setattr(slurm_scheduler, "PENDING_LOG_EVERY_S", 5.0)
    # A logger of the test's own: the module's keeps INFO cached as off once anything in this process logged
    # INFO on it at its default level, and setLevel no longer clears that cache after AReaL's getLogger has
    # installed a new logging manager
    lines = Said()
    monkeypatch.setattr(slurm_scheduler, "logger", logging.Logger(slurm_scheduler.logger.name, logging.INFO))
    slurm_scheduler.logger.addHandler(lines)
    holder = hold_the_node(cluster)
    config = load(tmp_path)
    scheduler = Tau2SlurmScheduler(config)
    ends = threading.Timer(25, queue.cancel, ([holder],))
    try:
        scheduler.create_workers(actor_job(config))
        job_id = scheduler._jobs["actor"]
        ends.start()
        start = time.monotonic()
        (worker,) = scheduler.get_workers("actor")
        took = time.monotonic() - start
        assert worker.worker_ports and took > 25
    finally:
        ends.cancel()
        scheduler.delete_workers()
        queue.cancel([holder])
    said = [line for line in lines.lines if line.startswith(f"actor: SLURM job {job_id} ")]
    line = (rf"actor: SLURM job {job_id} pending \((Resources|not scheduled yet)\) for \d+ s; waiting up to "
            rf"24 h \({PENDING_LIMIT_ENV}\)")
    pending = [m for m in said if re.fullmatch(line, m)]
    assert len(pending) >= 3 and pending == said[:len(pending)], said
    assert re.fullmatch(rf"actor: SLURM job {job_id} left the queue after \d+ s", said[len(pending)]), said
    print(f"pending {took:.1f} s, then started")

    # AReaL counts the time spent pending against its start-up timeout
    config = load(tmp_path, *STOCK)
    stock_scheduler = stock(config, container_type="none", startup_timeout=5, health_check_interval=1)
    holder = hold_the_node(cluster)
    try:
        stock_scheduler.create_workers(actor_job(config))
        with pytest.raises(WorkerTimeoutError):
            stock_scheduler.get_workers("actor")
        job_id = stock_scheduler._jobs["actor"]
        assert queue.query_jobs([job_id])[job_id].state == "PENDING"
    finally:
        queue.cancel([holder, *stock_scheduler._jobs.values()])
    assert not active_jobs(cluster)


def test_a_job_pending_past_the_limit_or_for_a_reason_no_wait_clears_is_cancelled(cluster, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setenv(PENDING_LIMIT_ENV, "3s")
    holder = hold_the_node(cluster)
    config = load(tmp_path)
    scheduler = Tau2SlurmScheduler(config)
    try:
        scheduler.create_workers(actor_job(config))
        job_id = scheduler._jobs["actor"]
        with pytest.raises(WorkerJobCannotStart) as past:
            scheduler.get_workers("actor")
        assert queue.query_jobs([job_id])[job_id].state == "CANCELLED"
    finally:
        queue.cancel([holder])
        scheduler.delete_workers()
    assert past.value.stderr == (f"actor: SLURM job {job_id} pended (Resources) for 3 s, past the pending "
                                 f"limit of 3 s, so it was cancelled; raise {PENDING_LIMIT_ENV} (tau2_rl.sh "
                                 "--pending-limit) or ask for fewer resources")

    queue.run("scontrol", "update", "PartitionName=cpu", "State=DOWN")
    try:
        scheduler = Tau2SlurmScheduler(load(tmp_path))
        scheduler.create_workers(actor_job(config))
        with pytest.raises(WorkerJobCannotStart, match=r"is PENDING \(PartitionDown\): it can never start, "
                                                       "so it was cancelled"):
            scheduler.get_workers("actor")
    finally:
        queue.run("scontrol", "update", "PartitionName=cpu", "State=UP")
        scheduler.delete_workers()
    assert not active_jobs(cluster)


# ---------------------------------------------------------------------------------------------
# 6: stopping cancels pending jobs too


def test_deleting_workers_cancels_a_pending_job(cluster, tmp_path):
    blocker = int(cluster.run("sbatch", "--parsable", "-c", "4", "-o", "/dev/null", "--wrap",
                              "sleep 600").strip())  # every CPU of the node: the next job pends
    try:
        wait_until(lambda: queue.query_jobs([blocker])[blocker].running, 30, "the blocker to run")
        config = load(tmp_path)
        scheduler = Tau2SlurmScheduler(config)
        scheduler.create_workers(actor_job(config))
        job_id = scheduler._jobs["actor"]
        wait_until(lambda: queue.query_jobs([job_id])[job_id].state == "PENDING", 30, "a pending job")
        scheduler.delete_workers()
        assert queue.query_jobs([job_id])[job_id].state == "CANCELLED"

        # AReaL's delete_workers sends `scancel -s SIGTERM <id>` (areal.infra.utils.slurm.cancel_jobs): on a
        # pending job scancel answers "Job can not be altered now" and retries (~95 s here), and the job
        # stays queued, to start later on nodes nobody uses.
        pending = int(cluster.run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true").strip())
        with pytest.raises(subprocess.TimeoutExpired):
            subprocess.run(["scancel", "-s", "SIGTERM", str(pending)], capture_output=True, timeout=5)
        assert queue.query_jobs([pending])[pending].state == "PENDING"
        queue.cancel([pending])
    finally:
        queue.cancel([blocker])
    assert not active_jobs(cluster)


# ---------------------------------------------------------------------------------------------
# 7: jobs the cluster can never run are refused before sbatch


@pytest.mark.parametrize(("overrides", "fragment"), [
    (["actor.scheduling_spec.0.cpu=64"],
     "SLURM can never start the actor job (1 node(s) x 1 task(s) of 64 CPUs"),
    (["actor.scheduling_spec.0.gpu=1", "cluster.n_gpus_per_node=8"],
     "this partition declares no GPUs: set cluster.n_gpus_per_node=0"),
    (["actor.scheduling_spec.0.gpu=1"], "cluster.n_gpus_per_node is 0 (a CPU-only cluster) but the actor"),
    (["actor.scheduling_spec.0.container_type=docker"], "container_type='docker' must be one of"),
])
def test_a_job_no_node_can_run_is_refused_before_submission(cluster, tmp_path, overrides, fragment):
    config = load(tmp_path, *overrides)
    with pytest.raises(WorkerCreationError) as refused:
        Tau2SlurmScheduler(config).create_workers(actor_job(config))
    assert fragment in str(refused.value), str(refused.value)
    assert not cluster.jobs() or all(job_name_prefix(config.experiment_name, config.trial_name) not in j
                                     for j in cluster.jobs())


# ---------------------------------------------------------------------------------------------
# The registry, the reaper and a rerun: no job outlives its controller


CONTROLLER = """
import sys, time
from areal.api import Job
from areal.api.cli_args import SchedulingStrategy
from examples.tau2.cpu.smoke_config import load_smoke_config
from examples.tau2.slurm.scheduler import Tau2SlurmScheduler
from examples.tau2.lifecycle.reaper import reaper_running
root = sys.argv[1]
config, _, _ = load_smoke_config([f"cluster.fileroot={root}",
                                  f"cluster.name_resolve.nfs_record_root={root}/nr",
                                  "scheduler.type=slurm", "trial_name=killed",
                                  "actor.scheduling_spec.0.container_type=none"])
with reaper_running(config):
    s = Tau2SlurmScheduler(config)
    s.create_workers(Job(replicas=1, tasks=[config.actor.scheduling_spec[0]],
                         scheduling_strategy=SchedulingStrategy(), role="actor"))
    print("submitted", s._jobs["actor"], flush=True)
    time.sleep(600)
"""


def test_the_reaper_cancels_the_jobs_of_a_killed_controller(cluster, tmp_path):
    (tmp_path / "nr").mkdir()
    controller = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(tmp_path)], cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        while not line.startswith("submitted"):
            line = controller.stdout.readline()
            assert line or controller.poll() is None, "the controller exited"
        job_id = int(line.split()[1])
        assert job_id in JobRegistry.of_trial(str(tmp_path), "tau2-smoke-cpu", "killed").job_ids()
        controller.send_signal(signal.SIGKILL)
        controller.wait()
        killed = time.monotonic()
        took = wait_until(lambda: not queue.query_jobs([job_id])[job_id].active, 60, "the job cancelled")
    finally:
        controller.kill()
    reaper_log = next(tmp_path.glob("logs/*/tau2-smoke-cpu/killed/reaper.log"))
    wait_until(lambda: "cancelled" in reaper_log.read_text(), 30, "the reaper's report")
    log = reaper_log.read_text()
    assert f"cancelled 1 SLURM job(s) of tau2-smoke-cpu/killed: SLURM job {job_id}" in log, log
    print(f"kill -9 of the controller: its job ended {time.monotonic() - killed:.1f} s later ({took:.1f} s)")


def test_a_rerun_cancels_the_jobs_left_by_an_earlier_controller(cluster, tmp_path):
    config = load(tmp_path)
    name = job_name_prefix(config.experiment_name, config.trial_name) + "rollout"
    left = int(cluster.run("sbatch", "--parsable", "-J", name, "-o", "/dev/null", "--begin=now+1hour",
                           "--wrap", "sleep 600").strip())  # pending until an hour from now
    cancelled = cancel_jobs(config)
    assert len(cancelled) == 1 and f"SLURM job {left} ({name}) is PENDING" in cancelled[0]
    assert queue.query_jobs([left])[left].state == "CANCELLED"
    assert cancel_jobs(load(tmp_path, "scheduler.type=local")) == []


# ---------------------------------------------------------------------------------------------
# A job that ends during training stops the run


def test_a_job_that_ends_during_training_stops_the_run_naming_it(cluster, tmp_path, monkeypatch):
    from areal import PPOTrainer

    config = load(tmp_path)
    scheduler = Tau2SlurmScheduler(config)
    scheduler.create_workers(actor_job(config))
    job_id = scheduler._jobs["actor"]
    wait_until(lambda: queue.query_jobs([job_id])[job_id].running, 30, "the job to run")
    assert scheduler.ended_job() == ""

    def train(self):
        queue.cancel([job_id])  # what `scancel` by a user or the cluster does
        time.sleep(600)

    monkeypatch.setattr(PPOTrainer, "train", train)
    trainer = trainer_without_areal_init(monkeypatch, config, scheduler=scheduler)
    trainer.job_poll_s = 0.5
    ended = rf"SLURM job {job_id} \(.*:actor\) is CANCELLED.*on n1: the actor "
    with pytest.raises(WorkerJobEnded, match=ended):
        trainer.train()  # the job watchdog's error: train() itself would only sleep
    scheduler.delete_workers()
