"""Token log-probabilities under the sampling distribution, and the policy-gradient losses.

The losses are a registry (``algorithm.loss``; :func:`register_loss` adds one): ``grpo`` (alias ``clip``),
``dapo``, ``dr_grpo``, ``gspo`` and ``cispo``, each a pure function of one micro-batch's log-probs,
advantages and mask; their formulas, aggregations and papers are in ``docs/loss-controls.md``.

The training log-prob of a token must be the log-prob it had when it was sampled: the same
temperature and the same top-k / top-p truncation (renormalised over the kept tokens). Both the
generator and the learner call :func:`process_logits` (the generator through :func:`sampling_logits`, the same
logits bit for bit), so the two cannot drift apart (the learner passes the sampled tokens as ``keep``, so
rounding at the truncation boundary cannot drop one).

The KL penalty is different: the policy and the reference both use the untruncated distribution at
the sampling temperature. A reference truncated like the sampler gives log-prob -inf to every token
the moved policy samples outside the reference's own top-k / top-p set, and the loss becomes infinite.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from accord import metric_names as mn
from accord.algorithms.advantages import ExtensionError


def process_logits(logits: torch.Tensor, temperature: float | torch.Tensor = 1.0, top_k: int | torch.Tensor = 0,
                   top_p: float | torch.Tensor = 1.0, keep: torch.Tensor | None = None,
                   blocked: torch.Tensor | None = None, blocked_ids: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 logits of the sampling distribution: divided by temperature, truncated to -inf.

    The truncation mask is computed without gradient; the kept logits keep theirs. ``keep`` (the
    logits' shape without the vocabulary axis) names one token per position that is never truncated:
    the learner passes the sampled tokens, which the sampler kept by construction, so that a
    recomputed forward whose float rounding puts a sampled token just past the top-k / top-p boundary
    cannot give it probability 0 (a -inf log-prob and a NaN loss).

    Each setting is one number for every row, or a tensor with one value per row (its shape a prefix of
    the logits' leading axes: ``(rows,)`` for ``(rows, V)`` or ``(rows, C, V)`` logits), so that rows of
    agents with different sampling settings share one batch; a row's result is the same as with its
    settings given as numbers (top-k 0 and top-p 1 mean no truncation).

    ``blocked`` (bool, the logits' shape without the vocabulary axis) marks the positions where the tokens
    ``blocked_ids`` (the EOS ids) may not be drawn: ``min_new_tokens``. They get -inf before the temperature
    and the truncation (the order of Hugging Face's processors), so top-k / top-p choose among the rest.
    """
    logits = logits.float()
    if blocked is not None and bool(blocked.any()):
        vocab = torch.zeros(logits.size(-1), dtype=torch.bool, device=logits.device)
        vocab[blocked_ids.to(logits.device)] = True
        logits = logits.masked_fill(blocked.to(logits.device).unsqueeze(-1) & vocab, float("-inf"))
    if isinstance(temperature, torch.Tensor):
        logits = logits / _per_row(temperature.to(logits.dtype), logits)
    elif temperature != 1.0:
        logits = logits / temperature
    if isinstance(top_k, torch.Tensor):
        logits = _top_k_rows(logits, top_k, keep)
    elif top_k and top_k < logits.size(-1):
        with torch.no_grad():
            kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
            drop = _spare(logits < kth, keep)
        logits = logits.masked_fill(drop, float("-inf"))
    rows_p = isinstance(top_p, torch.Tensor)
    if (rows_p and bool((top_p < 1.0).any())) or (not rows_p and top_p < 1.0):
        with torch.no_grad():
            p = _per_row(top_p.to(logits.dtype), logits) if rows_p else top_p
            drop = _spare(_top_p_drop(logits, p), keep)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


TOP_P_FIRST_K = 64   # the candidates a top-p search looks at first; widened eightfold while a row needs more


def _top_p_drop(logits: torch.Tensor, p: float | torch.Tensor) -> torch.Tensor:
    """bool, the logits' shape: the tokens top-p drops. A token is dropped when the probability mass of the
    tokens ranked above it already reaches ``p`` (the first always stays; ``p`` >= 1 drops nothing); the ranking
    is :func:`_top_p_ranked`'s, and every token past the boundary is dropped, ranked or not."""
    flat = logits.reshape(-1, logits.size(-1))
    limit = _top_p_limit(flat, p, logits.shape[:-1])
    _, index, drop_ranked = _top_p_ranked(flat, limit)
    drop = torch.ones_like(flat, dtype=torch.bool).scatter_(-1, index, drop_ranked)
    drop &= limit < 1.0
    return drop.view(logits.shape)


