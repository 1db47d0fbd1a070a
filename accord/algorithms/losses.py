"""Token log-probabilities under the sampling distribution, and the clipped policy-gradient loss.

The training log-prob of a token must be the log-prob it had when it was sampled: the same
temperature and the same top-k / top-p truncation (renormalised over the kept tokens). Both the
generator and the learner call :func:`process_logits`, so the two cannot drift apart (the learner
passes the sampled tokens as ``keep``, so rounding at the truncation boundary cannot drop one).

The KL penalty is different: the policy and the reference both use the untruncated distribution at
the sampling temperature. A reference truncated like the sampler gives log-prob -inf to every token
the moved policy samples outside the reference's own top-k / top-p set, and the loss becomes infinite.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                   keep: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 logits of the sampling distribution: divided by temperature, truncated to -inf.

    The truncation mask is computed without gradient; the kept logits keep theirs. ``keep`` (the
    logits' shape without the vocabulary axis) names one token per position that is never truncated:
    the learner passes the sampled tokens, which the sampler kept by construction, so that a
    recomputed forward whose float rounding puts a sampled token just past the top-k / top-p boundary
    cannot give it probability 0 (a -inf log-prob and a NaN loss).
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if top_k and top_k < logits.size(-1):
        with torch.no_grad():
            kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
            drop = _spare(logits < kth, keep)
        logits = logits.masked_fill(drop, float("-inf"))
    if top_p < 1.0:
        with torch.no_grad():
            sorted_logits, idx = torch.sort(logits, dim=-1, descending=True)
            probs = sorted_logits.softmax(-1)
            # drop a token when the mass strictly before it already reaches top_p (the first always stays)
            before = probs.cumsum(-1) - probs
            drop_sorted = before >= top_p
            drop = _spare(torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted), keep)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def _spare(drop: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """``drop`` with the ``keep`` token of each position cleared."""
    if keep is None:
        return drop
    return drop.scatter(-1, keep.unsqueeze(-1), False)


def gather_logprobs(processed_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax of processed logits gathered at ``targets`` (vectorised, no per-token loop)."""
    return logprobs_and_entropy(processed_logits, targets, want_entropy=False)[0]


