"""The rollout interface and its registry.

A rollout turns a batch of task instances into training samples: given the run's environment, the
agents and the policy acting for each, and a ``generate`` function, :meth:`Rollout.collect` returns the
step's :class:`~accord.rollout.sample.Sample` records (rewards and returns credited, advantage groups
assigned) and raw metric values; :meth:`Rollout.play` plays held-out instances without branching, for
evaluation. Rollouts know neither torch models nor the trainer: text comes from ``generate``.

Four implementations are registered (:func:`register_rollout`), and :func:`rollout_name` picks one from
the algorithm and the environment:

========================  ==============================================  ==============================
name                      what it samples                                 module
========================  ==============================================  ==============================
``magrpo_joint``          single-turn MAGRPO: K samples per agent, joint  :mod:`accord.rollout.magrpo`
                          actions scored in one team-reward call per step
``magrpo_tree``           multi-turn MAGRPO: a tree of joint actions      :mod:`accord.rollout.multiturn`
``atgrpo``                AT-GRPO: per turn and agent K candidates on     :mod:`accord.rollout.multiturn`
                          clones, the best advances
``episodes``              iac, maac, madpo on multi-turn environments:    :mod:`accord.rollout.episodes`
                          K independent sampled episodes per instance
========================  ==============================================  ==============================

The config's rules against the environment (agents, sizes, a tree's size, AT-GRPO's turn-based
environment, ...) are checked before a rollout is built, by :func:`accord.config.rules.check_rollout`
(from :func:`accord.build.check_run`); :meth:`Rollout.check` checks only that the environment object is of
the kind the rollout drives (called when it is built, before any model loads). The baselines are options of these: ``independent`` credits each
agent's local reward (tree) or sets ``alpha = 0`` (AT-GRPO); ``centralized`` and ``single_agent`` change
the environment (:func:`accord.build.build_env`), not the rollout.
"""

from __future__ import annotations

import difflib
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Callable

from accord.config import Config, ConfigError
from accord.config.rules import rollout_for
from accord.envs.protocol import Messages
from accord.rollout.sample import Sample

# generate(requests, n, greedy) -> for each (agent, messages) request, n completions
Generate = Callable[[list[tuple[str, Messages]], int, bool], list[list[Any]]]
# phase(name) -> a context manager timing the enclosed work as ``time/<name>``
Phase = Callable[[str], AbstractContextManager]


@dataclass
class RolloutResult:
    """One step's samples and raw metric values (the trainer averages each key over its values)."""

    samples: list[Sample]
    metrics: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class Played:
    """Held-out instances played without branching (``n`` trajectories or joint actions per instance)."""

    results: list[list[dict[str, float]]]    # per instance, n records: team, success, turns, agent/<a>/...
    table: list[dict]                         # the completions of the first trajectory of each instance
    components: dict[str, float] = field(default_factory=dict)   # mean reward parts (reward_components)


class Rollout:
    """Base class of rollouts: ``cfg``, the environment ``env``, ``make_env`` (a fresh environment per
    episode), the agents in turn order and the policy acting for each."""

    name = ""
    phases: tuple[str, ...] = ("rollout",)   # the ``time/<phase>`` metrics that collect() reports
    # training.audit: collect() records what it scored here (accord.audit.AuditRecorder); None: nothing recorded
    recorder = None

    def __init__(self, cfg: Config, env, make_env: Callable[[], Any], agents: tuple[str, ...],
                 agent_policy: dict[str, str]):
        self.cfg, self.env, self.make_env = cfg, env, make_env
        self.agents, self.agent_policy = tuple(agents), dict(agent_policy)
        self.check()

    def check(self) -> None:
        """Raise :class:`~accord.config.ConfigError` when the environment object is not of the kind this rollout
        drives (the config's rules against the environment: :func:`accord.config.rules.check_rollout`)."""

    def collect(self, rows: list[dict], generate: Generate, *, step: int, phase: Phase) -> RolloutResult:
        raise NotImplementedError

    def play(self, rows: list[dict], generate: Generate, *, n: int, greedy: bool, seed: int,
             success: bool = True) -> Played:
        """``n`` unbranched trajectories (or joint actions) per row; ``success``: also the task's success check."""
        raise NotImplementedError


ROLLOUTS: dict[str, type[Rollout]] = {}


def register_rollout(name: str):
    """Class decorator registering a :class:`Rollout` implementation under ``name``."""

    def wrap(cls):
        if name in ROLLOUTS:
            raise ValueError(f"rollout {name!r} is registered twice")
        cls.name = name
        ROLLOUTS[name] = cls
        return cls

    return wrap


def rollout_name(cfg: Config, env) -> str:
    """The rollout of an algorithm on an environment (:func:`accord.config.rules.rollout_for`): AT-GRPO's,
    sampled episodes (actor-critic and preference learning on a multi-turn environment), or MAGRPO's joint
    actions (a one-turn single-turn task) or tree (a multi-turn environment)."""
    from accord.envs.single_turn import SingleTurnEnv

    return rollout_for(cfg.algorithm.name, isinstance(env, SingleTurnEnv))


def make_rollout(name: str, cfg: Config, env, make_env, agents, agent_policy) -> Rollout:
    """Build the registered rollout ``name`` (it checks the config against the environment; the built-in
    rollouts are registered by importing :mod:`accord.rollout`)."""
    if name not in ROLLOUTS:
        close = difflib.get_close_matches(name, list(ROLLOUTS), n=1)
        hint = f" did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"rollout {name!r} is not registered;{hint} registered: {sorted(ROLLOUTS)}")
    return ROLLOUTS[name](cfg, env, make_env, agents, agent_policy)
