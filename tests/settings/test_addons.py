"""The extension point: a config turns add-ons on by name, and the core gets them only through it."""

from __future__ import annotations

import pytest

from examples.tau2.curriculum.addon import CurriculumAddon
from examples.tau2.settings import addons
from examples.tau2.slurm.addon import SlurmAddon
from tests.tau2_train_support import load


@pytest.mark.parametrize("overrides,names", [
    ((), []),
    (("scheduler.type=slurm",), ["slurm"]),
    (("curriculum.enabled=true",), ["curriculum"]),
    (("scheduler.type=slurm", "curriculum.enabled=true"), ["slurm", "curriculum"]),
])
def test_a_config_turns_on_the_add_ons_it_names(overrides, names):
    enabled = addons.enabled(load(*overrides).config)
    assert [a.name for a in enabled] == names
    assert all(isinstance(a, addons.Addon) for a in enabled)


def test_every_add_on_resolves_and_only_scheduler_add_ons_answer_for_a_scheduler():
    assert type(addons.load("slurm")) is SlurmAddon and type(addons.load("curriculum")) is CurriculumAddon
    assert isinstance(addons.scheduler_addon("slurm"), SlurmAddon)
    assert addons.scheduler_addon("local") is None and addons.scheduler_addon("curriculum") is None


def test_an_add_on_gives_nothing_it_does_not_write():
    """The defaults leave AReaL's behaviour as it is: no scheduler, no dataloader, the workflow unchanged."""
    base, config = addons.Addon(), load().config
    assert base.problems(config) == [] and base.unavailable(config) == "" and base.plan(config) == []
    assert base.scheduler(config) is None and base.cancel_jobs("/r", "e", "t") == []
    assert base.train_dataloader([], config, batch_size=1, drop_last=False) is None
    assert base.train_workflow(config, "w", {"a": 1}) == ("w", {"a": 1})


def test_the_curriculum_add_on_changes_the_training_workflow_only(tmp_path):
    config = load("curriculum.enabled=true", f"curriculum.outcomes_dir={tmp_path}").config
    workflow, kwargs = CurriculumAddon().train_workflow(config, "plain", {"a": 1})
    assert workflow.endswith("CurriculumAgentWorkflow")
    assert kwargs == {"a": 1, "curriculum_outcomes_dir": str(tmp_path)}
