"""The multi-turn, multi-agent text environment protocol.

An environment holds the state of one task instance. Agents (roles) act by writing text; the
environment parses that text, applies it, and answers with each agent's next observation, a team
reward, per-agent local rewards, a ``done`` flag and an info dict. Environments know nothing of torch
or models: they see strings and return strings and floats.

Two ways of taking turns:

- **turn-based** (``simultaneous = False``): within a turn the agents act one at a time, in the order
  of ``agents``; each :meth:`Env.step` takes exactly one agent's action, and the next agent's
  observation already reflects it (AT-GRPO's tool agent -> planner).
- **simultaneous** (``simultaneous = True``): one :meth:`Env.step` takes every agent's action of the turn
  (MAGRPO's writers).

:meth:`Env.acting` names the agent(s) the next ``step`` expects. A *turn* is one round over all agents.

Rewards are **increments**: the team reward of a step is what that step earned, so the return of an
episode is the sum over its steps. ``local_rewards`` has a key for every agent (0.0 for agents that
did not act in the step).

Agent text that cannot be parsed is a legal move with the penalty the environment documents: ``step``
never raises on model output. It raises only on protocol misuse (a step after ``done``, the wrong agent).

``clone()`` returns an independent copy of the state: stepping the copy never changes the original
(AT-GRPO steps each of K candidates on a clone; MAGRPO's tree branches on clones).

Task instances come from :meth:`Env.tasks`: plain dicts, generated from seeds or loaded from data; the
``train`` and ``eval`` splits never share an instance. Each has an ``id``: the task's own, or, for an
instance without one, a hash of its content that :func:`task_instances` adds (``accord train`` and the
conformance checker read instances through it alike, so both accept the same rows).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, runtime_checkable

Messages = list[dict[str, str]]


@dataclass
class StepResult:
    """What one :meth:`Env.step` returns."""

    observations: dict[str, str]       # every agent's observation after this step
    team_reward: float                 # team reward earned by this step (an increment)
    local_rewards: dict[str, float]    # every agent's local reward for this step (0.0 if it did not act)
    done: bool                         # the episode is over; no further step is allowed
    info: dict[str, Any] = field(default_factory=dict)  # e.g. ``success`` (bool), ``parse_error`` per agent


@runtime_checkable
class Env(Protocol):
    """A text environment for cooperating agents (see the module docstring for the contract)."""

    name: str
    agents: tuple[str, ...]   # role names, in turn order
    simultaneous: bool
    max_turns: int            # the episode is cut after this many turns (rounds over all agents)

    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        """Task instances of ``split`` ('train' or 'eval'), each with a unique ``id``."""
        ...

    def instructions(self, agent: str) -> str:
        """The system prompt of ``agent``: its role and the output format it must follow."""
        ...

    def reset(self, task: dict[str, Any], seed: int = 0) -> dict[str, str]:
        """Start an episode on ``task``; return every agent's first observation."""
        ...

    def acting(self) -> tuple[str, ...]:
        """The agent(s) whose actions the next :meth:`step` takes (all agents when simultaneous)."""
        ...

    def step(self, actions: dict[str, str]) -> StepResult:
        """Apply the acting agents' texts and return observations, rewards, ``done`` and info."""
        ...

    def clone(self) -> "Env":
        """An independent copy of the current state."""
        ...


def is_env(obj: Any) -> bool:
    """True for objects that follow the multi-turn :class:`Env` protocol (not single-turn tasks)."""
    return all(callable(getattr(obj, m, None)) for m in ("reset", "step", "clone", "acting", "instructions"))


def check_step_actions(env: Env, actions: Mapping[str, Any], *, started: bool, done: bool) -> None:
    """The checks every :meth:`Env.step` starts with. It raises, with the fix, for a step before
    ``reset`` or after ``done``, for actions keyed by agents other than ``env.acting()``, and for a
    text that is not a ``str`` (an action is never silently replaced)."""
    if not started:
        raise RuntimeError(f"{env.name}: step() before reset(); call reset(task) first")
    if done:
        raise RuntimeError(f"{env.name}: step() after the episode ended (done=True); call reset()")
    expected = env.acting()
    if set(actions) != set(expected):
        raise ValueError(f"{env.name}: this step takes the actions of {list(expected)} (turn order "
                         f"{list(env.agents)}), got actions for {sorted(actions)}")
    for agent in expected:
        if not isinstance(actions[agent], str):
            raise TypeError(f"{env.name}: the action of {agent!r} must be a str (the model's text), got "
                            f"{type(actions[agent]).__name__}")


class EnvOutputError(ValueError):
    """A task or environment returned something accord cannot use (a prompt that is not chat messages, a step
    result of the wrong shape); the message names the task, the method and what it must return."""


