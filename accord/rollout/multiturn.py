"""Multi-turn rollouts over :mod:`accord.envs.protocol` environments: MAGRPO trees and AT-GRPO.

Both build :class:`accord.rollout.sample.Sample` records; they differ only in how they branch, which
reward a sample is credited with, and what its advantage group is. Neither knows torch models: text
comes from a ``complete`` callback that the trainer implements with one batched generate call per
policy.

**MAGRPO tree** (:func:`magrpo_tree`). Every node is an environment state. At a node each agent samples
K completions; joint actions are ``aligned`` (the j-th samples of all agents; K children) or ``cross``
(all K^N combinations; simultaneous environments only). Each joint action steps a clone of the node's
environment and becomes a child node unless the episode is done, the turn limit is reached, or (when
``early_stop_reward`` is set) its team reward reaches that threshold. The return of a joint action is
``G = r + gamma * mean(G of the child's joint actions)``; ``r`` is the team-reward increment of the
joint action (with ``reward_mode='local'``, each agent's own local reward: independent learners). A
sample is credited with the return of its joint action (aligned) or the mean return over the joint
actions that contain it (cross). The advantage group is (node, agent). In a turn-based environment
the agents of a joint action act in turn order: the j-th sample of a later agent is drawn from the
state after the j-th samples of the earlier agents (it sees them), so a node's K samples of a later
agent come from K sibling states.

Both are registered rollouts of :mod:`accord.rollout.base` (``magrpo_tree``: :class:`TreeRollout`,
``atgrpo``: :class:`ATGRPORollout`).

**AT-GRPO** (:func:`atgrpo_rollout`, turn-based environments). Each task instance keeps one real state.
At each turn, for each agent in turn order: K candidates are sampled from the same state; each steps
its own clone; each candidate's reward is ``alpha * team + local`` (its own step's increments); the K
candidates form the group (instance, turn, agent); the clone of the best candidate (first argmax)
becomes the real state, so the next agent of the same turn and every later turn see it. Every
candidate is a sample for its agent's policy. No returns across turns: the reward of the candidate's
step is its training signal, as in the paper.

Counterfactual credit (``algorithm.credit: counterfactual``, MAGRPO trees): each node's swapped joint actions
are replayed on clones of the node's environment (:func:`_tree_credit`). With ``training.audit`` on, every
step of a clone is recorded with the fingerprint of the state stepped (:mod:`accord.audit`).

Prompts: an agent's chat is its ``instructions`` as the system message, then its earlier
(observation, action) exchanges as user/assistant turns (the last ``history_turns`` of them; None keeps
all), then its current observation.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from accord import metric_names as mn
from accord.algorithms.credit import counterfactual_credit, credit_rng as step_credit_rng
from accord.audit import AuditRecorder, state_fingerprint
from accord.config import ConfigError
from accord.config.rules import joint_mode_for
from accord.envs.protocol import Env, Messages, StepResult, env_instructions, is_env, reset_env, step_env
from accord.rollout.base import Generate, Phase, Played, Rollout, RolloutResult, register_rollout
from accord.rollout.sample import Sample
from accord.seeding import episode_seed, rollout_seed

# complete(requests, n, greedy) -> for each (agent, messages) request, n completions
CompleteFn = Callable[[list[tuple[str, Messages]], int, bool], list[list[Any]]]


@dataclass
class Episode:
    """One agent-facing view of an environment: the env plus each agent's chat so far."""

    env: Env
    obs: dict[str, str]
    history: dict[str, list[tuple[str, str]]]   # agent -> [(observation, action), ...]
    turn: int = 0
    done: bool = False
    team_return: float = 0.0
    success: bool = False
    local_return: dict[str, float] = field(default_factory=dict)
    success_reported: bool = False   # a step's info held "success": the environment has a success check

    def copy_with(self, env: Env) -> "Episode":
        return Episode(env, dict(self.obs), {a: list(h) for a, h in self.history.items()}, self.turn, self.done,
                       self.team_return, self.success, dict(self.local_return), self.success_reported)

    def messages(self, agent: str, history_turns: int | None) -> Messages:
        msgs: Messages = [{"role": "system", "content": env_instructions(self.env, agent)}]
        past = self.history[agent] if history_turns is None else self.history[agent][-history_turns:] \
            if history_turns > 0 else []
        for obs, action in past:
            msgs.append({"role": "user", "content": obs})
            msgs.append({"role": "assistant", "content": action})
        msgs.append({"role": "user", "content": self.obs[agent]})
        return msgs

    def apply(self, actions: dict[str, str], res: StepResult) -> None:
        """Record a step's actions and its result (checked where it was taken: :func:`step_env`)."""
        for a, text in actions.items():
            self.history[a].append((self.obs[a], text))
        self.obs = dict(res.observations)
        self.team_return += float(res.team_reward)
        for a, v in res.local_rewards.items():
            self.local_return[a] = self.local_return.get(a, 0.0) + float(v)
        if "success" in res.info:
            self.success, self.success_reported = bool(res.info["success"]), True
        self.done = bool(res.done)


