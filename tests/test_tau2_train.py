"""The training entry: dry-run plans, the arguments of PPOTrainer.train, and tau2_rl.sh."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from areal.utils.dynamic_import import import_from_string

from examples.tau2.tau2_agent import Tau2AgentWorkflow
from examples.tau2.tau2_filter import drop_uniform_groups
from examples.tau2.tau2_train import GROUP_FILTER, WORKFLOW, main, prepare, train_call
from tests.tau2_train_support import CONFIG, REPO, clean_overrides, load, write_model

SCRIPT = REPO / "examples" / "tau2" / "tau2_rl.sh"


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
        "  data            airline: 30 training rows (30 tasks), 20 validation rows",
        "  steps           3 per epoch x 50 epochs = 150",
        "  batch           8 tasks x 8 samples = 64 episodes per step",
        "  group filter    drop groups whose rows all carry one reward",
        "no problems found",
    ]
    for line in expected:
        assert line in lines, (line, out)
    assert not (tmp_path / "fileroot").exists()  # a dry run starts and creates nothing


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
        "  batch           15 tasks x 8 samples = 120 episodes per step",
        "  steps           2 per epoch x 50 epochs = 100",
    ]
    for line in expected:
        assert line in lines, (line, out)
    # On this machine the scheduler's one bind (/storage) may not be creatable; the loopback user
    # simulator always fails for SLURM, whose workers run on other nodes.
    problems = [line[4:] for line in lines if line.startswith("  - ")]
    assert rc == 1 and problems
    assert any("is a loopback address" in p for p in problems)
    assert all("is a loopback address" in p or "/storage/tau2-areal/" in p for p in problems), problems


def test_dry_run_mix_and_local_model(capsys, tmp_path, endpoint):
    model = write_model(tmp_path / "qwen3-1.7b")
    rc, out = dry_run(capsys, *clean_overrides(tmp_path, endpoint.url), f"actor.path={model}",
                      "econfig.domain=null", "econfig.mix={airline:1,retail:1}",
                      "econfig.drop_uniform_groups=false")
    assert rc == 0, out
    lines = out.splitlines()
    for line in [
        f"  model           {model}: qwen3, 28 layers, 16 heads, 8 kv heads, tied embeddings (checked)",
        "  data            airline: 74 training rows (30 tasks), 20 validation rows",
        "  data            retail: 74 training rows (74 tasks), 40 validation rows",
        "  steps           18 per epoch x 50 epochs = 900",
        "  group filter    off (every group trains)",
    ]:
        assert line in lines, (line, out)


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
    assert import_from_string(call["dynamic_filter_fn"]) is drop_uniform_groups
    train, evaluation = call["workflow_kwargs"], call["eval_workflow_kwargs"]
    assert (train["temperature"], train["top_p"]) == (1.0, 1.0)
    assert (evaluation["temperature"], evaluation["top_p"]) == (0.6, 0.95)  # eval_gconfig
    assert evaluation["dump_dir"] == os.path.join(train["dump_dir"], "eval")
    own = ("temperature", "top_p", "dump_dir", "group_size", "reward_baseline")
    assert {k: v for k, v in train.items() if k not in own} == {
        k: v for k, v in evaluation.items() if k not in own}
    assert train["group_size"] == config.gconfig.n_samples
    assert evaluation["group_size"] == config.eval_gconfig.n_samples
    assert evaluation["reward_baseline"] == "none"  # validation reports raw rewards
    centered = train_call(load("econfig.user_base_url=http://127.0.0.1:9/v1", "econfig.user_model=user",
                               "econfig.reward_baseline=group_mean").config, with_validation=True)
    assert centered["workflow_kwargs"]["reward_baseline"] == "group_mean"
    assert centered["eval_workflow_kwargs"]["reward_baseline"] == "none"
    assert Tau2AgentWorkflow(**centered["workflow_kwargs"])._baseline.group_size == config.gconfig.n_samples
    assert Tau2AgentWorkflow(**evaluation).config.temperature == 0.6

    plain = train_call(load("econfig.user_base_url=http://127.0.0.1:9/v1", "econfig.user_model=user",
                            "econfig.drop_uniform_groups=false").config, with_validation=False)
    assert plain["dynamic_filter_fn"] is None
    assert plain["eval_workflow"] is None and plain["eval_workflow_kwargs"] is None
    assert GROUP_FILTER not in plain.values()


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "TAU2_PYTHON": sys.executable, **(env or {})}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full_env,
                          timeout=300, check=False)


def test_script_usage_and_refusals(tmp_path):
    help_ = run_script("help")
    assert help_.returncode == 0
    for command in ("local", "slurm", "dry-run", "user-server start|stop|status", "eval"):
        assert f"  {command} " in help_.stdout
    assert run_script("bogus").returncode == 2
    no_image = run_script("slurm", env={"TAU2_IMAGE": ""})
    assert no_image.returncode == 1 and "set TAU2_IMAGE" in no_image.stderr
    outside = run_script("slurm", env={"TAU2_IMAGE": "/storage/x.sif"})
    if not REPO.as_posix().startswith("/storage/"):  # a checkout under /storage goes on to train
        assert outside.returncode == 1 and "clone the repository under /storage" in outside.stderr
    no_gpu = run_script("local")
    assert no_gpu.returncode == 1 and "cannot run SGLang on a GPU" in no_gpu.stderr
    stopped = run_script("user-server", "stop", env={"TAU2_RUN_DIR": str(tmp_path)})
    assert stopped.returncode == 0 and "not running" in stopped.stderr
    status = run_script("user-server", "status", env={"TAU2_RUN_DIR": str(tmp_path)})
    assert status.returncode == 1


@pytest.mark.slow
def test_script_dry_run_passes_overrides(tmp_path, endpoint):
    # No admin key given: the script passes a fresh one, as local and slurm do.
    overrides = [o for o in clean_overrides(tmp_path, endpoint.url) if "admin_api_key" not in o]
    result = run_script("dry-run", *overrides, "+configs=debug_2gpu")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "  rollout         sglang:d1 " in result.stdout and "no problems found" in result.stdout
    assert "admin key set" in result.stdout


FAKE_SERVER = '''
import http.server, subprocess, sys, time
args = sys.argv[1:]
open(args[0], "w").write(" ".join(args[1:]))
if "--fail" in args:
    sys.exit(3)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a child, as SGLang has
port = int(args[args.index("--port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
time.sleep(1)
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''


def fake_gpu_python(tmp_path) -> tuple[str, str]:
    """An interpreter that passes the GPU check and serves /health in place of sglang.launch_server."""
    server = tmp_path / "fake_sglang.py"
    server.write_text(FAKE_SERVER)
    argv_file = tmp_path / "sglang_argv.txt"
    wrapper = tmp_path / "python"
    wrapper.write_text(f"""#!/usr/bin/env bash
