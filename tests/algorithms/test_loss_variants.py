"""The loss variants (grpo/clip, dapo, dr_grpo, gspo, cispo), the sampler/learner importance weights, per-row
logit processing and the overlong penalty, against slow loop references written from the papers' formulas;
and the coincidences of the variants with one epoch, one mini-batch and fresh samples."""

import math

import pytest
import torch

from accord.algorithms import LOSS_SPECS, POLICY_LOSSES
from accord.algorithms.losses import LossTotals, policy_loss, process_logits, resolve_loss_agg, tis_weights
from accord.algorithms.shaping import overlong_penalty

EPS, EPS_HI, CAP = 0.2, 0.28, 10


def _batch(seed=0, b=6, t=7, spread=0.4):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    logp = (old + torch.randn(b, t, generator=g) * spread).requires_grad_(True)
    adv = torch.randn(b, generator=g)
    lengths = torch.tensor([7, 3, 5, 1, 6, 2])[:b]
    mask = torch.arange(t).unsqueeze(0) >= (t - lengths).unsqueeze(1)   # right-aligned completions
    return logp, old, adv, mask


def _tokens(mask, b):
    return [t for t in range(mask.size(1)) if mask[b, t]]


def slow_loss(name, logp, old, adv, mask, max_len=CAP):
    """The papers' objectives as loops over sequences and tokens (torch scalars, so autograd gives gradients)."""
    seqs = range(logp.size(0))
    n_tokens = int(mask.sum())

    def clipped(r, a):
        return -torch.minimum(r * a, r.clamp(1 - EPS, 1 + EPS_HI) * a)

    if name in ("grpo", "clip", "dapo"):            # 1/sum|y| sum_i sum_t
        return sum(clipped(torch.exp(logp[i, t] - old[i, t]), adv[i]) for i in seqs for t in _tokens(mask, i)) / n_tokens
    if name == "dr_grpo":                           # 1/G sum_i (1/L) sum_t
        return sum(sum(clipped(torch.exp(logp[i, t] - old[i, t]), adv[i]) for t in _tokens(mask, i)) / max_len
                   for i in seqs) / len(seqs)
    if name == "gspo":                              # 1/G sum_i clip(s_i), s_i = geometric mean of token ratios
        total = 0.0
        for i in seqs:
            toks = _tokens(mask, i)
            s = torch.exp(sum(logp[i, t] - old[i, t] for t in toks) / len(toks))
            total = total + clipped(s, adv[i])
        return total / len(seqs)
    if name == "cispo":                             # 1/sum|y| sum_i sum_t -sg(min(r, 1 + eps_high)) A log pi
        return sum(-torch.exp(logp[i, t] - old[i, t]).detach().clamp(max=1 + EPS_HI) * adv[i] * logp[i, t]
                   for i in seqs for t in _tokens(mask, i)) / n_tokens
    raise AssertionError(name)


def _grad(fn, logp):
    leaf = logp.detach().clone().requires_grad_(True)
    value = fn(leaf)
    value.backward()
    return value.detach(), leaf.grad


def _vectorised(name, old, adv, mask, agg=None, b_max=CAP):
    totals = LossTotals(num_tokens=int(mask.sum()), num_seqs=mask.size(0))
    max_lens = torch.full((mask.size(0),), float(b_max))
    return lambda lp: policy_loss(lp, old, adv, mask, totals, epsilon=EPS, epsilon_high=EPS_HI, loss=name,
                                  agg=agg, max_lens=max_lens)[0]


@pytest.mark.parametrize("name", ["grpo", "clip", "dapo", "dr_grpo", "gspo", "cispo"])
def test_loss_matches_loop_reference_value_and_gradient(name):
    logp, old, adv, mask = _batch()
    want_v, want_g = _grad(lambda lp: slow_loss(name, lp, old, adv, mask), logp)
    got_v, got_g = _grad(_vectorised(name, old, adv, mask), logp)
    assert torch.allclose(got_v, want_v, atol=1e-6), (got_v, want_v)
    assert torch.allclose(got_g, want_g, atol=1e-6)
    # the ratios are away from 1: some tokens (or sequences) are clipped, so the clip matters here
    ratio = torch.exp(logp - old)[mask]
    assert ((ratio > 1 + EPS_HI) | (ratio < 1 - EPS)).any()


