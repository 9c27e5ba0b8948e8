"""Pre-flight: one pass over a training run's config (`survey`) gives the plan that `tau2_train.py --dry-run`
prints and every problem that would fail the run or spoil its training, one sentence each, before anything
starts. It reads the model's `config.json`, asks the user simulator and judge for their model lists and
looks at the filesystem, but changes nothing. The config's own `validate` methods say what a section can
say about itself; everything that relates settings, data, files, endpoints or add-ons is checked here.
"""

from __future__ import annotations

import getpass
import json
import logging
import math
import operator
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal.api.alloc_mode import ModelAllocation
from areal.infra.utils.http import DEFAULT_ADMIN_API_KEY
from areal.utils.network import gethostip

from examples.tau2.compat import archon_model_types, tau2_judge, tree_block_size
from examples.tau2.compat.tau2_release import ignored_data_dir, installed_release
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.lifecycle.reaper import seed_collision
from examples.tau2.lifecycle.recover import check_recover, describe_recover, steps_per_epoch
from examples.tau2.lifecycle.watchdog import LOOPBACK_HOSTS, endpoint_problems
from examples.tau2.settings import addons
from examples.tau2.settings import dataset as tau2_dataset
from examples.tau2.settings.config import (
    DERIVED_EPISODE_FIELDS,
    LoadedConfig,
    Tau2PPOConfig,
    Tau2TrainEnvConfig,
    parse_backend,
)
from examples.tau2.tau2_utils import RewardBaseline

logger = logging.getLogger("tau2_areal.validate")

USER_CHECK_TIMEOUT_S = 5.0
WANDB_MODE_ENV = "WANDB_MODE"


@dataclass(frozen=True)
class ModelShape:
    """What parallel degrees depend on, from a checkpoint's `config.json`."""

    model_type: str
    num_heads: int
    num_kv_heads: int
    num_layers: int
    tied_embeddings: bool
    num_experts: int | None


def read_model_shape(path: str) -> ModelShape | None:
    """The shape of a local checkpoint; None when `path` is not a local directory (e.g. a hub id,
    which only the workers resolve). Raises ValueError when its config.json is missing or broken."""
    if not path or not Path(path).is_dir():
        return None
    config_file = Path(path) / "config.json"
    try:
        cfg = json.loads(config_file.read_text())
        text = cfg.get("text_config") or cfg  # multimodal configs nest the language model
        heads = int(text["num_attention_heads"])
        tied = bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
        return ModelShape(model_type=str(cfg.get("model_type", "")), num_heads=heads,
                          num_kv_heads=int(text.get("num_key_value_heads") or heads),
                          num_layers=int(text["num_hidden_layers"]), tied_embeddings=tied,
                          num_experts=text.get("num_experts") or text.get("num_routed_experts"))
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


def engine_uses(config: Tau2PPOConfig) -> list[EngineUse]:
    """The engines PPOTrainer will start (a colocated one takes no GPUs of its own).
    Raises ValueError for a backend AReaL cannot parse."""
    sections = [("rollout", config.rollout), ("actor", config.actor)]
    if config.actor.kl_ctl > 0 and config.ref is not None:  # PPOTrainer's own condition for a ref engine
        sections.append(("ref", config.ref))
    if config.critic is not None:
        sections.append(("critic", config.critic))
    parsed = [(role, section, parse_backend(section.backend)) for role, section in sections]
    return [EngineUse(role, s.backend, a, 0 if s.scheduling_strategy.type == "colocation" else a.world_size)
            for role, s, a in parsed]


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


