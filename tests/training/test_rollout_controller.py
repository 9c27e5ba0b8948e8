"""training/rollout_controller.py: AReaL's rollout controller with the proxies paused exactly through a weight
swap, told the version when they start, stale groups dropped at the batch, and each version's weights kept.

In-process, the controller's calls to its workers and proxies recorded in place of AReaL's RPCs. The whole
path (a real trainer, vLLM server, proxies and episodes, asynchronous) is the smoke run's
(tests/cpu/test_smoke_faults.py), whose records tests/cpu/test_async_checks.py's checks read.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from areal.api.cli_args import InferenceEngineConfig
from areal.infra import RolloutController
from areal.infra.staleness_manager import StalenessManager
from areal.utils import stats_tracker

from examples.tau2.training.rollout_controller import GroupVersions, Tau2RolloutController
from examples.tau2.training.trainer import Tau2SGLangEngine, Tau2vLLMEngine


class Recorded(Tau2RolloutController):
    """The controller with AReaL's RPCs to workers and proxies recorded, in order, instead of sent."""

    def __init__(self, config: InferenceEngineConfig) -> None:
        super().__init__(Tau2vLLMEngine, config=config, scheduler=None)  # type: ignore[arg-type]
        self.calls: list[tuple[str, str, Any]] = []
        self._dispatcher = SimpleNamespace(pause=lambda: self.calls.append(("dispatcher", "pause", None)),
                                           resume=lambda: self.calls.append(("dispatcher", "resume", None)))

    def _collective_rpc(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        self.calls.append(("workers", method, kwargs.get("version")))
        return []

    async def _collective_rpc_async(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        self.calls.append(("workers", method, kwargs.get("meta")))
        return []

    def _proxy_collective_rpc(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        self.calls.append(("proxies", method, kwargs.get("version")))
        return []

    async def _proxy_collective_rpc_async(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        self.calls.append(("proxies", method, None))
        return []


def controller(**config: Any) -> Recorded:
    return Recorded(InferenceEngineConfig(backend="vllm:d1", consumer_batch_size=2, **config))


def test_the_training_s_rollout_engines_build_this_controller():
    config = InferenceEngineConfig(backend="sglang:d1")
    for engine in (Tau2SGLangEngine, Tau2vLLMEngine):
        made = engine.as_controller(config, scheduler=None)
        assert type(made) is Tau2RolloutController and isinstance(made, RolloutController)
        assert made.inf_engine is engine


def test_the_proxies_pause_with_the_servers_and_go_on_at_the_new_version():
    """AReaL's `pause()` (before the update) leaves the proxies serving: episodes go on up to the update's
    own server pause; from there to the new version no proxy sends a segment (an aborted one waits)."""
    c = controller()
    c._proxy_started = True
    c.pause()
    assert ("proxies", "pause", None) not in c.calls
    asyncio.run(c.pause_generation())  # the start of the weight update
    c.set_version(3)
    c.resume()
    assert c.calls == [("dispatcher", "pause", None), ("workers", "pause", None),  # AReaL's pause()
                       ("proxies", "pause", None), ("workers", "pause_generation", None),
                       ("workers", "set_version", 3), ("proxies", "set_version", 3),  # AReaL's set_version
                       ("proxies", "resume", None),  # the swap is over: the proxies go on
                       ("workers", "resume", None), ("dispatcher", "resume", None)]  # AReaL's resume()


def test_a_resume_without_a_swap_resumes_no_proxy_and_proxies_learn_the_version_at_start(monkeypatch):
    c = controller()
    c.resume()
    assert ("proxies", "resume", None) not in c.calls  # none started
    c._proxy_started, c._version = True, 7  # a recovered run (AReaL's recover sets it before proxies start)
    monkeypatch.setattr(RolloutController, "start_proxy", lambda self: None)
    c.start_proxy()
    assert c.calls[-1] == ("proxies", "set_version", 7)


def test_each_version_s_weights_are_kept_when_asked_and_removed_otherwise(tmp_path: Path):
    def update(c: Recorded, version: int) -> Path:
        folder = tmp_path / f"weight_update_v{version}"
        folder.mkdir()
        (folder / "model.safetensors").write_text(f"v{version}")
        asyncio.run(c.update_weights_from_disk(SimpleNamespace(path=str(folder), version=version,
                                                               clear_checkpoint_after_load=True)))
        assert not folder.exists() and c.calls[-1][:2] == ("workers", "update_weights_from_disk")
        return folder

    plain = controller()
    update(plain, 1)
    kept = controller()
    kept.keep_weights_dir = str(tmp_path / "weights")
    update(kept, 1)
    update(kept, 2)
    update(kept, 2)  # a resumed run loads the recovered version again: that version's weights replace it
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v1", "v2"]
    assert (tmp_path / "weights" / "v2" / "model.safetensors").read_text() == "v2"
    shutil.rmtree(tmp_path / "weights")


def trajectory(*rows: list[int]) -> dict[str, Any]:
    """A group as `prepare_batch` gets it (its tensors fetched with `to_local`): per row, the versions of its
    generated tokens after two prompt tokens."""
    width = 2 + max(len(r) for r in rows)
    versions, mask = torch.full((len(rows), width), -1), torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        versions[i, 2:2 + len(r)], mask[i, 2:2 + len(r)] = torch.tensor(r), 1
    return {"versions": SimpleNamespace(to_local=lambda: versions),
            "loss_mask": SimpleNamespace(to_local=lambda: mask)}


def test_a_group_older_than_the_limit_is_dropped_counted_as_rejected_and_replaced(monkeypatch):
    c = controller(max_head_offpolicyness=1)
    c._version = 3
    c._staleness_manager = StalenessManager(c, max_concurrent_rollouts=8, consumer_batch_size=2,
                                            max_staleness=1)
    c._staleness_manager.rollout_stat.accepted = 8
    mixed, stale = trajectory([2, 2, 3], [3]), trajectory([1, 2], [2])  # mixed: a completion resumed
    monkeypatch.setattr(RolloutController, "prepare_batch", lambda self, *a, **k: [stale, mixed])
    replacement = trajectory([3])
    c.data_generator = iter(())
    asked: list[int] = []

    def more(generator: Any, batch_size: int, dynamic_bs: bool = False) -> list[Any]:
        asked.append(batch_size)
        return [SimpleNamespace(trajectory=replacement)]

    c._dispatcher = SimpleNamespace(active_submit_and_wait=more)
    stats_tracker.export_all(reset=True)
    batch = c.prepare_batch(SimpleNamespace(batch_size=2), workflow="w")
    assert batch == [mixed, replacement] and asked == [1]  # the stale group out, one fresh one in
    stat = c._staleness_manager.rollout_stat
    assert (stat.accepted, stat.rejected) == (7, 1)  # its place freed as a rejected group's
    stats = {k.removeprefix("tau2/async/"): v for k, v in stats_tracker.export_all(reset=True).items()
             if k.startswith("tau2/async/") and not k.endswith("__count")}
    assert stats == {"version": 3.0, "versions_in_batch": 2.0, "oldest_version": 2.0, "staleness_max": 1.0,
                     "rows_of_two_versions": 1.0, "stale_groups_dropped": 1.0, "stale_rows_dropped": 2.0}


def test_a_group_s_versions_are_read_from_its_generated_tokens_only():
    versions = GroupVersions.of(torch.tensor([[-1, -1, 4, 4, 0], [-1, 5, 5, 0, 0]]),
                                torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 0, 0]]))  # 0: padding, not version 0
    assert (versions.oldest, versions.newest, versions.rows, versions.rows_of_two_versions) == (4, 5, 2, 0)
    with pytest.raises(ValueError, match="without generated tokens"):
        GroupVersions.of(torch.tensor([[-1, 0]]), torch.tensor([[0, 0]]))
