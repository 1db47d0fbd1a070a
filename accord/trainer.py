"""The training loop: rollout -> reward -> advantage -> update -> log -> checkpoint.

Each step is a sequence of named phases, each timed into ``time/<phase>``:

1. single-turn tasks: ``gen`` (B task instances; every agent's prompt sampled K times, one generate
   call per policy) and ``reward`` (joint actions built, aligned or cross, and scored in one
   team-reward call); multi-turn environments: ``rollout`` (a MAGRPO tree or AT-GRPO's turn-wise
   candidates, see :mod:`accord.rollout.multiturn`; generation batched per policy at every level);
2. ``adv``: group-relative advantages over the group ids the rollout assigned (or per agent);
3. ``update``: each policy updated on the samples of the agents it acts for (all policies' updates
   are submitted before any is awaited, so Ray actors train concurrently);
4. ``log`` and ``checkpoint``.

The trainer knows tasks only through :mod:`accord.envs.base` / :mod:`accord.envs.protocol`, and models
only through the policy interface (:class:`accord.policies.Policy`, LoRA adapters, Ray proxies).
"""

from __future__ import annotations

import functools
import difflib
import inspect
import logging
import random
import sys
import time
import zlib
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from accord import envs  # noqa: F401  (registers the built-in tasks)
from accord.algorithms.advantages import ADVANTAGE_ESTIMATORS, check_advantage_config, group_advantages
from accord.algorithms.losses import KL_REWARD_ESTIMATORS, POLICY_LOSSES
from accord.checkpoint import (claim_run_dir, commit_checkpoint, discard_uncheckpointed, prune_checkpoints,
                               resume_checkpoint, write_checkpoint)
from accord.callbacks import check_callbacks
from accord.config import Config, ConfigError, save_config
from accord.devices import policy_devices
from accord.distributed import gather, submit
from accord.distributed.data_parallel import LocalGroups, wants_data_parallel
from accord.envs.base import import_modules, make_task, task_factory
from accord.envs.centralized import CentralizedEnv, CentralizedTask
from accord.envs.protocol import is_env
from accord.logging import MetricAccumulator
from accord.logging.tracking import check_report_to, run_sinks
from accord.logging.eval_completions import episode_completion_rows, joint_completion_rows, write_eval_completions
from accord.policies import Policy
from accord.policies_lora import build_lora_policies, generate_by_policy
from accord.rollout.magrpo import build_samples, sample_returns, score_joint_actions
from accord.rollout.multiturn import atgrpo_rollout, check_tree_size, magrpo_tree, play_episodes
from accord.rollout.sample import Completion, prompt_group_ids

logger = logging.getLogger(__name__)


def check_registered(cfg: Config) -> None:
    """``algorithm.advantage`` and ``algorithm.loss`` name registered functions (after ``imports:``)."""
    for key, registry, register in (("advantage", ADVANTAGE_ESTIMATORS, "register_advantage"),
                                    ("loss", POLICY_LOSSES, "register_loss")):
        name = getattr(cfg.algorithm, key)
        if name not in registry:
            close = difflib.get_close_matches(name, list(registry), n=1)
            hint = f" did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"algorithm.{key}={name!r} is not registered;{hint} registered: {sorted(registry)}. "
                              f"Register your own with accord.algorithms.{register} in a module listed under "
                              "imports:")


def build_task(cfg: Config):
    """The task or environment a config names, with its baseline variant applied."""
    import_modules(cfg.imports)
    check_registered(cfg)
    algo, options = cfg.algorithm, dict(cfg.task.options)
    if algo.baseline == "single_agent":
        if "single_agent" not in inspect.signature(task_factory(cfg.task.name)[0]).parameters:
            raise ConfigError(f"algorithm.baseline=single_agent: task {cfg.task.name!r} has no single-agent variant "
                              "(no `single_agent` option); use baseline=centralized for a one-model baseline")
        options["single_agent"] = True
    task = make_task(cfg.task.name, options)
    if algo.baseline == "centralized":
        wrap = CentralizedEnv if is_env(task) else CentralizedTask
        task = wrap(task, parse_penalty=algo.parse_penalty)
    return task