@pytest.mark.parametrize("name", ["grpo", "dapo", "dr_grpo", "gspo", "cispo"])
def test_micro_batches_add_up_to_the_batch(name):
    logp, old, adv, mask = _batch(seed=1)
    totals = LossTotals(num_tokens=int(mask.sum()), num_seqs=mask.size(0))
    lens = torch.full((6,), float(CAP))
    whole = policy_loss(logp, old, adv, mask, totals, epsilon=EPS, epsilon_high=EPS_HI, loss=name, max_lens=lens)[0]
    parts = sum(policy_loss(logp[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], totals, epsilon=EPS,
                            epsilon_high=EPS_HI, loss=name, max_lens=lens[i:i + 2])[0] for i in range(0, 6, 2))
    assert torch.allclose(whole, parts, atol=1e-6)


def test_fresh_samples_make_the_variants_coincide():
    """One epoch, one mini-batch, fresh samples (old = current, detached: every ratio is 1): dapo is grpo's token
    mean, cispo has its gradient, gspo is grpo's sequence mean of token means, and dr_grpo is grpo's sequence sum
    divided by the length cap (= the token mean when every completion has the cap's length)."""
    logp, _, adv, mask = _batch(seed=2)
    old = logp.detach()
    grads = {}
    values = {}
    for key, name, agg in (("grpo_tm", "grpo", "token_mean"), ("grpo_smtm", "grpo", "seq_mean_token_mean"),
                           ("grpo_ss", "grpo", "seq_sum"), ("dapo", "dapo", None), ("cispo", "cispo", None),
                           ("gspo", "gspo", None), ("dr_grpo", "dr_grpo", None)):
        values[key], grads[key] = _grad(_vectorised(name, old, adv, mask, agg), logp)
    assert torch.allclose(values["dapo"], values["grpo_tm"]) and torch.allclose(grads["dapo"], grads["grpo_tm"])
    assert torch.allclose(grads["cispo"], grads["grpo_tm"], atol=1e-7)
    assert not torch.allclose(values["cispo"], values["grpo_tm"])       # -A log pi is not -A: values differ
    assert torch.allclose(values["gspo"], values["grpo_smtm"]) and torch.allclose(grads["gspo"], grads["grpo_smtm"])
    assert torch.allclose(grads["dr_grpo"], grads["grpo_ss"] / CAP, atol=1e-7)
    # all completions as long as the cap: dr_grpo = grpo's token mean
    full = torch.ones_like(mask)
    a = _grad(_vectorised("dr_grpo", old, adv, full, b_max=mask.size(1)), logp)
    b = _grad(_vectorised("grpo", old, adv, full, "token_mean"), logp)
    assert torch.allclose(a[0], b[0]) and torch.allclose(a[1], b[1], atol=1e-7)
    # off-policy (another old) they no longer coincide: the coincidences are the maths of ratio 1, not an accident
    logp2, old2, adv2, mask2 = _batch(seed=3)
    g_gspo = _grad(_vectorised("gspo", old2, adv2, mask2), logp2)[1]
    g_grpo = _grad(_vectorised("grpo", old2, adv2, mask2, "seq_mean_token_mean"), logp2)[1]
    g_cispo = _grad(_vectorised("cispo", old2, adv2, mask2), logp2)[1]
    g_tm = _grad(_vectorised("grpo", old2, adv2, mask2, "token_mean"), logp2)[1]
    assert not torch.allclose(g_gspo, g_grpo, atol=1e-4) and not torch.allclose(g_cispo, g_tm, atol=1e-4)