def drop_unreported_success(metrics: dict[str, list], reported: bool) -> None:
    """No ``team/success`` where no episode's environment said whether it succeeded (no step's info held
    ``success``: a game of PettingZoo's, an environment without a success check): 0 would read as failure. Where
    one episode said so, the others' count as not succeeded (an environment may say it only on success)."""
    if not reported:
        metrics.pop(mn.TEAM_SUCCESS, None)


def start_episodes(make_env: Callable[[], Env], rows: Sequence[dict], seed: int,
                   positions: Sequence[int] | None = None) -> list[Episode]:
    """An episode per row, reset with the seed of its position in the batch (``positions[b]`` for row ``b``:
    copies of one instance given one position start from the same state)."""
    out = []
    for b, row in enumerate(rows):
        env = make_env()
        obs = reset_env(env, row, episode_seed(seed, b if positions is None else positions[b]))
        out.append(Episode(env, obs, {a: [] for a in env.agents}))
    return out


def _sample(agent: str, policy: str, turn: int, group: int, instance: int, msgs: Messages, comp: Any,
            reward: float) -> Sample:
    return Sample(agent=agent, policy=policy, turn=turn, group=group, instance=instance,
                  prompt_ids=comp.prompt_ids, completion_ids=comp.ids, logprobs=comp.logprobs,
                  finish_reason=comp.finish_reason, prompt_text=msgs[-1]["content"], completion_text=comp.text,
                  reward=reward, ret=reward, sampling=getattr(comp, "sampling", None))


# --------------------------------------------------------------------------------------------------
# MAGRPO tree
# --------------------------------------------------------------------------------------------------

@dataclass
class _Node:
    ep: Episode
    instance: int
    path: str = ""                                                   # instance, then the joint indices from the root
    samples: dict[str, list[Sample]] = field(default_factory=dict)   # agent -> K samples drawn here
    joint: list[tuple[int, ...]] = field(default_factory=list)       # sample index per agent, per joint action
    rewards: list[dict[str, float]] = field(default_factory=list)    # per joint action: agent -> reward
    team: list[float] = field(default_factory=list)                  # per joint action: team increment
    children: list["_Node | None"] = field(default_factory=list)


