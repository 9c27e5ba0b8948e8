"""tau2-bench RL with AReaL 1.0.4: the episode workflow, the training entry, evaluation.

Layout: the core (what every run needs) is the `tau2_*` modules here and the `episode/`, `training/`,
`settings/`, `lifecycle/`, `runtime/` and `compat/` folders; the add-ons above it are `cpu/` (the embedded
CPU runtime: tiny policy, scripted endpoint, smoke run), `eval/`, `slurm/`, `curriculum/`, `releases/`
and `sft/` (the README's "Layout").

Importing the package changes one thing, and only when the user has not set it: litellm, which
tau2 imports, fetches a remote model-cost map at import and retries for ~10 s without network, so
`LITELLM_LOCAL_MODEL_COST_MAP` defaults to its bundled copy. That must precede tau2's own import of
litellm, so it cannot wait for `runtime.process.setup_runtime()`, which does everything else.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
