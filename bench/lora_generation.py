#!/usr/bin/env python
"""LoRA generation: one mixed-adapter call against one call per adapter, and the bare base in one call.

    python bench/lora_generation.py [MODEL] [THREADS]      # default smollm2-135m, 1 thread

Prints, for 8, 16 and 32 prompts per adapter, the median seconds of each mode over 3 runs (see
bench/README.md).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from accord.config import Config, PolicyConfig, RolloutConfig
from accord.policies.agents import generate_by_policy
from accord.policies.lora import build_lora_policies


def bench_generation(model: str = "smollm2-135m", *, prompts_per_adapter: int = 32, adapters: int = 2,
                     max_new_tokens: int = 24, repeats: int = 5, model_kwargs: dict | None = None,
                     threads: int = 1) -> dict[str, float]:
    """Median seconds of one mixed-adapter generation of all prompts vs one call per adapter
    Adapters get random B so they differ."""
    torch.set_num_threads(threads)
    names = [f"role{i}" for i in range(adapters)]
    rollout = RolloutConfig(max_new_tokens=max_new_tokens, temperature=1.0, generation_batch_size=1024)
    cfg = Config(specialization="lora", rollout=rollout,
                 policies={n: PolicyConfig(model=model, model_kwargs=dict(model_kwargs or {})) for n in names})
    pols = build_lora_policies(cfg, names, 1, seed=0)
    with torch.no_grad():
        for p in pols.values():
            for k, t in p.named_params.items():
                if "lora_B" in k:
                    t.normal_(0, 0.02)
    chats = [[{"role": "user", "content": f"Write a short plan for puzzle number {i}: move from A to B."}]
             for i in range(prompts_per_adapter)]
    prompts = {n: [pols[n].encode_chat(c) for c in chats] for n in names}
    times: dict[str, list[float]] = {"mixed": [], "per_adapter": [], "base_one_call": []}
    group = pols[names[0]].group
    flat = [p for ps in prompts.values() for p in ps]
    for _ in range(repeats):
        for mode, spent in times.items():
            group.lora.mixed_generation = mode == "mixed"
            t = time.perf_counter()
            if mode == "base_one_call":  # reference: the same batch through the bare base, one call
                with group.model.disable_adapter():
                    pols[names[0]].generate(flat, greedy=False, temperature=1.0)
            else:
                generate_by_policy(pols, prompts, greedy=False, temperature=1.0)
            spent.append(time.perf_counter() - t)
    return {mode: statistics.median(v) for mode, v in times.items()}


def main() -> None:
    spec = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    kwargs = {"hidden_size": 64, "num_layers": 2} if spec.startswith("tiny") else None
    for per_adapter in (8, 16, 32):
        print(spec, per_adapter, bench_generation(spec, model_kwargs=kwargs, threads=threads, repeats=3,
                                                  prompts_per_adapter=per_adapter))


if __name__ == "__main__":
    main()