def check_parallelism(shape: ModelShape, uses: list[EngineUse]) -> list[str]:
    """Parallel degrees the model's shape allows, per engine."""
    errors = []
    heads, kv_heads, layers, experts = (shape.num_heads, shape.num_kv_heads, shape.num_layers,
                                        shape.num_experts)
    for u in uses:
        p, backend, rollout = u.alloc.parallel, u.alloc.backend, u.role == "rollout"
        # SGLang/vLLM replicate KV heads when tp exceeds them; the trainers shard them.
        kv_rule = "divide or be a multiple of" if rollout else "be divisible by"
        checks = [  # (failed, problem)
            (heads % p.tp_size, f"{heads} attention heads are not divisible by tp={p.tp_size}"),
            (kv_heads % p.tp_size and not (rollout and p.tp_size % kv_heads == 0),
             f"{kv_heads} key/value heads must {kv_rule} tp={p.tp_size}"),
            (p.pp_size > layers, f"pp={p.pp_size} exceeds the model's {layers} layers"),
            (backend == "megatron" and layers % p.pp_size,
             f"{layers} layers are not divisible by pp={p.pp_size}"),
            (backend == "archon" and p.pp_size > 1 and shape.tied_embeddings,
             "archon pipeline parallelism cannot split a model with tied input/output embeddings "
             "(tie_word_embeddings); use pp=1"),
            (backend == "archon" and p.cp_size > 1 and heads % (p.tp_size * p.cp_size),
             f"{heads} attention heads are not divisible by tp x cp = {p.tp_size * p.cp_size}"),
            (p.ep_size > 1 and not experts, f"ep={p.ep_size} but the model has no experts"),
            (p.ep_size > 1 and experts and experts % p.ep_size,
             f"{experts} experts are not divisible by ep={p.ep_size}")]
        errors += [f"{u.role}.backend={u.backend}: {problem}" for failed, problem in checks if failed]
        if backend == "archon" and shape.model_type not in archon_model_types():
            errors.append(f"{u.role}.backend={u.backend}: archon does not support model type "
                          f"{shape.model_type!r} (supported: {', '.join(sorted(archon_model_types()))})")
    return errors


def check_user_simulator(econfig: Tau2TrainEnvConfig, scheduler: str | None,
                         timeout_s: float = USER_CHECK_TIMEOUT_S) -> list[str]:
    if econfig.solo_mode or not econfig.user_base_url:
        return []  # solo mode has no user; a missing URL is reported by econfig.validate()
    return endpoint_problems(
        "user simulator", "econfig.user_base_url", econfig.user_base_url, econfig.user_api_key_env,
        "econfig.user_model", econfig.user_model, "start one (tau2_rl.sh user-server start), point "
        "econfig.user_base_url at one, or set econfig.solo_mode=true (a domain with tickets: telecom, "
        "mock)", timeout_s, scheduler)


def judge_problems(econfig: Tau2TrainEnvConfig, judged: list[str], scheduler: str | None,
                   timeout_s: float = USER_CHECK_TIMEOUT_S) -> list[str]:
    """A judge is set and answers when a chosen task needs one (`judged`: those tasks' domains)."""
    if not judged:
        return []
    if not econfig.judge_base_url:
        return [f"{installed_release().label} grades tasks of {', '.join(judged)} with an LLM judge (NL "
                "assertions), and no judge is set: point econfig.judge_base_url and econfig.judge_model at "
                "an OpenAI-compatible endpoint (docs/tau2_releases.md)"]
    return endpoint_problems(
        "NL-assertion judge", "econfig.judge_base_url", econfig.judge_base_url, econfig.judge_api_key_env,
        "econfig.judge_model", econfig.judge_model, "start one or point econfig.judge_base_url at one",
        timeout_s, scheduler)


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


def creatable(path: Path) -> str:
    """'' if `path` is a writable directory or can be created; else why not."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            return "no existing parent"
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    return "" if os.access(probe, os.W_OK | os.X_OK) else f"{probe} is not writable"


def shared_paths(config: Tau2PPOConfig) -> dict[str, str]:
    """Directories AReaL's schedulers require to exist (tau2_train creates them)."""
    paths = {"cluster.fileroot": config.cluster.fileroot}
    if config.cluster.name_resolve.type == "nfs":
        paths["cluster.name_resolve.nfs_record_root"] = config.cluster.name_resolve.nfs_record_root
    return paths


def check_paths(config: Tau2PPOConfig) -> list[str]:
    errors = []
    for name, value in shared_paths(config).items():
        if not value:
            errors.append(f"{name} must be set")
        elif problem := creatable(Path(value).absolute()):
            errors.append(f"{name}={value} does not exist and cannot be created ({problem})")
    return errors


