"""`Tau2PPOTrainer`: AReaL 1.0.4's `PPOTrainer` with every change this project makes to AReaL's behaviour
(each listed in `compat/replaced.py`'s `AREAL` table): served-prompt rendering, group scoring, atomic
recover saves after the step's stats, watchdogs and stop requests, and the add-ons' scheduler and
dataloader.
"""

from __future__ import annotations

import dataclasses
import logging
from copy import deepcopy
from pathlib import Path
from typing import Any

from areal import PPOTrainer
from areal.api import ModelRequest, ModelResponse, RolloutWorkflow
from areal.api.cli_args import (
    InferenceEngineConfig,
    SchedulingStrategy,
    SchedulingStrategyType,
    SGLangConfig,
    vLLMConfig,
)
from areal.engine.sglang_remote import RemoteSGLangEngine
from areal.engine.vllm_remote import RemotevLLMEngine
from areal.infra.remote_inf_engine import GroupedRolloutWorkflow, RemoteInfEngine
from areal.utils.environ import is_single_controller

from examples.tau2.compat import require_areal
from examples.tau2.lifecycle import watchdog as wd
from examples.tau2.settings import addons
from examples.tau2.training.group_workflow import (
    ROWS_RECORD_ENV,
    DropRejectedProxyWorkflow,
    PartialGroupWorkflow,
)
from examples.tau2.training.rollout_controller import Tau2RolloutController
from examples.tau2.training.served_prompt import (
    PARITY_RECORD_ENV,
    SERVING_ENGINE_ENV,
    install_from_env,
    serving_engine_name,
)

logger = logging.getLogger("tau2_areal.trainer")


