"""Preference learning (MADPO, MARLHF): pair selection, joint DPO and Bradley-Terry, as pure functions.

**Candidates and pairs.** Per prompt (task instance) every agent samples K candidates; the j-th samples
of all agents form joint candidate j (aligned joint actions; in a multi-turn environment, trajectory j),
scored by the team reward (or return). A preference pair is (winner w, loser l) with
``reward_w - reward_l > min_gap``: candidates with equal reward are never paired. :func:`select_pairs`
takes, per prompt, the pairs of largest reward gap (``reward_gap``), a seeded random subset (``random``)
or every pair (``all``), up to a cap.

**Joint DPO.** Each agent i contributes the margin of its own log-ratios::

    m_i = [log pi_i(y_i^w) - log ref_i(y_i^w)] - [log pi_i(y_i^l) - log ref_i(y_i^l)]

(reference-free: the ``ref`` terms are 0), where ``log pi_i(y)`` is the sum over the agent's completion
tokens (over all its turns, for a trajectory). The loss of a pair is ``-log sigmoid(beta * sum_i m_i)``:
the team is rewarded for the joint preference, and each agent's gradient flows through its own margin
only (the others' margins enter as constants). :func:`joint_dpo` returns, besides the loss, the
gradient of the mean loss with respect to each pair's joint margin, ``-beta * sigmoid(-beta * M_p) / P``:
the update weights every completion's log-prob by it (+ for winners, - for losers), which gives the
gradient of the joint loss exactly, for any split of the sequences into micro-batches and any mapping
of agents to policies.

**Bradley-Terry.** A reward model's scores ``s`` of the winner and the loser of each pair:
``-log sigmoid(s_w - s_l)``, its accuracy the share of pairs with ``s_w > s_l``.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from accord.config import PAIR_SELECTIONS


def select_pairs(rewards: list[float], mode: str, cap: int | None, min_gap: float = 0.0,
                 rng: random.Random | None = None) -> list[tuple[int, int]]:
    """(winner, loser) candidate indices of one prompt's candidates scored ``rewards``.

    Every ordered pair with ``rewards[w] - rewards[l] > min_gap`` is eligible (ties never are).
    ``reward_gap``: largest gap first (ties in the gap by index); ``random``: a shuffle by ``rng``;
    ``all``: by index. ``cap`` (None: no cap) keeps the first ``cap``."""
    if mode not in PAIR_SELECTIONS:
        raise ValueError(f"pair selection {mode!r}; choose one of {list(PAIR_SELECTIONS)}")
    n = len(rewards)
    pairs = [(rewards[w] - rewards[l], w, l) for w in range(n) for l in range(n)
             if w != l and rewards[w] - rewards[l] > min_gap]
    if mode == "reward_gap":
        pairs.sort(key=lambda p: (-p[0], p[1], p[2]))
    elif mode == "random":
        if rng is None:
            raise ValueError("pair selection 'random' needs a seeded rng")
        rng.shuffle(pairs)
    out = [(w, l) for _, w, l in pairs]
    return out if cap is None else out[:cap]


def dpo_margins(policy_w: torch.Tensor, policy_l: torch.Tensor, ref_w: torch.Tensor | None = None,
                ref_l: torch.Tensor | None = None) -> torch.Tensor:
    """Per-agent margins ``(log pi(w) - log ref(w)) - (log pi(l) - log ref(l))`` (same shapes; no
    reference: reference-free DPO)."""
    m = policy_w - policy_l
    if ref_w is not None:
        m = m - (ref_w - ref_l)
    return m


def joint_dpo(margins: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Joint DPO over a batch of pairs.

    Args:
        margins: (P, N) margin of each pair (row) and agent (column); see :func:`dpo_margins`.
        beta: the DPO temperature (> 0).
    Returns:
        (mean loss over the pairs, (P,) d loss / d joint margin of each pair, statistics: ``accuracy``
        (share of pairs whose joint margin is > 0) and ``margin`` (mean ``beta * sum_i m_i``)).
    """
    if margins.dim() != 2 or margins.size(0) == 0:
        raise ValueError(f"margins must be (pairs, agents) with at least one pair, got {tuple(margins.shape)}")
    if beta <= 0:
        raise ValueError(f"beta={beta} must be > 0")
    joint = beta * margins.double().sum(-1)
    loss = -F.logsigmoid(joint).mean()
    grad = -beta * torch.sigmoid(-joint) / joint.numel()
    stats = {"accuracy": float((joint > 0).double().mean()), "margin": float(joint.mean())}
    return loss, grad, stats


def bradley_terry(winner_scores: torch.Tensor, loser_scores: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Mean Bradley-Terry loss ``-log sigmoid(s_w - s_l)`` of paired scores, and the accuracy (share of
    pairs with ``s_w > s_l``). Finite for finite scores: ``logsigmoid`` never takes the log of 0."""
    if winner_scores.shape != loser_scores.shape or winner_scores.numel() == 0:
        raise ValueError(f"winner {tuple(winner_scores.shape)} and loser {tuple(loser_scores.shape)} scores must "
                         "be equal non-empty shapes")
    diff = winner_scores - loser_scores
    return -F.logsigmoid(diff).mean(), float((diff > 0).float().mean())
