"""Group-relative advantages: pure functions of (returns, group ids).

The group key is data: the rollout decides what a group is (MAGRPO: one tree node and one agent;
AT-GRPO: one task instance, turn and agent), and these functions only see integer group ids.

Estimators live in a registry (:data:`ADVANTAGE_ESTIMATORS`): ``algorithm.advantage`` names one, and
:func:`register_advantage` adds one without editing accord (in a module listed under ``imports:``)::

    from accord.algorithms import register_advantage

    @register_advantage("median")
    def median_baseline(returns, stats):   # stats: per-sample group mean, std, max, size, group index
        ...                                # -> per-sample advantages, a tensor like ``returns``

The built-in variants of the baseline subtracted from each return ``r`` in its group ``g`` of size ``K``:

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
from collections.abc import Callable
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)


class ExtensionError(ValueError):
    """A function registered with :func:`register_advantage` or :func:`accord.algorithms.register_loss` returned
    something unusable; the message names the function and what it must return."""



@dataclass(frozen=True)
class GroupStats:
    """Per-sample statistics of each sample's group (float64 tensors of the batch's shape; ``index`` is
    the group's position among the batch's distinct group ids)."""

    mean: torch.Tensor
    std: torch.Tensor
    max: torch.Tensor
    size: torch.Tensor
    index: torch.Tensor


AdvantageFn = Callable[[torch.Tensor, GroupStats], torch.Tensor]
#: name -> estimator: a pure function of (returns, group statistics) giving per-sample advantages.
ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register an advantage estimator under ``name`` (``algorithm.advantage: name``)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"advantage estimator name {name!r} must be an identifier")

    def deco(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGE_ESTIMATORS and ADVANTAGE_ESTIMATORS[name] is not fn:
            raise ValueError(f"an advantage estimator named {name!r} is already registered; choose another name")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return deco


@register_advantage("mean")
def mean_baseline(returns: torch.Tensor, stats: GroupStats) -> torch.Tensor:
    """``r - mean(g)`` (GRPO)."""
    return returns - stats.mean


@register_advantage("rloo")
def leave_one_out(returns: torch.Tensor, stats: GroupStats) -> torch.Tensor:
    """``r - mean(g without r)``; a singleton has r == mean(g): 0 * 1 / 1 = 0, its defined advantage."""
    return (returns - stats.mean) * stats.size / (stats.size - 1).clamp(min=1)


@register_advantage("max")
def max_baseline(returns: torch.Tensor, stats: GroupStats) -> torch.Tensor:
    """``r - max(g)`` (ReMax-like)."""
    return returns - stats.max


@register_advantage("raw")
def no_baseline(returns: torch.Tensor, stats: GroupStats) -> torch.Tensor:
    """``r`` (REINFORCE)."""
    return returns


VARIANTS = ("mean", "rloo", "max", "raw")  # the built-in estimators


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
    return GroupStats(mean[inv], std[inv], mx[inv], size[inv], inv)


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
        variant: a registered estimator (built in: ``mean`` | ``rloo`` | ``max`` | ``raw``).
        normalize_std: return the within-group z-score (all variants coincide; see module doc).
        std_ddof: 0 (population std) or 1 (sample std) in the z-score's denominator.
    """
    if std_ddof not in (0, 1):
        raise ValueError(f"std_ddof={std_ddof!r} must be 0 (population std) or 1 (sample std)")
    if variant not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage variant {variant!r}; choose one of {sorted(ADVANTAGE_ESTIMATORS)} "
                         "or register one with accord.algorithms.register_advantage")
    if returns.shape != group_ids.shape or returns.dim() != 1:
        raise ValueError(f"returns {tuple(returns.shape)} and group_ids {tuple(group_ids.shape)} must be equal 1-D")
    returns = returns.double()
    stats = _group_stats(returns, group_ids, std_ddof)
    if normalize_std:
        return ((returns - stats.mean) / (stats.std + eps)).float()
    adv = ADVANTAGE_ESTIMATORS[variant](returns, stats)
    if not isinstance(adv, torch.Tensor) or adv.shape != returns.shape:
        raise ExtensionError(f"advantage estimator {variant!r} returned {type(adv).__name__} "
                         f"{tuple(getattr(adv, 'shape', ()))}; it must return a tensor of shape {tuple(returns.shape)}")
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
