"""The training steps of iac, maac, madpo and marlhf, and the state they add to a run.

:class:`accord.trainer.Trainer` runs MAGRPO and AT-GRPO steps itself (rollout, group-relative advantages,
clipped policy gradient); for the algorithms here it calls ``STEPS[algorithm.name](trainer, step, rows, acc,
times)``, which runs its own named phases (timed into ``times``) and returns the step's samples (for the
completions table and the per-agent metrics the trainer logs for every algorithm):

- **iac / maac** (:func:`actor_critic_step`): ``rollout`` (single-turn: K aligned joint actions per instance;
  multi-turn: K sampled episodes, :mod:`accord.rollout.episodes`), ``kl`` (a k1 KL penalty on the reward),
  ``values`` (the critics' values of every sample's history, before any update), ``adv`` (GAE over each
  agent's own turns: :mod:`accord.algorithms.actor_critic`), ``update`` (actors on the clipped loss; critics
  on the value loss: value heads in the same summed loss, separate critics once per batch);
- **madpo** (:func:`madpo_step`): every ``preference.rounds_every`` steps ``rollout`` and ``pairs`` (pairs of a
  prompt's candidates, the reference's log-probs of their completions); every step ``update`` (joint DPO over
  the round's pairs: :mod:`accord.algorithms.preference`);
- **marlhf** (:func:`marlhf_step`): at the first step ``reward_model`` (stage 1: Bradley-Terry on joint
  preferences, then frozen); every step the rollout, ``rm_score`` (the reward model's score of each joint
  action replaces the task's reward as the training reward) and the online RL stage (``reward_model.rl``).

The state these add to a run (critics, the pair buffer, the reward model) is built by :func:`build_parts`
before a resume, and each part is saved in and loaded from every checkpoint (``extras/<part>``): resume is
exact. :func:`check_files` checks the files marlhf reads.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import random
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from accord import metric_names as mn
from accord.algorithms.actor_critic import explained_variance, gae, next_indices, normalize_per_group
from accord.algorithms.losses import KL_REWARD_ESTIMATORS
from accord.algorithms.preference import bradley_terry, dpo_margins, joint_dpo, select_pairs
from accord.audit import audit_step
from accord.config import ACTOR_CRITIC, Config, ConfigError
from accord.critics import (TARGET, VALUE, ScalarModel, attach_heads, ensure_reference, head_update, head_values,
                            joint_text, load_heads, same_vocabulary, save_heads, sequence_logprobs,
                            weighted_logprob_update)
from accord.data import DataFileError, json_lines
from accord.distributed import gather, submit
from accord.models.common import ModelNotFoundError
from accord.policies.learner import read_saved_state
from accord.policies.protocol import TrainingError
from accord.rollout.sample import Sample, Sampling
from accord.seeding import (critic_seed, pair_selection_seed, reward_model_pair_seed, reward_model_prompt_seed,
                             reward_model_seed)
from accord.tracking import MetricAccumulator

logger = logging.getLogger(__name__)


def stage_of(cfg: Config) -> str:
    """The algorithm whose update a step runs: marlhf's online RL stage, else the algorithm itself."""
    return cfg.reward_model.rl if cfg.algorithm.name == "marlhf" else cfg.algorithm.name


def total_optimizer_steps(cfg: Config) -> int:
    return cfg.run.steps * cfg.algorithm.ppo_epochs * cfg.training.num_mini_batches


def _driver_device(cfg: Config) -> torch.device:
    """Where the trainer's own models (separate critics, the reward model) live: ``run.device``."""
    from accord.devices import resolve_device

    return resolve_device(cfg.run.device, "run.device")


# --- rules that need files -----------------------------------------------------------------------------


def check_files(cfg: Config) -> None:
    """marlhf's files: ``reward_model.preferences`` (read and checked against the agents) and
    ``reward_model.path`` (a reward model there), after ``cfg.resolve_agents``. The rules of iac, maac, madpo
    and marlhf against the environment are :func:`accord.config.rules.check_rollout`'s."""
    algo = cfg.algorithm
    if algo.name == "marlhf" and cfg.reward_model.preferences:
        read_preferences(Path(cfg.reward_model.preferences), tuple(a.name for a in cfg.agents))
    path = cfg.reward_model.path
    if algo.name == "marlhf" and path and not (Path(path) / "head.safetensors").is_file():
        raise ConfigError(f"reward_model.path={path!r} does not load (no head.safetensors there); pass a directory a "
                          "marlhf run exported (RUN_DIR/reward_model), or null to train one")


# --- the parts a run gains ------------------------------------------------------------------------------


def build_parts(cfg: Config, run) -> dict[str, Any]:
    """The state of iac, maac, madpo and marlhf (``{}`` for the others), built before a resume loads it."""
    algo = cfg.algorithm
    parts: dict[str, Any] = {}
    if algo.name not in ("iac", "maac", "madpo", "marlhf"):
        return parts
    if stage_of(cfg) in ACTOR_CRITIC:
        parts["critics"] = Critics(cfg, run)
    if algo.name == "madpo":
        if not cfg.preference.reference_free:
            gather([submit(pol, "run", ensure_reference) for pol in run.policies.values()])
        parts["pairs"] = PairBuffer()
    if algo.name == "marlhf":
        parts["reward_model"] = RewardModel(cfg, run)
    return parts


