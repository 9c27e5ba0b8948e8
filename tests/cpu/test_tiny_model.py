"""The tiny Qwen3 policy: shape, tokenizer, cache, the oracle warm-up data, the newest saved one."""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer

from examples.tau2.cpu.tiny_model import (
    TOKENIZER_FILES,
    TinyModelRecipe,
    add_early_stops,
    add_other_actions,
    build_random_model,
    cache_key,
    ensure_tiny_model,
    freed_memory_kept,
    latest_saved_model,
    load_info,
    record_oracle_turns,
    render_example,
    tokenizer_dir,
    warm_up,
)


def test_recipe_rejects_bad_values_with_one_sentence_each():
    with pytest.raises(ValueError, match="num_attention_heads must be a multiple of num_key_value_heads"):
        TinyModelRecipe(num_attention_heads=4, num_key_value_heads=3)
    with pytest.raises(ValueError, match="warmup_steps must be >= 0"):
        TinyModelRecipe(warmup_steps=-1)
    with pytest.raises(ValueError, match="warmup_early_stops must be >= 0"):
        TinyModelRecipe(warmup_early_stops=-1)
    with pytest.raises(ValueError, match="warmup_other_actions must be >= 0"):
        TinyModelRecipe(warmup_other_actions=-1)
    with pytest.raises(ValueError, match="unknown tiny model recipe keys: hidden"):
        TinyModelRecipe.from_dict({"hidden": 32})
    assert TinyModelRecipe.from_dict({"warmup_tasks": ["a", 2]}).warmup_tasks == ("a", "2")


def test_tokenizer_files_are_the_qwen3_ones():
    folder = tokenizer_dir()
    assert all((folder / f).is_file() for f in TOKENIZER_FILES)
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert "<tool_call>" in tok.chat_template


def test_random_model_has_the_documented_shape_and_is_seeded():
    recipe = TinyModelRecipe()
    model = build_random_model(recipe)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim,
            cfg.num_key_value_heads, cfg.vocab_size) == (64, 2, 4, 32, 2, 151936)
    assert cfg.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    again = build_random_model(recipe)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))


def test_cache_builds_once_and_reloads(tmp_path):
    recipe = TinyModelRecipe(seed=3)
    path = ensure_tiny_model(recipe, tmp_path)
    files = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tiny_model.json", *TOKENIZER_FILES} <= files
    info = load_info(path)
    assert info.recipe["seed"] == 3 and info.num_parameters > 9_000_000
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(recipe, tmp_path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert ensure_tiny_model(TinyModelRecipe(seed=4), tmp_path) != path  # the key follows the recipe
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["tie_word_embeddings"]


def test_concurrent_builds_of_one_recipe_build_it_once(tmp_path, monkeypatch):
    """Two runs (or test workers) asking for the same missing model at once: one builds, one waits."""
    from concurrent.futures import ThreadPoolExecutor

    from examples.tau2.cpu import tiny_model

    builds = []
    real = tiny_model.build_random_model

    def counted(recipe):
        builds.append(recipe.seed)
        return real(recipe)

    monkeypatch.setattr(tiny_model, "build_random_model", counted)
    with ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda _: ensure_tiny_model(TinyModelRecipe(seed=5), tmp_path), range(2)))
    assert paths[0] == paths[1] and builds == [5]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [paths[0].name]


