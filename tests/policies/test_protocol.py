"""accord.policies.Policy: every implementation offers each member of the protocol with the protocol's parameters,
real tiny policies (a whole model, LoRA adapters, a one-rank data-parallel policy, a Ray proxy's driver side) are
instances of it, and ``logprobs`` recomputes the log-probs the sampler stored."""

from __future__ import annotations

import inspect

import pytest
import torch

from accord.config import AlgorithmConfig, Config, ConfigError, PolicyConfig, RolloutConfig, TrainingConfig
from accord.distributed.fsdp import FsdpPolicy
from accord.distributed.ranks import DataParallelPolicy
from accord.distributed.ray_backend import RemoteGroup, RemotePolicy
from accord.policies import Policy
from accord.policies.lora import LoraPolicy, build_lora_policies
from accord.policies.model import ModelPolicy
from accord.rollout.sample import Sample

TINY = {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}
IMPLEMENTATIONS = [ModelPolicy, LoraPolicy, DataParallelPolicy, FsdpPolicy, RemotePolicy, RemoteGroup]


def protocol_methods() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(getattr(Policy, name)) for name in dir(Policy)
            if not name.startswith("_") and callable(getattr(Policy, name))}


def shape(sig: inspect.Signature) -> list[tuple]:
    """Parameter names, kinds and defaults (annotations are documentation, not checked)."""
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def test_the_protocol_lists_the_interface():
    assert set(protocol_methods()) == {"encode_chat", "decode", "seed_stream", "generate", "logprobs", "kl_rewards",
                                       "update", "run", "save", "load", "export"}


@pytest.mark.parametrize("cls", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_every_implementation_has_each_method_with_the_protocols_parameters(cls):
    for name, sig in protocol_methods().items():
        impl = getattr(cls, name, None)
        assert callable(impl), f"{cls.__name__} has no {name}"
        assert shape(inspect.signature(impl)) == shape(sig), f"{cls.__name__}.{name}{inspect.signature(impl)} != {sig}"


def test_a_missing_member_is_noticed():
    class Partial:
        name, cfg, tokenizer, context_len, device = "p", None, None, None, torch.device("cpu")

        def decode(self, ids):
            return ""

    assert not isinstance(Partial(), Policy)


def samples_of(pol, prompts, gens) -> list[Sample]:
    return [Sample(agent="a", policy=pol.name, turn=0, group=i, instance=i, prompt_ids=p, completion_ids=list(g.ids),
                   logprobs=list(g.logprobs), finish_reason=g.finish_reason) for i, (p, g) in enumerate(zip(prompts, gens))]


def assert_recomputes_the_sampling_logprobs(pol):
    prompts = [pol.encode_chat([{"role": "user", "content": f"count to {n}"}]) for n in range(4)]
    gens = pol.generate(prompts, greedy=False, temperature=1.0)
    samples = samples_of(pol, prompts, gens)
    got = pol.logprobs(samples)
    assert [len(x) for x in got] == [len(s.completion_ids) for s in samples]
    for mine, s in zip(got, samples):
        assert torch.allclose(torch.tensor(mine), torch.tensor(s.logprobs), atol=2e-4), (mine, s.logprobs)
    # a changed completion token changes its log-prob (the method reads the samples, not the stored values)
    s = samples[0]
    changed = Sample(**{**s.__dict__, "completion_ids": [(s.completion_ids[0] + 1) % 200] + s.completion_ids[1:]})
    assert pol.logprobs([changed])[0][0] != pytest.approx(got[0][0], abs=1e-6)


def rollout():
    return RolloutConfig(max_new_tokens=8, temperature=1.0)


def test_a_whole_model_policy_is_a_policy_and_scores_what_it_sampled():
    pol = ModelPolicy("p", PolicyConfig(**TINY), TrainingConfig(bf16=False), AlgorithmConfig(), rollout(),
                      total_optimizer_steps=1, seed=3)
    assert isinstance(pol, Policy)
    assert_recomputes_the_sampling_logprobs(pol)


def test_lora_adapters_are_policies_and_score_what_they_sampled():
    cfg = Config(specialization="lora", rollout=rollout(), policies={n: PolicyConfig(**TINY) for n in ("a", "b")})
    cfg.training.bf16 = False
    cfg.lora.r, cfg.lora.target_modules = 4, ["q_proj", "v_proj"]
    pols = build_lora_policies(cfg, ["a", "b"], total_optimizer_steps=1, seed=0)
    with torch.no_grad():   # adapters start as the base (B = 0): give "b" its own weights
        for p in pols["b"].named_params.values():
            p.add_(0.05 * torch.randn_like(p))
    for pol in pols.values():
        assert isinstance(pol, Policy)
        assert_recomputes_the_sampling_logprobs(pol)


def test_a_one_rank_data_parallel_policy_is_a_policy_and_scores_what_it_sampled():
    pol = DataParallelPolicy("p", PolicyConfig(**TINY), TrainingConfig(bf16=False), AlgorithmConfig(), rollout(),
                             total_optimizer_steps=1, seed=1, rank=0, world=1)
    assert isinstance(pol, Policy)
    assert_recomputes_the_sampling_logprobs(pol)


def test_the_ray_proxy_is_a_policy_on_the_driver():
    from accord.models import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(TINY["model"], model_kwargs=TINY["model_kwargs"], seed=0)
    cfg = Config(policies={"p": PolicyConfig(**TINY)})
    proxy = RemotePolicy("p", actor=None, cfg=cfg, info={"tokenizer": tok, "context_len": 512, "device": "cpu"})
    assert isinstance(proxy, Policy)
    assert proxy.device == torch.device("cpu")
    assert proxy.encode_chat([{"role": "user", "content": "hi"}])   # prompt handling runs on the driver


def test_an_importance_correction_without_stored_sampling_logprobs_is_a_config_error():
    pol = ModelPolicy("p", PolicyConfig(**TINY), TrainingConfig(bf16=False), AlgorithmConfig(tis="truncate"),
                      rollout(), total_optimizer_steps=1, seed=3)
    pol.backend.sampling_logprobs = False          # a backend that returns no sampling log-probs
    with pytest.raises(ConfigError, match="stores no sampling log-probs; set algorithm.tis=off"):
        pol.update_setup([])
