"""Any PettingZoo environment as an accord task: ``task.name: pettingzoo:<env_id>``.

``<env_id>`` is a PettingZoo module name (``tictactoe_v3``, searched in the families classic, butterfly,
sisl, mpe, atari), a family-qualified one (``classic.connect_four_v3``), or ``my_module:make_env`` for your
own environment (a callable returning an AEC or a Parallel environment). AEC environments become
turn-based accord environments (agents act in the order of ``possible_agents``, which must be the
environment's turn order); Parallel environments (``parallel: true`` for a module that has both, or a
factory returning one) become simultaneous ones.

Agents are the environment's agent names (``player_1``, ``player_2``), so ``agents:`` in a config lists
them. Observations must be text or text-renderable:

- an observation that is a ``str`` (or a dict with a ``str`` under ``observation``) is used as it is;
- built-in renderers draw the boards of ``tictactoe_v3`` and ``connect_four_v3`` and the last moves of
  ``rps_v2`` from their arrays;
- ``task.options.render: my_module:render`` names your own ``render(observation, agent) -> str``;
- otherwise the first ``reset`` stops with a one-line :class:`TextObservationError`.

Actions: for a ``Discrete(n)`` action space the first integer in the model's text (rps also takes the words
rock, paper, scissors); ``task.options.parse: my_module:parse`` names your own ``parse(text, agent,
action_space) -> action or None``. An action outside the space, or one the observation's ``action_mask``
forbids, is an illegal move (see :mod:`accord.envs.external.base`).

Each observation the model sees starts with its role and ends with the legal actions: ``You are player_1
in tictactoe_v3. <board> Legal actions: 0, 2, 4. Answer with the number of one legal action.``

Options: ``parallel``, ``render``, ``parse``, ``max_turns`` (default: 5 for tictactoe, 21 for connect four,
the cycles of rps, else 50), ``team_reward`` (``sum`` or an agent), ``illegal_reward`` (-1.0), ``size``
(instances per split, 1000), ``env_kwargs`` (keyword arguments of the environment's constructor).
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from typing import Any, Callable

from accord.envs.external.base import ReplayEnv, TextObservationError, first_int
from accord.envs.protocol import RAISED_MESSAGE_CHARS, EnvOutputError
from accord.envs.registry import TaskError, _import_module

FAMILIES = ("classic", "butterfly", "sisl", "mpe", "atari")
RPS = ("rock", "paper", "scissors")


def _board(obs: dict, rows: int, cols: int, numbered: bool) -> str:
    planes = obs["observation"]
    lines = []
    for r in range(rows):
        cells = []
        for c in range(cols):
            if planes[r][c][0]:
                cells.append("X")
            elif planes[r][c][1]:
                cells.append("O")
            else:
                cells.append(str(r * cols + c) if numbered else ".")
        lines.append(" ".join(cells))
    if not numbered:
        lines.append(" ".join(str(c) for c in range(cols)))
    return "\n".join(lines)


def render_tictactoe(obs: Any, agent: str) -> str:
    return "Board (X: yours, O: the opponent's, numbers: free cells):\n" + _board(obs, 3, 3, True)


def render_connect_four(obs: Any, agent: str) -> str:
    return ("Board, top row first (X: yours, O: the opponent's; drop a piece into a column 0-6):\n"
            + _board(obs, 6, 7, False))


def render_rps(obs: Any, agent: str) -> str:
    last = int(obs)
    return "The opponent has not moved yet." if last >= 3 else f"The opponent's last move: {RPS[last]}."


def parse_rps(text: str, agent: str, space) -> int | None:
    low = text.lower()
    found = [(low.find(w), i) for i, w in enumerate(RPS) if w in low]
    if found:
        return min(found)[1]
    return _discrete(text, space)


BUILTIN = {  # module name -> (renderer, parser or None, default max_turns)
    "tictactoe_v3": (render_tictactoe, None, 5),
    "connect_four_v3": (render_connect_four, None, 21),
    "rps_v2": (render_rps, parse_rps, None),
}


def _discrete(text: str, space) -> int | None:
    n = getattr(space, "n", None)
    value = first_int(text)
    if n is None or value is None:
        return None
    start = int(getattr(space, "start", 0))
    return value if start <= value < start + int(n) else None


def _callable(ref: str, key: str) -> Callable:
    """The function ``ref`` (module:function) names, its module imported with the current directory on the path
    as a task's module is; ``key``: the option that gives it (``task.options.KEY``), or ``name`` for the
    environment's own factory (``task.name=pettingzoo:module:function``)."""
    what = f"task.name=pettingzoo:{ref}" if key == "name" else f"task.options.{key}={ref!r}"
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise TaskError(f"{what} must be module:function")
    try:
        fn = getattr(_import_module(module, what), attr)
    except AttributeError as err:
        raise TaskError(f"{what}: module {module!r} has no {attr!r} ({err}); point it at a function of that "
                        "module") from err
    if not callable(fn):
        raise TaskError(f"{what} is not callable")
    return fn