def wandb_dir(config: Any) -> str:
    """Where W&B writes its run directories (AReaL passes its log directory as `dir`)."""
    sl = config.stats_logger
    return os.path.join(sl.fileroot, "logs", getpass.getuser(), sl.experiment_name, sl.trial_name, "wandb")


def apply_tracking_env(config: Any, environ: dict[str, str] | None = None) -> None:
    """Set WANDB_MODE=offline for `stats_logger.wandb.mode: offline` unless the user set WANDB_MODE: for any
    W&B mode but `disabled` AReaL calls `wandb.login()`, which without a key fails even offline."""
    env = os.environ if environ is None else environ
    if config.stats_logger.wandb.mode == "offline" and WANDB_MODE_ENV not in env:
        env[WANDB_MODE_ENV] = "offline"
        logger.info("stats_logger.wandb.mode=offline: set %s=offline for wandb.login()", WANDB_MODE_ENV)


def check_tracking(config: Any, environ: dict[str, str] | None = None) -> list[str]:
    """AReaL's `stats_logger` (console, TensorBoard, W&B, SwanLab, Trackio, written by the controller)."""
    env = os.environ if environ is None else environ
    errors = []
    mode, given = config.stats_logger.wandb.mode, env.get(WANDB_MODE_ENV)
    if mode != "disabled" and given is not None and given != mode:
        errors.append(f"stats_logger.wandb.mode={mode} but {WANDB_MODE_ENV}={given} in the environment; "
                      f"unset {WANDB_MODE_ENV} or make them agree")
    path = config.stats_logger.tensorboard.path
    if path is not None and not str(path).strip():
        errors.append("stats_logger.tensorboard.path is empty; give a directory or null (no TensorBoard)")
    return errors


def describe_tracking(config: Any) -> str:
    sl = config.stats_logger
    parts = ["console"]
    if sl.tensorboard.path:
        parts.append(f"TensorBoard in {sl.tensorboard.path}")
    if sl.wandb.mode != "disabled":
        parts.append(f"W&B {sl.wandb.mode} (project {sl.wandb.project or sl.experiment_name}, files in "
                     f"{wandb_dir(config)})")
    parts += [f"{name} {getattr(sl, name).mode}" for name in ("swanlab", "trackio")
              if getattr(sl, name).mode != "disabled"]
    return ", ".join(parts)


def check_derived(config: Tau2PPOConfig) -> list[str]:
    """A derived episode setting (`DERIVED_EPISODE_FIELDS`) set explicitly to another value than its
    source's."""
    errors = []
    for name, derived in DERIVED_EPISODE_FIELDS.items():
        value, source = getattr(config.econfig, name), derived.value(config)
        same = math.isclose(value, source, abs_tol=1e-9) if isinstance(source, float) else value == source
        if not same:
            shown = [f"{v:g}" if isinstance(v, float) else str(v) for v in (value, source)]
            errors.append(f"econfig.{name}={shown[0]} contradicts {derived.source}={shown[1]}, which it "
                          f"follows when left unset ({derived.why}); drop the key")
    return errors


def check_tree_training(config: Tau2PPOConfig) -> list[str]:
    """Combinations AReaL 1.0.4's tree training (`actor.enable_tree_training`) cannot run."""
    actor = config.actor
    if not actor.enable_tree_training:
        return []
    errors = []
    try:
        alloc = ModelAllocation.from_str(actor.backend)
        name, parallel = alloc.backend, alloc.parallel
    except Exception:  # reported by engine_uses
        name, parallel = "", None
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