def test_oracle_turns_render_as_tool_calls_the_model_can_learn(tokenizer):
    examples = record_oracle_turns("mock", ["create_task_1"])
    assert len(examples) == 2  # the tool call, then the closing statement
    prompt, target = render_example(tokenizer, examples[0])
    text = tokenizer.decode(target)
    assert text.endswith("<|im_end|>") and "<tool_call>" in text and '"create_task"' in text
    assert examples[0].tools and any(t["function"]["name"] == "create_task" for t in examples[0].tools)
    # the `user-scenario` user opened with the task's instructions, not with its persona
    opening = [m["content"] for m in examples[0].messages if m["role"] == "user"][0]
    assert opening.startswith("You are a team member who needs to create a task")
    assert opening.endswith("Create a new task called 'Important Meeting' for user_1.")
    assert "Persona" not in opening
    # the prompt is what AReaL's proxy renders for the same request
    rendered = tokenizer.apply_chat_template(examples[0].messages, tools=examples[0].tools,
                                       add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(prompt) == rendered

    model = build_random_model(TinyModelRecipe())
    stats = warm_up(model, tokenizer, examples, TinyModelRecipe(warmup_steps=4, warmup_lr=1e-2))
    assert stats["final_loss"] < stats["first_loss"]
    assert 0 < stats["shared_prefix_tokens"] < len(prompt)


def test_other_actions_put_other_tasks_first_replies_on_each_first_turn():
    tasks = ["create_task_1", "create_task_1_with_env_assertions", "update_task_1", "impossible_task_1"]
    examples = record_oracle_turns("mock", tasks)
    assert add_other_actions(examples, 0, seed=0) == examples
    mixed = add_other_actions(examples, 1, seed=0)
    assert mixed[: len(examples)] == examples  # the oracle's turns stay, in order
    added = mixed[len(examples):]
    first = {}
    for ex in examples:
        first.setdefault(ex.task, ex)
    assert [ex.task for ex in added] == list(first)  # one per task, on its first turn's request
    for ex in added:
        assert ex.messages is first[ex.task].messages
        assert ex.reply != first[ex.task].reply  # never the task's own action...
        # ...nor its twin's: create_task_1 and its env-assertions variant open with the same call
        if ex.task.startswith("create_task_1"):
            assert ex.reply.get("tool_calls", [{}])[0].get("function", {}).get("name") != "create_task"
        assert ex.reply in [f.reply for f in first.values()]
    # three distinct opening actions (create, update, transfer): each task has two others to draw from
    assert len(add_other_actions(examples, 2, seed=0)) == len(examples) + 2 * len(first)
    with pytest.raises(ValueError, match="only 2 other distinct replies"):
        add_other_actions(examples, 3, seed=0)
    # seeded per task: the same draw whatever the order of the tasks
    by_task = [ex for task in reversed(first) for ex in examples if ex.task == task]
    again = add_other_actions(by_task, 1, seed=0)[len(examples):]
    def action(reply):  # call ids are the server's and not rendered by the template
        return reply.get("content"), [c["function"] for c in reply.get("tool_calls") or []]

    assert {ex.task: action(ex.reply) for ex in again} == {ex.task: action(ex.reply) for ex in added}


def test_cache_key_of_recipes_without_the_later_fields_is_unchanged():
    # models cached before warmup_early_stops / warmup_other_actions existed keep their key; setting one
    # changes it (the tokenizer files are part of the key: they are pinned by requirements/cpu.lock)
    base = cache_key(TinyModelRecipe(warmup_steps=60), [])
    assert base == "8fe5bf50f9d786e9"  # computed by the code before these fields existed
    keys = {cache_key(TinyModelRecipe(warmup_steps=60, **{name: 1}), [])
            for name in ("warmup_early_stops", "warmup_other_actions")}
    assert len(keys) == 2 and base not in keys


def test_early_stops_put_each_tasks_closing_reply_on_its_first_turn():
    examples = record_oracle_turns("mock", ["create_task_1", "create_task_1_nl_eval"])
    assert [ex.task for ex in examples] == ["create_task_1", "create_task_1", "create_task_1_nl_eval"]
    assert add_early_stops(examples, 0) == examples
    mixed = add_early_stops(examples, 3)
    assert mixed[:3] == examples
    added = mixed[3:]
    # create_task_1 opens with its tool call and closes with DONE_ALL: three DONE_ALLs on its request;
    # the text-only task's first reply is its closing one, so it gains nothing
    assert [ex.task for ex in added] == ["create_task_1"] * 3
    for ex in added:
        assert ex.messages is examples[0].messages and ex.tools is examples[0].tools
        assert ex.reply is examples[1].reply and "DONE_ALL" in ex.reply["content"]


def test_latest_saved_model_is_the_newest_model_dir(tmp_path):
    from areal.utils.saver import Saver

    saver = SimpleNamespace(experiment_name="e", trial_name="t", fileroot=str(tmp_path))
    assert latest_saved_model(saver) is None
    root = Path(Saver.get_save_root(saver.experiment_name, saver.trial_name, saver.fileroot))
    for i, step in enumerate(("globalstep1", "globalstep2")):
        (root / step).mkdir(parents=True)
        (root / step / "config.json").write_text("{}")
        os.utime(root / step / "config.json", (1000 + i, 1000 + i))
    assert latest_saved_model(saver) == root / "globalstep2"


def test_freed_memory_is_reused_inside_and_given_back_after():
    """A freed 200 MB tensor: outside, its next allocation is faulted in (and zeroed) page by page again;
    inside `freed_memory_kept`, it reuses the heap; after, glibc's defaults are back. The second is 1 MB
    smaller: torch's 64-byte-aligned allocation asks glibc for a little more than it keeps, so an equal one
    fits the freed block only when nothing was allocated next to it (3 runs in 8 failed)."""
    def pages_faulted_by_a_second_allocation() -> int:
        torch.ones(50_000_000)  # 200 MB, freed at once
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.ones(49_750_000)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    outside = pages_faulted_by_a_second_allocation()
    with freed_memory_kept():
        inside = pages_faulted_by_a_second_allocation()
    after = pages_faulted_by_a_second_allocation()
    assert inside < 1_000 < outside and after > 1_000, (outside, inside, after)
