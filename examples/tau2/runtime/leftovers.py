"""What a run would leave outside its own folders and the caches, kept in a folder it removes.

Libraries leave temporary files behind when their process is killed, or leaves with `os._exit` as the
commands do (`runtime/process.py`: `exit_after`): W&B's `tmp*wandb-*` folders, made at import, vLLM's
`vllm_dist_*` rendezvous files and ZMQ sockets; and SwanLab keeps a run it does not save in
`~/.cache/swanlab`. The commands run inside `own_temp_dir`; `Tau2PPOTrainer` names SwanLab's run
(`discard_swanlab_run`).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

TEMP_ENV = "TMPDIR"
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
_discarded: list[Path] = []


@contextlib.contextmanager
def own_temp_dir(children: bool = False) -> Iterator[Path]:
    """This process's temporary files go to a folder of their own (with `children` or after `share_temp_dir`,
    those of the processes it starts too), removed when the block ends with what `discard_on_exit` named.

    Enter it before the run's checks: they import W&B, which makes its folders then. The folder is short
    and in the system's temporary folder (a Unix socket's path must stay under 108 bytes).
    """
    folder = Path(tempfile.mkdtemp(prefix="tau2-"))
    saved_env = {k: os.environ.get(k) for k in (TEMP_ENV, INDUCTOR_CACHE_ENV)}
    saved_tempdir = tempfile.tempdir
    tempfile.tempdir = str(folder)  # this process has read TMPDIR already
    try:
        if children:
            share_temp_dir()
        yield folder
    finally:
        tempfile.tempdir = saved_tempdir
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for path in [folder, *_discarded]:
            shutil.rmtree(path, ignore_errors=True)
        _discarded.clear()


def share_temp_dir() -> None:
    """The processes this one starts from now on use its `own_temp_dir` folder too, until the block ends.
    Only for processes on this machine: SLURM's workers run on nodes that do not have the folder. Torch's
    compile cache stays where it was (it is a cache)."""
    folder = tempfile.gettempdir()  # own_temp_dir's, in the system's temporary folder
    os.environ.setdefault(INDUCTOR_CACHE_ENV,
                          os.path.join(os.path.dirname(folder), f"torchinductor_{getpass.getuser()}"))
    os.environ[TEMP_ENV] = folder


def discard_on_exit(path: str | Path) -> None:
    """Remove `path` when the `own_temp_dir` block ends: a folder a library makes outside the run's folders
    whatever its settings say (`discard_swanlab_run`)."""
    _discarded.append(Path(path))


def discard_swanlab_run() -> None:
    """SwanLab keeps a run it does not save (AReaL's stats logger starts one whatever the config says, in the
    disabled mode by default) in its cache folder, `~/.cache/swanlab/run-*`, and never removes it: this
    process's goes with its `own_temp_dir` folder."""
    swanlab = sys.modules.get("swanlab")  # imported by AReaL's stats logger
    run = swanlab.get_run() if swanlab is not None else None
    if run is None:
        return
    import platformdirs

    if Path(run.public.swanlog_dir) == Path(platformdirs.user_cache_dir("swanlab", "SwanHubX")):
        discard_on_exit(run.public.run_dir)