ROLES = ("system", "user", "assistant")


def check_messages(messages: Any, where: str) -> Any:
    """``messages`` if they are chat messages ending with the user's turn: a non-empty list of ``{"role": system|
    user|assistant, "content": str}``; else an :class:`EnvOutputError` naming ``where`` (a task's ``prompt``)."""
    if not isinstance(messages, list) or not messages:
        raise EnvOutputError(f"{where} must return a non-empty list of chat messages {{'role': ..., 'content': "
                             f"...}}, got {messages!r:.120}")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise EnvOutputError(f"{where} returned the message {m!r:.120}; each must be {{'role': one of "
                                 f"{list(ROLES)}, 'content': a str}}")
    if messages[-1]["role"] != "user":
        raise EnvOutputError(f"{where} must end with the user's message (the model answers it), got a "
                             f"{messages[-1]['role']!r} message last")
    return messages


def check_step_result(env: Any, res: Any) -> Any:
    """``res`` if it is a :class:`StepResult` whose rewards are finite numbers (a local reward for every agent),
    observations text and ``done`` a bool; else an :class:`EnvOutputError` naming the environment. The shape
    ``accord envs --check`` checks, enforced on every step of a run, so that a text reward, a ``done`` given as
    text or a missing agent's reward is not read as something else."""
    name = _env_name(env)
    if not isinstance(res, StepResult):
        raise EnvOutputError(f"environment {name!r}: step() must return a StepResult, got {type(res).__name__}")
    problem = None
    if not finite_number(res.team_reward):
        problem = f"team_reward must be a finite number, got {res.team_reward!r:.60}"
    elif not isinstance(res.local_rewards, dict) or set(res.local_rewards) != set(env.agents):
        problem = f"local_rewards must hold a reward for each agent {list(env.agents)}, got {res.local_rewards!r:.120}"
    elif not all(finite_number(v) for v in res.local_rewards.values()):
        problem = f"every local reward must be a finite number, got {res.local_rewards!r:.120}"
    elif not isinstance(res.done, bool):
        problem = f"done must be a bool, got {res.done!r:.60}"
    elif not isinstance(res.observations, dict) or not all(isinstance(v, str) for v in res.observations.values()):
        problem = f"observations must map agents to text, got {res.observations!r:.120}"
    elif not res.done and not set(env.agents) <= set(res.observations):
        problem = (f"observations must hold one for each agent {list(env.agents)} while the episode goes on, got "
                   f"{sorted(map(str, res.observations))}")
    elif not isinstance(res.info, dict):
        problem = f"info must be a dict (empty for nothing to say), got {type(res.info).__name__}"
    if problem is not None:
        raise EnvOutputError(f"environment {name!r}: step() returned a StepResult whose {problem}")
    return res


def _env_name(env: Any) -> str:
    return getattr(env, "name", type(env).__name__)


def _accords(err: Exception) -> bool:
    """An error of accord's own (a sandbox or checker that could not start, a replay that diverged, a bad step
    result): it names its cause already and passes unchanged."""
    return type(err).__module__.split(".")[0] == "accord"


# characters of an environment's exception message kept in the error (it may quote a model's whole move)
RAISED_MESSAGE_CHARS = 300


def _raised(env: Any, call: str, err: Exception, fix: str) -> EnvOutputError:
    message = str(err)
    if len(message) > RAISED_MESSAGE_CHARS:
        message = f"{message[:RAISED_MESSAGE_CHARS]}... ({len(message)} characters)"
    return EnvOutputError(f"environment {_env_name(env)!r}: {call} raised {type(err).__name__}: {message}; {fix} "
                          "(--debug shows the traceback)")


def call_env(env: Any, call: str, fix: str, method: Any, *args: Any, **kwargs: Any) -> Any:
    """``method(*args, **kwargs)`` of ``env``; an exception from the environment's own code becomes an
    :class:`EnvOutputError` naming the environment and ``call`` (the original chained: ``--debug`` shows it).
    ``OSError``, ``MemoryError`` and accord's own errors pass unchanged (a full disk, a sandbox that cannot
    start: not the environment's code at fault)."""
    try:
        return method(*args, **kwargs)
    except (OSError, MemoryError):
        raise
    except Exception as err:  # re-raised with the environment named: its code failed, the run must stop
        if _accords(err):
            raise
        raise _raised(env, call, err, fix) from err


def step_env(env: Any, actions: Mapping[str, str]) -> Any:
    """``env.step(actions)``, checked (:func:`check_step_result`); an exception from the environment's own code
    is named (:func:`call_env`). Every step of a run goes through here."""
    res = call_env(env, "step()", "an environment must take any text as a move (`accord envs --check` tries some)",
                   env.step, actions)
    return check_step_result(env, res)


