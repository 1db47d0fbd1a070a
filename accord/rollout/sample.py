"""The one record type of training data, and the sampling settings it was drawn with."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sampling:
    """How one completion is sampled: temperature, top-k (0: off), top-p (1: off), its length cap and its
    floor (EOS may not be drawn before ``min_new_tokens`` tokens). The learner recomputes a sample's log-probs
    with the same temperature, truncation and floor."""

    temperature: float
    top_k: int
    top_p: float
    max_new_tokens: int
    min_new_tokens: int = 0


def agent_sampling(cfg) -> dict[str, Sampling]:
    """Each agent's sampling: ``rollout``'s settings with the agent's ``sampling`` overrides (a
    :class:`~accord.config.Config` whose ``agents`` are resolved)."""
    r = cfg.rollout
    out = {}
    for a in cfg.agents:
        s = a.sampling
        out[a.name] = Sampling(r.temperature if s.temperature is None else s.temperature,
                               r.top_k if s.top_k is None else s.top_k,
                               _top_p(r) if s.top_p is None else s.top_p,
                               r.max_new_tokens if s.max_new_tokens is None else s.max_new_tokens,
                               s.min_new_tokens if s.min_new_tokens is not None else r.min_new_tokens or 0)
    return out


def rollout_sampling(rollout) -> Sampling:
    """The rollout config's own sampling (a sample that records none was drawn with it)."""
    return Sampling(rollout.temperature, rollout.top_k, _top_p(rollout), rollout.max_new_tokens,
                    rollout.min_new_tokens or 0)


def _top_p(rollout) -> float:
    """The rollout config's nucleus: ``top_p``, or 1.0 (none) while it is null (no task has filled it in: a
    policy built without a run)."""
    return 1.0 if rollout.top_p is None else rollout.top_p


@dataclass
class Sample:
    """One agent's completion at one turn, with everything the update needs.

    ``group`` is the integer id of the advantage group (the rollout decides what a group is);
    ``reward`` is the immediate reward credited to this sample, ``ret`` its return (equal to the
    reward in single-turn rollouts; in cross mode the marginal mean over joint actions).
    ``sampling`` is how it was drawn (its agent's settings; None: the rollout config's).
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
    sampling: Sampling | None = None


@dataclass
class Completion:
    """One generated completion of a chat prompt, as rollouts receive it from the trainer."""

    prompt_ids: list[int]
    ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str
    sampling: Sampling | None = None


def prompt_group_ids(samples: list[Sample]) -> list[int]:
    """Group ids that put together exactly the samples of one agent drawn from identical prompt tokens
    (``algorithm.norm_scope: prompt``), numbered in order of first appearance."""
    ids: dict[tuple, int] = {}
    return [ids.setdefault((s.agent, tuple(s.prompt_ids)), len(ids)) for s in samples]
