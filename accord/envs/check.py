"""Conformance checker for environments: run it on your own environment before training on it.

    from accord.envs.check import check_env
    check_env(lambda: MyEnv(), actions=["move right", "garbage"])

It checks, and raises :class:`EnvCheckError` naming the method at fault:

- **API shape**: ``name``, ``agents`` (non-empty tuple of unique strings), ``simultaneous``, ``max_turns``;
  ``tasks`` returns dicts with unique ids (an instance without an ``id`` key is identified by a hash of its
  content, as in ``accord train``: :func:`accord.envs.protocol.task_instances`) and disjoint train/eval
  splits, deterministic per seed;
  ``instructions`` returns a non-empty string per agent; ``reset`` returns a string observation for every
  agent; ``acting`` names agents in turn order; ``step`` returns a :class:`StepResult` with an observation
  and a finite local reward for every agent, a finite team reward (numbers, numpy scalars included; not bool or
  text) and a bool ``done``, as every step of a run must; a step after
  ``done`` raises;
- **robustness**: unparseable text (empty, random symbols, very long) is a legal move, never an exception;
- **seed determinism**: two fresh environments reset with the same task and seed and fed the same
  actions return identical observations, rewards and flags;
- **clone independence**: stepping a clone leaves the original's future unchanged, and the clone
  continues exactly as the original would;
- **single-turn tasks** (one-turn :class:`~accord.envs.single_turn.SingleTurnEnv`, what
  :func:`accord.envs.registry.make_env` builds from a task with ``rows`` / ``prompt`` / ``reward``): besides
  all of the above, ``prompt`` returns chat messages ending with a user message for every agent, and the
  batched reward returns one finite float per joint action for a batch that mixes instances and texts.

``accord envs --check NAME`` runs it on a registered task of either kind.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from accord.envs.protocol import Env, EnvOutputError, StepResult, check_step_result, task_instances
from accord.envs.single_turn import RewardError, SingleTurnEnv

GARBAGE = ("", "   ", "\x00\ufffd}{][", "lorem " * 2000, "```python\nwhile True: pass\n```", "🙂" * 50)


class EnvCheckError(AssertionError):
    """An environment breaks the protocol; the message names the method and what is wrong."""


def _fail(env: Any, method: str, problem: str) -> EnvCheckError:
    name = getattr(env, "name", type(env).__name__)
    return EnvCheckError(f"environment {name!r}: {type(env).__name__}.{method} {problem}")


def _check_attrs(env: Any) -> None:
    for attr in ("name", "agents", "simultaneous", "max_turns"):
        if not hasattr(env, attr):
            raise _fail(env, attr, "is missing; every environment declares name, agents, simultaneous and max_turns")
    for method in ("tasks", "instructions", "reset", "acting", "step", "clone"):
        if not callable(getattr(env, method, None)):
            raise _fail(env, method, "is missing or not callable")
    agents = env.agents
    if not isinstance(agents, tuple) or not agents or not all(isinstance(a, str) and a for a in agents):
        raise _fail(env, "agents", f"must be a non-empty tuple of role names, got {agents!r}")
    if len(set(agents)) != len(agents):
        raise _fail(env, "agents", f"has duplicate names: {agents!r}")
    if not isinstance(env.simultaneous, bool):
        raise _fail(env, "simultaneous", f"must be a bool, got {env.simultaneous!r}")
    if not isinstance(env.max_turns, int) or env.max_turns < 1:
        raise _fail(env, "max_turns", f"must be a positive int, got {env.max_turns!r}")


def _check_tasks(env: Env, n: int) -> list[dict]:
    splits = {}
    for split in ("train", "eval"):
        try:
            rows = task_instances(env, split, limit=n, seed=0)
        except TypeError as err:
            raise _fail(env, "tasks", f"must accept (split, limit=None, seed=0): {err}") from err
        if not isinstance(rows, list) or not rows:
            raise _fail(env, "tasks", f"returned no {split!r} instances (got {type(rows).__name__})")
        if len(rows) > n:
            raise _fail(env, "tasks", f"returned {len(rows)} {split!r} instances for limit={n}")
        ids = []
        for row in rows:
            if not isinstance(row, dict):
                raise _fail(env, "tasks", f"must return dicts (an 'id' key optional), got {row!r:.120}")
            if isinstance(row["id"], bool) or not isinstance(row["id"], (str, int)):
                raise _fail(env, "tasks", f"must give ids of text or integers, got {type(row['id']).__name__} "
                                          f"{row['id']!r:.60}")
            ids.append(row["id"])
        if len(set(ids)) != len(ids):
            raise _fail(env, "tasks", f"returned duplicate ids in split {split!r} (an instance without an 'id' is "
                                      "identified by its content: two equal instances)")
        again = task_instances(env, split, limit=n, seed=0)
        if [r["id"] for r in again] != ids:
            raise _fail(env, "tasks", f"is not deterministic: two calls with seed=0 gave different {split!r} ids")
        splits[split] = rows
    overlap = {r["id"] for r in splits["train"]} & {r["id"] for r in splits["eval"]}
    if overlap:
        raise _fail(env, "tasks", f"puts {len(overlap)} instances in both train and eval (e.g. {sorted(overlap)[:3]})")
    return splits["train"]


def _check_obs(env: Env, method: str, obs: Any) -> None:
    if not isinstance(obs, dict) or set(obs) != set(env.agents):
        got = sorted(obs) if isinstance(obs, dict) else type(obs).__name__
        raise _fail(env, method, f"must return an observation for every agent {list(env.agents)}, got {got}")
    for a, text in obs.items():
        if not isinstance(text, str):
            raise _fail(env, method, f"observation of {a!r} must be a str, got {type(text).__name__}")


def _check_result(env: Env, res: Any) -> StepResult:
    """What a run demands of every step (:func:`accord.envs.protocol.check_step_result`: finite number rewards,
    numpy scalars included, a bool ``done``), and besides an observation for every agent and a dict ``info``."""
    try:
        check_step_result(env, res)
    except EnvOutputError as err:
        raise _fail(env, "step", str(err).split("step() ", 1)[-1]) from err
    _check_obs(env, "step", res.observations)
    if not isinstance(res.info, dict):
        raise _fail(env, "step", f"info must be a dict, got {type(res.info).__name__}")
    return res


def _acting(env: Env, turn_slot: int) -> tuple[str, ...]:
    acting = env.acting()
    if not isinstance(acting, tuple) or not acting or not set(acting) <= set(env.agents):
        raise _fail(env, "acting", f"must return a non-empty tuple of agents, got {acting!r}")
    if env.simultaneous and tuple(acting) != tuple(env.agents):
        raise _fail(env, "acting", f"of a simultaneous environment must return every agent, got {acting!r}")
    if not env.simultaneous:
        if len(acting) != 1:
            raise _fail(env, "acting", f"of a turn-based environment must return one agent, got {acting!r}")
        expected = env.agents[turn_slot % len(env.agents)]
        if acting[0] != expected:
            raise _fail(env, "acting", f"must follow the turn order {list(env.agents)}: expected {expected!r}, "
                                       f"got {acting[0]!r}")
    return acting


def _fingerprint(res: StepResult) -> tuple:
    return (tuple(sorted(res.observations.items())), round(float(res.team_reward), 12),
            tuple(sorted((a, round(float(v), 12)) for a, v in res.local_rewards.items())), res.done)


def _play(env: Env, task: dict, seed: int, script: Sequence[str], start: int = 0) -> list[tuple]:
    """Step ``env`` (already reset) with actions drawn cyclically from ``script``; fingerprints of each step."""
    out, slot = [], start
    for _ in range(env.max_turns * len(env.agents)):
        acting = _acting(env, slot)
        actions = {a: script[(slot + i) % len(script)] for i, a in enumerate(acting)}
        res = _check_result(env, env.step(actions))
        out.append(_fingerprint(res))
        slot += len(acting)
        if res.done:
            break
    return out


def check_env(factory: Callable[[], Env], actions: Sequence[str] = (), *, n_tasks: int = 4, seed: int = 0) -> None:
    """Check that environments built by ``factory`` follow the protocol.

    ``actions`` are texts a competent agent might write (parseable moves); the checker mixes them with
    garbage. Raises :class:`EnvCheckError` naming the method at fault.
    """
    env = factory()
    _check_attrs(env)
    tasks = _check_tasks(env, n_tasks)
    for a in env.agents:
        text = env.instructions(a)
        if not isinstance(text, str) or not text.strip():
            raise _fail(env, "instructions", f"must return a non-empty string for agent {a!r}")
    script = list(actions) + list(GARBAGE)
    if isinstance(env, SingleTurnEnv):
        _check_batched(env, tasks[:n_tasks], script)
    rng = random.Random(seed)
    for task in tasks[:n_tasks]:
        # determinism: two fresh environments, same task, seed and actions
        order = script[:]
        rng.shuffle(order)
        runs = []
        for _ in range(2):
            e = factory()
            obs = e.reset(task, seed=seed)
            _check_obs(e, "reset", obs)
            runs.append((tuple(sorted(obs.items())), _play(e, task, seed, order)))
        if runs[0] != runs[1]:
            raise _fail(env, "reset/step", f"is not deterministic on task {task['id']!r}: two fresh environments "
                                           "with the same seed and actions diverged (seed every random choice "
                                           "from the task and the reset seed)")
        # a step after done must raise (protocol misuse), unless the episode was cut by max_turns alone
        e = factory()
        e.reset(task, seed=seed)
        steps = _play(e, task, seed, order)
        if steps and steps[-1][3]:
            acting = env.agents if env.simultaneous else (env.agents[0],)
            try:
                e.step({a: order[0] for a in acting})
            except (RuntimeError, ValueError):
                pass
            else:
                raise _fail(env, "step", "accepted a step after done=True; raise RuntimeError instead")
        # clone independence
        e = factory()
        e.reset(task, seed=seed)
        first = e.acting()
        res = _check_result(e, e.step({a: order[0] for a in first}))
        if res.done:
            continue
        slot = len(first)
        c = e.clone()
        if c is e:
            raise _fail(env, "clone", "returned the same object; return an independent copy")
        other = list(reversed(order))
        _play(c, task, seed, other, start=slot)
        ref = factory()
        ref.reset(task, seed=seed)
        ref.step({a: order[0] for a in first})
        expect = _play(ref.clone(), task, seed, order, start=slot)
        got = _play(e, task, seed, order, start=slot)
        if got != expect:
            raise _fail(env, "clone", f"is not independent on task {task['id']!r}: stepping a clone changed the "
                                      "original (copy mutable state such as grids and lists)")


def _check_batched(env: SingleTurnEnv, tasks: list[dict], script: Sequence[str]) -> None:
    """The single-turn form: prompts are chats, and one reward call scores a mixed batch of joint actions."""
    for task in tasks:
        for a in env.agents:
            msgs = env.prompt(a, task)
            if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                                for m in msgs) or msgs[-1].get("role") != "user":
                raise _fail(env, "prompt", f"must return chat messages ending with a user message for agent {a!r}, "
                                           f"got {msgs!r:.200}")
    rows = [task for task in tasks for _ in script]
    prompts = {a: [env.prompt(a, row)[-1]["content"] for row in rows] for a in env.agents}
    completions = {a: [script[(j + i) % len(script)] for j in range(len(rows))] for i, a in enumerate(env.agents)}
    try:
        env.score(rows, prompts, completions)
    except RewardError as err:
        raise _fail(env, "reward", f"fails on a batch of {len(rows)} joint actions: {err}") from err
