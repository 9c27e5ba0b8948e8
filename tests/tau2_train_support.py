"""Shared by the training-entry tests: the example config with overrides, a clean baseline, fake models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from examples.tau2.settings.config import LoadedConfig, load_config

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "tau2" / "config.yaml"

# Qwen3-1.7B's config.json fields that parallel degrees depend on.
QWEN3_1_7B: dict[str, Any] = {
    "model_type": "qwen3", "num_attention_heads": 16, "num_key_value_heads": 8, "num_hidden_layers": 28,
    "tie_word_embeddings": True,
}


def load(*overrides: str) -> LoadedConfig:
    return load_config(["--config", str(CONFIG), *overrides])


def clean_overrides(tmp_path: Path, user_url: str) -> list[str]:
    """Overrides under which `validate` finds nothing on this machine: a reachable (scripted) user
    simulator, a non-default proxy admin key, writable shared directories."""
    return [
        f"cluster.fileroot={tmp_path / 'fileroot'}",
        f"cluster.name_resolve.nfs_record_root={tmp_path / 'name_resolve'}",
        f"econfig.user_base_url={user_url}",
        "econfig.user_model=user",
        "rollout.agent.admin_api_key=test-secret",
    ]


def write_model(directory: Path, **fields: Any) -> Path:
    """A checkpoint directory with only a config.json (Qwen3-1.7B's shape unless overridden)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**QWEN3_1_7B, **fields}))
    return directory


def trainer_without_areal_init(monkeypatch: Any, config: Any, **attributes: Any) -> Any:
    """A `Tau2PPOTrainer` whose AReaL `PPOTrainer.__init__` (which would start a cluster) only sets a
    recover handler, a saver and `attributes` (e.g. `rollout`, `scheduler`), so that the trainer's own
    overrides run against AReaL's real class."""
    from areal import PPOTrainer
    from areal.api import FinetuneSpec
    from areal.api.cli_args import RecoverConfig, SaverConfig
    from areal.utils.recover import RecoverHandler
    from areal.utils.saver import Saver

    from examples.tau2.training.trainer import Tau2PPOTrainer

    def init(self: Any, config: Any, **_: Any) -> None:
        self.config = config
        spec = FinetuneSpec(total_train_epochs=1, dataset_size=4, train_batch_size=1)
        names = {"experiment_name": "e", "trial_name": "t", "fileroot": "/x"}
        self.recover_handler = RecoverHandler(RecoverConfig(mode="auto", freq_steps=1, **names), spec)
        self.saver = Saver(SaverConfig(**names), spec)
        self.scheduler = None
        for name, value in attributes.items():
            setattr(self, name, value)

    monkeypatch.setattr(PPOTrainer, "__init__", init)
    return Tau2PPOTrainer(config)
