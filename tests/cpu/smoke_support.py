"""What a passing CI-sized smoke run must show, and how the end-to-end tests start, watch and stop one
(on this machine: tests/cpu/test_smoke_faults.py; through SLURM: tests/slurm/test_smoke_on_slurm.py)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 1200

CI_OVERRIDES = ["total_train_steps=2", "econfig.max_steps=8"]
"""The CI-sized smoke run: 2 steps of 2 tasks x 4 episodes, up to 8 tau2 steps each (the full one: 3 steps,
12 tau2 steps): the second step trains what the first swap interrupted."""


def check_passing_run(summary: dict, root: Path) -> None:
    """Everything the smoke run promises: steps applied, weights changed, every trained token of the weights
    of its version label and the trainer agreeing with the rollout (within 1 +- 0.05), asynchronous as
    configured (episodes across swaps, completions interrupted and resumed, batches of two versions), rows
    that are the turns taken, every prompt equal to the vLLM server's, episodes dumped, a plot, and no
    process of the run (`root` in its command line) left behind."""
    s = summary
    assert s["steps"] >= 2 and not s["problems"], s
    training = s["training"]
    tolerance = math.log(1 / 0.95)
    assert training["versions"] and all(v["max_gap"] <= tolerance for v in training["versions"]), training
    gaps = [step["trainer_max_gap"] for step in training["steps"] if step["on_policy_tokens"]]
    assert gaps and all(g <= tolerance for g in gaps), training["steps"]
    # vLLM's, the trainer's and transformers' kernels differ, so two real computations never agree bit for
    # bit: an exact 0 everywhere would mean one side's logprobs were compared with themselves.
    assert any(g > 0 for g in gaps) and any(v["max_gap"] > 0 for v in training["versions"])
    assert training["rows_matched"] == training["rows_trained"] > 0
    if training["max_head_offpolicyness"]:  # the run's own check made these non-vacuous: shown here
        assert training["episodes_across_swaps"] > 0, training
        assert any(step["rows_of_two_versions"] for step in training["steps"]), training
        assert any(len(step["versions"]) > 1 for step in training["steps"]), training
    # the weights move exactly when some step trained on a nonzero advantage (a group with two rewards)
    assert (s["weights_changed"] > 0) == any(a != 0.0 for a in s["advantage_max_abs"]), s
    assert all(n > 0 for n in s["rows_trained"])
    # every step compared the prompts AReaL's proxy rendered with the vLLM server's own: all identical
    assert all(n > 0 for n in s["parity_requests"]) and not any(s["parity_differing"]), s
    assert s["episode_dumps"] > 0
    assert Path(s["paths"]["plot"]).is_file()
    # the trajectory browser the run names builds over its real dumps, a column per step
    from examples.tau2.eval.view import build_site

    assert s["view_command"].startswith(f"bash examples/tau2/tau2_rl.sh view {s['paths']['dumps']} --out ")
    per_step = int(s["view_command"].rsplit(" ", 1)[1])
    counts = build_site([Path(s["paths"]["dumps"])], root / "view", per_step)
    assert counts["episodes"] == s["episode_dumps"], counts
    assert counts["columns"] == -(-counts["episodes"] // per_step), counts
    leftover = [p.info for p in psutil.process_iter(["pid", "cmdline"])
                if str(root) in " ".join(p.info["cmdline"] or [])]
    assert not leftover, leftover


def format_result_for_log(summary: dict) -> str:
    versions = [step["versions"] for step in summary["training"]["steps"]]
    timings = {name: round(s) for name, s in summary["timings_s"].items()}
    return (f"smoke: {summary['steps']} steps, tokens by version {versions}, "
            f"rows {summary['rows_trained']}, timings s {timings}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smoke_command(root: Path, *overrides: str, user_port: int | None = None) -> list[str]:
    """The CI-sized smoke run with everything under `root`."""
    return [sys.executable, "-m", "examples.tau2.cpu.smoke", f"cluster.fileroot={root}",
            f"cluster.name_resolve.nfs_record_root={root}/name_resolve",
            f"econfig.user_base_url=http://127.0.0.1:{user_port or free_port()}/v1", *CI_OVERRIDES,
            *overrides]


def processes_of(root: Path) -> list[psutil.Process]:
    """Every process whose command line names the run's directory (workers, shells, the reaper)."""
    return [p for p in psutil.process_iter(["cmdline"]) if str(root) in " ".join(p.info["cmdline"] or [])]


def cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def kill_all(proc: subprocess.Popen, root: Path) -> None:
    """Whatever is left of a run: its process group, and anything naming its directory (and children)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for p in processes_of(root):
        with contextlib.suppress(psutil.Error):
            for q in [*p.children(recursive=True), p]:
                with contextlib.suppress(psutil.Error):
                    q.kill()


_TROUBLE = re.compile(r"ERROR|Traceback|Error\b|PROBLEM|^smoke:|^tau2 |watchdog|stopp")


def log_excerpt(log: Path) -> str:
    """The log's errors and the run's own lines, then its tail. A worker's output is buffered in a pipe and
    can land as one block when the worker ends, hiding the controller's last words above it."""
    text = log.read_text()
    trouble = [line[:300] for line in text.splitlines() if _TROUBLE.search(line)][-40:]
    return "errors and the run's own lines:\n" + "\n".join(trouble) + "\n... the tail:\n" + text[-4000:]


def wait_for(predicate, proc: subprocess.Popen, log: Path, timeout_s: float, what: str) -> float:
    """Seconds until `predicate()`; fails the test if the run ends first or `timeout_s` passes."""
    start_s = time.monotonic()
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"the run ended (rc {proc.returncode}) before {what}:\n{log_excerpt(log)}")
        if time.monotonic() - start_s > timeout_s:
            pytest.fail(f"no {what} within {timeout_s:.0f} s:\n{log_excerpt(log)}")
        time.sleep(0.2)
    return time.monotonic() - start_s


def stats_rows(root: Path) -> list[dict]:
    """The run's `stats.jsonl` (one row per committed step), or [] before the first."""
    stats = next(root.glob("logs/**/stats.jsonl"), None)
    if stats is None:
        return []
    return [json.loads(line) for line in stats.read_text().splitlines() if line.strip()]


def stats_steps(root: Path) -> list[int]:
    return [row["global_step"] for row in stats_rows(root)]