class Tau2PPOTrainer(PPOTrainer):
    """AReaL's `PPOTrainer` for τ² episodes (see the module). `parity_record_dir`: the proxies record every
    prompt they render there (the smoke run compares them with the server's own rendering). `record_dir`:
    the run keeps there what the smoke run's asynchronous checks read (`cpu/async_checks.py`): each
    version's weights (`weights/v<N>`) and each kept group's rows (`rows/`)."""

    server_dead_after_s: float = 15.0
    """Refused connections for this long make an inference server dead: a refusal means nothing listens on
    the port (a busy server still accepts, and a full accept queue drops, not refuses), and AReaL never
    restarts a server; four refused polls in a row rule out a probe's own hiccup."""
    job_poll_s: float = 5.0
    """How often a SLURM run checks that every job of its workers still runs."""
    record_dir: str = ""

    def __init__(self, config: Any, train_dataset: Any = None, valid_dataset: Any = None, *,
                 parity_record_dir: str = "", record_dir: str = ""):
        require_areal("Tau2PPOTrainer (examples/tau2/training/trainer.py)")
        self.parity_record_dir = parity_record_dir  # read by _init_rollout, inside AReaL's __init__
        self.record_dir = record_dir
        self._deferred_recover_save: tuple[int, int, int] | None = None
        super().__init__(config, train_dataset=train_dataset, valid_dataset=valid_dataset)
        from examples.tau2.lifecycle.reaper import discard_swanlab_run
        from examples.tau2.lifecycle.recover import AtomicRecoverHandler, SaveWhenAsked

        discard_swanlab_run()  # the folder of the stats logger's SwanLab run, outside the run's

        self.recover_handler = AtomicRecoverHandler.adopt(self.recover_handler, config)
        self.saver.freq_ctl = SaveWhenAsked(self.saver.freq_ctl)  # the last step's save (_save_hf)

    def _init_scheduler(self) -> Any:
        """The scheduler of the add-on `scheduler.type` names (e.g. SLURM's), else AReaL's own."""
        addon = addons.scheduler_addon(self.config.scheduler.type)
        scheduler = addon.scheduler(self.config) if addon is not None else None
        return scheduler if scheduler is not None else super()._init_scheduler()

    def _create_dataloader(self, dataset: Any, dataset_config: Any, rank: int, world_size: int) -> Any:
        """The training dataloader of an add-on that provides one (the curriculum samples by solve rate);
        validation, and training without such an add-on, are AReaL's."""
        if dataset_config is self.config.train_dataset:
            for addon in addons.enabled(self.config):
                loader = addon.train_dataloader(dataset, self.config, batch_size=dataset_config.batch_size,
                                                drop_last=dataset_config.drop_last)
                if loader is not None:
                    if world_size != 1:
                        raise RuntimeError(f"{addon.name}: the training dataloader has {world_size} "
                                           "data-parallel ranks; the single controller (the only mode for "
                                           "agent workflows) has 1")
                    return loader
        return super()._create_dataloader(dataset, dataset_config, rank, world_size)

    def rollout_engine_class(self) -> type:
        """The rollout engine of `rollout.backend`, with the served-prompt rendering and partial groups."""
        return {"sglang": Tau2SGLangEngine, "vllm": Tau2vLLMEngine}[self.rollout_alloc.backend]

    def _init_rollout(self, rollout_config: InferenceEngineConfig, is_eval: bool = False,
                      lora_path: str | None = None) -> Any:
        """AReaL's `_init_rollout` (rl_trainer.py:1005; single controller, no LoRA) with
        `rollout_engine_class`, the workers told whose prompt to render (and where to record it), and no
        evaluation rollout for a run without a validation dataloader: AReaL would start a worker and a
        proxy per server that nothing uses (bench/RESULTS.md, "Smoke run without the unused evaluation
        workers"); it checks `eval_rollout is None` where used."""
        if is_eval and getattr(self, "valid_dataloader", None) is None:
            return None
        if lora_path is not None or not is_single_controller() or rollout_config._version == "v2":
            raise NotImplementedError("the serving-engine rendering runs on AReaL's single controller "
                                      "(scheduler.type local or slurm), without LoRA or the v2 controller")
        config = deepcopy(rollout_config)
        env = {SERVING_ENGINE_ENV: serving_engine_name(self.config.econfig.serving_engine,
                                                       self.rollout_alloc.backend)}
        if self.parity_record_dir:
            env[PARITY_RECORD_ENV] = self.parity_record_dir
        if self.record_dir and not is_eval:
            env[ROWS_RECORD_ENV] = str(Path(self.record_dir) / "rows")
        for spec in config.scheduling_spec:
            spec.env_vars = {**(spec.env_vars or {}), **env}
        if is_eval:  # as AReaL: no off-policyness bound, colocated with the rollout servers
            config.max_head_offpolicyness = int(1e12)
            config.scheduling_strategy = SchedulingStrategy(
                type=SchedulingStrategyType.colocation, target="rollout")
            for spec in config.scheduling_spec:
                spec.gpu = 0
        parallel = self.rollout_alloc.parallel
        if self.rollout_alloc.backend == "sglang":
            if self.config.rollout.return_routed_experts:
                self.config.sglang.enable_return_routed_experts = True
            server_args = SGLangConfig.build_args(sglang_config=self.config.sglang, tp_size=parallel.tp_size,
                                                  pp_size=parallel.pp_size, base_gpu_id=0)
        else:
            if self.config.rollout.return_routed_experts:
                raise ValueError("return_routed_experts is not supported with the vLLM backend")
            server_args = vLLMConfig.build_args(vllm_config=self.config.vllm, tp_size=parallel.tp_size,
                                                pp_size=parallel.pp_size)
        controller = self.rollout_engine_class().as_controller(config, self.scheduler)
        if self.record_dir and not is_eval:
            controller.keep_weights_dir = str(Path(self.record_dir) / "weights")
        evaluation = dict(role="eval-rollout", server_infos=self.rollout.server_infos) if is_eval else {}
        controller.initialize(**{"role": "rollout", "server_args": server_args, **evaluation})
        return controller

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """AReaL's loop, stopped with `InferenceServerDied` / `WorkerJobEnded` when a watchdog finds that
        a server died or (`Tau2SlurmScheduler`) a worker job ended, and with `StopRequested` when asked to
        stop (`CONTROL`) and interrupted before a step's end."""
        infos = getattr(getattr(self, "rollout", None), "server_infos", None) or []
        ended_job = getattr(self.scheduler, "ended_job", None)  # Tau2SlurmScheduler's
        with (wd.Watchdog(ended_job, self.job_poll_s, name="tau2-job-watchdog") as jobs,
              wd.ServerWatchdog([(s.host, s.port) for s in infos], self.server_dead_after_s) as servers):
            try:
                result = super().train(*args, **kwargs)
            except KeyboardInterrupt:
                if jobs.failure:
                    raise wd.WorkerJobEnded(jobs.failure) from None
                if servers.failure:  # its job may have ended with it: that is the cause
                    if ended := self._ended_job_sentence(ended_job):
                        raise wd.WorkerJobEnded(ended) from None
                    raise wd.InferenceServerDied(servers.failure) from None
                if reason := wd.CONTROL.stop_reason:
                    raise wd.StopRequested(f"{reason}; stopped before the step's end") from None
                raise
            except Exception as e:  # a call to a worker whose job ended may fail before the watchdog looks
                if (ended := self._ended_job_sentence(ended_job)) and not isinstance(e, wd.WorkerJobEnded):
                    raise wd.WorkerJobEnded(ended) from e
                raise
            wd.CONTROL.finished = True
            return result

    @staticmethod
    def _ended_job_sentence(ended_job: Any) -> str:
        """The job watchdog's sentence about an ended worker job, now ('' when none, or SLURM cannot say)."""
        try:
            return (ended_job() or "") if ended_job is not None else ""
        except Exception:  # noqa: BLE001 - SLURM busy: the run's own exception stands
            return ""

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> bool:
        """AReaL's clean-up; while an exception propagates, a failure of the clean-up itself (e.g. a call to
        workers whose job has ended) is logged, not raised over it: the first cause is the one to see."""
        try:
            return super().__exit__(exc_type, exc_value, traceback)
        except Exception as cleanup:  # noqa: BLE001 - the run's own exception goes on
            if exc_type is None:
                raise
            first = (str(cleanup).strip().splitlines() or [""])[0]
            logger.warning("the clean-up after %s failed too: %s: %s", exc_type.__name__,
                           type(cleanup).__name__, first)
            return False

    def _save_hf(self, epoch: int, epoch_step: int, global_step: int) -> None:
        """AReaL's save when `saver.freq_*` is due, and always after the run's last step: a run whose steps
        end between two due saves would otherwise end without its trained policy."""
        if global_step + 1 >= self._total_steps():
            self.saver.freq_ctl.save_next()
        super()._save_hf(epoch, epoch_step, global_step)

    def _save_recover_checkpoint(self, epoch: int, epoch_step: int, global_step: int) -> None:
        """Deferred: AReaL saves before it commits the step's stats (rl_trainer.py:797 vs :854), so a kill
        between the two would lose that step's stats for good."""
        self._deferred_recover_save = (epoch, epoch_step, global_step)

    def _export_and_commit_stats(self, epoch: int, epoch_step: int, global_step: int) -> None:
        """AReaL's commit, then the deferred recover save (still before `rollout.resume()`); a rerun drops
        the stats lines of steps after the saved one, which run again (`lifecycle.recover.trim_stats`)."""
        wd.CONTROL.saving = True  # the step is trained: a stop request waits for its save
        try:
            super()._export_and_commit_stats(epoch, epoch_step, global_step)
            wd.CONTROL.committed(global_step)  # its save (`recover.commit`) sets `CONTROL.saved_step`
            deferred, self._deferred_recover_save = self._deferred_recover_save, None
            last = global_step + 1 >= self._total_steps()
            stopping = bool(wd.CONTROL.stop_reason) and not last
            if deferred is not None:
                if stopping:  # saved whatever recover.freq_* say: a stop loses no step
                    self.recover_handler.freq_ctl.save_next()
                super()._save_recover_checkpoint(*deferred)
        finally:
            wd.CONTROL.saving = False
        if last:
            wd.CONTROL.finished = True
        if stopping:
            raise wd.StopRequested(f"{wd.CONTROL.stop_reason}; stopped after step {global_step + 1}, its "
                                   "state saved")

    def _total_steps(self) -> int:
        """The steps `train` runs in all, as AReaL's loop counts them."""
        config = self.config
        total = config.total_train_epochs * len(self.train_dataloader)
        return total if config.total_train_steps is None else min(total, config.total_train_steps)


