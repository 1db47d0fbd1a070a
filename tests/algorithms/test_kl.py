"""The KL penalty (fixes of issue 14, item 5): KL under truncated sampling, the reference's log-probs, and the
KL estimators' placement (in the loss or as a reward penalty). Group advantages: test_group_advantages.py."""

import math

import pytest
import torch

from accord.algorithms.losses import process_logits
from accord.config import AlgorithmConfig, PolicyConfig, RolloutConfig, TrainingConfig, config_from_dict
from accord.tracking import read_metrics
from accord.policies.model import ModelPolicy
from accord.rollout.sample import Sample
from accord.trainer import Trainer


def _weights(trainer):
    return {f"{p}/{k}": v.detach().clone() for p, pol in trainer.policies.items()
            for k, v in pol.model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("rollout", [{"top_p": 0.8}, {"top_k": 5}], ids=["top_p", "top_k"])
def test_kl_with_truncated_sampling_stays_finite(tiny_cfg, rollout):
    """20 steps with a KL penalty while sampling is truncated: before the fix the reference, truncated
    like the sampler, gave -inf to tokens the moved policy sampled, and the loss was infinite."""
    data = tiny_cfg(run={"steps": 20}, algorithm={"num_generations": 4, "kl_coef": 0.1, "normalize_std": True},
                    rollout={"batch_size": 4, "max_new_tokens": 8, "temperature": 1.0, **rollout},
                    training={"lr": 3e-2, "micro_batch_size": 16})
    trainer = Trainer(config_from_dict(data))
    before = _weights(trainer)
    trainer.train()
    recs = [r for r in read_metrics(trainer.run_dir) if "loss/main/pg" in r]
    assert len(recs) == 20
    for r in recs:
        assert math.isfinite(r["loss/main/pg"]) and math.isfinite(r["loss/main/kl"]), r
    assert max(r["loss/main/kl"] for r in recs) > 0   # the policy moved away from the reference
    after = _weights(trainer)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def _policy(kl_coef=0.1, **rollout):
    return ModelPolicy("p", PolicyConfig(model="tiny-qwen2", model_kwargs={"hidden_size": 64, "num_layers": 2}),
                       TrainingConfig(bf16=False), AlgorithmConfig(kl_coef=kl_coef), RolloutConfig(**rollout),
                       total_optimizer_steps=1, seed=0)


def _samples(pol, completions):
    prompt = pol.encode_chat([{"role": "user", "content": "hello"}])
    return [Sample(agent="a", policy="p", turn=0, group=0, instance=0, prompt_ids=prompt, completion_ids=c,
                   logprobs=[0.0] * len(c), finish_reason="length") for c in completions]


def test_reference_logprobs_are_untruncated_at_the_sampling_temperature():
    """The KL reference ignores top-k (every token finite) but keeps the temperature."""
    pol = _policy(temperature=0.7, top_k=3)
    plain = _policy(temperature=0.7)                     # same seed: same weights, no truncation
    # tokens 0..9 at every position: most lie outside any top-3 set
    batch = _samples(pol, [list(range(10)), list(range(10, 20))])
    ref = pol._reference_logprobs(batch)
    with torch.no_grad():
        want, _, mask = plain._forward_completion(plain.model, batch, want_entropy=False)
        truncated, _, _ = _policy(temperature=0.7, top_k=3)._forward_completion(plain.model, batch, False)
    assert torch.isfinite(ref[mask]).all()
    assert torch.allclose(ref[mask], want[mask], atol=1e-5)
    # the policy's own training log-probs do renormalise over the top-3 (sampled tokens are kept)
    assert (truncated[mask] > want[mask]).all()


def test_policy_kl_logprobs_come_from_the_same_forward_untruncated():
    pol = _policy(temperature=0.9, top_p=0.5)
    batch = _samples(pol, [list(range(6)), list(range(6, 14))])
    with torch.no_grad():
        logp, _, mask, full = pol._forward_completion(pol.model, batch, want_entropy=False, kl_too=True)
        untrunc, _, _ = pol._forward_completion(pol.model, batch, want_entropy=False, untruncated=True)
    assert torch.allclose(full[mask], untrunc[mask], atol=1e-6)
    assert (logp[mask] >= full[mask] - 1e-6).all() and (logp[mask] > full[mask]).any()


def test_process_logits_keep_spares_the_sampled_token():
    logits = torch.tensor([[[4.0, 3.0, 0.0, -1.0], [0.0, 5.0, 1.0, 1.0]]])   # (1, 2, 4)
    keep = torch.tensor([[3, 2]])
    for kw in ({"top_k": 1}, {"top_p": 0.5}):
        plain = process_logits(logits, **kw)
        spared = process_logits(logits, keep=keep, **kw)
        assert torch.isinf(plain[0, 0, 3]) and torch.isinf(plain[0, 1, 2])
        assert spared[0, 0, 3] == -1.0 and spared[0, 1, 2] == 1.0
        # nothing else changes: the top token stays, the others stay dropped
        assert spared[0, 0, 0] == 4.0 and torch.isinf(spared[0, 0, 2]) and torch.isinf(spared[0, 1, 3])


def _expected_grad(estimator, logits, ref_logits):
    """Exact on-policy expected gradient of a per-token KL loss term over a small vocabulary:
    sum_y pi(y) * d/dtheta k(log pi(y) - log ref(y)), with pi(y) as the (stop-gradient) sampling weight."""
    from accord.algorithms.losses import kl_penalty

    theta = logits.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)
    ref = torch.log_softmax(ref_logits, -1)
    per_token = kl_penalty(logp, ref, estimator)
    (logp.exp().detach() * per_token).sum().backward()
    return theta.grad


