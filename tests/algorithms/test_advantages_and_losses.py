"""Advantages and losses against slow, loop-based reference implementations."""

import itertools
import math
import statistics

import pytest
import torch

from accord.algorithms.advantages import check_advantage_config, cross_marginals, group_advantages
from accord.algorithms.losses import (LossTotals, entropy_from_logits, gather_logprobs, kl_penalty,
                                      logprobs_and_entropy, policy_loss, process_logits)


def slow_advantages(returns, groups, variant, normalize_std, eps=1e-6):
    out = []
    for r, g in zip(returns, groups):
        members = [x for x, h in zip(returns, groups) if h == g]
        mean = sum(members) / len(members)
        if normalize_std:
            std = statistics.pstdev(members)
            out.append((r - mean) / (std + eps))
        elif variant == "mean":
            out.append(r - mean)
        elif variant == "rloo":
            others = list(members)
            others.remove(r)
            out.append(r - sum(others) / len(others))
        elif variant == "max":
            out.append(r - max(members))
        else:
            out.append(r)
    return out


@pytest.mark.parametrize("variant", ["mean", "rloo", "max", "raw"])
@pytest.mark.parametrize("normalize_std", [False, True])
def test_advantages_match_reference(variant, normalize_std):
    g = torch.Generator().manual_seed(1)
    returns = torch.rand(24, generator=g) * 3
    groups = torch.tensor([i // 4 for i in range(24)])[torch.randperm(24, generator=g)]
    got = group_advantages(returns, groups, variant, normalize_std)
    want = slow_advantages(returns.tolist(), groups.tolist(), variant, normalize_std)
    assert torch.allclose(got, torch.tensor(want), atol=1e-5)


def test_constant_group_has_zero_advantage():
    adv = group_advantages(torch.tensor([1.0, 1.0, 1.0, 2.0, 0.0]), torch.tensor([0, 0, 0, 1, 1]), "mean", True)
    assert adv[:3].abs().max() == 0
    assert adv[3] > 0 > adv[4]


def test_normalisation_warning(caplog):
    check_advantage_config("rloo", True)
    assert "identical to advantage=mean" in caplog.text


def test_cross_marginals_match_loops():
    k, n = 3, 3
    grid = torch.rand((k,) * n, dtype=torch.float64)
    m = cross_marginals(grid)
    for i in range(n):
        for s in range(k):
            vals = [grid[c].item() for c in itertools.product(range(k), repeat=n) if c[i] == s]
            assert math.isclose(m[i, s].item(), sum(vals) / len(vals), rel_tol=1e-9)


def slow_logprobs(logits, targets, temperature, top_k, top_p):
    out = torch.zeros(targets.shape)
    for b in range(logits.size(0)):
        for t in range(logits.size(1)):
            row = (logits[b, t].double() / temperature).tolist()
            order = sorted(range(len(row)), key=lambda i: -row[i])
            keep = set(order[:top_k]) if top_k else set(order)
            if top_p < 1:
                # nucleus of the distribution left after top-k (the order the sampler applies them)
                zmax = max(row)
                probs = {i: math.exp(row[i] - zmax) for i in keep}
                z = sum(probs.values())
                mass, kept = 0.0, set()
                for i in [i for i in order if i in keep]:
                    if mass >= top_p:
                        break
                    kept.add(i)
                    mass += probs[i] / z
                keep &= kept
            z = sum(math.exp(row[i]) for i in keep)
            tok = int(targets[b, t])
            out[b, t] = row[tok] - math.log(z) if tok in keep else -math.inf
    return out


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8),
                                                     (0.6, 7, 0.9)])
