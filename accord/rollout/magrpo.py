"""Single-turn MAGRPO rollouts: sample K completions per agent, score joint actions, build Samples.

Per step, B task instances. For every agent, each instance's prompt is sampled K times; all prompts of
agents that share a policy go through one batched generation call. Joint actions are either
``aligned`` (the j-th samples of all agents: K joint actions per instance) or ``cross`` (all K^N
combinations). The team reward is called once for all joint actions of the step. Each sample's
return is its joint action's reward (aligned) or the mean over the joint actions containing it (cross);
the advantage group of a sample is (instance, agent).

Reward components: a task may also define ``reward_components`` with the reward's keyword contract,
returning one ``dict[str, float]`` per joint action with the key ``"total"`` (the team reward) and the
named parts of that reward (the writing task's levels, the code reward's stages), the same keys for
every joint action. When it exists it is called *instead of* ``reward`` (one call, so an expensive
reward, e.g. a sandbox run, is not paid twice); the trainer logs each part's mean as
``reward/<name>``. Tasks that define only ``reward`` (plain floats) are unchanged.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from accord.algorithms.advantages import cross_marginals
from accord.rollout.sample import Sample


class RewardError(ValueError):
    """The task's reward function returned something unusable; the message names the row and agent."""


@dataclass
class JointBatch:
    """The scored joint actions of one step."""

    instance: list[int]           # instance index (within the step) of each joint action
    choice: list[tuple[int, ...]]  # sample index of each agent in each joint action
    rewards: list[float]
    components: list[dict[str, float]] | None = None  # per joint action, when the task has reward_components

    def component_means(self) -> dict[str, float]:
        """Mean of each named reward component over the joint actions (empty without components)."""
        if not self.components:
            return {}
        return {key: sum(c[key] for c in self.components) / len(self.components) for key in self.components[0]}


def joint_actions(k: int, n_agents: int, mode: str) -> list[tuple[int, ...]]:
    """Sample-index tuples of the joint actions of one instance."""
    if mode == "aligned":
        return [(j,) * n_agents for j in range(k)]
    if mode == "cross":
        return list(itertools.product(range(k), repeat=n_agents))
    raise ValueError(f"unknown joint mode {mode!r}; choose aligned or cross")


def _invoke(fn: Callable, what: str, *, task_name: str, agents: tuple[str, ...], prompts: dict, completions: dict,
            columns: dict[str, list], row_ids: list[str]):
    """Call a task's ``reward`` or ``reward_components`` for a batch; what it raises stops the run, with context."""
    try:
        return fn(prompts=prompts, completions=completions, agents=agents, **columns)
    except Exception as err:  # re-raised with context: the user's reward code failed, the run must stop
        raise RewardError(
            f"the {what} of task {task_name!r} raised {type(err).__name__}: {err} while scoring {len(row_ids)} joint "
            f"actions (first row {row_ids[0]!r}); fix it (it must accept prompts=, completions=, agents= and "
            "**kwargs)"
        ) from err


