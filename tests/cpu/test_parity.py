"""Train/serve parity on recorded tau2 conversations of every domain, through AReaL's real proxy.

The fast tests compare with SGLang 0.5.10.post1's own OpenAI chat server code, run in this process on CPU
(tests/compat/sglang_server.py); the slow one with a live vLLM 0.32 CPU server's `/tokenize` and vLLM's own
reply parser.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from examples.tau2.compat import serving_render
from examples.tau2.compat.serving_render import ServingEngine
from examples.tau2.cpu.parity import (
    PARITY_DOMAINS,
    REPLY_TEXTS,
    Comparison,
    InProcessProxy,
    ParityCase,
    RecordedParity,
    compare_prompts,
    first_difference,
    main,
    record_cases,
    render_prompt_ids,
    run_parity,
)
from tests.compat.sglang_server import SGLangChatServer, sglang_model_dir

SGLANG_SERVER = "SGLang 0.5.10.post1 (its chat server)"


@pytest.fixture(scope="module")
def cases() -> list[ParityCase]:
    return record_cases(PARITY_DOMAINS, 1)


@pytest.fixture(scope="module")
def tokenizer_dir() -> str:
    from examples.tau2.cpu.tiny_model import tokenizer_dir

    return str(tokenizer_dir())


@pytest.fixture(scope="module")
def sglang(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: str) -> Iterator[SGLangChatServer]:
    model = sglang_model_dir(tmp_path_factory.mktemp("sglang-model"), Path(tokenizer_dir))
    with SGLangChatServer(model) as server:
        yield server


def proxy_prompts(tokenizer: Any, engine: ServingEngine | None, cases: Sequence[ParityCase],
                  tool_choice: Any = None) -> list[list[int]]:
    """The prompt ids AReaL's proxy, rendering as `engine`, trains on (`tool_choice` overrides the cases')."""
    with InProcessProxy(tokenizer, engine) as proxy:
        return [proxy.complete(c.messages, c.tools, tool_choice or c.tool_choice)[0] for c in cases]


def sglang_prompts(server: SGLangChatServer, cases: Sequence[ParityCase],
                   tool_choice: Any = None) -> list[list[int]]:
    """What SGLang's chat server builds for the same requests (the body the proxy is sent)."""
    prompts = []
    for c in cases:
        body: dict[str, Any] = {"model": "policy", "messages": c.messages, "max_completion_tokens": 64,
                                "temperature": 1.0, "top_p": 1.0}
        if c.tools:
            body.update(tools=c.tools, tool_choice=tool_choice or c.tool_choice)
        prompts.append(server.prompt_ids(body))
    return prompts


@pytest.fixture(scope="module")
def served(cases: list[ParityCase], sglang: SGLangChatServer) -> list[list[int]]:
    """SGLang's prompts for every recorded request, built once."""
    return sglang_prompts(sglang, cases)


def against_sglang(tokenizer: Any, engine: ServingEngine | None, cases: Sequence[ParityCase],
                   served: Sequence[list[int]]) -> Comparison:
    """The proxy's prompts, rendering as `engine`, against SGLang's server's `served` ones for `cases`."""
    return compare_prompts(SGLANG_SERVER, tokenizer, cases, proxy_prompts(tokenizer, engine, cases), served)


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference([], []) is None


def test_recorded_conversations_cover_every_domain_tools_users_think_and_solo(cases):
    kinds = collections.Counter((c.domain, c.mode) for c in cases)
    solo = {("telecom", "solo"), ("mock", "solo")}
    assert set(kinds) == {(d, "conversation") for d in PARITY_DOMAINS} | solo
    roles = {m["role"] for c in cases for m in c.messages}
    assert roles == {"system", "user", "assistant", "tool"}
    called = {tc["function"]["name"] for c in cases for m in c.messages for tc in m.get("tool_calls") or []}
    assert "think" in called and len(called) > 5  # thoughts and real actions with arguments
    assert {c.tool_choice for c in cases} == {"auto", "required"}  # solo mode requires a tool call
    assert max(len(c.messages) for c in cases) >= 8  # multi-turn


def test_the_proxy_trains_on_sglangs_prompt_token_for_token(cases, tokenizer, served):
    prompts = against_sglang(tokenizer, ServingEngine.SGLANG, cases, served)
    assert prompts.requests == len(cases) and prompts.differing == 0, prompts.first
    assert prompts.tokens > 50_000


def test_the_proxys_reply_parsing_agrees_with_sglangs_parsers(cases, tokenizer_dir):
    report = run_parity(cases[:1], tokenizer_dir, ServingEngine.SGLANG)
    assert report.replies[0].requests == len(REPLY_TEXTS) and report.replies[0].ok, report.format()


def test_a_rendering_that_strays_from_sglangs_is_caught(cases, tokenizer, sglang, monkeypatch):
    """The reference is SGLang's server, not the rendering under test: a perturbed rendering fails."""
    real = serving_render._sglang_inputs

    def perturbed(messages, tools, tool_choice):
        out, rendered_tools = real(messages, tools, tool_choice)
        return [{**m, "content": m["content"] + " (perturbed)"} if m["role"] == "tool" else m
                for m in out], rendered_tools

    monkeypatch.setattr(serving_render, "_sglang_inputs", perturbed)
    with_tools = [c for c in cases if any(m["role"] == "tool" for m in c.messages)]
    sample = with_tools[:2] + [c for c in cases if c.mode == "solo"][-1:]
    prompts = against_sglang(tokenizer, ServingEngine.SGLANG, sample, sglang_prompts(sglang, sample))
    assert prompts.differing == len(sample) == 3
    assert "first difference at token" in prompts.first
    assert " (perturbed)" in prompts.first.split("| served")[0]


