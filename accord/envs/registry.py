"""The task registry, and the single-turn form of a task.

Every task, single-turn or multi-turn, is registered here (:func:`register_task`) and built by
:func:`make_env` as an environment of :mod:`accord.envs.protocol`. A single-turn task may be written in
the simpler form below; it becomes a one-turn, simultaneous environment
(:class:`accord.envs.single_turn.SingleTurnEnv`) whose team reward keeps its batched call.

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
import importlib
import importlib.metadata
import inspect
import os
import sys
import types
from collections import Counter
from typing import Any, Callable, Protocol

from accord.config import ConfigError
from accord.config.base import MAX_TURNS
from accord.envs.protocol import Messages  # noqa: F401  (tasks import it from here too)


class Task(Protocol):
    """A single-turn task: role names ``agents``, instances ``rows(split, limit, seed)`` (dicts; train and eval
    never overlap), each agent's chat messages ``prompt(agent, row)``, and a team reward ``reward(*, prompts,
    completions, agents, **columns)`` with one value per joint action (TRL-style keywords: ``completions[agent][j]``
    is joint action j's completion of that agent, ``columns[field][j]`` its instance's field). Optional:
    ``reward_components`` (a dict of parts per joint action, ``total`` the reward) and ``success`` (the same
    keywords, a truth value per joint action: success rates and pass@k). Register it with :func:`register_task` or
    name it as ``module:Class`` in ``task.name``; docs/own-task.md."""

    name: str                   # optional in a task class: make_task names it by its registered name
    agents: tuple[str, ...]

    def rows(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]: ...

    def prompt(self, agent: str, row: dict[str, Any]) -> Messages: ...

    def reward(self, *, prompts: dict, completions: dict, agents: tuple[str, ...], **columns) -> list[float]: ...


class TaskError(ConfigError):
    """A task name or option is wrong (``task.name`` / ``task.options``, or a baseline that needs a task
    variant); the message says how to fix it."""


# instances a generated task may hold (built up front: far more fills the memory before the run starts)
MAX_TASK_SIZE = 1_000_000


def check_number(name: str, value: Any, lo: float, hi: float | None = None, integer: bool = False) -> Any:
    """``value`` within [lo, hi] (an int when ``integer``), else a :class:`TaskError` naming the option."""
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise TaskError(f"task.options.{name}={value!r}: must be {'an integer' if integer else 'a number'} {bound}")
    return value


def check_flag(name: str, value: Any) -> bool:
    """``value`` if it is a bool, else a :class:`TaskError` naming the option (a string such as 'false' would be
    truthy)."""
    if not isinstance(value, bool):
        raise TaskError(f"task.options.{name}={value!r}: must be true or false")
    return value


TASKS: dict[str, tuple[Callable[..., Task], str]] = {}


def register_task(name: str, description: str):
    """Decorator registering a task factory under ``name`` with a one-line description. A name is non-empty text
    without whitespace or ':' (a ':' marks ``module:attribute`` references and the adapters' ``pettingzoo:<env_id>``
    names); another name is a :class:`TaskError`."""
    if not isinstance(name, str) or not name or any(c.isspace() or c == ":" for c in name):
        problem = (f"is of type {type(name).__name__}, not text" if not isinstance(name, str)
                   else "is empty" if not name else "holds a ':'" if ":" in name else "holds whitespace")
        raise TaskError(f"register_task({name!r}, ...): the name {problem}; a task name is non-empty text without "
                        "whitespace or ':' (which marks module:attribute and adapter names), e.g. 'my_task'")

    def wrap(factory):
        if name in TASKS:
            raise TaskError(f"task {name!r} is registered twice")
        TASKS[name] = (factory, description)
        return factory

    return wrap


class TaskBuilder:
    """A task name and its options resolved once (see :func:`task_factory`; unknown options get the closest
    valid one in the error); each call builds a fresh task from them. A run builds one environment per
    episode through one of these, so user modules are looked up and options checked once per run."""

    def __init__(self, name: str, options: dict | None = None) -> None:
        self.name, self.options = name, dict(options or {})
        self.factory = task_factory(name)[0]
        params = inspect.signature(self.factory).parameters
        for key in self.options:
            if key not in params:
                close = difflib.get_close_matches(key, list(params), n=1)
                hint = f" did you mean {close[0]!r}?" if close else ""
                if key == "single_agent":  # set by algorithm.baseline=single_agent
                    hint += (" (algorithm.baseline=single_agent needs a task with a single-agent variant; use "
                             "baseline=centralized for a one-model baseline)")
                raise TaskError(f"task {name!r} has no option {key!r};{hint} valid options: {list(params)}")

    def __call__(self) -> Task:
        try:
            task = self.factory(**self.options)
        except ConfigError:
            raise
        except Exception as err:  # the task's own code failed: re-raised as one line, the original chained
            raise TaskError(f"task {self.name!r} could not be built with options {self.options}: "
                            f"{type(err).__name__}: {err}; fix the options or the task's code (--debug shows the "
                            "traceback)") from err
        except SystemExit as err:   # exit() in the task's code would end the run with its status and no word
            raise TaskError(f"task {self.name!r} called exit({err.code!r}) while being built; point task.name at a "
                            "task class or factory that returns a task") from err
        _name_task(self.name, task)
        _check_task(self.name, task)
        return task


def make_task(name: str, options: dict | None = None) -> Task:
    """Build a task: a registered name, a ``module:attribute`` reference or an ``accord.tasks`` entry
    point (see :func:`task_factory`); unknown names or options get the closest valid one in the error."""
    return TaskBuilder(name, options)()


def _name_task(name: str, task: Any) -> None:
    """A task without a ``name`` attribute is named by what it was made from: its registered name (or
    ``module:attribute``), which the registry knows already, so a task class need not repeat it."""
    if hasattr(task, "name"):
        return
    try:
        task.name = name
    except AttributeError as err:  # __slots__ or a read-only property
        raise TaskError(f"task {name!r} built a {type(task).__name__} that has no 'name' and takes none ({err}); give "
                        "the class a name attribute") from err


def as_env(task: Any):
    """A task as an environment of :mod:`accord.envs.protocol`: a single-turn task comes back as a one-turn,
    simultaneous :class:`~accord.envs.single_turn.SingleTurnEnv` (the one place where the two authoring forms
    are told apart), a multi-turn environment as it is."""
    from accord.envs.protocol import is_env
    from accord.envs.single_turn import SingleTurnEnv

    return task if is_env(task) else SingleTurnEnv(task)


def make_env(name: str, options: dict | None = None):
    """:func:`make_task`, as an environment (:func:`as_env`)."""
    return as_env(make_task(name, options))


# --- tasks from the user's own modules ----------------------------------------------------------

ENTRY_POINT_GROUP = "accord.tasks"
"""Installed packages provide tasks under this entry-point group: ``name = "pkg.module:MyTask"``
(a task class or factory) or ``name = "pkg.module"`` (a module whose ``@register_task(name)`` runs on import)."""


def task_factory(name: str) -> tuple[Callable[..., Task], str]:
    """(factory, description) of a task name, looked up in this order:

    1. a registered name (the built-in tasks, and those of modules already imported, e.g. ``imports:``);
    2. ``module:attribute`` (``my_pkg.my_tasks:MyTask``): the module is imported (the current directory
       is on the import path, as with ``python -m``) and the attribute is a task class or factory;
    3. an entry point of the group ``accord.tasks`` with that name, loaded only now.
    """
    if name in TASKS:
        return TASKS[name]
    scheme, _, env_id = name.partition(":")
    if scheme in EXTERNAL and env_id:
        return _external(scheme, env_id)
    if ":" in name:
        return _from_reference(name)
    if _load_entry_point(name):
        return TASKS[name]
    close = difflib.get_close_matches(name, list(TASKS), n=1)
    hint = f" did you mean {close[0]!r}?" if close else ""
    raise TaskError(f"unknown task {name!r};{hint} available: {sorted(TASKS)} (see `accord envs`); for a task in your "
                    "own module use task.name=my_module:MyTask, or list the module under `imports:`")


EXTERNAL = {  # task-name scheme -> the adapter module's factory maker (accord.envs.external)
    "pettingzoo": ("accord.envs.external.pettingzoo", "make_pettingzoo"),
    "textarena": ("accord.envs.external.textarena", "make_textarena"),
    "gymnasium": ("accord.envs.external.gymnasium", "make_gymnasium"),
}
"""``pettingzoo:<env_id>``, ``textarena:<env_id>`` and ``gymnasium:<env_id>`` name other libraries' environments
through accord's adapters (docs/pettingzoo.md); the library is imported only when such a task is built."""


