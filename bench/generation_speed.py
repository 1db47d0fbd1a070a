#!/usr/bin/env python
"""Decoding speed: accord's own loop against Hugging Face ``generate`` driving the same sampler.

    python bench/generation_speed.py                          # SmolLM2-135M, 4 prompts x K=4, 96 new tokens
    python bench/generation_speed.py --model tiny-qwen2 --prompt-repeats 3 --max-new-tokens 32
    python bench/generation_speed.py --json /tmp/gen.json

All three paths are :func:`accord.generation.generate`: the default one (accord's loop, for models
with a plain full-attention cache, whose decoding steps run as ``DecodeStep`` where it applies), the
loop with every decoding step through the model's forward ("loop, forward"), and the call with the
loop switched off, which hands decoding to ``model.generate`` with the same sampler and random
stream. The speed-up is ``generate`` against the default path. The batch is ``--prompts`` distinct
chat prompts (a filler text repeated ``--prompt-repeats`` times) each repeated ``--k`` times, as a
training step asks for. Each path runs sampled and greedy, ``--rounds`` times, in alternating order;
the best time is reported. The table also says whether the default path and ``generate`` drew the
same tokens and the largest log-prob difference between them on identical rows.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import accord.generation.hf as hf
from accord.models import load_model_and_tokenizer

FILLER = ("The committee met on Tuesday to discuss the budget for next year, and several members raised "
          "concerns about rising costs.")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="accord model spec (smollm2-135m, tiny-qwen2, a path)")
    p.add_argument("--prompts", type=int, default=4, help="distinct prompts")
    p.add_argument("--k", type=int, default=4, help="copies of each prompt (samples per prompt)")
    p.add_argument("--prompt-repeats", type=int, default=14, help="filler sentences per prompt (14: ~350 tokens)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model_and_tokenizer(args.model)
    text = " ".join([FILLER] * args.prompt_repeats)
    prompts = []
    for i in range(args.prompts):
        ids = tok.apply_chat_template([{"role": "user", "content": f"Summarise text {i}:\n{text}"}],
                                      add_generation_prompt=True)
        ids = ids if isinstance(ids, list) else ids["input_ids"]
        prompts += [ids] * args.k
    own_loop, build_step = hf.supports_own_loop, hf.DecodeStep.build
    paths = ("own loop", "loop, forward", "generate")

    def run(path: str, greedy: bool):
        if path == "generate":
            hf.supports_own_loop = lambda m: False
        elif path == "loop, forward":  # the loop with every decoding step through the model's forward
            hf.DecodeStep.build = lambda *a: None
        try:
            gen = torch.Generator().manual_seed(0)
            start = time.perf_counter()
            out = hf.generate(model, tok, prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              greedy=greedy, generator=gen)
            return time.perf_counter() - start, out
        finally:
            hf.supports_own_loop, hf.DecodeStep.build = own_loop, build_step

    results = []
    print(f"{args.model}: {len(prompts)} rows ({args.prompts} prompts x K={args.k}, {len(prompts[0])} prompt tokens), "
          f"{args.max_new_tokens} new tokens, {args.threads} threads; own loop applies: {own_loop(model)}; "
          f"direct decoding step applies: {hf.DecodeStep.build(model, 8) is not None}")
    print(f"{'mode':8} {'own loop s':>10} {'loop, forward s':>15} {'generate s':>10} {'speed-up':>8} {'tokens':>7} "
          f"{'same tokens':>11} {'max logp gap':>12}")
    for greedy in (False, True):
        best = {path: float("inf") for path in paths}
        outs = {}
        for _ in range(args.rounds):
            for path in paths:
                dt, outs[path] = run(path, greedy)
                best[path] = min(best[path], dt)
        a, b = outs["own loop"], outs["generate"]
        same = sum(x.ids == y.ids for x, y in zip(a, b))
        gap = max((abs(u - v) for x, y in zip(a, b) if x.ids == y.ids for u, v in zip(x.logprobs, y.logprobs)),
                  default=0.0)
        row = {"mode": "greedy" if greedy else "sampled", "own_loop_s": best["own loop"],
               "loop_forward_s": best["loop, forward"], "generate_s": best["generate"],
               "speedup": best["generate"] / best["own loop"], "tokens": sum(len(x.ids) for x in a),
               "identical_rows": same, "rows": len(a), "max_logprob_gap": gap}
        results.append(row)
        print(f"{row['mode']:8} {row['own_loop_s']:10.2f} {row['loop_forward_s']:15.2f} {row['generate_s']:10.2f} "
              f"{row['speedup']:7.2f}x {row['tokens']:7d} {f'{same}/{len(a)}':>11} {gap:12.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "prompt_tokens": len(prompts[0]), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