def test_without_the_compat_rendering_every_prompt_differs_and_the_first_token_is_shown(
        cases, tokenizer, served):
    prompts = against_sglang(tokenizer, None, cases, served)  # AReaL's own rendering
    assert prompts.differing == prompts.requests == len(cases)
    # the first difference: the proxy writes `{"function": ...` where SGLang writes `{"type": "function", ...`
    assert "first difference at token" in prompts.first
    assert 'function": {"name": ' in prompts.first.split("| served")[0]
    assert 'type": "function", "function": {"description"' in prompts.first.split("| served")[1]
    assert not prompts.ok


def test_rendering_for_vllm_is_not_sglangs_prompt(cases, tokenizer, served):
    """The check tells the engines apart: vLLM's tool order (name before description, no `strict`)."""
    prompts = against_sglang(tokenizer, ServingEngine.VLLM, cases[:3], served[:3])
    assert prompts.differing == 3
    assert '"description"' in prompts.first


def test_tool_choice_none_and_named_are_rendered_as_each_servers(cases, tokenizer, sglang):
    """SGLang's server renders no tools for `none` and only the named one for a named choice; vLLM's renders
    every tool whatever the choice. The proxy passes the request's choice to the rendering."""
    sample = [next(c for c in cases if c.domain == d and len(c.tools) > 1) for d in PARITY_DOMAINS]
    for c in sample:
        named = {"type": "function", "function": {"name": c.tools[-1]["function"]["name"]}}
        auto = proxy_prompts(tokenizer, ServingEngine.SGLANG, [c])[0]
        for choice in ("none", named):
            trained = proxy_prompts(tokenizer, ServingEngine.SGLANG, [c], choice)
            assert trained == sglang_prompts(sglang, [c], choice), (c.label, choice)
            assert len(trained[0]) < len(auto)  # fewer tools than `auto` renders
            vllm = proxy_prompts(tokenizer, ServingEngine.VLLM, [c], choice)[0]
            assert vllm == render_prompt_ids(tokenizer, ServingEngine.VLLM, c.messages, c.tools, choice)
            assert vllm == render_prompt_ids(tokenizer, ServingEngine.VLLM, c.messages, c.tools, "auto")


@pytest.mark.memory(gib=4.5)  # a vLLM CPU server (4.4 GiB measured)
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_parity_with_a_live_vllm_server_and_its_reply_parser(tmp_path, tokenizer_dir, capsys):
    from transformers import AutoTokenizer

    from examples.tau2.cpu.learn import serve_policy
    from examples.tau2.cpu.smoke_config import vllm_python
    from examples.tau2.cpu.tiny_model import TinyModelRecipe, ensure_tiny_model

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    mock = record_cases(["mock"], 1)
    model = ensure_tiny_model(TinyModelRecipe(), tmp_path / "cache")
    with serve_policy(model, "tiny", tmp_path / "vllm.log", 4096) as url:
        assert main(["--engine", "vllm", "--vllm-url", url, "--tasks", "1", "--output",
                     str(tmp_path / "on.json")]) == 0
        on = capsys.readouterr().out
        assert main(["--engine", "areal", "--vllm-url", url, "--tasks", "1", "--domains", "mock"]) == 1
        off = capsys.readouterr().out
        # what the smoke run checks every step: the prompts the proxy recorded, against the live server
        for engine, differing in ((ServingEngine.VLLM, 0), (None, len(mock))):
            folder = tmp_path / f"records-{engine}"
            with InProcessProxy(tok, engine, str(folder)) as proxy:
                for c in mock:
                    proxy.complete(c.messages, c.tools, c.tool_choice)
            parity = RecordedParity(folder, url, tok)
            assert parity.check() == {"tau2/parity/requests": len(mock), "tau2/parity/differing": differing}
            assert parity.check() == {"tau2/parity/requests": 0, "tau2/parity/differing": 0}  # read once
            assert bool(parity.first) == bool(differing)
        # vLLM's hermes parser (as `--tool-call-parser hermes` without a reasoning parser serves) reads two
        # texts otherwise than the proxy: a tool call inside <think>, and one whose </tool_call> never came.
        report = run_parity(mock, tokenizer_dir, ServingEngine.VLLM, vllm_url=url, vllm_python=vllm_python())
    vllm_line = next(line for line in on.splitlines() if "vLLM at" in line)
    assert "identical" in vllm_line and "PARITY OK" in on
    assert Path(tmp_path / "on.json").is_file()
    vllm_line = next(line for line in off.splitlines() if "vLLM at" in line)
    assert "differ" in vllm_line and "first difference at token" in off

    assert len(report.prompts) == 1 and report.prompts[0].ok  # for vLLM, compared with vLLM alone
    vllm_reply = report.replies[1]
    assert vllm_reply.requests == len(REPLY_TEXTS)
    assert sorted(vllm_reply.differing_labels) == ["tool call inside think", "unclosed tool call"]