# --- critics -------------------------------------------------------------------------------------------


class Critics:
    """The critics of an actor-critic run: value heads on the policies (iac, ``critic.mode: head``), a
    separate critic per agent (iac, ``separate``) or one centralised critic (maac, ``joint``)."""

    def __init__(self, cfg: Config, run):
        self.cfg, self.run = cfg, run
        stage, critic = stage_of(cfg), cfg.critic
        self.kind = "joint" if stage == "maac" else ("separate" if critic.mode == "separate" else "head")
        self.agents = tuple(run.agents)
        total = total_optimizer_steps(cfg)
        self.models: dict[str, ScalarModel] = {}
        self._kept: str | None = None   # the critic whose values' forward values() kept for its fit
        if self.kind == "head":
            jobs = [submit(pol, "run", attach_heads, [a for a in self.agents if run.agent_policy[a] == name], critic,
                           total, critic_seed(cfg.run.seed)) for name, pol in run.policies.items()]
            gather(jobs)
            return
        device = _driver_device(cfg)
        first = cfg.policies[run.agent_policy[self.agents[0]]]
        owners = {"joint": first} if self.kind == "joint" else {a: cfg.policies[run.agent_policy[a]] for a in self.agents}
        for i, (name, pcfg) in enumerate(owners.items()):
            spec = critic.model or pcfg.model
            kwargs = critic.model_kwargs if critic.model else pcfg.model_kwargs
            self.models[name] = ScalarModel(f"critic {name!r}", spec, dict(kwargs), critic.lr or cfg.training.lr,
                                            cfg.training, total, seed=critic_seed(cfg.run.seed, i), device=device,
                                            max_tokens=critic.max_tokens)
        # separate per-agent critics read the actor's tokens when they share its vocabulary
        self.same_vocab = {a: same_vocabulary(self.models[a].tokenizer, run.policies[run.agent_policy[a]].tokenizer)
                           for a in self.agents} if self.kind == "separate" else {}

    def name_of(self, s: Sample) -> str:
        """The critic (metric name) of a sample: its policy (heads), its agent (separate) or ``joint``."""
        return s.policy if self.kind == "head" else (s.agent if self.kind == "separate" else "joint")

    # inputs of the separate critics, in their own vocabulary
    def _inputs(self, samples: list[Sample]) -> tuple[list[list[int]], list[bool]]:
        at_completion = self.cfg.critic.value_at == "completion"
        out, cut = [], []
        histories = joint_records(samples, at_completion) if self.kind == "joint" else None
        for i, s in enumerate(samples):
            model = self.models[self.name_of(s)]
            if self.kind == "joint":
                ids, was_cut = model.encode(joint_text(histories[i], s.agent, s.turn, self.agents))
            else:
                ids = s.prompt_ids + s.completion_ids if at_completion else list(s.prompt_ids)
                if self.same_vocab[s.agent]:
                    ids, was_cut = model.fit(ids)
                else:
                    ids, was_cut = model.translate(self.run.policies[s.policy].tokenizer, ids)
            out.append(ids)
            cut.append(was_cut)
        return out, cut

    def values(self, samples: list[Sample], acc: MetricAccumulator) -> None:
        """Set ``extra["value"]`` of every sample: its critic's value of its history (before any update)."""
        if self.kind == "head":
            jobs = {}
            for name, pol in self.run.policies.items():
                mine = [s for s in samples if s.policy == name]
                if mine:
                    jobs[name] = (mine, submit(pol, "run", head_values, mine))
            for mine, job in jobs.values():
                for s, v in zip(mine, job.result()):
                    s.extra[VALUE] = v
            return
        inputs, cut = self._inputs(samples)
        # the last critic's forward, where it is its fit's whole first micro-batch, runs with its graph kept for the
        # fit (one pass instead of two); that critic then fits before anything else runs, so no other model works
        # while the graph is alive and the step's peak memory stays what it was
        tr = self.cfg.training
        named = {name: [i for i, s in enumerate(samples) if self.name_of(s) == name] for name in self.models}
        last = [name for name, idx in named.items() if idx][-1:]
        self._kept = None
        for name, model in self.models.items():
            idx = named[name]
            keep = [name] == last and len(idx) <= tr.micro_batch_size and min(tr.num_mini_batches, len(idx)) == 1
            for i, v in zip(idx, model.scores([inputs[i] for i in idx], keep=keep)):
                samples[i].extra[VALUE] = v
            if keep and model._kept is not None:
                self._kept = name
            if idx:
                acc.add(mn.critic_key(name, mn.TRUNCATED_FRAC), sum(cut[i] for i in idx) / len(idx))
        self._cache = (samples, inputs)

    def update(self, trainer, samples: list[Sample], step: int, acc: MetricAccumulator) -> None:
        """Actors and critics: heads in their policies' summed loss; else the actors' clipped update and each
        separate critic's value regression (once per batch, all policies submitted before any is awaited)."""
        if self.kind == "head":
            jobs = {}
            for name, pol in self.run.policies.items():
                mine = [s for s in samples if s.policy == name]
                if mine:
                    jobs[name] = submit(pol, "run", head_update, mine, step)
            for name, stats in zip(jobs, gather(list(jobs.values()))):
                for key, v in stats.items():
                    if key in (mn.VALUE_LOSS, mn.VALUE_CLIP_FRAC):
                        acc.add(mn.critic_key(name, key), v)
                    else:
                        acc.add(mn.update_key(name, key), v)
            return
        cached, inputs = self._cache
        assert cached is samples
        critic, algo, tr = self.cfg.critic, self.cfg.algorithm, self.cfg.training
        # the critic whose graph values() kept fits first (see there), then the actors, then the other critics
        order = [None] + list(self.models) if self._kept is None else [self._kept, None] + [
            name for name in self.models if name != self._kept]
        self._kept = None
        for name in order:
            if name is None:
                trainer._update(samples, step, acc)
                continue
            model = self.models[name]
            idx = [i for i, s in enumerate(samples) if self.name_of(s) == name]
            if not idx:
                continue
            stats = model.fit_values([inputs[i] for i in idx], [samples[i].extra[VALUE] for i in idx],
                                     [samples[i].extra[TARGET] for i in idx], coef=critic.value_coef,
                                     clip=critic.value_clip, epochs=algo.ppo_epochs,
                                     mini_batches=min(tr.num_mini_batches, len(idx)), step=step)
            acc.add(mn.critic_key(name, mn.VALUE_LOSS), stats[mn.VALUE_LOSS])
            acc.add(mn.critic_key(name, mn.VALUE_CLIP_FRAC), stats[mn.CLIP_FRAC])
            acc.add(mn.critic_key(name, mn.GRAD_NORM), stats[mn.GRAD_NORM])

    def save(self, directory: Path) -> None:
        Path(directory).mkdir(exist_ok=True)
        if self.kind == "head":
            gather([submit(pol, "run", save_heads, Path(directory) / name) for name, pol in self.run.policies.items()])
        for name, model in self.models.items():
            model.save(Path(directory) / name)

    def load(self, directory: Path) -> None:
        if self.kind == "head":
            gather([submit(pol, "run", load_heads, Path(directory) / name) for name, pol in self.run.policies.items()])
        for name, model in self.models.items():
            model.load(Path(directory) / name)


