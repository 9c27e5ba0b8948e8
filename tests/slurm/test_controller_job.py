"""`tau2_rl.sh slurm --submit`: the controller as a SLURM job of its own (slurm/controller_job.py), its
arguments (with the admin key) on no command line, its log where the script says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from examples.tau2.slurm import queue
from examples.tau2.slurm.controller_job import read_args
from tests.slurm.support import REPO, slurm, wait_until

SCRIPT = REPO / "examples" / "tau2" / "tau2_rl.sh"


def test_arguments_are_read_once_and_the_file_removed(tmp_path):
    args = tmp_path / "args"
    args.write_bytes(b"--config\0/x.yaml\0rollout.agent.admin_api_key=s3cret\0a b=c\0")
    assert read_args(args) == ["--config", "/x.yaml", "rollout.agent.admin_api_key=s3cret", "a b=c"]
    assert not args.exists()


@pytest.mark.slow
def test_submit_runs_the_controller_as_a_job_and_says_where_its_log_is(tmp_path):
    with slurm(nodes=1, cpus=4):
        env = {**os.environ, "TAU2_PYTHON": sys.executable, "TAU2_RUN_DIR": str(tmp_path),
               "TAU2_ADMIN_KEY": "s3cret-admin-key", "TAU2_CONTROLLER_SBATCH": "--cpus-per-task=1 --mem=2G"}
        # A config the controller refuses at once (a loopback user simulator cannot serve SLURM workers).
        done = subprocess.run(["bash", str(SCRIPT), "slurm", "--submit", "+configs=slurm_native",
                               "cluster.n_gpus_per_node=0", "actor.scheduling_spec.0.gpu=0",
                               f"cluster.fileroot={tmp_path}/root", "econfig.user_base_url=http://127.0.0.1:9/v1"],
                              capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        job = int(re.search(r"the controller runs as SLURM job (\d+); its log: (\S+)", done.stdout).group(1))
        log = Path(re.search(r"its log: (\S+)", done.stdout).group(1))
        assert log.parent == tmp_path and f"scancel {job}" in done.stdout
        script = queue.run("scontrol", "write", "batch_script", str(job), "-")
        assert "examples.tau2.slurm.controller_job" in script and "s3cret-admin-key" not in script
        wait_until(lambda: not queue.query_jobs([job])[job].active, 120, "the controller's job to end")
        assert queue.query_jobs([job])[job].state == "FAILED"  # the controller's exit status, 1
        out = log.read_text()
        assert f"controller_job: SLURM job {job} on " in out
        assert "econfig.user_base_url=http://127.0.0.1:9/v1 is a loopback address" in out
        assert "nothing was started" in out and "s3cret-admin-key" not in out
        assert not list(tmp_path.glob("controller-*.args"))  # read and removed by the job