def test_loss_aggregations_and_aliases():
    assert POLICY_LOSSES["clip"] is POLICY_LOSSES["grpo"]
    assert {n: LOSS_SPECS[n].agg for n in ("grpo", "clip", "dapo", "dr_grpo", "gspo", "cispo")} == {
        "grpo": None, "clip": None, "dapo": "token_mean", "dr_grpo": "seq_sum_norm", "gspo": "seq_mean_token_mean",
        "cispo": None}
    assert resolve_loss_agg("grpo", None) == "token_mean" and resolve_loss_agg("grpo", "seq_sum") == "seq_sum"
    assert resolve_loss_agg("gspo", "seq_mean_token_mean") == "seq_mean_token_mean"
    with pytest.raises(ValueError, match="loss=dr_grpo is defined with loss_agg=seq_sum_norm.*leave loss_agg unset"):
        resolve_loss_agg("dr_grpo", "token_mean")


def slow_tis(learner, sampler, cap, mode):
    out, over = [], []
    for lv, sv in zip(learner.flatten().tolist(), sampler.flatten().tolist()):
        r = math.exp(lv - sv)
        over.append(r > cap)
        out.append(min(r, cap) if mode == "truncate" else (r if r <= cap else 0.0))
    return torch.tensor(out).view_as(learner), torch.tensor(over).view_as(learner)


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_importance_weights_match_reference_and_weight_the_gradient(mode):
    logp, _, adv, mask = _batch(seed=4)
    learner = logp.detach()
    sampler = learner + torch.randn(learner.shape, generator=torch.Generator().manual_seed(5))
    w, over = tis_weights(learner, sampler, 2.0, mode)
    want_w, want_over = slow_tis(learner, sampler, 2.0, mode)
    assert torch.allclose(w, want_w, atol=1e-6) and torch.equal(over, want_over) and over.any() and (~over).any()
    totals = LossTotals(int(mask.sum()), 6)
    _, g = _grad(lambda lp: policy_loss(lp, lp.detach(), adv, mask, totals, weights=w)[0], logp)
    _, plain = _grad(lambda lp: policy_loss(lp, lp.detach(), adv, mask, totals)[0], logp)
    assert torch.allclose(g, plain * w, atol=1e-7)   # each token's policy gradient scaled by its weight


def test_per_row_settings_give_each_row_its_own_processing_bit_for_bit():
    """Rows of different agents in one batch: each row's processed logits equal the row alone with its settings
    given as numbers (the generator and the learner both rely on it)."""
    g = torch.Generator().manual_seed(6)
    settings = [(0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.8), (0.6, 7, 0.9), (1.0, 0, 1.0), (0.9, 50, 1.0)]
    logits = torch.randn(len(settings), 4, 40, generator=g) * 3            # (rows, positions, vocab)
    keep = torch.randint(0, 40, (len(settings), 4), generator=g)
    temps, ks, ps = zip(*settings)
    rows = process_logits(logits, torch.tensor(temps), torch.tensor(ks), torch.tensor(ps), keep=keep)
    for i, (t, k, p) in enumerate(settings):
        alone = process_logits(logits[i:i + 1], t, k, p, keep=keep[i:i + 1])
        assert torch.equal(rows[i:i + 1], alone), settings[i]
    # the sampler's shape, (rows, vocab)
    flat = process_logits(logits[:, 0], torch.tensor(temps), torch.tensor(ks), torch.tensor(ps))
    for i, (t, k, p) in enumerate(settings):
        assert torch.equal(flat[i], process_logits(logits[i, 0], t, k, p))


def test_overlong_penalty_is_dapos_soft_punishment():
    cap, window = 20, 8
    # DAPO eq. 13 with L_max = cap, L_cache = window: 0 up to cap - window, then linear down to -1 at the cap
    for length in range(1, cap + 1):
        want = 0.0 if length <= cap - window else ((cap - window) - length) / window
        assert overlong_penalty(length, cap, window) == pytest.approx(want)
    assert overlong_penalty(cap, cap, window, penalty=0.5) == -0.5
    assert overlong_penalty(cap, cap, 0) == 0.0
    with pytest.raises(ValueError, match="shorter than the length cap"):
        overlong_penalty(5, 4, 4)
