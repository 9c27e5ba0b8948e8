"""A real SLURM for the tests: the project's throw-away cluster (`slurm.local_cluster`) under a short folder.

The daemons run as root (CI runs as root and reaches Debian's packages, which `local_cluster.up` installs
when they are missing); elsewhere the tests that need them are skipped with the reason. Each fixture
brings a cluster up for its test and down afterwards, by the pids it recorded; `SLURM_CONF` points this
process (and every process it starts) at it for the duration.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from examples.tau2.slurm import local_cluster
from examples.tau2.slurm.local_cluster import ClusterSpec, LocalCluster

REPO = Path(__file__).resolve().parents[2]
STAND_IN_LOG_ENV = "TAU2_TEST_SINGULARITY_LOG"
"""Where the stand-in `singularity` appends one JSON line per call (its arguments, as it parsed them)."""


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the local SLURM runs its daemons as root (run the suite as root, as CI does)")


@contextlib.contextmanager
def slurm(nodes: int = 1, cpus: int = 4, mem_mb: int = 16384) -> Iterator[LocalCluster]:
    """A fresh cluster (folder under /tmp: munge's socket path must stay short), `SLURM_CONF` set."""
    require_root()
    root = Path(tempfile.mkdtemp(prefix="tau2-slurm-", dir="/tmp"))
    previous = os.environ.get("SLURM_CONF")
    try:
        with local_cluster.running(root / "c", ClusterSpec(nodes=nodes, cpus=cpus, mem_mb=mem_mb)) as cluster:
            os.environ["SLURM_CONF"] = str(cluster.conf)
            yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        shutil.rmtree(root, ignore_errors=True)


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.2) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"no {what} within {timeout_s:.0f} s")
        time.sleep(poll_s)
    return time.monotonic() - start


def install_stand_in(folder: Path) -> Path:
    """`folder/singularity`: runs `singularity_stand_in.py` with this interpreter; returns `folder` (for
    PATH). The stand-in logs each call to `$TAU2_TEST_SINGULARITY_LOG`."""
    folder.mkdir(parents=True, exist_ok=True)
    launcher = folder / "singularity"
    stand_in = Path(__file__).with_name("singularity_stand_in.py")
    launcher.write_text(f'#!/bin/sh\nexec {sys.executable} {stand_in} "$@"\n')
    launcher.chmod(0o755)
    return folder
