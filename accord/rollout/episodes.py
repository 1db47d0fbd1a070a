"""Independent sampled episodes: the multi-turn rollout of iac, maac and madpo.

Per task instance K episodes are played from the same start (reset with one seed), with sampling and no branching (the
MAGRPO tree branches every node; an actor-critic learns from whole trajectories, and a preference pair
compares two of them). Agents act as the environment orders them: turn-based agents one at a time,
each seeing the earlier agents' actions; simultaneous agents together. Generation is batched per
policy over all live episodes at every step.

Every action is a :class:`~accord.rollout.sample.Sample` with:

- ``reward``: the team reward the agent received from this action up to (not including) its next one,
  or to the end of the episode (``baseline: independent``: its local reward over the same span), so the
  rewards of one agent's samples in an episode sum to the episode's return (its local return); ``ret``
  starts equal to it, and the algorithm's step sets returns and advantages;
- ``turn`` and ``instance``; ``group`` = instance * N + agent index;
- ``extra``: ``episode`` (index of the episode in the step), ``sample`` (j, the candidate index within the
  instance's K episodes), ``order`` (position of the action in the episode), ``episode_return`` (the
  episode's team return) and ``joint_history``: the (turn, agent, observation, action) records every agent
  made before this action, then the (turn, agent, observation, None) of the agents acting with it (itself
  included), from which a centralised critic builds its input (:func:`accord.critics.joint_text`).
"""

from __future__ import annotations

from typing import Callable, Sequence

from accord import metric_names as mn
from accord.config import ConfigError
from accord.envs.protocol import Env, is_env, step_env
from accord.rollout.base import Generate, Phase, RolloutResult, register_rollout
from accord.rollout.multiturn import CompleteFn, _EpisodeRollout, _sample, drop_unreported_success, start_episodes
from accord.rollout.sample import Sample


def sample_episodes(make_env: Callable[[], Env], rows: Sequence[dict], complete: CompleteFn, *,
                    agent_policy: dict[str, str], k: int, turns: int, history_turns: int | None = None,
                    seed: int = 0, reward_mode: str = "team") -> tuple[list[Sample], dict[str, list[float]]]:
    """K sampled episodes per row (see the module docstring); returns the samples in acting order and raw
    metrics (``team/return``, ``team/success``, ``episode/turns``, ``turn/<t>/reward``, ``team/reward``)."""
    if reward_mode not in ("team", "local"):
        raise ValueError(f"unknown reward mode {reward_mode!r}")
    reps = [row for row in rows for _ in range(k)]
    # the K copies of an instance are reset with one seed: the same start, whatever the environment draws from it
    episodes = start_episodes(make_env, reps, seed, [i for i in range(len(rows)) for _ in range(k)])
    env0 = episodes[0].env
    agents = env0.agents
    samples: list[Sample] = []
    metrics: dict[str, list[float]] = {}
    log: list[list[tuple[int, str, str, str]]] = [[] for _ in episodes]   # per episode: (turn, agent, obs, action)
    pending: list[dict[str, Sample]] = [{} for _ in episodes]            # per episode: each agent's last sample
    order = [0] * len(episodes)
    for t in range(turns):
        groups = [tuple(agents)] if env0.simultaneous else [(a,) for a in agents]
        for acting in groups:
            live = [e for e, ep in enumerate(episodes) if not ep.done]
            if not live:
                break
            requests = [(a, episodes[e].messages(a, history_turns)) for e in live for a in acting]
            outs = iter(complete(requests, 1, False))
            reqs = iter(requests)
            for e in live:
                ep = episodes[e]
                now = [(t, a, ep.obs[a], None) for a in acting]
                actions = {}
                for a in acting:
                    (_, msgs), comp = next(reqs), next(outs)[0]
                    s = _sample(a, agent_policy[a], t, (e // k) * len(agents) + agents.index(a), e // k, msgs,
                                comp, 0.0)
                    s.extra.update(episode=e, sample=e % k, order=order[e], joint_history=list(log[e]) + now)
                    order[e] += 1
                    samples.append(s)
                    pending[e][a] = s
                    actions[a] = comp.text
                res = step_env(ep.env, actions)
                for a in acting:
                    log[e].append((t, a, ep.obs[a], actions[a]))
                ep.apply(actions, res)
                for a, s in pending[e].items():   # every agent that has acted earns this step's reward
                    s.reward += float(res.team_reward) if reward_mode == "team" else float(res.local_rewards[a])
                metrics.setdefault(mn.turn_key(t), []).append(float(res.team_reward))
                metrics.setdefault(mn.TEAM_REWARD, []).append(float(res.team_reward))
        for ep in episodes:
            if not ep.done:
                ep.turn += 1
    for e, ep in enumerate(episodes):
        metrics.setdefault(mn.TEAM_RETURN, []).append(ep.team_return)
        metrics.setdefault(mn.TEAM_SUCCESS, []).append(float(ep.success))
        metrics.setdefault(mn.EPISODE_TURNS, []).append(max(len(h) for h in ep.history.values()))
    drop_unreported_success(metrics, any(ep.success_reported for ep in episodes))
    for s in samples:
        s.ret = s.reward
        s.extra["episode_return"] = episodes[s.extra["episode"]].team_return
    return samples, metrics


@register_rollout("episodes")
class EpisodesRollout(_EpisodeRollout):
    """K independent sampled episodes per instance (:func:`sample_episodes`): iac, maac and madpo on a
    multi-turn environment; ``baseline=independent`` credits each agent's local reward."""

    def check(self) -> None:
        if not is_env(self.env) or getattr(self.env, "max_turns", 0) < 1:
            raise ConfigError(f"rollout {self.name!r} needs a multi-turn environment of accord.envs.protocol")

    def collect(self, rows: list[dict], generate: Generate, *, step: int, phase: Phase) -> RolloutResult:
        algo = self.cfg.algorithm
        with phase("rollout"):
            samples, raw = sample_episodes(
                self.make_env, rows, generate, agent_policy=self.agent_policy, k=algo.num_generations,
                turns=self.turns, history_turns=self.cfg.rollout.history_turns, seed=self.seed(step, len(rows)),
                reward_mode="local" if algo.baseline == "independent" else "team")
        return RolloutResult(samples, raw)