def joint_records(samples: list[Sample], at_completion: bool) -> list[list[tuple]]:
    """Per sample, the (turn, agent, observation, action) records its centralised critic reads: the episode's
    ``joint_history`` (multi-turn), or the observations of every agent of its joint action (single-turn:
    the j-th samples of one instance). With ``at_completion`` (Q) the sample's own action is filled in."""
    joint: dict[tuple, list[Sample]] = defaultdict(list)
    for s in samples:
        if "joint_history" not in s.extra:
            joint[(s.instance, s.extra["sample"])].append(s)
    out = []
    for s in samples:
        if "joint_history" in s.extra:
            records = [tuple(r) for r in s.extra["joint_history"]]
        else:
            records = [(0, o.agent, o.prompt_text, None) for o in joint[(s.instance, s.extra["sample"])]]
        if at_completion:
            records = [(t, a, obs, s.completion_text if a == s.agent and act is None else act)
                       for t, a, obs, act in records]
        out.append(records)
    return out


def advantages_and_targets(samples: list[Sample], agents: tuple[str, ...], cfg: Config) -> None:
    """GAE over each agent's own turns of each episode (one step per sample in single-turn tasks): sets
    ``advantage`` and ``extra["value_target"]``; with ``critic.value_at: completion`` the advantage is Q minus
    the mean Q of the samples of one agent and prompt. Advantages z-scored per agent when configured."""
    critic = cfg.critic
    keys = [(s.extra.get("episode", ("single", i)), s.agent) for i, s in enumerate(samples)]
    order = [s.extra.get("order", 0) for s in samples]
    nxt = torch.tensor(next_indices(keys, order), dtype=torch.long)
    rewards = torch.tensor([s.ret for s in samples], dtype=torch.float64)
    values = torch.tensor([s.extra[VALUE] for s in samples], dtype=torch.float64)
    adv, targets = gae(rewards, values, nxt, cfg.algorithm.gamma, critic.gae_lambda)
    if critic.value_at == "completion":
        groups = {}
        gid = torch.tensor([groups.setdefault((s.agent, tuple(s.prompt_ids)), len(groups)) for s in samples])
        mean = torch.zeros(len(groups), dtype=torch.float64).index_add_(0, gid, values)
        mean /= torch.zeros(len(groups), dtype=torch.float64).index_add_(0, gid, torch.ones_like(values))
        adv = (values - mean[gid]).float()
    if critic.normalize_advantage:
        adv = normalize_per_group(adv, torch.tensor([agents.index(s.agent) for s in samples]))
    for s, a, g in zip(samples, adv.tolist(), targets.tolist()):
        s.advantage = a
        s.extra[TARGET] = g