def magrpo_tree(make_env: Callable[[], Env], rows: Sequence[dict], complete: CompleteFn, *, agent_policy: dict[str, str],
                k: int, turns: int, mode: str = "aligned", gamma: float = 1.0, reward_mode: str = "team",
                early_stop_reward: float | None = None, history_turns: int | None = None, seed: int = 0,
                group_offset: int = 0, credit_orderings: int | None = None,
                credit_rng: random.Random | None = None,
                recorder: AuditRecorder | None = None) -> tuple[list[Sample], dict[str, list[float]]]:
    """Roll out one MAGRPO tree per row; return its samples (returns credited) and raw metrics.

    ``credit_orderings`` (``algorithm.credit: counterfactual``): each node's team increments are replaced,
    per agent, by the agent's counterfactual credit (:func:`_tree_credit`) before the returns are summed."""
    roots = [_Node(ep, b, str(b)) for b, ep in enumerate(start_episodes(make_env, rows, seed))]
    agents = roots[0].ep.env.agents
    simultaneous = roots[0].ep.env.simultaneous
    if mode == "cross" and not simultaneous:
        raise ValueError("algorithm.joint_mode=cross needs a simultaneous environment: in a turn-based one a later "
                         "agent's samples depend on the earlier agent's action; use joint_mode=aligned")
    metrics: dict[str, list[float]] = {}
    frontier = roots
    all_nodes: list[_Node] = []
    reported = False   # an episode's environment said whether it succeeded
    for t in range(turns):
        if not frontier:
            break
        if simultaneous:
            _expand_simultaneous(frontier, agents, complete, agent_policy, k, mode, reward_mode, history_turns,
                                 recorder)
        else:
            _expand_turn_based(frontier, agents, complete, agent_policy, k, reward_mode, history_turns, recorder)
        nxt = []
        for node in frontier:
            all_nodes.append(node)
            for j, child in enumerate(node.children):
                metrics.setdefault(mn.turn_key(t), []).append(node.team[j])
                stop = early_stop_reward is not None and node.team[j] >= early_stop_reward
                if child is None or child.ep.done or stop or t + 1 >= turns:
                    node.children[j] = None
                    if child is not None:
                        reported |= child.ep.success_reported
                        metrics.setdefault(mn.TEAM_SUCCESS, []).append(float(child.ep.success))
                        metrics.setdefault(mn.TEAM_RETURN, []).append(child.ep.team_return)
                        metrics.setdefault(mn.EPISODE_TURNS, []).append(t + 1)
                else:
                    nxt.append(child)
        frontier = nxt
    drop_unreported_success(metrics, reported)
    if credit_orderings is not None:
        for key, values in _tree_credit(all_nodes, agents, k, simultaneous, rows, credit_orderings,
                                        credit_rng or random.Random(seed)).items():
            metrics.setdefault(key, []).extend(values)
    # returns, leaves first
    returns: dict[int, list[dict[str, float]]] = {}
    for node in reversed(all_nodes):
        per_joint = []
        for j, child in enumerate(node.children):
            g = dict(node.rewards[j])
            if child is not None:
                child_returns = returns[id(child)]
                for a in agents:
                    g[a] += gamma * sum(cr[a] for cr in child_returns) / len(child_returns)
            per_joint.append(g)
        returns[id(node)] = per_joint
    samples: list[Sample] = []
    gid = group_offset
    for n_idx, node in enumerate(all_nodes):
        per_joint = returns[id(node)]
        for i, a in enumerate(agents):
            credit: dict[int, list[float]] = {}
            immediate: dict[int, list[float]] = {}
            team: dict[int, list[float]] = {}
            for j, choice in enumerate(node.joint):
                credit.setdefault(choice[i], []).append(per_joint[j][a])
                immediate.setdefault(choice[i], []).append(node.rewards[j][a])
                team.setdefault(choice[i], []).append(node.team[j])
            for s_idx, s in enumerate(node.samples[a]):
                if s is None:
                    continue   # the chain ended before this agent's turn: nothing was sampled
                s.group = gid
                s.ret = sum(credit[s_idx]) / len(credit[s_idx])
                s.reward = sum(immediate[s_idx]) / len(immediate[s_idx])
                s.extra["team_reward"] = sum(team[s_idx]) / len(team[s_idx])
                if recorder is not None:
                    s.extra["audit_keys"] = [f"t{node.path}/{j}" for j, c in enumerate(node.joint) if c[i] == s_idx]
                # aligned: the j-th samples of the node's agents form joint action node * K + j of the step
                s.extra.update(sample=s_idx, joint=n_idx * len(node.samples[a]) + s_idx if mode == "aligned" else None)
                samples.append(s)
            gid += 1
        metrics.setdefault(mn.TEAM_REWARD, []).extend(node.team)
    return samples, metrics


