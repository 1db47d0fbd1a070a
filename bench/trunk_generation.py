#!/usr/bin/env python
"""The default job's generation of one step, its two policies' calls one after the other against one call that
runs the layers they share as one batch (``accord.generation.hf.generate_together``), side by side.

    python bench/trunk_generation.py                      # the default job: SmolLM2-135M, the last 10 of 30 layers train
    python bench/trunk_generation.py --rounds 5 --json /tmp/trunk.json
    python bench/trunk_generation.py --set policies.main.trainable_layers=20

The workload is the first step's generation of ``accord train`` (no config, ``--set`` overrides applied): each of
the writing task's two agents has a policy of its own (``specialization=separate``), a copy of the model whose
``policies.main.trainable_layers`` last decoder layers train; each policy writes its agent's K samples of the
step's texts (``rollout.batch_size`` x K rows) from its own seeded stream, with the job's length cap, temperature
and nucleus. The second policy's trained weights are moved by a seeded 1 % noise, as after training, so that the
two policies' upper layers differ while the layers below stay equal, as ``trainable_layers`` keeps them.

- ``separate``: one :func:`accord.generation.generate` call per policy, one after the other (as each step ran
  before the policies decoded together);
- ``together``: one :func:`accord.generation.hf.generate_together` call: each decoding step runs the shared
  layers once for both policies' rows, then each policy's own layers and head for its rows.

Both run in this process, alternating round by round (the first round of each is a warm-up and not counted
unless ``--rounds 1``). The last lines report the best and median seconds, the ratio, and how many rows have the
same tokens and log-probs in both: all of them with oneDNN's kernels, where a row's products do not depend on the
rows beside it (a tiny model's products, too small for them, go through ``F.linear``, whose last bits do). The last
line of stdout is all results as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from generation_speed import default_job_requests, second_policy  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=4, help="calls per path after the warm-up, alternating")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides of the job")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()

    import torch

    from accord.config import load_config
    from accord.generation import generate
    from accord.generation.fast_decode import shared_trunk
    from accord.generation.hf import DecodeJob, generate_together
    from accord.models import load_model_and_tokenizer
    from accord.policies.learner import train_last_layers

    torch.set_num_threads(args.threads)
    cfg = load_config(None, [f"run.run_dir={Path.cwd() / 'runs' / 'bench-trunk'}", *args.set])
    layers = cfg.policies["main"].trainable_layers
    model_spec = cfg.policies["main"].model
    given = {o.split("=", 1)[0].strip() for o in args.set}
    job = default_job_requests(model_spec, [o for o in args.set if o.split("=", 1)[0].strip() != "policies.main.model"]
                               + [f"{key}={value}" for key, value in (("rollout.batch_size", cfg.rollout.batch_size),
                                                                      ("algorithm.num_generations",
                                                                       cfg.algorithm.num_generations))
                                  if key not in given])
    half = len(job["prompts"]) // 2   # the rollout's order: the first agent's rows, then the second's
    prompts = [job["prompts"][:half], job["prompts"][half:]]
    models, tokenizer = [], None
    for i in range(2):
        model, tokenizer = load_model_and_tokenizer(model_spec)
        if layers is not None:
            train_last_layers(model, layers)
        if i == 1 and layers is not None:
            second_policy(model, layers)
        model.eval()
        models.append(model)
    trunk = shared_trunk(models)
    if not trunk:
        sys.exit("the two policies share no frozen layers (set policies.main.trainable_layers below the model's "
                 "layer count)")
    kwargs = dict(max_new_tokens=job["max_new_tokens"], temperature=job["temperature"], top_k=job["top_k"],
                  top_p=job["top_p"])

    def separate():
        return [generate(m, tokenizer, ps, generator=torch.Generator().manual_seed(job["seed"] + i), name=str(i),
                         batch_size=len(ps), **kwargs) for i, (m, ps) in enumerate(zip(models, prompts))]

    def together():
        return generate_together([DecodeJob(m, tokenizer, ps, False, torch.Generator().manual_seed(job["seed"] + i),
                                            str(i), kwargs) for i, (m, ps) in enumerate(zip(models, prompts))], trunk)

    paths = {"separate": separate, "together": together}
    times = {name: [] for name in paths}
    outs = {}
    load = os.getloadavg()
    for r in range(args.rounds + (1 if args.rounds > 1 else 0)):
        for name in (list(paths) if r % 2 == 0 else list(paths)[::-1]):
            t = time.perf_counter()
            outs[name] = paths[name]()
            if r > 0 or args.rounds == 1:
                times[name].append(time.perf_counter() - t)
    load = (load, os.getloadavg())
    pairs = [(a, b) for pa, pb in zip(outs["separate"], outs["together"]) for a, b in zip(pa, pb)]
    rows = [(a.ids, a.logprobs) == (b.ids, b.logprobs) for a, b in pairs]
    same_tokens = sum(a.ids == b.ids for a, b in pairs)
    gap = max((abs(u - v) for a, b in pairs if a.ids == b.ids for u, v in zip(a.logprobs, b.logprobs)), default=0.0)
    tokens = sum(len(g.ids) for gens in outs["separate"] for g in gens)
    config = models[0].config
    print(f"{model_spec}: 2 policies x {half} rows ({len({tuple(q) for q in job['prompts']})} distinct prompts of "
          f"{min(map(len, job['prompts']))}-{max(map(len, job['prompts']))} tokens), up to {job['max_new_tokens']} "
          f"new tokens, temperature {job['temperature']}, top-p {job['top_p']}; the first {trunk} of "
          f"{config.num_hidden_layers} layers shared; {args.threads} threads, {args.rounds} rounds after a warm-up; "
          f"load average {load[0][0]:.1f} before, {load[1][0]:.1f} after")
    results = {}
    for name in paths:
        best = min(times[name])
        results[name] = {"best_s": best, "median_s": statistics.median(times[name]), "times_s": times[name],
                         "tokens_per_s": tokens / best}
        print(f"{name:9} best {best:6.2f} s  median {results[name]['median_s']:6.2f} s  "
              f"{results[name]['tokens_per_s']:6.1f} tokens/s")
    ratio = results["separate"]["best_s"] / results["together"]["best_s"]
    median_ratio = results["separate"]["median_s"] / results["together"]["median_s"]
    print(f"together: {ratio:.2f}x (median {median_ratio:.2f}x); rows with the same tokens and log-probs: "
          f"{sum(rows)}/{len(rows)} (the same tokens: {same_tokens}, largest log-prob gap {gap:.1e}); {tokens} tokens")
    summary = {"config": vars(args), "trunk_layers": trunk, "layers": config.num_hidden_layers, "rows": len(rows),
               "same_rows": sum(rows), "same_token_rows": same_tokens, "max_logprob_gap": gap, "tokens": tokens,
               "load": load, "results": results, "speedup": ratio, "median_speedup": median_ratio}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
