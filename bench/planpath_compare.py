#!/usr/bin/env python
"""Learning comparison on Plan-Path: AT-GRPO vs multi-turn MAGRPO vs single-agent GRPO, same token budget.

    python bench/planpath_compare.py                          # SmolLM2-135M, the defaults below
    python bench/planpath_compare.py --budget 6000 --eval-size 16 --json /tmp/planpath.json
    python bench/planpath_compare.py --model tiny-qwen2 --budget 3000   # a quick dry run

Each method starts from the same base model and trains on the smallest Plan-Path setting until the
completions it has generated for training reach ``--budget`` tokens (the step that crosses the budget
is the last). Before and after, every method is evaluated on the same held-out puzzles, greedily,
one trajectory per puzzle and no branching, in its own agent layout:

- ``atgrpo``: planner + executor on one shared model; K candidates per (puzzle, turn, agent) from one
  state, rewards ``alpha * team + local``, the best candidate advances the state;
- ``magrpo``: the same two roles, a MAGRPO tree (aligned joint actions, returns
  ``G = r + gamma * mean(children)``, team reward only);
- ``grpo``: one model does the whole task alone (the environment's single-agent variant) with the same
  turn-wise tree sampling as AT-GRPO, which isolates the effect of having two roles.

It is a benchmark, not a test: numbers depend on the budget, and on 2 CPU cores SmolLM2-135M
generates about 150 tokens per second. ``flat groups`` is the mean share of advantage groups whose
returns were all equal during training (``adv/zero_std_frac``): at 1.0 no sample had a learning signal
(every advantage, hence the policy-gradient loss, was zero). The table is printed and the last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# spinning OpenMP threads make a shared 2-core machine several times slower (measured: a SmolLM2 prefill
# went from ~1 s to 20 s under load 5); passive waiting costs nothing on an idle one
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

METHODS = {
    "atgrpo": {"algorithm": {"name": "atgrpo"}},
    "magrpo": {"algorithm": {"name": "magrpo", "joint_mode": "aligned"}},
    "grpo": {"algorithm": {"name": "atgrpo", "baseline": "single_agent"}},
}


def build_config(args: argparse.Namespace, method: str, run_dir: Path):
    from accord.config import config_from_dict

    model_kwargs = {"hidden_size": 64, "num_layers": 2} if args.model.startswith("tiny") else {}
    data = {
        "run": {"name": method, "run_dir": str(run_dir), "steps": 10_000, "seed": args.seed, "threads": args.threads,
                "eval_before": False, "eval_after": False},
        "policies": {"main": {"model": args.model, "model_kwargs": model_kwargs}},
        "task": {"name": "planpath", "options": {"size": args.size, "max_turns": args.turns},
                 "eval_size": args.eval_size},
        "algorithm": {"num_generations": args.k, "normalize_std": True, "alpha": args.alpha, "gamma": 1.0,
                      **METHODS[method]["algorithm"]},
        "rollout": {"batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                    "history_turns": args.history_turns, "max_prompt_tokens": 1024},
        "training": {"lr": args.lr, "micro_batch_size": 8, "warmup_steps": 0, "max_grad_norm": 1.0,
                     "bf16": args.bf16},
        "logging": {"console": False, "tensorboard": False, "completions_every": 0},
    }
    return config_from_dict(data)


def run_method(args: argparse.Namespace, method: str, root: Path) -> dict:
    from accord.trainer import Trainer

    cfg = build_config(args, method, root / method)
    trainer = Trainer(cfg)
    t0 = time.perf_counter()
    before = trainer.evaluate()
    tokens, steps, rewards, flat = 0, 0, [], []
    t_train = time.perf_counter()
    while tokens < args.budget:
        metrics, _ = trainer.train_step(steps)
        tokens += int(metrics["perf/gen_tokens"])
        rewards.append(metrics["team/reward"])
        flat.append(metrics["adv/zero_std_frac"])
        steps += 1
        logging.info("%s step %d: %d/%d tokens, team reward %.3f, %.1fs", method, steps, tokens, args.budget,
                     metrics["team/reward"], metrics["time/step"])
    train_s = time.perf_counter() - t_train
    after = trainer.evaluate()
    return {"method": method, "steps": steps, "train_tokens": tokens, "train_s": round(train_s, 1),
            "total_s": round(time.perf_counter() - t0, 1),
            "success_before": before["eval/success"], "success_after": after["eval/success"],
            "return_before": before["eval/team/reward"], "return_after": after["eval/team/reward"],
            "train_reward_first": rewards[0], "train_reward_last": rewards[-1],
            "flat_group_frac": round(sum(flat) / len(flat), 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--budget", type=int, default=3000, help="generated training tokens per method")
    p.add_argument("--size", type=int, default=4, help="Plan-Path grid size (the smallest setting)")
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--temperature", type=float, default=1.0, help="training sampling temperature")
    p.add_argument("--history-turns", type=int, default=0,
                   help="earlier exchanges kept in prompts (0: the observation already holds the whole state)")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--bf16", action="store_true",
                   help="training.bf16=true (autocast over fp32 weights): 2.4x faster updates on CPUs with AMX; "
                        "without it the updates run in fp32, as in the table in bench/README.md")
    p.add_argument("--eval-size", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", force=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="planpath_cmp_") as tmp:
        for method in args.methods:
            results.append(run_method(args, method, Path(tmp)))
    header = f"{'method':8s} {'steps':>5s} {'tokens':>7s} {'train s':>8s} {'success before':>15s} " \
             f"{'success after':>14s} {'return before':>14s} {'return after':>13s} {'flat groups':>11s}"
    print(header)
    for r in results:
        print(f"{r['method']:8s} {r['steps']:5d} {r['train_tokens']:7d} {r['train_s']:8.1f} "
              f"{r['success_before']:15.3f} {r['success_after']:14.3f} {r['return_before']:14.3f} "
              f"{r['return_after']:13.3f} {r['flat_group_frac']:11.3f}")
    out = {"config": vars(args) | {"json": str(args.json) if args.json else None}, "results": results}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
