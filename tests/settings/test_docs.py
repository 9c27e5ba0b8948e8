"""config.yaml's setting comments and docs/episode.md's settings table say what the fields' docstrings say."""

from __future__ import annotations

import pytest

from examples.tau2.settings.config import Tau2TrainEnvConfig
from examples.tau2.settings.docs import (
    CONFIG_YAML,
    EPISODE_MD,
    describe,
    field_docs,
    first_sentence,
    render_config,
    render_episode_md,
)
from examples.tau2.tau2_utils import Tau2EnvConfig

REWRITE = "rewrite it with: python -m examples.tau2.settings.docs"


def test_config_yaml_comments_are_the_docstrings():
    text = CONFIG_YAML.read_text()
    assert render_config(text) == text, REWRITE


def test_episode_md_settings_table_is_the_docstrings():
    text = EPISODE_MD.read_text()
    assert render_episode_md(text) == text, REWRITE


def test_an_edited_comment_or_row_is_written_back():
    """What the two tests above rely on: a copy edited by hand does not survive rendering."""
    config = CONFIG_YAML.read_text()
    comment = "# Failed tool calls after which tau2 ends the episode."
    assert comment in config
    edited = config.replace(comment, "# failed tool calls before tau2 gives up")
    assert render_config(edited) == config
    table = EPISODE_MD.read_text()
    row = "| Failed tool calls after which tau2 ends the episode. |"
    assert row in table
    assert render_episode_md(table.replace(row, "| Failed tool calls. |")) == table
    with pytest.raises(ValueError, match="max_stepz is not a field of Tau2TrainEnvConfig"):
        render_config(config.replace("  max_steps: 100", "  max_stepz: 100"))


def test_a_field_is_described_by_its_first_sentence_and_its_choices():
    assert first_sentence("A URL, e.g. http://h:1/v1. Unused in solo mode.") == "A URL, e.g. http://h:1/v1."
    assert first_sentence("Version 1.0.x grades it.\nMore.") == "Version 1.0.x grades it."
    assert describe(Tau2TrainEnvConfig, "reward_baseline") == (
        "What an episode trains on: \"none\", its reward; \"group_mean\", its reward minus the mean of its "
        "GRPO group's finished episodes (`tau2_utils.py`: within-task comparisons only). One of none, "
        "group_mean.")
    # A derived field re-declared without a docstring keeps the episode field's.
    assert field_docs(Tau2TrainEnvConfig)["temperature"] == field_docs(Tau2EnvConfig)["temperature"]
