"""TextArena's games as accord tasks: ``task.name: textarena:<env_id>`` (e.g. ``textarena:TicTacToe-v0``).

TextArena games are text games for one or more players that run offline. The adapter plays one game per
episode: agents ``player_0 .. player_{N-1}`` (``num_players``, default 2), turn-based in that order.

- **observations**: every message the game sent a player since its last move, as TextArena's own LLM
  wrapper formats them (``[GAME] ...``, ``[Player 1] ...``); the first one holds the game's rules and
  prompt. The model's history of earlier turns is accord's (``rollout.history_turns``).
- **actions**: the model's text goes to the game unchanged (with TextArena's default action wrappers, e.g.
  the bracket formatting of the board games); the game parses it. A text longer than ``max_move_chars``
  (8,000) is an invalid move, never handed to the game (some games parse in time quadratic in the text:
  16,000 characters took 1.5 s, a megabyte hours); so is a text the game raises on (a 5,000-digit cell
  number: Python refuses to read it), whatever its error.
- **what the other players see** of a player's text: at most :data:`SHOWN_CHARS` characters of each
  message (the rest cut, with a note of how much), and its lines after the first indented, so that a player
  cannot write a line that reads as the game's.
- **invalid moves**: TextArena lets a player retry an invalid move; accord's turn order is fixed, so a move
  the game asks its player to retry ends the episode with ``illegal_reward`` for that player (as for
  PettingZoo, :mod:`accord.envs.external.base`).
- **rewards**: the game's final per-player rewards (``env.close()``), 0 before the end; team reward ``sum``
  or one player's (``team_reward: player_0``).
- **clone()**: reset with the instance's seed and replay the texts; verified like every adapter.

Options: ``num_players`` (2), ``max_turns`` (10), ``team_reward``, ``illegal_reward`` (-1.0), ``size``
(1000), ``max_move_chars`` (8000), ``env_kwargs`` (the game's constructor arguments).
"""

from __future__ import annotations

import difflib
import logging
from typing import Any, Callable

from accord.envs.external.base import ReplayEnv
from accord.envs.registry import TaskError

logger = logging.getLogger(__name__)


SHOWN_CHARS = 2000
"""The most of one message of a player that the players' observations show."""
# what a game's own parsing of a model's text raises (a game bug, never the model's move, would be caught too: it
# ends the episode as that player's invalid move, warned once per game and error)
GAME_PARSE_ERRORS = (ValueError, IndexError, KeyError, TypeError, AttributeError, ArithmeticError, RecursionError,
                     AssertionError)


_WARNED: set[tuple[str, str]] = set()


def _shown(message: str) -> str:
    """A player's message as the observations show it: cut to :data:`SHOWN_CHARS`, later lines indented."""
    cut = len(message) - SHOWN_CHARS
    text = message[:SHOWN_CHARS] + (f" ... ({cut} more characters not shown)" if cut > 0 else "")
    return "\n  ".join(text.splitlines())


def _textarena():
    try:
        import textarena
    except ImportError as err:
        raise TaskError("task textarena:... needs the `textarena` package: pip install 'accord[envs]'") from err
    return textarena


