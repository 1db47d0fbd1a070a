"""Dynamic sampling (DAPO, arXiv 2503.14476, section 3.2; ``rollout.drop_flat_groups``).

A group whose returns are all equal has every advantage 0: it costs an update and teaches nothing. The
trainer drops such groups and rolls out more task instances, round after round, until the step holds as
many informative groups as its first round held groups (``target``), or ``rollout.max_extra_rounds``
rounds were added; informative groups past the target are left out (in the order they came), so a step
trains on a fixed number of groups whenever the rounds allow it. Flatness is judged on the rollout's
returns, before overlong shaping and KL penalties (the paper filters on accuracy).

The extra rounds' instances are drawn from the training set (without the step's own) by a generator
seeded with the run's seed, the step and the round, so a resumed run repeats them exactly.
"""

from __future__ import annotations

import random
from collections import defaultdict

from accord.rollout.sample import Sample
from accord.seeding import extra_rows_seed


def flat_groups(samples: list[Sample], groups: list[int]) -> set[int]:
    """The group ids whose samples' returns are all equal."""
    values = defaultdict(set)
    for s, g in zip(samples, groups):
        values[g].add(s.ret)
    return {g for g, v in values.items() if len(v) == 1}


def extra_rows(train_rows: list[dict], exclude: set, n: int, seed: int, step: int, round_: int) -> list[dict]:
    """``n`` training instances for an extra round, drawn without the ids in ``exclude`` (all of them when that
    leaves fewer than ``n``)."""
    pool = [r for r in train_rows if r.get("id") not in exclude] if exclude else list(train_rows)
    if len(pool) < n:
        pool = list(train_rows)
    rng = random.Random(extra_rows_seed(seed, step, round_))
    return rng.sample(pool, n) if len(pool) >= n else [rng.choice(pool) for _ in range(n)]


def renumber(samples: list[Sample], group_offset: int, instance_offset: int, joint_offset: int) -> None:
    """Shift a later round's group, instance and joint-action ids past the earlier rounds' (in place)."""
    for s in samples:
        s.group += group_offset
        s.instance += instance_offset
        if s.extra.get("joint") is not None:
            s.extra["joint"] += joint_offset


def keep_informative(samples: list[Sample], groups: list[int], target: int) -> tuple[list[Sample], int]:
    """The samples of the first ``target`` non-flat groups (in order of first appearance), and how many flat
    groups were dropped."""
    flat = flat_groups(samples, groups)
    kept_groups: dict[int, None] = {}
    out = []
    for s, g in zip(samples, groups):
        if g in flat:
            continue
        if g not in kept_groups:
            if len(kept_groups) >= target:
                continue
            kept_groups[g] = None
        out.append(s)
    return out, len(flat)