def _external(scheme: str, env_id: str) -> tuple[Callable[..., Task], str]:
    module, attr = EXTERNAL[scheme]
    factory = getattr(importlib.import_module(module), attr)(env_id)
    return factory, f"{scheme} environment {env_id} (accord adapter, docs/pettingzoo.md)"


def import_modules(modules: list[str] | tuple[str, ...], what: str = "imports") -> None:
    """Import each module (for its ``@register_task`` calls), with the current directory on the path."""
    for module in modules:
        _import_module(module, f"{what}: {module!r}")


def entry_point_names() -> list[str]:
    """Names of the tasks installed packages provide under :data:`ENTRY_POINT_GROUP` (none loaded)."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})


def _describe(obj: Any, origin: str) -> str:
    doc = inspect.getdoc(obj) or ""
    first = doc.strip().splitlines()[0] if doc.strip() else ""
    return f"{first} ({origin})" if first else f"({origin})"


def _import_module(module: str, what: str) -> types.ModuleType:
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.append(cwd)  # like `python -m`, but after the installed packages: a local file never shadows them
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if module == missing or module.startswith(missing + "."):
            fix = (f"run accord from the directory that contains {module.split('.')[0]!r}, add that directory to "
                   "PYTHONPATH, or pip install the package that provides it")
        else:
            fix = f"install {missing!r} or fix the import in module {module!r}"
        raise TaskError(f"{what}: module {module!r} does not import (ModuleNotFoundError: {err}); {fix}") from err
    except Exception as err:  # the module's own code failed: re-raised as one line, the original chained
        raise TaskError(f"{what}: module {module!r} does not import ({type(err).__name__}: {err}); fix the module "
                        "so that `python -c 'import " + module + "'` works") from err
    except SystemExit as err:   # sys.exit() at import would end the command with its status and no word
        raise TaskError(f"{what}: module {module!r} called exit({err.code!r}) while being imported; a module listed "
                        "for accord must not exit") from err


def _from_reference(ref: str) -> tuple[Callable[..., Task], str]:
    module, _, attr = ref.partition(":")
    if not module or not attr or not all(part.isidentifier() for part in module.split(".") + attr.split(".")):
        raise TaskError(f"task {ref!r} is not a module:attribute reference; write it as my_pkg.my_module:MyTask "
                        "(a task class or a function that returns a task)")
    obj: Any = _import_module(module, f"task {ref!r}")
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f" did you mean {close[0]!r}?" if close else ""
            raise TaskError(f"task {ref!r}: module {module!r} has no attribute {attr!r};{hint} name the task class "
                            "or factory defined in that module")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TaskError(f"task {ref!r}: {attr!r} in module {module!r} is of type {type(obj).__name__}, not a task class or "
                        "factory; point task.name at a class or a function that returns a task")
    return obj, _describe(obj, ref)


def _load_entry_point(name: str) -> bool:
    """Load the ``accord.tasks`` entry point ``name`` (registering it); False when there is none."""
    eps = {ep.value: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name}
    if not eps:
        return False
    if len(eps) > 1:
        raise TaskError(f"task {name!r} is provided by several installed packages ({sorted(eps)}, entry-point group "
                        f"{ENTRY_POINT_GROUP!r}); uninstall all but one, or name one as task.name=module:attribute")
    (ep,) = eps.values()
    dist = getattr(getattr(ep, "dist", None), "name", "an installed package")
    try:
        obj = ep.load()
    except (ImportError, AttributeError, SyntaxError) as err:
        raise TaskError(f"task {name!r}: the entry point {ep.value!r} of {dist} (group {ENTRY_POINT_GROUP!r}) does not "
                        f"load ({type(err).__name__}: {err}); fix or reinstall {dist}") from err
    if name in TASKS:  # the module registered it with @register_task(name)
        return True
    if isinstance(obj, types.ModuleType) or not callable(obj):
        raise TaskError(f"task {name!r}: the entry point {ep.value!r} of {dist} gives a {type(obj).__name__} and "
                        f"registers no task {name!r}; point it at a task class or factory (module:attribute), or "
                        f"register the task in that module with @register_task({name!r}, ...)")
    TASKS[name] = (obj, _describe(obj, f"{dist}, entry point {ep.value}"))
    return True


_TASK_METHODS = ("rows", "prompt", "reward")
_ENV_METHODS = ("tasks", "reset", "step", "clone", "acting", "instructions")


def _check_task(name: str, task: Any) -> None:
    """A built task is a single-turn task or a multi-turn environment; else one line saying what it lacks."""
    from accord.envs.protocol import is_env

    lacks = [a for a in ("agents",) if not hasattr(task, a)]
    if is_env(task):
        lacks += [m for m in _ENV_METHODS if not callable(getattr(task, m, None))]
    else:   # reward_components (the parts, total among them) stands for reward: it is called instead
        lacks += [m for m in _TASK_METHODS if not callable(getattr(task, m, None))
                  and not (m == "reward" and callable(getattr(task, "reward_components", None)))]
    if lacks:
        raise TaskError(f"task {name!r} built a {type(task).__name__}, which is not a task: it lacks {lacks}; a "
                        "single-turn task needs agents, rows(), prompt() and reward(), a multi-turn environment "
                        "the protocol of accord/envs/protocol.py (see docs/own-task.md)")
    turns = getattr(task, "max_turns", None)
    if is_env(task) and (isinstance(turns, bool) or not isinstance(turns, int) or turns < 1):
        raise TaskError(f"task {name!r} ({type(task).__name__}) has " + ("no max_turns" if turns is None else
                        f"max_turns={turns!r}") + "; a multi-turn environment declares the most turns an episode "
                        "takes (rounds over its agents) as a positive int, e.g. max_turns = 4 in __init__")
    if is_env(task) and turns > MAX_TURNS:
        raise TaskError(f"task {name!r} has max_turns={turns}, more than {MAX_TURNS:,} turns (each a generate call per "
                        "agent); give the turns an episode should take (task.options.max_turns)")
    agents = task.agents
    if isinstance(agents, (str, bytes)) or not isinstance(agents, (tuple, list)) or not agents \
            or not all(isinstance(a, str) and a for a in agents):
        raise TaskError(f"task {name!r} has agents={agents!r}; give a non-empty tuple of role names, e.g. "
                        "agents = ('first', 'second')")
    repeated = sorted(a for a, n in Counter(agents).items() if n > 1)
    if repeated:
        raise TaskError(f"task {name!r} has agents={tuple(agents)!r}, which repeats {repeated}; give each role its "
                        "own name")
