"""Counterfactual credit from the team reward alone (``algorithm.credit: counterfactual``).

With one team reward, every agent of a joint action gets the same return, so an agent whose action did
not matter is pushed as hard as the one whose action did. Counterfactual credit asks, for each agent's
sample, how the team reward changes when *that agent's* action is swapped for its siblings' (the K - 1
other samples of the same agent in the same group) while the other agents' actions stay fixed. It needs
more reward calls (or environment steps), never more generation.

The game behind it. In a group of K aligned joint actions ``a^1 .. a^K`` of N agents, the value of a
coalition ``S`` of agents for joint action ``j`` is

    v_j(S) = mean over siblings j' != j of  R(agents in S play a^j, the others play a^j')

so ``v_j(all) = R(a^j)`` and ``v_j(empty) = mean_{j' != j} R(a^j')``. An agent's credit is its **Shapley
value** in this game: the mean, over orderings of the agents, of ``v_j(P + i) - v_j(P)`` with ``P`` the
agents before ``i``. For N = 2 both orderings are used, so the credit is exact and needs exactly the
swaps the definition names: ``R(e^j, o^j')`` and ``R(e^j', o^j)`` (the off-diagonal cells of the K x K
grid). For N >= 3 the orderings are all N! of them when that is at most ``algorithm.credit_orderings``,
else that many distinct orderings drawn with the run's seed and step.

Properties the tests hold it to:

- **efficiency**: the credits of a joint action sum to ``R(a^j) - mean_{j' != j} R(a^j')`` (the
  leave-one-out advantage of the plain team return), for every ordering sampled;
- **null player**: an agent whose action never changes the reward gets credit exactly 0.0 (differences
  are taken per sibling before averaging, so no rounding is left over);
- the credit replaces the sample's return; the advantage estimator and ``normalize_std`` apply to it as
  to any return.

Diagnostics (logged per step by the rollout, pooled over the step's groups). With ``T^j = v_j(all) -
v_j(empty)`` (the joint action's effect over its siblings), the main effect ``m_i^j = v_j({i}) -
v_j(empty)`` and the interaction ``I^j = T^j - sum_i m_i^j``:

- ``credit/<agent>/variance_share`` = ``sum phi_i T / sum T^2``: the agent's Shapley share of the team
  reward's variance within groups (the shares sum to 1);
- ``credit/interaction_share`` = ``sum I T / sum T^2``: the share no agent's action explains alone (0 for
  an additive reward, 1 for an XOR of two agents' choices sampled evenly);
- ``credit/<agent>/free_rider`` = ``clamp(1 - N * variance_share, 0, 1)``: 0 when the agent carries at
  least an equal share of the variance, 1 when its action explains none of it;
- ``credit/evaluations``: the extra reward evaluations (or environment replays) this step paid.

A step whose groups all have constant rewards (``sum T^2 = 0``) logs no shares (they are undefined).

The reward must be deterministic: every plan re-scores the unchanged joint actions, and a different value
stops the run with :class:`CreditError` (one line naming the group).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

from accord import metric_names as mn
from accord.config import ConfigError
from accord.seeding import credit_seed

Choice = tuple[int, ...]   # the sample index each agent plays in an evaluated joint action


class CreditError(ConfigError):
    """Counterfactual credit cannot be computed for this reward (it is not deterministic); the message says
    which group and how to fix it."""


def agent_orderings(n_agents: int, count: int, rng: random.Random) -> list[tuple[int, ...]]:
    """All N! orderings of the agents when there are at most ``count``, else ``count`` distinct ones drawn
    with ``rng``."""
    if count < 1:
        raise ValueError(f"credit orderings must be >= 1, got {count}")
    if math.factorial(n_agents) <= count:
        return list(itertools.permutations(range(n_agents)))
    seen: dict[tuple[int, ...], None] = {}
    while len(seen) < count:
        order = list(range(n_agents))
        rng.shuffle(order)
        seen.setdefault(tuple(order), None)
    return list(seen)


def coalitions(n_agents: int, orders: Sequence[tuple[int, ...]]) -> list[frozenset[int]]:
    """The coalitions whose values the credit and diagnostics need: every proper non-empty prefix of every
    ordering, and every single agent (the main effects); the empty and full coalitions need no new call."""
    out: dict[frozenset[int], None] = {}
    for order in orders:
        for p in range(1, n_agents):
            out.setdefault(frozenset(order[:p]), None)
    for i in range(n_agents):
        out.setdefault(frozenset([i]), None)
    full = frozenset(range(n_agents))
    return [s for s in out if s and s != full]


def choice(j: int, sibling: int, keep: frozenset[int], n_agents: int) -> Choice:
    """The joint action in which the agents of ``keep`` play their sample ``j`` and the others ``sibling``."""
    return tuple(j if i in keep else sibling for i in range(n_agents))


def plan_choices(n_agents: int, k: int, orders: Sequence[tuple[int, ...]]) -> list[Choice]:
    """Every joint action to evaluate for one group: the K unchanged ones first (the determinism check),
    then each needed coalition of each joint action with each sibling, without duplicates (the value of
    ``S`` for ``j`` with sibling ``j'`` is the value of the complement for ``j'`` with sibling ``j``)."""
    out: dict[Choice, None] = {(j,) * n_agents: None for j in range(k)}
    for keep in coalitions(n_agents, orders):
        for j in range(k):
            for sib in range(k):
                if sib != j:
                    out.setdefault(choice(j, sib, keep, n_agents), None)
    return list(out)


@dataclass
class GroupCredit:
    """Credits of one group: ``credit[j][i]`` of agent i in joint action j, and the sums of the diagnostics."""

    credit: list[list[float]]
    sum_tt: float = 0.0                                       # sum_j T^2
    sum_phi_t: list[float] = field(default_factory=list)     # per agent: sum_j phi_i T
    sum_it: float = 0.0                                       # sum_j I T


def group_credit(values: dict[Choice, float], n_agents: int, k: int, orders: Sequence[tuple[int, ...]]) -> GroupCredit:
    """Shapley credits and diagnostics of one group from the team reward of every planned joint action
    (``values``: choice -> reward; it holds at least :func:`plan_choices`'s choices)."""
    full = frozenset(range(n_agents))
    empty: frozenset[int] = frozenset()

    def delta(j: int, with_i: frozenset[int], without: frozenset[int]) -> float:
        # per-sibling differences first: a reward that ignores the agent gives exact zeros
        diffs = [values[choice(j, s, with_i, n_agents)] - values[choice(j, s, without, n_agents)]
                 for s in range(k) if s != j]
        return sum(diffs) / len(diffs)

    out = GroupCredit(credit=[], sum_phi_t=[0.0] * n_agents)
    for j in range(k):
        phi = [0.0] * n_agents
        for order in orders:
            before: frozenset[int] = empty
            for i in order:
                phi[i] += delta(j, before | {i}, before)
                before = before | {i}
        phi = [p / len(orders) for p in phi]
        total = delta(j, full, empty)
        main = [delta(j, frozenset([i]), empty) for i in range(n_agents)]
        interaction = total - sum(main)
        out.credit.append(phi)
        out.sum_tt += total * total
        out.sum_it += interaction * total
        for i in range(n_agents):
            out.sum_phi_t[i] += phi[i] * total
    return out


def check_deterministic(label: str, recorded: Sequence[float], values: dict[Choice, float], n_agents: int) -> None:
    """Raise :class:`CreditError` when re-scoring an unchanged joint action gave another reward."""
    for j, r in enumerate(recorded):
        again = values[(j,) * n_agents]
        if not math.isclose(again, r, rel_tol=1e-9, abs_tol=1e-12):
            raise CreditError(f"algorithm.credit=counterfactual needs a deterministic team reward, but re-scoring the "
                              f"unchanged joint action {j} of {label} gave {again!r} instead of {r!r}; make the "
                              "reward a function of the texts and the instance only (seed any randomness from the "
                              "instance), or set algorithm.credit=team")


@dataclass
class CreditStep:
    """The credits of a step's groups and its diagnostics."""

    credits: list[list[list[float]]]          # [group][j][i]
    metrics: dict[str, list[float]]


def counterfactual_credit(agents: Sequence[str], k: int, recorded: Sequence[Sequence[float]], labels: Sequence[str],
                          evaluate: Callable[[list[tuple[int, Choice]]], list[float]], *, orderings: int,
                          rng: random.Random) -> CreditStep:
    """Credits of every group of a step.

    Args:
        agents: the agents, in the order of the choice tuples.
        k: joint actions per group (aligned: sample j of every agent).
        recorded: per group, the K team rewards the rollout recorded for its joint actions.
        labels: per group, how an error names it (e.g. ``instance 'train-3'``).
        evaluate: the team rewards of a batch of (group, choice) joint actions, in order (one reward call,
            or one environment replay per item).
        orderings: ``algorithm.credit_orderings``.
        rng: draws the orderings when N! exceeds ``orderings``.
    """
    n = len(agents)
    orders = agent_orderings(n, orderings, rng)
    plan = plan_choices(n, k, orders)
    requests = [(g, c) for g in range(len(recorded)) for c in plan]
    flat = evaluate(requests) if requests else []
    if len(flat) != len(requests):
        raise RuntimeError(f"credit evaluation returned {len(flat)} rewards for {len(requests)} joint actions")
    values: list[dict[Choice, float]] = [{} for _ in recorded]
    for (g, c), v in zip(requests, flat):
        values[g][c] = float(v)
    credits, sum_tt, sum_it = [], 0.0, 0.0
    sum_phi_t = [0.0] * n
    for g, rec in enumerate(recorded):
        check_deterministic(labels[g], rec, values[g], n)
        gc = group_credit(values[g], n, k, orders)
        credits.append(gc.credit)
        sum_tt += gc.sum_tt
        sum_it += gc.sum_it
        for i in range(n):
            sum_phi_t[i] += gc.sum_phi_t[i]
    metrics: dict[str, list[float]] = {mn.CREDIT_EVALUATIONS: [float(len(requests))]}
    for i, a in enumerate(agents):
        metrics[mn.credit_key(a, mn.CREDIT_MEAN)] = [c[i] for group in credits for c in group]
    if sum_tt > 0:
        metrics[mn.CREDIT_INTERACTION_SHARE] = [sum_it / sum_tt]
        for i, a in enumerate(agents):
            share = sum_phi_t[i] / sum_tt
            metrics[mn.credit_key(a, mn.CREDIT_VARIANCE_SHARE)] = [share]
            metrics[mn.credit_key(a, mn.CREDIT_FREE_RIDER)] = [min(1.0, max(0.0, 1.0 - n * share))]
    return CreditStep(credits, metrics)


def credit_rng(seed: int, step: int) -> random.Random:
    """The orderings' random stream of a step: a function of the run's seed and the step (resume-exact)."""
    return random.Random(credit_seed(seed, step))
