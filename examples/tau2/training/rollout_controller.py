"""`Tau2RolloutController`: AReaL 1.0.4's rollout controller made safe for asynchronous training.

With `rollout.max_head_offpolicyness` > 0 episodes run on while the trainer trains, and the weights are
swapped under them. AReaL 1.0.4 gets three things wrong there, each fixed here in the controller process:

1. Proxies through a swap. `pause()` stops the rollout workers from starting episodes but leaves AReaL's
   proxies serving the running ones: a completion the servers abort for the weight update is sent again at
   once, served by whatever the servers then hold, and its tokens labelled with the version current when
   the proxy reads the answer. Here the proxies pause when the servers do (`pause_generation`, the start
   of every engine's weight update) and go on once the new version is set (`set_version`): an aborted
   completion (its tokens so far labelled with the version that made them) waits in its proxy and is
   finished by the new weights, labelled with the new version. Episodes keep running up to that moment,
   and again from it through the step's save and statistics.
2. Versions after a resume. Proxies start after a recovery has set the version and are never told it,
   so they label the first step's tokens 0; `start_proxy` tells them.
3. Staleness. 1.0.4 bounds how many groups may start ahead of the trainer, not how old a group's tokens
   are when it is trained: a slow group can arrive many versions late. `prepare_batch` drops every group
   with a token older than the current version minus `max_head_offpolicyness` (counted; it frees its
   place as a rejected group does) and waits for fresh ones instead.

Each step's batch is described in the stats (`tau2/async/*`: the versions it holds, its staleness, rows
whose completion a swap interrupted, groups dropped as stale). With `keep_weights_dir` set, each version's
weights are kept there (`v<N>`) instead of being deleted after the server loaded them: the smoke run checks
every token against the weights of its label.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from areal.infra import RolloutController
from areal.infra.rpc.rtensor import RTensor
from areal.infra.utils.concurrent import run_async_task
from areal.utils import stats_tracker

logger = logging.getLogger("tau2_areal.rollout")


@dataclass(frozen=True)
class GroupVersions:
    """The policy versions of one group's generated tokens (a trajectory of `prepare_batch`)."""

    oldest: int
    newest: int
    rows: int
    rows_of_two_versions: int
    """Rows whose tokens came from more than one version: completions a swap interrupted and resumed."""
    versions: frozenset[int]

    @classmethod
    def of(cls, versions: torch.Tensor, loss_mask: torch.Tensor) -> GroupVersions:
        """From a group's `versions` and `loss_mask` ([rows, tokens]; the mask marks generated tokens)."""
        generated = loss_mask.bool()
        seen = versions[generated]
        if seen.numel() == 0:
            raise ValueError("a group without generated tokens")
        per_row = [set(row[mask].tolist()) for row, mask in zip(versions, generated, strict=True)]
        return cls(oldest=int(seen.min()), newest=int(seen.max()), rows=len(per_row),
                   rows_of_two_versions=sum(len(v) > 1 for v in per_row), versions=frozenset(seen.tolist()))


