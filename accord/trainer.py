"""The training loop: rollout -> reward -> advantage -> update -> log -> checkpoint.

Each step is a sequence of named phases, each timed into ``time/<phase>``:

1. ``gen``: B task instances; every agent's prompt sampled K times, one generate call per policy;
2. ``reward``: joint actions built (aligned or cross) and scored in one team-reward call;
3. ``adv``: group-relative advantages, one group per (instance, agent);
4. ``update``: each policy updated on the samples of the agents it acts for;
5. ``log`` and ``checkpoint``.

The trainer knows tasks only through :mod:`accord.envs.base` and models only through
:class:`accord.policies.Policy`.
"""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from accord import envs  # noqa: F401  (registers the built-in tasks)
from accord.algorithms.advantages import check_advantage_config, group_advantages
from accord.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from accord.config import Config, ConfigError, save_config
from accord.envs.base import make_task
from accord.generation import generate
from accord.logging import MetricAccumulator, make_sinks
from accord.policies import Policy
from accord.rollout.magrpo import build_samples, sample_returns, score_joint_actions

logger = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    """Builds everything a config names and runs MAGRPO steps."""

    def __init__(self, cfg: Config, *, resume: bool = False):
        self.cfg = cfg
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        seed_everything(cfg.run.seed)
        self.task = make_task(cfg.task.name, cfg.task.options)
        cfg.resolve_agents(tuple(self.task.agents))
        self.agents = tuple(a.name for a in cfg.agents)
        self.agent_policy = {a.name: a.policy for a in cfg.agents}
        per_policy = defaultdict(int)
        for a in cfg.agents:
            per_policy[a.policy] += 1
        cfg.validate_sizes(dict(per_policy))
        algo = cfg.algorithm
        if algo.joint_mode == "cross" and algo.num_generations ** len(self.agents) > algo.max_cross_joint:
            raise ConfigError(
                f"cross mode makes K^N = {algo.num_generations}^{len(self.agents)} joint actions per instance, more "
                f"than algorithm.max_cross_joint={algo.max_cross_joint}; lower algorithm.num_generations or use "
                "joint_mode=aligned")
        check_advantage_config(algo.advantage, algo.normalize_std)
        self.train_rows = self.task.rows("train", limit=cfg.task.train_size, seed=cfg.run.seed)
        self.eval_rows = self.task.rows("eval", limit=cfg.task.eval_size, seed=cfg.run.seed) if cfg.task.eval_size else []
        if not self.train_rows:
            raise ConfigError(f"task {cfg.task.name!r} has no training instances; check task.options and task.train_size")
        overlap = {r.get("id") for r in self.train_rows} & {r.get("id") for r in self.eval_rows}
        if overlap - {None}:
            raise ConfigError(f"task {cfg.task.name!r}: {len(overlap)} instances are in both train and eval splits")
        total_opt = cfg.run.steps * algo.ppo_epochs * cfg.training.num_mini_batches
        self.policies: dict[str, Policy] = {}
        for i, name in enumerate(sorted(per_policy)):
            self.policies[name] = Policy(name, cfg.policies[name], cfg.training, algo, cfg.rollout, total_opt,
                                         seed=cfg.run.seed + i)
        self._perm_epoch, self._perm = -1, []
        self.run_dir = cfg.run_dir
        self.start_step = 0
        if resume:
            ckpt = latest_checkpoint(self.run_dir)
            if ckpt is None:
                raise FileNotFoundError(f"{self.run_dir} has no checkpoint to resume from; start it without --resume")
            state = load_checkpoint(ckpt, self.policies)
            self.start_step = state["step"]
            logger.info("resumed %s at step %d", self.run_dir, self.start_step)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.run_dir / "config.yaml")  # on resume too: overrides (e.g. run.steps) are part of the run
        self.sinks = None

    # --- data --------------------------------------------------------------------------------------
    def batch_rows(self, step: int) -> list[dict]:
        """Instances of a step: a fresh seeded permutation of the training set each epoch; the data
        position is a function of the step, so resume needs no iterator state."""
        n, b = len(self.train_rows), self.cfg.rollout.batch_size
        out = []
        for i in range(step * b, (step + 1) * b):
            epoch, pos = divmod(i, n)
            out.append(self.train_rows[self._permutation(epoch)[pos]])
        return out

    def _permutation(self, epoch: int) -> list[int]:
        if self._perm_epoch != epoch:
            perm = list(range(len(self.train_rows)))
            random.Random(self.cfg.run.seed * 1_000_003 + epoch).shuffle(perm)
            self._perm_epoch, self._perm = epoch, perm
        return self._perm

    # --- rollout -----------------------------------------------------------------------------------
    def _generate(self, rows: list[dict], k: int, greedy: bool, temperature: float):
        """Prompts of every agent for every row, sampled k times; one generate call per policy."""
        prompt_ids = {a: [] for a in self.agents}
        prompt_texts = {a: [] for a in self.agents}
        for a in self.agents:
            pol = self.policies[self.agent_policy[a]]
            for row in rows:
                messages = self.task.prompt(a, row)
                prompt_ids[a].append(pol.encode_chat(messages))
                prompt_texts[a].append(messages[-1]["content"])
        gens = {a: [[None] * k for _ in rows] for a in self.agents}
        texts = {a: [[""] * k for _ in rows] for a in self.agents}
        n_tokens = 0
        for pname, pol in self.policies.items():
            slots = [(a, b, s) for a in self.agents if self.agent_policy[a] == pname
                     for b in range(len(rows)) for s in range(k)]
            # fp32 even with training.bf16: bf16 autocast makes CPU decoding about 4x slower
            outs = generate(pol.model, pol.tokenizer, [prompt_ids[a][b] for a, b, _ in slots],
                            max_new_tokens=self.cfg.rollout.max_new_tokens, temperature=temperature,
                            top_k=self.cfg.rollout.top_k, top_p=self.cfg.rollout.top_p, greedy=greedy,
                            batch_size=self.cfg.rollout.generation_batch_size, name=pname)
            for (a, b, s), g in zip(slots, outs):
                gens[a][b][s] = g
                texts[a][b][s] = pol.decode(g.ids)
                n_tokens += len(g.ids)
        return prompt_ids, prompt_texts, gens, texts, n_tokens

    # --- one step ----------------------------------------------------------------------------------
    def train_step(self, step: int) -> tuple[dict[str, float], list[dict]]:
        cfg, algo = self.cfg, self.cfg.algorithm
        k = algo.num_generations
        acc = MetricAccumulator()
        rows = self.batch_rows(step)
        t_step = time.perf_counter()
        with self._phase(acc, "gen"):
            prompt_ids, prompt_texts, gens, texts, n_tokens = self._generate(
                rows, k, greedy=False, temperature=cfg.rollout.temperature)
        with self._phase(acc, "reward"):
            joint = score_joint_actions(self.task, self.agents, rows, texts, prompt_texts, k, algo.joint_mode)
            returns = sample_returns(joint, len(rows), len(self.agents), k, algo.joint_mode)
            samples = build_samples(self.agents, self.agent_policy, prompt_ids, prompt_texts, gens, texts, returns)
        with self._phase(acc, "adv"):
            adv = group_advantages(torch.tensor([s.ret for s in samples]), torch.tensor([s.group for s in samples]),
                                   algo.advantage, algo.normalize_std)
            for s, a in zip(samples, adv.tolist()):
                s.advantage = a
        with self._phase(acc, "update"):
            for pname, pol in self.policies.items():
                mine = [s for s in samples if s.policy == pname]
                for key, v in pol.update(mine, step).items():
                    acc.add(f"loss/{pname}/{key}", v)
        elapsed = time.perf_counter() - t_step
        acc.add("time/step", elapsed)
        acc.add("perf/gen_tokens_per_s", n_tokens / max(acc.mean()["time/gen"], 1e-9))
        acc.add("perf/completions_per_s", len(samples) / elapsed)
        for r in joint.rewards:
            acc.add("team/reward", r)
        by_inst = defaultdict(list)
        for b, r in zip(joint.instance, joint.rewards):
            by_inst[b].append(r)
        for rs in by_inst.values():
            acc.add("team/reward_best", max(rs))
        for s in samples:
            acc.add(f"agent/{s.agent}/reward", s.ret)
            acc.add(f"agent/{s.agent}/completion_len", len(s.completion_ids))
            acc.add(f"agent/{s.agent}/stop_frac", float(s.finish_reason == "stop"))
            acc.add("adv/abs_mean", abs(s.advantage))
        table = [{"prompt": s.prompt_text, "agent": s.agent, "completion": s.completion_text, "reward": s.reward,
                  "return": s.ret, "advantage": s.advantage, "group": s.group, "turn": s.turn,
                  "instance": rows[s.instance].get("id", s.instance), "finish_reason": s.finish_reason}
                 for s in samples]
        return acc.mean(), table

    @contextmanager
    def _phase(self, acc: MetricAccumulator, name: str):
        t = time.perf_counter()
        yield
        acc.add(f"time/{name}", time.perf_counter() - t)

    # --- evaluation --------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """One joint action per held-out instance (greedy unless rollout.eval_temperature > 0)."""
        if not self.eval_rows:
            return {}
        temp = self.cfg.rollout.eval_temperature
        acc = MetricAccumulator()
        t = time.perf_counter()
        with torch.random.fork_rng():  # evaluation must not shift the training RNG stream
            torch.manual_seed(self.cfg.run.seed + 7919)
            _, prompt_texts, gens, texts, _ = self._generate(self.eval_rows, 1, greedy=temp == 0,
                                                             temperature=temp or 1.0)
        joint = score_joint_actions(self.task, self.agents, self.eval_rows, texts, prompt_texts, 1, "aligned")
        for r in joint.rewards:
            acc.add("eval/team/reward", r)
        for a in self.agents:
            for b in range(len(self.eval_rows)):
                acc.add(f"eval/agent/{a}/completion_len", len(gens[a][b][0].ids))
        acc.add("time/eval", time.perf_counter() - t)
        return acc.mean()

    # --- the loop ----------------------------------------------------------------------------------
    def train(self, stop_after: int | None = None) -> dict[str, float]:
        """Run to ``run.steps`` (or stop after ``stop_after`` total steps, for tests of resume).

        Returns the last step's metrics merged with the final evaluation.
        """
        cfg = self.cfg
        self.sinks = make_sinks(self.run_dir, total_steps=cfg.run.steps, start_step=self.start_step,
                                tensorboard=cfg.logging.tensorboard, console=cfg.logging.console,
                                resume_from_step=self.start_step if self.start_step else None)
        last: dict[str, float] = {}
        end = cfg.run.steps if stop_after is None else min(stop_after, cfg.run.steps)
        try:
            if self.start_step == 0 and cfg.run.eval_before and self.eval_rows:
                before = self.evaluate()
                self.sinks.log(0, before)
                logger.info("eval before training: team reward %.4f", before["eval/team/reward"])
            for step in range(self.start_step, end):
                metrics, table = self.train_step(step)
                n = step + 1
                final = n == cfg.run.steps
                if (cfg.run.eval_every and n % cfg.run.eval_every == 0) or (final and cfg.run.eval_after):
                    metrics.update(self.evaluate())
                ce = cfg.logging.completions_every
                if ce and n % ce == 0:
                    self.sinks.log_completions(n, table)
                if (cfg.run.checkpoint_every and n % cfg.run.checkpoint_every == 0) or n == end:
                    t = time.perf_counter()
                    save_checkpoint(self.run_dir, n, self.policies, {"data_position": n * cfg.rollout.batch_size},
                                    cfg.run.keep_checkpoints)
                    metrics["time/checkpoint"] = time.perf_counter() - t
                self.sinks.log(n, metrics)
                last = metrics
        finally:
            self.sinks.close()
        return last


def train(cfg: Config, *, resume: bool = False) -> Path:
    """Build a trainer from a config, run it, and return the run directory."""
    trainer = Trainer(cfg, resume=resume)
    trainer.train()
    return trainer.run_dir