def test_logprobs_match_reference(temperature, top_k, top_p):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g) * 2
    # targets drawn from inside the kept set so the reference is finite
    processed = process_logits(logits, temperature, top_k, top_p)
    targets = torch.distributions.Categorical(logits=processed).sample()
    got = gather_logprobs(processed, targets)
    want = slow_logprobs(logits, targets, temperature, top_k, top_p)
    assert torch.allclose(got, want.float(), atol=1e-5)
    # entropy over the kept tokens: every vocabulary entry's slow log-prob (-inf outside the kept set)
    every = torch.arange(11).expand(2, 5, 11)
    slow_all = torch.stack([slow_logprobs(logits, every[..., v], temperature, top_k, top_p) for v in range(11)], -1)
    want_ent = -torch.where(slow_all > -math.inf, slow_all.exp() * slow_all, 0.0).sum(-1)
    assert torch.allclose(entropy_from_logits(processed), want_ent, atol=1e-5)
    truncated = top_k > 0 or top_p < 1.0
    logp, ent = logprobs_and_entropy(processed, targets, truncated=truncated)
    assert torch.allclose(logp, want.float(), atol=1e-5) and torch.allclose(ent, want_ent, atol=1e-5)
    assert logprobs_and_entropy(processed, targets, want_entropy=False)[1] is None


