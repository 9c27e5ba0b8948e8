"""The scripted oracle and `user-scenario` user on tau2's mock tasks, through real HTTP, τ²'s real
environments and evaluator: the warm-up data of the tiny policy and the ceiling of the learning run
depend on which tasks the oracle solves."""

from __future__ import annotations

import asyncio

from examples.tau2.cpu.scripted_endpoint import oracle_reply, scenario_user_reply
from examples.tau2.episode import domain as tau2_domain
from tests.conftest import make_workflow

HISTORY_TASK = "update_task_with_message_history"
NO_ACTIONS_TASK = "update_task_with_history_and_env_assertions"
"""Scored by an env assertion alone (task_2 completed); it lists no ground-truth actions to replay."""


def _rewards(endpoint, task_ids: list[str]) -> dict[str, float]:
    async def go() -> dict[str, float]:
        wf = make_workflow(endpoint, "oracle", user_model="user-scenario")
        try:
            results = await asyncio.gather(*[
                wf.run_episode({"domain": "mock", "task_id": t}, base_url=endpoint.url, api_key="k")
                for t in task_ids])
        finally:
            await wf.aclose()
        return {r.task_id: r.reward for r in results}

    return asyncio.run(go())


def test_the_oracle_solves_every_mock_task_that_has_ground_truth_actions(endpoint):
    ids = tau2_domain.task_ids("mock", "all")
    rewards = _rewards(endpoint, ids)
    assert len(rewards) == len(ids) == 9
    assert {t: r for t, r in rewards.items() if r != 1.0} == {NO_ACTIONS_TASK: 0.0}


def test_after_a_message_history_the_oracle_acts_once_and_the_user_states_its_request(endpoint):
    endpoint.endpoint.recent.clear()
    assert _rewards(endpoint, [HISTORY_TASK]) == {HISTORY_TASK: 1.0}
    policy = [r.body["messages"] for r in endpoint.endpoint.recent if r.model == "oracle"]
    instructions = tau2_domain.get_task("mock", HISTORY_TASK).user_scenario.instructions
    # the history's create_task call and reply are context; then the user says what it wants now
    assert [m["role"] for m in policy[0][1:]] == ["user", "assistant", "tool", "assistant", "user"]
    assert policy[0][-1]["content"] == " ".join(str(instructions).split())
    calls = [c["function"]["name"] for m in policy[-1] for c in m.get("tool_calls") or []]
    assert calls == ["create_task", "update_task_status"]  # one from the history, one the oracle's


def _user_view(*turns: tuple[str, str]) -> list[dict]:
    scenario = "<scenario>Persona: x\nInstructions: Mark  task_2\ncompleted.</scenario>"
    system = {"role": "system", "content": scenario}
    return [system, *({"role": r, "content": c} for r, c in turns)]


def test_the_scenario_user_opens_with_its_instructions_once():
    # in the user simulator's view its own turns are `assistant` and the agent's are `user`
    opening = {"content": "Mark task_2 completed."}
    assert scenario_user_reply(_user_view()) == opening
    history = _user_view(("assistant", "I need a task."), ("user", "Created task_2."))
    assert scenario_user_reply(history) == opening  # a scripted history is not the user saying it
    said = [*history, {"role": "assistant", **opening}, {"role": "user", "content": "And?"}]
    assert scenario_user_reply(said) == {"content": "Okay, please go on."}


def test_the_oracle_does_not_count_the_history_s_tool_calls_as_its_own():
    task = tau2_domain.get_task("mock", HISTORY_TASK)
    history_call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "create_task", "arguments": "{}"}}]}
    opening = [{"role": "system", "content": "policy"}, {"role": "user", "content": "I need a task."},
               history_call, {"role": "tool", "content": "{}", "tool_call_id": "call_1"},
               {"role": "user", "content": "Now mark it completed."}]
    tools = {"create_task", "update_task_status"}
    first = oracle_reply(task, opening, tools)
    assert first == {"tool_calls": [{"name": "update_task_status",
                                     "arguments": {"task_id": "task_2", "status": "completed"}}]}
    own_call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "update_task_status", "arguments": "{}"}}]}
    result = {"role": "tool", "content": "{}", "tool_call_id": "call_2"}
    done = oracle_reply(task, [*opening, own_call, result], tools)
    assert done["content"].startswith("DONE_ALL")
