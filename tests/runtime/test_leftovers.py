"""A run leaves nothing outside its own folders and the caches: no SwanLab run in `~/.cache/swanlab` (SwanLab
is off), no `vllm_dist_*` rendezvous file and no empty `tmp*wandb-*` folder in the temporary folder
(`runtime/process.py`: `own_temp_dir`, `discard_swanlab_run`)."""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from examples.tau2.cpu.tiny_model import default_cache_dir
from examples.tau2.cpu.trainer import vllm_python
from examples.tau2.runtime.leftovers import discard_on_exit, own_temp_dir, share_temp_dir
from tests.cpu.smoke_support import RUN_TIMEOUT_S, finish, smoke_command, start


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
    with own_temp_dir(children=True) as folder:
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


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_a_smoke_run_leaves_nothing_outside_its_folders_and_the_caches(tmp_path):
    """The CI-sized smoke run (AReaL's trainer and stats logger, its workers, the vLLM server), with a home
    and a temporary folder of its own, so that what it leaves there is its own."""
    assert vllm_python()
    home, root = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    # short: vLLM's sockets go in the run's folder inside it, and a socket's path takes at most 107 bytes
    temp = Path(tempfile.mkdtemp(prefix="tau2-lt-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR")}
    env.update(HOME=str(home), TMPDIR=str(temp))
    log = tmp_path / "smoke.log"
    # the tiny model from the usual cache: building it is not what this test is about
    try:
        run = start(smoke_command(root, f"smoke.cache_dir={default_cache_dir()}"), log, env)
        out = finish(run, log, root)
        assert "tau2 CPU smoke run: PASSED" in out, out[-5000:]
        left = {p for p in _listing(temp) if not p.startswith("torchinductor_")}  # torch's compile cache
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    left |= {f"~/{p}" for p in _listing(home) if p.startswith(".cache/swanlab/run-")}
    assert left == set(), sorted(left)[:20]
