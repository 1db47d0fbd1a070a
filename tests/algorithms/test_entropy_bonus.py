"""``algorithm.entropy_coef``: the entropy bonus in the policy loss (against a loop reference, finite gradients
under top-k / top-p truncation), in real tiny-model updates of a whole policy and of value heads, and its
errors."""

import math

import pytest
import torch

from accord.algorithms.losses import LossTotals, logprobs_and_entropy, policy_loss, process_logits
from accord.config import AlgorithmConfig, ConfigError, PolicyConfig, RolloutConfig, TrainingConfig, config_from_dict
from accord.policies.model import ModelPolicy
from accord.rollout.sample import Sample

TINY = {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}


def _loop_entropy(logits_row: list[float]) -> float:
    m = max(x for x in logits_row if x != -math.inf)
    z = sum(math.exp(x - m) for x in logits_row if x != -math.inf)
    ps = [math.exp(x - m) / z if x != -math.inf else 0.0 for x in logits_row]
    return -sum(p * math.log(p) for p in ps if p > 0)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_sum"])
def test_the_bonus_is_the_aggregated_entropy_subtracted(agg):
    """loss(coef) = loss(0) - coef x the entropy aggregated like the loss; the entropies match a loop over the
    distribution."""
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 7, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 7, (3, 4))
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
    logp, ent = logprobs_and_entropy(logits, targets, truncated=False, entropy_grad=True)
    assert ent.requires_grad
    for b in range(3):
        for t in range(4):
            assert ent[b, t].item() == pytest.approx(_loop_entropy(logits[b, t].tolist()), abs=1e-12)
    adv = torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64)
    totals = LossTotals(num_tokens=int(mask.sum()), num_seqs=3)
    base, _ = policy_loss(logp, logp.detach(), adv, mask, totals, agg=agg)
    with_bonus, _ = policy_loss(logp, logp.detach(), adv, mask, totals, agg=agg, entropy=ent, entropy_coef=0.3)
    fm = mask.double()
    if agg == "token_mean":
        agg_ent = (ent * fm).sum() / totals.num_tokens
    elif agg == "seq_mean_token_mean":
        agg_ent = ((ent * fm).sum(-1) / fm.sum(-1)).sum() / 3
    else:
        agg_ent = (ent * fm).sum() / 3
    assert with_bonus.item() == pytest.approx(base.item() - 0.3 * agg_ent.item(), abs=1e-12)
    # the gradient is that of the bonus: descending it raises the entropy
    (-(agg_ent)).backward(retain_graph=True)
    g = logits.grad.clone()
    logits.grad = None
    (with_bonus - base).div(0.3).backward()
    assert torch.allclose(logits.grad, g, atol=1e-12)


def test_the_bonus_needs_an_entropy_with_its_gradient():
    logp = torch.zeros(1, 2, requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="entropy_grad=True"):
        policy_loss(logp, logp.detach(), torch.ones(1), mask, LossTotals(2, 1), entropy=torch.zeros(1, 2),
                    entropy_coef=0.1)


@pytest.mark.parametrize("top_k, top_p", [(3, 1.0), (0, 0.6), (2, 0.9)])
def test_entropy_gradient_under_truncation_is_finite_and_counts_only_kept_tokens(top_k, top_p):
    """Truncated tokens (logit -inf) add 0 to the entropy and NaN nowhere, in the value or the gradient; the
    result equals the entropy of the kept tokens renormalised."""
    torch.manual_seed(1)
    raw = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    targets = raw.detach().argmax(-1)  # the top token is never truncated
    processed = process_logits(raw, 0.8, top_k, top_p, keep=targets)
    _, ent = logprobs_and_entropy(processed, targets, truncated=True, entropy_grad=True)
    assert torch.isfinite(ent).all()
    ent.sum().backward()
    assert torch.isfinite(raw.grad).all()
    for b in range(2):
        for t in range(3):
            assert ent[b, t].item() == pytest.approx(_loop_entropy(processed[b, t].tolist()), abs=1e-6)  # fp32
    dropped = torch.isinf(processed.detach())
    assert dropped.any() and (raw.grad[dropped] == 0).all()


