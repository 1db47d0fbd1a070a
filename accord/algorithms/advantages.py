"""Group-relative advantages: pure functions of (returns, group ids).

The group key is data: the rollout decides what a group is (MAGRPO: one tree node and one agent;
AT-GRPO: one task instance, turn and agent), and these functions only see integer group ids.

Variants of the baseline subtracted from each return ``r`` in its group ``g`` of size ``K``:

- ``mean``: ``r - mean(g)`` (GRPO);
- ``rloo``: ``r - mean(g without r)`` = ``(r - mean(g)) * K / (K - 1)`` (leave-one-out); a group of one
  sample (turn-based trees make them when an episode ends mid-turn, and grouping by prompt does) has
  no other sample to form a baseline from, and its advantage is 0, as ``mean`` gives it;
- ``max``:  ``r - max(g)`` (ReMax-like: the best sample is the baseline, every advantage <= 0);
- ``raw``:  ``r`` (REINFORCE, no baseline).

With ``normalize_std=True`` the result is the z-score ``(r - mean(g)) / (std(g) + eps)`` for every
variant: dividing by the group std after any of these baselines leaves the same ordering, and once the
group mean is removed again (as standard normalisation does) the variants are identical. accord
therefore computes the z-score directly and :func:`check_advantage_config` warns when a non-``mean``
variant is combined with normalisation, instead of pretending they differ.

``std_ddof`` chooses the group std of the z-score: 0, the population std ``sqrt(sum (r - mean)^2 / K)``
(accord's default), or 1, the sample std ``sqrt(sum (r - mean)^2 / (K - 1))`` of TRL's GRPOTrainer and
DeepSeekMath; the sample std is larger by ``sqrt(K / (K - 1))``, so its advantages are that much
smaller. A one-sample group has std 0 under both (its advantage is 0).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

VARIANTS = ("mean", "rloo", "max", "raw")


def _group_stats(returns: torch.Tensor, group_ids: torch.Tensor, std_ddof: int = 0):
    """Per-sample group mean, std (``std_ddof`` 0: population, 1: sample), max and size, vectorised with
    scatter ops."""
    uniq, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = uniq.numel()
    ones = torch.ones_like(returns)
    size = torch.zeros(n_groups, dtype=returns.dtype).index_add_(0, inv, ones)
    total = torch.zeros(n_groups, dtype=returns.dtype).index_add_(0, inv, returns)
    mean = total / size
    sq = torch.zeros(n_groups, dtype=returns.dtype).index_add_(0, inv, (returns - mean[inv]) ** 2)
    std = (sq / (size - std_ddof).clamp(min=1)).sqrt()   # a group of size <= ddof has sq = 0: std 0
    mx = torch.full((n_groups,), -float("inf"), dtype=returns.dtype).scatter_reduce_(0, inv, returns, "amax")
    return mean[inv], std[inv], mx[inv], size[inv]


def group_advantages(
    returns: torch.Tensor,
    group_ids: torch.Tensor,
    variant: str = "mean",
    normalize_std: bool = False,
    eps: float = 1e-6,
    std_ddof: int = 0,
) -> torch.Tensor:
    """Advantages for a flat batch of samples.

    Args:
        returns: (n,) float returns (or rewards) of each sample.
        group_ids: (n,) integer group id of each sample; samples of one group share a baseline.
        variant: ``mean`` | ``rloo`` | ``max`` | ``raw``.
        normalize_std: return the within-group z-score (all variants coincide; see module doc).
        std_ddof: 0 (population std) or 1 (sample std) in the z-score's denominator.
    """
    if std_ddof not in (0, 1):
        raise ValueError(f"std_ddof={std_ddof!r} must be 0 (population std) or 1 (sample std)")
    if variant not in VARIANTS:
        raise ValueError(f"unknown advantage variant {variant!r}; choose one of {list(VARIANTS)}")
    if returns.shape != group_ids.shape or returns.dim() != 1:
        raise ValueError(f"returns {tuple(returns.shape)} and group_ids {tuple(group_ids.shape)} must be equal 1-D")
    returns = returns.double()
    mean, std, mx, size = _group_stats(returns, group_ids, std_ddof)
    if normalize_std:
        return ((returns - mean) / (std + eps)).float()
    if variant == "mean":
        adv = returns - mean
    elif variant == "rloo":   # a singleton has r == mean(g): 0 * 1 / 1 = 0, its defined advantage
        adv = (returns - mean) * size / (size - 1).clamp(min=1)
    elif variant == "max":
        adv = returns - mx
    else:
        adv = returns
    return adv.float()


def check_advantage_config(variant: str, normalize_std: bool) -> None:
    """Warn when std-normalisation makes the chosen variant identical to ``mean``."""
    if normalize_std and variant != "mean":
        logger.warning(
            "algorithm.advantage=%s with normalize_std=true: the group z-score is the same for every "
            "baseline variant, so this run is identical to advantage=mean; set normalize_std=false to use %s",
            variant, variant,
        )


def cross_marginals(joint_returns: torch.Tensor) -> torch.Tensor:
    """Credit each agent's sample with the mean return of the joint actions that contain it.

    Args:
        joint_returns: tensor of shape (K,)*N: the return of every combination of the N agents' K samples.
    Returns:
        (N, K): entry [i, k] is the mean over all joint actions in which agent i played its sample k.
    """
    n = joint_returns.dim()
    out = []
    for i in range(n):
        dims = tuple(d for d in range(n) if d != i)
        out.append(joint_returns.mean(dim=dims) if dims else joint_returns)
    return torch.stack(out)
