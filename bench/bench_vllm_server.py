"""The vLLM CPU server with its model in the engine's process (`--distributed-executor-backend uni`, the
CPU recipes' setting) against vLLM's CPU default (`mp`: one more interpreter, the worker, holds the model):
what a server start costs, as every whole run of the CPU recipes and the test suite pays it.

    python bench/bench_vllm_server.py [--runs 3]   (Markdown)

Each run starts the launcher (`cpu/vllm_cpu_server.py`) on the tiny model, waits for `/health`, sends four
short chat requests and stops it; CPU is the user + system time of the server's whole process tree, read
just before it stops. The two settings alternate, in one session; medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import requests

from examples.tau2.cpu.smoke_config import vllm_python
from examples.tau2.cpu.tiny_model import TinyModelRecipe, ensure_tiny_model
from examples.tau2.cpu.trainer import LAUNCHER_MODULE, vllm_server_env
from examples.tau2.cpu.vllm_cpu_server import IN_ENGINE_PROCESS

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("mp", "uni")


def serve_once(model: Path, backend: str, port: int) -> tuple[float, float, int]:
    """(seconds until healthy, CPU seconds of the process tree, vLLM processes under the launcher)."""
    cmd = [vllm_python(), "-m", LAUNCHER_MODULE, "--model", str(model), "--dtype", "float32",
           "--enforce-eager", "--block-size", "32", "--max-model-len", "1024",
           "--distributed-executor-backend", backend, "--host", "127.0.0.1", "--port", str(port)]
    env = {k: v for k, v in vllm_server_env().items() if k != IN_ENGINE_PROCESS}  # the launcher decides
    started = time.monotonic()
    server = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if server.poll() is not None:
                raise SystemExit(f"the vLLM server exited:\n{server.stderr.read()[-3000:]}")
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.2)
        ready = time.monotonic() - started
        for _ in range(4):
            requests.post(f"{url}/v1/chat/completions", timeout=60, json={
                "model": str(model), "messages": [{"role": "user", "content": "hello"}], "max_tokens": 32})
        tree = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
        cpu = sum(sum(p.cpu_times()[:2]) for p in tree)
        return ready, cpu, sum("VLLM" in p.name() for p in tree)
    finally:
        os.killpg(server.pid, 15)
        server.wait(60)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="starts per setting (default: 3)")
    parser.add_argument("--port", type=int, default=18931)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as folder:
        model = ensure_tiny_model(TinyModelRecipe(), folder)
        runs: dict[str, list[tuple[float, float, int]]] = {b: [] for b in BACKENDS}
        for _ in range(args.runs):
            for backend in BACKENDS:
                runs[backend].append(serve_once(model, backend, args.port))
    ready, cpu = ({b: statistics.median(r[i] for r in runs[b]) for b in BACKENDS} for i in (0, 1))
    print(f"| vLLM CPU server, {os.cpu_count()} cores, median of {args.runs} | `mp` (vLLM's CPU default) | "
          "`uni` (the CPU recipes) | uni / mp |")
    print("|---|---|---|---|")
    print(f"| vLLM processes | {runs['mp'][0][2]} | {runs['uni'][0][2]} | |")
    print(f"| start until healthy (s) | {ready['mp']:.1f} | {ready['uni']:.1f} | "
          f"**{ready['uni'] / ready['mp']:.2f}** |")
    print(f"| CPU of the tree, start + 4 requests (s) | {cpu['mp']:.1f} | {cpu['uni']:.1f} | "
          f"**{cpu['uni'] / cpu['mp']:.2f}** |")


if __name__ == "__main__":
    main()
