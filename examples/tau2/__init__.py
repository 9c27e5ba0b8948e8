"""tau2-bench RL with AReaL: workflow, training entry, evaluation.

Importing the package first sets up the environment tau2 needs (offline litellm cost map, quiet
loguru) before any tau2 module is imported: see `tau2_utils`.
"""

from examples.tau2 import tau2_utils as _tau2_utils  # noqa: F401