def _top_p_limit(flat: torch.Tensor, p: float | torch.Tensor, leading: torch.Size) -> torch.Tensor:
    """(rows, 1): each row of ``flat`` (the logits' ``leading`` axes flattened) and its top-p."""
    limit = (p if isinstance(p, torch.Tensor) else torch.tensor(p, dtype=flat.dtype, device=flat.device))
    return limit.expand(*leading, 1).reshape(flat.size(0), 1)


def _top_p_ranked(flat: torch.Tensor, limit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The top-p boundary of each row of ``flat`` (rows, vocab) without sorting the whole vocabulary: the
    largest ``TOP_P_FIRST_K`` logits are ranked, and more only while some row's mass stays under its ``limit``
    (rows, 1). Returns the ranked logits and their vocabulary ids (rows, k), and which of them top-p drops: a
    token whose logit is below the row's boundary, the smallest logit among the tokens kept in rank order (those
    the mass ranked above does not reach the limit). The probabilities are ``exp(logit - logsumexp)`` over the whole
    vocabulary. Tokens tied with the boundary are all kept, as top-k keeps every token tied with its k-th: which
    of them ``topk`` ranks first depends on how many it ranks, which depends on the other rows, and the kept set
    of a row must not (tied tokens have equal probabilities, so the boundary's value is the same in any order)."""
    vocab = flat.size(-1)
    lse = torch.logsumexp(flat, dim=-1, keepdim=True)
    k = min(TOP_P_FIRST_K, vocab)
    while True:
        values, index = torch.topk(flat, k, dim=-1)
        probs = (values - lse).exp()
        in_order = (probs.cumsum(-1) - probs) >= limit   # a prefix of the ranked tokens is kept, the first always
        last_kept = (~in_order).sum(-1, keepdim=True).clamp(min=1) - 1
        drop_ranked = values < values.gather(-1, last_kept)
        # a row is decided once a ranked token lies below its boundary (every token tied with it is then ranked),
        # or when every token is ranked
        open_rows = ~(drop_ranked[:, -1] | (limit >= 1.0).squeeze(1))
        if k == vocab or not bool(open_rows.any()):
            return values, index, drop_ranked
        k = _top_p_next_k(k, vocab, probs[open_rows], limit[open_rows])


def _top_p_next_k(k: int, vocab: int, probs: torch.Tensor, limit: torch.Tensor) -> int:
    """How many tokens the search ranks next, after ``k`` left the rows of ``probs`` (their k largest
    probabilities, rows, k) short of their ``limit``: eight times as many, or twice what a row needs at least if
    that is more (a token not yet ranked is no likelier than the k-th, so a row needs at least ``(limit - mass) /
    p_k`` more: the flat rows of an untrained model rank the vocabulary at once, not in three rounds), and the whole
    vocabulary once that is half of it (``topk`` of half the vocabulary costs about what all of it does)."""
    short = (limit - probs.sum(-1, keepdim=True)) / probs[:, -1:]
    need = float(short.nan_to_num(nan=float(vocab), posinf=float(vocab)).clamp(0, vocab).max())
    k = max(k * 8, k + 2 * math.ceil(need))
    return vocab if 2 * k >= vocab else k


def sampling_logits(logits: torch.Tensor, temperature: float | torch.Tensor = 1.0, top_k: int | torch.Tensor = 0,
                    top_p: float | torch.Tensor = 1.0, blocked: torch.Tensor | None = None,
                    blocked_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The sampler's :func:`process_logits` of (rows, vocab) ``logits`` without gradient: the same logits, bit
    for bit, and the support of each row when top-p truncates every row: (rows, n) vocabulary ids in ascending
    order of the tokens top-p keeps, padded with ``vocab`` (None when some row keeps the whole vocabulary, or
    when the search ranked more than a quarter of it). A draw then needs the distribution's cumulative sums only
    over the support."""
    rows_p = isinstance(top_p, torch.Tensor)
    every_row = bool((top_p < 1.0).all()) if rows_p else top_p < 1.0
    if not every_row or logits.dim() != 2:
        return process_logits(logits, temperature, top_k, top_p, blocked=blocked, blocked_ids=blocked_ids), None
    with torch.no_grad():
        logits = process_logits(logits, temperature, top_k, 1.0, blocked=blocked, blocked_ids=blocked_ids)
        vocab = logits.size(-1)
        p = _per_row(top_p.to(logits.dtype), logits) if rows_p else top_p
        values, index, drop_ranked = _top_p_ranked(logits, _top_p_limit(logits, p, logits.shape[:-1]))
        # what process_logits' masked_fill leaves: the kept logits as they are, -inf everywhere else
        out = torch.full_like(logits, float("-inf")).scatter_(-1, index, values.masked_fill(drop_ranked, float("-inf")))
        # a search that had to rank a large part of the vocabulary (flat rows) leaves the sums to the whole
        # vocabulary: sorting that many ids costs more than it saves
        support = index.masked_fill(drop_ranked, vocab).sort(dim=-1).values if 4 * index.size(-1) <= vocab else None
    return out, support


def floor_mask(lengths: torch.Tensor, floors: torch.Tensor, width: int, right_aligned: bool) -> torch.Tensor:
    """(rows, width) bool: the completion positions under each row's ``min_new_tokens`` (``floors``), for
    completions of ``lengths`` tokens laid out in ``width`` columns, right-aligned (column j holds token
    j - (width - length)) or left-aligned: ``process_logits``'s ``blocked``."""
    index = torch.arange(width, device=floors.device)[None, :]
    if right_aligned:
        index = index - (width - lengths.to(floors.device))[:, None]
    return (index >= 0) & (index < floors[:, None])


def _spare(drop: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """``drop`` with the ``keep`` token of each position cleared."""
    if keep is None:
        return drop
    return drop.scatter(-1, keep.unsqueeze(-1), False)


def _per_row(values: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Per-row settings shaped to broadcast over ``logits`` (trailing axes of size 1)."""
    values = values.to(logits.device)
    return values.reshape(values.shape + (1,) * (logits.dim() - values.dim()))


def _top_k_rows(logits: torch.Tensor, top_k: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Top-k truncation with each row's own k (0: none): the k-th largest logit of a row is read from one
    ``topk`` of the largest k in the batch, so it is the value a row-alone ``topk`` gives."""
    vocab = logits.size(-1)
    k = _per_row(top_k.long().clamp(max=vocab), logits)
    active = (k > 0) & (k < vocab)
    if not bool(active.any()):
        return logits
    with torch.no_grad():
        kmax = int(k[active].max())
        values = torch.topk(logits, kmax, dim=-1).values
        index = (k.clamp(min=1, max=kmax) - 1).expand(*logits.shape[:-1], 1)
        kth = values.gather(-1, index)
        drop = _spare((logits < kth) & active, keep)
    return logits.masked_fill(drop, float("-inf"))


def gather_logprobs(processed_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax of processed logits gathered at ``targets`` (vectorised, no per-token loop)."""
    return logprobs_and_entropy(processed_logits, targets, want_entropy=False)[0]


def logprobs_and_entropy(processed_logits: torch.Tensor, targets: torch.Tensor, want_entropy: bool = True,
                         truncated: bool = True, entropy_grad: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``targets`` and, if wanted, the entropy at each position, from one log-softmax.

    The entropy has a gradient only with ``entropy_grad`` (the entropy bonus). ``truncated`` says whether
    top-k/top-p may have set logits to -inf (those tokens are skipped: their 0 * -inf would be NaN); without
    truncation that masking pass is not paid. One log-softmax serves both, and its backward is lighter than
    that of logsumexp + gather + a separate entropy pass (docs/performance.md, *Measured numbers*).
    """
    log_probs = torch.log_softmax(processed_logits, dim=-1)
    picked = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not want_entropy:
        return picked, None
    if entropy_grad:
        return picked, _entropy_terms(log_probs, truncated)
    with torch.no_grad():
        return picked, _entropy_terms(log_probs, truncated)


def entropy_from_logits(processed_logits: torch.Tensor, truncated: bool = True) -> torch.Tensor:
    """Entropy of the sampling distribution at each position (no gradient); see
    :func:`logprobs_and_entropy` for ``truncated``."""
    with torch.no_grad():
        return _entropy_terms(torch.log_softmax(processed_logits, dim=-1), truncated)


def _entropy_terms(log_probs: torch.Tensor, truncated: bool) -> torch.Tensor:
    """-sum p log p over the last axis (with a gradient where grad mode is on and ``log_probs`` has one)."""
    p = log_probs.exp()
    if truncated:  # truncated tokens have p = 0 and log p = -inf: their term is 0, not 0 * -inf = NaN (in the
        # backward too, which a torch.where over the product would not avoid)
        log_probs = log_probs.masked_fill(p == 0, 0.0)
    if torch.is_grad_enabled() and log_probs.requires_grad:
        terms = p * log_probs
    else:
        terms = p.mul_(log_probs)  # in place: one vocabulary-sized tensor fewer
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
    the old ones the ratio is taken to (the learner's before the update, or the sampler's: see
    :mod:`accord.policies`), (b, 1) advantages, the (b, T) completion mask and the clip ranges.
    ``sampling_logp`` holds the sampler's stored log-probs for a loss registered with
    ``sampling_logprobs=True`` (None otherwise)."""

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    epsilon: float
    epsilon_high: float
    sampling_logp: torch.Tensor | None = None


@dataclass(frozen=True)
class LossSpec:
    """How a registered loss is aggregated and what it reads.

    ``agg``: the aggregation the loss is defined with (``algorithm.loss_agg`` must then be unset or equal);
    None: the loss takes ``algorithm.loss_agg`` (unset: ``token_mean``). ``sampling_logprobs``: the loss
    reads the sampler's stored log-probs (a generation backend that stores none is refused)."""

    agg: str | None = None
    sampling_logprobs: bool = False


LossFn = Callable[[SurrogateInputs], "tuple[torch.Tensor, dict[str, torch.Tensor]]"]
#: name -> policy loss: (b, T) per-token loss (to be minimised) and masked per-token statistic sums.
POLICY_LOSSES: dict[str, LossFn] = {}
#: name -> its aggregation and inputs (see :class:`LossSpec`).
LOSS_SPECS: dict[str, LossSpec] = {}
#: every aggregation ``algorithm.loss_agg`` names (see :func:`policy_loss`).
LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "seq_sum", "seq_sum_norm")
DEFAULT_AGG = "token_mean"


def register_loss(name: str, *, agg: str | None = None, sampling_logprobs: bool = False
                  ) -> Callable[[LossFn], LossFn]:
    """Decorator: register a policy loss under ``name`` (``algorithm.loss: name``). The function returns the
    per-token loss and a dict of statistics summed over the masked tokens (logged as ``loss/<policy>/<key>``,
    averaged per token); aggregation and the KL term are applied by accord. ``agg`` fixes the aggregation
    the loss is defined with (one of ``LOSS_AGGS``; None: ``algorithm.loss_agg``); ``sampling_logprobs``
    says it reads ``SurrogateInputs.sampling_logp``."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"policy loss name {name!r} must be an identifier")
    if agg is not None and agg not in LOSS_AGGS:
        raise ValueError(f"policy loss {name!r}: agg={agg!r} is not one of {list(LOSS_AGGS)}")

    def deco(fn: LossFn) -> LossFn:
        if name in POLICY_LOSSES and POLICY_LOSSES[name] is not fn:
            raise ValueError(f"a policy loss named {name!r} is already registered; choose another name")
        POLICY_LOSSES[name] = fn
        LOSS_SPECS[name] = LossSpec(agg, sampling_logprobs)
        return fn

    return deco


def resolve_loss_agg(loss: str, agg: str | None) -> str:
    """The aggregation a run of ``loss`` uses: the loss's own (``agg`` must then be None or equal), else
    ``agg``, else ``token_mean``. A conflict is a ValueError naming both."""
    spec = LOSS_SPECS.get(loss, LossSpec())
    if spec.agg is not None:
        if agg is not None and agg != spec.agg:
            raise ValueError(f"algorithm.loss={loss} is defined with loss_agg={spec.agg}, but algorithm.loss_agg="
                             f"{agg}; leave loss_agg unset (null) or set it to {spec.agg}")
        return spec.agg
    return agg or DEFAULT_AGG


def _clip_stats(per_token: torch.Tensor, ratio: torch.Tensor, x: SurrogateInputs) -> dict[str, torch.Tensor]:
    """Masked sums of the surrogate, the share of clipped tokens (their gradient is zero) and the ratio."""
    with torch.no_grad():
        clipped = ((ratio < 1.0 - x.epsilon) & (x.advantages < 0)) | ((ratio > 1.0 + x.epsilon_high) & (x.advantages > 0))
        return {mn.PG: (per_token * x.mask).sum(), mn.CLIP_FRAC: clipped.to(x.mask.dtype).mul(x.mask).sum(),
                mn.RATIO: (ratio * x.mask).sum()}


def clipped_surrogate(x: SurrogateInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO/GRPO's clipped-ratio surrogate ``-min(r * A, clip(r, 1 - eps, 1 + eps_high) * A)`` per token,
    ``r = pi / pi_old`` of the token (DeepSeekMath, arXiv 2402.03300)."""
    ratio = torch.exp(x.logp - x.old_logp)
    per_token = -torch.minimum(ratio * x.advantages, ratio.clamp(1.0 - x.epsilon, 1.0 + x.epsilon_high) * x.advantages)
    return per_token, _clip_stats(per_token, ratio, x)


# ``grpo`` takes algorithm.loss_agg (token_mean unless set); ``clip`` is its older name, kept for existing configs
register_loss("grpo")(clipped_surrogate)
register_loss("clip")(clipped_surrogate)
# DAPO (arXiv 2503.14476): the same token surrogate, clip range (epsilon, epsilon_high) decoupled, every token of
# the batch weighted alike (token-level aggregation); dynamic sampling and overlong shaping are separate keys
register_loss("dapo", agg="token_mean")(clipped_surrogate)
# Dr. GRPO (arXiv 2503.20783): no 1/|y| per sequence; each sequence's token sum divided by the length cap
register_loss("dr_grpo", agg="seq_sum_norm")(clipped_surrogate)


@register_loss("gspo", agg="seq_mean_token_mean")
def sequence_surrogate(x: SurrogateInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (arXiv 2507.18071): the sequence ratio ``s = exp(mean_t log(pi / pi_old))`` (geometric mean of the
    token ratios) clipped per sequence, ``-min(s * A, clip(s, 1 - eps, 1 + eps_high) * A)``; the value is
    repeated on every token of the sequence, so the sequence mean of token means is the paper's mean over
    sequences."""
    lengths = x.mask.sum(-1, keepdim=True).clamp(min=1)
    ratio = torch.exp(((x.logp - x.old_logp) * x.mask).sum(-1, keepdim=True) / lengths)   # (b, 1)
    per_seq = -torch.minimum(ratio * x.advantages, ratio.clamp(1.0 - x.epsilon, 1.0 + x.epsilon_high) * x.advantages)
    per_token = per_seq.expand_as(x.logp)
    return per_token, _clip_stats(per_token, ratio.expand_as(x.logp), x)


@register_loss("cispo")
def clipped_is_reinforce(x: SurrogateInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): ``-sg(min(r, 1 + eps_high)) * A * log pi`` per token: the importance
    weight is clipped and carries no gradient, so every token keeps a REINFORCE gradient (none is dropped by
    a clip), only its weight is bounded. No lower bound on the weight (the paper's choice)."""
    ratio = torch.exp(x.logp - x.old_logp)
    weight = ratio.detach().clamp(max=1.0 + x.epsilon_high)
    per_token = -weight * x.advantages * x.logp
    with torch.no_grad():
        stats = {mn.PG: (per_token * x.mask).sum(),
                 mn.CLIP_FRAC: (ratio > 1.0 + x.epsilon_high).to(x.mask.dtype).mul(x.mask).sum(),
                 mn.RATIO: (ratio * x.mask).sum()}
    return per_token, stats


def tis_weights(learner_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float, mode: str
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token importance weights correcting for a sampler that is not the learner, and which tokens
    exceed ``cap``: ``r = pi_learner / pi_sampler`` of the sampled token; ``truncate``: ``min(r, cap)``;
    ``mask``: ``r`` where ``r <= cap``, else 0. No gradient (both log-probs are the old policy's)."""
    with torch.no_grad():
        ratio = torch.exp(learner_logp - sampler_logp)
        over = ratio > cap
        if mode == "truncate":
            return ratio.clamp(max=cap), over
        if mode == "mask":
            return ratio.masked_fill(over, 0.0), over
    raise ValueError(f"unknown importance-weight mode {mode!r}; choose truncate or mask")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    totals: LossTotals,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    agg: str | None = None,
    kl_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    kl_estimator: str = "k3",
    kl_logp: torch.Tensor | None = None,
    loss: str = "grpo",
    weights: torch.Tensor | None = None,
    max_lens: torch.Tensor | None = None,
    sampling_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The registered policy loss ``loss`` of one micro-batch (default: the clipped-ratio surrogate of
    PPO/GRPO) plus the KL term, aggregated and normalised by batch-wide totals.

    Args:
        logp, old_logp, mask: (b, T) current and old log-probs and the completion mask.
        advantages: (b,) one advantage per sequence.
        totals: token and sequence counts of the whole batch being accumulated.
        agg: ``token_mean`` (sum over all tokens / all tokens), ``seq_mean_token_mean`` (mean over
            sequences of each sequence's token mean), ``seq_sum`` (sum over a sequence's tokens, mean
            over sequences) or ``seq_sum_norm`` (a sequence's token sum divided by its length cap
            ``max_lens``, mean over sequences); None: the loss's own (see :func:`resolve_loss_agg`).
        ref_logp, kl_logp: the reference's and the policy's log-probs for the KL term, both of the
            untruncated distribution at the sampling temperature (``kl_logp`` None: ``logp``, right
            when sampling is not truncated by top-k / top-p).
        weights: (b, T) per-token weights of the policy-gradient term (the sampler/learner correction of
            :func:`tis_weights`); None: 1.
        max_lens: (b,) each sequence's completion length cap (``seq_sum_norm``).
        sampling_logp: (b, T) the sampler's stored log-probs, for losses that read them.
        entropy, entropy_coef: (b, T) the entropy of the sampling distribution at each token, with its gradient,
            and the weight of the bonus: ``entropy_coef`` x entropy is subtracted from each token's loss before
            the aggregation (0: no bonus).
    Returns:
        The loss contribution of this micro-batch and unnormalised statistic sums (divide by
        ``totals.num_tokens`` to average).
    """
    if loss not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {loss!r}; choose one of {sorted(POLICY_LOSSES)} or register one "
                         "with accord.algorithms.register_loss")
    agg = resolve_loss_agg(loss, agg)
    mask = mask.to(logp.dtype)
    eps_high = epsilon if epsilon_high is None else epsilon_high
    out = POLICY_LOSSES[loss](SurrogateInputs(logp, old_logp, advantages.unsqueeze(-1), mask, epsilon, eps_high,
                                              sampling_logp))
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.Tensor) and isinstance(out[1], dict)):
        raise ExtensionError(f"policy loss {loss!r} returned {type(out).__name__}; it must return (the per-token loss, "
                             f"a tensor of shape {tuple(logp.shape)}, and a dict of statistics)")
    per_token, stats = out
    if per_token.shape != logp.shape:
        raise ExtensionError(f"policy loss {loss!r} returned a loss of shape {tuple(per_token.shape)}; it must be "
                             f"per token, {tuple(logp.shape)}")
    if weights is not None:
        per_token = per_token * weights
    kl = None
    if kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp")
        kl = kl_penalty(logp if kl_logp is None else kl_logp, ref_logp, kl_estimator)
        per_token = per_token + kl_coef * kl
    if entropy_coef > 0:
        if entropy is None or not entropy.requires_grad:
            raise ValueError("entropy_coef > 0 needs the entropy with its gradient (logprobs_and_entropy(..., "
                             "entropy_grad=True))")
        per_token = per_token - entropy_coef * entropy
    if agg == "token_mean":
        total = (per_token * mask).sum() / totals.num_tokens
    elif agg == "seq_mean_token_mean":
        lengths = mask.sum(-1).clamp(min=1)
        total = ((per_token * mask).sum(-1) / lengths).sum() / totals.num_seqs
    elif agg == "seq_sum":
        total = (per_token * mask).sum() / totals.num_seqs
    elif agg == "seq_sum_norm":
        if max_lens is None:
            raise ValueError("loss_agg=seq_sum_norm needs max_lens (each sequence's completion length cap)")
        total = ((per_token * mask).sum(-1) / max_lens.to(per_token.dtype)).sum() / totals.num_seqs
    else:
        raise ValueError(f"unknown loss aggregation {agg!r}; choose one of {list(LOSS_AGGS)}")
    if kl is not None:
        with torch.no_grad():
            stats[mn.KL] = (kl * mask).sum()
    return total, stats