def _samples(policy, n_prompts=2, k=4):
    out = []
    for p in range(n_prompts):
        prompt = policy.encode_chat([{"role": "user", "content": f"write something {p}"}])
        gens = policy.generate([prompt] * k, greedy=False, temperature=1.0)
        for j, g in enumerate(gens):
            out.append(Sample(agent="a", policy="p", turn=0, group=p, instance=p, prompt_ids=prompt,
                              completion_ids=g.ids, logprobs=g.logprobs, finish_reason=g.finish_reason,
                              advantage=0.0, extra={"sample": j}))
    return out


def _mean_entropy(policy, samples) -> float:
    with torch.no_grad():
        _, ent, mask = policy._forward_completion(policy.model, samples, want_entropy=True)
    return float((ent * mask).sum() / mask.sum())


@pytest.mark.parametrize("coef, rises", [(0.0, False), (1.0, True)])
def test_an_update_with_the_bonus_raises_the_policy_entropy(coef, rises):
    """Real tiny-model updates on zero advantages: with the bonus the entropy of the sampling distribution on
    the same completions rises each step; without it (and without weight decay) nothing moves."""
    policy = ModelPolicy("p", PolicyConfig(**TINY), TrainingConfig(bf16=False, lr=3e-3, weight_decay=0.0),
                         AlgorithmConfig(entropy_coef=coef), RolloutConfig(temperature=1.0, max_new_tokens=8),
                         total_optimizer_steps=4, seed=0)
    samples = _samples(policy)
    before = _mean_entropy(policy, samples)
    history = [before]
    for step in range(3):
        metrics = policy.update(samples, step)
        history.append(_mean_entropy(policy, samples))
        assert math.isfinite(metrics["entropy"])
    if rises:
        assert all(b > a for a, b in zip(history, history[1:])), history
    else:
        assert history == [before] * 4, history


def test_value_heads_train_with_the_bonus(tmp_path):
    """iac with value heads (one summed loss through the shared trunk) takes the bonus as well."""
    from accord.trainer import Trainer

    ents = {}
    for coef in (0.0, 5.0):
        cfg = config_from_dict({
            "run": {"name": "ent", "run_dir": str(tmp_path / f"coef-{coef}"), "steps": 2, "seed": 0,
                    "eval_before": False, "eval_after": False, "threads": 1},
            "policies": {"main": dict(TINY)}, "task": {"name": "letters", "eval_size": 0},
            "algorithm": {"name": "iac", "num_generations": 2, "entropy_coef": coef},
            "critic": {"mode": "head"},
            "rollout": {"batch_size": 2, "max_new_tokens": 8, "temperature": 1.0},
            "training": {"lr": 1e-3, "bf16": False},
            "logging": {"console": False, "report_to": [], "completions_every": 0}})
        trainer = Trainer(cfg)
        try:
            trainer.train_step(0)
            m, _ = trainer.train_step(1)
        finally:
            trainer.close()
        ents[coef] = [v for k, v in m.items() if k.endswith("/entropy")][0]
    assert ents[5.0] > ents[0.0], ents


def test_config_errors_name_the_key_and_the_fix():
    with pytest.raises(ConfigError, match=r"algorithm.entropy_coef=-0.1 must be >= 0"):
        AlgorithmConfig(entropy_coef=-0.1)
    with pytest.raises(ConfigError, match=r"entropy_coef=0.01 does not apply to madpo.*set entropy_coef=0"):
        cfg = config_from_dict({"run": {"name": "x", "run_dir": None},
                                "policies": {"main": dict(TINY)}, "task": {"name": "letters"},
                                "algorithm": {"name": "madpo", "num_generations": 2, "entropy_coef": 0.01}})
        from accord.config.rules import check_config
        check_config(cfg)
