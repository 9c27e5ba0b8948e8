"""`Tau2AgentWorkflow`: one tau2-bench episode as an AReaL 1.0.4 agent workflow.

tau2's own `Orchestrator` runs the episode unchanged, in a greenlet on the event loop's thread (tau2 has
no async API); only the LLM calls are replaced: each suspends the episode's greenlet while the loop awaits
the request (`_EpisodeBridge`), sent to AReaL's proxy (which records the policy's tokens) or to the user
simulator's and judge's endpoints by the workflow's own aiohttp-backed client. No threads: hundreds of
episodes in flight cost about what one does in CPU (bench/RESULTS.md "Episodes in flight"). Infrastructure
failures raise `EpisodeRejected`."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import hashlib
import os
import time
import traceback
import urllib.parse
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import greenlet
import httpx
import openai
from tau2.agent.llm_agent import LLMAgent, LLMAgentState, LLMSoloAgent
from tau2.data_model.message import AssistantMessage, Message, MultiToolMessage, ToolMessage, UserMessage
from tau2.data_model.simulation import RewardInfo, SimulationRun, TerminationReason
from tau2.data_model.tasks import Task
from tau2.environment.tool import Tool, as_tool
from tau2.orchestrator.orchestrator import Orchestrator
from tau2.user.user_simulator import DummyUser, UserSimulator, UserState  # tau2.user.base: 26.3 only
from tau2.utils.utils import get_now

from examples.tau2.compat import tau2_judge
from examples.tau2.compat.tau2_release import installed_release
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.episode.llm import (
    ChatEndpoint,
    ContextExceeded,
    InvalidOutput,
    parse_reply,
    to_openai_messages,
)
from examples.tau2.episode.record import db_difference, failed_checks, where_met, write_episode_dump
from examples.tau2.runtime.files import fingerprint
from examples.tau2.runtime.process import record_stats, setup_runtime
from examples.tau2.tau2_utils import (
    EpisodeRejected,
    EpisodeResult,
    EpisodeTurns,
    GroupRules,
    RejectReason,
    RewardBaseline,
    TaskRef,
    Tau2EnvConfig,
    Termination,
    logger,
    shape_reward,
)

T = TypeVar("T")

THINK_TOOL_NAME = "think"
TASK_HEADER = "X-Tau2-Task"
EPISODE_HEADER = "X-Tau2-Episode"
MAX_THINK_CALLS_PER_TURN = 4


class Tau2AgentWorkflow:
    """AReaL agent workflow: `await run(data, base_url=, api_key=, http_client=)` -> reward, for a row
    `{"domain", "task_id", "seed"?}`; kwargs are `Tau2EnvConfig` fields. One instance serves a whole GRPO
    group concurrently, so it keeps no state but its own HTTP client per event loop."""

    def __init__(self, **kwargs: Any):
        self.config = Tau2EnvConfig.from_kwargs(kwargs)
        setup_runtime(self.config.tau2_log_level)
        installed = installed_release().label
        if self.config.tau2_release and self.config.tau2_release != installed:
            raise ValueError(f"this process imports {installed}, but the run grades with "
                             f"{self.config.tau2_release} (econfig.tau2_release): install that release on "
                             "every node (docs/tau2_releases.md)")
        tau2_domain.load_modules(self.config.domain_modules)  # before the first lookup, in every worker
        # Keyed by the loop, not `id(loop)`: a dead loop's id is reused, and its client must not be.
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}

    def group_rules(self) -> GroupRules:
        """How the group workflow turns this workflow's episodes into training rewards."""
        return GroupRules(baseline=RewardBaseline(self.config.reward_baseline),
                          drop_uniform=self.config.drop_uniform_groups)

    async def run(self, data: dict[str, Any], *, base_url: str = "", api_key: str = "EMPTY",
                  http_client: httpx.AsyncClient | None = None) -> float:
        """AReaL's entry point in inline mode, the only one training allows (`lifecycle/validate.py`): the
        episode's (shaped) reward, or EpisodeRejected."""
        turns = await self.run_turns(data, base_url=base_url, api_key=api_key, http_client=http_client)
        return turns.reward

    async def run_turns(self, data: dict[str, Any], *, base_url: str = "", api_key: str = "EMPTY",
                        http_client: httpx.AsyncClient | None = None) -> EpisodeTurns:
        """`run`, with the policy completions the episode received: the turns it took, which are its
        training rows (`training/group_workflow.py` trains those and no other completion of the session)."""
        if not base_url:
            raise ValueError("Tau2AgentWorkflow.run needs base_url")
        try:
            result = await self.run_episode(data, base_url=base_url, api_key=api_key, http_client=http_client)
        except EpisodeRejected as e:
            record_stats({f"rejected/{e.reason.value}": 1.0})
            logger.warning("tau2 %s/%s rejected (%s): %s", data.get("domain"), data.get("task_id"),
                           e.reason.value, e.detail)
            raise
        metrics = result.metrics()
        if self.config.dump_dir:
            metrics["dump_failed"] = float(bool(result.dump_error))
        record_stats(metrics)
        return EpisodeTurns(result.reward, tuple(result.completion_ids), result.policy_failed_attempts)

    async def run_episode(self, data: dict[str, Any], *, base_url: str, api_key: str,
                          http_client: httpx.AsyncClient | None = None) -> EpisodeResult:
        """Run one episode and score it with tau2. Used by `run` and by evaluation. The policy's requests go
        through `http_client` when one is given, else through `_own_client` (aiohttp's pool): httpx's own
        costs ~20 ms of CPU a request at 256 in flight, aiohttp's ~1 ms (bench/RESULTS.md "Episodes in
        flight"), which is why training passes none. The user's and the judge's always go through ours."""
        ref = TaskRef.from_data(data)
        tau2_domain.check_domain(ref.domain)  # a row of an unknown domain is bad input, not a rejection
        cfg = self.config
        loop = asyncio.get_running_loop()
        headers = {TASK_HEADER: urllib.parse.quote(f"{ref.domain}/{ref.task_id}", safe="/"),
                   EPISODE_HEADER: uuid.uuid4().hex}

        def endpoint(url: str, key: str, model: str, reason: RejectReason,
                     client: httpx.AsyncClient | None = None) -> ChatEndpoint:
            return ChatEndpoint(base_url=url, api_key=key, model=model, reject_reason=reason, headers=headers,
                                http_client=client or self._own_client(), retries=cfg.llm_retries,
                                request_timeout_s=cfg.request_timeout_s, backoff_s=cfg.retry_backoff_s)

        policy = endpoint(base_url, api_key, cfg.agent_model, RejectReason.POLICY_ENDPOINT, http_client)
        user = None if cfg.solo_mode else endpoint(
            cfg.user_base_url, os.environ.get(cfg.user_api_key_env) or "EMPTY", cfg.user_model,
            RejectReason.USER_ENDPOINT)
        judge = None if not cfg.judge_base_url else endpoint(
            cfg.judge_base_url, os.environ.get(cfg.judge_api_key_env) or "EMPTY", cfg.judge_model,
            RejectReason.JUDGE_ENDPOINT)
        seed = data.get("seed")
        if cfg.policy_seed and seed is None:
            raise ValueError(f"policy_seed is set but the row for {ref.domain}/{ref.task_id} has no seed")
        bridge = _EpisodeBridge()
        try:
            # Waiting for a free slot does not count against the episode's budget.
            async with _episode_slots(loop, cfg.max_concurrent_episodes):
                result = await asyncio.wait_for(
                    bridge.drive(_run_episode_body, ref, cfg, policy, user, judge, bridge,
                                 int(seed) if seed is not None else None),
                    timeout=cfg.episode_timeout_s)
            result.policy_failed_attempts = policy.failed_attempts
        except TimeoutError:
            raise EpisodeRejected(RejectReason.TIMEOUT,
                                  f"{ref.domain}/{ref.task_id} exceeded {cfg.episode_timeout_s}s") from None
        except EpisodeRejected:
            raise
        except Exception as e:
            logger.error("tau2 episode %s/%s crashed:\n%s", ref.domain, ref.task_id, traceback.format_exc())
            raise EpisodeRejected(RejectReason.INTERNAL, f"{type(e).__name__}: {e}") from e
        if cfg.dump_dir:  # the episode's record for people (episode/record.py)
            try:
                result.dump_path = str(write_episode_dump(cfg.dump_dir, result))
            except Exception as e:  # a dump is a record of the episode, never a reason to lose it
                result.dump_error = f"{type(e).__name__}: {e}"
                logger.warning("tau2 %s/%s dump to %s failed (episode kept): %s", ref.domain, ref.task_id,
                               cfg.dump_dir, result.dump_error)
        if result.termination is Termination.CONTEXT_EXCEEDED:  # the run's context may be too small
            logger.warning("tau2 %s/%s ended: %s; scored %.3f", ref.domain, ref.task_id, result.note,
                           result.reward)
        logger.info("tau2 %s/%s reward=%.3f termination=%s turns=%d", ref.domain, ref.task_id,
                    result.reward, result.termination.value, result.num_agent_turns)
        return result

    def _own_client(self) -> httpx.AsyncClient:
        """This workflow's client for the running event loop (an httpx client is bound to one loop)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            # A closed loop's client can be neither used nor closed any more: let it (and the loop) go.
            for dead in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[dead]
            client = self._clients[loop] = openai.DefaultAioHttpClient(  # httpx's API on aiohttp's pool
                timeout=self.config.request_timeout_s,
                limits=httpx.Limits(max_connections=4096, max_keepalive_connections=1024))
        return client

    async def aclose(self) -> None:
        """Close the clients this workflow created (not AReaL's); those of closed loops are only dropped."""
        for loop, c in list(self._clients.items()):
            if not loop.is_closed():
                await c.aclose()
        self._clients.clear()


def _run_episode_body(ref: TaskRef, cfg: Tau2EnvConfig, policy: ChatEndpoint,
                      user_endpoint: ChatEndpoint | None, judge_endpoint: ChatEndpoint | None,
                      bridge: _EpisodeBridge, seed: int | None) -> EpisodeResult:
    """tau2's `Orchestrator.run()`, then `_score_episode`, in the episode's greenlet; an invalid policy
    output ends the episode as an agent error, a prompt past the policy's context as a run out of steps
    (tau2 has no reason for it)."""
    start, start_time, stats = time.perf_counter(), get_now(), _EpisodeStats()
    orch = _build_episode(ref, cfg, policy, user_endpoint, bridge, stats, seed)
    ended: InvalidOutput | ContextExceeded | None = None
    try:
        simulation = orch.run()
    except (InvalidOutput, ContextExceeded) as e:  # tau2's `run()` did not finish: its run is built here
        ended = e
        reason, raw = ((TerminationReason.AGENT_ERROR, e.raw_text) if isinstance(e, InvalidOutput)
                       else (TerminationReason.MAX_STEPS, ""))
        extra = [AssistantMessage(role="assistant", content=raw, cost=0.0)] if raw else []
        simulation = SimulationRun(id=str(uuid.uuid4()), task_id=orch.task.id, start_time=start_time,
                                   end_time=get_now(), duration=time.perf_counter() - start,
                                   termination_reason=reason.value, reward_info=None, agent_cost=0.0,
                                   user_cost=0.0, messages=orch.get_trajectory() + extra, seed=orch.seed)
    except _Cancelled:
        raise EpisodeRejected(RejectReason.TIMEOUT, "episode cancelled") from None

    def judge(messages: list[dict[str, Any]], args: dict[str, Any]) -> str:
        """tau2 1.0.x's NL-assertion judge calls, sent to the judge endpoint from the episode's greenlet."""
        assert judge_endpoint is not None
        completion, latency = bridge.call(judge_endpoint.complete(messages, None, **args))
        stats.judge_latency_s += latency
        return completion.choices[0].message.content or ""

    return _score_episode(ref, orch, stats, start, cfg, simulation, ended, judge if judge_endpoint else None)


@dataclass(frozen=True)
class AgentTools:
    """What the policy is offered: tau2's Tool objects (listed in the agent's prompt), their OpenAI schemas
    (sent with every request) and the names tau2 may run (not the think tool, answered inside the agent)."""

    tools: list[Tool]
    schemas: tuple[dict[str, Any], ...]
    valid_names: frozenset[str]


def agent_tools(domain: str, solo_mode: bool, think_tool: bool) -> AgentTools:
    """The domain's agent tools, plus its user's in solo mode, plus the think tool when asked: for the
    episodes and for the SFT rows built from their dumps. Shared by the domain's episodes: tau2 runs calls
    through each episode's own environment."""
    toolset = tau2_domain.tools(domain)
    tools = [*toolset.agent, *(toolset.user if solo_mode else ())]
    schemas = [*toolset.agent_schemas, *(toolset.user_schemas if solo_mode else ())]
    valid_names = frozenset(t.name for t in tools)
    if think_tool:
        tools.append(_THINK_TOOL)
        schemas.append(_THINK_TOOL.openai_schema)
    return AgentTools(tools, tuple(schemas), valid_names)


def _build_episode(ref: TaskRef, cfg: Tau2EnvConfig, policy: ChatEndpoint, user_endpoint: ChatEndpoint | None,
                   bridge: _EpisodeBridge, stats: _EpisodeStats, seed: int | None) -> Orchestrator:
    """tau2's task, environment, agent, user and orchestrator, as `tau2 run` would build them."""
    task = tau2_domain.get_task(ref.domain, ref.task_id)
    env = tau2_domain.make_environment(ref.domain, solo_mode=cfg.solo_mode)
    offered = agent_tools(ref.domain, cfg.solo_mode, cfg.enable_think_tool)
    turn = _PolicyTurn(policy, bridge, stats, cfg, offered.schemas, offered.valid_names,
                       episode_seed=seed if cfg.policy_seed else None, task=f"{ref.domain}/{ref.task_id}")
    if cfg.solo_mode:
        agent: LLMAgent | LLMSoloAgent = _ProxySoloAgent(turn, offered.tools, env.get_policy(), task)
        user: UserSimulator = DummyUser()
    else:
        assert user_endpoint is not None
        agent = _ProxyAgent(turn, offered.tools, env.get_policy())
        toolset = tau2_domain.tools(ref.domain)
        user = _BridgedUser(user_endpoint, bridge, stats, cfg, list(toolset.user) or None,
                            list(toolset.user_schemas) or None, str(task.user_scenario))
    return Orchestrator(domain=ref.domain, agent=agent, user=user, environment=env, task=task,
                        max_steps=cfg.max_steps, max_errors=cfg.max_errors, seed=seed,
                        solo_mode=cfg.solo_mode)


def _score_episode(ref: TaskRef, orch: Orchestrator, stats: _EpisodeStats, start: float, cfg: Tau2EnvConfig,
                   simulation: SimulationRun, ended: InvalidOutput | ContextExceeded | None,
                   judge: tau2_judge.Judge | None) -> EpisodeResult:
    """tau2's evaluator on the finished simulation, then the configured reward shaping. `ended`: why
    the policy's side stopped it early, if it did (only an invalid output adds the format penalty)."""
    run_s = time.perf_counter() - start
    eval_note = ""
    try:
        reward_info = tau2_domain.evaluate(simulation, orch.task, ref.domain, cfg.solo_mode, judge)
    except tau2_judge.NoJudge as e:
        raise EpisodeRejected(RejectReason.JUDGE_ENDPOINT, str(e)) from None
    except tau2_judge.BadVerdict as e:
        raise EpisodeRejected(RejectReason.JUDGE_INVALID_OUTPUT, str(e)) from None
    except Exception as e:  # an EpisodeRejected of the judge's endpoint is raised in llm.py: re-raised
        frames = traceback.extract_tb(e.__traceback__)
        if not frames or f"{os.sep}tau2{os.sep}domains{os.sep}" not in frames[-1].filename:
            raise
        # Raised in a tau2 domain's own code: its environment assertions call domain functions on the
        # final state, which raise when the episode never created what they inspect (mock: "Task task_2
        # not found"). That is the policy's outcome, scored 0 with the reason; any other error is a bug.
        eval_note = f"tau2's evaluator raised {type(e).__name__}: {e}; scored 0"
        logger.warning("tau2 %s/%s: %s", ref.domain, ref.task_id, eval_note)
        reward_info = RewardInfo(reward=0.0, info={"note": eval_note})
    grade = _grade(ref.domain, orch.task, cfg.solo_mode, simulation, reward_info) if cfg.dump_dir else {}
    eval_s = time.perf_counter() - start - run_s
    breakdown = {str(getattr(k, "value", k)): float(v)
                 for k, v in (reward_info.reward_breakdown or {}).items()}
    # tau2's reasons that `Termination` shares by value; its agent_error (and any other) is an invalid output.
    termination = ended.termination if ended else next(
        (t for t in Termination if t == simulation.termination_reason), Termination.INVALID_OUTPUT)
    invalid = isinstance(ended, InvalidOutput)
    return EpisodeResult(
        domain=ref.domain, task_id=ref.task_id,
        reward=shape_reward(reward_info.reward, breakdown, partial_credit_alpha=cfg.partial_credit_alpha,
                            invalid_format_penalty=cfg.invalid_format_penalty,
                            had_invalid_output=invalid or stats.invalid_tool_calls > 0),
        tau2_reward=float(reward_info.reward), reward_breakdown=breakdown, termination=termination,
        num_agent_turns=stats.agent_turns, num_tool_calls=stats.tool_calls,
        num_invalid_tool_calls=stats.invalid_tool_calls + invalid, agent_latency_s=stats.agent_latency_s,
        user_latency_s=stats.user_latency_s, judge_latency_s=stats.judge_latency_s,
        nl_assertions=[c.model_dump(mode="json") for c in getattr(reward_info, "nl_assertions", None) or []],
        wall_s=time.perf_counter() - start, eval_s=eval_s,
        messages=[m.model_dump(mode="json", exclude={"raw_data"}) for m in simulation.messages],
        tau2_run=simulation.model_copy(update={"reward_info": reward_info}).model_dump(
            mode="json", exclude={"messages"}),
        note="; ".join(n for n in (ended.detail if ended else "", eval_note) if n),
        agent_view=agent_view(orch.agent, simulation.messages), grade=grade,
        completion_ids=list(stats.completion_ids))


def _grade(domain: str, task: Task, solo_mode: bool, simulation: SimulationRun,
           reward_info: RewardInfo) -> dict[str, Any]:
    """For the dump: the grade in words and a failed database check's difference (one more replay)."""
    grade: dict[str, Any] = {"failed": failed_checks(reward_info.model_dump(mode="json")),
                             **where_met(task, simulation.messages)}
    if reward_info.db_check is not None and not reward_info.db_check.db_match:
        try:
            grade["db_diff"] = db_difference(domain, task, simulation.messages, solo_mode)
        except Exception as e:  # the record of a grade, never a reason to lose the episode
            grade["db_diff_error"] = f"{type(e).__name__}: {e}"
    return grade


def agent_view(agent: LLMAgent | LLMSoloAgent, messages: list[Message]) -> dict[str, Any]:
    """For the dump: fingerprints of the system prompt and tool schemas the policy was sent, the tool
    names, and the indices of the valid turns it generated (not tau2's greeting, a task's history or an
    invalid reply): SFT export rebuilds its requests exactly without a copy of the prompt in every dump."""
    schemas = list(agent.turn.schemas)  # type: ignore[union-attr]  # _ProxyAgent / _ProxySoloAgent
    return {"system_prompt_sha256": fingerprint(agent.system_prompt), "tools_sha256": fingerprint(schemas),
            "tool_names": [s["function"]["name"] for s in schemas],
            "policy_messages": [i for i, m in enumerate(messages)
                                if isinstance(m, AssistantMessage) and "completion_id" in (m.raw_data or {})]}


_SLOTS: dict[tuple[asyncio.AbstractEventLoop, int], asyncio.Semaphore] = {}


def _episode_slots(loop: asyncio.AbstractEventLoop, size: int) -> asyncio.Semaphore:
    """The process's `size` episode slots on this loop (one set per size, as `max_concurrent_episodes`
    says), made on first use; a semaphore belongs to one loop, and a closed loop's are dropped."""
    slots = _SLOTS.get((loop, size))
    if slots is None:
        for dead in [key for key in _SLOTS if key[0].is_closed()]:
            del _SLOTS[dead]
        slots = _SLOTS[(loop, size)] = asyncio.Semaphore(size)
    return slots


class _Cancelled(Exception):
    """The episode was abandoned (timeout or cancel); thrown into its greenlet to unwind the orchestrator."""


class _EpisodeBridge:
    """Runs a synchronous episode in its own greenlet on the event loop's thread. `call(coro)`, from inside
    it, hands `coro` to `drive`, which awaits it on the loop while other episodes run, and switches back
    with the result (or raises its exception there)."""

    def __init__(self) -> None:
        self._greenlet: greenlet.greenlet | None = None
        self._cancelled = False

    async def drive(self, body: Any, *args: Any) -> Any:
        """`body(*args)` to its end; a cancel of this coroutine unwinds `body` before it propagates."""
        g = self._greenlet = greenlet.greenlet(body)
        g.gr_context = contextvars.copy_context()  # the episode sees the task's context variables
        request = g.switch(*args)
        while not g.dead:
            try:
                value = await request
            except asyncio.CancelledError:
                self._cancelled = True  # a later `call` raises at once: the greenlet can only end
                with contextlib.suppress(_Cancelled, EpisodeRejected):
                    g.throw(_Cancelled())
                raise
            except BaseException as e:  # noqa: BLE001 - the episode decides what an error means
                request = g.throw(e)
            else:
                request = g.switch(value)
        return request

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """From inside the episode: the result of awaiting `coro` on the loop."""
        g = self._greenlet
        if self._cancelled or g is None or greenlet.getcurrent() is not g:
            coro.close()
            if self._cancelled:
                raise _Cancelled()
            raise RuntimeError("_EpisodeBridge.call runs only inside its episode's greenlet")
        return g.parent.switch(coro)  # type: ignore[union-attr]  # `drive` is the parent


class _EpisodeStats:
    def __init__(self) -> None:
        self.agent_turns = self.tool_calls = self.invalid_tool_calls = 0
        self.agent_latency_s = self.user_latency_s = self.judge_latency_s = 0.0
        self.completion_ids: list[str] = []
        """The policy completions the episode received, in order (`EpisodeResult.completion_ids`)."""


def think(thought: str) -> str:
    """Use this tool to think through the request or the policy before acting. It changes nothing
    and obtains no new information; the thought is only logged.

    Args:
        thought: Your reasoning.
    """
    return "Your thought has been logged."


def think_call_problem(arguments: Any) -> str | None:
    """Why a think call's arguments are not `{"thought": <string>}`, or None if they are: no policy output
    reaches `think` as arguments it cannot take."""
    if not isinstance(arguments, dict):
        return f"think takes an object of arguments, got {type(arguments).__name__}"
    extra = ", ".join(map(repr, sorted(set(arguments) - {"thought"})))
    if "thought" not in arguments:
        return "think needs a 'thought' argument" + (f"; unexpected {extra}" if extra else "")
    if extra:
        return f"think takes only 'thought'; unexpected {extra}"
    if not isinstance(arguments["thought"], str):
        return f"think's 'thought' must be a string, got {type(arguments['thought']).__name__}"
    return None


_THINK_TOOL = as_tool(think)


@dataclass(frozen=True)
class _PolicyTurn:
    """The policy side of one turn, shared by the conversational and the solo agent."""

    endpoint: ChatEndpoint
    bridge: _EpisodeBridge
    stats: _EpisodeStats
    config: Tau2EnvConfig
    schemas: tuple[dict[str, Any], ...]
    valid_tool_names: frozenset[str]
    episode_seed: int | None = None
    """Seeds every policy request (`policy_seed`); None sends no seed."""
    task: str = ""

    def generate(self, state: LLMAgentState, tool_choice: str | None = None) -> AssistantMessage:
        cfg = self.config
        sampling: dict[str, Any] = {"temperature": cfg.temperature, "top_p": cfg.top_p,
                                    "max_completion_tokens": cfg.max_completion_tokens}
        if tool_choice:
            sampling["tool_choice"] = tool_choice
        for _ in range(MAX_THINK_CALLS_PER_TURN + 1):
            if self.episode_seed is not None:
                sampling["seed"] = request_seed(self.episode_seed, self.task, self.stats.agent_turns)
            messages = to_openai_messages(state.system_messages + state.messages)
            completion, latency = self.bridge.call(self.endpoint.complete(messages, list(self.schemas),
                                                                          **sampling))
            self.stats.agent_turns += 1
            self.stats.agent_latency_s += latency
            self.stats.completion_ids.append(completion.id or "")
            reply = parse_reply(completion)
            thoughts = [c for c in reply.tool_calls if c.name == THINK_TOOL_NAME]
            if not (cfg.enable_think_tool and thoughts):
                break
            actions = [c for c in reply.tool_calls if c.name != THINK_TOOL_NAME]
            if actions:  # thoughts next to real actions: keep the actions, drop the thoughts
                self.stats.invalid_tool_calls += sum(think_call_problem(c.arguments) is not None
                                                     for c in thoughts)
                reply.tool_calls = actions
                break
            # Only thoughts: answer them inside the agent and ask the policy again. A misused call
            # gets an error answer, as tau2 answers an unknown tool, and counts as invalid.
            state.messages.append(AssistantMessage(role="assistant", content=reply.content,
                                                   tool_calls=thoughts, cost=0.0))
            for c in thoughts:
                problem = think_call_problem(c.arguments)
                self.stats.invalid_tool_calls += problem is not None
                state.messages.append(
                    ToolMessage(id=c.id, role="tool", requestor="assistant", error=problem is not None,
                                content=f"Error: {problem}" if problem else think(c.arguments["thought"])))
        else:
            raise InvalidOutput(f"more than {MAX_THINK_CALLS_PER_TURN} think calls in one turn",
                                reply.raw_text)
        self.stats.tool_calls += len(reply.tool_calls)
        self.stats.invalid_tool_calls += sum(c.name not in self.valid_tool_names for c in reply.tool_calls)
        return AssistantMessage(
            role="assistant", content=reply.content, tool_calls=reply.tool_calls or None, cost=0.0,
            raw_data={"completion_id": reply.completion_id, "finish_reason": reply.finish_reason})


def request_seed(episode_seed: int, task: str, request_index: int) -> int:
    """The seed of one policy request, hashed from (episode seed, task, the request's index in the episode)
    so that the requests of one evaluation do not share random numbers."""
    digest = hashlib.blake2b(f"{episode_seed}#{task}#{request_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 2**31


def _append_incoming(state: LLMAgentState | UserState, message: Message | None) -> None:
    if isinstance(message, MultiToolMessage):
        state.messages.extend(message.tool_messages)
    elif message is not None:
        state.messages.append(message)


class _ProxyAgent(LLMAgent):
    """tau2's LLMAgent with its LLM call sent through the policy endpoint."""

    def __init__(self, turn: _PolicyTurn, tools: list[Tool], domain_policy: str):
        super().__init__(tools=tools, domain_policy=domain_policy, llm="policy")
        self.turn = turn

    def generate_next_message(self, message, state):  # type: ignore[override]
        _append_incoming(state, message)
        assistant = self.turn.generate(state)
        state.messages.append(assistant)
        return assistant, state

    def set_seed(self, seed: int) -> None:  # the policy's seeds come from `_PolicyTurn` (policy_seed)
        pass


class _ProxySoloAgent(LLMSoloAgent):
    """tau2's LLMSoloAgent (no user; must call tools; `done` ends) through the policy endpoint."""

    def __init__(self, turn: _PolicyTurn, tools: list[Tool], domain_policy: str, task: Task):
        super().__init__(tools=tools, domain_policy=domain_policy, task=task, llm="policy")
        # tau2 appended its `done` tool: the policy is offered it, and calling it is valid.
        self.turn = dataclasses.replace(turn, schemas=(*turn.schemas, self.tools[-1].openai_schema),
                                        valid_tool_names=turn.valid_tool_names | {self.STOP_FUNCTION_NAME})

    def generate_next_message(self, message, state):  # type: ignore[override]
        if isinstance(message, UserMessage):
            raise ValueError("LLMSoloAgent does not support user messages.")
        _append_incoming(state, message)
        assistant = self.turn.generate(state, tool_choice="required")
        if not assistant.is_tool_call():
            raise InvalidOutput("solo agent replied with text instead of a tool call",
                                assistant.content or "")
        assistant = self._check_if_stop_toolcall(assistant)
        state.messages.append(assistant)
        return assistant, state

    def set_seed(self, seed: int) -> None:
        pass


class _BridgedUser(UserSimulator):
    """tau2's UserSimulator (its prompts and role flipping) with its LLM call via our endpoint."""

    def __init__(self, endpoint: ChatEndpoint, bridge: _EpisodeBridge, stats: _EpisodeStats,
                 config: Tau2EnvConfig, tools: list[Tool] | None, schemas: list[dict[str, Any]] | None,
                 instructions: str):
        super().__init__(tools=tools, instructions=instructions, llm=config.user_model,
                         llm_args=dict(config.user_llm_args))
        self.endpoint, self.bridge, self.stats, self.schemas = endpoint, bridge, stats, schemas
        self.retries = config.llm_retries

    def set_seed(self, seed: int) -> None:
        self.llm_args["seed"] = seed

    def generate_next_message(self, message, state):  # type: ignore[override]
        _append_incoming(state, message)
        messages = to_openai_messages(state.system_messages + state.flip_roles())
        problem = ""
        for _ in range(self.retries + 1):
            request = self.endpoint.complete(messages, self.schemas, **self.llm_args)
            completion, latency = self.bridge.call(request)
            self.stats.user_latency_s += latency
            try:
                reply = parse_reply(completion, requestor="user")
                break
            except InvalidOutput as e:  # the user model misbehaved: not the policy's fault
                problem = e.detail
        else:
            raise EpisodeRejected(RejectReason.USER_INVALID_OUTPUT, problem)
        user_message = UserMessage(role="user", content=reply.content, tool_calls=reply.tool_calls or None,
                                   cost=0.0)
        state.messages.append(user_message)
        return user_message, state
