"""`EvalPlan`: everything one evaluation needs, validated, and which of its settings make two runs
comparable (`settings()`) or only record where and how it ran (`session()`). `evaluate.py` builds it from
the command line; the leaderboard and τ²'s Results files read it."""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.tau2.compat import installed_version
from examples.tau2.compat.tau2_release import installed_release
from examples.tau2.eval.metrics import SUCCESS_THRESHOLD, BootstrapConfig, TaskTrust
from examples.tau2.tau2_utils import Tau2EnvConfig

TRAINING_ONLY_FIELDS = ("reward_baseline", "drop_uniform_groups")
"""Tau2EnvConfig fields that shape what a training step learns from, never a score: evaluation returns
raw rewards of single episodes (no flag, not in run.json)."""
EVAL_OWNED_FIELDS = ("agent_model", "max_concurrent_episodes", "dump_dir", *TRAINING_ONLY_FIELDS)
"""Tau2EnvConfig fields the evaluation sets itself (--policy-model, --concurrency, <output-dir>/dumps)."""
OPERATIONAL_FIELDS = (
    "user_base_url", "user_api_key_env", "judge_base_url", "judge_api_key_env", "episode_timeout_s",
    "request_timeout_s", "llm_retries", "retry_backoff_s", "max_concurrent_episodes", "dump_dir",
    "tau2_log_level", "tau2_release",
)
"""Fields that change where or how robustly episodes run, not what they score: recorded, not compared."""


@dataclass
class EvalPlan:
    """Everything one evaluation needs, validated."""

    output_dir: Path
    tasks: dict[str, list[str]]
    split: str
    trials: int
    concurrency: int
    policy_base_url: str
    policy_api_key_env: str
    env: Tau2EnvConfig
    config_file: str
    config_overrides: tuple[str, ...] = ()
    """`--config-override`s composed into `config_file` (recorded in the session; the episode settings
    they give are in `settings()`)."""
    bootstrap: BootstrapConfig = dataclasses.field(default_factory=BootstrapConfig)
    """How results.md's intervals are computed: reporting only, so not in `settings()`."""
    seed_base: int = 0
    """Trial t uses seed `seed_base + t`: another base draws other episodes of the same policy."""
    inputs: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    """domain -> task id -> the key of what its trials depend on (`eval.inputs.task_keys`)."""
    trust: TaskTrust = dataclasses.field(default_factory=lambda: TaskTrust({}, {}))
    """Which of the tasks a do-nothing or half-done agent passes (`eval.evaluate.task_trust`)."""

    def seed(self, trial: int) -> int:
        return self.seed_base + trial

    @property
    def policy_model(self) -> str:
        return self.env.agent_model

    def settings(self) -> dict[str, Any]:
        """What makes two runs comparable. Resuming requires these to be equal."""
        env = self.env.to_kwargs()
        return {
            "domains": list(self.tasks),
            "split": self.split,
            "tasks": self.tasks,
            "trials": self.trials,
            "seeds": "trial index" if not self.seed_base else f"{self.seed_base} + trial index",
            "success_threshold": SUCCESS_THRESHOLD,
            "policy_model": self.policy_model,
            "user_model": self.env.user_model,
            "episode": {k: v for k, v in env.items()
                        if k not in OPERATIONAL_FIELDS and k not in ("agent_model", "user_model")
                        and k not in TRAINING_ONLY_FIELDS},
            "tau2": installed_release().label,
            "versions": {"areal": installed_version("areal")},
        }

    def session(self) -> dict[str, Any]:
        """Where and how this session ran; recorded, never compared."""
        env = self.env.to_kwargs()
        return {
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "policy_base_url": self.policy_base_url,
            "policy_api_key_env": self.policy_api_key_env,
            "concurrency": self.concurrency,
            "config_file": self.config_file,
            "config_overrides": list(self.config_overrides),
            "operational": {k: v for k, v in env.items() if k in OPERATIONAL_FIELDS},
            "python": sys.version.split()[0],
        }

    def all_trials(self) -> list[tuple[str, str, int]]:
        """Every (domain, task, trial), trial-major: an interrupted run has covered tasks evenly."""
        return [(d, t, trial) for trial in range(self.trials) for d, ids in self.tasks.items() for t in ids]
