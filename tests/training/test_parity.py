"""Train/serve parity on recorded tau2 conversations of every domain, through AReaL's real proxy.

The fast tests compare with SGLang 0.5.10.post1's rendering (its own request models, in this process);
the slow one with a live vLLM 0.32 CPU server's `/tokenize` and vLLM's own reply parser.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from examples.tau2.compat.serving_render import ServingEngine
from examples.tau2.training.parity import (
    PARITY_DOMAINS,
    REPLY_TEXTS,
    InProcessProxy,
    ParityCase,
    RecordedParity,
    first_difference,
    main,
    record_cases,
    run_parity,
)


@pytest.fixture(scope="module")
def cases() -> list[ParityCase]:
    return record_cases(PARITY_DOMAINS, 1)


@pytest.fixture(scope="module")
def tokenizer_dir() -> str:
    from examples.tau2.cpu.tiny_model import tokenizer_dir

    return str(tokenizer_dir())


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


def test_the_proxy_trains_on_sglangs_prompt_token_for_token(cases, tokenizer_dir):
    report = run_parity(cases, tokenizer_dir, ServingEngine.SGLANG)
    prompts = report.prompts[0]
    assert prompts.requests == len(cases) and prompts.differing == 0, report.format()
    assert prompts.tokens > 50_000
    # the reply side: the proxy's parsers and SGLang's agree on every generated text
    assert report.replies[0].requests == len(REPLY_TEXTS) and report.replies[0].ok, report.format()
    assert report.ok


def test_without_the_compat_rendering_every_prompt_differs_and_the_first_token_is_shown(cases, tokenizer_dir):
    report = run_parity(cases, tokenizer_dir, None)  # AReaL's own rendering
    prompts = report.prompts[0]
    assert prompts.differing == prompts.requests == len(cases)
    # the first difference: the proxy writes `{"function": ...` where SGLang writes `{"type": "function", ...`
    assert "first difference at token" in prompts.first
    assert 'function": {"name": ' in prompts.first.split("| served")[0]
    assert 'type": "function", "function": {"description"' in prompts.first.split("| served")[1]
    assert not report.ok and "PARITY FAILED" in report.format()


def test_rendering_for_vllm_is_not_sglangs_prompt(cases, tokenizer_dir):
    """The check tells the engines apart: vLLM's tool order (name before description, no `strict`)."""
    report = run_parity(cases[:3], tokenizer_dir, ServingEngine.VLLM, compare_sglang=True)
    assert report.prompts[0].differing == 3
    assert '"description"' in report.prompts[0].first


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_parity_with_a_live_vllm_server_and_its_reply_parser(tmp_path, tokenizer_dir, capsys):
    from transformers import AutoTokenizer

    from examples.tau2.compat.areal_cpu import vllm_python
    from examples.tau2.cpu.learn import serve_policy
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