def audit(trainer, step: int, samples: list[Sample], rows: list[dict], acc: MetricAccumulator,
          times: dict[str, float]) -> None:
    """The ``audit`` phase (``training.audit``) of a step that rolled out: as MAGRPO's, on the single-turn
    rollout's joint actions (the multi-turn ``episodes`` rollout records nothing: see :func:`check_run`)."""
    if trainer.run.rollout.recorder is not None:
        with trainer._phase(times, "audit"):
            audit_step(trainer.run, step + 1, samples, rows, acc)


def actor_critic_step(trainer, step: int, rows: list[dict], acc: MetricAccumulator, times: dict[str, float],
                      samples: list[Sample] | None = None) -> list[Sample]:
    """One iac / maac step (see the module docstring); ``samples``: already rolled out and audited (marlhf's
    stage 2)."""
    cfg, critics = trainer.cfg, trainer.run.parts["critics"]
    if samples is None:
        samples, rows = trainer.rollout(step, rows, acc, times)
        audit(trainer, step, samples, rows, acc, times)
    algo = cfg.algorithm
    if algo.kl_coef > 0 and algo.kl_estimator in KL_REWARD_ESTIMATORS:
        with trainer._phase(times, "kl"):
            trainer._kl_reward_penalty(samples, acc)
    with trainer._phase(times, "values"):
        critics.values(samples, acc)
    with trainer._phase(times, "adv"):
        advantages_and_targets(samples, trainer.agents, cfg)
        by_critic: dict[str, list[Sample]] = defaultdict(list)
        for s in samples:
            by_critic[critics.name_of(s)].append(s)
        for name, mine in by_critic.items():
            v = torch.tensor([s.extra[VALUE] for s in mine])
            g = torch.tensor([s.extra[TARGET] for s in mine])
            acc.add(mn.critic_key(name, mn.VALUE_MEAN), float(v.mean()))
            ev = explained_variance(v, g)
            if ev is not None:
                acc.add(mn.critic_key(name, mn.EXPLAINED_VARIANCE), ev)
    with trainer._phase(times, "update"):
        critics.update(trainer, samples, step, acc)
    return samples


# --- preference pairs ----------------------------------------------------------------------------------


def candidate_reward(s: Sample) -> float:
    """The team reward of the joint candidate a sample belongs to (its episode's return, multi-turn)."""
    return float(s.extra.get("episode_return", s.ret))


def build_pairs(samples: list[Sample], cfg: Config, step: int) -> tuple[list[tuple], dict[tuple, list[int]]]:
    """Pairs (instance, winner, loser, reward_w, reward_l) of each instance's candidates, and the members
    (instance, candidate, agent) -> sample positions (one per turn the agent acted)."""
    pref = cfg.preference
    members: dict[tuple, list[int]] = defaultdict(list)
    rewards: dict[int, dict[int, float]] = defaultdict(dict)
    for i, s in enumerate(samples):
        j = s.extra["sample"]
        members[(s.instance, j, s.agent)].append(i)
        rewards[s.instance][j] = candidate_reward(s)
    pairs = []
    for inst in sorted(rewards):
        cands = sorted(rewards[inst])
        scores = [rewards[inst][j] for j in cands]
        rng = random.Random(pair_selection_seed(cfg.run.seed, step, inst))
        for w, l in select_pairs(scores, pref.pair_selection, pref.max_pairs_per_prompt, pref.min_gap, rng):
            pairs.append((inst, cands[w], cands[l], scores[w], scores[l]))
    return pairs, dict(members)


