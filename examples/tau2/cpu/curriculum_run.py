"""The curriculum over real tau2 episodes on CPU: no model and no AReaL servers, the same sampling path.

Each step draws a batch the way AReaL's rollout controller does (`cycle_dataloader` over the training
dataloader, here `curriculum_dataloader`), plays `samples` episodes per row with `CurriculumAgentWorkflow`
against the scripted endpoint (tau2's own tasks, environments and evaluator), and those episodes'
outcome lines are what the sampler reads at the next draw. The policy has a fixed skill per task
(scripted `route:` rules): a third of the tasks always solved ("easy"), a third solved on even seeds
("medium"), a third never ("hard"), so the buckets must come out as retired / partial / unsolved.

    python -m examples.tau2.cpu.curriculum_run [--domain airline] [--domain-modules MOD ...] [--steps 8]
        [--batch 8] [--samples 2]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from examples.tau2.curriculum.sampler import Draw, curriculum_dataloader
from examples.tau2.settings.config import BucketWeights, CurriculumConfig

SKILLS = ("easy", "medium", "hard")


@dataclass(frozen=True)
class RunConfig:
    """One driven run: which tasks, how many steps and episodes, and the curriculum."""

    domain: str = "airline"
    domain_modules: tuple[str, ...] = ()
    """Modules that register `domain` when it is not a built-in one (docs/own_domain.md)."""
    split: str = "train"
    steps: int = 8
    batch: int = 8
    samples: int = 2
    """Episodes per row (the GRPO group); seeds 0..samples-1."""
    seed: int = 1
    curriculum: CurriculumConfig = field(default_factory=lambda: CurriculumConfig(
        enabled=True, window=4, min_attempts=2, retire_after=2, unsolved_floor=0.1,
        weights=BucketWeights(new=1.0, unsolved=0.5, partial=2.0, solved=0.5, retired=0.0)))


@dataclass(frozen=True)
class StepReport:
    step: int
    draw: Draw
    skills: dict[str, int]
    """Sampled rows per task skill."""
    episodes: int
    solved: int

    def line(self) -> str:
        skills = ", ".join(f"{s} {n}" for s, n in self.skills.items())
        return (f"step {self.step}: {self.draw.log_line()}\n        by skill: {skills}; played "
                f"{self.episodes} episodes, {self.solved} solved")


def task_skills(task_ids: list[str]) -> dict[str, str]:
    """Task id -> easy / medium / hard, in turn down tau2's order."""
    return {t: SKILLS[i % len(SKILLS)] for i, t in enumerate(task_ids)}


def skill_policy(skills: dict[str, str]) -> str:
    """The scripted endpoint's `route:` model: easy tasks oracle, medium on even seeds, hard never."""
    rules = []
    for task_id, skill in skills.items():
        if skill == "easy":
            rules.append(f"{task_id}.*=oracle")
        elif skill == "medium":
            rules += [f"{task_id}.{seed}=oracle" for seed in range(0, 16, 2)]
    return "route:" + ";".join(rules)  # no rule (hard, odd seeds): `empty`, an invalid turn, reward 0


async def drive(run: RunConfig, endpoint_url: str, outcomes: Path) -> list[StepReport]:
    """Play `run.steps` steps; returns what each drew and played."""
    from areal.utils.data import cycle_dataloader

    from examples.tau2.curriculum.addon import CurriculumAgentWorkflow
    from examples.tau2.episode import domain as tau2_domain
    from examples.tau2.settings import dataset as tau2_dataset

    tau2_domain.load_modules(run.domain_modules)
    rows = tau2_dataset.split_rows(run.domain, run.split)
    skills = task_skills([r["task_id"] for r in rows])
    loader = curriculum_dataloader(tau2_dataset.to_dataset(rows), run.curriculum, batch_size=run.batch,
                                   drop_last=True, seed=run.seed, outcomes=outcomes)
    draws: list[Draw] = []
    loader.sampler.on_draw = draws.append
    workflow = CurriculumAgentWorkflow(
        curriculum_outcomes_dir=str(outcomes), user_base_url=endpoint_url, user_model="user",
        agent_model=skill_policy(skills), llm_retries=1, retry_backoff_s=0.01, request_timeout_s=30.0,
        episode_timeout_s=300.0, domain_modules=list(run.domain_modules))
    reports = []
    batches = cycle_dataloader(loader)
    try:
        for step in range(1, run.steps + 1):
            batch = next(batches)
            results = await asyncio.gather(*(
                workflow.run_episode({**row, "seed": seed}, base_url=endpoint_url, api_key="sk-curriculum")
                for row in batch for seed in range(run.samples)))
            solved = sum(r.tau2_reward >= run.curriculum.success_threshold for r in results)
            sampled = Counter(skills[row["task_id"]] for row in batch)
            reports.append(StepReport(step, draws[-1], {s: sampled[s] for s in SKILLS}, len(results), solved))
            print(reports[-1].line(), flush=True)
    finally:
        await workflow.aclose()
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", default="airline")
    parser.add_argument("--domain-modules", nargs="+", default=[], metavar="MOD")
    parser.add_argument("--split", default="train")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    from examples.tau2.runtime.process import setup_runtime

    setup_runtime("ERROR")  # before tau2 is imported: it logs at import
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from examples.tau2.cpu.scripted_endpoint import EndpointThread

    run = RunConfig(domain=args.domain, domain_modules=tuple(args.domain_modules), split=args.split,
                    steps=args.steps, batch=args.batch, samples=args.samples, seed=args.seed)
    with EndpointThread() as endpoint, tempfile.TemporaryDirectory() as tmp:
        asyncio.run(drive(run, endpoint.url, Path(tmp) / "outcomes"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