def _grad_of(fn, logits):
    theta = logits.clone().requires_grad_(True)
    fn(theta).backward()
    return theta.grad


def test_kl_estimator_gradient_directions():
    """What the docstrings claim: as a loss term k1 has zero expected gradient, k2 follows the reverse
    KL(pi || ref) and k3 the forward KL(ref || pi)."""
    torch.manual_seed(0)
    logits, ref_logits = torch.randn(7, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
    ref_logp = torch.log_softmax(ref_logits, -1)

    def reverse(theta):
        lp = torch.log_softmax(theta, -1)
        return (lp.exp() * (lp - ref_logp)).sum()

    def forward(theta):
        lp = torch.log_softmax(theta, -1)
        return (ref_logp.exp() * (ref_logp - lp)).sum()

    assert torch.allclose(_expected_grad("k1", logits, ref_logits), torch.zeros(7, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(_expected_grad("k2", logits, ref_logits), _grad_of(reverse, logits), atol=1e-12)
    assert torch.allclose(_expected_grad("k3", logits, ref_logits), _grad_of(forward, logits), atol=1e-12)
    assert not torch.allclose(_grad_of(reverse, logits), _grad_of(forward, logits), atol=1e-3)


@pytest.mark.slow
def test_k1_is_a_reward_penalty(tiny_cfg):
    """kl_estimator=k1: the summed log-ratio is subtracted from each sample's return (the update's loss has
    no KL term), with top-p sampling; every step stays finite."""
    import json

    coef = 0.5
    data = tiny_cfg(run={"steps": 4}, algorithm={"num_generations": 4, "kl_coef": coef, "kl_estimator": "k1"},
                    rollout={"batch_size": 2, "max_new_tokens": 8, "temperature": 1.0, "top_p": 0.9},
                    training={"lr": 3e-2, "micro_batch_size": 16})
    trainer = Trainer(config_from_dict(data))
    trainer.train()
    recs = [r for r in read_metrics(trainer.run_dir) if "loss/main/pg" in r]
    assert all(math.isfinite(r["loss/main/kl"]) for r in recs)
    assert recs[0]["loss/main/kl"] == pytest.approx(0.0, abs=1e-5)      # step 1: the policy is the reference
    assert recs[-1]["loss/main/kl"] != 0.0
    rows = [json.loads(line) for line in (trainer.run_dir / "completions" / "step_000004.jsonl").open()]
    assert len(rows) == 2 * 2 * 4                                       # B x agents x K samples
    assert any(abs(r["return"] - r["reward"]) > 1e-6 for r in rows)    # return = reward - coef x summed log-ratio
    # the update's loss carries no KL term: its statistics have none of their own (only the reward's)
    pol = trainer.policies["main"]
    samples = _samples(pol, [[1, 2, 3], [4, 5, 6, 7]])
    for s in samples:
        s.logprobs = [-1.0] * len(s.completion_ids)
    stats = pol.update(samples, step=99)
    assert "kl" not in stats
    kls = pol.kl_rewards(samples)
    assert [n for _, n in kls] == [3, 4] and all(math.isfinite(v) and v != 0.0 for v, _ in kls)
