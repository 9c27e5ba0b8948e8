"""What one recover save costs in AReaL's RPC, with the tokenizer in its `SaveLoadMeta` (AReaL's handler) and
without it (`lifecycle/recover.py`: a DCP checkpoint does not use it). The controller serializes the call's
arguments and every worker rebuilds them, each step.

    python bench/bench_recover_payload.py [--pairs 9]   (Markdown)

Each pair runs both, in turn, in this process: AReaL's `serialize_value` and `orjson` (the controller's side,
`infra/scheduler/local.py`), then `deserialize_value` (the worker's side), on the smoke run's tiny policy's
tokenizer (the real Qwen3 one).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def round_trip(tokenizer: object | None) -> tuple[float, int]:
    """(CPU seconds, payload bytes) of one recover save's arguments, sent and rebuilt."""
    import orjson
    from areal.api.io_struct import SaveLoadMeta
    from areal.infra.rpc.serialization import deserialize_value, serialize_value

    meta = SaveLoadMeta(path="/ckpt", weight_format="dcp", with_optim=True, tokenizer=tokenizer)
    start = time.process_time()
    body = orjson.dumps(serialize_value([meta]))
    deserialize_value(orjson.loads(body))
    return time.process_time() - start, len(body)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=9)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from examples.tau2.cpu.smoke_config import load_smoke_config
    from examples.tau2.cpu.tiny_model import TinyModelRecipe, ensure_tiny_model

    model = ensure_tiny_model(TinyModelRecipe.from_dict(load_smoke_config([])[0].smoke.tiny_model))
    tokenizer = AutoTokenizer.from_pretrained(model)
    runs: dict[str, list[tuple[float, int]]] = {"with the tokenizer": [], "without": []}
    for _ in range(args.pairs):
        runs["with the tokenizer"].append(round_trip(tokenizer))
        runs["without"].append(round_trip(None))
    print("| recover save's arguments | CPU s (median, min-max) | bytes |\n|---|---|---|")
    for name, rows in runs.items():
        cpu = [c for c, _ in rows]
        print(f"| {name} | {statistics.median(cpu):.4f} ({min(cpu):.4f}-{max(cpu):.4f}) | {rows[0][1]:,} |")


if __name__ == "__main__":
    main()