def _tree_credit(nodes: list[_Node], agents: Sequence[str], k: int, simultaneous: bool, rows: Sequence[dict],
                 orderings: int, rng: random.Random) -> dict[str, list[float]]:
    """Counterfactual credit of every node's aligned joint actions (:mod:`accord.algorithms.credit`): a
    swapped joint action is replayed on a clone of the node's environment (simultaneous: one step with the
    mixed actions; turn-based: the agents' turns in order, each with its chosen sample's text, until the
    episode ends). ``node.rewards[j][a]`` becomes agent a's credit for joint action j. A node where a chain
    ended before a later agent's turn (that agent has no sample there) has no complete joint actions to
    swap: it keeps the team reward and is counted in ``credit/skipped_groups``."""
    full = [n for n in nodes if all(s is not None for a in agents for s in n.samples[a])]

    def replay(node: _Node, c: tuple[int, ...]) -> float:
        env = node.ep.env.clone()
        texts = {a: node.samples[a][c[i]].completion_text for i, a in enumerate(agents)}
        if simultaneous:
            return float(step_env(env, texts).team_reward)
        total = 0.0
        for a in agents:
            res = step_env(env, {a: texts[a]})
            total += float(res.team_reward)
            if res.done:
                break
        return total

    labels = [f"instance {rows[n.instance].get('id', n.instance)!r}, turn {n.ep.turn}" for n in full]
    result = counterfactual_credit(agents, k, [n.team for n in full], labels,
                                   lambda reqs: [replay(full[g], c) for g, c in reqs], orderings=orderings, rng=rng)
    for node, credits in zip(full, result.credits):
        node.rewards = [{a: credits[j][i] for i, a in enumerate(agents)} for j in range(len(node.joint))]
    result.metrics[mn.CREDIT_SKIPPED_GROUPS] = [float(len(nodes) - len(full))]
    return result.metrics


def _step_clone(ep: Episode, actions: dict[str, str], audit: bool = False) -> tuple[Episode, StepResult, str | None]:
    """Step a clone of ``ep``'s environment; with ``audit``, also the fingerprint of the clone just before its
    step (the state the actions were scored on)."""
    env = ep.env.clone()
    stepped = state_fingerprint(env) if audit else None
    res = step_env(env, actions)
    child = ep.copy_with(env)
    child.apply(actions, res)
    child.turn = ep.turn + 1 if (ep.env.simultaneous or _ends_turn(ep.env, actions)) else ep.turn
    return child, res, stepped


def _mark(sample: Sample, recorder: AuditRecorder | None, state: str | None, shared: bool) -> Sample:
    """Audit fields of a sample: the fingerprint of the state its prompt was rendered from, and whether its
    group comes from one prompt."""
    if recorder is not None:
        sample.extra.update(prompt_state=state, prompt_shared=shared)
    return sample


def _ends_turn(env: Env, actions: dict[str, str]) -> bool:
    return tuple(actions) == (env.agents[-1],)


def _expand_simultaneous(frontier: list[_Node], agents, complete, agent_policy, k, mode, reward_mode, history_turns,
                         recorder: AuditRecorder | None = None):
    requests = [(a, node.ep.messages(a, history_turns)) for node in frontier for a in agents]
    outs = complete(requests, k, False)
    it = iter(zip(requests, outs))
    audit = recorder is not None
    for node in frontier:
        state = state_fingerprint(node.ep.env) if audit else None
        for a in agents:
            (_, msgs), comps = next(it)
            node.samples[a] = [_mark(_sample(a, agent_policy[a], node.ep.turn, -1, node.instance, msgs, c, 0.0),
                                     recorder, state, True) for c in comps]
        node.joint = [(j,) * len(agents) for j in range(k)] if mode == "aligned" else \
            list(itertools.product(range(k), repeat=len(agents)))
        for j, choice in enumerate(node.joint):
            actions = {a: node.samples[a][choice[i]].completion_text for i, a in enumerate(agents)}
            child, res, stepped = _step_clone(node.ep, actions, audit)
            if audit:
                recorder.score(f"t{node.path}/{j}", actions, {a: stepped for a in agents}, float(res.team_reward))
            node.team.append(float(res.team_reward))
            node.rewards.append(_credit(res, agents, reward_mode))
            node.children.append(_Node(child, node.instance, f"{node.path}.{j}"))