def reset_env(env: Any, task: Mapping[str, Any], seed: int) -> dict[str, str]:
    """``env.reset(task, seed=seed)``: the agents' observations as text, else an :class:`EnvOutputError`; an
    exception from the environment's code is named as in :func:`step_env`."""
    where = task.get("id") if isinstance(task, Mapping) else None
    obs = call_env(env, f"reset(task {where!r})", "fix its reset or the task's row", env.reset, task, seed=seed)
    if not isinstance(obs, dict) or not all(isinstance(v, str) for v in obs.values()):
        raise EnvOutputError(f"environment {_env_name(env)!r}: reset() must return the agents' observations as "
                             f"text, got {obs!r:.120}")
    if not set(env.agents) <= set(obs):
        raise EnvOutputError(f"environment {_env_name(env)!r}: reset() must return an observation for each agent "
                             f"{list(env.agents)}, got {sorted(map(str, obs))}")
    return dict(obs)


def env_instructions(env: Any, agent: str) -> str:
    """``env.instructions(agent)``, the system message of the agent's prompts: text, else an
    :class:`EnvOutputError`; an exception from the environment's code is named as in :func:`step_env`."""
    text = call_env(env, f"instructions({agent!r})", "fix its instructions", env.instructions, agent)
    if not isinstance(text, str):
        raise EnvOutputError(f"environment {_env_name(env)!r}: instructions({agent!r}) must return text (the agent's "
                             f"system message), got {type(text).__name__}")
    return text


def array_bool(value: Any) -> bool:
    """A NumPy or torch bool (``np.bool_``, a bool tensor): a pass/fail, not a number, like Python's bool."""
    return str(getattr(value, "dtype", "")) in ("bool", "torch.bool")


def finite_number(value: Any) -> bool:
    """Whether ``value`` is a reward: a finite number, neither text (``float('0.5')`` would read it) nor a bool."""
    if isinstance(value, (str, bytes, bool)) or array_bool(value):
        return False
    try:
        return math.isfinite(value)
    except (TypeError, ValueError, OverflowError):   # not a number; an array of several; an int past float's range
        return False


def _canonical(value: Any) -> Any:
    """A JSON stand-in for a row value JSON cannot hold, the same in every process: a set by its sorted members, a
    NumPy array or torch tensor by its values, bytes by their hex; another object by its ``repr`` unless that
    names a memory address (``<object at 0x...>``, different in each process): an :class:`EnvOutputError`."""
    if isinstance(value, (set, frozenset)):
        return {"set": sorted(json.dumps(v, sort_keys=True, default=_canonical, ensure_ascii=False) for v in value)}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).hex()}
    if callable(getattr(value, "tolist", None)):   # numpy / torch values
        return value.tolist()
    text = repr(value)
    if " at 0x" in text:
        raise EnvOutputError(f"an instance without an 'id' holds a value of type {type(value).__name__} whose repr "
                             f"({text[:60]}) differs in each process, so no id can be made from its content; give the "
                             "instance an 'id', or give it JSON values")
    return text


def instance_id(row: Mapping[str, Any]) -> str:
    """The id of an instance that has none: ``row-`` and 16 hex digits of the SHA-256 of its content (keys
    sorted; values that are not JSON by a stand-in that is the same in every process: a set's sorted members, an
    array's values, another object's ``repr``), so equal content gets equal ids in any split and any process, and
    an eval instance equal to a training one is caught as an overlap."""
    try:
        text = json.dumps(dict(row), sort_keys=True, separators=(",", ":"), default=_canonical, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as err:   # keys of mixed types; a row that holds itself
        raise EnvOutputError(f"an instance without an 'id' cannot be hashed into one ({err}); give the instance an "
                             "'id', or give it JSON values under text keys") from err
    return "row-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def task_instances(env: Any, split: str, limit: int | None = None, seed: int = 0) -> list[Any]:
    """``env.tasks(split, limit, seed)``, each dict without an ``id`` given :func:`instance_id` (a copy; the
    task's rows are not changed; a tuple is read as a list). An entry that is not a dict is passed through for the
    caller to refuse; an exception from the environment's code, or instances that are no list, is an
    :class:`EnvOutputError`."""
    rows = call_env(env, f"tasks({split!r})", "fix its instances (a task's rows)", env.tasks, split, limit=limit,
                    seed=seed)
    if isinstance(rows, tuple):
        rows = list(rows)
    if not isinstance(rows, list):
        raise EnvOutputError(f"environment {_env_name(env)!r}: the {split} instances (tasks(), a task's rows()) must "
                             f"be a list of dicts, got {type(rows).__name__}; return a list")
    return [{**row, "id": instance_id(row)} if isinstance(row, dict) and "id" not in row else row for row in rows]
