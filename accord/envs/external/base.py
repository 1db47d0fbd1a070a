"""What the adapters of other libraries' environments share: instances as seeds, ``clone()`` by seed plus
action replay (verified), team reward from per-agent rewards, and the one-line errors.

An adapter wraps one live environment of another library. accord's protocol needs three things those
libraries do not give directly, and this base class supplies them:

- **task instances**: an external environment has none; an instance is a reset seed. ``tasks('train')``
  gives seeds ``0 .. size-1``, ``tasks('eval')`` seeds from ``10 * size`` on: the splits never overlap.
  ``reset(task, seed)`` resets the wrapped environment with the *task's* seed (the rollout's ``seed``
  argument is ignored, so an instance is the same episode start wherever it is played);
- **clone()**: a fresh environment reset with the same seed and fed the same actions (the parsed ones
  the wrapped environment received). Each clone is verified: its observations must equal the original's,
  else :class:`ReplayError` says the environment cannot be cloned by replay (it draws randomness that
  ``reset(seed=...)`` does not fix). Cost: one reset and ``t`` steps of the wrapped environment per clone
  at step ``t``;
- **illegal moves**: model text that does not parse into an action, or an action the environment marks
  illegal, ends the episode (as PettingZoo's ``TerminateIllegalWrapper`` does): the acting agent gets the
  local reward ``illegal_reward`` (default -1), the others 0, and ``info['illegal']`` names the agent. The
  wrapped environment never sees such a move, so a model never makes it raise.

Team reward (option ``team_reward``): ``sum`` of the agents' rewards of the step (local rewards are
always each agent's own), or the name of one agent whose reward is the team's (e.g. ``player_1`` in a
zero-sum game, where the sum is always 0 apart from illegal-move penalties).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from accord.envs.protocol import StepResult, check_step_actions
from accord.envs.registry import TaskError

logger = logging.getLogger(__name__)


class ReplayError(TaskError):
    """An external environment cannot be cloned by seed plus action replay; the message names it and the fix."""


class TextObservationError(TaskError):
    """An external environment's observations are not text and no renderer was given; the message says how."""


def first_int(text: str) -> int | None:
    """The first integer written in ``text`` (digits, optionally in brackets), or None; None also when it has
    more than 18 digits (no move is numbered so; Python refuses to read more than 4,300 digits)."""
    m = re.search(r"-?\d+", text)
    return int(m.group()) if m and len(m.group().lstrip("-")) <= 18 else None


class ReplayEnv:
    """Base of the adapters (see the module docstring). Subclasses implement ``_make`` (a fresh wrapped
    environment), ``_reset`` (reset it with a seed; the agents' observations), ``_apply`` (one step of
    parsed actions: per-agent rewards, done) and ``_observe`` (every agent's observation now), plus
    ``_parse`` (text -> action or None)."""

    name = "external"
    simultaneous = False
    success_check = False   # whether the adapter says in info["success"] whether an episode succeeded

    def __init__(self, *, max_turns: int, team_reward: str, illegal_reward: float, size: int):
        if max_turns < 1:
            raise TaskError(f"task.options.max_turns={max_turns} must be >= 1")
        if size < 1:
            raise TaskError(f"task.options.size={size} must be >= 1 (instances per split)")
        self.max_turns, self.team_mode, self.illegal_reward, self.size = max_turns, team_reward, illegal_reward, size
        self._seed: int | None = None
        self._actions: list[Any] = []      # what the wrapped environment received, in order
        self._obs: dict[str, str] = {}
        self._slot = 0
        self._done = False

    def _check_team_mode(self) -> None:
        if self.team_mode != "sum" and self.team_mode not in self.agents:
            raise TaskError(f"{self.name}: task.options.team_reward={self.team_mode!r} is neither 'sum' nor one of the "
                            f"agents {list(self.agents)}")

    # --- the protocol ----------------------------------------------------------------------------------
    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        base = 0 if split == "train" else 10 * self.size
        n = self.size if limit is None else min(limit, self.size)
        return [{"id": f"{split}-{base + i}", "seed": base + i} for i in range(n)]

    def reset(self, task: dict[str, Any], seed: int = 0) -> dict[str, str]:
        self._seed, self._actions, self._slot, self._done = int(task["seed"]), [], 0, False
        self._obs = self._reset(self._seed)
        return dict(self._obs)

    def acting(self) -> tuple[str, ...]:
        if self.simultaneous:
            return tuple(self.agents)
        return (self.agents[self._slot % len(self.agents)],)

    def step(self, actions: dict[str, str]) -> StepResult:
        check_step_actions(self, actions, started=self._seed is not None, done=self._done)
        acting = self.acting()
        parsed = {a: self._parse(a, actions[a]) for a in acting}
        illegal = [a for a in acting if parsed[a] is None]
        if illegal:
            local = {a: (self.illegal_reward if a in illegal else 0.0) for a in self.agents}
            self._done = True
            return StepResult(dict(self._obs), self._team(local), local, True,
                              {"illegal": illegal[0], **({"success": False} if self.success_check else {})})
        move = parsed if self.simultaneous else parsed[acting[0]]
        rewards, done, info = self._apply(move)
        self._actions.append(move)
        self._slot += len(acting)
        turns = self._slot // len(self.agents)
        self._done = bool(done) or turns >= self.max_turns
        self._obs = self._observe()
        local = {a: float(rewards.get(a, 0.0)) for a in self.agents}
        return StepResult(dict(self._obs), self._team(local), local, self._done, info)

    def _team(self, local: dict[str, float]) -> float:
        return sum(local.values()) if self.team_mode == "sum" else local[self.team_mode]

    def clone(self):
        """A fresh environment reset with the same seed and fed the same actions, checked against this one."""
        twin = self._fresh()
        if self._seed is not None:
            twin._seed, twin._obs = self._seed, twin._reset(self._seed)
            for move in self._actions:
                twin._apply(move)
            twin._actions, twin._slot, twin._done = list(self._actions), self._slot, self._done
            twin._obs = twin._observe() if self._actions else twin._obs
            if twin._obs != self._obs:
                agent = next(a for a in self.agents if twin._obs.get(a) != self._obs.get(a))
                raise ReplayError(f"{self.name} cannot be cloned by seed + action replay: replaying "
                                  f"{len(self._actions)} action(s) from seed {self._seed} gave agent {agent!r} "
                                  "another observation (the environment draws randomness that reset(seed=...) "
                                  "does not fix); make it deterministic given its seed, or wrap it in an accord "
                                  "environment with its own "
                                  "clone()")
        return twin

    def fingerprint(self) -> str:
        """The audit's state fingerprint (accord.audit): the seed and the actions replayed fix the state."""
        return f"{self.name}|{self._seed}|{self._actions!r}|{self._slot}|{self._done}"

    # --- for subclasses ----------------------------------------------------------------------------------
    def _fresh(self):
        raise NotImplementedError

    def _reset(self, seed: int) -> dict[str, str]:
        raise NotImplementedError

    def _apply(self, move) -> tuple[dict[str, float], bool, dict]:
        raise NotImplementedError

    def _observe(self) -> dict[str, str]:
        raise NotImplementedError

    def _parse(self, agent: str, text: str):
        raise NotImplementedError