def call_reward(reward_fn: Callable, *, task_name: str, agents: tuple[str, ...], prompts: dict, completions: dict,
                columns: dict[str, list], row_ids: list[str]) -> list[float]:
    """Call a team reward once for a batch and check its output, naming the row and agent on error."""
    n = len(row_ids)
    out = _invoke(reward_fn, "reward", task_name=task_name, agents=agents, prompts=prompts, completions=completions,
                  columns=columns, row_ids=row_ids)
    try:
        values = [float(v) for v in out]
    except (TypeError, ValueError) as err:
        raise RewardError(f"the reward of task {task_name!r} must return a list of floats, got {type(out).__name__}: "
                          f"{err}") from err
    if len(values) != n:
        raise RewardError(
            f"the reward of task {task_name!r} returned {len(values)} values for {n} joint actions; return one "
            "float per joint action (entry j of every completions list)"
        )
    for j, v in enumerate(values):
        if not math.isfinite(v):
            parts = ", ".join(f"{a}: {completions[a][j][:60]!r}" for a in agents)
            raise RewardError(
                f"the reward of task {task_name!r} is {v} for joint action {j} (row {row_ids[j]!r}; {parts}); "
                "return a finite float for every joint action"
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
            if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise RewardError(f"the reward_components of task {task_name!r} gave {key!r}: {value!r} for {where}; "
                                  "every part must be a finite float named by a str")
            clean[key] = float(value)
        totals.append(clean.pop("total"))
        parts.append(clean)
    return totals, parts


def score_joint_actions(task, agents: tuple[str, ...], rows: list[dict[str, Any]], texts: dict[str, list[list[str]]],
                        prompts: dict[str, list[str]], k: int, mode: str) -> JointBatch:
    """Build every joint action of the step and score them with one reward call."""
    combos = joint_actions(k, len(agents), mode)
    inst, choice = [], []
    for b in range(len(rows)):
        for c in combos:
            inst.append(b)
            choice.append(c)
    completions = {a: [texts[a][b][c[i]] for b, c in zip(inst, choice)] for i, a in enumerate(agents)}
    prompt_cols = {a: [prompts[a][b] for b in inst] for a in agents}
    keys = sorted({key for row in rows for key in row})
    columns = {key: [rows[b].get(key) for b in inst] for key in keys}
    row_ids = [str(rows[b].get("id", b)) for b in inst]
    if callable(getattr(task, "reward_components", None)):
        rewards, parts = call_reward_components(task.reward_components, task_name=task.name, agents=agents,
                                                prompts=prompt_cols, completions=completions, columns=columns,
                                                row_ids=row_ids)
        return JointBatch(inst, choice, rewards, parts)
    rewards = call_reward(task.reward, task_name=task.name, agents=agents, prompts=prompt_cols,
                          completions=completions, columns=columns, row_ids=row_ids)
    return JointBatch(inst, choice, rewards)


def sample_returns(batch: JointBatch, n_rows: int, n_agents: int, k: int, mode: str) -> torch.Tensor:
    """(B, N, K) return credited to each sample."""
    r = torch.tensor(batch.rewards, dtype=torch.float64)
    if mode == "aligned":
        per = r.view(n_rows, k)
        return per.unsqueeze(1).expand(n_rows, n_agents, k).clone()
    grid = r.view(n_rows, *([k] * n_agents))
    return torch.stack([cross_marginals(grid[b]) for b in range(n_rows)])


def build_samples(agents: tuple[str, ...], agent_policy: dict[str, str], prompt_ids: dict[str, list[list[int]]],
                  prompt_texts: dict[str, list[str]], gens: dict[str, list[list[Any]]], texts: dict[str, list[list[str]]],
                  returns: torch.Tensor, step_offset: int = 0, aligned: bool = True,
                  components: list[dict[str, float]] | None = None) -> list[Sample]:
    """Samples of a single-turn step; group id = instance * N + agent index (offset by ``step_offset``).

    ``extra["sample"]`` is the sample's index among its agent's K samples of the instance; aligned joint
    actions also get ``extra["joint"]`` = instance * K + sample, the joint action's index in the step's
    reward call, shared by the agents' samples of one joint action (cross mode: every combination of
    samples is a joint action, so a sample has no single joint id). With ``components`` (the joint actions'
    reward parts, aligned mode) ``extra["components"]`` holds the parts of the sample's joint action."""
    out = []
    n = len(agents)
    for b in range(returns.size(0)):
        for i, a in enumerate(agents):
            for s, g in enumerate(gens[a][b]):
                ret = float(returns[b, i, s])
                out.append(Sample(
                    agent=a, policy=agent_policy[a], turn=0, group=step_offset + b * n + i, instance=b,
                    prompt_ids=prompt_ids[a][b], completion_ids=g.ids, logprobs=g.logprobs,
                    finish_reason=g.finish_reason, prompt_text=prompt_texts[a][b], completion_text=texts[a][b][s],
                    reward=ret, ret=ret,
                    extra={"sample": s, "joint": b * len(gens[a][b]) + s if aligned else None},
                ))
                if components and aligned:
                    out[-1].extra["components"] = components[b * len(gens[a][b]) + s]
    return out