class OptionFunction:
    """A user's ``task.options.render`` or ``parse`` function (:func:`_callable`), called so that what it raises,
    or a render that gives no text, is an :class:`~accord.envs.protocol.EnvOutputError` naming the option (not
    the environment, nor a move of the model)."""

    def __init__(self, ref: str, key: str):
        self.ref, self.key, self.fn = ref, key, _callable(ref, key)

    def __call__(self, *args: Any) -> Any:
        what = f"task.options.{self.key}={self.ref!r}"
        try:
            out = self.fn(*args)
        except (OSError, MemoryError):
            raise
        except Exception as err:   # the user's function failed: re-raised naming the option
            message = str(err)[:RAISED_MESSAGE_CHARS]
            raise EnvOutputError(f"{what} raised {type(err).__name__}: {message}; fix that function (a {self.key} "
                                 f"must {_MUST[self.key]})") from err
        if self.key == "render" and not isinstance(out, str):
            raise EnvOutputError(f"{what} returned {type(out).__name__}, not text; a render must {_MUST['render']}")
        return out


_MUST = {"render": "return the observation as a str for any observation",
         "parse": "return an action, or None for a text that is no action, for any text"}


def _known_ids() -> list[str]:
    import pettingzoo

    out = []
    for fam in FAMILIES:
        try:
            pkg = importlib.import_module(f"pettingzoo.{fam}")
        except ImportError:
            continue
        out += [m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name[-3:-1] == "_v"]
    return sorted(set(out)) or [pettingzoo.__name__]


def resolve(env_id: str, parallel: bool, env_kwargs: dict) -> tuple[Callable[[], Any], str]:
    """A factory of fresh wrapped environments for ``env_id``, and the module name (for built-in renderers)."""
    try:
        import pettingzoo  # noqa: F401
    except ImportError as err:
        raise TaskError("task pettingzoo:... needs the `pettingzoo` package: pip install 'accord[envs]'") from err
    if ":" in env_id:
        fn = _callable(env_id, "name")
        return (lambda: fn(**env_kwargs)), env_id.rsplit(":", 1)[1]
    family, _, name = env_id.rpartition(".")
    candidates = [f"pettingzoo.{family}.{name}"] if family else [f"pettingzoo.{f}.{name}" for f in FAMILIES]
    module = None
    for path in candidates:
        try:
            module = importlib.import_module(path)
            break
        except ModuleNotFoundError as err:
            if err.name and not path.startswith(err.name) and err.name not in path:
                raise TaskError(f"pettingzoo:{env_id} needs the package {err.name!r}: pip install "
                                f"'pettingzoo[{family or 'classic'}]' (or {err.name})") from err
        except ImportError as err:   # a family that moved or needs more (pettingzoo.mpe -> mpe2)
            if family:
                raise TaskError(f"pettingzoo:{env_id} does not import ({err}); install what it names") from err
    if module is None:
        close = difflib.get_close_matches(name, _known_ids(), n=1)
        hint = f" did you mean {close[0]!r}?" if close else ""
        raise TaskError(f"pettingzoo:{env_id} is not a PettingZoo environment;{hint} name a module such as "
                        "tictactoe_v3 or classic.connect_four_v3, or my_module:make_env for your own")
    ctor = getattr(module, "parallel_env" if parallel else "env", None)
    if ctor is None:
        raise TaskError(f"pettingzoo:{env_id} has no {'parallel_env' if parallel else 'env'}(); "
                        f"set task.options.parallel={'false' if parallel else 'true'}")
    return (lambda: ctor(**env_kwargs)), name


def _is_parallel(env: Any) -> bool:
    from pettingzoo.utils.env import AECEnv, ParallelEnv

    if isinstance(env, ParallelEnv):
        return True
    if isinstance(env, AECEnv):
        return False
    raise TaskError(f"the PettingZoo factory returned a {type(env).__name__}, neither an AEC nor a Parallel "
                    "environment (pettingzoo.AECEnv / pettingzoo.ParallelEnv)")


