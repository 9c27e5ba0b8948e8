"""AReaL 1.0.4's rollout engine, building the GRPO groups of `training/group_workflow.py`.

In AReaL 1.0.4 a group of `n_samples` episodes is `GroupedRolloutWorkflow`, in which one rejected
episode fails the whole group (with a user simulator that fails 2 % of episodes, 15 % of groups of 8
are lost; 5 %: 34 %), and each episode keeps its own reward. `PartialGroupInfEngine` is AReaL's
`RemoteInfEngine` building `PartialGroupWorkflow` of `DropRejectedProxyWorkflow` episodes instead
(a rejected episode drops only itself; the group is scored as a whole by `training.group`), and
`PartialGroupEngine` the mixin that puts it behind `RemoteSGLangEngine` / `RemotevLLMEngine` (the
rollout engines of `compat/areal_serving.py`, created in the rollout workers).
"""

from __future__ import annotations

import logging
from typing import Any

from areal.api import RolloutWorkflow
from areal.infra.remote_inf_engine import GroupedRolloutWorkflow, RemoteInfEngine

from examples.tau2.compat import require
from examples.tau2.training.group_workflow import DropRejectedProxyWorkflow, PartialGroupWorkflow

logger = logging.getLogger("tau2_areal.groups")


class PartialGroupInfEngine(RemoteInfEngine):
    """AReaL's `RemoteInfEngine` whose agent workflows are `DropRejectedProxyWorkflow`s, grouped by
    `PartialGroupWorkflow`. Other workflows (AReaL's own `RolloutWorkflow`s) resolve as in AReaL."""

    def __init__(self, *args: Any, **kwargs: Any):
        require("areal", "1.0.4", "PartialGroupInfEngine (examples/tau2/compat/areal_groups.py)")
        super().__init__(*args, **kwargs)
        self.logger = logger  # AReaL sets its own in `initialize`

    def _wrap_openai_agent(self, agent: Any, proxy_addr: str) -> RolloutWorkflow:
        cfg = self.config.agent
        if cfg.mode != "inline":
            return super()._wrap_openai_agent(agent, proxy_addr)
        return DropRejectedProxyWorkflow(
            mode=cfg.mode, agent=agent, proxy_addr=proxy_addr, admin_api_key=cfg.admin_api_key,
            discount=cfg.turn_discount, export_style=cfg.export_style,
            subproc_max_workers=cfg.subproc_max_workers, proxy_gateway_addr=self._proxy_gateway_addr)

    def _resolve_workflow(self, workflow: Any, workflow_kwargs: dict[str, Any] | None,
                          group_size: int = 1, proxy_addr: str | None = None) -> RolloutWorkflow:
        resolved = super()._resolve_workflow(workflow, workflow_kwargs, 1, proxy_addr=proxy_addr)
        if group_size == 1:
            return resolved
        if isinstance(resolved, DropRejectedProxyWorkflow):
            return PartialGroupWorkflow(resolved, group_size, self.logger)
        return GroupedRolloutWorkflow(resolved, group_size, self.logger)


class PartialGroupEngine:
    """Mixin before AReaL's `RemoteSGLangEngine` / `RemotevLLMEngine` (which delegate everything to a
    `RemoteInfEngine`): they delegate to a `PartialGroupInfEngine` with the backend of `rollout_backend`."""

    _engine: RemoteInfEngine

    def __init__(self, config: Any, *args: Any, **kwargs: Any):
        super().__init__(config, *args, **kwargs)  # type: ignore[call-arg]
        self._engine = PartialGroupInfEngine(config, self.rollout_backend(self._engine.backend))

    def rollout_backend(self, default: Any) -> Any:
        """The server backend (AReaL's SGLang or vLLM backend by default)."""
        return default
