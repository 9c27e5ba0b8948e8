"""What a trial's score depends on, as one key per task, so that a resumed evaluation reruns a trial whose
inputs changed instead of keeping its old score.

A task's key hashes the task as τ² parses it, its domain as τ² builds it (the policy document, the
databases, the tool schemas, and for a domain from a module that module's Python files) and the run's
settings (the policy, the user simulator, the episode settings, the τ² release). `evaluate.open_run`
keeps a recorded trial only when its key equals today's: editing one task reruns that task's trials,
editing a domain's code or data reruns the whole domain's.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from examples.tau2.runtime.files import fingerprint


def task_keys(tasks: dict[str, list[str]], settings: dict[str, Any]) -> dict[str, dict[str, str]]:
    """domain -> task id -> the key of what that task's trials depend on. `settings`: the run's
    (`EvalPlan.settings()`); its task list is left out, so that one task's key ignores the others."""
    from examples.tau2.episode import domain as tau2_domain

    shared = {k: v for k, v in settings.items() if k not in ("domains", "tasks")}
    keys: dict[str, dict[str, str]] = {}
    for domain, ids in tasks.items():
        base = fingerprint({"settings": shared, "domain": domain, "built": domain_fingerprint(domain)})
        keys[domain] = {t: fingerprint([base, tau2_domain.get_task(domain, t).model_dump(mode="json")])
                        for t in ids}
    return keys


def domain_fingerprint(domain: str) -> dict[str, str]:
    """Hashes of the domain as a fresh episode meets it: its policy, databases and tools, and the code of
    the module that registers it ('' for a built-in domain, which the τ² release in the settings pins)."""
    from examples.tau2.episode import domain as tau2_domain

    env = tau2_domain.make_environment(domain)
    toolset = tau2_domain.tools(domain)
    return {
        "policy": fingerprint(env.get_policy()),
        "db": env.get_db_hash() or "",
        "user_db": env.get_user_db_hash() or "",
        "tools": fingerprint([toolset.agent_schemas, toolset.user_schemas]),
        "code": module_code_digest(domain),
    }


def module_code_digest(domain: str) -> str:
    """Hash of the Python files of the module that registered `domain`: the file itself, or every `.py`
    file of its package (data files count through what τ² builds from them, so editing one task's JSON
    changes that task's key only). '' for a domain no loaded module registered."""
    from examples.tau2.episode import domain as tau2_domain

    owner = next((m.name for m in tau2_domain.loaded_modules() if domain in m.domains), None)
    file = getattr(sys.modules.get(owner or ""), "__file__", None)
    if not file:
        return ""
    path = Path(file).resolve()
    files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    return fingerprint({str(f.relative_to(path.parent)): fingerprint(f.read_bytes().hex()) for f in files})
