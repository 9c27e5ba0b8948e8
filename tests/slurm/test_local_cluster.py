"""The throw-away local SLURM (slurm/local_cluster.py): up with one and two nodes, jobs across them, down by
pid, and its refusals."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from examples.tau2.slurm import local_cluster
from examples.tau2.slurm.local_cluster import ClusterSpec, LocalClusterError, slurm_conf
from tests.slurm.support import require_root, slurm


def test_the_config_declares_cpu_only_nodes_on_this_host(tmp_path):
    conf = slurm_conf(tmp_path, ClusterSpec(nodes=2, cpus=2, mem_mb=4096), 7001, [7002, 7003],
                      tmp_path / "munge.sock")
    assert "SlurmctldPort=7001" in conf and f"AuthInfo=socket={tmp_path / 'munge.sock'}" in conf
    assert "NodeName=n1 " in conf and "Port=7002 CPUs=2 RealMemory=4096" in conf and "Port=7003" in conf
    assert "PartitionName=cpu Nodes=n1,n2 Default=YES" in conf and "Gres" not in conf
    assert "EnforcePartLimits=ALL" in conf and "SlurmdParameters=config_overrides" in conf


def test_bad_specs_and_long_folders_are_refused(tmp_path):
    with pytest.raises(LocalClusterError, match="--nodes must be at least 1"):
        ClusterSpec(nodes=0)
    require_root()
    with pytest.raises(LocalClusterError, match="longer than 107 bytes; choose a shorter --dir"):
        local_cluster.up(tmp_path / ("x" * 100))
    assert local_cluster.down(tmp_path / "nothing-here") == []


@pytest.mark.slow
def test_two_nodes_run_a_job_across_both_and_go_down_by_pid():
    with slurm(nodes=2, cpus=2, mem_mb=2048) as cluster:
        assert cluster.node_states() == {"n1": "idle", "n2": "idle"}
        out = cluster.run("srun", "-N2", "--ntasks-per-node=1", "bash", "-c", "echo $SLURMD_NODENAME")
        assert sorted(out.split()) == ["n1", "n2"]
        assert local_cluster.load(cluster.root) is not None
        status = local_cluster.status(cluster.root)
        assert "2 node(s)" in status and "slurmd n2" in status and f"SLURM_CONF={cluster.conf}" in status
        pids = [d.pid for d in cluster.daemons]
        assert all(psutil.pid_exists(p) for p in pids) and len(pids) == 4  # munged, slurmctld, 2 x slurmd
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    assert local_cluster.load(cluster.root) is None


@pytest.mark.slow
def test_up_leaves_a_running_cluster_and_its_jobs_alone_and_down_leaves_no_job_step(capsys):
    """`up` twice does not restart the daemons nor empty the queue; `down` ends the job steps too, which
    leave slurmd's process tree at once, even when slurmctld is gone and cannot cancel them."""
    require_root()
    import tempfile

    root = tempfile.mkdtemp(prefix="tau2-slurm-twice-", dir="/tmp")
    try:
        assert local_cluster.main(["up", "--dir", root, "--nodes", "1"]) == 0
        cluster = local_cluster.load(Path(root))
        job = cluster.run("sbatch", "--parsable", "--output=/dev/null", "--wrap",
                          "trap '' TERM; sleep 617").strip()
        deadline = time.monotonic() + 30
        while not local_cluster.job_steps(cluster.conf) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert local_cluster.job_steps(cluster.conf), "the job's step did not start"
        capsys.readouterr()
        assert local_cluster.main(["up", "--dir", root, "--nodes", "1"]) == 0
        assert "already up under" in capsys.readouterr().err
        assert [d.pid for d in local_cluster.load(Path(root)).daemons] == [d.pid for d in cluster.daemons]
        assert job in cluster.jobs()[0]
        assert local_cluster.main(["up", "--dir", root, "--nodes", "2"]) == 1
        assert "`tau2_rl.sh slurm-local down` first" in capsys.readouterr().err
        ctld = next(d for d in cluster.daemons if d.name == "slurmctld")
        os.kill(ctld.pid, signal.SIGKILL)  # nothing can cancel the job now
    finally:
        down = local_cluster.main(["down", "--dir", root])
    assert down == 0
    assert local_cluster.job_steps(cluster.conf) == []
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "617"]]


@pytest.mark.slow
def test_the_command_line_brings_a_cluster_up_and_down(tmp_path, capsys):
    require_root()
    import tempfile

    root = tempfile.mkdtemp(prefix="tau2-slurm-cli-", dir="/tmp")
    try:
        assert local_cluster.main(["up", "--dir", root, "--nodes", "1"]) == 0
        assert capsys.readouterr().out.strip() == f"export SLURM_CONF={root}/slurm.conf"
        assert local_cluster.main(["status", "--dir", root]) == 0
        assert "node n1: idle" in capsys.readouterr().out
    finally:
        assert local_cluster.main(["down", "--dir", root]) == 0
    assert "stopped 3 daemon(s)" in capsys.readouterr().err
    assert local_cluster.main(["down", "--dir", root]) == 0
    assert "no local SLURM running" in capsys.readouterr().err
