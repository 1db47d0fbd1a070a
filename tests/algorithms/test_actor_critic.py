"""GAE / TD targets, the clipped value loss and advantage normalisation against slow loop references."""

import random

import pytest
import torch

from accord.algorithms.actor_critic import explained_variance, gae, next_indices, normalize_per_group, value_loss
from accord.algorithms.losses import LossTotals, policy_loss


def slow_gae(trajectories, gamma, lam):
    """Per trajectory (a list of (reward, value)), the textbook backward recursion."""
    adv, ret = [], []
    for traj in trajectories:
        a_next, out_a, out_g = 0.0, [], []
        for t in reversed(range(len(traj))):
            r, v = traj[t]
            v_next = traj[t + 1][1] if t + 1 < len(traj) else 0.0   # the episode ends: no bootstrap
            delta = r + gamma * v_next - v
            a_next = delta + gamma * lam * a_next
            out_a.append(a_next)
            out_g.append(a_next + v)
        adv.append(out_a[::-1])
        ret.append(out_g[::-1])
    return adv, ret


def flatten(trajectories, seed=0):
    """Trajectories interleaved in a random order (as a rollout of several agents and episodes writes them)."""
    items = [(k, t, r, v) for k, traj in enumerate(trajectories) for t, (r, v) in enumerate(traj)]
    random.Random(seed).shuffle(items)
    keys, order, rewards, values = zip(*items)
    return list(keys), list(order), torch.tensor(rewards), torch.tensor(values)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95), (0.99, 0.0), (0.5, 0.7), (0.0, 0.5)])
def test_gae_matches_loop_reference(gamma, lam):
    g = random.Random(3)
    # lengths 1 (one turn / single-turn), 2, 5 and 3: episodes ended early by the environment are shorter
    trajectories = [[(g.uniform(-1, 2), g.uniform(-1, 1)) for _ in range(n)] for n in (1, 2, 5, 3, 1, 4)]
    keys, order, rewards, values = flatten(trajectories)
    adv, ret = gae(rewards, values, torch.tensor(next_indices(keys, order)), gamma, lam)
    want_a, want_g = slow_gae(trajectories, gamma, lam)
    for i, (k, t) in enumerate(zip(keys, order)):
        assert adv[i].item() == pytest.approx(want_a[k][t], abs=1e-5)
        assert ret[i].item() == pytest.approx(want_g[k][t], abs=1e-5)


def test_one_turn_target_is_the_reward_and_lambda_one_is_the_return():
    rewards, values = torch.tensor([1.5, 0.0]), torch.tensor([0.25, -2.0])
    adv, ret = gae(rewards, values, torch.tensor([-1, -1]), gamma=0.9, lam=0.3)
    assert ret.tolist() == [1.5, 0.0]               # single turn (K = 1 or more): G = r
    assert adv.tolist() == [1.25, 2.0]              # A = r - V
    # lambda = 1: the discounted Monte-Carlo return from each turn, whatever the values
    keys, order = ["a"] * 3, [0, 1, 2]
    _, g = gae(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([9.0, -3.0, 5.0]),
               torch.tensor(next_indices(keys, order)), gamma=0.5, lam=1.0)
    assert g.tolist() == pytest.approx([1 + 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4, 4.0])
    # lambda = 0: TD(0), r_t + gamma V_{t+1}, and nothing after the episode's end
    _, g0 = gae(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([9.0, -3.0, 5.0]),
                torch.tensor(next_indices(keys, order)), gamma=0.5, lam=0.0)
    assert g0.tolist() == pytest.approx([1 + 0.5 * -3, 2 + 0.5 * 5, 4.0])


def test_next_indices_follow_positions_and_refuse_duplicates():
    assert next_indices(["x", "y", "x", "x"], [5, 0, 1, 9]) == [3, -1, 0, -1]
    with pytest.raises(ValueError, match="share a position"):
        next_indices(["x", "x"], [1, 1])
    with pytest.raises(ValueError, match="cycle"):
        gae(torch.zeros(2), torch.zeros(2), torch.tensor([1, 0]), 1.0, 1.0)


@pytest.mark.parametrize("clip", [None, 0.2])
def test_value_loss_matches_loop(clip):
    g = torch.Generator().manual_seed(0)
    v, old, target = torch.randn(32, generator=g), torch.randn(32, generator=g), torch.randn(32, generator=g)
    got, stats = value_loss(v, old, target, clip)
    want, clipped = [], 0
    for a, o, t in zip(v.tolist(), old.tolist(), target.tolist()):
        plain = (a - t) ** 2
        if clip is None:
            want.append(0.5 * plain)
            continue
        moved = o + min(max(a - o, -clip), clip)
        want.append(0.5 * max(plain, (moved - t) ** 2))
        clipped += (moved - t) ** 2 > plain
    assert got.tolist() == pytest.approx(want, abs=1e-6)
    assert float(stats["clipped"]) == clipped


def test_clipped_value_loss_stops_the_gradient_past_the_clip():
    old, target = torch.tensor([0.0]), torch.tensor([1.0])
    far = torch.tensor([0.5], requires_grad=True)        # moved 0.5 > clip 0.2 toward the target: clipped term wins
    value_loss(far, old, target, 0.2)[0].sum().backward()
    assert far.grad.item() == 0.0
    near = torch.tensor([0.1], requires_grad=True)
    value_loss(near, old, target, 0.2)[0].sum().backward()
    assert near.grad.item() == pytest.approx(0.1 - 1.0)


def test_actor_loss_is_the_clipped_surrogate_on_stored_logprobs():
    """The actor's loss (the shared policy loss, fed the stored sampling log-probs) against a per-token loop."""
    g = torch.Generator().manual_seed(5)
    logp, old = -torch.rand(3, 4, generator=g), -torch.rand(3, 4, generator=g)
    adv, mask = torch.tensor([1.0, -0.5, 2.0]), torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    loss, _ = policy_loss(logp, old, adv, mask, LossTotals(int(mask.sum()), 3), epsilon=0.2)
    want = 0.0
    for i in range(3):
        for t in range(4):
            if mask[i, t]:
                ratio = float(torch.exp(logp[i, t] - old[i, t]))
                want += -min(ratio * adv[i].item(), min(max(ratio, 0.8), 1.2) * adv[i].item())
    assert loss.item() == pytest.approx(want / int(mask.sum()), abs=1e-6)


def test_normalize_per_group_and_explained_variance():
    x = torch.tensor([1.0, 2.0, 3.0, 10.0, 7.0])
    z = normalize_per_group(x, torch.tensor([0, 0, 0, 1, 2]))
    assert z[:3].tolist() == pytest.approx([-1.2247, 0.0, 1.2247], abs=1e-3)
    assert z[3:].tolist() == [0.0, 0.0]             # a group of one sample (K = 1, one prompt) carries no scale
    assert explained_variance(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])) == 1.0
    assert explained_variance(torch.tensor([1.5, 1.5]), torch.tensor([1.0, 2.0])) == 0.0
    assert explained_variance(torch.zeros(2), torch.ones(2)) is None
