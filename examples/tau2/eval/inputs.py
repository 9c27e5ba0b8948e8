"""What a trial's score depends on, as one key per task, so that a resumed evaluation reruns a trial whose
inputs changed instead of keeping its old score.

A task's key hashes the task as τ² parses it, its domain as τ² builds it (the policy document, the
databases, the tool schemas, and for a domain from a module that module's Python files) and the run's
settings (the policy, the user simulator, the episode settings, the τ² release). `evaluate.open_run`
keeps a recorded trial only when its key equals today's: editing one task reruns that task's trials,
editing a domain's code or data reruns the whole domain's.
"""

from __future__ import annotations

from typing import Any

from examples.tau2.runtime.files import fingerprint


def task_keys(tasks: dict[str, list[str]], settings: dict[str, Any]) -> dict[str, dict[str, str]]:
    """domain -> task id -> the key of what that task's trials depend on. `settings`: the run's
    (`EvalPlan.settings()`); its task list is left out, so that one task's key ignores the others."""
    from examples.tau2.episode import domain as tau2_domain
    from examples.tau2.episode.task_check import domain_fingerprint

    shared = {k: v for k, v in settings.items() if k not in ("domains", "tasks")}
    keys: dict[str, dict[str, str]] = {}
    for domain, ids in tasks.items():
        base = fingerprint({"settings": shared, "domain": domain,
                            "built": domain_fingerprint(domain)})
        keys[domain] = {t: fingerprint([base, tau2_domain.get_task(domain, t).model_dump(mode="json")])
                        for t in ids}
    return keys
