"""`tau2_rl.sh slurm --submit`: the controller as a SLURM job of its own (slurm/controller_job.py), its
arguments (with the admin key) on no command line, its log where the script says; the run and the
controller's own request checked before `sbatch`, a refused one submitting nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from examples.tau2.slurm import controller_job, queue
from examples.tau2.slurm.controller_job import (
    controller_problem,
    controller_request,
    read_args,
    time_limit_s,
    time_problem,
)
from examples.tau2.slurm.queue import NodeInfo
from examples.tau2.slurm.requeue import WarningSignal
from tests.slurm.support import REPO, slurm, wait_until

SCRIPT = REPO / "examples" / "tau2" / "tau2_rl.sh"
CONTROLLER_TOO_BIG = ("SLURM can never start the controller job (1 node(s) x 1 task(s) of 4 CPUs = 4 CPUs, "
                      "32768 MB per node): 0 of the 1 node(s) of partition cpu fit it, 1 needed (largest: 4 "
                      "CPUs, 16384 MB, no GPU (GRES)); set TAU2_CONTROLLER_SBATCH (now \"--cpus-per-task=4 "
                      "--mem=32G\") to --cpus-per-task and --mem that one node has")


def submit(env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "slurm", "--submit", *overrides], capture_output=True,
                          text=True, env=env, timeout=180)


def script_env(run_dir: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TAU2_CONFIG", "TAU2_CONTROLLER_SBATCH")}
    return {**env, "TAU2_PYTHON": sys.executable, "TAU2_RUN_DIR": str(run_dir), **more}


def test_arguments_are_read_as_one_each_and_the_file_kept_for_a_requeue(tmp_path):
    args = tmp_path / "args"
    args.write_bytes(b"--config\0/x.yaml\0rollout.agent.admin_api_key=s3cret\0a b=c\0")
    assert read_args(args) == ["--config", "/x.yaml", "rollout.agent.admin_api_key=s3cret", "a b=c"]
    assert read_args(args) == read_args(args)  # every incarnation of the job reads it


def test_the_controller_request_is_read_from_its_sbatch_options():
    request, partitions = controller_request("--cpus-per-task=4 --mem=32G")
    assert (request.cpus_per_node, request.mem_mb_per_node, request.gpus_per_node) == (4, 32768, 0)
    assert partitions == []
    request, partitions = controller_request("-c 2 --mem 4096 --time 1:00:00 --hold -p a,b")
    assert (request.cpus_per_node, request.mem_mb_per_node, partitions) == (2, 4096, ["a", "b"])
    request, partitions = controller_request("-c2 --mem-per-cpu=2G --partition gpu")
    assert (request.cpus_per_node, request.mem_mb_per_node, partitions) == (2, 4096, ["gpu"])
    assert controller_request("--time=10")[0].mem_mb_per_node == 0  # no request: SLURM's default, not checked
    assert controller_problem("--mem=lots") == (
        'TAU2_CONTROLLER_SBATCH="--mem=lots" is not a request sbatch takes: --mem=lots is not a size sbatch '
        'reads (e.g. 32G, 4096M); set TAU2_CONTROLLER_SBATCH, e.g. to "--cpus-per-task=4 --mem=32G"')


@pytest.mark.parametrize(("value", "seconds"), [("4", 240), ("4:30", 270), ("1:00:00", 3600), ("2-3", 183600),
                                              ("1-0:10", 87000), ("0-0:0:59", 59), ("UNLIMITED", None)])
def test_time_limits_are_read_as_sbatch_reads_them(value, seconds):
    assert time_limit_s(value) == seconds


def test_a_time_limit_within_the_warnings_reach_is_refused_naming_both():
    """SLURM warns up to a minute before the signal's lead: `--time=4` with USR1@600 is told to stop as it
    starts, every incarnation, and never trains a step."""
    default = WarningSignal.parse("USR1@600")
    assert time_problem("-c 1 --mem=2G --time=4", default) == (
        "--time=4 (240 s) leaves no room for the warning signal USR1@600, which SLURM sends 600 s before the "
        "time limit and up to a minute early, so every incarnation would be told to stop as it starts; set "
        "TAU2_CONTROLLER_SBATCH's --time above 660 s (11.0 min), or a shorter --signal (e.g. USR1@90)")
    assert "above 660 s" in time_problem("-t 11", default) and time_problem("-t 11:01", default) == ""
    assert time_problem("--time=10", WarningSignal.parse("USR1@539")) == ""  # the requeue test's
    assert time_problem("--time 1", default).endswith("(11.0 min)")  # no shorter signal fits a minute
    assert time_problem("--mem=2G", default) == "" and time_problem("--time=infinite", default) == ""
    assert "is not a time limit sbatch reads" in time_problem("--time=soon", default)


def test_a_controller_request_no_node_holds_is_one_sentence_naming_the_setting(monkeypatch):
    nodes = {"cpu": [NodeInfo("n1", "cpu", True, 4, 16384, 0, "idle")]}
    monkeypatch.setattr(controller_job.queue, "available", lambda: True)
    monkeypatch.setattr(controller_job.queue, "nodes", lambda p=None: nodes.get(p or "cpu", []))
    assert controller_problem("--cpus-per-task=4 --mem=32G").startswith(CONTROLLER_TOO_BIG)
    assert controller_problem("--cpus-per-task=1 --mem=2G") == ""
    assert controller_problem("--mem=2G -p gpu") == (
        'SLURM reports no node in partition gpu for the controller job (TAU2_CONTROLLER_SBATCH="--mem=2G -p '
        "gpu\"); set TAU2_CONTROLLER_SBATCH's --partition to one that `sinfo` lists")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_submit_of_the_default_config_is_refused_before_sbatch(tmp_path):
    """What a new user of `tau2_rl.sh slurm-local up` gets from `slurm --submit`: the controller's own job
    (32 GiB) on nodes of 16 GiB and the config's problems, as plain `slurm` reports them, and no job."""
    with slurm(nodes=1, cpus=4, mem_mb=16384):  # nodes of 16 GiB
        done = submit(script_env(tmp_path))
        assert done.returncode == 1, done.stderr
        err = done.stderr
        assert f"  - {CONTROLLER_TOO_BIG}" in err
        assert "econfig.user_base_url=http://127.0.0.1:30000/v1 is a loopback address" in err
        assert "SLURM can never start the rollout job" in err
        count = int(re.search(r"^problems \((\d+)\):$", err, re.MULTILINE).group(1))
        assert count >= 5 and f"tau2_train: {count} problem(s); nothing was started" in err
        assert err.rstrip().endswith(
            "tau2_rl.sh: slurm --submit: refused before sbatch (the problems above); nothing was submitted")
        assert not list(tmp_path.glob("controller-*"))  # no arguments file, no log
        assert queue.jobs_named("") == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_smoke_submit_refuses_a_layout_that_never_fits_at_once_and_a_time_within_the_warning(tmp_path):
    """On a node of 4 CPUs and 16 GiB the smoke run's jobs each fit, but not at once (the trainer's and the
    vLLM server's 8 GiB and the controller's 2 GiB): the last would pend for good. `--time=4` with the
    default warning (600 s) would be warned as it starts, every time. Both refused before sbatch."""
    with slurm(nodes=1, cpus=4, mem_mb=16384):
        env = script_env(tmp_path, TAU2_CONTROLLER_SBATCH="-c 1 --mem=2G --time=4")
        done = subprocess.run(["bash", str(SCRIPT), "smoke", "--submit", "scheduler.type=slurm"],
                              capture_output=True, text=True, env=env, timeout=180)
        assert done.returncode == 1, done.stderr
        problems = [line for line in done.stderr.splitlines() if line.startswith("smoke: ")]
        assert problems[-1] == "smoke: 2 problem(s); nothing was started", done.stderr
        assert problems[0].startswith("smoke: SLURM can never run the jobs of this run at once (rollout job "
                                      "(1 node(s) x 1 task(s) of 1 CPUs = 1 CPUs, 8192 MB per node), actor "
                                      "job"), done.stderr
        assert problems[0].endswith("(CPUs, GPUs and memory shared), and the run holds each job until it "
                                    "ends, so the last one would pend for good; lower the roles' "
                                    "scheduling_spec (cpu, mem, gpu), or TAU2_CONTROLLER_SBATCH's "
                                    "--cpus-per-task and --mem, or use a partition with more nodes")
        assert problems[1].startswith("smoke: --time=4 (240 s) leaves no room for the warning signal USR1@")
        assert "nothing was submitted" in done.stderr and queue.jobs_named("") == []
        assert not list(tmp_path.glob("controller-*"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_submit_runs_the_controller_as_a_job_and_says_where_its_log_is(tmp_path):
    """A run the checks accept is submitted (an sbatch that refuses it leaves nothing behind); the job's
    controller checks again and here refuses, since its cluster.fileroot can no longer be created (the
    job is held until then)."""
    gone = tmp_path / "gone"
    # Accepted on a CPU-only cluster: both engines colocated ask SLURM for no job and no GPU of their own.
    accepted = ("+configs=slurm_native", "cluster.n_gpus_per_node=1", "rollout.backend=sglang:d1",
                "actor.backend=archon:d1", "++rollout.scheduling_strategy.type=colocation",
                "++actor.scheduling_strategy.type=colocation", "econfig.domain=mock",
                "econfig.solo_mode=true", "econfig.train_split=all", "econfig.valid_split=null",
                "valid_dataset=null",
                f"cluster.fileroot={gone}/root")
    with slurm(nodes=1, cpus=4):
        refused = submit(script_env(tmp_path, TAU2_CONTROLLER_SBATCH="-c 1 --mem=2G --constraint=nosuch"),
                         *accepted)
        assert refused.returncode == 1 and "Invalid feature specification" in refused.stderr, refused.stderr
        assert "sbatch refused the controller's job; nothing was submitted" in refused.stderr
        assert not list(tmp_path.glob("controller-*.args")) and queue.jobs_named("") == []
        env = script_env(tmp_path, TAU2_ADMIN_KEY="s3cret-admin-key",
                         TAU2_CONTROLLER_SBATCH="--cpus-per-task=1 --mem=2G --hold")
        done = submit(env, *accepted)
        assert done.returncode == 0, done.stderr
        assert "slurm --submit: the checks found no problem; submitting the controller's job" in done.stderr
        job = int(re.search(r"^controller: SLURM job (\d+), log (\S+)$", done.stdout, re.M).group(1))
        log = Path(re.search(r"^controller: SLURM job \d+, log (\S+)$", done.stdout, re.M).group(1))
        assert log.parent == tmp_path and f"scancel {job}" in done.stdout
        [args] = tmp_path.glob("controller-*.args")
        assert args.stat().st_mode & 0o777 == 0o600
        script = queue.run("scontrol", "write", "batch_script", str(job), "-")
        assert "examples.tau2.slurm.controller_job" in script and "s3cret-admin-key" not in script
        assert "--entry train --max-requeues 10 --signal USR1@600 " in script  # slurm/requeue.py's defaults
        # SLURM may send the warning as the job starts: the shell ignores it until Python catches it.
        assert "trap '' USR1; exec " in script
        shown = queue.run("scontrol", "show", "job", str(job))
        assert "Requeue=1" in shown and f"StdOut={log}" in shown
        gone.write_text("")  # a file where the run's folder would go
        queue.run("scontrol", "release", str(job))
        wait_until(lambda: not queue.query_jobs([job])[job].active, 120, "the controller's job to end")
        assert queue.query_jobs([job])[job].state == "FAILED"  # the controller's exit status, 1
        out = log.read_text()
        assert f"controller_job: SLURM job {job} on " in out
        assert (f"cluster.fileroot={gone}/root does not exist and cannot be created ({gone} is not a "
                "directory)") in out
        assert "nothing was started" in out and "s3cret-admin-key" not in out
        assert not list(tmp_path.glob("controller-*.args"))  # read and removed by the job


@pytest.mark.parametrize(("command", "flags", "said"), [
    ("slurm", ("--max-requeues", "x"), "slurm --submit --max-requeues needs a number (e.g. 10)"),
    ("slurm", ("--signal", "USR1"), "slurm --submit --signal USR1 is not SIGNAL@SECONDS (e.g. USR1@600)"),
    ("smoke", ("--signal=USR1@"), "smoke --submit --signal USR1@ is not SIGNAL@SECONDS (e.g. USR1@600)"),
])
def test_bad_requeue_flags_are_refused_in_one_sentence_before_anything_is_checked(tmp_path, command, flags,
                                                                                   said):
    flags = (flags,) if isinstance(flags, str) else flags
    done = subprocess.run(["bash", str(SCRIPT), command, "--submit", *flags], capture_output=True, text=True,
                          env=script_env(tmp_path), timeout=120)
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == f"tau2_rl.sh: {said}", done.stderr
    assert not list(tmp_path.glob("controller-*"))
