"""Whether an OpenAI-compatible endpoint can serve a run, asked before the run starts anything: it
answers, accepts the key, and serves the model when it lists its models. Used for the training's user
simulator and judge (`lifecycle.validate`) and for the evaluation's policy (`eval.evaluate`)."""

from __future__ import annotations

import os

import httpx


def endpoint_problems(what: str, url_setting: str, url: str, key_env: str, model_setting: str, model: str,
                      unreachable_hint: str, timeout_s: float) -> list[str]:
    """One sentence per problem (none, or one): `GET <url>/models` with the key in `$key_env`.
    `url_setting` / `model_setting` name where the user set them (e.g. `econfig.user_base_url`,
    `--policy-model`)."""
    url = url.rstrip("/")
    key = os.environ.get(key_env) or "EMPTY"
    try:
        response = httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {key}"}, timeout=timeout_s)
    except httpx.HTTPError as e:
        return [f"the {what} at {url_setting}={url} is not reachable ({type(e).__name__}); "
                f"{unreachable_hint}"]
    if response.status_code in (401, 403):
        return [f"the {what} at {url} rejects the key in ${key_env} (HTTP {response.status_code})"]
    if response.status_code == 200:
        try:
            served = [str(m["id"]) for m in response.json().get("data", [])]
        except (ValueError, KeyError, TypeError, AttributeError):
            served = []
        if served and model not in served:
            return [f"the {what} at {url} serves {', '.join(served)}, not {model_setting}={model}"]
    return []  # any other answer: up, without an OpenAI model list to compare against
