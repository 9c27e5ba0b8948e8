"""The training controller as a SLURM job of its own (`tau2_rl.sh slurm --submit`): login nodes end long
processes, and a job's controller outlives the user's session.

    python -m examples.tau2.slurm.controller_job ARGFILE

ARGFILE holds `tau2_train.py`'s arguments, NUL-separated, written by `tau2_rl.sh` readable only by its
user (any override, however quoted, stays one argument; the proxy's admin key comes with the job's
environment, `TAU2_ADMIN_KEY`, never on a command line); it is deleted once read. The
controller then runs as `tau2_train.py` does; `scancel` of this job sends it SIGTERM, on which it stops its
workers and cancels their jobs (`runtime.process.exit_on_sigterm`), as on any other exit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from examples.tau2.runtime.process import exit_after


def read_args(path: Path) -> list[str]:
    """The arguments in `path` (NUL-separated), which is then removed."""
    try:
        data = path.read_bytes()
    finally:
        path.unlink(missing_ok=True)
    return [a.decode() for a in data.split(b"\0") if a]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m examples.tau2.slurm.controller_job ARGFILE", file=sys.stderr)
        return 2
    from examples.tau2 import tau2_train

    job = os.environ.get("SLURM_JOB_ID", "?")
    print(f"controller_job: SLURM job {job} on {os.uname().nodename}", flush=True)
    return tau2_train.main(read_args(Path(argv[0])))


if __name__ == "__main__":
    exit_after(main)