def logprobs_and_entropy(processed_logits: torch.Tensor, targets: torch.Tensor, want_entropy: bool = True,
                         truncated: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``targets`` and, if wanted, the entropy at each position, from one log-softmax.

    The entropy has no gradient. ``truncated`` says whether top-k/top-p may have set logits to -inf
    (those tokens are skipped: their 0 * -inf would be NaN); without truncation that masking pass is
    not paid. One log-softmax serves both, and its backward is lighter than that of logsumexp + gather
    + a separate entropy pass (README, *Measured numbers*).
    """
    log_probs = torch.log_softmax(processed_logits, dim=-1)
    picked = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked, (_entropy(log_probs, truncated) if want_entropy else None)


def entropy_from_logits(processed_logits: torch.Tensor, truncated: bool = True) -> torch.Tensor:
    """Entropy of the sampling distribution at each position (no gradient); see
    :func:`logprobs_and_entropy` for ``truncated``."""
    with torch.no_grad():
        return _entropy(torch.log_softmax(processed_logits, dim=-1), truncated)


@torch.no_grad()
def _entropy(log_probs: torch.Tensor, truncated: bool) -> torch.Tensor:
    p = log_probs.exp()
    terms = p * log_probs
    if truncated:  # truncated tokens have p = 0 and log p = -inf: 0 * -inf is NaN, so skip them
        terms = torch.where(p > 0, terms, 0.0)
    return -terms.sum(-1)


@dataclass
class LossTotals:
    """Batch-wide normalisers, so micro-batches accumulate to the loss of the whole batch."""

    num_tokens: int
    num_seqs: int


# Where each KL estimator works (Schulman's k1/k2/k3 of x = log pi(y) - log ref(y), y sampled from pi).
# Every value estimates the reverse KL(pi || ref) (k1 and k3 unbiasedly, k2 with a bias of third order).
# What matters for training is the gradient of the term as it is used:
# - k1 = x as a loss term has zero expected gradient on-policy (E_pi[grad log pi] = 0): it only works
#   as a reward penalty, r - beta * sum_t x_t, whose policy gradient is that of KL(pi || ref) (reverse);
# - k2 = x^2 / 2 as a loss term: its gradient x * grad log pi is, in expectation, the gradient of the
#   reverse KL(pi || ref);
# - k3 = e^-x + x - 1 as a loss term: its gradient (1 - ref/pi) grad log pi is, in expectation, the
#   gradient of the forward KL(ref || pi) (GRPO's and TRL's choice; mass-covering).
KL_LOSS_ESTIMATORS = ("k2", "k3")
KL_REWARD_ESTIMATORS = ("k1",)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate from sampled tokens: k1 = log ratio x, k2 = x^2 / 2,
    k3 = e^-x + x - 1 (see ``KL_LOSS_ESTIMATORS`` above for the direction each one's gradient follows)."""
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio ** 2
    if estimator == "k3":
        return torch.exp(-log_ratio) + log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; choose k1, k2 or k3")


@dataclass(frozen=True)
class SurrogateInputs:
    """What a policy-loss function sees for one micro-batch: (b, T) log-probs under the current policy and
    at sampling time, (b, 1) advantages, the (b, T) completion mask and the clip ranges."""

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    epsilon: float
    epsilon_high: float


LossFn = Callable[[SurrogateInputs], "tuple[torch.Tensor, dict[str, torch.Tensor]]"]
#: name -> policy loss: (b, T) per-token loss (to be minimised) and masked per-token statistic sums.
POLICY_LOSSES: dict[str, LossFn] = {}


def register_loss(name: str) -> Callable[[LossFn], LossFn]:
    """Decorator: register a policy loss under ``name`` (``algorithm.loss: name``). The function returns the
    per-token loss and a dict of statistics summed over the masked tokens (logged as ``loss/<policy>/<key>``,
    averaged per token); aggregation (``algorithm.loss_agg``) and the KL term are applied by accord."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"policy loss name {name!r} must be an identifier")

    def deco(fn: LossFn) -> LossFn:
        if name in POLICY_LOSSES and POLICY_LOSSES[name] is not fn:
            raise ValueError(f"a policy loss named {name!r} is already registered; choose another name")
        POLICY_LOSSES[name] = fn
        return fn

    return deco


@register_loss("clip")
def clipped_surrogate(x: SurrogateInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO/GRPO's clipped-ratio surrogate ``-min(ratio * A, clip(ratio, 1 - eps, 1 + eps_high) * A)``."""
    ratio = torch.exp(x.logp - x.old_logp)
    unclipped = ratio * x.advantages
    clipped = ratio.clamp(1.0 - x.epsilon, 1.0 + x.epsilon_high) * x.advantages
    per_token = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        stats = {
            "pg": (per_token * x.mask).sum(),
            "clip_frac": (((ratio < 1.0 - x.epsilon) & (x.advantages < 0))
                          | ((ratio > 1.0 + x.epsilon_high) & (x.advantages > 0))).to(x.mask.dtype).mul(x.mask).sum(),
            "ratio": (ratio * x.mask).sum(),
        }
    return per_token, stats


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    totals: LossTotals,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    agg: str = "token_mean",
    kl_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    kl_estimator: str = "k3",
    kl_logp: torch.Tensor | None = None,
    loss: str = "clip",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The registered policy loss ``loss`` of one micro-batch (default: the clipped-ratio surrogate of
    PPO/GRPO) plus the KL term, aggregated and normalised by batch-wide totals.

    Args:
        logp, old_logp, mask: (b, T) current and sampling log-probs and the completion mask.
        advantages: (b,) one advantage per sequence.
        totals: token and sequence counts of the whole batch being accumulated.
        agg: ``token_mean`` (sum over all tokens / all tokens), ``seq_mean_token_mean`` (mean over
            sequences of each sequence's token mean) or ``seq_sum`` (sum over a sequence's tokens,
            mean over sequences).
        ref_logp, kl_logp: the reference's and the policy's log-probs for the KL term, both of the
            untruncated distribution at the sampling temperature (``kl_logp`` None: ``logp``, right
            when sampling is not truncated by top-k / top-p).
    Returns:
        The loss contribution of this micro-batch and unnormalised statistic sums (divide by
        ``totals.num_tokens`` to average).
    """
    if loss not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {loss!r}; choose one of {sorted(POLICY_LOSSES)} or register one "
                         "with accord.algorithms.register_loss")
    mask = mask.to(logp.dtype)
    eps_high = epsilon if epsilon_high is None else epsilon_high
    per_token, stats = POLICY_LOSSES[loss](SurrogateInputs(logp, old_logp, advantages.unsqueeze(-1), mask,
                                                           epsilon, eps_high))
    if per_token.shape != logp.shape:
        raise ValueError(f"policy loss {loss!r} returned a loss of shape {tuple(per_token.shape)}; it must be "
                         f"per token, {tuple(logp.shape)}")
    kl = None
    if kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp")
        kl = kl_penalty(logp if kl_logp is None else kl_logp, ref_logp, kl_estimator)
        per_token = per_token + kl_coef * kl
    if agg == "token_mean":
        total = (per_token * mask).sum() / totals.num_tokens
    elif agg == "seq_mean_token_mean":
        lengths = mask.sum(-1).clamp(min=1)
        total = ((per_token * mask).sum(-1) / lengths).sum() / totals.num_seqs
    elif agg == "seq_sum":
        total = (per_token * mask).sum() / totals.num_seqs
    else:
        raise ValueError(f"unknown loss aggregation {agg!r}")
    if kl is not None:
        with torch.no_grad():
            stats["kl"] = (kl * mask).sum()
    return total, stats
