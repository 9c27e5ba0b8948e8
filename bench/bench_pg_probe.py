"""Which start can RL improve quickly? A policy-gradient probe on the tiny policy's oracle turns.

The learning run (`tau2_rl.sh learn`, examples/tau2/docs/learn/README.md) answers the question for
real; this probe answers it in ~2 min, without servers: REINFORCE on the requests of the oracle's
turns of the mock tasks, with
the learning run's advantage (reward minus the group mean, divided by the batch's standard deviation),
token-mean loss, gradient clipping at 1 and a fresh optimizer, as AReaL's PPO actor does on its first
minibatch. The reward of a sampled reply is 1 when it is the oracle's reply token for token (a strict
stand-in for tau2's success). What it prints needs no sampling: the probability of the oracle's reply
under the policy at every first turn (where the tasks' decisions are) and its mean over all turns.

    .venv/bin/python bench/bench_pg_probe.py --warmup-steps 130 --lr 1e-3            # Adam's first step
    .venv/bin/python bench/bench_pg_probe.py --warmup-steps 300 --early-stops 3 --lr 2e-4 --steps 20
With `--checkpoints DIR ...` it trains nothing and prints, per task, the probability of the oracle's first
reply under each checkpoint at `--temperature` (e.g. a learning run's start and final checkpoints);
`--all-turns` adds every later oracle turn (after a tool result: the closing replies):

    .venv/bin/python bench/bench_pg_probe.py --temperature 0.7 --checkpoints START AFTER_SEED1 ...
Results: bench/RESULTS.md ("Policy-gradient probe").
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Turn:
    task: str
    first: bool
    """The task's first policy turn (later ones follow a tool result)."""
    prompt: list[int]
    target: list[int]


def oracle_turns(tokenizer) -> list[Turn]:
    from examples.tau2.cpu.tiny_model import record_oracle_turns, render_example
    from examples.tau2.episode import domain as tau2_domain

    tasks = tau2_domain.splits("mock")["all"]
    turns, seen = [], set()
    for ex in record_oracle_turns("mock", tasks):
        prompt, target = render_example(tokenizer, ex)
        turns.append(Turn(ex.task, ex.task not in seen, prompt, target))
        seen.add(ex.task)
    return turns