class EmptyReply(ModelResponse):
    """A completion of nothing but stop tokens (the policy ended its turn at once), whose text is empty.
    AReaL 1.0.4's proxy decodes `output_tokens_without_stop`, which raises on it ("All output_tokens are EOS
    or PAD tokens"), and answers 500: the client retries, and the policy's empty reply is resampled away
    instead of scored (and never trained). Here it reaches the agent as the empty reply it is."""

    @property
    def output_tokens_without_stop(self) -> list[int]:
        return []

    @classmethod
    def of(cls, response: ModelResponse) -> ModelResponse:
        """`response` as an `EmptyReply` when it is one (stopped, every token a stop token), else itself."""
        tokenizer = response.tokenizer
        if tokenizer is None or response.stop_reason in ("length", "abort") or not response.output_tokens:
            return response
        stops = {tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
        if not set(response.output_tokens) <= stops:
            return response
        return cls(**{f.name: getattr(response, f.name) for f in dataclasses.fields(response)})


class Tau2InfEngine(RemoteInfEngine):
    """AReaL's `RemoteInfEngine` whose inline agent workflows are `DropRejectedProxyWorkflow`s, grouped by
    `PartialGroupWorkflow`, and whose empty replies are `EmptyReply`s; other workflows resolve as in
    AReaL."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.logger = logger  # AReaL sets its own in `initialize`

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        return EmptyReply.of(await super().agenerate(req))

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


class Tau2RolloutEngine:
    """Put before AReaL's `RemoteSGLangEngine` / `RemotevLLMEngine`: they delegate to a `Tau2InfEngine`
    instead, and creating one (in a rollout worker, and in the proxy it forks) installs the rendering."""

    _engine: RemoteInfEngine

    def __init__(self, config: InferenceEngineConfig, *args: Any, **kwargs: Any):
        require_areal(f"{type(self).__name__} (examples/tau2/training/trainer.py)")
        super().__init__(config, *args, **kwargs)  # type: ignore[call-arg]
        self._engine = Tau2InfEngine(config, self.rollout_backend(self._engine.backend))
        install_from_env(self)

    def rollout_backend(self, default: Any) -> Any:
        """The server backend (AReaL's SGLang or vLLM backend by default)."""
        return default

    @classmethod
    def as_controller(cls, config: InferenceEngineConfig, scheduler: Any) -> Tau2RolloutController:
        """`Tau2RolloutController` (`Tau2PPOTrainer._init_rollout` refuses AReaL's v2 controller)."""
        return Tau2RolloutController(cls, config=config, scheduler=scheduler)


class Tau2SGLangEngine(Tau2RolloutEngine, RemoteSGLangEngine):
    """AReaL's SGLang rollout engine, rendering as `SERVING_ENGINE_ENV` says, with partial groups."""


class Tau2vLLMEngine(Tau2RolloutEngine, RemotevLLMEngine):
    """AReaL's vLLM rollout engine, rendering as `SERVING_ENGINE_ENV` says, with partial groups."""