def _expand_turn_based(frontier: list[_Node], agents, complete, agent_policy, k, reward_mode, history_turns,
                       recorder: AuditRecorder | None = None):
    # chains[n][j]: node n's episode after the j-th samples of the agents that acted so far in this turn
    chains = [[node.ep] * k for node in frontier]
    team = [[0.0] * k for _ in frontier]
    per_agent = [[{a: 0.0 for a in agents} for _ in range(k)] for _ in frontier]
    audit = recorder is not None
    scored = [[({}, {}) for _ in range(k)] for _ in frontier]   # audit: per chain, texts and stepped states
    for i, a in enumerate(agents):
        if i == 0:
            # one state per node: K samples from it in one request
            requests = [(a, node.ep.messages(a, history_turns)) for node in frontier]
            outs = complete(requests, k, False)
            drawn = {(n, j): (requests[n][1], outs[n][j]) for n in range(len(frontier)) for j in range(k)}
        else:
            # K sibling states per node: one sample from each chain that is still running
            slots = [(n, j) for n in range(len(frontier)) for j in range(k) if not chains[n][j].done]
            requests = [(a, chains[n][j].messages(a, history_turns)) for n, j in slots]
            outs = complete(requests, 1, False) if requests else []
            drawn = {slot: (req[1], comps[0]) for slot, req, comps in zip(slots, requests, outs)}
        for n, node in enumerate(frontier):
            node.samples[a] = [None] * k
            for j in range(k):
                if (n, j) not in drawn:
                    continue
                msgs, comp = drawn[(n, j)]
                state = state_fingerprint(chains[n][j].env) if audit else None
                node.samples[a][j] = _mark(_sample(a, agent_policy[a], node.ep.turn, -1, node.instance, msgs, comp,
                                                   0.0), recorder, state, i == 0)
                child, res, stepped = _step_clone(chains[n][j], {a: comp.text}, audit)
                scored[n][j][0][a], scored[n][j][1][a] = comp.text, stepped
                chains[n][j] = child
                team[n][j] += float(res.team_reward)
                for b, v in _credit(res, agents, reward_mode).items():
                    per_agent[n][j][b] += v
    for n, node in enumerate(frontier):
        node.joint = [(j,) * len(agents) for j in range(k)]
        for j in range(k):
            node.team.append(team[n][j])
            node.rewards.append(per_agent[n][j])
            if audit:
                recorder.score(f"t{node.path}/{j}", scored[n][j][0], scored[n][j][1], team[n][j])
            child = chains[n][j]
            child.turn = node.ep.turn + 1
            node.children.append(_Node(child, node.instance, f"{node.path}.{j}"))


def _credit(res: StepResult, agents: Sequence[str], reward_mode: str) -> dict[str, float]:
    if reward_mode == "team":
        return {a: float(res.team_reward) for a in agents}
    if reward_mode == "local":
        return {a: float(res.local_rewards[a]) for a in agents}
    raise ValueError(f"unknown reward mode {reward_mode!r}")


# --------------------------------------------------------------------------------------------------
# AT-GRPO
# --------------------------------------------------------------------------------------------------

