"""What a passing CI-sized smoke run must show, shared by the end-to-end tests that run one."""

from __future__ import annotations

from pathlib import Path

import psutil

CI_OVERRIDES = ["total_train_steps=2", "gconfig.n_samples=3", "econfig.max_steps=8"]
"""The CI-sized smoke run: 2 steps of 2 tasks x 3 episodes (the full one: 3 steps x 2 x 4)."""


def check_passing_run(summary: dict, root: Path) -> None:
    """Everything the smoke run promises: steps applied, weights changed, rollout and trainer logprobs
    agreeing (ratio within 1 +- 0.05, every token), rows trained, every prompt equal to the vLLM server's,
    episodes dumped, a plot, and no process of the run (`root` in its command line) left behind."""
    s = summary
    assert s["steps"] >= 2 and not s["problems"], s
    assert all(abs(r - 1.0) <= 0.05 for r in s["logprob_ratio"]), s["logprob_ratio"]
    assert min(s["logprob_ratio_min"]) >= 0.95 and max(s["logprob_ratio_max"]) <= 1.05, s
    # vLLM's and the trainer's kernels differ, so two real computations never agree bit for bit:
    # an exact 1 everywhere would mean one side's logprobs were compared with themselves.
    assert any(lo < 1.0 or hi > 1.0 for lo, hi in zip(s["logprob_ratio_min"], s["logprob_ratio_max"],
                                                       strict=True))
    assert s["weights_changed"] > 0 and s["weight_rel_change"] > 0
    assert all(n > 0 for n in s["rows_trained"])
    # every step compared the prompts AReaL's proxy rendered with the vLLM server's own: all identical
    assert all(n > 0 for n in s["parity_requests"]) and not any(s["parity_differing"]), s
    assert s["episode_dumps"] > 0
    assert Path(s["paths"]["plot"]).is_file()
    leftover = [p.info for p in psutil.process_iter(["pid", "cmdline"])
                if str(root) in " ".join(p.info["cmdline"] or [])]
    assert not leftover, leftover


def format_result_for_log(summary: dict, wall: float) -> str:
    return (f"smoke: {summary['steps']} steps in {wall:.0f} s, ratio {summary['logprob_ratio']}, "
            f"rows {summary['rows_trained']}, timings {summary['timings_s']}")