def sorted_top_p_drop(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Top-p by sorting the whole vocabulary: drop a token when the mass ranked strictly above it reaches p."""
    ordered, idx = torch.sort(logits, dim=-1, descending=True)
    probs = ordered.softmax(-1)
    drop_sorted = ((probs.cumsum(-1) - probs) >= p) & (p < 1.0)
    return torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)


def test_top_p_search_drops_what_a_full_sort_drops():
    """The top-p search ranks the largest 64 logits first and widens only for rows whose nucleus is larger: the
    kept tokens are a full sort's on peaked rows, flat rows (a nucleus of thousands), rows with -inf entries
    (EOS blocked, top-k) and per-row p, 1.0 (no truncation) included."""
    from accord.algorithms import losses

    g = torch.Generator().manual_seed(0)
    vocab = 8000
    peaked = torch.randn(6, vocab, generator=g) * 4
    flat = torch.randn(6, vocab, generator=g) * 0.05          # the nucleus spans most of the vocabulary
    blocked = torch.randn(4, vocab, generator=g) * 2
    blocked[:, ::3] = float("-inf")
    logits = torch.cat([peaked, flat, blocked])
    p = torch.tensor([0.5, 0.9, 0.99, 1.0, 0.1, 0.95] * 2 + [0.9, 0.7, 1.0, 0.3])[:, None]
    want = sorted_top_p_drop(logits, p)
    got = losses._top_p_drop(logits, p)
    assert torch.equal(got, want)
    kept = (~got).sum(-1)
    assert kept[3] == vocab and kept[6:12].max() > 512   # rows that needed the widened search, and a p of 1.0
    # one number for every row, and logits with a position axis
    assert torch.equal(losses._top_p_drop(logits, 0.9), sorted_top_p_drop(logits, torch.tensor(0.9)))
    three = logits.view(2, 8, vocab)
    assert torch.equal(losses._top_p_drop(three, p.view(2, 8, 1)), want.view(2, 8, vocab))


def test_top_p_keeps_every_token_tied_with_its_boundary_whatever_the_rows_beside_it():
    """Tokens of exactly equal logits across the nucleus' boundary (identical head rows: untrained or padded
    vocabulary entries) are all kept, as top-k keeps its ties: which of them topk ranked first depended on how
    many it ranked, that is on the other rows of the batch, so a row's token and the learner's log-prob of it
    changed with the rows beside it."""
    from accord.algorithms import losses

    g = torch.Generator().manual_seed(3)
    vocab = 3000
    row = torch.randn(vocab, generator=g) - 4.0
    row[100:243] = 1.0                                   # 143 tied logits above the rest
    flat = torch.randn(vocab, generator=g) * 0.01        # a row whose nucleus makes the search rank thousands
    for p in (0.6, 0.7, 0.8):
        alone = losses._top_p_drop(row[None], p)[0]
        beside = losses._top_p_drop(torch.stack([row, flat]), p)[0]
        assert torch.equal(alone, beside)
        assert not bool(alone[100:243].any()) and bool(alone[row < 1.0].all())   # every tie kept, nothing else
        got, _ = losses.sampling_logits(torch.stack([row, flat]), 1.0, 0, p)
        assert torch.equal(got[0].isinf(), alone)
    # a boundary inside a tie among the 64 first ranked: the same
    row2 = torch.randn(vocab, generator=g) - 4.0
    row2[:3] = 5.0
    row2[3:40] = 2.0
    for p in (0.6, 0.75):
        alone = losses._top_p_drop(row2[None], p)[0]
        assert torch.equal(alone, losses._top_p_drop(torch.stack([row2, flat]), p)[0])
        assert not bool(alone[:40].any())


def test_top_p_search_ranks_flat_rows_whole_in_two_rounds_and_peaked_rows_in_one(monkeypatch):
    """The widening search skips the rounds that a row's ranked mass shows to be too few: an untrained model's flat
    rows take two ``topk`` calls (64, then every token), not three (64, 512, every token); a row decided among the
    first 64 takes one, and the kept tokens are those of a full sort."""
    from accord.algorithms import losses

    calls = []
    topk = torch.topk
    monkeypatch.setattr(torch, "topk", lambda x, k, **kw: calls.append(k) or topk(x, k, **kw))
    g = torch.Generator().manual_seed(5)
    vocab = 3000
    flat, peaked = torch.randn(4, vocab, generator=g) * 0.1, torch.randn(4, vocab, generator=g) * 8.0
    for logits, rounds in ((flat, [64, vocab]), (peaked, [64]), (torch.cat([peaked, flat]), [64, vocab])):
        calls.clear()
        got = losses._top_p_drop(logits, 0.9)
        assert calls == rounds
        monkeypatch.setattr(torch, "topk", topk)
        assert torch.equal(got, sorted_top_p_drop(logits, torch.tensor(0.9)))
        monkeypatch.setattr(torch, "topk", lambda x, k, **kw: calls.append(k) or topk(x, k, **kw))
    # a row whose nucleus holds about 640 tokens, more than the second round's 512: two rounds, the second
    # ranking 64 + twice the 576 or so that the first round's mass shows it lacks
    middle = torch.cat([2.0 + torch.rand(1, 700, generator=g) * 0.01, torch.randn(1, 20000, generator=g) - 6.0], 1)
    calls.clear()
    got = losses._top_p_drop(middle, 0.9)
    assert len(calls) == 2 and calls[0] == 64 and 1100 < calls[1] < 1300, calls
    monkeypatch.setattr(torch, "topk", topk)
    assert torch.equal(got, sorted_top_p_drop(middle, torch.tensor(0.9)))


def test_sampling_logits_are_process_logits_and_their_support_draws_the_same_tokens():
    """The sampler's truncation: the same logits as process_logits bit for bit (temperature, per-row top-k, EOS
    blocked, per-row and single top-p), the support its kept tokens in ascending order, and the sampler's draw
    over the support the token and log-prob of the draw over the whole vocabulary (the same uniform numbers).
    No support where some row keeps the whole vocabulary, or where flat rows made the search rank most of it
    (the draw then sums over the vocabulary, the same tokens all the same)."""
    from accord.algorithms.losses import sampling_logits
    from accord.generation.hf import _Sampler

    g = torch.Generator().manual_seed(1)
    vocab = 3000
    peaked = torch.randn(8, vocab, generator=g) * torch.tensor([5.0, 3, 8, 4, 6, 5, 3, 7])[:, None]
    mixed = torch.cat([peaked[:5], torch.randn(3, vocab, generator=g) * 0.05])
    blocked, eos = torch.tensor([True, False] * 4), torch.tensor([7, 11])
    cases = [(0.7, 0, 0.9), (1.0, 0, torch.tensor([0.5, 0.9, 0.99, 0.3, 0.95, 0.9, 0.6, 0.2])),
             (torch.tensor([0.7, 1.3] * 4), torch.tensor([0, 5, 40, 0, 2, 0, 900, 0]), 0.8)]
    for logits, temperature, top_k, top_p in [(x, *case) for x in (peaked, mixed) for case in cases]:
        want = process_logits(logits, temperature, top_k, top_p, blocked=blocked, blocked_ids=eos)
        got, support = sampling_logits(logits, temperature, top_k, top_p, blocked=blocked, blocked_ids=eos)
        assert torch.equal(got, want)
        if logits is peaked:
            kept = [row.isfinite().nonzero().squeeze(1) for row in want]
            assert all(torch.equal(s[:len(k)], k) and bool((s[len(k):] == vocab).all()) for s, k in zip(support, kept))
        else:
            assert support is None
        for seed in range(20):
            sampler = _Sampler(temperature, top_k, top_p, False, "x", generator=torch.Generator().manual_seed(seed),
                               floors=blocked.long(), eos=eos.tolist())   # min_new_tokens 1 on the blocked rows
            tokens = sampler.draw(logits.clone())
            u = torch.rand((8, 1), dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
            log_probs = torch.log_softmax(want, -1)
            cdf = log_probs.exp().double().cumsum(-1)
            whole = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
            assert torch.equal(tokens, whole)
            assert torch.equal(sampler.logprobs[0], log_probs.gather(1, whole).squeeze(1))
    assert sampling_logits(peaked, 0.7, 0, torch.tensor([0.9] * 7 + [1.0]))[1] is None
    assert sampling_logits(peaked, 0.7, 0, 1.0)[1] is None


def slow_loss(logp, old, adv, mask, eps_lo, eps_hi, agg, kl_coef, ref, est):
    per_seq, tok_sum, tok_count = [], 0.0, 0
    for b in range(logp.size(0)):
        s, n = 0.0, 0
        for t in range(logp.size(1)):
            if not mask[b, t]:
                continue
            ratio = math.exp(logp[b, t] - old[b, t])
            clipped = min(max(ratio, 1 - eps_lo), 1 + eps_hi)
            v = -min(ratio * adv[b], clipped * adv[b])
            if kl_coef:
                x = float(logp[b, t] - ref[b, t])
                v += kl_coef * (x if est == "k1" else math.exp(-x) + x - 1)
            s, n = s + v, n + 1
        per_seq.append((s, n))
        tok_sum, tok_count = tok_sum + s, tok_count + n
    if agg == "token_mean":
        return tok_sum / tok_count
    if agg == "seq_mean_token_mean":
        return sum(s / n for s, n in per_seq) / len(per_seq)
    return sum(s for s, _ in per_seq) / len(per_seq)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_sum"])
@pytest.mark.parametrize("kl_coef,est", [(0.0, "k3"), (0.1, "k1"), (0.1, "k3")])
def test_loss_matches_reference_and_accumulates(agg, kl_coef, est):
    g = torch.Generator().manual_seed(3)
    b, t = 6, 7
    old = -torch.rand(b, t, generator=g) * 3
    logp = old + torch.randn(b, t, generator=g) * 0.3
    ref = old + torch.randn(b, t, generator=g) * 0.2
    adv = torch.randn(b, generator=g)
    lengths = torch.tensor([7, 3, 5, 1, 6, 2])
    mask = torch.arange(t).unsqueeze(0) >= (t - lengths).unsqueeze(1)  # right-aligned completions
    totals = LossTotals(num_tokens=int(mask.sum()), num_seqs=b)
    want = slow_loss(logp, old, adv, mask, 0.2, 0.28, agg, kl_coef, ref, est)
    full, _ = policy_loss(logp, old, adv, mask, totals, epsilon=0.2, epsilon_high=0.28, agg=agg, kl_coef=kl_coef,
                          ref_logp=ref, kl_estimator=est)
    assert math.isclose(full.item(), want, rel_tol=1e-5)
    # micro-batches with batch-wide totals add up to the full-batch loss
    parts = sum(policy_loss(logp[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], totals, epsilon=0.2,
                            epsilon_high=0.28, agg=agg, kl_coef=kl_coef, ref_logp=ref[i:i + 2],
                            kl_estimator=est)[0] for i in range(0, b, 2))
    assert math.isclose(parts.item(), want, rel_tol=1e-5)


def test_ratio_one_gradient_is_policy_gradient():
    logp = torch.randn(3, 4, requires_grad=True)
    adv = torch.tensor([1.0, -2.0, 0.5])
    mask = torch.ones(3, 4, dtype=torch.bool)
    loss, stats = policy_loss(logp, logp.detach(), adv, mask, LossTotals(12, 3))
    loss.backward()
    assert torch.allclose(logp.grad, -adv.unsqueeze(1).expand(3, 4) / 12)
    assert stats["clip_frac"].item() == 0


def test_k3_is_nonnegative():
    x = torch.linspace(-3, 3, 13)
    assert (kl_penalty(x, torch.zeros(13), "k3") >= 0).all()