def atgrpo_rollout(make_env: Callable[[], Env], rows: Sequence[dict], complete: CompleteFn, *,
                   agent_policy: dict[str, str], k: int, turns: int, alpha: float, history_turns: int | None = None,
                   seed: int = 0, group_offset: int = 0,
                   recorder: AuditRecorder | None = None) -> tuple[list[Sample], dict[str, list[float]], list[Episode]]:
    """AT-GRPO: per turn and agent, K candidates from one state, scored on clones; the best advances.

    Returns the samples (reward = ``alpha * team + local`` of the candidate's own step, group =
    (instance, turn, agent)), raw metrics, and the episodes (the real trajectories).
    """
    episodes = start_episodes(make_env, rows, seed)
    env0 = episodes[0].env
    if env0.simultaneous:
        raise ValueError(f"AT-GRPO needs a turn-based environment (agents act in order and later agents see earlier "
                         f"ones); {env0.name!r} is simultaneous: use algorithm.name=magrpo for it")
    agents = env0.agents
    samples: list[Sample] = []
    metrics: dict[str, list[float]] = {}
    gid = group_offset
    for t in range(turns):
        for a in agents:
            live = [b for b, ep in enumerate(episodes) if not ep.done]
            if not live:
                break
            requests = [(a, episodes[b].messages(a, history_turns)) for b in live]
            outs = complete(requests, k, False)
            for b, (_, msgs), comps in zip(live, requests, outs):
                ep = episodes[b]
                best_r, best_child = -math.inf, None
                state = state_fingerprint(ep.env) if recorder is not None else None
                for c, comp in enumerate(comps):
                    child, res, stepped = _step_clone(ep, {a: comp.text}, recorder is not None)
                    r = alpha * float(res.team_reward) + float(res.local_rewards[a])
                    samples.append(_mark(_sample(a, agent_policy[a], t, gid, b, msgs, comp, r), recorder, state, True))
                    if recorder is not None:
                        recorder.score(f"a{gid}/{c}", {a: comp.text}, {a: stepped}, r)
                        samples[-1].extra["audit_keys"] = [f"a{gid}/{c}"]
                    metrics.setdefault(mn.turn_key(t), []).append(r)
                    metrics.setdefault(mn.TEAM_REWARD, []).append(float(res.team_reward))
                    metrics.setdefault(mn.agent_key(a, mn.AGENT_TEAM_REWARD), []).append(float(res.team_reward))
                    metrics.setdefault(mn.agent_key(a, mn.AGENT_LOCAL_REWARD), []).append(float(res.local_rewards[a]))
                    if r > best_r:
                        best_r, best_child = r, child
                best_child.turn = t + 1 if a == agents[-1] else t
                episodes[b] = best_child
                gid += 1
    for ep in episodes:
        metrics.setdefault(mn.TEAM_RETURN, []).append(ep.team_return)
        metrics.setdefault(mn.TEAM_SUCCESS, []).append(float(ep.success))
        metrics.setdefault(mn.EPISODE_TURNS, []).append(sum(len(h) for h in ep.history.values()) / len(agents))
    drop_unreported_success(metrics, any(ep.success_reported for ep in episodes))
    return samples, metrics, episodes


def play_episodes(make_env: Callable[[], Env], rows: Sequence[dict], complete: CompleteFn, *, turns: int,
                  history_turns: int | None = None, seed: int = 0, greedy: bool = True) -> list[Episode]:
    """One trajectory per row, no branching (evaluation): agents act in turn order, one completion each."""
    episodes = start_episodes(make_env, rows, seed)
    env0 = episodes[0].env
    for _ in range(turns):
        groups = [env0.agents] if env0.simultaneous else [(a,) for a in env0.agents]
        for acting in groups:
            live = [b for b, ep in enumerate(episodes) if not ep.done]
            if not live:
                return episodes
            requests = [(a, episodes[b].messages(a, history_turns)) for b in live for a in acting]
            outs = iter(complete(requests, 1, greedy))
            for b in live:
                actions = {a: next(outs)[0].text for a in acting}
                ep = episodes[b]
                res = step_env(ep.env, actions)
                ep.apply(actions, res)
        for ep in episodes:
            ep.turn += 1
    return episodes


