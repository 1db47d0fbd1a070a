"""A single-turn task as a one-turn, simultaneous environment of :mod:`accord.envs.protocol`.

Single-turn tasks are written in the simpler form of :mod:`accord.envs.registry` (``rows``, ``prompt``,
``reward``); :func:`accord.envs.registry.make_env` wraps every one of them in :class:`SingleTurnEnv`, so the
rest of the library sees one protocol. The adapter is a complete environment (``reset`` / ``step`` /
``clone``, checked by :func:`accord.envs.check.check_env` like any other): one step takes every agent's
text and ends the episode with the task's team reward.

It also keeps the batched form of the reward, :meth:`SingleTurnEnv.score`: single-turn MAGRPO scores
all joint actions of a step with **one** call of the task's reward (an expensive reward, such as a
sandbox run over a batch, is not paid per joint action). ``reward_components``, when the task defines
it, is called instead of ``reward`` (see :mod:`accord.rollout.magrpo`); ``success``, when defined, has
the same keyword contract and gives one bool per joint action (used by ``accord eval``).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from accord.envs.protocol import (Messages, StepResult, array_bool, call_env, check_messages, check_step_actions,
                                   finite_number)


class RewardError(ValueError):
    """The task's reward function returned something unusable; the message names the row and agent."""


_PASSED = ("prompts", "completions", "agents")   # what a reward gets besides the instance fields


def _invoke(fn: Callable, what: str, *, task_name: str, agents: tuple[str, ...], prompts: dict, completions: dict,
            columns: dict[str, list], row_ids: list[str]):
    """Call a task's ``reward`` or ``reward_components`` for a batch; what it raises stops the run, with context."""
    clash = next((k for k in columns if not isinstance(k, str) or k in _PASSED), None)
    if clash is not None:   # the call itself would fail, and the error would blame the reward's code
        why = "is no text" if not isinstance(clash, str) else f"is also the {what}'s argument of the agents' {clash}"
        raise RewardError(f"task {task_name!r}: an instance field {clash!r} (row {row_ids[0]!r}) {why}, and every "
                          f"field is passed to the {what} by its name; rename the field (a text key other than "
                          "prompts, completions and agents)")
    try:
        return fn(prompts=prompts, completions=completions, agents=agents, **columns)
    except Exception as err:  # re-raised with context: the user's reward code failed, the run must stop
        raise RewardError(
            f"the {what} of task {task_name!r} raised {type(err).__name__}: {err} while scoring {len(row_ids)} joint "
            f"actions (first row {row_ids[0]!r}); fix it (it must accept prompts=, completions=, agents= and "
            "**kwargs)"
        ) from err


def _reward_items(out: Any, what: str, task_name: str, kind: str) -> list:
    """The entries of a reward's (or success check's) output: a list, a tuple, or a 1-d NumPy array or torch tensor
    (its ``tolist()``: Python numbers, bools and text, checked as a list's); anything else (a dict, whose keys a
    loop would read, a string, whose characters it would, a set, in no order) is a :class:`RewardError`."""
    if isinstance(out, (list, tuple)):
        return list(out)
    if hasattr(out, "ndim") and hasattr(out, "tolist") and not isinstance(out, (str, bytes)):
        if out.ndim == 1:
            return out.tolist()
        raise RewardError(f"the {what} of task {task_name!r} returned a {out.ndim}-d {type(out).__name__}; return a "
                          f"list of {kind}, one per joint action")
    raise RewardError(f"the {what} of task {task_name!r} returned a {type(out).__name__}; return a list of {kind}, one "
                      "per joint action (entry j of every completions list)")