class TextArenaEnv(ReplayEnv):
    """One TextArena game per episode (see the module docstring)."""

    def __init__(self, env_id: str, *, num_players: int = 2, max_turns: int = 10, team_reward: str = "sum",
                 illegal_reward: float = -1.0, size: int = 1000, max_move_chars: int = 8000,
                 env_kwargs: dict | None = None):
        ta = _textarena()
        from textarena.envs.registration import ENV_REGISTRY

        if env_id not in ENV_REGISTRY:
            close = difflib.get_close_matches(env_id, sorted(ENV_REGISTRY), n=1)
            hint = f" did you mean {close[0]!r}?" if close else ""
            raise TaskError(f"textarena:{env_id} is not a TextArena game;{hint} see textarena.envs.registration."
                            "ENV_REGISTRY for the names")
        if num_players < 1:
            raise TaskError(f"task.options.num_players={num_players} must be >= 1")
        if isinstance(max_move_chars, bool) or not isinstance(max_move_chars, int) or max_move_chars < 1:
            raise TaskError(f"task.options.max_move_chars={max_move_chars!r} must be a positive integer (the longest "
                            "text handed to the game as a move)")
        self.max_move_chars = max_move_chars
        self.env_id, self.num_players, self.env_kwargs = env_id, num_players, dict(env_kwargs or {})
        self._ta = ta
        self.name = f"textarena:{env_id}"
        self.agents = tuple(f"player_{i}" for i in range(num_players))
        super().__init__(max_turns=max_turns, team_reward=team_reward, illegal_reward=illegal_reward, size=size)
        self._check_team_mode()
        self._env = self._make()
        self._log: dict[int, list[str]] = {}
        self._seen: dict[int, int] = {}

    def instructions(self, agent: str) -> str:
        return (f"You are {agent.replace('_', ' ')} in the text game {self.env_id}. Follow the game's rules and "
                "answer with your move in the format the game asks for.")

    def _make(self):
        return self._ta.make(self.env_id, **self.env_kwargs)

    def _raw(self):
        env = self._env
        while isinstance(env, self._ta.Wrapper):
            env = env.env
        return env

    def _fresh(self) -> "TextArenaEnv":
        twin = object.__new__(TextArenaEnv)
        twin.__dict__.update(self.__dict__)
        twin._env, twin._log, twin._seen, twin._actions, twin._obs = self._make(), {}, {}, [], {}
        return twin

    def _drain(self) -> None:
        """Move the game's pending messages of every player into accord's log (the game's queue is emptied)."""
        state = self._raw().state
        names = state.role_mapping
        for pid in range(self.num_players):
            for sender, message, _ in state.observations.get(pid, []):
                game = sender == self._ta.GAME_ID
                who = "GAME" if game else names.get(sender, f"Player {sender}")
                self._log[pid].append(f"[{who}] {message if game else _shown(str(message))}")
            state.observations[pid] = []

    def _reset(self, seed: int) -> dict[str, str]:
        try:
            self._env.reset(num_players=self.num_players, seed=seed)
        except (ValueError, AssertionError, TypeError) as err:
            raise TaskError(f"{self.name} does not start with num_players={self.num_players} ({type(err).__name__}: "
                            f"{err}); set task.options.num_players to a number the game supports") from err
        self._log = {pid: [] for pid in range(self.num_players)}
        self._seen = {pid: 0 for pid in range(self.num_players)}
        self._drain()
        return self._observe()

    def _observe(self) -> dict[str, str]:
        return {a: "\n".join(self._log[i][self._seen[i]:]).strip() or "(no new messages)"
                for i, a in enumerate(self.agents)}

    def _parse(self, agent: str, text: str):
        # the game parses its moves; an invalid one is caught after the step (_apply), one too long to hand it here
        return text if len(text) <= self.max_move_chars else None

    def _apply(self, move: str) -> tuple[dict[str, float], bool, dict]:
        state = self._raw().state
        mover = state.current_player_id
        self._seen[mover] = len(self._log[mover])   # the mover saw everything up to its move
        info: dict[str, Any] = {}
        try:
            done, _ = self._env.step(action=move)
        except GAME_PARSE_ERRORS as err:   # the game's parsing of the text failed: an invalid move
            kind = (self.name, type(err).__name__)
            if kind not in _WARNED:   # once per game and error: a game bug would make every move invalid
                _WARNED.add(kind)
                logger.warning("%s raised on player %d's move (%s: %s); counted as an invalid move (this message "
                               "shows once per game and error)", self.name, mover, type(err).__name__,
                               " ".join(str(err).split())[:200])
            info.update(illegal=f"player_{mover}")
            return {f"player_{mover}": self.illegal_reward}, True, info
        self._drain()
        if done:
            rewards, _ = self._env.close()
            return {f"player_{pid}": float(r) for pid, r in (rewards or {}).items()}, True, info
        nxt = state.current_player_id
        if self.num_players > 1 and nxt == mover:   # the game asks for a retry: an invalid move
            info.update(illegal=f"player_{mover}")
            return {f"player_{mover}": self.illegal_reward}, True, info
        if nxt != (mover + 1) % self.num_players:
            raise TaskError(f"{self.name}: player {nxt} acts after player {mover}, but accord's turn-based "
                            f"environments act in the fixed order {list(self.agents)}; this game's turn order does "
                            "not rotate")
        return {}, False, info


def make_textarena(env_id: str) -> Callable[..., TextArenaEnv]:
    """The task factory of ``textarena:<env_id>`` (its keyword arguments are the task options)."""

    def factory(num_players: int = 2, max_turns: int = 10, team_reward: str = "sum", illegal_reward: float = -1.0,
                size: int = 1000, max_move_chars: int = 8000, env_kwargs: dict | None = None) -> TextArenaEnv:
        return TextArenaEnv(env_id, num_players=num_players, max_turns=max_turns, team_reward=team_reward,
                            illegal_reward=illegal_reward, size=size, max_move_chars=max_move_chars,
                            env_kwargs=env_kwargs)

    factory.__doc__ = f"TextArena game {env_id} (see accord.envs.external.textarena)"
    return factory
