"""AReaL's vLLM worker extension with a weight reload that works on vLLM's CPU backend, and the CPU server's
paced scheduler.

On CPU, vLLM repacks every linear layer's weight into a kernel-specific layout after loading and
leaves the original parameter empty (`torch.Size([0])`), so AReaL's reload (the model loader's
`load_weights` into the live parameters) fails. vLLM 0.32 has an in-place reload that restores
the checkpoint layout, loads, and repacks; that is used here. A tied `lm_head` shares the
embedding's weight but keeps its own packed copy for the output projection, which the reload does
not rebuild, so it is repacked explicitly.

Selected with `vllm.worker_extension_cls: examples.tau2.cpu.vllm_cpu_worker.CpuReloadWorkerExtension`.
Runs inside the vLLM venv's engine process (imports vLLM at module level), which
`cpu.vllm_cpu_server` starts after checking the vLLM and AReaL versions this mirrors.

`PacedScheduler` (vLLM's `--scheduler-cls`, which `cpu.vllm_cpu_server` passes when `STEP_MS_ENV` is set)
gives each generation step a least duration. On a CPU the tiny policy generates far faster than it trains
(its 152k-word output layer is nearly all of it, and the trainer runs it over every position it trains), so
every episode of an asynchronous run ends long before the next weight swap, and nothing runs across one; a
GPU run is the other way round. Paced, the rollout takes the time it takes there (`smoke.serve_step_ms`).
"""

from __future__ import annotations

import os
import time
from typing import Any

from areal.engine.vllm_ext.vllm_worker_extension import VLLMWorkerExtension
from vllm.logger import init_logger
from vllm.v1.core.sched.scheduler import Scheduler

from examples.tau2.cpu.vllm_cpu_server import STEP_MS_ENV

logger = init_logger("tau2_areal.vllm_cpu_worker")


class CpuReloadWorkerExtension(VLLMWorkerExtension):
    """`areal_update_weights` (AReaL's disk weight update) via vLLM's in-place reload."""

    def areal_update_weights(self, model_path: str):
        logger.info("reloading weights in place from %s", model_path)
        try:
            self.reload_weights(weights_path=model_path, is_checkpoint_format=True)
            self._repack_tied_lm_head()
            return True, "Success"
        except Exception as e:  # AReaL turns (False, msg) into an HTTP 400 with the message
            logger.exception("weight reload failed")
            return False, f"failed to reload weights from {model_path}: {e}"

    def _repack_tied_lm_head(self) -> None:
        from vllm.platforms import current_platform

        model = self.model_runner.get_model()
        lm_head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if lm_head is None or embed is None or not current_platform.is_cpu():
            return
        if lm_head is not embed and lm_head.weight is not embed.weight:
            return  # untied: the reload repacked it like every other layer
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(lm_head, remove_weight=False)


class PacedScheduler(Scheduler):
    """vLLM's scheduler whose steps that run the model start at least `STEP_MS_ENV` ms apart (a step with
    nothing to run, e.g. while generation is paused, waits for nothing)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.step_s = float(os.environ.get(STEP_MS_ENV) or 0) / 1000.0
        self._next = 0.0
        logger.info("paced scheduler: each generation step takes at least %.0f ms", self.step_s * 1000)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        output = super().schedule(*args, **kwargs)
        if self.step_s and output.total_num_scheduled_tokens:
            now = time.monotonic()
            if self._next > now:
                time.sleep(self._next - now)
            self._next = max(now, self._next) + self.step_s
        return output
