"""The tiny Qwen3 policy: shape, tokenizer, cache, and the oracle warm-up data it imitates."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from examples.tau2.cpu.tiny_model import (
    TOKENIZER_FILES,
    TinyModelRecipe,
    build_random_model,
    ensure_tiny_model,
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


def test_oracle_turns_render_as_tool_calls_the_model_can_learn():
    examples = record_oracle_turns("mock", ["create_task_1"])
    assert len(examples) == 2  # the tool call, then the closing statement
    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    prompt, target = render_example(tok, examples[0])
    text = tok.decode(target)
    assert text.endswith("<|im_end|>") and "<tool_call>" in text and '"create_task"' in text
    assert examples[0].tools and any(t["function"]["name"] == "create_task" for t in examples[0].tools)
    # the `user-scenario` user opened with the task's instructions, not with its persona
    opening = [m["content"] for m in examples[0].messages if m["role"] == "user"][0]
    assert opening.startswith("You are a team member who needs to create a task")
    assert opening.endswith("Create a new task called 'Important Meeting' for user_1.")
    assert "Persona" not in opening
    # the prompt is what AReaL's proxy renders for the same request
    rendered = tok.apply_chat_template(examples[0].messages, tools=examples[0].tools,
                                       add_generation_prompt=True, tokenize=False)
    assert tok.decode(prompt) == rendered

    model = build_random_model(TinyModelRecipe())
    stats = warm_up(model, tok, examples, TinyModelRecipe(warmup_steps=4, warmup_lr=1e-2))
    assert stats["final_loss"] < stats["first_loss"]
    assert 0 < stats["shared_prefix_tokens"] < len(prompt)
