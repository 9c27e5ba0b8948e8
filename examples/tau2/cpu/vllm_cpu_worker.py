"""AReaL's vLLM worker extension with a weight reload that works on vLLM's CPU backend.

On CPU, vLLM repacks every linear layer's weight into a kernel-specific layout after loading and
leaves the original parameter empty (`torch.Size([0])`), so AReaL's reload (the model loader's
`load_weights` into the live parameters) fails. vLLM 0.32 has an in-place reload that restores
the checkpoint layout, loads, and repacks; that is used here. A tied `lm_head` shares the
embedding's weight but keeps its own packed copy for the output projection, which the reload does
not rebuild, so it is repacked explicitly.

Selected with `vllm.worker_extension_cls: examples.tau2.cpu.vllm_cpu_worker.CpuReloadWorkerExtension`.
Runs inside the vLLM venv's engine process (imports vLLM at module level), which
`cpu.vllm_cpu_server` starts after checking the vLLM and AReaL versions this mirrors.
"""

from __future__ import annotations

from areal.engine.vllm_ext.vllm_worker_extension import VLLMWorkerExtension
from vllm.logger import init_logger

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