class Tau2RolloutController(RolloutController):
    """AReaL's `RolloutController` with the three changes of the module docstring."""

    keep_weights_dir: str = ""
    """Where each version's weights are kept (`v<N>`, the disk weight update's folder); empty: deleted."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._proxies_paused = False

    def start_proxy(self) -> None:
        super().start_proxy()
        self._proxy_collective_rpc("set_version", version=self.get_version(), http_timeout=60.0)

    async def pause_generation(self) -> None:
        """The servers' pause at the start of every weight update (each engine's `update_weights` asks for
        it): the proxies first, so that a completion the servers abort waits in its proxy (its tokens so
        far labelled with the version that made them) instead of being sent again at once."""
        if self._proxy_started:
            await self._proxy_collective_rpc_async("pause", http_timeout=60.0)
            self._proxies_paused = True
        await super().pause_generation()

    def set_version(self, version: int) -> None:
        """AReaL's, then the proxies paused for the swap go on, under the new weights and version."""
        super().set_version(version)
        self._resume_proxies()

    def resume(self) -> None:
        """The proxies (if a swap left them paused), then AReaL's: the workers, then new episodes."""
        self._resume_proxies()
        super().resume()

    def _resume_proxies(self) -> None:
        if self._proxies_paused:
            self._proxy_collective_rpc("resume", http_timeout=60.0)
            self._proxies_paused = False

    async def update_weights_from_disk(self, meta: Any) -> None:
        """AReaL's (the servers load `meta.path`, which is then removed), keeping the folder as
        `keep_weights_dir/v<version>` when that is set."""
        meta.clear_checkpoint_after_load = False
        await self._collective_rpc_async("update_weights_from_disk", meta=meta)
        if self.keep_weights_dir:
            kept = Path(self.keep_weights_dir) / f"v{meta.version}"
            shutil.rmtree(kept, ignore_errors=True)  # a resumed run's: the same version's weights again
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(meta.path, kept)
        else:
            shutil.rmtree(meta.path, ignore_errors=True)

    def prepare_batch(self, dataloader: Any, workflow: Any, workflow_kwargs: dict[str, Any] | None = None,
                      should_accept_fn: str | None = None, group_size: int = 1,
                      dynamic_bs: bool = False) -> list[dict[str, Any]]:
        """AReaL's batch of `dataloader.batch_size` groups, none with a token older than the current version
        minus `max_head_offpolicyness`: a stale group is dropped and replaced by a fresh one."""
        current, limit = self.get_version(), self.config.max_head_offpolicyness
        batch = super().prepare_batch(dataloader, workflow, workflow_kwargs, should_accept_fn, group_size,
                                      dynamic_bs)
        fresh: list[tuple[dict[str, Any], GroupVersions]] = []
        dropped_groups = dropped_rows = 0
        while batch:
            for trajectory in batch:
                versions = GroupVersions.of(trajectory["versions"].to_local(),
                                            trajectory["loss_mask"].to_local())
                if current - versions.oldest <= limit:
                    fresh.append((trajectory, versions))
                    continue
                dropped_groups, dropped_rows = dropped_groups + 1, dropped_rows + versions.rows
                self._drop_stale(trajectory, versions, current)
            missing = 0 if dynamic_bs else dataloader.batch_size - len(fresh)
            batch = self._more_groups(missing) if missing > 0 else []
        kept = [v for _, v in fresh]
        in_batch = frozenset().union(*(v.versions for v in kept)) if kept else frozenset()
        stats_tracker.scalar(**{
            "tau2/async/version": float(current),
            "tau2/async/versions_in_batch": float(len(in_batch)),
            "tau2/async/oldest_version": float(min(in_batch, default=current)),
            "tau2/async/staleness_max": float(current - min(in_batch, default=current)),
            "tau2/async/rows_of_two_versions": float(sum(v.rows_of_two_versions for v in kept)),
            "tau2/async/stale_groups_dropped": float(dropped_groups),
            "tau2/async/stale_rows_dropped": float(dropped_rows)})
        return [trajectory for trajectory, _ in fresh]

    def _more_groups(self, count: int) -> list[dict[str, Any]]:
        """`count` more accepted groups from the same data stream (AReaL's `prepare_batch` made it)."""
        results = self.dispatcher.active_submit_and_wait(self.data_generator, batch_size=count)
        return [r.trajectory for r in results if r is not None and r.trajectory is not None]

    def _drop_stale(self, trajectory: dict[str, Any], versions: GroupVersions, current: int) -> None:
        """Free the group's tensors on its worker and count it as rejected: AReaL's staleness gate counts
        accepted groups as trained, and a group that is not would hold a place for ever."""
        logger.warning("a group of %d rows dropped as stale: its oldest token is of version %d, the batch "
                       "trains version %d (rollout.max_head_offpolicyness %d)", versions.rows,
                       versions.oldest, current, self.config.max_head_offpolicyness)
        manager = self.staleness_manager
        with manager.lock:
            manager.rollout_stat.accepted -= 1
            manager.rollout_stat.rejected += 1
        shards = RTensor.collect_shards(trajectory)

        async def clear() -> None:
            for node, shard_ids in shards.items():
                await RTensor.clear_node(node, shard_ids)

        run_async_task(clear)