def check_values(config: Tau2PPOConfig) -> list[str]:
    """Values no run can start with, named with the fix: AReaL accepts them and the run dies later in a
    traceback (a negative batch size, a temperature at or below 0, a local model path that is not there)."""
    errors = []
    own_eval_tokens = config.eval_gconfig.max_new_tokens != config.gconfig.max_new_tokens  # else gconfig's
    given = {"valid_dataset.batch_size": config.valid_dataset is not None,
             "total_train_steps": config.total_train_steps is not None,
             "eval_gconfig.max_new_tokens": own_eval_tokens}
    counted = ["train_dataset.batch_size", "gconfig.n_samples", "gconfig.max_new_tokens",
               "total_train_epochs", *(name for name, is_given in given.items() if is_given)]
    counts = {name: operator.attrgetter(name)(config) for name in counted}
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
    errors += check_derived(config)
    if agent.mode != "inline":
        errors.append(f"rollout.agent.mode must be inline (Tau2AgentWorkflow takes the proxy's base_url, "
                      f"api_key and http_client as arguments), got {agent.mode!r}")
    if agent.export_style != "individual":
        errors.append(f"rollout.agent.export_style must be individual, got {agent.export_style!r}: an "
                      "episode trains one row per turn it took (training/group_workflow.py); concat joins "
                      "turns through the proxy's own messages, which tau2's messages are not")
    else:
        for name, norm in (("adv_norm", config.actor.adv_norm), ("reward_norm", config.actor.reward_norm)):
            if norm is not None and "group" in (norm.mean_level, norm.std_level):
                errors.append(f"actor.{name} uses group-level statistics, but with "
                              "rollout.agent.export_style=individual an episode yields one row per "
                              f"completion, so groups have no fixed size; set actor.{name}.mean_level=batch "
                              "and std_level=batch")
    # The trainer recomputes each sampled token's logprob under the full softmax at actor.temperature: a
    # truncated training sampler (top-p, top-k) would make every importance ratio compare two distributions.
    if config.gconfig.top_p < 1.0:  # econfig.top_p, which the requests carry, follows it (check_derived)
        errors.append(f"gconfig.top_p={config.gconfig.top_p:g}: training samples must come from the full "
                      "distribution the trainer recomputes (top_p 1); truncate only in evaluation "
                      "(eval_gconfig.top_p)")
    if 0 < config.gconfig.top_k != type(config.gconfig)().top_k:
        errors.append(f"gconfig.top_k={config.gconfig.top_k}: training samples must come from the full "
                      "distribution the trainer recomputes; leave top_k unset in training")
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


@dataclass(frozen=True)
class Survey:
    """One pre-flight pass: what the run would start and train on (the `--dry-run` plan's rows, label and
    text, in print order), every problem, and those of them that stop an entry at once (exit 2)."""

    config_file: Path
    rows: tuple[tuple[str, str], ...]
    problems: list[str]
    domain_problems: list[str]


