"""Actor-critic targets and losses (IAC, MAAC): pure functions of tensors, no models.

A trajectory here is one agent's own turns in one episode, in order: ``r_t`` is the team reward the
agent received from its ``t``-th action up to (not including) its next action (in a simultaneous
environment: the reward of the joint step; with ``baseline: independent``: its local reward), and
``V_t`` the critic's value of the history it acted on. The episode ends after the last turn: no
bootstrap follows it (the environment's ``done`` and the turn limit both end it).

Generalised advantage estimation (Schulman et al., 2016), per trajectory::

    delta_t = r_t + gamma * V_{t+1} - V_t          (V_T = 0: the episode has ended)
    A_t     = delta_t + gamma * lambda * A_{t+1}    (A_T = 0)
    G_t     = A_t + V_t                             (the lambda-return: the critic's target)

``lambda = 1`` gives the Monte-Carlo return ``G_t = sum_k gamma^k r_{t+k}``; ``lambda = 0`` the TD(0)
target ``r_t + gamma * V_{t+1}`` (CoMLRL 1.4.3's only choice). A single-turn task is a one-step
trajectory: ``G = r``, ``A = r - V``.

Trajectories are flattened into one batch; ``next_index[i]`` is the position of sample ``i``'s next
turn in its trajectory, or -1 after its last. :func:`gae` is vectorised over the batch and iterates
once per turn of the longest trajectory.
"""

from __future__ import annotations

import torch


def next_indices(trajectory: list, order: list) -> list[int]:
    """``next_index`` of :func:`gae` from each sample's trajectory key and its position in it
    (positions need not be contiguous, only ordered)."""
    by_key: dict = {}
    for i, (key, pos) in enumerate(zip(trajectory, order)):
        by_key.setdefault(key, []).append((pos, i))
    out = [-1] * len(trajectory)
    for members in by_key.values():
        members.sort()
        if len({p for p, _ in members}) != len(members):
            raise ValueError("two samples of one trajectory share a position; each turn of an agent is one sample")
        for (_, i), (_, j) in zip(members, members[1:]):
            out[i] = j
    return out


def gae(rewards: torch.Tensor, values: torch.Tensor, next_index: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, lambda-returns) of a flat batch of trajectory steps (see the module docstring).

    Args:
        rewards, values: (n,) float tensors: each step's reward and the critic's value of its history.
        next_index: (n,) long tensor: the position of the trajectory's next step, or -1 after the last
            (no bootstrap: the episode has ended).
        gamma, lam: discount and GAE lambda, each in [0, 1].
    """
    if not (rewards.shape == values.shape == next_index.shape) or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and next_index "
                         f"{tuple(next_index.shape)} must be equal 1-D shapes")
    if not (0 <= gamma <= 1 and 0 <= lam <= 1):
        raise ValueError(f"gamma={gamma} and lambda={lam} must be in [0, 1]")
    rewards, values = rewards.double(), values.double()
    has_next = next_index >= 0
    safe = next_index.clamp(min=0)
    next_value = torch.where(has_next, values[safe], torch.zeros_like(values))
    delta = rewards + gamma * next_value - values
    adv = delta.clone()
    # each pass carries the advantage one more step back along every trajectory: after as many passes
    # as the longest trajectory has steps, every A_t holds its whole discounted tail
    for _ in range(_longest(next_index)):
        adv = delta + gamma * lam * torch.where(has_next, adv[safe], torch.zeros_like(adv))
    return adv.float(), (adv + values).float()


def _longest(next_index: torch.Tensor) -> int:
    """Steps of the longest trajectory, following the ``next_index`` pointers (a cycle is an error)."""
    nxt = next_index.clone()
    for steps in range(1, next_index.numel() + 2):
        alive = nxt >= 0
        if not bool(alive.any()):
            return steps
        nxt = torch.where(alive, next_index[nxt.clamp(min=0)], nxt)
    raise ValueError("next_index has a cycle: a trajectory must end")


def normalize_per_group(values: torch.Tensor, groups: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Z-score of ``values`` within each group (population std); a group of one sample gets 0."""
    uniq, inv = torch.unique(groups, return_inverse=True)
    x = values.double()
    size = torch.zeros(uniq.numel(), dtype=x.dtype).index_add_(0, inv, torch.ones_like(x))
    mean = torch.zeros_like(size).index_add_(0, inv, x) / size
    var = torch.zeros_like(size).index_add_(0, inv, (x - mean[inv]) ** 2) / size
    return ((x - mean[inv]) / (var.sqrt()[inv] + eps)).float()


def value_loss(values: torch.Tensor, old_values: torch.Tensor, targets: torch.Tensor,
               clip: float | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-sample critic loss ``0.5 * (V - G)^2``; with ``clip``, PPO's pessimistic clipped form
    ``0.5 * max((V - G)^2, (V_old + clamp(V - V_old, -clip, clip) - G)^2)`` (the new value may move at
    most ``clip`` from the one the advantages were computed with before it stops earning gradient).

    Returns the (n,) losses and the count of clipped samples (``clipped``, no gradient)."""
    err = (values - targets) ** 2
    if clip is None:
        return 0.5 * err, {"clipped": torch.zeros((), dtype=values.dtype)}
    moved = old_values + (values - old_values).clamp(-clip, clip)
    err_clipped = (moved - targets) ** 2
    with torch.no_grad():
        clipped = (err_clipped > err).to(values.dtype).sum()
    return 0.5 * torch.maximum(err, err_clipped), {"clipped": clipped}


def explained_variance(predicted: torch.Tensor, targets: torch.Tensor) -> float | None:
    """``1 - Var(G - V) / Var(G)``: 1 for a perfect critic, 0 for one that predicts the mean, below 0
    for worse; None when the targets do not vary (nothing to explain: not logged)."""
    var = targets.double().var(unbiased=False)
    if var <= 0:
        return None
    return float(1.0 - (targets.double() - predicted.double()).var(unbiased=False) / var)