if [[ "$1" == "-" ]]; then cat >/dev/null; exit 0; fi
if [[ "$1" == "-m" && "$2" == "sglang.launch_server" ]]; then
  shift 2
  exec {sys.executable} {server} {argv_file} "$@"
fi
exec {sys.executable} "$@"
""")
    wrapper.chmod(0o755)
    return str(wrapper), str(argv_file)


@pytest.mark.slow
def test_user_server_start_waits_for_health_and_stop_ends_its_group(tmp_path, closed_port):
    python, argv_file = fake_gpu_python(tmp_path)
    env = {"TAU2_PYTHON": python, "TAU2_RUN_DIR": str(tmp_path / "run"), "TAU2_USER_GPUS": "2,3",
           "TAU2_USER_PORT": str(closed_port), "TAU2_USER_TIMEOUT": "60"}
    started = run_script("user-server", "start", "--mem-fraction-static", "0.5", env=env)
    try:
        assert started.returncode == 0, started.stderr
        assert "healthy after" in started.stderr
        assert "econfig.user_base_url=http://" in started.stderr
        argv = Path(argv_file).read_text().split()
        assert argv[argv.index("--served-model-name") + 1] == "tau2-user"
        assert argv[argv.index("--tp-size") + 1] == "2"  # one rank per GPU in TAU2_USER_GPUS
        assert argv[-6:] == ["--tool-call-parser", "qwen", "--reasoning-parser", "qwen3",
                             "--mem-fraction-static", "0.5"]
        pid = int((tmp_path / "run" / "user-server.pid").read_text())
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
    assert (len(train), len(valid)) == (30, 20)
    assert train[0] == {"domain": "airline", "task_id": train[0]["task_id"], "split": "train"}
    _, _, none = prepare(load(*clean_overrides(tmp_path, endpoint.url), "econfig.valid_split=null",
                              "valid_dataset=null"))
    assert none is None
