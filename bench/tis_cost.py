#!/usr/bin/env python
"""Cost of the sampler/learner mismatch correction (``algorithm.tis``) per update, off against on, side by side.

    python bench/tis_cost.py                         # SmolLM2-135M, 4 prompts x K=4, fp32, ppo_epochs 1 and 2
    python bench/tis_cost.py --model tiny-qwen2 --rounds 5

One :meth:`accord.policies.model.ModelPolicy.update` over ``--prompts`` x ``--k`` samples (random token ids: prompts of
about ``--prompt-tokens`` tokens, completions of 30 to 95 tokens, advantages +-1, stored sampling log-probs a
little off the learner's so that the weights are not all 1) with ``algorithm.tis`` ``off`` and ``truncate``,
for one epoch (fresh samples: the learner's old log-probs are the current forward's, so the correction only
adds elementwise work) and for ``--epochs`` epochs (the learner's old log-probs take one extra no-grad forward
over the batch before the first optimizer step). The rest of a step (generation, rewards, advantages) does not
change with the setting, so the update's extra time is the step's. Best of ``--rounds`` updates per setting,
the settings alternating within each round, in wall time and in this process's CPU time (which other jobs
on a shared machine disturb less); the ratios on/off are printed per epoch count.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from accord.config import config_from_dict
from accord.policies.model import ModelPolicy
from accord.rollout.sample import Sample


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=100)
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--epochs", type=int, default=2, help="ppo_epochs of the non-fresh setting")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    prompts: list[list[int]] = []
    completions: list[list[int]] = []

    def make_ids(vocab: int) -> None:
        """Random prompt and completion ids below ``min(vocab, 20000)`` (the same for every setting)."""
        g = torch.Generator().manual_seed(0)
        top = min(vocab, 20000)
        prompts[:] = [torch.randint(100, top, (args.prompt_tokens + 10 * i,), generator=g).tolist()
                      for i in range(args.prompts)]
        completions[:] = [torch.randint(100, top, (int(torch.randint(30, 96, (1,), generator=g)),),
                                        generator=g).tolist() for _ in range(args.prompts * args.k)]

    def samples(stored: list[list[float]]) -> list[Sample]:
        out = []
        for i, c in enumerate(completions):
            s = Sample("a", "main", 0, i % args.prompts, i % args.prompts, prompts[i % args.prompts], c,
                       list(stored[i]), "length")
            s.advantage = 1.0 if i % 2 else -1.0
            out.append(s)
        return out

    print(f"{args.model}: {args.prompts} prompts of ~{args.prompt_tokens} tokens x K={args.k} completions of 30-95 "
          f"tokens, micro-batches of {args.micro_batch_size}, fp32, {args.threads} threads, best of {args.rounds}")
    print(f"{'ppo_epochs':>10} {'tis off s':>10} {'tis on s':>10} {'on/off':>7} {'off CPU s':>10} {'on CPU s':>10} "
          f"{'on/off CPU':>10}")
    results = []
    for epochs in (1, args.epochs):
        pols = {}
        for tis in ("off", "truncate"):
            cfg = config_from_dict({"policies": {"main": {"model": args.model}},
                                    "algorithm": {"tis": tis, "ppo_epochs": epochs},
                                    "training": {"micro_batch_size": args.micro_batch_size, "lr": 1e-6, "bf16": False}})
            pols[tis] = ModelPolicy("main", cfg.policies["main"], cfg.training, cfg.algorithm, cfg.rollout,
                                    total_optimizer_steps=100, seed=0)
        make_ids(pols["off"].model.config.vocab_size)
        # stored log-probs: the learner's own, perturbed (a sampler that differs a little)
        with torch.no_grad():
            base = samples([[0.0] * len(c) for c in completions])
            stored = pols["off"]._learner_logprobs(base)
        noise = torch.Generator().manual_seed(1)
        stored_lists = [(stored[id(s)] + 0.05 * torch.randn(stored[id(s)].shape, generator=noise)).tolist()
                        for s in base]
        for pol in pols.values():
            pol.update(samples(stored_lists), 0)   # warm-up
        best = {"off": float("inf"), "truncate": float("inf")}
        cpu = dict(best)
        stats: dict = {}
        for r in range(args.rounds):
            for tis in (("off", "truncate") if r % 2 == 0 else ("truncate", "off")):
                start, start_cpu = time.perf_counter(), time.process_time()
                out = pols[tis].update(samples(stored_lists), r + 1)
                best[tis] = min(best[tis], time.perf_counter() - start)
                cpu[tis] = min(cpu[tis], time.process_time() - start_cpu)
                stats = out if tis == "truncate" else stats
        row = {"ppo_epochs": epochs, "off_s": best["off"], "on_s": best["truncate"],
               "ratio": best["truncate"] / best["off"], "off_cpu_s": cpu["off"], "on_cpu_s": cpu["truncate"],
               "cpu_ratio": cpu["truncate"] / cpu["off"], "tis_capped": stats.get("tis_capped"),
               "tis_weight": stats.get("tis_weight")}
        results.append(row)
        print(f"{epochs:>10} {row['off_s']:10.2f} {row['on_s']:10.2f} {row['ratio']:6.2f}x {row['off_cpu_s']:10.2f} "
              f"{row['on_cpu_s']:10.2f} {row['cpu_ratio']:9.2f}x", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