class _EpisodeRollout(Rollout):
    """Shared by the multi-turn rollouts: the turn limit and evaluation by :func:`play_episodes`."""

    @property
    def turns(self) -> int:
        return self.cfg.rollout.max_turns or self.env.max_turns

    def seed(self, step: int, n_rows: int) -> int:
        return rollout_seed(self.cfg.run.seed, step, n_rows)

    def play(self, rows: list[dict], generate: Generate, *, n: int, greedy: bool, seed: int,
             success: bool = True) -> Played:
        """``n`` trajectories per row, no branching: team return, success, turns, each agent's local return."""
        from accord.tracking.eval_completions import episode_completion_rows

        reps = [row for row in rows for _ in range(n)]
        episodes = play_episodes(self.make_env, reps, generate, turns=self.turns,
                                 history_turns=self.cfg.rollout.history_turns, seed=seed, greedy=greedy)
        results = []
        reported = any(ep.success_reported for ep in episodes)
        for b in range(len(rows)):
            per = []
            for ep in episodes[b * n:(b + 1) * n]:
                rec = {"team": ep.team_return, **({"success": float(ep.success)} if reported else {}),
                       "turns": max(len(h) for h in ep.history.values())}
                for a in self.agents:
                    rec[mn.agent_key(a, mn.AGENT_LOCAL_RETURN)] = ep.local_return.get(a, 0.0)
                per.append(rec)
            results.append(per)
        table = episode_completion_rows(rows, episodes) if n == 1 else []
        return Played(results, table)


@register_rollout("magrpo_tree")
class TreeRollout(_EpisodeRollout):
    """Multi-turn MAGRPO: one tree per instance (:func:`magrpo_tree`); ``baseline=independent`` credits each
    agent's local reward instead of the team reward."""

    def check(self) -> None:
        """An environment of the protocol (the config's rules against it, the tree's size among them:
        :func:`accord.config.rules.check_rollout`)."""
        if not is_env(self.env) or getattr(self.env, "max_turns", 0) < 1:
            raise ConfigError(f"rollout {self.name!r} needs an environment of accord.envs.protocol")

    def collect(self, rows: list[dict], generate: Generate, *, step: int, phase: Phase) -> RolloutResult:
        algo, r = self.cfg.algorithm, self.cfg.rollout
        with phase("rollout"):
            samples, raw = magrpo_tree(
                self.make_env, rows, generate, agent_policy=self.agent_policy, k=algo.num_generations,
                turns=self.turns, mode=algo.joint_mode or joint_mode_for(self.cfg, "magrpo_tree", len(self.agents)),
                gamma=algo.gamma,
                reward_mode="local" if algo.baseline == "independent" else "team",
                early_stop_reward=algo.early_stop_reward, history_turns=r.history_turns,
                seed=self.seed(step, len(rows)),
                credit_orderings=algo.credit_orderings if algo.credit == "counterfactual" else None,
                credit_rng=step_credit_rng(self.cfg.run.seed, step), recorder=self.recorder)
        return RolloutResult(samples, raw)


@register_rollout("atgrpo")
class ATGRPORollout(_EpisodeRollout):
    """AT-GRPO (:func:`atgrpo_rollout`) on a turn-based environment; ``baseline=independent`` sets ``alpha = 0``
    (each candidate rewarded by its agent's local reward only)."""

    def collect(self, rows: list[dict], generate: Generate, *, step: int, phase: Phase) -> RolloutResult:
        algo = self.cfg.algorithm
        alpha = 0.0 if algo.baseline == "independent" else algo.alpha
        with phase("rollout"):
            samples, raw, _ = atgrpo_rollout(self.make_env, rows, generate, agent_policy=self.agent_policy,
                                             k=algo.num_generations, turns=self.turns, alpha=alpha,
                                             history_turns=self.cfg.rollout.history_turns,
                                             seed=self.seed(step, len(rows)), recorder=self.recorder)
        return RolloutResult(samples, raw)