def survey(loaded: LoadedConfig) -> Survey:
    """One walk over the run's config (one descent for the data: `_survey_data`); problems and plan rows
    come out in the order the plan prints them."""
    config = loaded.config
    econfig, scheduler, cluster, path = (config.econfig, config.scheduler.type, config.cluster,
                                         config.actor.path)
    endpoints = check_user_simulator(econfig, scheduler) + check_admin_key(config, gethostip())
    paths, values, tracking = check_paths(config), check_values(config), check_tracking(config)
    try:
        shape, shape_errors = read_model_shape(path), []
        model = (f"{path}: shape not checked (not a local directory; the workers resolve it) -- give a local "
                 "checkpoint to check tp/pp against its heads and layers" if shape is None else
                 f"{path}: {shape.model_type}, {shape.num_layers} layers, {shape.num_heads} heads, "
                 f"{shape.num_kv_heads} kv heads{', tied embeddings' * shape.tied_embeddings} (checked)")
    except ValueError as e:
        shape, model, shape_errors = None, f"{path}: {e}", [str(e)]
    recover_errors, collision = check_recover(config), [p for p in [seed_collision(config)] if p]
    try:
        engines, engine_errors = engine_uses(config), []
    except ValueError as e:
        engines, engine_errors = [], [str(e)]
    enabled = addons.enabled(config)
    addon_problems = [problem for addon in enabled for problem in addon.problems(config)]
    addon_rows = [(addon.name, line) for addon in enabled for line in addon.plan(config)]
    econfig_errors, domain_problems, data_errors, judged, data = _survey_data(config)
    gpus = check_gpus(config, engines)
    parallelism = check_parallelism(shape, engines) if shape is not None else []
    judge = judge_problems(econfig, judged, scheduler)
    train_rows, valid_rows, data_rows = data if data is not None else (None, None, [("data", "unavailable "
                                                                                         "(see problems)")])
    per_epoch = steps_per_epoch(config, train_rows) if train_rows is not None else None
    validation = describe_validation(config, per_epoch, valid_rows)
    training = check_training(config, None if data_errors else train_rows)
    width, width_errors = describe_width(config, engines)
    errors = [*econfig_errors, *engine_errors, *gpus, *shape_errors, *parallelism, *width_errors, *endpoints,
              *paths,
              *domain_problems, *judge, *data_errors, *values, *training,
              *[problem for problem in [ignored_data_dir()] if problem], *tracking, *recover_errors,
              *addon_problems, *collision]
    available = cluster.n_nodes * cluster.n_gpus_per_node
    rows = [("allocation", f"allocation_mode={loaded.allocation_mode} -> rollout.backend="
                           f"{loaded.backends.rollout}, actor.backend={loaded.backends.train}")
            ] if loaded.backends is not None else []
    rows += [("scheduler", f"{scheduler}, {cluster.n_nodes} node(s), {available} GPUs"),
             *[(u.role, _describe_engine(u)) for u in engines], *addon_rows,
             ("GPUs", f"{sum(u.gpus for u in engines)} of {available} used"), ("model", model),
             ("user simulator", "solo mode (no user simulator)" if econfig.solo_mode
              else f"{econfig.user_base_url} model {econfig.user_model}"),
             ("proxy", _describe_proxy(config)), *[("prefix sharing", note) for note in loaded.notes],
             *data_rows]
    if per_epoch is not None:
        steps, epochs, limit = per_epoch, config.total_train_epochs, config.total_train_steps
        text = f"{steps} per epoch x {epochs} epochs = {steps * epochs}"
        if limit is not None and limit < steps * epochs:
            text += f", stopped at total_train_steps={limit}"
        rows.append(("steps", f"{text}; the last step is saved"))
    batch, samples = config.train_dataset.batch_size, config.gconfig.n_samples
    rows += [("batch", f"{batch} tasks x {samples} samples = {batch * samples} episodes per step"),
             ("asynchrony", describe_asynchrony(config)), ("width", width),
             ("group filter", "drop groups whose episodes all train on one reward"
              if econfig.drop_uniform_groups else "off (every group trains)"),
             ("validation", validation),
             ("curriculum", "" if config.curriculum.enabled else "off (every task once per epoch, shuffled)"),
             ("tracking", describe_tracking(config)),
             ("recover", describe_recover(config))]
    return Survey(loaded.config_file, tuple((k, v) for k, v in rows if v), errors, domain_problems)