class PairBuffer:
    """madpo's pairs of the current round: the round's samples, its pairs, and the reference's log-prob sum of
    each sample (0 when reference-free). Saved in checkpoints, so a resume mid-round trains on the same pairs."""

    def __init__(self):
        self.round_step = -1
        self.samples: list[Sample] = []
        self.pairs: list[tuple] = []
        self.members: dict[tuple, list[int]] = {}
        self.ref: list[float] = []

    def new_round(self, trainer, samples: list[Sample], step: int, acc: MetricAccumulator) -> None:
        cfg = trainer.cfg
        self.round_step, self.samples = step, samples
        self.pairs, self.members = build_pairs(samples, cfg, step)
        used = sorted({i for p in self.pairs for key in _pair_keys(p, trainer.agents) for i in self.members.get(key, [])})
        self.ref = [0.0] * len(samples)
        if not cfg.preference.reference_free and used:
            for pname, idx, values in _per_policy(trainer, [samples[i] for i in used], used, sequence_logprobs,
                                                  reference=True):
                for i, v in zip(idx, values):
                    self.ref[i] = v
        acc.add(mn.PREF_PAIRS, len(self.pairs))
        acc.add(mn.PREF_PROMPTS_WITH_PAIRS,
                len({p[0] for p in self.pairs}) / max(1, len({s.instance for s in samples})))
        if self.pairs:
            acc.add(mn.PREF_REWARD_GAP, sum(p[3] - p[4] for p in self.pairs) / len(self.pairs))

    def state(self) -> dict:
        from dataclasses import asdict

        return {"round_step": self.round_step, "samples": [asdict(s) for s in self.samples], "pairs": self.pairs,
                "members": [[list(k), v] for k, v in self.members.items()], "ref": self.ref}

    def save(self, directory: Path) -> None:
        Path(directory).mkdir(exist_ok=True)
        torch.save(self.state(), Path(directory) / "pairs.pt")

    def load(self, directory: Path) -> None:
        state = read_saved_state(Path(directory) / "pairs.pt", ("round_step", "samples", "pairs", "members", "ref"))
        try:
            samples = [Sample(**{**s, "sampling": Sampling(**s["sampling"]) if s.get("sampling") else None})
                       for s in state["samples"]]   # asdict made the nested Sampling a dict
            pairs = [tuple(p) for p in state["pairs"]]
            members = {tuple(k): list(v) for k, v in state["members"]}
            ref = list(state["ref"])
        except (TypeError, AttributeError) as err:   # the parts of another structure (a damaged or foreign file)
            raise ValueError(f"pairs.pt holds no pair buffer of this accord ({type(err).__name__}: {err})") from err
        if not isinstance(state["round_step"], int):
            raise ValueError(f"pairs.pt: its round step is {str(state['round_step'])[:40]!r}, not a step")
        self.round_step, self.samples, self.pairs, self.members, self.ref = (state["round_step"], samples, pairs,
                                                                             members, ref)


def _pair_keys(pair: tuple, agents: tuple[str, ...]) -> list[tuple]:
    inst, w, l = pair[:3]
    return [(inst, c, a) for c in (w, l) for a in agents]


def _per_policy(trainer, samples: list[Sample], idx: list[int], fn, weights: list[float] | None = None, **kwargs):
    """``fn(policy, its samples[, its weights], **kwargs)`` submitted to every policy before any is awaited;
    yields (policy, the positions ``idx`` of its samples, its result)."""
    jobs = {}
    for pname, pol in trainer.policies.items():
        mine = [k for k, s in enumerate(samples) if s.policy == pname]
        if mine:
            args = [[samples[k] for k in mine]] + ([[weights[k] for k in mine]] if weights is not None else [])
            jobs[pname] = ([idx[k] for k in mine], submit(pol, "run", fn, *args, **kwargs))
    for pname, (positions, job) in jobs.items():
        yield pname, positions, job.result()


def preference_update(trainer, buf: PairBuffer, step: int, acc: MetricAccumulator) -> None:
    """Joint DPO over the round's pairs: per epoch and mini-batch of pairs, every policy's log-probs of the
    pairs' completions (no gradient), the joint loss and its per-pair gradient, then one optimizer step of
    each policy on its completions' log-probs weighted by that gradient (+ winners, - losers)."""
    cfg = trainer.cfg
    agents = trainer.agents
    if not buf.pairs:
        logger.warning("step %d: no preference pair in this round (every prompt's candidates have equal team rewards, "
                       "or gaps below preference.min_gap): the update is skipped", step)
        acc.add(mn.PREF_SKIPPED, 1.0)
        return
    acc.add(mn.PREF_SKIPPED, 0.0)
    n_mb = min(cfg.training.num_mini_batches, len(buf.pairs))
    for epoch in range(cfg.algorithm.ppo_epochs):
        for mb in range(n_mb):
            pairs = buf.pairs[mb::n_mb]
            used = sorted({i for p in pairs for key in _pair_keys(p, agents) for i in buf.members.get(key, [])})
            logp = {}
            # one policy: its margins' forward is its update's (kept for it); with several, each policy's graph would
            # be alive while the others run theirs, so the update's peak memory would grow: two passes instead
            for _, positions, values in _per_policy(trainer, [buf.samples[i] for i in used], used, sequence_logprobs,
                                                    keep=len(trainer.policies) == 1):
                logp.update(zip(positions, values))

            def total(key, table):
                return sum(table[i] for i in buf.members.get(key, []))

            ref = dict(enumerate(buf.ref))
            pw = torch.tensor([[total((p[0], p[1], a), logp) for a in agents] for p in pairs], dtype=torch.float64)
            pl = torch.tensor([[total((p[0], p[2], a), logp) for a in agents] for p in pairs], dtype=torch.float64)
            rw = torch.tensor([[total((p[0], p[1], a), ref) for a in agents] for p in pairs], dtype=torch.float64)
            rl = torch.tensor([[total((p[0], p[2], a), ref) for a in agents] for p in pairs], dtype=torch.float64)
            loss, grad, stats = joint_dpo(dpo_margins(pw, pl, rw, rl), cfg.preference.beta)
            weights: dict[int, float] = defaultdict(float)
            for p, g in zip(pairs, grad.tolist()):
                for a in agents:
                    for i in buf.members.get((p[0], p[1], a), []):
                        weights[i] += g
                    for i in buf.members.get((p[0], p[2], a), []):
                        weights[i] -= g
            if epoch == 0:
                acc.add(mn.PREF_LOSS, float(loss), len(pairs))
                acc.add(mn.PREF_ACCURACY, stats["accuracy"], len(pairs))
                acc.add(mn.PREF_MARGIN, stats["margin"], len(pairs))
            order = sorted(weights)
            for pname, _, result in _per_policy(trainer, [buf.samples[i] for i in order], order, weighted_logprob_update,
                                                weights=[weights[i] for i in order], step=step):
                for key, v in result.items():
                    acc.add(mn.loss_key(pname, key), v)


