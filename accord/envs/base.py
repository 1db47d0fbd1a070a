"""Single-turn cooperative tasks and their registry.

A task gives its agents (role names, in order), instances split into ``train`` and ``eval`` that never
overlap, each agent's chat prompt for an instance, and a team reward over a batch of joint actions.
Tasks know nothing of torch or models.

Team reward contract (TRL-style, keyword-only, called once per step with the whole batch):

    reward(*, prompts: dict[agent, list[str]], completions: dict[agent, list[str]],
           agents: tuple[str, ...], **columns) -> list[float]

Entry ``j`` of every list is joint action ``j``; ``columns`` holds each instance field repeated per
joint action (e.g. ``text``, ``id``); unknown keyword arguments must be accepted via ``**kwargs``.
It returns one finite float per joint action.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable, Protocol

Messages = list[dict[str, str]]


class Task(Protocol):
    name: str
    agents: tuple[str, ...]

    def rows(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]: ...

    def prompt(self, agent: str, row: dict[str, Any]) -> Messages: ...

    def reward(self, *, prompts: dict, completions: dict, agents: tuple[str, ...], **columns) -> list[float]: ...


class TaskError(ValueError):
    """A task name or option is wrong; the message says how to fix it."""


TASKS: dict[str, tuple[Callable[..., Task], str]] = {}


def register_task(name: str, description: str):
    """Decorator registering a task factory under ``name`` with a one-line description."""

    def wrap(factory):
        if name in TASKS:
            raise TaskError(f"task {name!r} is registered twice")
        TASKS[name] = (factory, description)
        return factory

    return wrap


def make_task(name: str, options: dict | None = None) -> Task:
    """Build a registered task; unknown names or options get the closest valid one in the error."""
    options = dict(options or {})
    if name not in TASKS:
        close = difflib.get_close_matches(name, list(TASKS), n=1)
        hint = f" did you mean {close[0]!r}?" if close else ""
        raise TaskError(f"unknown task {name!r};{hint} available: {sorted(TASKS)} (see `accord envs`)")
    factory = TASKS[name][0]
    params = inspect.signature(factory).parameters
    for key in options:
        if key not in params:
            close = difflib.get_close_matches(key, list(params), n=1)
            hint = f" did you mean {close[0]!r}?" if close else ""
            raise TaskError(f"task {name!r} has no option {key!r};{hint} valid options: {list(params)}")
    return factory(**options)