def _survey_data(config: Tau2PPOConfig) -> tuple[list[str], list[str], list[str], list[str],
                                                   tuple[int, int, list[tuple[str, str]]] | None]:
    """The settings' own problems and the run's data, in one descent through the rooms below: (econfig's
    problems, domain problems, data problems, judged domains, and when the data can be read: (training
    rows, validation rows, the plan's rows about them))."""
    econfig = config.econfig
    econfig_errors = econfig.validate()
    if econfig.choice_errors():  # (among econfig's problems) the splits cannot be read
        return econfig_errors, [], [], [], None
    splits, domains = econfig.domain_splits(), econfig.domain_weights()
    if domain_problems := tau2_domain.problems(econfig.domain_modules, splits, solo_mode=econfig.solo_mode,
                                               mix=bool(econfig.mix)):
        return econfig_errors, domain_problems, [], [], None
    modules = tau2_domain.load_modules(econfig.domain_modules)
    available = {d: tau2_domain.splits(d) for d in domains}
    run_ids = {d: {t for s in splits[d] if s in available[d] for t in available[d][s]} for d in domains}
    tasks = {d: [tau2_domain.get_task(d, t) for t in sorted(run_ids[d])] for d in domains}
    graded = {d: tau2_domain.grading(d) for d in domains}
    judged = {d: sum(tau2_judge.needs_judge(task) for task in tasks[d]) for d in domains}
    judged_list = [d for d in domains if judged[d]]
    rows = []
    for d in domains:
        module = next((m for m in modules if d in m.domains), None)
        origin = f"module {module.name} ({module.root})" if module is not None else "built-in"
        split_text = ", ".join(f"{name} {len(ids)}" for name, ids in available[d].items())
        rows.append(("domain", f"{d}: {origin}, graded {graded[d]}; splits {split_text}; {judged[d]} of its "
                               f"{len(run_ids[d])} run tasks need the LLM judge"))
    try:  # what is left out first: the rows' own descent ends in the domains
        left_out = {d: tau2_dataset.reasons_left_out(econfig, d) for d in domains}
        regraded = {d: tau2_dataset.regraded_task_ids(d) for d in domains}
        train = tau2_dataset.train_rows(econfig, config.seed)
        valid = tau2_dataset.valid_rows(econfig) if config.valid_dataset is not None else []
    except (ValueError, KeyError) as e:  # e.g. every task of a split left out as regraded
        return econfig_errors, [], [str(e)], judged_list, None
    why = {"regraded": "regraded", "flagged": "that pay for doing nothing or half the job"}
    for d in domains:
        train_ids = set(available[d].get(splits[d][0], []))
        left = [f"{n} {why[reason]}" for reason, ids in left_out[d].items() if (n := len(train_ids & ids))]
        trained, validated = ([r["task_id"] for r in part if r["domain"] == d] for part in (train, valid))
        n_regraded = sum(t in regraded[d] for t in validated)
        regraded_text = f" ({n_regraded} regraded)" if n_regraded else ""
        out = f"; left out: {', '.join(left)}" if left else ""
        rows.append(("data", f"{d}: {len(trained)} training rows ({len(set(trained))} tasks{out}), "
                             f"{len(validated)} validation rows{regraded_text}"))
    return econfig_errors, [], [], judged_list, (len(train), len(valid), rows)


def _describe_engine(u: EngineUse) -> str:
    p = u.alloc.parallel
    degrees = (("dp", p.dp_size), ("tp", p.tp_size), ("pp", p.pp_size), ("cp", p.cp_size), ("ep", p.ep_size))
    dims = [f"{name}{size}" for name, size in degrees if size > 1 or name == "dp"]
    if u.role == "rollout":
        return (f"{u.backend:<34} {p.dp_size} {u.alloc.backend} server(s) x {u.gpus_per_instance} GPU(s)"
                f" = {u.gpus} GPUs")
    gpus = ", colocated (no GPUs of its own)" if u.gpus == 0 else f" = {u.gpus} GPUs"
    return f"{u.backend:<34} {' '.join(dims)}{gpus}"


def _describe_proxy(config: Tau2PPOConfig) -> str:
    agent, econfig = config.rollout.agent, config.econfig
    key = "AReaL's public default" if agent.admin_api_key == DEFAULT_ADMIN_API_KEY else "set"
    rendering = econfig.serving_engine
    if rendering == "auto":
        rendering = config.rollout.backend.split(":")[0]
    return (f"mode {agent.mode}, tool parser {agent.tool_call_parser}, reasoning parser "
            f"{agent.reasoning_parser}, export {agent.export_style}, turn_discount {agent.turn_discount}, "
            f"admin key {key}, prompts rendered as {rendering}'s server does (econfig.serving_engine)")


def groups_in_flight(config: Tau2PPOConfig) -> tuple[int, str]:
    """The most GRPO groups the rollout runs at once, and what bounds it (AReaL's staleness manager:
    min(max_concurrent_rollouts, (max_head_offpolicyness + 1) batches))."""
    rollout, batch = config.rollout, config.train_dataset.batch_size
    ahead = rollout.max_head_offpolicyness
    knob, staleness = rollout.max_concurrent_rollouts or batch, (ahead + 1) * batch
    bounds = [name for name, limit in (("rollout.max_concurrent_rollouts", knob),
                                       (f"the staleness limit, {ahead + 1} batches", staleness))
              if limit == min(knob, staleness)]
    return min(knob, staleness), " and ".join(bounds)


