"""Gymnasium environments as one-agent accord tasks: ``task.name: gymnasium:<env_id>`` (e.g.
``gymnasium:FrozenLake-v1``), for the single-agent baseline on text-renderable environments.

One agent, ``agent``. Observations are the environment's ``ansi`` rendering (the toy-text environments:
FrozenLake, Taxi, CliffWalking, Blackjack have one), a ``str`` observation, or your own
``task.options.render: my_module:render`` (``render(observation, agent) -> str``); anything else stops with a
one-line :class:`~accord.envs.external.base.TextObservationError`. Actions: the first integer of the text
for a ``Discrete`` space, or ``task.options.parse: my_module:parse`` (``parse(text, agent, action_space)``);
a text that is no action ends the episode with ``illegal_reward`` (see :mod:`accord.envs.external.base`).
The step reward is the team and local reward; ``info['success']`` is true when the episode terminates
(not truncates) with a positive reward (reaching the goal in FrozenLake, winning in Blackjack).
``clone()`` resets with the instance's seed and replays the actions (Gymnasium seeds its random generator
in ``reset(seed=...)``, so slippery FrozenLake replays exactly).

Options: ``render``, ``parse``, ``max_turns`` (20), ``illegal_reward`` (-1.0), ``size`` (1000),
``env_kwargs`` (``gymnasium.make`` arguments, e.g. ``{is_slippery: false}``).
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Callable

from accord.envs.external.base import ReplayEnv, TextObservationError
from accord.envs.external.pettingzoo import OptionFunction, _discrete
from accord.envs.registry import TaskError


def plain_ansi(text: str) -> str:
    """Terminal colours out of an ``ansi`` rendering; a coloured span (FrozenLake's position, Taxi's cab) is kept
    visible in brackets: ``\x1b[41mS\x1b[0m`` -> ``[S]``."""
    text = re.sub(r"\x1b\[[0-9;]*m([^\x1b]*?)\x1b\[0m", r"[\1]", text)
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


class GymnasiumEnv(ReplayEnv):
    """A single-agent Gymnasium environment (see the module docstring)."""

    agents = ("agent",)
    success_check = True

    def __init__(self, env_id: str, *, render: str | None = None, parse: str | None = None, max_turns: int = 20,
                 illegal_reward: float = -1.0, size: int = 1000, env_kwargs: dict | None = None):
        try:
            import gymnasium
        except ImportError as err:
            raise TaskError("task gymnasium:... needs the `gymnasium` package: pip install 'accord[envs]'") from err
        if env_id not in gymnasium.registry:
            close = difflib.get_close_matches(env_id, sorted(gymnasium.registry), n=1)
            hint = f" did you mean {close[0]!r}?" if close else ""
            raise TaskError(f"gymnasium:{env_id} is not a registered Gymnasium environment;{hint}")
        self._gym, self.env_id, self.env_kwargs = gymnasium, env_id, dict(env_kwargs or {})
        self.name = f"gymnasium:{env_id}"
        self._render = OptionFunction(render, "render") if render else None
        self._parser = OptionFunction(parse, "parse") if parse else None
        super().__init__(max_turns=max_turns, team_reward="sum", illegal_reward=illegal_reward, size=size)
        self._env = self._make()
        self._last: Any = None

    def instructions(self, agent: str) -> str:
        return (f"You act in the environment {self.env_id}. Each turn you see its state and the legal actions; "
                "answer with one legal action.")

    def _make(self):
        kwargs = dict(self.env_kwargs)
        try:
            env = self._gym.make(self.env_id, **kwargs)
            if self._render is None and "render_mode" not in kwargs and \
                    "ansi" in (env.metadata.get("render_modes") or ()):
                env.close()
                env = self._gym.make(self.env_id, render_mode="ansi", **kwargs)
        except (TypeError, ValueError, self._gym.error.Error) as err:
            raise TaskError(f"{self.name} does not build with env_kwargs={kwargs} ({type(err).__name__}: {err}); fix "
                            "task.options.env_kwargs") from err
        return env

    def _fresh(self) -> "GymnasiumEnv":
        twin = object.__new__(GymnasiumEnv)
        twin.__dict__.update(self.__dict__)
        twin._env, twin._last, twin._actions, twin._obs = self._make(), None, [], {}
        return twin

    def _reset(self, seed: int) -> dict[str, str]:
        self._last, _ = self._env.reset(seed=seed)
        return self._observe()

    def _observe(self) -> dict[str, str]:
        if self._render is not None:
            board = self._render(self._last, "agent")
        elif isinstance(self._last, str):
            board = self._last
        elif self._env.render_mode == "ansi":
            board = plain_ansi(str(self._env.render()))
        else:
            raise TextObservationError(f"{self.name}: observations are {type(self._last).__name__} and the environment "
                                       "has no ansi rendering; give task.options.render=my_module:render (a function "
                                       "(observation, agent) -> str)")
        n = getattr(self._env.action_space, "n", None)
        tail = f"\nLegal actions: 0-{int(n) - 1}. Answer with one action number." if n is not None else ""
        return {"agent": board.rstrip() + tail}

    def _parse(self, agent: str, text: str):
        space = self._env.action_space
        return self._parser(text, agent, space) if self._parser else _discrete(text, space)

    def _apply(self, move) -> tuple[dict[str, float], bool, dict]:
        self._last, reward, terminated, truncated, _ = self._env.step(move)
        info = {"success": bool(terminated and reward > 0)}
        return {"agent": float(reward)}, bool(terminated or truncated), info


def make_gymnasium(env_id: str) -> Callable[..., GymnasiumEnv]:
    """The task factory of ``gymnasium:<env_id>`` (its keyword arguments are the task options)."""

    def factory(render: str | None = None, parse: str | None = None, max_turns: int = 20,
                illegal_reward: float = -1.0, size: int = 1000, env_kwargs: dict | None = None) -> GymnasiumEnv:
        return GymnasiumEnv(env_id, render=render, parse=parse, max_turns=max_turns, illegal_reward=illegal_reward,
                            size=size, env_kwargs=env_kwargs)

    factory.__doc__ = f"Gymnasium environment {env_id} (see accord.envs.external.gymnasium)"
    return factory