def build_policy(cfg: Config, name: str, index: int, total_optimizer_steps: int, device=None) -> Policy:
    """Policy ``name`` of a config; ``index`` is its position among the sorted policy names (its seed
    offset); ``device`` where its model lives (default the CPU; see :mod:`accord.devices`). The Ray
    backend calls this inside each policy's actor, so both backends build the same."""
    return Policy(name, cfg.policies[name], cfg.training, cfg.algorithm, cfg.rollout, total_optimizer_steps,
                  seed=cfg.run.seed + index, device=device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def reset_peak_memory() -> bool:
    """Start a new per-step memory high-water mark; True when the CPU one could be reset.

    On Linux, writing "5" to /proc/self/clear_refs resets the process's peak RSS (``VmHWM``, and
    with it ``ru_maxrss``); where that is not permitted the CPU peak stays the high-water mark since
    the process started. On CUDA the allocator's peak is reset too."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(i)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_metrics(peak_is_per_step: bool) -> dict[str, float]:
    """``mem/peak_rss_mb`` (process RSS high-water: this step's when it could be reset, else since
    start), ``mem/rss_mb`` (current RSS) and, on CUDA, ``mem/cuda_peak_mb`` (this step's peak)."""
    out: dict[str, float] = {}
    try:
        status = Path("/proc/self/status").read_text()
        for line in status.splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out["mem/peak_rss_mb" if key == "VmHWM" else "mem/rss_mb"] = int(value.split()[0]) / 1024
    except OSError:
        import resource  # ru_maxrss: KiB on Linux, bytes on macOS; a high-water mark since start

        scale = 1024 * 1024 if sys.platform == "darwin" else 1024
        out["mem/peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale
        peak_is_per_step = False
    out["mem/peak_is_per_step"] = float(peak_is_per_step)
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # summed over this process's GPUs
        out["mem/cuda_peak_mb"] = sum(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count())) / 2**20
    return out


class Trainer:
    """Builds everything a config names and runs MAGRPO steps."""

    def __init__(self, cfg: Config, *, resume: bool = False, overwrite: bool = False, callbacks=None):
        self.cfg = cfg
        self.callbacks = check_callbacks(callbacks)  # see accord.callbacks
        check_report_to(cfg.logging.report_to)  # a tracker's package is missing: say so before models load
        claim_run_dir(cfg.run_dir, resume=resume, overwrite=overwrite)  # before the (slow) build: fail fast
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        seed_everything(cfg.run.seed)
        self.task = build_task(cfg)
        self.multi_turn = is_env(self.task)
        cfg.resolve_agents(tuple(self.task.agents))
        self.agents = tuple(a.name for a in cfg.agents)
        self.agent_policy = {a.name: a.policy for a in cfg.agents}
        per_policy = defaultdict(int)
        for a in cfg.agents:
            per_policy[a.policy] += 1
        algo = cfg.algorithm
        check_advantage_config(algo.advantage, algo.normalize_std)
        if self.multi_turn:
            self.turns = cfg.rollout.max_turns or self.task.max_turns
            if algo.name == "atgrpo" and self.task.simultaneous:
                raise ConfigError(f"algorithm.name=atgrpo needs a turn-based environment; {self.task.name!r} is "
                                  "simultaneous (set its option simultaneous=false if it has one, or use magrpo)")
            if algo.name == "magrpo":
                if algo.joint_mode == "cross" and not self.task.simultaneous:
                    raise ConfigError("algorithm.joint_mode=cross needs a simultaneous environment (in a turn-based "
                                      "one later agents see earlier actions); use joint_mode=aligned")
                check_tree_size(cfg.rollout.batch_size, len(self.agents), algo.num_generations, self.turns,
                                algo.joint_mode, cfg.rollout.max_tree_generations)
        else:
            if algo.name == "atgrpo":
                raise ConfigError(f"algorithm.name=atgrpo needs a multi-turn environment; {cfg.task.name!r} is a "
                                  "single-turn task: use algorithm.name=magrpo (see `accord envs`)")
            if algo.baseline == "independent":
                raise ConfigError(f"algorithm.baseline=independent needs per-agent local rewards; the single-turn task "
                                  f"{cfg.task.name!r} has only a team reward")
            cfg.validate_sizes(dict(per_policy))
            if algo.joint_mode == "cross" and algo.num_generations ** len(self.agents) > algo.max_cross_joint:
                raise ConfigError(
                    f"cross mode makes K^N = {algo.num_generations}^{len(self.agents)} joint actions per instance, "
                    f"more than algorithm.max_cross_joint={algo.max_cross_joint}; lower algorithm.num_generations "
                    "or use joint_mode=aligned")
        split = self.task.tasks if self.multi_turn else self.task.rows
        self.train_rows = split("train", limit=cfg.task.train_size, seed=cfg.run.seed)
        self.eval_rows = split("eval", limit=cfg.task.eval_size, seed=cfg.run.seed) if cfg.task.eval_size else []
        if not self.train_rows:
            raise ConfigError(f"task {cfg.task.name!r} has no training instances; check task.options and task.train_size")
        overlap = {r.get("id") for r in self.train_rows} & {r.get("id") for r in self.eval_rows}
        if overlap - {None}:
            raise ConfigError(f"task {cfg.task.name!r}: {len(overlap)} instances are in both train and eval splits")
        self._gen_tokens = 0
        total_opt = cfg.run.steps * algo.ppo_epochs * cfg.training.num_mini_batches
        self.policies: dict[str, Policy] = {}
        self.backend = None
        if cfg.run.backend == "ray":  # one actor per policy, built there with build_policy
            from accord.distributed.ray_backend import RayBackend

            self.backend = RayBackend(cfg.ray)
            self.policies = self.backend.start_policies(cfg, sorted(per_policy), total_opt)
        elif wants_data_parallel(cfg, sorted(per_policy)):  # policies.<name>.replicas, or launched by torchrun
            self.backend = LocalGroups(cfg)
            self.policies = self.backend.start_policies(cfg, sorted(per_policy), total_opt, build_policy)
        elif cfg.specialization == "lora":  # one frozen base, one adapter per policy
            devices = policy_devices(cfg, sorted(per_policy))
            self.policies = build_lora_policies(cfg, sorted(per_policy), total_opt, seed=cfg.run.seed,
                                                device=devices[min(per_policy)])
        else:
            devices = policy_devices(cfg, sorted(per_policy))  # checked before any model is loaded
            for i, name in enumerate(sorted(per_policy)):
                self.policies[name] = build_policy(cfg, name, i, total_opt, device=devices[name])
        self._perm_epoch, self._perm = -1, []
        self.run_dir = cfg.run_dir
        self.start_step = 0
        if resume:
            state = resume_checkpoint(self.run_dir, self.policies)
            if state is None:  # killed before its first checkpoint: the same seed replays it exactly
                logger.warning("%s has no checkpoint yet: starting the run over from step 0", self.run_dir)
                discard_uncheckpointed(self.run_dir)
            else:
                self.start_step = state["step"]
                if self.start_step > cfg.run.steps:
                    raise ConfigError(f"run.steps={cfg.run.steps} is below step {self.start_step} of the checkpoint "
                                      f"{state['path']}; resume with run.steps={self.start_step} or more")
                prune_checkpoints(self.run_dir, cfg.run.keep_checkpoints, state["path"])  # a kill before the prune
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
    def _complete(self, requests: list[tuple[str, list[dict]]], n: int, greedy: bool,
                  temperature: float, stream: str | None = None) -> list[list[Completion]]:
        """``n`` completions of each (agent, chat) request; one generate call per policy for all of them
        (one call for all adapters of a LoRA base with lora.mixed_generation)."""
        encoded = [self.policies[self.agent_policy[a]].encode_chat(msgs) for a, msgs in requests]
        out: list[list[Completion | None]] = [[None] * n for _ in requests]
        by_policy = {}
        for pname in self.policies:
            slots = [(r, s) for r, (a, _) in enumerate(requests) if self.agent_policy[a] == pname for s in range(n)]
            if slots:
                by_policy[pname] = slots
        all_gens = generate_by_policy(self.policies, {p: [encoded[r] for r, _ in sl] for p, sl in by_policy.items()},
                                      greedy=greedy, temperature=temperature, stream=stream)
        for pname, slots in by_policy.items():
            pol, gens = self.policies[pname], all_gens[pname]
            for (r, s), g in zip(slots, gens):
                out[r][s] = Completion(encoded[r], g.ids, g.logprobs, g.finish_reason, pol.decode(g.ids))
                self._gen_tokens += len(g.ids)
        return out

    def _generate(self, rows: list[dict], k: int, greedy: bool, temperature: float, stream: str | None = None):
        """Single-turn tasks: every agent's prompt for every row, sampled k times."""
        requests = [(a, self.task.prompt(a, row)) for a in self.agents for row in rows]
        outs = iter(self._complete(requests, k, greedy, temperature, stream))
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

    # --- one step ----------------------------------------------------------------------------------
    def _rollout(self, step: int, rows: list[dict], acc: MetricAccumulator):
        """Generate and score one step's samples; returns them (rewards and returns credited)."""
        cfg, algo = self.cfg, self.cfg.algorithm
        k = algo.num_generations
        complete = functools.partial(self._complete, temperature=cfg.rollout.temperature)
        if self.multi_turn:
            with self._phase(acc, "rollout"):
                make_env = functools.partial(build_task, cfg)
                seed = cfg.run.seed * 1_000_003 + step * len(rows)
                if algo.name == "atgrpo":
                    alpha = 0.0 if algo.baseline == "independent" else algo.alpha
                    samples, raw, _ = atgrpo_rollout(make_env, rows, complete, agent_policy=self.agent_policy, k=k,
                                                     turns=self.turns, alpha=alpha,
                                                     history_turns=cfg.rollout.history_turns, seed=seed)
                else:
                    samples, raw = magrpo_tree(
                        make_env, rows, complete, agent_policy=self.agent_policy, k=k, turns=self.turns,
                        mode=algo.joint_mode, gamma=algo.gamma,
                        reward_mode="local" if algo.baseline == "independent" else "team",
                        early_stop_reward=algo.early_stop_reward, history_turns=cfg.rollout.history_turns, seed=seed)
            for key, values in raw.items():
                for v in values:
                    acc.add(key, v)
            return samples
        with self._phase(acc, "gen"):
            prompt_ids, prompt_texts, gens, texts = self._generate(rows, k, greedy=False,
                                                                   temperature=cfg.rollout.temperature)
        with self._phase(acc, "reward"):
            joint = score_joint_actions(self.task, self.agents, rows, texts, prompt_texts, k, algo.joint_mode)
            returns = sample_returns(joint, len(rows), len(self.agents), k, algo.joint_mode)
            samples = build_samples(self.agents, self.agent_policy, prompt_ids, prompt_texts, gens, texts, returns,
                                    aligned=algo.joint_mode == "aligned", components=joint.components)
        for r in joint.rewards:
            acc.add("team/reward", r)
        for key, value in joint.component_means().items():
            acc.add(f"reward/{key}", value)
        by_inst = defaultdict(list)
        for b, r in zip(joint.instance, joint.rewards):
            by_inst[b].append(r)
        for rs in by_inst.values():
            acc.add("team/reward_best", max(rs))
        return samples

    def train_step(self, step: int) -> tuple[dict[str, float], list[dict]]:
        algo = self.cfg.algorithm
        acc = MetricAccumulator()
        rows = self.batch_rows(step)
        t_step = time.perf_counter()
        self._gen_tokens = 0
        per_step_peak = reset_peak_memory()
        samples = self._rollout(step, rows, acc)
        if algo.kl_coef > 0 and algo.kl_estimator in KL_REWARD_ESTIMATORS:
            with self._phase(acc, "kl"):
                self._kl_reward_penalty(samples, acc)
        with self._phase(acc, "adv"):
            if algo.norm_scope == "agent":
                groups = [self.agents.index(s.agent) for s in samples]
            elif algo.norm_scope == "prompt":
                groups = prompt_group_ids(samples)
            else:
                groups = [s.group for s in samples]
            adv = group_advantages(torch.tensor([s.ret for s in samples]), torch.tensor(groups),
                                   algo.advantage, algo.normalize_std, std_ddof=int(algo.group_std == "sample"))
            for s, a in zip(samples, adv.tolist()):
                s.advantage = a
            # groups whose members all have the same return carry no learning signal (every advantage 0)
            spread = defaultdict(set)
            for s, g in zip(samples, groups):
                spread[g].add(s.ret)
            for values in spread.values():
                acc.add("adv/zero_std_frac", float(len(values) == 1))
        with self._phase(acc, "update"):  # all policies' updates sent first: concurrent on the Ray backend
            jobs = {}
            for pname, pol in self.policies.items():
                mine = [s for s in samples if s.policy == pname]
                if mine:
                    jobs[pname] = submit(pol, "update", mine, step)
            for pname, stats in zip(jobs, gather(list(jobs.values()))):
                for key, v in stats.items():
                    acc.add(key if key.startswith("mem/") else f"loss/{pname}/{key}", v)
        elapsed = time.perf_counter() - t_step
        acc.add("time/step", elapsed)
        gen_time = acc.mean().get("time/gen", acc.mean().get("time/rollout", 0.0))
        acc.add("perf/gen_tokens_per_s", self._gen_tokens / max(gen_time, 1e-9))
        acc.add("perf/completions_per_s", len(samples) / elapsed)
        acc.add("perf/samples", len(samples))
        acc.add("perf/gen_tokens", self._gen_tokens)
        for key, v in memory_metrics(per_step_peak).items():
            acc.add(key, v)
        for s in samples:
            acc.add(f"agent/{s.agent}/reward", s.ret)
            acc.add(f"agent/{s.agent}/completion_len", len(s.completion_ids))
            acc.add(f"agent/{s.agent}/stop_frac", float(s.finish_reason == "stop"))
            acc.add("adv/abs_mean", abs(s.advantage))
        table = [{"prompt": s.prompt_text, "agent": s.agent, "completion": s.completion_text, "reward": s.reward,
                  "return": s.ret, "advantage": s.advantage, "group": s.group, "turn": s.turn,
                  "instance": rows[s.instance].get("id", s.instance), "finish_reason": s.finish_reason,
                  "joint": s.extra.get("joint"), "sample": s.extra.get("sample"),
                  **({"components": s.extra["components"]} if "components" in s.extra else {})}
                 for s in samples]
        return acc.mean(), table

    def _kl_reward_penalty(self, samples: list, acc: MetricAccumulator) -> None:
        """``kl_estimator: k1``: subtract ``kl_coef`` x the sample's summed log-ratio to the reference
        from its return (before advantages), so the policy gradient carries the reverse KL's gradient."""
        coef = self.cfg.algorithm.kl_coef
        jobs = {p: submit(pol, "kl_rewards", [s for s in samples if s.policy == p]) for p, pol in self.policies.items()
                if any(s.policy == p for s in samples)}
        for pname, kls in zip(jobs, gather(list(jobs.values()))):
            mine = [s for s in samples if s.policy == pname]
            for s, (kl, _) in zip(mine, kls):
                s.ret -= coef * kl
            acc.add(f"loss/{pname}/kl", sum(kl for kl, _ in kls) / max(1, sum(n for _, n in kls)))

    @contextmanager
    def _phase(self, acc: MetricAccumulator, name: str):
        t = time.perf_counter()
        if self.sinks is not None:
            self.sinks.set_activity(name)  # named in the console's heartbeat line
        yield
        acc.add(f"time/{name}", time.perf_counter() - t)

    # --- evaluation --------------------------------------------------------------------------------
    def evaluate(self, step: int | None = None) -> dict[str, float]:
        """Held-out instances, no branching: one joint action (single-turn) or one episode (multi-turn)
        each, greedy unless rollout.eval_temperature > 0. ``eval/team/reward`` is the team reward
        (single-turn) or the episode's team return (multi-turn). With ``step``, the completions are
        written to ``RUN_DIR/eval_completions/step_N.jsonl`` (see :mod:`accord.logging.eval_completions`)."""
        if not self.eval_rows:
            return {}
        temp = self.cfg.rollout.eval_temperature
        acc = MetricAccumulator()
        t = time.perf_counter()
        if self.sinks is not None:
            self.sinks.set_activity("eval")
        eval_seed = self.cfg.run.seed + 7919
        for pname, pol in self.policies.items():   # the same stream at every evaluation; training's is untouched
            pol.seed_stream("eval", eval_seed + zlib.crc32(pname.encode()))
        with torch.random.fork_rng():
            torch.manual_seed(eval_seed)
            if self.multi_turn:
                complete = functools.partial(self._complete, temperature=temp or 1.0, stream="eval")
                episodes = play_episodes(functools.partial(build_task, self.cfg), self.eval_rows, complete,
                                         turns=self.turns, history_turns=self.cfg.rollout.history_turns,
                                         seed=self.cfg.run.seed + 7919, greedy=temp == 0)
                for ep in episodes:
                    acc.add("eval/team/reward", ep.team_return)
                    acc.add("eval/success", float(ep.success))
                    acc.add("eval/turns", max(len(h) for h in ep.history.values()))
                    for a in self.agents:   # an agent's own (local) return; the summary shows it where it differs
                        acc.add(f"eval/agent/{a}/return", ep.local_return.get(a, 0.0))
                table = episode_completion_rows(self.eval_rows, episodes)
            else:
                _, prompt_texts, gens, texts = self._generate(self.eval_rows, 1, greedy=temp == 0, stream="eval",
                                                              temperature=temp or 1.0)
        if not self.multi_turn:
            joint = score_joint_actions(self.task, self.agents, self.eval_rows, texts, prompt_texts, 1, "aligned")
            for r in joint.rewards:
                acc.add("eval/team/reward", r)
            for key, value in joint.component_means().items():
                acc.add(f"eval/reward/{key}", value)
            table = joint_completion_rows(self.eval_rows, self.agents, prompt_texts, gens, texts, joint)
            for a in self.agents:
                for b in range(len(self.eval_rows)):
                    acc.add(f"eval/agent/{a}/completion_len", len(gens[a][b][0].ids))
        if step is not None:
            write_eval_completions(self.run_dir, step, table)
        acc.add("time/eval", time.perf_counter() - t)
        return acc.mean()

    def _callback(self, hook: str, *args) -> None:
        """Call ``hook`` of every callback, in order."""
        for cb in self.callbacks:
            getattr(cb, hook)(*args)

    def close(self) -> None:
        """Release the policies' Ray actors (and a local Ray cluster the trainer started); no-op locally."""
        if getattr(self, "backend", None) is not None:
            self.backend.close()
            self.backend = None

    # --- the loop ----------------------------------------------------------------------------------
    def train(self, stop_after: int | None = None) -> dict[str, float]:
        """Run to ``run.steps`` (or stop after ``stop_after`` total steps, for tests of resume).

        Returns the last step's metrics merged with the final evaluation.
        """
        cfg = self.cfg
        self.sinks = run_sinks(cfg, self.run_dir, start_step=self.start_step)
        last: dict[str, float] = {}
        end = cfg.run.steps if stop_after is None else min(stop_after, cfg.run.steps)
        try:
            if self.start_step == 0 and cfg.run.eval_before and self.eval_rows:
                before = self.evaluate(step=0)
                self._callback("on_evaluate", 0, dict(before))
                self.sinks.log(0, before)
                logger.info("eval before training: team reward %.4f", before["eval/team/reward"])
            for step in range(self.start_step, end):
                metrics, table = self.train_step(step)
                n = step + 1
                final = n == cfg.run.steps
                if (cfg.run.eval_every and n % cfg.run.eval_every == 0) or (final and cfg.run.eval_after):
                    evaluation = self.evaluate(step=n)
                    self._callback("on_evaluate", n, dict(evaluation))
                    metrics.update(evaluation)
                ce = cfg.logging.completions_every
                if ce and (n % ce == 0 or final):   # the last step's always: the report shows its best and worst
                    self.sinks.log_completions(n, table)
                if (cfg.run.checkpoint_every and n % cfg.run.checkpoint_every == 0) or n == end:
                    t = time.perf_counter()
                    tmp = write_checkpoint(self.run_dir, n, self.policies,
                                           {"data_position": n * cfg.rollout.batch_size})
                    metrics["time/checkpoint"] = time.perf_counter() - t
                    # the step's metrics (fsynced) before the rename: a checkpoint never exists without them, and
                    # a resume cuts metrics.jsonl back to the checkpoint it loads, so every step is logged once
                    self.sinks.log(n, metrics)
                    self.sinks.flush()
                    path = commit_checkpoint(self.run_dir, tmp, n, cfg.run.keep_checkpoints)
                    self._callback("on_checkpoint", n, path)
                else:
                    self.sinks.log(n, metrics)
                self._callback("on_step_end", n, dict(metrics))
                last = metrics
            self._callback("on_train_end", dict(last))
        finally:
            self.sinks.close()
        return last


def train(cfg: Config, *, resume: bool = False, overwrite: bool = False, callbacks=None) -> Path:
    """Build a trainer from a config, run it (calling ``callbacks``, see :mod:`accord.callbacks`), and return
    the run directory (``overwrite``: delete an earlier run in the same directory first; without it that is
    an error)."""
    trainer = Trainer(cfg, resume=resume, overwrite=overwrite, callbacks=callbacks)
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer.run_dir