class PettingZooEnv(ReplayEnv):
    """A PettingZoo AEC (turn-based) or Parallel (simultaneous) environment (see the module docstring)."""

    def __init__(self, env_id: str, *, parallel: bool = False, render: str | None = None, parse: str | None = None,
                 max_turns: int | None = None, team_reward: str = "sum", illegal_reward: float = -1.0,
                 size: int = 1000, env_kwargs: dict | None = None):
        self.env_id = env_id
        self._factory, module = resolve(env_id, parallel, dict(env_kwargs or {}))
        builtin = BUILTIN.get(module, (None, None, None))
        self._render = OptionFunction(render, "render") if render else builtin[0]
        self._parser = OptionFunction(parse, "parse") if parse else builtin[1]
        probe = self._factory()
        self._env = probe
        self.simultaneous = _is_parallel(probe)
        self.agents = tuple(probe.possible_agents)
        self.name = f"pettingzoo:{env_id}"
        if max_turns is None:
            max_turns = builtin[2] or int(getattr(getattr(probe, "unwrapped", probe), "max_cycles", 0) or 0) or 50
        super().__init__(max_turns=max_turns, team_reward=team_reward, illegal_reward=illegal_reward, size=size)
        self._check_team_mode()
        self._last: dict[str, Any] = {}
        self.example_actions = tuple(str(i) for i in range(min(int(getattr(probe.action_space(self.agents[0]), "n", 0)),
                                                             10)))

    def instructions(self, agent: str) -> str:
        return (f"You are {agent} in the game {self.env_id} (PettingZoo). Each turn you see the game and the legal "
                "actions; answer with one legal action.")

    def _fresh(self) -> "PettingZooEnv":
        twin = object.__new__(PettingZooEnv)
        twin.__dict__.update(self.__dict__)
        twin._env, twin._last = self._factory(), {}
        twin._actions, twin._obs = [], {}
        return twin

    # --- wrapped environment --------------------------------------------------------------------------
    def _reset(self, seed: int) -> dict[str, str]:
        try:
            out = self._env.reset(seed=seed)
        except TypeError as err:
            raise TaskError(f"{self.name} cannot be cloned by seed + action replay: its reset() takes no seed "
                            f"({err}); accord needs reset(seed=...) to replay an episode") from err
        self._last = dict(out[0]) if self.simultaneous else {}
        return self._observe()

    def _raw(self, agent: str) -> Any:
        return self._last.get(agent) if self.simultaneous else self._env.observe(agent)

    def _text(self, agent: str) -> str:
        raw = self._raw(agent)
        if self._render is not None:
            board = self._render(raw, agent)
        elif isinstance(raw, str):
            board = raw
        elif isinstance(raw, dict) and isinstance(raw.get("observation"), str):
            board = raw["observation"]
        else:
            raise TextObservationError(
                f"{self.name}: the observations of agent {agent!r} are {type(raw).__name__}, not text; give "
                "task.options.render=my_module:render (a function (observation, agent) -> str) or use an "
                "environment with text observations")
        legal = self._legal(agent)
        tail = (f"Legal actions: {', '.join(map(str, legal))}. Answer with one legal action." if legal is not None
                else "")
        return f"You are {agent} in {self.env_id}.\n{board}\n{tail}".rstrip()

    def _legal(self, agent: str) -> list[int] | None:
        space = self._env.action_space(agent)
        n = getattr(space, "n", None)
        if n is None:
            return None
        raw = self._raw(agent)
        mask = raw.get("action_mask") if isinstance(raw, dict) else None
        if mask is not None and (self.simultaneous or self._env.agent_selection == agent):
            return [i for i in range(int(n)) if mask[i]]
        return list(range(int(n)))

    def _observe(self) -> dict[str, str]:
        return {a: self._text(a) for a in self.agents}

    def _parse(self, agent: str, text: str):
        space = self._env.action_space(agent)
        action = self._parser(text, agent, space) if self._parser else _discrete(text, space)
        if action is None:
            return None
        legal = self._legal(agent)
        return action if legal is None or action in legal else None

    def _apply(self, move) -> tuple[dict[str, float], bool, dict]:
        env = self._env
        if self.simultaneous:
            obs, rewards, terms, truncs, _ = env.step(dict(move))
            self._last.update(obs)
            done = not env.agents or all(terms.get(a) or truncs.get(a) for a in self.agents)
            return {a: float(r) for a, r in rewards.items()}, done, {}
        mover = env.agent_selection
        env.step(move)
        rewards = {a: float(r) for a, r in env.rewards.items()}
        ended = [a for a in env.agents if env.terminations.get(a) or env.truncations.get(a)]
        done = not env.agents or len(ended) == len(env.agents)
        while not done and env.agent_selection in ended:   # a dead agent's turn: PettingZoo's None step
            env.step(None)
            ended = [a for a in env.agents if env.terminations.get(a) or env.truncations.get(a)]
            done = not env.agents or len(ended) == len(env.agents)
        if not done:
            expected = self.agents[(self.agents.index(mover) + 1) % len(self.agents)]
            if env.agent_selection != expected:
                raise TaskError(f"{self.name}: {env.agent_selection!r} acts after {mover!r}, but accord's turn-based "
                                f"environments act in the fixed order {list(self.agents)}; wrap the environment so "
                                "that turns rotate, or write an accord environment for it")
        return rewards, done, {}


def make_pettingzoo(env_id: str) -> Callable[..., PettingZooEnv]:
    """The task factory of ``pettingzoo:<env_id>`` (its keyword arguments are the task options)."""

    def factory(parallel: bool = False, render: str | None = None, parse: str | None = None,
                max_turns: int | None = None, team_reward: str = "sum", illegal_reward: float = -1.0,
                size: int = 1000, env_kwargs: dict | None = None) -> PettingZooEnv:
        return PettingZooEnv(env_id, parallel=parallel, render=render, parse=parse, max_turns=max_turns,
                             team_reward=team_reward, illegal_reward=illegal_reward, size=size, env_kwargs=env_kwargs)

    factory.__doc__ = f"PettingZoo environment {env_id} (see accord.envs.external.pettingzoo)"
    return factory
