"""The standalone actors' process group leaves nothing behind, and the suite's check sees it if it does."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import torch.distributed as dist

from bench.standalone_actor import DISTRIBUTED_ENV, single_process_group
from tests.conftest import distributed_state, restore_distributed_state


def child_env() -> dict[str, str]:
    """The rendezvous variables a process started now inherits."""
    out = subprocess.run([sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
                         capture_output=True, text=True, check=True).stdout
    return {k: v for k, v in json.loads(out).items() if k in DISTRIBUTED_ENV}


def test_the_group_and_its_variables_end_with_the_block(monkeypatch):
    for key in DISTRIBUTED_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.2")  # a caller's own value is kept, and restored
    before = distributed_state()
    with single_process_group():
        assert dist.is_initialized() and dist.get_world_size() == 1
        assert os.environ["RANK"] == "0" and os.environ["MASTER_ADDR"] == "127.0.0.2"
    assert not dist.is_initialized()
    assert distributed_state() == before
    assert child_env() == {"MASTER_ADDR": "127.0.0.2"}


def test_the_suites_check_sees_a_group_left_initialized(monkeypatch):
    for key in DISTRIBUTED_ENV:
        monkeypatch.delenv(key, raising=False)
    before = distributed_state()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29511", RANK="0", WORLD_SIZE="1")
    dist.init_process_group(backend="gloo", world_size=1, rank=0)  # as a test that forgot to clean up
    leaked = {key for key, value in distributed_state().items() if value != before[key]}
    assert leaked == {"torch.distributed group", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"}
    restore_distributed_state(before)
    assert not dist.is_initialized() and distributed_state() == before


def test_a_port_another_process_holds_is_not_taken(monkeypatch):
    """The port the group once derived from the pid, held by another socket: it starts on a free one."""
    for key in DISTRIBUTED_ENV:
        monkeypatch.delenv(key, raising=False)
    before = distributed_state()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 29500 + os.getpid() % 20000))
        held.listen()
        with single_process_group():
            assert dist.is_initialized() and os.environ["MASTER_PORT"] != str(held.getsockname()[1])
    assert distributed_state() == before