def madpo_step(trainer, step: int, rows: list[dict], acc: MetricAccumulator, times: dict[str, float]) -> list[Sample]:
    """One madpo step: a new round of pairs every ``preference.rounds_every`` steps (and whenever the buffer
    holds none yet), then the joint DPO update over the round's pairs."""
    buf: PairBuffer = trainer.run.parts["pairs"]
    samples: list[Sample] = []
    if step % trainer.cfg.preference.rounds_every == 0 or buf.round_step < 0:
        samples, rows = trainer.rollout(step, rows, acc, times)
        audit(trainer, step, samples, rows, acc, times)
        with trainer._phase(times, "pairs"):
            buf.new_round(trainer, samples, step, acc)
    acc.add(mn.PREF_ROUND_STEP, buf.round_step)
    with trainer._phase(times, "update"):
        preference_update(trainer, buf, step, acc)
    return samples


# --- the joint reward model -----------------------------------------------------------------------------


PREFERENCE_KEYS = ("prompts", "chosen", "rejected")


def read_preferences(path: Path, agents: tuple[str, ...]) -> list[dict[str, dict[str, str]]]:
    """The preferences of a JSONL file a person wrote (``reward_model.preferences``): one object per line with
    ``prompts``, ``chosen`` and ``rejected``, each a mapping of every agent to its text (blank lines skipped).
    Any problem is a one-line :class:`ConfigError` naming the line."""
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise ConfigError(f"reward_model.preferences={str(path)!r} {what}; pass a JSONL file of "
                          "{prompts, chosen, rejected} objects (docs/algorithms-preference.md)")
    out = []
    try:
        lines = json_lines(path, "reward_model.preferences")
    except DataFileError as err:
        raise ConfigError(str(err)) from err
    for n, item in lines:
        where = f"reward_model.preferences {path} line {n}"
        if not isinstance(item, dict) or sorted(item) != sorted(PREFERENCE_KEYS):
            got = sorted(item) if isinstance(item, dict) else type(item).__name__
            raise ConfigError(f"{where}: needs exactly the keys {list(PREFERENCE_KEYS)}, got {got}")
        for key in PREFERENCE_KEYS:
            part = item[key]
            if not isinstance(part, dict):
                raise ConfigError(f"{where}: {key!r} must map each agent to its text, got {type(part).__name__}")
            unknown = sorted(set(part) - set(agents))
            if unknown:
                raise ConfigError(f"{where}: unknown agent(s) {unknown} in {key!r}; the task's agents are "
                                  f"{list(agents)}")
            missing = sorted(set(agents) - set(part))
            if missing:
                raise ConfigError(f"{where}: {key!r} lacks agent(s) {missing}; give every agent's text")
            for a, text in part.items():
                if not isinstance(text, str):
                    raise ConfigError(f"{where}: {key}.{a} must be text, got {type(text).__name__}")
                if key != "prompts" and not text.strip():
                    raise ConfigError(f"{where}: empty completion of agent {a!r} in {key!r}; every preferred "
                                      "and rejected completion needs text")
        if item["chosen"] == item["rejected"]:
            raise ConfigError(f"{where}: 'chosen' and 'rejected' are identical; a preference needs two different "
                              "joint completions")
        out.append(item)
    if not out:
        raise ConfigError(f"reward_model.preferences {path} holds no preference; add one JSON object per line")
    return out


def rm_text(prompts: dict[str, str], completions: dict[str, str], agents: tuple[str, ...]) -> str:
    """The reward model's input for one joint action (:func:`accord.critics.joint_text`, one turn)."""
    return joint_text([(0, a, prompts[a], completions[a]) for a in agents], None, None, agents)


