"""The workflow's episode against tau2's own `run_task` (stock LLMAgent, UserSimulator, Orchestrator and
evaluator, the LLM calls through litellm), both against the same scripted endpoint: the same messages,
termination and `RewardInfo`, on every built-in domain and on the example own domain. The workflow runs
tau2's orchestrator in a greenlet with its LLM calls awaited on the event loop; this pins that doing so
changes nothing tau2 decides, with many episodes in flight at once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tau2.registry import registry
from tau2.run import run_task

from examples.tau2.episode import domain as tau2_domain
from examples.tau2.tau2_agent import TASK_HEADER
from tests.conftest import make_workflow

OWN_DOMAIN = Path(__file__).resolve().parents[1] / "examples" / "tau2" / "docs" / "own_domain"
CASES = [("mock", "oracle"), ("mock", "noop"), ("airline", "oracle"), ("airline", "noop"),
         ("retail", "oracle"), ("telecom", "oracle"), ("library", "oracle"), ("library", "noop")]
TASKS_PER_CASE = 3


def _message_view(m: dict[str, Any]) -> dict[str, Any]:
    """What tau2 decided in a message: who said what, which tools were called with what, what they
    returned (not ids, timestamps, costs or usage)."""
    calls = [(c["name"], c["arguments"], c.get("requestor")) for c in m.get("tool_calls") or []]
    return {"role": m["role"], "content": m.get("content"), "tool_calls": calls,
            "error": m.get("error"), "requestor": m.get("requestor")}


def _reward_view(info: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in info.items() if k not in ("info",)}


@pytest.mark.slow
@pytest.mark.parametrize(("domain", "policy"), CASES)
def test_an_episode_is_the_one_tau2_s_own_orchestrator_runs(endpoint, monkeypatch, domain, policy):
    if domain == "library":
        monkeypatch.syspath_prepend(str(OWN_DOMAIN))
        tau2_domain.load_modules(["library_desk"])
    tasks = registry.get_tasks_loader(domain)()[:TASKS_PER_CASE]
    wf = make_workflow(endpoint, policy, domain_modules=["library_desk"] if domain == "library" else [])

    async def ours() -> list[Any]:  # every task's episode in flight at once, twice over
        try:
            return await asyncio.gather(*[wf.run_episode({"domain": domain, "task_id": t.id},
                                                         base_url=endpoint.url, api_key="k")
                                          for t in tasks * 2])
        finally:
            await wf.aclose()

    results = asyncio.run(ours())
    for task, result, again in zip(tasks, results[:len(tasks)], results[len(tasks):], strict=True):
        header = {TASK_HEADER: f"{domain}/{task.id}"}  # the oracle plays the task the header names
        llm_args = {"api_base": endpoint.url, "api_key": "k", "extra_headers": header}
        try:
            stock = run_task(domain, task, agent="llm_agent", user="user_simulator",
                             llm_agent=f"openai/{policy}", llm_user="openai/user",
                             llm_args_agent=llm_args, llm_args_user=dict(llm_args),
                             max_steps=wf.config.max_steps, max_errors=wf.config.max_errors)
        except ValueError as e:  # tau2's evaluator raised on the final state: the one place the two differ
            assert result.tau2_reward == 0.0 and f"tau2's evaluator raised ValueError: {e}" in result.note
            continue
        expected = [_message_view(m.model_dump(mode="json")) for m in stock.messages]
        assert [_message_view(m) for m in result.messages] == expected, task.id
        assert [_message_view(m) for m in again.messages] == expected, task.id
        assert result.tau2_run["termination_reason"] == stock.termination_reason.value
        assert stock.reward_info is not None
        assert (_reward_view(result.tau2_run["reward_info"])
                == _reward_view(stock.reward_info.model_dump(mode="json"))), task.id
        assert result.tau2_reward == stock.reward_info.reward
