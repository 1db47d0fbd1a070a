#!/usr/bin/env python
"""Generation speed of the vLLM backend against the HF one on the same policy and prompts.

    python bench/vllm_speed.py [MODEL] [THREADS]      # default smollm2-135m, 2 threads

Needs the optional ``vllm`` package (``pip install 'accord[vllm]'``). Prints the tokens per second of
both backends, the engine's start and weight-sync times and the largest gap between vLLM's stored
log-probs and the learner's (the numbers quoted in :mod:`accord.generation.vllm_backend`).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from accord.config import AlgorithmConfig, PolicyConfig, RolloutConfig, TrainingConfig
from accord.policies.model import ModelPolicy
from accord.rollout.sample import Sample


def bench(model: str = "smollm2-135m", *, prompts: int = 32, max_new_tokens: int = 64, repeats: int = 3,
          model_kwargs: dict | None = None, threads: int = 2, llm_kwargs: dict | None = None) -> dict[str, float]:
    """Generated tokens per second of the HF backend and of vLLM on the same policy and prompts
    (``python bench/vllm_speed.py [MODEL]``), sampling at temperature 0.7 / top-p 0.9,
    medians of ``repeats`` runs after one warm-up run each; also the engine's start and weight-sync
    times and the largest gap between vLLM's stored log-probs and the learner's."""
    torch.set_num_threads(threads)
    kwargs = {"enforce_eager": True, "kv_cache_memory_bytes": 1 << 30}
    kwargs.update(llm_kwargs or {})
    out: dict[str, float] = {}
    texts = [f"Write a short plan for puzzle number {i}: move from A to B." for i in range(prompts)]
    for backend in ("hf", "vllm"):
        r = RolloutConfig(max_new_tokens=max_new_tokens, temperature=0.7, top_p=0.9, generation_batch_size=prompts,
                          generation_backend=backend, vllm_kwargs=kwargs)
        pol = ModelPolicy("main", PolicyConfig(model=model, model_kwargs=dict(model_kwargs or {})), TrainingConfig(),
                          AlgorithmConfig(), r, 1, seed=0)
        ids = [pol.encode_chat([{"role": "user", "content": t}]) for t in texts]
        t = time.perf_counter()
        pol.generate(ids[:1], greedy=False, temperature=0.7)  # vllm: builds the engine
        out[f"{backend}_first_call_s"] = time.perf_counter() - t
        rates = []
        for _ in range(repeats):
            t = time.perf_counter()
            gens = pol.generate(ids, greedy=False, temperature=0.7)
            rates.append(sum(len(g.ids) for g in gens) / (time.perf_counter() - t))
        out[f"{backend}_tokens_per_s"] = statistics.median(rates)
        if backend == "vllm":
            samples = [Sample(agent="a", policy="main", turn=0, group=0, instance=i, prompt_ids=p,
                              completion_ids=g.ids, logprobs=g.logprobs, finish_reason=g.finish_reason)
                       for i, (p, g) in enumerate(zip(ids, gens))]
            with torch.no_grad():
                logp, _, mask = pol._forward_completion(pol.model, samples[:8], want_entropy=False)
            stored = torch.zeros_like(logp)
            for i, s in enumerate(samples[:8]):
                stored[i, mask.size(1) - len(s.logprobs):] = torch.tensor(s.logprobs)
            out["vllm_max_logp_gap"] = float(((logp - stored).abs() * mask).max())
            engine = pol.backend.engine
            with torch.no_grad():
                next(pol.model.parameters()).add_(0.0)  # marks the weights as changed
            t = time.perf_counter()
            engine.sync(pol.model)
            out["vllm_weight_sync_s"] = time.perf_counter() - t
            pol.backend.close()
    out["speedup"] = out["vllm_tokens_per_s"] / out["hf_tokens_per_s"]
    return out


if __name__ == "__main__":  # pragma: no cover
    import sys

    spec = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"
    n_threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    kw = {"hidden_size": 64, "num_heads": 2, "num_layers": 2} if spec.startswith("tiny") else None
    print(spec, f"threads={n_threads}", bench(spec, model_kwargs=kw, threads=n_threads))