class RewardModel:
    """marlhf's joint reward model: trained at the first step (stage 1) unless ``reward_model.path`` gives one,
    then frozen; saved in checkpoints and exported to ``RUN_DIR/reward_model``."""

    def __init__(self, cfg: Config, run):
        self.cfg, self.run = cfg, run
        rm = cfg.reward_model
        first = cfg.policies[run.agent_policy[run.agents[0]]]
        spec = rm.path or rm.model or first.model
        kwargs = {} if rm.path else dict(rm.model_kwargs if rm.model else first.model_kwargs)
        try:
            self.model = ScalarModel("reward model", spec, kwargs, rm.lr, cfg.training, 1,
                                     seed=reward_model_seed(cfg.run.seed), device=_driver_device(cfg),
                                     max_tokens=rm.max_tokens, schedule="constant")
            if rm.path:
                self.model.load_exported(Path(rm.path))
        except (OSError, ValueError, KeyError, RuntimeError, ModelNotFoundError) as err:
            if isinstance(err, ConfigError) and not rm.path:
                raise
            what = f"reward_model.path={rm.path!r}" if rm.path else f"the reward model backbone {spec!r}"
            raise ConfigError(f"{what} does not load ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                              "); pass a directory a marlhf run exported (RUN_DIR/reward_model), or null to train "
                              "one") from err
        self.ready = bool(rm.path)
        if self.ready:
            self._freeze()

    def _freeze(self) -> None:
        self.model.model.requires_grad_(False)
        self.model.head.requires_grad_(False)
        self.model.model.eval()

    def _pairs_from_rollouts(self, trainer) -> list[tuple[str, str]]:
        """(winner text, loser text) of pairs of the initial policies' candidates on ``reward_model.prompts``
        training instances, by the team reward (pairs selected as ``preference.*`` says)."""
        cfg, run = self.cfg, self.run
        rows = list(run.train_rows)
        random.Random(reward_model_prompt_seed(cfg.run.seed)).shuffle(rows)
        rows = rows[:cfg.reward_model.prompts]
        generate = functools.partial(run.generate, temperature=None)   # each agent its own sampling
        out = []
        b = cfg.rollout.batch_size
        for start in range(0, len(rows), b):
            chunk = rows[start:start + b]
            result = run.rollout.collect(chunk, generate, step=0, phase=lambda name: contextlib.nullcontext())
            if run.rollout.recorder is not None:   # stage 1's pairs are no training step's samples: not audited
                run.rollout.recorder.take()
            pairs, members = build_pairs(result.samples, cfg, -1 - start)
            for inst, w, l, _, _ in pairs:
                texts = []
                for cand in (w, l):
                    picked = {a: result.samples[members[(inst, cand, a)][0]] for a in run.agents}
                    texts.append(rm_text({a: s.prompt_text for a, s in picked.items()},
                                         {a: s.completion_text for a, s in picked.items()}, run.agents))
                out.append((texts[0], texts[1]))
        return out

    def train_stage(self, trainer, acc: MetricAccumulator, step: int) -> None:
        """Stage 1: Bradley-Terry on the joint preferences (a file, or the team reward's), ``reward_model.epochs``
        passes; ``rm/accuracy`` on the held-out share; then frozen and exported."""
        cfg, rm = self.cfg, self.cfg.reward_model
        if rm.preferences:
            items = read_preferences(Path(rm.preferences), self.run.agents)
            pairs = [(rm_text(it["prompts"], it["chosen"], self.run.agents),
                      rm_text(it["prompts"], it["rejected"], self.run.agents)) for it in items]
        else:
            pairs = self._pairs_from_rollouts(trainer)
        acc.add(mn.RM_PAIRS, len(pairs))
        if not pairs:
            raise ConfigError("marlhf stage 1 found no preference pair: every prompt's candidates had equal team "
                              "rewards; raise reward_model.prompts or algorithm.num_generations, or give "
                              "reward_model.preferences")
        encoded, cut = [], 0
        for w, l in pairs:
            (iw, cw), (il, cl) = self.model.encode(w), self.model.encode(l)
            encoded.append((iw, il))
            cut += cw + cl
        acc.add(mn.RM_TRUNCATED_FRAC, cut / (2 * len(pairs)))
        if cut:
            logger.warning("reward model: %d of the %d preference texts are longer than %d tokens and keep only their "
                           "last %d (rm/truncated_frac); raise reward_model.max_tokens or shorten them", cut,
                           2 * len(pairs), self.model.max_tokens, self.model.max_tokens)
        rng = random.Random(reward_model_pair_seed(cfg.run.seed))
        order = list(range(len(encoded)))
        rng.shuffle(order)
        # eval_frac > 0 holds out at least one of two or more pairs (a share that rounds to none too): rm/accuracy
        # is then always the held-out pairs'
        n_eval = int(len(order) * rm.eval_frac)
        if rm.eval_frac > 0 and len(order) > 1:
            n_eval = max(n_eval, 1)
        held, train = order[:n_eval], order[n_eval:]
        model = self.model
        losses, accs = [], []
        for epoch in range(rm.epochs):
            rng.shuffle(train)
            for start in range(0, len(train), rm.batch_size):
                batch = [encoded[i] for i in train[start:start + rm.batch_size]]
                model.optimizer.zero_grad(set_to_none=True)
                for m in range(0, len(batch), max(1, cfg.training.micro_batch_size // 2)):
                    part = batch[m:m + max(1, cfg.training.micro_batch_size // 2)]
                    scores = model._scores([w for w, _ in part] + [l for _, l in part])
                    loss, accuracy = bradley_terry(scores[:len(part)], scores[len(part):])
                    (loss * len(part) / len(batch)).backward()
                    if epoch == rm.epochs - 1:
                        losses.append((loss.item(), len(part)))
                        accs.append((accuracy, len(part)))
                model._step(step, "Bradley-Terry loss")
        self._freeze()
        for key, values in ((mn.RM_LOSS, losses), (mn.RM_TRAIN_ACCURACY, accs)):
            acc.add(key, sum(v * n for v, n in values) / max(1, sum(n for _, n in values)))
        check = held if rm.eval_frac > 0 else train   # eval_frac 0: the training pairs, as documented
        if check:
            scores = model.scores([encoded[i][0] for i in check] + [encoded[i][1] for i in check])
            s = torch.tensor(scores)
            acc.add(mn.RM_ACCURACY, bradley_terry(s[:len(check)], s[len(check):])[1])
            acc.add(mn.RM_ACCURACY_PAIRS, len(check))
        else:
            logger.warning("reward model: its one preference pair is all it trains on, so none is held out and "
                           "rm/accuracy (held-out accuracy) is not logged (rm/train_accuracy is); give 2 or more pairs")
        self.ready = True
        self.export(Path(self.run.run_dir) / "reward_model")

    def export(self, target: Path) -> None:
        """Write the reward model to ``target`` atomically (a temporary sibling, then a rename)."""
        tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        self.model.export(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        logger.info("reward model exported to %s (reward_model.path reuses it)", target)

    def rescore(self, samples: list[Sample], acc: MetricAccumulator) -> None:
        """The reward model's score of each joint action becomes the training reward of its samples (``ret`` and
        ``reward``; the task's reward stays in ``extra["task_reward"]``)."""
        agents = self.run.agents
        joint: dict[tuple, dict[str, Sample]] = defaultdict(dict)
        for s in samples:
            joint[(s.instance, s.extra["sample"])][s.agent] = s
        keys = sorted(joint)
        texts, cut = [], 0
        for key in keys:
            group = joint[key]
            ids, was_cut = self.model.encode(rm_text({a: group[a].prompt_text for a in agents},
                                                     {a: group[a].completion_text for a in agents}, agents))
            texts.append(ids)
            cut += was_cut
        scores = self.model.scores(texts)
        bad = [x for x in scores if not math.isfinite(x)]
        if bad:   # the reward model's, not the task's: name it (the advantages' error would blame the task's reward)
            path = self.cfg.reward_model.path
            which = (f"reward_model.path={path!r}" if path else
                     f"the reward model stage 1 trained ({Path(self.run.run_dir) / 'reward_model'})")
            raise TrainingError(f"{which} scored {len(bad)} of the {len(scores)} joint actions {bad[0]} (its head or "
                                "backbone gives non-finite values); give reward_model.path a sound exported reward "
                                "model, or null to train one")
        for key, score in zip(keys, scores):
            for s in joint[key].values():
                s.extra["task_reward"] = s.ret
                s.ret = s.reward = float(score)
        acc.add(mn.RM_REWARD, sum(scores) / max(1, len(scores)))
        acc.add(mn.RM_TRUNCATED_FRAC, cut / max(1, len(keys)))

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        directory.mkdir(exist_ok=True)
        from safetensors.torch import save_file, save_model

        save_model(self.model.model, str(directory / "model.safetensors"))
        save_file({k: v.detach().contiguous() for k, v in self.model.head.state_dict().items()},
                  str(directory / "head.safetensors"))
        (directory / "state.json").write_text(json.dumps({"ready": self.ready}))

    def load(self, directory: Path) -> None:
        from safetensors.torch import load_file, load_model

        directory = Path(directory)
        load_model(self.model.model, str(directory / "model.safetensors"), strict=True, device="cpu")
        self.model.head.load_state_dict(load_file(str(directory / "head.safetensors"), device="cpu"))
        ready = json.loads((directory / "state.json").read_text())
        if not isinstance(ready, dict) or not isinstance(ready.get("ready"), bool):
            raise ValueError(f"{directory / 'state.json'} holds no reward model's state (\"ready\": true or false)")
        self.ready = ready["ready"]
        if self.ready:
            self._freeze()


def marlhf_step(trainer, step: int, rows: list[dict], acc: MetricAccumulator, times: dict[str, float]) -> list[Sample]:
    """One marlhf step: stage 1 first if the reward model is not trained yet, then the rollout, the reward
    model's scores as the training reward, and the online RL stage (``reward_model.rl``)."""
    rm: RewardModel = trainer.run.parts["reward_model"]
    if not rm.ready:
        with trainer._phase(times, "reward_model"):
            rm.train_stage(trainer, acc, step)
    samples, rows = trainer.rollout(step, rows, acc, times)
    # audited before the reward model's scores replace the task's: the audit checks each sample's reward against
    # the task's score of its own text, which the rollout recorded
    audit(trainer, step, samples, rows, acc, times)
    with trainer._phase(times, "rm_score"):
        rm.rescore(samples, acc)
    if stage_of(trainer.cfg) in ACTOR_CRITIC:
        return actor_critic_step(trainer, step, rows, acc, times, samples)
    trainer._policy_gradient(samples, rows, step, acc, times, audited=True)
    return samples


STEPS = {"iac": actor_critic_step, "maac": actor_critic_step, "madpo": madpo_step, "marlhf": marlhf_step}