def call_reward(reward_fn: Callable, *, task_name: str, agents: tuple[str, ...], prompts: dict, completions: dict,
                columns: dict[str, list], row_ids: list[str], success: bool = False) -> list[float]:
    """Call a team reward once for a batch and check its output, naming the row and agent on error; ``success``:
    ``reward_fn`` is the task's success check, whose bools are read as 1.0 and 0.0."""
    n = len(row_ids)
    what, kind = ("success check", "bools") if success else ("reward", "floats")
    out = _invoke(reward_fn, what, task_name=task_name, agents=agents, prompts=prompts, completions=completions,
                  columns=columns, row_ids=row_ids)
    # float('0.5') and float(True) would pass: a reward is a number, neither text that reads as one nor a bool (the
    # rule of environments' step rewards); a success check's bools are its answer
    items = _reward_items(out, what, task_name, kind)
    refused = (str, bytes) if success else (str, bytes, bool)
    text = next(((j, v) for j, v in enumerate(items)
                 if isinstance(v, refused) or (not success and array_bool(v))), None)
    if text is not None:
        fix = " (float(passed) for a pass/fail reward)" if not isinstance(text[1], (str, bytes)) else ""
        raise RewardError(f"the {what} of task {task_name!r} returned {type(text[1]).__name__} {text[1]!r} for joint "
                          f"action {text[0]}; return a list of {kind}{fix}")
    try:
        values = [float(v) for v in items]
    except (TypeError, ValueError, OverflowError) as err:
        raise RewardError(f"the {what} of task {task_name!r} must return a list of {kind}, got {type(out).__name__}: "
                          f"{err}") from err
    if len(values) != n:
        raise RewardError(
            f"the {what} of task {task_name!r} returned {len(values)} values for {n} joint actions; return one "
            f"{kind[:-1]} per joint action (entry j of every completions list)"
        )
    for j, v in enumerate(values):
        if not math.isfinite(v):
            parts = ", ".join(f"{a}: {completions[a][j][:60]!r}" for a in agents)
            raise RewardError(
                f"the {what} of task {task_name!r} is {v} for joint action {j} (row {row_ids[j]!r}; {parts}); "
                f"return {'a bool' if success else 'a finite float'} for every joint action"
            )
    return values


def call_reward_components(components_fn: Callable, *, task_name: str, agents: tuple[str, ...], prompts: dict,
                           completions: dict, columns: dict[str, list],
                           row_ids: list[str]) -> tuple[list[float], list[dict[str, float]]]:
    """Call a task's ``reward_components`` once for a batch: (team rewards, the other parts per joint action).

    Each entry must be a mapping of str to finite float with a ``"total"`` key (the team reward) and the
    same keys as the first entry; errors name the row and what to return."""
    n = len(row_ids)
    out = _invoke(components_fn, "reward_components", task_name=task_name, agents=agents, prompts=prompts,
                  completions=completions, columns=columns, row_ids=row_ids)
    out = list(out) if isinstance(out, (list, tuple)) else out
    if not isinstance(out, list) or len(out) != n:
        got = f"{len(out)} values" if isinstance(out, list) else type(out).__name__
        raise RewardError(f"the reward_components of task {task_name!r} returned {got} for {n} joint actions; "
                          "return one dict {'total': reward, '<part>': value, ...} per joint action")
    totals, parts, keys = [], [], None
    for j, entry in enumerate(out):
        where = f"joint action {j} (row {row_ids[j]!r})"
        if not isinstance(entry, dict) or "total" not in entry:
            raise RewardError(f"the reward_components of task {task_name!r} gave {type(entry).__name__} for {where}; "
                              "return a dict with the key 'total' (the team reward) and one key per part")
        if keys is None:
            keys = set(entry)
        elif set(entry) != keys:
            raise RewardError(f"the reward_components of task {task_name!r} gave keys {sorted(entry)} for {where} and "
                              f"{sorted(keys)} for joint action 0; give every joint action the same parts")
        clean = {}
        for key, value in entry.items():
            if not isinstance(key, str) or not finite_number(value):   # the rule of call_reward and of step rewards
                raise RewardError(f"the reward_components of task {task_name!r} gave {key!r}: {value!r} for {where}; "
                                  "every part must be a finite float named by a str")
            clean[key] = float(value)
        totals.append(clean.pop("total"))
        parts.append(clean)
    return totals, parts


def _copies(texts: dict[str, list[str]]) -> dict[str, list[str]]:
    """The agents' lists of texts as new lists: a reward that edits what it is given (clears a list, replaces an
    entry) leaves the rollout's record of the completions as they were written."""
    return {a: list(v) for a, v in texts.items()}


def _columns(rows: list[dict[str, Any]]) -> dict[str, list]:
    """Each instance field as a column, one entry per joint action (``None`` where a row lacks it)."""
    keys = sorted({key for row in rows for key in row}, key=lambda k: (not isinstance(k, str), str(k)))
    return {key: [row.get(key) for row in rows] for key in keys}


