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

With ``algorithm.credit: counterfactual`` a ``credit`` phase follows: every agent's sample is re-credited with
its Shapley credit (:mod:`accord.algorithms.credit`), the swapped joint actions of the whole step scored in
one more reward call. With ``training.audit`` on, the reward call is recorded (:mod:`accord.audit`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

from accord import metric_names as mn
from accord.algorithms.advantages import cross_marginals
from accord.algorithms.credit import counterfactual_credit, credit_rng
from accord.audit import AuditRecorder
from accord.config import ConfigError
from accord.config.rules import joint_mode_for
from accord.rollout.base import Generate, Phase, Played, Rollout, RolloutResult, register_rollout
from accord.envs.single_turn import (RewardError, SingleTurnEnv, call_reward, call_reward_components,  # noqa: F401
                                     declared)
from accord.rollout.sample import Sample


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


def score_joint_actions(env, agents: tuple[str, ...], rows: list[dict[str, Any]], texts: dict[str, list[list[str]]],
                        prompts: dict[str, list[str]], k: int, mode: str, recorder: AuditRecorder | None = None
                        ) -> JointBatch:
    """Build every joint action of the step and score them with one reward call (``env``: a
    :class:`~accord.envs.single_turn.SingleTurnEnv`, or a single-turn task, which is wrapped). ``recorder``
    (``training.audit``): each joint action is recorded under the key ``j<index>`` with the texts and
    instance ids exactly as the reward received them."""
    if not isinstance(env, SingleTurnEnv):
        env = SingleTurnEnv(env)
    combos = joint_actions(k, len(agents), mode)
    inst, choice = [], []
    for b in range(len(rows)):
        for c in combos:
            inst.append(b)
            choice.append(c)
    completions = {a: [texts[a][b][c[i]] for b, c in zip(inst, choice)] for i, a in enumerate(agents)}
    prompt_cols = {a: [prompts[a][b] for b in inst] for a in agents}
    row_ids = [str(rows[b].get("id", b)) for b in inst]
    rewards, parts = env.score([rows[b] for b in inst], prompt_cols, completions, row_ids, agents=agents)
    if recorder is not None:
        for idx, (rid, r) in enumerate(zip(row_ids, rewards)):
            recorder.score(f"j{idx}", {a: completions[a][idx] for a in agents}, {a: rid for a in agents}, r)
    return JointBatch(inst, choice, rewards, parts)


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
                    sampling=getattr(g, "sampling", None),
                ))
                if components and aligned:
                    out[-1].extra["components"] = components[b * len(gens[a][b]) + s]
    return out



