"""How AReaL 1.0.4's proxy renders a request's tools, against how OpenAI-compatible servers render them.

The proxy's `/chat/completions` takes the body as the OpenAI SDK's `CompletionCreateParams` (FastAPI
validates it with pydantic), which rebuilds each tool dict in the TypedDict's field order: `function`
before `type`. The chat template writes each tool with `tojson`, so the prompt the trainer sees differs
from the one vLLM's OpenAI server (and the Hugging Face template on the request as sent) renders: the
train/evaluation skew measured in examples/tau2/docs/learn/README.md ("Training sees the prompt evaluation
shows"). If this test fails, the skew has gone or changed: measure again and update that README.
"""

from __future__ import annotations

from areal.utils.hf_utils import apply_chat_template
from openai.types.chat.completion_create_params import CompletionCreateParams
from pydantic import TypeAdapter

MESSAGES = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Close task_1."}]
TOOLS = [{"type": "function", "function": {
    "name": "update_task_status", "description": "Update a task's status.",
    "parameters": {"type": "object", "properties": {"task_id": {"type": "string"}},
                   "required": ["task_id"]}}}]


def test_the_proxy_request_schema_renders_type_after_function(tokenizer):
    schema = TypeAdapter(CompletionCreateParams)  # alive while its lazy `tools` iterator is read
    body = schema.validate_python({"model": "m", "messages": MESSAGES, "tools": TOOLS})
    proxied = [dict(t) for t in body["tools"]]
    assert [list(t) for t in proxied] == [["function", "type"]]  # the request sent ["type", "function"]
    assert proxied == TOOLS  # the same content, another order

    as_sent = tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    as_proxied = apply_chat_template(tokenizer, MESSAGES, tools=proxied, add_generation_prompt=True,
                                     tokenize=False)
    assert '{"type": "function", "function": {"name": "update_task_status"' in as_sent
    assert '{"function": {"name": "update_task_status"' in as_proxied
    assert '"type": "function"}\n</tools>' in as_proxied
    # ... and nothing else differs: the text before and after the tool list is the same
    assert as_proxied.rsplit("<tools>\n", 1)[0] == as_sent.rsplit("<tools>\n", 1)[0]
    assert as_proxied.rsplit("</tools>", 1)[1] == as_sent.rsplit("</tools>", 1)[1]
