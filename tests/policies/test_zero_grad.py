"""training.skip_zero_grad: a mini-batch whose gradient is exactly zero (every advantage 0, no KL or entropy term)
moves no weight, while AdamW stepped on it would carry on along its momentum; the LR schedule advances either way.
Real tiny policies (a whole model and LoRA adapters), real samples, real updates."""

from __future__ import annotations

import pytest
import torch

from accord import metric_names as mn
from accord.config import AlgorithmConfig, Config, PolicyConfig, RolloutConfig, TrainingConfig
from accord.policies.lora import build_lora_policies
from accord.policies.model import ModelPolicy
from accord.rollout.sample import Sample

TINY = {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}


def sampled(pol, advantages: list[float]) -> list[Sample]:
    prompts = [pol.encode_chat([{"role": "user", "content": f"count to {n}"}]) for n in range(len(advantages))]
    torch.manual_seed(0)
    gens = pol.generate(prompts, greedy=False, temperature=1.0)
    return [Sample(agent="a", policy=pol.name, turn=0, group=0, instance=0, prompt_ids=p,
                   completion_ids=list(g.ids), logprobs=list(g.logprobs), finish_reason=g.finish_reason,
                   advantage=a) for p, g, a in zip(prompts, gens, advantages)]


def weights(pol) -> list[torch.Tensor]:
    return [p.detach().clone() for p in pol.params]


def signal_then_none(pol) -> tuple[list[torch.Tensor], list[torch.Tensor], dict, dict]:
    """An update with a signal (AdamW's momentum is now non-zero), then one whose advantages are all 0."""
    first = pol.update(sampled(pol, [1.0, -1.0, 0.5, -0.5]), step=0)
    before = weights(pol)
    second = pol.update(sampled(pol, [0.0] * 4), step=1)
    return before, weights(pol), first, second


def model_policy(skip: bool) -> ModelPolicy:
    return ModelPolicy("p", PolicyConfig(**TINY), TrainingConfig(bf16=False, lr=1e-3, skip_zero_grad=skip),
                       AlgorithmConfig(), RolloutConfig(max_new_tokens=8, temperature=1.0),
                       total_optimizer_steps=4, seed=3)


def test_a_zero_gradient_moves_no_weight_and_the_schedule_still_advances():
    pol = model_policy(skip=True)
    before, after, first, second = signal_then_none(pol)
    assert first[mn.SKIPPED_STEPS] == 0.0 and first[mn.GRAD_NORM] > 0
    assert second[mn.SKIPPED_STEPS] == 1.0 and second[mn.GRAD_NORM] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert pol.scheduler.last_epoch == 2


def test_stepping_on_a_zero_gradient_moves_the_weights_along_the_momentum():
    """What the skip prevents: with it off, the same zero-advantage update changes the weights."""
    pol = model_policy(skip=False)
    before, after, _, second = signal_then_none(pol)
    assert second[mn.SKIPPED_STEPS] == 0.0 and second[mn.GRAD_NORM] == 0.0
    assert any(not torch.equal(a, b) for a, b in zip(before, after))


def test_an_entropy_bonus_is_a_gradient_so_the_step_is_taken():
    pol = ModelPolicy("p", PolicyConfig(**TINY), TrainingConfig(bf16=False, lr=1e-3),
                      AlgorithmConfig(entropy_coef=0.01), RolloutConfig(max_new_tokens=8, temperature=1.0),
                      total_optimizer_steps=4, seed=3)
    before, after, _, second = signal_then_none(pol)
    assert second[mn.SKIPPED_STEPS] == 0.0 and second[mn.GRAD_NORM] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("skip", [True, False])
def test_lora_adapters_skip_a_zero_gradient_too(skip):
    cfg = Config(specialization="lora", rollout=RolloutConfig(max_new_tokens=8, temperature=1.0),
                 policies={n: PolicyConfig(**TINY) for n in ("a", "b")})
    cfg.training.bf16, cfg.training.lr, cfg.training.skip_zero_grad = False, 1e-3, skip
    cfg.lora.r, cfg.lora.target_modules = 4, ["q_proj", "v_proj"]
    pol = build_lora_policies(cfg, ["a", "b"], total_optimizer_steps=4, seed=0)["a"]
    before, after, _, second = signal_then_none(pol)
    assert second[mn.SKIPPED_STEPS] == float(skip)
    assert all(torch.equal(a, b) for a, b in zip(before, after)) == skip


def test_a_skipped_first_step_raises_no_schedule_order_warning(recwarn):
    """A first update with no signal skips the optimizer's first step on purpose; torch's warning that the schedule
    advanced before the optimizer stepped is not shown for it."""
    pol = model_policy(skip=True)
    metrics = pol.update(sampled(pol, [0.0] * 4), step=0)
    assert metrics[mn.SKIPPED_STEPS] == 1.0 and pol.scheduler.last_epoch == 1
    assert not [w for w in recwarn if "lr_scheduler.step()" in str(w.message)]