@register_rollout("magrpo_joint")
class JointRollout(Rollout):
    """Single-turn MAGRPO (see the module docstring): one generate call per policy for all agents' prompts,
    then all joint actions of the step scored in one team-reward call."""

    phases = ("gen", "reward")

    def check(self) -> None:
        """A single-turn task (the config's rules against it: :func:`accord.config.rules.check_rollout`)."""
        if not isinstance(self.env, SingleTurnEnv):
            raise ConfigError(f"rollout {self.name!r} needs a single-turn task; {self.env.name!r} is a multi-turn "
                              "environment: use the magrpo_tree or atgrpo rollout")

    def sample(self, rows: list[dict], generate: Generate, k: int, greedy: bool):
        """Every agent's prompt for every row, sampled ``k`` times: (prompt ids, prompt texts, completions,
        completion texts), each keyed by agent and indexed [row][sample] (prompts: [row])."""
        requests = [(a, self.env.prompt(a, row)) for a in self.agents for row in rows]
        outs = iter(generate(requests, k, greedy))
        prompt_ids, prompt_texts, gens, texts = {}, {}, {}, {}
        reqs = iter(requests)
        for a in self.agents:
            prompt_ids[a], prompt_texts[a], gens[a], texts[a] = [], [], [], []
            for _ in rows:
                comps, (_, msgs) = next(outs), next(reqs)
                prompt_ids[a].append(comps[0].prompt_ids)
                prompt_texts[a].append(msgs[-1]["content"])
                gens[a].append(comps)
                texts[a].append([c.text for c in comps])
        return prompt_ids, prompt_texts, gens, texts

    def collect(self, rows: list[dict], generate: Generate, *, step: int, phase: Phase) -> RolloutResult:
        algo = self.cfg.algorithm
        k = algo.num_generations
        mode = algo.joint_mode or joint_mode_for(self.cfg, "magrpo_joint", len(self.agents),   # null: as check_rollout
                                                 declared(self.env, "joint_mode"))
        with phase("gen"):
            prompt_ids, prompt_texts, gens, texts = self.sample(rows, generate, k, greedy=False)
        with phase("reward"):
            joint = score_joint_actions(self.env, self.agents, rows, texts, prompt_texts, k, mode,
                                        recorder=self.recorder)
            returns = sample_returns(joint, len(rows), len(self.agents), k, mode)
        metrics: dict[str, list[float]] = {mn.TEAM_REWARD: list(joint.rewards)}
        if algo.credit == "counterfactual":
            with phase("credit"):
                returns, credit_metrics = self.counterfactual(rows, texts, prompt_texts, joint, k, step)
            metrics.update(credit_metrics)
        samples = build_samples(self.agents, self.agent_policy, prompt_ids, prompt_texts, gens, texts, returns,
                                aligned=mode == "aligned", components=joint.components)
        if algo.credit == "counterfactual":
            for s in samples:   # the joint action's team reward, beside the credit the sample's return carries
                s.extra["team_reward"] = joint.rewards[s.extra["joint"]]
        if self.recorder is not None:
            self.mark_for_audit(samples, rows, joint)
        for key, value in joint.component_means().items():
            metrics[mn.component_key(key)] = [value]
        by_inst: dict[int, list[float]] = {}
        for b, r in zip(joint.instance, joint.rewards):
            by_inst.setdefault(b, []).append(r)
        metrics[mn.TEAM_REWARD_BEST] = [max(rs) for rs in by_inst.values()]
        return RolloutResult(samples, metrics)

    def mark_for_audit(self, samples: list[Sample], rows: list[dict], joint: JointBatch) -> None:
        """Audit fields of the step's samples: the joint actions (keys ``j<index>``) that contain each one, and
        the instance its prompt was rendered from; a single-turn group always comes from one prompt."""
        containing: dict[tuple[int, int, int], list[str]] = {}
        for idx, (b, c) in enumerate(zip(joint.instance, joint.choice)):
            for i in range(len(self.agents)):
                containing.setdefault((b, i, c[i]), []).append(f"j{idx}")
        for s in samples:
            i = self.agents.index(s.agent)
            s.extra.update(audit_keys=containing[(s.instance, i, s.extra["sample"])], prompt_shared=True,
                           prompt_state=str(rows[s.instance].get("id", s.instance)))

    def counterfactual(self, rows: list[dict], texts: dict, prompts: dict, joint: JointBatch, k: int,
                       step: int) -> tuple[torch.Tensor, dict[str, list[float]]]:
        """(B, N, K) counterfactual credits of the step's aligned joint actions (see
        :mod:`accord.algorithms.credit`): every swapped joint action of every instance scored in one reward
        call, and the credit diagnostics."""
        agents = self.agents

        def evaluate(requests: list[tuple[int, tuple[int, ...]]]) -> list[float]:
            completions = {a: [texts[a][b][c[i]] for b, c in requests] for i, a in enumerate(agents)}
            prompt_cols = {a: [prompts[a][b] for b, _ in requests] for a in agents}
            rewards, _ = self.env.score([rows[b] for b, _ in requests], prompt_cols, completions,
                                        [str(rows[b].get("id", b)) for b, _ in requests], agents=agents)
            return rewards

        recorded = [joint.rewards[b * k:(b + 1) * k] for b in range(len(rows))]
        labels = [f"instance {rows[b].get('id', b)!r}" for b in range(len(rows))]
        result = counterfactual_credit(agents, k, recorded, labels, evaluate,
                                       orderings=self.cfg.algorithm.credit_orderings,
                                       rng=credit_rng(self.cfg.run.seed, step))
        returns = torch.tensor(result.credits, dtype=torch.float64).permute(0, 2, 1).contiguous()
        return returns, result.metrics

    def play(self, rows: list[dict], generate: Generate, *, n: int, greedy: bool, seed: int,
             success: bool = True) -> Played:
        """``n`` joint actions per row (aligned), scored in one call; ``success``: also the task's success check."""
        _, prompt_texts, gens, texts = self.sample(rows, generate, n, greedy)
        return self.score(rows, prompt_texts, gens, texts, n, success=success)

    def score(self, rows: list[dict], prompt_texts: dict, gens: dict, texts: dict, n: int,
              success: bool = True) -> Played:
        """Score ``n`` aligned joint actions per row (``texts[agent][row][j]``, ``gens`` the completions) with the
        task's reward in one call; ``success``: also the task's success check."""
        from accord.tracking.eval_completions import joint_completion_rows

        joint = score_joint_actions(self.env, self.agents, rows, texts, prompt_texts, n, "aligned")
        ok = None
        if success:
            flat_rows = [rows[b] for b in range(len(rows)) for _ in range(n)]
            completions = {a: [texts[a][b][j] for b in range(len(rows)) for j in range(n)] for a in self.agents}
            prompts = {a: [prompt_texts[a][b] for b in range(len(rows)) for _ in range(n)] for a in self.agents}
            ok = self.env.success(flat_rows, prompts, completions,
                                  [str(rows[b].get("id", b)) for b in range(len(rows)) for _ in range(n)],
                                  agents=self.agents)
        results = []
        for b in range(len(rows)):
            per = []
            for j in range(n):
                idx = b * n + j
                rec = {"team": joint.rewards[idx]}
                if ok is not None:
                    rec["success"] = float(ok[idx])
                for a in self.agents:
                    rec[mn.agent_key(a, mn.AGENT_COMPLETION_LEN)] = len(gens[a][b][j].ids)
                per.append(rec)
            results.append(per)
        table = joint_completion_rows(rows, self.agents, prompt_texts, gens, texts, joint) if n == 1 else []
        return Played(results, table, joint.component_means())
