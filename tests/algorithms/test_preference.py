"""Pair selection, joint DPO and Bradley-Terry against slow loop references."""

import math
import random

import pytest
import torch

from accord.algorithms.preference import bradley_terry, dpo_margins, joint_dpo, select_pairs
from accord.config import PAIR_SELECTIONS


def log_sigmoid(x):
    return -math.log1p(math.exp(-x)) if x > 0 else x - math.log1p(math.exp(x))


def test_pairs_by_gap_skip_ties_and_respect_the_cap():
    rewards = [0.5, 1.0, 0.5, 0.0]
    pairs = select_pairs(rewards, "reward_gap", cap=None)
    assert (0, 2) not in pairs and (2, 0) not in pairs          # equal rewards are never paired
    assert pairs[0] == (1, 3)                                   # the largest gap first
    assert sorted(pairs) == sorted((w, l) for w in range(4) for l in range(4) if rewards[w] > rewards[l])
    assert select_pairs(rewards, "reward_gap", cap=2) == pairs[:2]
    assert select_pairs(rewards, "all", cap=None) == sorted(pairs)
    assert select_pairs(rewards, "reward_gap", cap=None, min_gap=0.5) == [(1, 3)]
    assert select_pairs([0.3] * 5, "reward_gap", cap=None) == []   # a batch with no usable pair
    assert select_pairs([1.0], "all", cap=None) == []


def test_random_pairs_are_seeded():
    draw = random.Random(1)
    rewards = [draw.random() for _ in range(8)]
    a = select_pairs(rewards, "random", cap=5, rng=random.Random(7))
    assert a == select_pairs(rewards, "random", cap=5, rng=random.Random(7))
    assert len(a) == 5 and all(rewards[w] > rewards[l] for w, l in a)
    with pytest.raises(ValueError, match="seeded rng"):
        select_pairs(rewards, "random", cap=5)
    assert set(PAIR_SELECTIONS) == {"reward_gap", "random", "all"}


@pytest.mark.parametrize("reference", [True, False])
def test_joint_dpo_matches_loop_and_its_gradient_weights_are_autograd(reference):
    g = torch.Generator().manual_seed(2)
    pw, pl, rw, rl = (torch.randn(6, 3, generator=g, dtype=torch.float64) * 3 for _ in range(4))
    pw.requires_grad_(True)
    pl.requires_grad_(True)
    beta = 0.3
    margins = dpo_margins(pw, pl, rw, rl) if reference else dpo_margins(pw, pl)
    loss, grad, stats = joint_dpo(margins.detach(), beta)
    want, correct = 0.0, 0
    for p in range(6):
        m = sum((pw[p, i] - pl[p, i] - ((rw[p, i] - rl[p, i]) if reference else 0)).item() for i in range(3))
        want += -log_sigmoid(beta * m) / 6
        correct += beta * m > 0
    assert loss.item() == pytest.approx(want, rel=1e-9)
    assert stats["accuracy"] == pytest.approx(correct / 6)
    # the update weights each log-prob by d loss / d joint margin: the same gradient as differentiating the loss
    direct = -torch.nn.functional.logsigmoid(beta * margins.sum(-1)).mean()
    direct.backward()
    assert torch.allclose(pw.grad, grad[:, None].expand(6, 3), atol=1e-12)
    assert torch.allclose(pl.grad, -grad[:, None].expand(6, 3), atol=1e-12)


def test_joint_dpo_each_agents_gradient_is_through_its_own_margin():
    """With the other agents' margins held constant, agent i's gradient is the joint one (the reference detaches
    them; here the weights are shared by construction)."""
    margins = torch.tensor([[0.5, -1.0], [2.0, 0.25]], dtype=torch.float64)
    _, grad, _ = joint_dpo(margins, 1.0)
    own = margins[:, 0].clone().requires_grad_(True)
    loss = -torch.nn.functional.logsigmoid(own + margins[:, 1]).mean()
    loss.backward()
    assert torch.allclose(own.grad, grad)


def test_joint_dpo_stays_finite_on_extreme_margins_and_refuses_an_empty_batch():
    loss, grad, _ = joint_dpo(torch.tensor([[1e6, 1e6], [-1e6, -1e6]]), 1.0)
    assert math.isfinite(float(loss)) and torch.isfinite(grad).all()
    with pytest.raises(ValueError, match="at least one pair"):
        joint_dpo(torch.zeros(0, 2), 0.1)


def test_bradley_terry_matches_loop():
    g = torch.Generator().manual_seed(4)
    sw, sl = torch.randn(9, generator=g), torch.randn(9, generator=g)
    loss, accuracy = bradley_terry(sw, sl)
    assert loss.item() == pytest.approx(sum(-log_sigmoid(a - b) for a, b in zip(sw.tolist(), sl.tolist())) / 9,
                                        rel=1e-5)
    assert accuracy == pytest.approx(sum(a > b for a, b in zip(sw.tolist(), sl.tolist())) / 9)
    big, _ = bradley_terry(torch.tensor([-500.0]), torch.tensor([500.0]))
    assert big.item() == pytest.approx(1000.0)      # never log(0)
