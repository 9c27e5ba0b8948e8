"""A small example tau2 domain of your own: the front desk of a public library ("library").

Importing this package registers the domain and its tasks with tau2's registry, once (Python imports a
module once per process). The domain is tau2's own parts only (a database, a toolkit, a policy, tasks),
so stock tau2 runs and grades it like a built-in domain.

Use it in a run, with this package's parent folder on PYTHONPATH (every process that looks the domain up
imports it):

    PYTHONPATH=examples/tau2/docs/own_domain ... econfig.domain_modules=[library_desk] econfig.domain=library

Layout: data_model.py (the database), tools.py (the agent's tools), environment.py (what the registry
calls), data/ (db.json, policy.md, tasks.json, split_tasks.json). Check its tasks with
`tau2_rl.sh eval --oracle` (docs/own_domain.md).
"""

from tau2.registry import registry

from .environment import DOMAIN_NAME, get_environment, get_tasks, get_tasks_split

registry.register_domain(get_environment, DOMAIN_NAME)
registry.register_tasks(get_tasks, DOMAIN_NAME, get_task_splits=get_tasks_split)

__all__ = ["DOMAIN_NAME", "get_environment", "get_tasks", "get_tasks_split"]