def reply_logprobs(model, prompt: list[int], reply: list[int],
                   temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token logprobs of `reply` after `prompt` when sampling at `temperature`, and the policy's
    entropy at each position."""
    ids = torch.tensor([prompt + reply])
    hidden = model.model(input_ids=ids).last_hidden_state[0, len(prompt) - 1: len(prompt) + len(reply) - 1]
    logp = torch.log_softmax(model.lm_head(hidden).float() / temperature, -1)
    return logp.gather(-1, torch.tensor(reply)[:, None])[:, 0], -(logp.exp() * logp).sum(-1)


@torch.no_grad()
def oracle_reply_probs(model, turns: list[Turn], temperature: float = 1.0) -> list[float]:
    return [reply_logprobs(model, t.prompt, t.target, temperature)[0].sum().exp().item() for t in turns]


def turn_labels(turns: list[Turn]) -> list[str]:
    """`task` for a task's first turn, `task, turn N` (1-based) for its later ones."""
    labels, count = [], {}
    for t in turns:
        count[t.task] = count.get(t.task, 0) + 1
        labels.append(t.task if t.first else f"{t.task}, turn {count[t.task]}")
    return labels


def compare_checkpoints(paths: list[str], turns: list[Turn], temperature: float,
                        all_turns: bool = False) -> None:
    """A Markdown table: P(oracle's reply) per task's first turn, or per oracle turn with `all_turns`
    (rows), under each checkpoint (columns)."""
    from transformers import Qwen3ForCausalLM

    rows = [(label, t) for label, t in zip(turn_labels(turns), turns, strict=True) if all_turns or t.first]
    first = [t for _, t in rows]
    columns = [oracle_reply_probs(Qwen3ForCausalLM.from_pretrained(p).float().eval(), first, temperature)
               for p in paths]
    print(f"P(oracle's {'reply' if all_turns else 'first reply'}) at temperature {temperature}\n")
    print("| turn | " + " | ".join(f"({i}) " for i in range(1, len(paths) + 1)) + "|")
    print("|---|" + "---|" * len(paths))
    for row, (label, _) in enumerate(rows):
        print(f"| {label} | " + " | ".join(f"{c[row]:.3f}" for c in columns) + " |")
    print("| mean | " + " | ".join(f"{sum(c) / len(c):.3f}" for c in columns) + " |\n")
    for i, p in enumerate(paths, 1):
        print(f"({i}) {p}")


def report(step: int, model, turns: list[Turn], extra: str = "") -> None:
    probs = oracle_reply_probs(model, turns)
    first = [p for p, t in zip(probs, turns, strict=True) if t.first]
    print(f"step {step:3d}  P(oracle reply) first turns {sum(first) / len(first):.3f} "
          f"[{' '.join(f'{p:.2f}' for p in first)}]  all turns {sum(probs) / len(probs):.3f}{extra}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--warmup-steps", type=int, default=300)
    parser.add_argument("--early-stops", type=int, default=0, help="TinyModelRecipe.warmup_early_stops")
    parser.add_argument("--other-actions", type=int, default=0, help="TinyModelRecipe.warmup_other_actions")
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--adam-eps", type=float, default=1e-8)
    parser.add_argument("--positive-only", action="store_true",
                        help="train only on rewarded replies (REINFORCE without a baseline)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--prompts", type=int, default=4, help="turns per step")
    parser.add_argument("--group", type=int, default=8, help="sampled replies per turn")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--report-every", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--checkpoints", nargs="+", metavar="DIR",
                        help="train nothing: compare these checkpoints' P(oracle's first reply) per task")
    parser.add_argument("--all-turns", action="store_true",
                        help="with --checkpoints: every oracle turn, not only each task's first")
    args = parser.parse_args()

    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from examples.tau2.cpu.tiny_model import TinyModelRecipe, ensure_tiny_model, tokenizer_dir
    from examples.tau2.runtime.process import setup_runtime

    setup_runtime()
    torch.set_num_threads(1)
    recipe = TinyModelRecipe(warmup_steps=args.warmup_steps, warmup_early_stops=args.early_stops,
                             warmup_other_actions=args.other_actions)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
    turns = oracle_turns(tokenizer)
    if args.checkpoints:
        compare_checkpoints(args.checkpoints, turns, args.temperature, args.all_turns)
        return
    model = Qwen3ForCausalLM.from_pretrained(ensure_tiny_model(recipe)).float()
    params = list(model.parameters())
    opt = (torch.optim.AdamW(params, lr=args.lr, eps=args.adam_eps, weight_decay=0.0)
           if args.optimizer == "adam" else torch.optim.SGD(params, lr=args.lr))
    gen = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id
    print(f"{args}\n{recipe}")
    report(0, model, turns)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        rows: list[tuple[list[int], list[int], float, float]] = []
        model.eval()
        with torch.no_grad():
            for i in torch.randperm(len(turns), generator=gen)[: args.prompts].tolist():
                t = turns[i]
                out = model.generate(torch.tensor([t.prompt]).repeat(args.group, 1), do_sample=True,
                                     temperature=args.temperature, top_k=0, top_p=1.0,
                                     max_new_tokens=args.max_new_tokens, pad_token_id=pad, eos_token_id=eos)
                replies = [o[: o.index(eos) + 1] if eos in o else o for o in out[:, len(t.prompt):].tolist()]
                rewards = [float(r == t.target) for r in replies]
                mean = sum(rewards) / len(rewards)
                rows += [(t.prompt, r, w, w - mean) for r, w in zip(replies, rewards, strict=True)]
        advantages = torch.tensor([a for *_, a in rows])
        std = advantages.std().item()
        n_tokens = sum(len(r) for _, r, _, _ in rows)
        model.train()
        opt.zero_grad(set_to_none=True)
        entropies = []
        for prompt, reply, reward, adv in rows:
            weight = reward if args.positive_only else adv / (std + 1e-5)
            if weight and std > 0:
                logp, entropy = reply_logprobs(model, prompt, reply)
                (-weight * logp.sum() / n_tokens).backward()
                entropies.append(entropy.mean().item())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0)) if entropies else 0.0
        if entropies:
            opt.step()
        if step % args.report_every == 0 or step == args.steps:
            success = sum(w for _, _, w, _ in rows) / len(rows)
            report(step, model, turns,
                   f"  sampled success {success:.2f}  entropy {sum(entropies) / max(len(entropies), 1):.2f}"
                   f"  grad norm {grad_norm:.2f}  {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
