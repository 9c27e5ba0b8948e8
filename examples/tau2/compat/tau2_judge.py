"""tau2 1.0.x's NL-assertion judge, asked through the episode's own endpoint instead of tau2's litellm call.

tau2-bench 1.0.1 calls `generate` with a fixed model through litellm, with no base-URL or key option.
`install()` (idempotent) binds that `generate` to `_dispatch`, which sends tau2's prompt unchanged to the
calling thread's judge (`judging(...)`); prompt and verdict parsing stay tau2's; no judge raises `NoJudge`.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

JUDGE_MODULE = "tau2.evaluator.evaluator_nl_assertions"

Judge = Callable[[list[dict[str, Any]], dict[str, Any]], str]
"""(OpenAI-style messages (system, user), tau2's sampling args, e.g. temperature 0) -> the reply text."""

_local = threading.local()
_install_lock = threading.Lock()
_installed = False


class NoJudge(RuntimeError):
    """tau2 asked for an NL-assertion verdict on a thread that has no judge."""


class BadVerdict(ValueError):
    """The judge's reply is not the JSON tau2 reads (`check_verdict`)."""


def needs_judge(task: Any) -> bool:
    """Whether tau2 calls its LLM judge for this task (only tau2 1.0.x tasks can)."""
    criteria = task.evaluation_criteria
    return (criteria is not None and bool(getattr(criteria, "nl_assertions", None))
            and any(getattr(b, "value", b) == "NL_ASSERTION" for b in criteria.reward_basis or []))


def uniform_verdicts(messages: list[dict[str, Any]], met: bool, reasoning: str) -> str:
    """A judge with no LLM: verdict JSON, `met` for each outcome listed after `expectedOutcomes:`."""
    prompt = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
    _, _, listed = prompt.partition("expectedOutcomes:")
    try:
        outcomes = [str(o) for o in ast.literal_eval(listed.strip())]
    except (ValueError, SyntaxError):
        outcomes = ["(no expected outcomes found in the prompt)"]
    return json.dumps({"results": [{"expectedOutcome": o, "reasoning": reasoning, "metExpectation": met}
                                   for o in outcomes]})


def check_verdict(text: str) -> None:
    """Raise `BadVerdict` unless tau2 can read `text` as its verdicts."""
    try:
        results = json.loads(text)["results"]
        if not isinstance(results, list) or not results:
            raise TypeError("`results` must be a non-empty list")
        for r in results:
            if missing := {"expectedOutcome", "reasoning", "metExpectation"} - set(r):
                raise KeyError(f"a verdict lacks {', '.join(sorted(missing))}")
            if not isinstance(r["metExpectation"], bool):
                raise TypeError("`metExpectation` must be true or false")
    except (ValueError, KeyError, TypeError) as e:
        raise BadVerdict(f"{type(e).__name__}: {e}; reply begins {text[:200]!r}") from None


def _dispatch(model: str, messages: list[Any], call_name: str | None = None, **args: Any) -> Any:
    """Stands in for tau2's `generate` inside its NL-assertion evaluator (see the module docstring)."""
    from tau2.data_model.message import AssistantMessage

    judge: Judge | None = getattr(_local, "judge", None)
    if judge is None:
        raise NoJudge(f"tau2 asked its NL-assertion judge ({model}) for a verdict, but no judge is set "
                      "for this episode (econfig.judge_base_url / judge_model)")
    text = judge([{"role": m.role, "content": m.content} for m in messages], args)
    check_verdict(text)
    return AssistantMessage(role="assistant", content=text)


def install() -> None:
    """Route tau2 1.0.x's judge calls through `_dispatch` (idempotent)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        module = importlib.import_module(JUDGE_MODULE)
        if not callable(getattr(module, "generate", None)):
            raise RuntimeError(f"{JUDGE_MODULE} has no `generate`: audit examples/tau2/compat/tau2_judge.py "
                               "for this tau2 release")
        module.generate = _dispatch
        _installed = True


@contextlib.contextmanager
def judging(judge: Judge | None) -> Iterator[None]:
    """Within the block, tau2's NL-assertion verdicts on this thread come from `judge` (None: refused)."""
    previous = getattr(_local, "judge", None)
    _local.judge = judge
    try:
        yield
    finally:
        _local.judge = previous
