"""The test command's install from scratch (`scripts/install_all.sh`: .venv and .venv-vllm side by side, as
`scripts/test.sh` and `tau2_rl.sh smoke` run it) with pip and with uv, each from a cold download cache and
a warm one, in one session, into fresh temporary folders.

    python bench/bench_install.py [--runs 1]   (Markdown)

Cold: an empty cache folder (`PIP_CACHE_DIR`, `UV_CACHE_DIR`), and for uv its own small venv installed
too (`TAU2_UV_VENV`). Warm: the same cache again, as on a machine that has installed once before. Both
installers install the same locks with --no-deps from the same indexes (scripts/venv_lib.sh).
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
INSTALL = ["bash", "scripts/install_all.sh"]


def timed_install(installer: str, cache: Path) -> tuple[float, str]:
    """Seconds to build both venvs from nothing with `installer` and `cache`, and what the scripts said
    they used; the venvs are removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="bench-install-"))
    env = {**os.environ, "VENV": str(folder / "venv"), "VLLM_VENV": str(folder / "venv-vllm"),
           "TAU2_INSTALLER": installer, "PIP_CACHE_DIR": str(cache / "pip"),
           "UV_CACHE_DIR": str(cache / "uv"), "TAU2_UV_VENV": str(cache / "venv-uv")}
    try:
        started = time.monotonic()
        done = subprocess.run(INSTALL, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        seconds = time.monotonic() - started
        used = sorted({line.rsplit("(", 1)[-1].rstrip(")") for line in done.stderr.splitlines()
                       if ": done in " in line})
        return seconds, ",".join(used)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    runs = parser.parse_args().runs
    times: dict[tuple[str, str], list[float]] = {}
    used: dict[tuple[str, str], set[str]] = {}
    for _ in range(runs):  # alternated, so that a slow spell of the machine falls on every row
        for installer in ("pip", "uv"):
            cache = Path(tempfile.mkdtemp(prefix=f"bench-install-cache-{installer}-"))
            try:
                for state in ("cold", "warm"):
                    seconds, said = timed_install(installer, cache)
                    times.setdefault((installer, state), []).append(seconds)
                    used.setdefault((installer, state), set()).add(said)
            finally:
                shutil.rmtree(cache, ignore_errors=True)
    print(f"| install_all.sh, {runs} run(s), {os.cpu_count()} cores | installer used | median s | all s |")
    print("|---|---|---|---|")
    medians = {}
    for (installer, state), values in times.items():
        medians[installer, state] = statistics.median(values)
        print(f"| {installer}, {state} cache | {'; '.join(sorted(used[installer, state]))} | "
              f"{medians[installer, state]:.0f} | {', '.join(f'{s:.0f}' for s in values)} |")
    for state in ("cold", "warm"):
        print(f"\nuv / pip, {state} cache: {medians['uv', state] / medians['pip', state]:.2f}")


if __name__ == "__main__":
    main()