class SingleTurnEnv:
    """One-turn, simultaneous environment over a single-turn task (``rows`` / ``prompt`` / ``reward``)."""

    simultaneous = True
    max_turns = 1

    def __init__(self, task):
        self.task = task
        self._row: dict[str, Any] | None = None
        self._done = False

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(self.task.agents)

    # --- the batched form (one reward call per step) -------------------------------------------------
    def prompt(self, agent: str, row: dict[str, Any]) -> Messages:
        """The task's chat prompt of ``agent`` for instance ``row`` (checked: :func:`check_messages`)."""
        call = f"prompt({agent!r}, row {row.get('id')!r})"
        return check_messages(call_env(self, call, "fix the task's prompt", self.task.prompt, agent, row),
                              f"task {self.name!r}: {call}")

    def score(self, rows: list[dict[str, Any]], prompts: dict[str, list[str]], completions: dict[str, list[str]],
              row_ids: list[str] | None = None, agents: tuple[str, ...] | None = None,
              ) -> tuple[list[float], list[dict[str, float]] | None]:
        """Team rewards of a batch of joint actions (entry ``j`` of every list is joint action ``j``, ``rows[j]``
        its instance) in one call of the task's reward; with ``reward_components``, also each one's parts.
        ``agents``: the order passed to the reward (default the task's)."""
        ids = row_ids or [str(row.get("id", j)) for j, row in enumerate(rows)]
        kwargs = dict(task_name=self.name, agents=tuple(agents or self.agents), prompts=_copies(prompts),
                      completions=_copies(completions), columns=_columns(rows), row_ids=ids)
        if callable(getattr(self.task, "reward_components", None)):
            return call_reward_components(self.task.reward_components, **kwargs)
        return call_reward(self.task.reward, **kwargs), None

    def success(self, rows: list[dict[str, Any]], prompts: dict[str, list[str]], completions: dict[str, list[str]],
                row_ids: list[str] | None = None, agents: tuple[str, ...] | None = None) -> list[bool] | None:
        """The task's ``success`` of each joint action, or None when the task defines no success check."""
        if not callable(getattr(self.task, "success", None)):
            return None
        ids = row_ids or [str(row.get("id", j)) for j, row in enumerate(rows)]
        values = call_reward(self.task.success, task_name=self.name, agents=tuple(agents or self.agents),
                             prompts=_copies(prompts), completions=_copies(completions), columns=_columns(rows),
                             row_ids=ids, success=True)
        return [v > 0.5 for v in values]

    # --- the environment protocol --------------------------------------------------------------------
    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        return self.task.rows(split, limit=limit, seed=seed)

    def instructions(self, agent: str) -> str:
        """The system part of the current instance's prompt (a role line before ``reset``)."""
        if self._row is not None:
            system = "\n".join(m["content"] for m in self.prompt(agent, self._row)[:-1])
            if system.strip():
                return system
        return f"You are the {agent} of the team task {self.name}; answer the request."

    def reset(self, task: dict[str, Any], seed: int = 0) -> dict[str, str]:
        self._row, self._done = task, False
        return {a: self.prompt(a, task)[-1]["content"] for a in self.agents}

    def acting(self) -> tuple[str, ...]:
        return self.agents

    def step(self, actions: dict[str, str]) -> StepResult:
        check_step_actions(self, actions, started=self._row is not None, done=self._done)
        row = self._row
        prompts = {a: [self.prompt(a, row)[-1]["content"]] for a in self.agents}
        completions = {a: [actions[a]] for a in self.agents}
        rewards, parts = self.score([row], prompts, completions)
        info: dict[str, Any] = {}
        success = self.success([row], prompts, completions)
        if success is not None:
            info["success"] = success[0]
        if parts is not None:
            info["components"] = parts[0]
        self._done = True
        return StepResult({a: "" for a in self.agents}, rewards[0], {a: 0.0 for a in self.agents}, True, info)

    def clone(self) -> "SingleTurnEnv":
        c = SingleTurnEnv(self.task)
        c._row, c._done = self._row, self._done
        return c


def declared(env: Any, name: str) -> Any:
    """What an environment declares as attribute ``name`` (a task's ``min_new_tokens`` or ``joint_mode``), or,
    for a single-turn task wrapped in :class:`SingleTurnEnv`, what the task object declares; None where neither
    does."""
    value = getattr(env, name, None)
    if value is None and isinstance(env, SingleTurnEnv):
        value = getattr(env.task, name, None)
    return value
