"""The one record type of training data."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sample:
    """One agent's completion at one turn, with everything the update needs.

    ``group`` is the integer id of the advantage group (the rollout decides what a group is);
    ``reward`` is the immediate reward credited to this sample, ``ret`` its return (equal to the
    reward in single-turn rollouts; in cross mode the marginal mean over joint actions).
    """

    agent: str
    policy: str
    turn: int
    group: int
    instance: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    prompt_text: str = ""
    completion_text: str = ""
    reward: float = 0.0
    ret: float = 0.0
    advantage: float = 0.0
    extra: dict = field(default_factory=dict)


@dataclass
class Completion:
    """One generated completion of a chat prompt, as rollouts receive it from the trainer."""

    prompt_ids: list[int]
    ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str


def prompt_group_ids(samples: list[Sample]) -> list[int]:
    """Group ids that put together exactly the samples of one agent drawn from identical prompt tokens
    (``algorithm.norm_scope: prompt``), numbered in order of first appearance."""
    ids: dict[tuple, int] = {}
    return [ids.setdefault((s.agent, tuple(s.prompt_ids)), len(ids)) for s in samples]
