"""The embedded CPU runtime, an add-on: the whole RL loop on a machine with no GPU and no API key.

`smoke` (the runner, `bash examples/tau2/tau2_rl.sh smoke`) and its config `smoke_config`, the tiny
Qwen3 policy built in code (`tiny_model`), and the scripted OpenAI-compatible endpoint that stands in
for the user simulator (and, in tests and benchmarks, for the policy): `scripted_endpoint`. `trainer`
is `Tau2PPOTrainer` with the CPU-capable AReaL engines it runs on, `sft_trainer` AReaL's SFT trainer;
`archon_tree_cpu`, `vllm_cpu_server` and `vllm_cpu_worker` are AReaL's archon tree path and vLLM's
server on a CPU; `parity` compares the prompt trained on with the server's own. See SMOKE.md.
"""
