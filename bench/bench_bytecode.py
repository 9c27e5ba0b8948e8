"""A process's imports with the venv's compiled bytecode, against the same imports compiled from source, as
in a venv installed without it (uv's default) where PYTHONDONTWRITEBYTECODE is set (many CI and container
images): every process then compiles every module it imports, every time.

    python bench/bench_bytecode.py [--runs 3]   (Markdown)

Each import runs in a fresh interpreter with PYTHONDONTWRITEBYTECODE=1, alternately with the venv's
`__pycache__` and with `-X pycache_prefix=<an empty folder>`, where Python finds no bytecode (and, not
allowed to write, leaves none): what an uncompiled venv costs each process. The imports are those of the
processes a smoke run starts: AReaL's worker (trainer and rollout roles), the training entry, and the vLLM
server's (three such processes per server).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

IMPORTS = {
    "AReaL's worker (rpc_server)": ("venv", "import areal.infra.rpc.rpc_server"),
    "the training entry (tau2_train)": ("venv", "import examples.tau2.tau2_train"),
    "a vLLM server process (vllm + its engine)":
        ("vllm", "import vllm.entrypoints.launchers.api_server.entry, vllm.v1.engine.core"),
}


def timed_import(python: str, code: str, prefix: str | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of `python -c code` in a fresh interpreter."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [python, *(["-X", f"pycache_prefix={prefix}"] if prefix else []), "-c", code]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs of each import in each mode (alternating)")
    args = parser.parse_args(argv)
    from examples.tau2.cpu.smoke_config import vllm_python

    pythons = {"venv": sys.executable, "vllm": vllm_python()}
    print("| import, fresh interpreter (median of "
          f"{args.runs}) | compiled: wall / CPU | from source: wall / CPU | compiled / from source (wall) |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-bytecode-") as empty:
        for label, (venv, code) in IMPORTS.items():
            compiled, source = [], []
            timed_import(pythons[venv], code, None)  # the page cache warm for both modes
            for _ in range(args.runs):
                compiled.append(timed_import(pythons[venv], code, None))
                source.append(timed_import(pythons[venv], code, empty))
            cw, cc = (statistics.median(x) for x in zip(*compiled, strict=True))
            sw, sc = (statistics.median(x) for x in zip(*source, strict=True))
            print(f"| {label} | {cw:.1f} s / {cc:.1f} s | {sw:.1f} s / {sc:.1f} s | **{cw / sw:.2f}** |",
                  flush=True)


if __name__ == "__main__":
    main()
