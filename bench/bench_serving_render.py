"""What rendering as the serving engine does costs AReaL's proxy, side by side with its own rendering.

Policy requests of recorded airline and retail oracle episodes (`cpu.parity.record_cases`, the largest
prompts: ~5,000 tokens of policy and tool schemas) go through AReaL's real proxy app in this process
(`cpu.parity.InProcessProxy`: FastAPI validation, `ArealOpenAI`, the chat template, tokenization, a
capturing engine) with each rendering, interleaved round by round so that machine load hits all alike.
Prints the CPU time per request (median over rounds) and the ratio to AReaL's own rendering.

    .venv/bin/python bench/bench_serving_render.py [--rounds 5] [--tasks 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

from examples.tau2.compat.serving_render import ServingEngine
from examples.tau2.cpu.parity import InProcessProxy, default_tokenizer_dir, record_cases
from examples.tau2.runtime.process import setup_runtime

RENDERINGS: dict[str, ServingEngine | None] = {"areal (own)": None, "sglang": ServingEngine.SGLANG,
                                               "vllm": ServingEngine.VLLM}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=2, help="tasks per domain (airline, retail)")
    args = parser.parse_args()
    setup_runtime("ERROR")
    from transformers import AutoTokenizer

    cases = record_cases(["airline", "retail"], args.tasks)
    tokenizer = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    per_request: dict[str, list[float]] = {name: [] for name in RENDERINGS}
    tokens = 0
    for _ in range(args.rounds):
        for name, engine in RENDERINGS.items():
            with InProcessProxy(tokenizer, engine) as proxy:
                start = time.process_time()
                ids = [proxy.complete(c.messages, c.tools, c.tool_choice)[0] for c in cases]
                per_request[name].append((time.process_time() - start) / len(cases))
            tokens = sum(len(i) for i in ids)
    base = statistics.median(per_request["areal (own)"])
    print(f"{len(cases)} policy requests of airline and retail episodes, {tokens / len(cases):.0f} prompt "
          f"tokens on average, {args.rounds} interleaved rounds; CPU ms per request through the proxy app")
    print(f"{'rendering':<14} {'median':>8} {'min':>8} {'max':>8} {'vs own':>8}")
    for name, values in per_request.items():
        ms = [v * 1000 for v in values]
        print(f"{name:<14} {statistics.median(ms):>8.2f} {min(ms):>8.2f} {max(ms):>8.2f} "
              f"{statistics.median(values) / base:>7.2f}x")


if __name__ == "__main__":
    main()
