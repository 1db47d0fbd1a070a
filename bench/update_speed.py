#!/usr/bin/env python
"""Update speed: one policy update with each distinct prompt run once, against full-sequence forwards.

    python bench/update_speed.py                     # SmolLM2-135M, 4 prompts x K=4, fp32 and bf16 autocast
    python bench/update_speed.py --precision fp32 --prompt-tokens 500
    python bench/update_speed.py --precision fp32 --prompts 16 --k 1 --shared-prefix 200   # a later turn's prompts
    python bench/update_speed.py --precision fp32 --trainable-layers 10   # also the last 10 blocks trained only

One :meth:`accord.policies.model.ModelPolicy.update` over ``--prompts`` x ``--k`` samples (random token ids:
prompts of about ``--prompt-tokens`` tokens, the first ``--shared-prefix`` of them the same in every prompt,
as instructions are; completions of 30 to 95 tokens, advantages +-1) in micro-batches of
``--micro-batch-size``, with prompt sharing on (the default), with the shared prefix not run once
(``no prefix``: only repeated prompts shared; measured when ``--shared-prefix`` is set) and off; with
``--trainable-layers N`` also the shared update of a second policy that trains only the last N blocks
(``policies.<name>.trainable_layers``; a different gradient, so only its time compares). The first three
paths compute the same loss and gradients (``tests/generation/test_generation.py``); this measures the time.
Best of ``--rounds`` updates per setting, the order rotated from round to round. bf16 is fast on CPUs with bf16
matrix units (AMX); with AVX512-BF16 alone it measured 1.6x slower than fp32 on an Intel Xeon and 2.6x faster on an
AMD EPYC Zen 5 (bench/README.md); without bf16 instructions it is emulated: measure ``--precision fp32``.
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
    p.add_argument("--prompt-tokens", type=int, default=300)
    p.add_argument("--shared-prefix", type=int, default=0, help="tokens every prompt starts with (default 0)")
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--precision", choices=("both", "fp32", "bf16"), default="both")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--trainable-layers", type=int, help="also time a policy training only its last N blocks")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    if not 0 <= args.shared_prefix < args.prompt_tokens:
        p.error(f"--shared-prefix={args.shared_prefix} must be at least 0 and below --prompt-tokens")
    head = torch.randint(100, 20000, (args.shared_prefix,), generator=g).tolist()
    prompts = [head + torch.randint(100, 20000, (args.prompt_tokens - args.shared_prefix + 10 * i,),
                                    generator=g).tolist() for i in range(args.prompts)]
    completions = [torch.randint(100, 20000, (int(torch.randint(30, 96, (1,), generator=g)),), generator=g).tolist()
                   for _ in range(args.prompts * args.k)]

    def samples() -> list[Sample]:
        out = []
        for i, c in enumerate(completions):
            s = Sample("a", "main", 0, i % args.prompts, i % args.prompts, prompts[i % args.prompts], c,
                       [-5.0] * len(c), "length")
            s.advantage = 1.0 if i % 2 else -1.0
            out.append(s)
        return out

    import accord.policies.model as policy_model
    plan = policy_model.prefix_plan
    paths = ("shared", "no prefix", "full") if args.shared_prefix else ("shared", "full")
    top = f"last {args.trainable_layers}" if args.trainable_layers else None
    paths += (top,) if top else ()
    results = []
    print(f"{args.model}: {args.prompts} prompts of ~{args.prompt_tokens} tokens ({args.shared_prefix} shared) x "
          f"K={args.k} completions of 30-95 tokens, micro-batches of {args.micro_batch_size}, {args.threads} threads")
    print(f"{'precision':9} " + " ".join(f"{p + ' s':>12}" for p in paths) + f" {'speed-up':>8}")
    for precision in (("fp32", "bf16") if args.precision == "both" else (args.precision,)):
        cfg_data = {"policies": {"main": {"model": args.model}},
                    "training": {"micro_batch_size": args.micro_batch_size, "lr": 1e-6, "bf16": precision == "bf16"}}
        cfg = config_from_dict(cfg_data)
        pol = ModelPolicy("main", cfg.policies["main"], cfg.training, cfg.algorithm, cfg.rollout,
                          total_optimizer_steps=100, seed=0)
        pol.update(samples(), 0)  # warm-up
        pol_top = None
        if top:
            cfg_top = config_from_dict({**cfg_data, "policies": {"main": {"model": args.model,
                                                                          "trainable_layers": args.trainable_layers}}})
            pol_top = ModelPolicy("main", cfg_top.policies["main"], cfg_top.training, cfg_top.algorithm,
                                  cfg_top.rollout, total_optimizer_steps=100, seed=0)
            pol_top.update(samples(), 0)
        best = dict.fromkeys(paths, float("inf"))
        for r in range(args.rounds):
            for path in paths[r % len(paths):] + paths[:r % len(paths)]:   # each path first in some round
                if path == "full":
                    pol._can_share_prompts = lambda model: False
                policy_model.prefix_plan = (lambda prompts: None) if path == "no prefix" else plan
                start = time.perf_counter()
                (pol_top if path == top else pol).update(samples(), r + 1)
                best[path] = min(best[path], time.perf_counter() - start)
                pol.__dict__.pop("_can_share_prompts", None)
                policy_model.prefix_plan = plan
        row = {"precision": precision, **{f"{p.replace(' ', '_')}_s": best[p] for p in paths},
               "speedup": best["full"] / best["shared"]}
        if args.shared_prefix:
            row["speedup_of_the_prefix"] = best["no prefix"] / best["shared"]
        if top:
            row["speedup_of_the_last_blocks"] = best["shared"] / best[top]
        results.append(row)
        print(f"{precision:9} " + " ".join(f"{best[p]:12.2f}" for p in paths) + f" {row['speedup']:7.2f}x"
              + (f" (the prefix: {row['speedup_of_the_prefix']:.2f}x)" if args.shared_prefix else "")
              + (f" ({top} blocks against all: {row['speedup_of_the_last_blocks']:.2f}x)" if top else ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
