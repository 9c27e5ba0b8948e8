"""`eval.evaluate --leaderboard`: the tau2-bench leaderboard's protocol, then tau2's own submission tools.

The protocol is what the leaderboard's checks (`tau2 submit verify-trajs`) and its table assume: tau2-bench
1.0.x, every task of the base split of airline, retail and telecom, the same number of trials of every
task (4: the table shows pass^1 to pass^4), and tau2's own reward (its reward basis, no shaping). What
the benchmark would not accept is refused before anything starts, one sentence each. After the
evaluation, tau2's `submit prepare` (interactive upstream: its questions are answered from the flags)
and `submit validate` run on the results files, and the submission's folder and track are printed.

A policy run through this project's agent harness goes to the leaderboard's "custom" track: "standard"
is for off-the-shelf models in tau2's own `tau2 run` scaffold, and fine-tuned policies are custom.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from examples.tau2.compat.tau2_release import Tau2Release, installed_release

if TYPE_CHECKING:
    from examples.tau2.eval.plan import EvalPlan

logger = logging.getLogger("tau2_areal.eval")


@dataclass(frozen=True)
class Protocol:
    """What the leaderboard runs: `PROTOCOL`; tests shrink it to stay short."""

    domains: tuple[str, ...] = ("airline", "retail", "telecom")
    split: str = "base"
    trials: int = 4


PROTOCOL = Protocol()
TRACK = "custom"
SUBMISSION_DIR = "submission"
"""Folder of the output directory that `tau2 submit prepare` writes into."""
SHAPING_FIELDS = ("partial_credit_alpha", "invalid_format_penalty")
"""Episode settings that change the reward away from tau2's own (both 0 for tau2's reward)."""


@dataclass(frozen=True)
class Contact:
    """What `tau2 submit prepare` records about who submits."""

    email: str
    organization: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "leaderboard", "run the tau2-bench leaderboard's protocol and prepare a submission with tau2's tools"
    )
    group.add_argument("--leaderboard", action="store_true",
                       help="tau2 1.0.x, the base split of airline, retail and telecom, 4 trials, tau2's own "
                            "reward; then `tau2 submit prepare` and `validate` on the results (custom track)")
    group.add_argument("--contact-email", default="", help="--leaderboard: the submission's contact email")
    group.add_argument("--organization", default="",
                       help="--leaderboard: the organization that made the model and ran the evaluation")


def protocol_problems(args: argparse.Namespace, release: Tau2Release | None = None) -> list[str]:
    """Set the protocol's domains, split and trials on `args`; every sentence naming what the benchmark
    would not accept (empty: none)."""
    p = PROTOCOL
    what = f"every task of the {p.split} split of {', '.join(p.domains)}"
    subset = (("--domains", args.domains), ("--split", args.split), ("--task-ids", args.task_ids),
              ("--limit", args.limit))
    problems = [f"--leaderboard runs {what} and accepts no subset; drop {flag}"
                for flag, given in subset if given is not None]
    if args.trials is not None and args.trials != p.trials:
        problems.append(f"--leaderboard runs {p.trials} trials of every task (the leaderboard reports pass^1 "
                        f"to pass^{p.trials} over equal trials); drop --trials")
    if not args.contact_email or not args.organization:
        problems.append("--leaderboard needs --contact-email and --organization: tau2 submit prepare records "
                        "them")
    release = release or installed_release()
    if not release.is_upstream_1_0:
        problems.append(f"--leaderboard needs tau2-bench 1.0.x, the leaderboard's release, but "
                        f"{release.label} is installed; install it with TAU2=upstream bash "
                        "scripts/install.sh (docs/tau2_releases.md)")
    args.domains, args.split, args.trials = list(p.domains), p.split, p.trials
    args.task_ids = args.limit = None
    return problems


def plan_problems(plan: EvalPlan) -> list[str]:
    """The episode settings the benchmark would not accept, one sentence each."""
    env = plan.env
    problems = [f"--leaderboard scores tau2's own reward, but {name}={getattr(env, name)} shapes it (from "
                f"--config or --{name.replace('_', '-')}); set it to 0" for name in SHAPING_FIELDS
                if getattr(env, name)]
    if env.solo_mode:
        problems.append("--leaderboard runs the benchmark's conversations with a user simulator; drop "
                        "--solo-mode")
    judged = [d for d in plan.tasks if d == "retail"]
    if judged and not env.judge_base_url:
        problems.append("--leaderboard needs an NL-assertion judge: tau2 1.0.x grades some retail tasks with "
                        "an LLM; give --judge-base-url and --judge-model")
    return problems


def _tau2_cli(args: list[str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    """tau2's own command line in a child process (the same interpreter, so the same tau2)."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.run([sys.executable, "-m", "tau2.cli", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=1800)


def prepare_answers(plan: EvalPlan, contact: Contact) -> str:
    """`tau2 submit prepare`'s questions (tau2 1.0.x, text modality), answered in the order it asks."""
    env = plan.env
    notes = (f"Policy served by an OpenAI-compatible endpoint and run through tau2's LLMAgent prompts by the "
             f"tau2_areal evaluation (eval.evaluate --leaderboard); {plan.trials} trials per task; user "
             f"simulator {env.user_model}.")
    answers = [
        plan.policy_model, env.user_model, contact.organization, contact.organization, contact.email,
        "", "",                       # contact name, GitHub user
        "n",                          # highlighted as new
        TRACK, "",                    # submission type, reasoning effort
        "", installed_release().version, notes,  # evaluation date (today), tau2 version, notes
        "n", "n",                     # modified prompts, omitted tasks
        "n", "",                      # references, model release date
    ]
    return "\n".join(answers) + "\n"


def submit(plan: EvalPlan, contact: Contact, run_file: Path) -> int:
    """tau2's `submit prepare` then `submit validate` on the evaluation's results files; 0 when both
    accept them. A run with trials missing from the files (rejected) is not submitted."""
    record = json.loads(run_file.read_text(encoding="utf-8"))["tau2_results"]
    if record["left_out"]:
        logger.error("not submitted: %d trials are missing from tau2's results files (%s lists them), and "
                     "the leaderboard needs every trial of every task; rerun the same command to retry them",
                     len(record["left_out"]), run_file)
        return 1
    out = plan.output_dir / SUBMISSION_DIR
    files = list(record["files"].values())
    prepared = _tau2_cli(["submit", "prepare", *files, "--output", str(out)], prepare_answers(plan, contact))
    print(prepared.stdout, end="", flush=True)
    made = sorted(out.glob("*/submission.json"), key=lambda p: p.stat().st_mtime)
    if prepared.returncode != 0 or "Submission prepared successfully" not in prepared.stdout or not made:
        last = (prepared.stderr.strip().splitlines() or ["see its output above"])[-1]
        logger.error("tau2 submit prepare did not prepare a submission (exit status %d): %s",
                     prepared.returncode, last)
        return 1
    folder = made[-1].parent
    validated = _tau2_cli(["submit", "validate", str(folder)])
    print(validated.stdout, end="", flush=True)
    accepted = "Submission metrics validation successful" in validated.stdout and "❌" not in validated.stdout
    if validated.returncode != 0 or not accepted:
        logger.error("tau2 submit validate did not accept the submission in %s (its output is above)", folder)
        return 1
    print(f"leaderboard submission: {folder} (track: {TRACK}; a fine-tuned policy in this project's harness)",
          flush=True)
    return 0
