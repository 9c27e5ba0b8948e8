"""tau2-bench RL with AReaL 1.0.4: the episode workflow, the training entry, evaluation.

Layout: the example's core is the `tau2_*` modules here; `cpu/` is the embedded CPU runtime (tiny
policy, scripted endpoint, smoke run); `compat/` holds every piece that mirrors a particular
release of tau2, AReaL or vLLM.

Importing the package changes one thing, and only when the user has not set it: litellm, which
tau2 imports, fetches a remote model-cost map at import and retries for ~10 s without network, so
`LITELLM_LOCAL_MODEL_COST_MAP` defaults to its bundled copy. That must precede tau2's own import of
litellm, so it cannot wait for `runtime.process.setup_runtime()`, which does everything else.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