def describe_width(config: Tau2PPOConfig, engines: list[EngineUse]) -> tuple[str, list[str]]:
    """Episodes in flight per inference server, what bounds them, and a width no rollout worker can serve
    (AReaL sends each group to one worker, round-robin; one worker and one proxy per server)."""
    servers = next((u.alloc.parallel.dp_size for u in engines if u.role == "rollout"), 0)
    if not servers:
        return "", []
    groups, bound = groups_in_flight(config)
    samples, slots = config.gconfig.n_samples, config.econfig.max_concurrent_episodes
    per_worker = -(-groups // servers) * samples
    row = (f"{groups * samples} episodes in flight at most ({groups} groups x {samples}; bound: {bound}), "
           f"{per_worker} per inference server and its rollout worker, of the worker's "
           f"econfig.max_concurrent_episodes {slots} slots")
    problems = [] if per_worker <= slots else [
        f"a rollout worker gets up to {per_worker} episodes at once ({-(-groups // servers)} groups of "
        f"{samples}), more than its econfig.max_concurrent_episodes={slots} slots: the rest would wait. "
        "Raise econfig.max_concurrent_episodes or lower rollout.max_concurrent_rollouts"]
    return row, problems


def describe_asynchrony(config: Tau2PPOConfig) -> str:
    """How far rollouts may run ahead of the trainer, in words (`training/rollout_controller.py`)."""
    rollout, samples = config.rollout, config.gconfig.n_samples
    ahead = rollout.max_head_offpolicyness
    if ahead == 0:
        return ("synchronous (rollout.max_head_offpolicyness 0): each step's episodes are played by the "
                "weights it then trains, and no episode runs while the weights are swapped")
    groups, bound = groups_in_flight(config)
    correction = ("the decoupled loss corrects for the older weights" if config.actor.use_decoupled_loss
                  else "no off-policy correction (actor.use_decoupled_loss false)")
    return (f"asynchronous: rollouts run up to {ahead} step(s) ahead of the trainer "
            f"(rollout.max_head_offpolicyness {ahead}), at most {groups} groups ({groups * samples} "
            f"episodes) at once (bound: {bound}); episodes go on while the trainer trains and the weights "
            "are swapped under them, a completion the swap interrupts is finished by the new weights, and a "
            f"group with a token older than {ahead} versions when its step trains is dropped "
            f"(tau2/async/stale_groups_dropped); {correction}")


def describe_validation(config: Tau2PPOConfig, per_epoch: int | None, valid_rows: int | None) -> str:
    """When validation runs, in steps: the evaluator counts epochs, which the config's comments cannot
    turn into steps (that depends on the split's size and the batch size)."""
    if config.valid_dataset is None:
        return "off (valid_dataset: null)"
    ev = config.evaluator
    in_steps = f" = every {ev.freq_epochs * per_epoch} steps" if ev.freq_epochs and per_epoch else ""
    when = [text for due, text in ((ev.freq_epochs, f"after every {ev.freq_epochs} epoch(s){in_steps}"),
                                   (ev.freq_steps, f"every {ev.freq_steps} steps"),
                                   (ev.freq_secs, f"every {ev.freq_secs} s")) if due]  # any one due: it runs
    text = " or ".join(when) or "never (evaluator.freq_epochs, freq_steps and freq_secs are all unset)"
    if ev.eval_before_train:
        text = f"before training, then {text}"
    tasks = f"{valid_rows} tasks" if valid_rows is not None else "the validation tasks"
    return f"{text}: {tasks} x {config.eval_gconfig.n_samples} sample(s)"


def format_plan(found: Survey, errors: list[str]) -> str:
    lines = [f"tau2 training plan ({found.config_file})", *("  {:<16}{}".format(*row) for row in found.rows)]
    problems = [f"problems ({len(errors)}):", *(f"  - {e}" for e in errors)]
    return "\n".join(lines + (problems if errors else ["no problems found"]))
