"""Does RL make the policy better? The CPU training run between two evaluations of the same policy.

    python -m examples.tau2.cpu.learn [--seeds 1 2 3] [--trials 8] [--out DIR] [key=value ...]
    (= bash examples/tau2/tau2_rl.sh learn ...)

For each seed, with config.yaml + configs/learn_cpu.yaml (+ the overrides), independently of the other
seeds:
1. builds or loads the seed's own tiny policy (the start of RL: `smoke.tiny_model` with the seed as its
   `seed`, so its initial weights and warm-up are the seed's own; cached);
2. evaluates it: vLLM's OpenAI server on CPU serves it, `eval.evaluate` plays every task `--trials`
   times (our workflow, the scripted `user-scenario` user, tau2's evaluator) at the training sampling
   temperature and reply length, on the seed's own episodes (`--seed-base` 1000 x seed);
3. trains it with the smoke run's code (`cpu.smoke.run`: AReaL's PPOTrainer, archon with prefix sharing,
   the vLLM CPU rollout server, AReaL's proxy), printing progress as steps finish;
4. evaluates the final checkpoint exactly as in 2, and compares the two (`eval.compare`: paired
   bootstrap interval of the difference).
Writes `learn.md` / `learn.json` (the table of all seeds) and `learn_curves.png` (per step: reward,
τ² success rate, entropy, the trainer's agreement with the rollout) into `--out`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from examples.tau2.cpu import smoke
from examples.tau2.cpu.smoke_config import MAIN_CONFIG, Tau2SmokeConfig, check_config, load_smoke_config
from examples.tau2.runtime.charts import new_figure, save_png
from examples.tau2.runtime.process import stop_descendants

logger = logging.getLogger("tau2_areal.learn")

LEARN_VARIANT = "+configs=learn_cpu"
SUCCESS = "rollout/tau2/tau2_reward"
"""Per step: mean tau2 reward of the step's episodes (0 or 1 per episode without partial credit: the success
rate)."""
ENTROPY = "ppo_actor/update/entropy/avg"
REWARD = "rollout/tau2/shaped_reward"
"""Per step: mean episode reward before any group centering (tau2 reward minus the format penalty)."""


@dataclass
class PolicyScore:
    """One evaluation of one policy: success rate over all tasks x trials, with its interval."""

    eval_dir: str
    success_rate: float
    interval: tuple[float, float]
    """Percentile bootstrap over tasks (eval.evaluate's pass^1 interval)."""
    episodes: int
    tasks: int = 0
    trusted_pass1: float | None = None
    """pass^1 over the tasks no do-nothing or half-done agent passes (None: no such task)."""
    trusted_tasks: int = 0


@dataclass
class SeedResult:
    seed: int
    before: PolicyScore
    after: PolicyScore
    steps: int
    train_s: float
    total_s: float
    entropy: list[float]
    step_success: list[float]
    smoke_problems: list[str] = field(default_factory=list)
    train_tasks: dict[str, list[int]] = field(default_factory=dict)
    """Per task: [τ² successes, episodes] of the training episodes (`training_outcomes`)."""
    domain: str = "mock"
    """The domain trained and evaluated (`econfig.domain`), on its `econfig.train_split`."""
    trainer_gap: list[float] = field(default_factory=list)
    """Per step: max |trainer - rollout logprob| on the tokens of the step's own version (nan: none)."""
    asynchrony: dict[str, int] = field(default_factory=dict)
    """What the run's records show (`cpu.async_checks`): episodes across swaps, completions interrupted and
    resumed, batches of two versions, the largest staleness."""

    @property
    def gain(self) -> float:
        return self.after.success_rate - self.before.success_rate


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the policy server exited with code {proc.returncode} before answering")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(1)
    raise TimeoutError(f"no answer from {url} within {timeout_s:.0f} s")


@contextlib.contextmanager
def serve_policy(model_dir: Path, name: str, log_path: Path, max_model_len: int) -> Iterator[str]:
    """vLLM's OpenAI server on CPU for `model_dir` (hermes tool parser), the model in the engine's process
    as in training (`vllm_cpu_server`, 5.: one interpreter fewer); yields its base URL."""
    from examples.tau2.cpu.smoke_config import vllm_python
    from examples.tau2.cpu.trainer import vllm_server_env
    from examples.tau2.cpu.vllm_cpu_server import IN_ENGINE_PROCESS, kv_cache_bytes

    port = free_port()
    env = {IN_ENGINE_PROCESS: "0", **vllm_server_env()}
    cmd = [vllm_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", name, "--distributed-executor-backend", "uni", "--dtype", "float32",
           "--enforce-eager", "--block-size", "32", "--max-model-len", str(max_model_len), "--max-num-seqs",
           "16", "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--host", "127.0.0.1", "--port",
           str(port)]
    cache = kv_cache_bytes(str(model_dir), str(max_model_len), "float32")  # as the training's launcher
    cmd += ["--kv-cache-memory-bytes", str(cache)] if cache is not None else []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", 600, proc)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


EVAL_SEED_STRIDE = 1000
"""Seed s evaluates on trial seeds 1000·s + t: every seed draws its own episodes."""


def evaluate_policy(model_dir: Path, name: str, out_dir: Path, config: Tau2SmokeConfig,
                    trials: int, seed: int) -> PolicyScore:
    """Every task of the training domain, `trials` times, on a vLLM server of its own for `model_dir`
    (`evaluate_served_policy`)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with serve_policy(model_dir, name, out_dir.with_suffix(".vllm.log"), config.vllm.max_model_len) as url:
        return evaluate_served_policy(url, name, out_dir, config, trials, seed)


def evaluate_served_policy(url: str, name: str, out_dir: Path, config: Tau2SmokeConfig, trials: int,
                           seed: int) -> PolicyScore:
    """Every task of the training domain, `trials` times, sampled as in training from the policy served at
    `url`, with seeded policy requests (`--policy-seed`, trial seeds from `EVAL_SEED_STRIDE` x seed): both
    evaluations of a seed draw the same random numbers, other seeds other ones, and evaluating one policy
    twice gives the same episodes."""
    from examples.tau2.cpu.scripted_endpoint import EndpointThread

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    e = config.econfig
    with EndpointThread() as user:
        cmd = [sys.executable, "-m", "examples.tau2.eval.evaluate", "--policy-base-url", url,
               "--policy-model", name, "--user-base-url", user.url, "--user-model", e.user_model,
               *(["--domain-modules", *e.domain_modules] if e.domain_modules else []),
               "--domains", e.domain, "--split", e.train_split, "--trials", str(trials),
               "--temperature", str(config.gconfig.temperature), "--top-p", str(config.gconfig.top_p),
               "--max-completion-tokens", str(config.gconfig.max_new_tokens),
               "--max-steps", str(e.max_steps), "--max-errors", str(e.max_errors), "--policy-seed",
               "--seed-base", str(EVAL_SEED_STRIDE * seed), "--concurrency", "8",
               "--output-dir", str(out_dir)]
        with open(out_dir.with_suffix(".eval.log"), "w") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    results = json.loads((out_dir / "results.json").read_text())
    report = results["report"]["domains"][e.domain]
    interval = report["pass_hat_k_ci"]["1"]
    trusted = report.get("trusted") or {}
    return PolicyScore(eval_dir=str(out_dir), success_rate=report["success_rate"],
                       interval=(float(interval["low"]), float(interval["high"])),
                       episodes=report["num_valid_trials"], tasks=report["num_tasks"],
                       trusted_pass1=(trusted.get("pass_hat_k") or {}).get("1"),
                       trusted_tasks=trusted.get("tasks", 0))


class ProgressPrinter:
    """Prints one line per finished training step (read from stats.jsonl): success, entropy, time left."""

    def __init__(self, stats_path: Path, total_steps: int, seed: int):
        self.stats_path, self.total, self.seed = stats_path, total_steps, seed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="learn-progress")

    def _run(self) -> None:
        seen = 0
        first: tuple[int, float] | None = None  # the first step seen, and when: start-up is not a step
        while not self._stop.wait(5):
            stats = smoke.read_stats(self.stats_path)
            for s in stats[seen:]:
                done, now = int(s["global_step"]) + 1, time.monotonic()
                if first is None:
                    first = (done, now)
                left = ("time left after the next step" if done == first[0] else
                        f"~{(now - first[1]) / (done - first[0]) * (self.total - done) / 60:.1f} min left")
                print(f"[learn seed {self.seed}] step {done}/{self.total}: success "
                      f"{s.get(SUCCESS, math.nan):.2f}, reward {s.get(REWARD, math.nan):+.3f}, entropy "
                      f"{s.get(ENTROPY, math.nan):.2f}, {left}", flush=True)
            seen = len(stats)

    def __enter__(self) -> ProgressPrinter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_seed(seed: int, trials: int, out: Path, overrides: list[str]) -> SeedResult:
    from examples.tau2.cpu.tiny_model import TinyModelRecipe, ensure_tiny_model
    from examples.tau2.cpu.trainer import STATS_FILE

    start = time.perf_counter()
    argv = ["--config", str(MAIN_CONFIG), LEARN_VARIANT, f"seed={seed}", f"trial_name=seed{seed}",
            f"++smoke.tiny_model.seed={seed}", *overrides]
    config, config_file, seed_overrides = load_smoke_config(argv)
    errors = check_config(config)
    if errors:
        raise ValueError("; ".join(errors))
    model_dir = (Path(config.actor.path) if config.actor.path else
                 ensure_tiny_model(TinyModelRecipe.from_dict(config.smoke.tiny_model),
                                   config.smoke.cache_dir or None))
    seed_out = out / f"seed{seed}"
    logger.info("seed %d: evaluating the start policy %s", seed, model_dir)
    before = evaluate_policy(model_dir, "before", seed_out / "eval-before", config, trials, seed)
    from areal.utils.stats_logger import StatsLogger

    from examples.tau2.cpu.smoke_config import total_steps

    steps = total_steps(config) or 0
    logger.info("seed %d: start success %.3f; training %d steps", seed, before.success_rate, steps)

    stats_path = Path(StatsLogger.get_log_path(config.stats_logger)) / STATS_FILE
    t, since = time.perf_counter(), time.time()
    with ProgressPrinter(stats_path, steps, seed):
        result = smoke.run(config_file, [*seed_overrides, f"actor.path={model_dir}"], config)
    train_s = time.perf_counter() - t
    train_tasks = (training_outcomes(Path(config.econfig.dump_dir), since, time.time())
                   if config.econfig.dump_dir else {})
    if not result.checkpoint:
        raise RuntimeError(f"seed {seed}: training saved no checkpoint ({'; '.join(result.problems)})")
    after = evaluate_policy(Path(result.checkpoint), "after", seed_out / "eval-after", config, trials, seed)
    subprocess.run([sys.executable, "-m", "examples.tau2.eval.compare", "compare", after.eval_dir,
                    before.eval_dir, "--output-dir", str(seed_out / "after-vs-before")],
                   check=True, stdout=subprocess.DEVNULL)
    stats = smoke.read_stats(stats_path)
    (seed_out / "stats.jsonl").write_text(stats_path.read_text())
    training = result.training
    return SeedResult(seed=seed, before=before, after=after, steps=len(stats), train_s=train_s,
                      total_s=time.perf_counter() - start, entropy=smoke._series(stats, ENTROPY),
                      step_success=smoke._series(stats, SUCCESS), smoke_problems=result.problems,
                      train_tasks=train_tasks, domain=str(config.econfig.domain),
                      trainer_gap=[s.trainer_max_gap for s in training.steps],
                      asynchrony={"episodes_across_swaps": training.episodes_across_swaps,
                                  "interrupted": training.interrupted,
                                  "mixed_batches": training.mixed_batches,
                                  "staleness_max": training.staleness_max})


def training_outcomes(dump_dir: Path, since: float, until: float) -> dict[str, list[int]]:
    """Per task: [τ² successes, episodes] of the training episodes dumped between two times (epoch s;
    the runs of a `--seeds` list share one dump folder, one after the other)."""
    outcomes: dict[str, list[int]] = {}
    for path in sorted(dump_dir.glob("*/*/*.json")):
        if not since <= path.stat().st_mtime <= until:
            continue
        episode = json.loads(path.read_text())
        counts = outcomes.setdefault(episode["task_id"], [0, 0])
        counts[0] += int(episode["tau2_reward"] >= 1.0)
        counts[1] += 1
    return dict(sorted(outcomes.items()))


def task_table(results: list[SeedResult]) -> str:
    """τ² successes / episodes per task in training, one column per seed."""
    tasks = sorted({t for r in results for t in r.train_tasks})
    lines = ["| task (training episodes) | " + " | ".join(f"seed {r.seed}" for r in results) + " |",
             "|---|" + "---|" * len(results)]
    for task in tasks:
        cells = [f"{r.train_tasks[task][0]}/{r.train_tasks[task][1]}" if task in r.train_tasks else "–"
                 for r in results]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(out: Path, results: list[SeedResult]) -> Path:
    panels = [("episode reward (before centering)", REWARD),
              ("τ² success rate of the step's episodes", SUCCESS), ("entropy", ENTROPY),
              ("max |trainer - rollout logprob|", None)]
    fig, axes = new_figure(4.2 * len(panels), 3.4, panels=len(panels), dpi=100)
    for r in results:
        stats = smoke.read_stats(out / f"seed{r.seed}" / "stats.jsonl")
        steps = [int(s["global_step"]) + 1 for s in stats]
        for ax, (_, key) in zip(axes, panels, strict=True):
            values = (smoke._series(stats, key) if key is not None else
                      [r.trainer_gap[i] if i < len(r.trainer_gap) else math.nan for i in range(len(steps))])
            ax.plot(steps, values, marker=".", label=f"seed {r.seed}")
    axes[-1].set_yscale("log")
    for ax, (title, _) in zip(axes, panels, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"tau2 {results[0].domain if results else ''}, tiny Qwen3 on CPU: RL training curves")
    return save_png(fig, out / "learn_curves.png")


def table(results: list[SeedResult], trials: int) -> str:
    lines = ["| seed | success before | success after | gain | steps | train min | total min | "
             "entropy first → last (max) | smoke checks |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        b, a = r.before, r.after
        ent = [x for x in r.entropy if not math.isnan(x)]
        entropy = f"{ent[0]:.2f} → {ent[-1]:.2f} ({max(ent):.2f})" if ent else "–"
        lines.append(f"| {r.seed} | {b.success_rate:.3f} [{b.interval[0]:.2f}, {b.interval[1]:.2f}] | "
                     f"{a.success_rate:.3f} [{a.interval[0]:.2f}, {a.interval[1]:.2f}] | {r.gain:+.3f} | "
                     f"{r.steps} | {r.train_s / 60:.1f} | {r.total_s / 60:.1f} | {entropy} | "
                     f"{'FAILED' if r.smoke_problems else 'passed'} |")
    lines.append("")
    tasks, domain = (results[0].before.tasks, results[0].domain) if results else (0, "")
    lines.append(f"success: τ² reward 1 over {tasks} {domain} tasks x {trials} trials (interval: bootstrap "
                 "over tasks, 95 %); smoke checks: the checks the smoke run enforces (cpu/SMOKE.md)")
    for r in results:
        if r.asynchrony:
            n = r.asynchrony
            lines.append(f"- seed {r.seed}, asynchrony: {n['episodes_across_swaps']} episodes across a "
                         f"weight swap, {n['interrupted']} completions interrupted and resumed, "
                         f"{n['mixed_batches']} batches of two versions, "
                         f"staleness at most {n['staleness_max']}")
    for r in results:
        b, a = r.before.trusted_pass1, r.after.trusted_pass1
        if r.after.trusted_tasks < r.after.tasks and b is not None and a is not None:
            lines.append(f"- seed {r.seed}, on the {r.after.trusted_tasks} tasks no do-nothing or "
                         f"half-done agent passes (tau2_rl.sh check-tasks): {b:.3f} → {a:.3f} ({a - b:+.3f})")
    for r in results:
        lines += [f"- seed {r.seed}: {p}" for p in r.smoke_problems]
    if any(r.train_tasks for r in results):
        lines += ["", "τ² successes / episodes per task during training:", "", task_table(results)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--trials", type=int, default=8,
                        help="evaluation trials per task (default 8: 72 episodes per evaluation; at 4 one "
                             "seeded draw moved a seed's gain by 0.028)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/tau2-areal/learn-cpu/results"))
    args, overrides = parser.parse_known_args(argv)
    bad = [o for o in overrides if "=" not in o]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (overrides are key=value)")
    from examples.tau2.lifecycle.reaper import own_temp_dir, share_temp_dir
    from examples.tau2.runtime.process import setup_runtime

    setup_runtime()
    smoke.log_progress()
    if not logger.handlers:
        logger.addHandler(logging.StreamHandler(sys.stderr))
    logger.setLevel(logging.INFO)
    args.out.mkdir(parents=True, exist_ok=True)
    results: list[SeedResult] = []
    for seed in args.seeds:
        with own_temp_dir():
            share_temp_dir()  # the CPU run's processes are all on this machine
            try:
                results.append(run_seed(seed, args.trials, args.out, overrides))
            finally:
                stop_descendants()
        (args.out / "learn.json").write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=2))
        text = table(results, args.trials)
        (args.out / "learn.md").write_text(text + "\n")
        print(text, flush=True)
    print(f"curves: {plot(args.out, results)}", flush=True)
    evals = " ".join(p for r in results for p in (r.before.eval_dir, r.after.eval_dir))
    if evals:
        print(f"browse the evaluations' episodes: bash examples/tau2/tau2_rl.sh view {evals} "
              f"--out {args.out / 'view'}", flush=True)
    failed = [r.seed for r in results if r.smoke_problems]
    if failed:
        seeds = ", ".join(map(str, failed))
        print(f"the smoke run's checks failed for seed(s) {seeds}: see {args.out / 'learn.md'}",
              file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    from examples.tau2.runtime.process import exit_after

    exit_after(main)
