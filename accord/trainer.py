"""The training loop: rollout -> advantage -> update -> log -> checkpoint.

The run's parts (environment, policies, rollout, generator, data, backend) are built by
:func:`accord.build.build_run`; the trainer only loops. Each step is a sequence of named phases, each
timed into ``time/<phase>``:

1. the rollout's phases (see :mod:`accord.rollout.base`): single-turn tasks ``gen`` (B task instances;
   every agent's prompt sampled K times, one generate call per policy) and ``reward`` (joint actions
   built, aligned or cross, and scored in one team-reward call); multi-turn environments ``rollout`` (a
   MAGRPO tree or AT-GRPO's turn-wise candidates; generation batched per policy at every level); with
   ``rollout.drop_flat_groups`` groups without reward spread are dropped and more rounds rolled out
   (:mod:`accord.rollout.dynamic`; a phase's time is summed over the rounds); then ``audit``
   (``training.audit``: the step's groups recorded and, strict, checked; :mod:`accord.audit`);
2. overlong shaping (:mod:`accord.algorithms.shaping`), ``kl`` (with a k1 KL penalty on the reward) and
   ``adv``: group-relative advantages over the group ids the rollout assigned (or per agent, or per
   prompt), each agent with its own estimator where ``agents[].advantage`` names one;
3. ``update``: each policy updated on the samples of the agents it acts for (all policies' updates
   are submitted before any is awaited, so Ray actors train concurrently); frozen agents
   (``trainable: false``), agents out of turn (``algorithm.alternate_every``, :mod:`accord.algorithms.schedule`)
   and, with ``algorithm.overlong.mask_truncated``, completions cut at their length cap are left out;
4. ``eval`` (:func:`accord.evaluate.evaluate_run`), ``log`` and ``checkpoint``.

The trainer knows neither the environment nor the generation backend: it sees the rollout interface
and the policy interface (:class:`accord.policies.Policy`: whole models, LoRA adapters, data-parallel ranks, Ray proxies).
"""

from __future__ import annotations

import functools
import logging
import math
import random
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch
import yaml

from accord import metric_names as mn
from accord.algorithms.advantages import group_advantages
from accord.algorithms.losses import KL_REWARD_ESTIMATORS
from accord.algorithms.schedule import AlternationSchedule
from accord.algorithms.shaping import overlong_penalty
from accord.audit import audit_step
from accord.build import Run, RunComplete, build_run
from accord.callbacks import check_callbacks
from accord.checkpoint import (WRITE_ERRORS, CheckpointError, check_run_dir_kept, commit_checkpoint, discard_written,
                               disk_full_error, folder_identity, is_disk_full, write_checkpoint)
from accord.config import Config
from accord.distributed import gather, submit
from accord.evaluate import evaluate_run
from accord.policies.protocol import TrainingError
from accord.tracking import MetricAccumulator
from accord.tracking.report_to import run_sinks
from accord.rollout.dynamic import extra_rows, flat_groups, keep_informative, renumber
from accord.rollout.sample import prompt_group_ids, rollout_sampling
from accord.seeding import epoch_order_seed
from accord.stopping import GracefulStop, TrainingInterrupted
from accord.trainer_steps import STEPS

logger = logging.getLogger(__name__)


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
                out[mn.MEM_PEAK_RSS_MB if key == "VmHWM" else mn.MEM_RSS_MB] = int(value.split()[0]) / 1024
    except OSError:
        import resource  # ru_maxrss: KiB on Linux, bytes on macOS; a high-water mark since start

        scale = 1024 * 1024 if sys.platform == "darwin" else 1024
        out[mn.MEM_PEAK_RSS_MB] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale
        peak_is_per_step = False
    out[mn.MEM_PEAK_IS_PER_STEP] = float(peak_is_per_step)
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # summed over this process's GPUs
        out[mn.MEM_CUDA_PEAK_MB] = sum(torch.cuda.max_memory_allocated(i)
                                       for i in range(torch.cuda.device_count())) / 2**20
    return out


class Trainer:
    """Runs MAGRPO / AT-GRPO steps over the parts :func:`accord.build.build_run` makes of a config (iac, maac,
    madpo and marlhf steps: :mod:`accord.trainer_steps`)."""

    def __init__(self, cfg: Config, *, resume: bool = False, overwrite: bool = False, callbacks=None,
                 allow_unverified: bool = False, stop_if_finished: bool = False):
        self.cfg = cfg
        self.callbacks = check_callbacks(callbacks)  # see accord.callbacks
        self.run: Run = build_run(cfg, resume=resume, overwrite=overwrite, allow_unverified=allow_unverified,
                                  stop_if_finished=stop_if_finished)
        run = self.run
        self.task, self.agents, self.agent_policy = run.env, run.agents, run.agent_policy
        self.policies, self.train_rows, self.eval_rows = run.policies, run.train_rows, run.eval_rows
        self.run_dir, self.start_step = run.run_dir, run.start_step
        self._run_dir_identity = None   # the run directory's (device, inode) while train() writes there
        self._perm_epoch, self._perm = -1, []
        self.sinks = None
        self.trainable = [a.name for a in cfg.agents if a.trainable]
        self.schedule = None
        if cfg.algorithm.alternate_every:
            self.schedule = AlternationSchedule(self.trainable, cfg.algorithm.alternate_every)
            state = run.resume_state
            self.schedule.restore(state.get("alternation") if state else None, self.start_step)

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
            random.Random(epoch_order_seed(self.cfg.run.seed, epoch)).shuffle(perm)
            self._perm_epoch, self._perm = epoch, perm
        return self._perm

    # --- one step ----------------------------------------------------------------------------------
    def rollout(self, step: int, rows: list[dict], acc: MetricAccumulator, times: dict[str, float]):
        """Generate and score one step's samples with the run's rollout (rewards and returns credited), its
        metrics added to ``acc``; with ``rollout.drop_flat_groups``, more rounds until the step holds as many
        informative groups as the first round held groups (:mod:`accord.rollout.dynamic`). Returns the
        samples and the rows their ``instance`` indexes (the step's, then each extra round's)."""
        r = self.cfg.rollout
        phase = functools.partial(self._phase, times)
        samples = self._collect(step, rows, acc, phase)
        if not r.drop_flat_groups:
            return samples, rows
        rows = list(rows)
        groups = self._groups(samples)
        target = len(set(groups))
        rounds = 0
        while len(set(groups)) - len(flat_groups(samples, groups)) < target and rounds < r.max_extra_rounds:
            rounds += 1
            more_rows = extra_rows(self.train_rows, {row.get("id") for row in rows}, r.batch_size, self.cfg.run.seed,
                                   step, rounds)
            recorder = self.run.rollout.recorder
            if recorder is not None:   # this round's audit keys start over: keep them apart from earlier rounds'
                recorder.prefix = f"r{rounds}:"
            try:
                more = self._collect(step, more_rows, acc, phase)
            finally:
                if recorder is not None:
                    recorder.prefix = ""
            if recorder is not None:
                for s in more:
                    if "audit_keys" in s.extra:
                        s.extra["audit_keys"] = [f"r{rounds}:{k}" for k in s.extra["audit_keys"]]
            joints = [s.extra["joint"] for s in samples if s.extra.get("joint") is not None]
            renumber(more, max(s.group for s in samples) + 1, len(rows), max(joints, default=-1) + 1)
            samples, rows = samples + more, rows + more_rows
            groups = self._groups(samples)
        kept, dropped = keep_informative(samples, groups, target)
        acc.add(mn.ROLLOUT_FLAT_GROUPS_DROPPED, dropped)
        acc.add(mn.ROLLOUT_EXTRA_ROUNDS, rounds)
        acc.add(mn.ROLLOUT_INFORMATIVE_GROUPS, len(set(self._groups(kept))))
        return kept, rows

    def _collect(self, step: int, rows: list[dict], acc: MetricAccumulator, phase) -> list:
        """One round of the run's rollout over ``rows`` (each agent samples with its own settings)."""
        generate = functools.partial(self.run.generate, temperature=None)
        result = self.run.rollout.collect(rows, generate, step=step, phase=phase)
        for key, values in result.metrics.items():
            for v in values:
                acc.add(key, v)
        return result.samples

    def train_step(self, step: int) -> tuple[dict[str, float], list[dict]]:
        algo = self.cfg.algorithm
        acc = MetricAccumulator()
        times: dict[str, float] = defaultdict(float)
        rows = self.batch_rows(step)
        t_step = time.perf_counter()
        self.run.generate.tokens = self.run.generate.history_cut = 0
        per_step_peak = reset_peak_memory()
        step_fn = STEPS.get(algo.name)
        if step_fn is not None:   # iac, maac, madpo, marlhf: their own phases (accord.trainer_steps)
            samples = step_fn(self, step, rows, acc, times)
        else:
            samples, rows = self.rollout(step, rows, acc, times)
            self._policy_gradient(samples, rows, step, acc, times)
        elapsed = time.perf_counter() - t_step
        for name, seconds in times.items():
            acc.add(mn.time_key(name), seconds)
        acc.add(mn.TIME_STEP, elapsed)
        means = acc.mean()
        gen_time = means.get(mn.TIME_GEN, means.get(mn.TIME_ROLLOUT, 0.0))
        acc.add(mn.PERF_GEN_TOKENS_PER_S, self.run.generate.tokens / max(gen_time, 1e-9))
        acc.add(mn.PERF_COMPLETIONS_PER_S, len(samples) / elapsed)
        acc.add(mn.PERF_SAMPLES, len(samples))
        acc.add(mn.PERF_GEN_TOKENS, self.run.generate.tokens)
        if self.run.generate.history_cut:
            acc.add(mn.ROLLOUT_HISTORY_CUT, self.run.generate.history_cut)
        for key, v in memory_metrics(per_step_peak).items():
            acc.add(key, v)
        for s in samples:
            acc.add(mn.agent_key(s.agent, mn.AGENT_REWARD), s.ret)
            acc.add(mn.agent_key(s.agent, mn.AGENT_COMPLETION_LEN), len(s.completion_ids))
            acc.add(mn.agent_key(s.agent, mn.AGENT_STOP_FRAC), float(s.finish_reason == "stop"))
            acc.add(mn.ADV_ABS_MEAN, abs(s.advantage))
        table = [{"prompt": s.prompt_text, "agent": s.agent, "completion": s.completion_text, "reward": s.reward,
                  "return": s.ret, "advantage": s.advantage, "group": s.group, "turn": s.turn,
                  "instance": rows[s.instance].get("id", s.instance), "finish_reason": s.finish_reason,
                  "joint": s.extra.get("joint"), "sample": s.extra.get("sample"),
                  **({"components": s.extra["components"]} if "components" in s.extra else {})}
                 for s in samples]
        return acc.mean(), table

    def _policy_gradient(self, samples: list, rows: list[dict], step: int, acc: MetricAccumulator,
                         times: dict[str, float], *, audited: bool = False) -> None:
        """MAGRPO's and AT-GRPO's phases after the rollout (also marlhf's with ``reward_model.rl: magrpo``):
        ``audit`` (unless the caller ``audited`` the samples already), the overlong penalty, ``kl`` (a k1
        penalty), ``adv``, ``update``."""
        algo = self.cfg.algorithm
        if not audited and self.run.rollout.recorder is not None:
            with self._phase(times, "audit"):   # training.audit: records (and, strict, checks) the step's groups
                audit_step(self.run, step + 1, samples, rows, acc)
        if algo.overlong.window:
            self._overlong(samples, acc)
        if algo.kl_coef > 0 and algo.kl_estimator in KL_REWARD_ESTIMATORS:
            with self._phase(times, "kl"):
                self._kl_reward_penalty(samples, acc)
        with self._phase(times, "adv"):
            self._advantages(samples, acc, step)
        with self._phase(times, "update"):  # all policies' updates sent first: concurrent on the Ray backend
            self._update(samples, step, acc)

    def _groups(self, samples: list) -> list[int]:
        """Each sample's advantage group under ``algorithm.norm_scope``."""
        scope = self.cfg.algorithm.norm_scope
        if scope == "agent":
            return [self.agents.index(s.agent) for s in samples]
        if scope == "prompt":
            return prompt_group_ids(samples)
        return [s.group for s in samples]

    def _advantages(self, samples: list, acc: MetricAccumulator, step: int) -> None:
        """Group-relative advantages over the rollout's groups (or per agent, or per prompt); an agent with its
        own ``advantage`` estimator gets it over its samples (groups never span agents). Advantages that float32
        cannot hold (returns of about 1e38 and beyond) stop the run naming the largest return."""
        algo = self.cfg.algorithm
        groups = self._groups(samples)
        own = {a.name: a.advantage for a in self.cfg.agents if a.advantage and a.advantage != algo.advantage}
        parts = [(algo.advantage, [i for i, s in enumerate(samples) if s.agent not in own])]
        parts += [(est, [i for i, s in enumerate(samples) if s.agent == agent]) for agent, est in own.items()]
        for estimator, idx in parts:
            if not idx:
                continue
            adv = group_advantages(torch.tensor([samples[i].ret for i in idx]), torch.tensor([groups[i] for i in idx]),
                                   estimator, algo.normalize_std, std_ddof=int(algo.group_std == "sample"))
            if not bool(torch.isfinite(adv).all()):
                worst = max((samples[i] for i in idx), key=lambda s: abs(s.ret))
                if abs(worst.ret) < torch.finfo(torch.float32).max / 2 ** 10:   # the returns fit: the estimator
                    bad = next(a for a in adv.tolist() if not math.isfinite(a))
                    raise TrainingError(f"step {step}: the advantage estimator {estimator!r} gave {bad} for finite "
                                        f"returns (the largest {worst.ret:.3g}, agent {worst.agent!r}); fix it to "
                                        "return finite advantages")
                raise TrainingError(f"step {step}: the {estimator} advantages are not finite: returns reach "
                                    f"{worst.ret:.3g} (agent {worst.agent!r}), more than float32 holds; scale the "
                                    "task's reward down")
            for i, a in zip(idx, adv.tolist()):
                samples[i].advantage = a
        # groups whose members all have the same return carry no learning signal (every advantage 0)
        flat = flat_groups(samples, groups)
        for g in set(groups):
            acc.add(mn.ADV_ZERO_STD_FRAC, float(g in flat))

    def _overlong(self, samples: list, acc: MetricAccumulator) -> None:
        """DAPO's soft overlong penalty (``algorithm.overlong``) added to each sample's return."""
        o, default = self.cfg.algorithm.overlong, rollout_sampling(self.cfg.rollout)
        for s in samples:
            p = overlong_penalty(len(s.completion_ids), (s.sampling or default).max_new_tokens, o.window, o.penalty)
            s.ret += p
            s.extra["overlong"] = p
            acc.add(mn.ROLLOUT_OVERLONG_PENALTY, p)

    def trained_agents(self) -> list[str]:
        """The agents whose samples this step's update uses: the trainable ones, or the one whose turn it is."""
        return [self.schedule.active] if self.schedule is not None else list(self.trainable)

    def _update(self, samples: list, step: int, acc: MetricAccumulator) -> None:
        """Each policy updated on its trained agents' samples (without truncated completions when
        ``overlong.mask_truncated``); all updates submitted before any is awaited."""
        trained = set(self.trained_agents())
        train = [s for s in samples if s.agent in trained]
        if self.cfg.algorithm.overlong.mask_truncated:
            kept = [s for s in train if s.finish_reason != "length"]
            acc.add(mn.ROLLOUT_TRUNCATED_MASKED, (len(train) - len(kept)) / max(1, len(train)))
            train = kept
        if self.schedule is not None:
            acc.add(mn.SCHEDULE_ACTIVE_AGENT, self.agents.index(self.schedule.active))
            self.schedule.advance()
        jobs = {}
        for pname, pol in self.policies.items():
            mine = [s for s in train if s.policy == pname]
            if mine:
                jobs[pname] = submit(pol, "update", mine, step)
        for pname, stats in zip(jobs, gather(list(jobs.values()))):
            for key, v in stats.items():
                acc.add(mn.update_key(pname, key), v)

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
            acc.add(mn.loss_key(pname, mn.KL), sum(kl for kl, _ in kls) / max(1, sum(n for _, n in kls)))

    @contextmanager
    def _phase(self, times: dict[str, float], name: str):
        """Time the enclosed work into ``times[name]`` (summed: a phase may run once per rollout round)."""
        t = time.perf_counter()
        if self.sinks is not None:
            self.sinks.set_activity(name)  # named in the console's heartbeat line
        yield
        times[name] += time.perf_counter() - t

    # --- evaluation --------------------------------------------------------------------------------
    def evaluate(self, step: int | None = None) -> dict[str, float]:
        """Held-out evaluation of the current weights (:func:`accord.evaluate.evaluate_run`); with ``step``,
        the completions are written to ``RUN_DIR/eval_completions/step_N.jsonl``."""
        if self.sinks is not None:
            self.sinks.set_activity("eval")
        return evaluate_run(self.run, step=step)

    def _callback(self, hook: str, *args) -> None:
        """Call ``hook`` of every callback, in order."""
        for cb in self.callbacks:
            getattr(cb, hook)(*args)

    def _callback_kept(self, hook: str, *args) -> BaseException | None:
        """:meth:`_callback`, returning what a callback raised (a ``SystemExit`` that ends training, its own error)
        instead of raising it: the caller logs and checkpoints the step first, then raises it."""
        try:
            self._callback(hook, *args)
        except BaseException as err:   # deferred: re-raised by the caller once the step is kept
            return err
        return None

    def close(self) -> None:
        """Release the run's backend: Ray actors (and a local Ray cluster the trainer started) or data-parallel
        ranks; no-op for policies in this process."""
        if getattr(self, "run", None) is not None:
            self.run.close()

    # --- the loop ----------------------------------------------------------------------------------
    def train(self, stop_after: int | None = None,
              stop_when: Callable[[int, dict[str, float]], bool] | None = None) -> dict[str, float]:
        """Run to ``run.steps`` (or stop after ``stop_after`` total steps, for tests of resume).

        ``stop_when(step, metrics)`` is called after each training step with a copy of its metrics (before
        that step's evaluation); True makes that step the last one, as step ``run.steps`` would be: it is
        evaluated (``run.eval_after``), its completions written and a checkpoint saved (``accord compare``
        stops each method at its token budget this way). Returns the last step's metrics merged with the
        final evaluation. Ctrl-C stops the run after the step in progress, checkpointed (:class:`GracefulStop`),
        and raises :class:`TrainingInterrupted`; a full disk is a :class:`accord.checkpoint.DiskFullError`
        naming the last intact checkpoint.
        """
        cfg = self.cfg
        self._run_dir_identity = folder_identity(self.run_dir)
        self.sinks = run_sinks(cfg, self.run_dir, start_step=self.start_step)
        last: dict[str, float] = {}
        end = cfg.run.steps if stop_after is None else min(stop_after, cfg.run.steps)
        progress = {"done": self.start_step, "saved": self.start_step if self.start_step else None, "doing": None}
        stop = GracefulStop(functools.partial(self._stopping, progress))
        try:
            with stop:
                if self.start_step == 0 and cfg.run.eval_before and self.eval_rows:
                    progress["doing"] = "the evaluation before training"
                    before = self.evaluate(step=0)
                    stopped = self._callback_kept("on_evaluate", 0, dict(before))
                    self.sinks.log(0, before)
                    logger.info("eval before training: team reward %.4f", before[mn.EVAL_TEAM_REWARD])
                    if stopped is not None:
                        raise stopped
                for step in range(self.start_step, end):
                    if stop.requested:
                        break
                    # with stop_when (accord compare's token budget) run.steps is only a cap, not the end
                    progress["doing"] = f"step {step + 1}" + ("" if stop_when else f"/{cfg.run.steps}")
                    last, halt = self._step(step, end, stop, progress, stop_when)
                    if halt:
                        break
                progress["doing"] = None
                if stop.requested:
                    if progress["done"] and progress["saved"] != progress["done"]:  # Ctrl-C just after a step
                        self._save(progress["done"], progress)
                    raise self._interrupted(progress, stop.signal_name)
                self._callback("on_train_end", dict(last))
        except OSError as err:
            check_run_dir_kept(self.run_dir, self._run_dir_identity,
                               f"a write of {progress['doing'] or 'the run'} failed: {type(err).__name__}")
            if not is_disk_full(err):
                raise
            raise disk_full_error(self.run_dir, f"writing the logs of {progress['doing'] or 'the run'}", err) from err
        finally:
            self.sinks.close()
        return last

    def _step(self, step: int, end: int, stop: GracefulStop, progress: dict,
              stop_when: Callable[[int, dict[str, float]], bool] | None = None) -> tuple[dict[str, float], bool]:
        """One training step with its evaluation, logs and checkpoint (also when a stop was asked for during it);
        its metrics, and whether ``stop_when`` made it the last step."""
        cfg = self.cfg
        metrics, table = self.train_step(step)
        n = step + 1
        check_run_dir_kept(self.run_dir, self._run_dir_identity, f"found before logging step {n}")
        halt = stop_when is not None and bool(stop_when(n, dict(metrics)))
        final = n == cfg.run.steps or halt
        stopped = None
        if (cfg.run.eval_every and n % cfg.run.eval_every == 0) or (final and cfg.run.eval_after):
            evaluation = self.evaluate(step=n)
            stopped = self._callback_kept("on_evaluate", n, dict(evaluation))
            metrics.update(evaluation)
        ce = cfg.logging.completions_every
        if ce and (n % ce == 0 or final or stopped is not None):   # the last step's always: the report shows it
            self.sinks.log_completions(n, table)
        if ((cfg.run.checkpoint_every and n % cfg.run.checkpoint_every == 0) or n == end or halt or stop.requested
                or stopped is not None):
            self._save(n, progress, metrics)
        else:
            self.sinks.log(n, metrics)
        progress["done"] = n
        if stopped is not None:
            raise stopped
        stopped = self._callback_kept("on_step_end", n, dict(metrics))
        if stopped is not None:
            if progress["saved"] != n:
                self._save(n, progress)
            raise stopped
        return metrics, halt

    def _save(self, n: int, progress: dict, metrics: dict[str, float] | None = None) -> None:
        """Checkpoint step ``n``; with ``metrics``, log them (fsynced) between writing it and renaming it into
        place, so that a checkpoint never exists without its step's metrics and a resume, which cuts
        metrics.jsonl back to the checkpoint it loads, logs every step once."""
        cfg = self.cfg
        check_run_dir_kept(self.run_dir, self._run_dir_identity, f"found before the checkpoint of step {n}")
        t = time.perf_counter()
        # the config the steps so far ran with, as config.yaml holds it: a resume names what an edit of the file changed
        state = {"data_position": n * cfg.rollout.batch_size, "config": yaml.safe_dump(cfg.to_dict(), sort_keys=False)}
        if self.schedule is not None:
            state["alternation"] = self.schedule.state()
        try:
            tmp = write_checkpoint(self.run_dir, n, self.policies, state, parts=self.run.parts)
            try:   # replaced while it was written: what went into the new folder is taken out again
                check_run_dir_kept(self.run_dir, self._run_dir_identity, f"found writing the checkpoint of step {n}")
            except CheckpointError:
                discard_written(tmp)
                raise
            if metrics is not None:
                metrics[mn.TIME_CHECKPOINT] = time.perf_counter() - t
                self.sinks.log(n, metrics)
            self.sinks.flush()
            path = commit_checkpoint(self.run_dir, tmp, n, cfg.run.keep_checkpoints)
        except (*WRITE_ERRORS, CheckpointError) as err:
            check_run_dir_kept(self.run_dir, self._run_dir_identity,
                               f"writing the checkpoint of step {n} failed: {type(err).__name__}")
            raise
        progress["saved"] = n
        self._callback("on_checkpoint", n, path)

    def _stopping(self, progress: dict) -> str:
        """What the first Ctrl-C (or SIGTERM) will do, for its notice."""
        doing = progress["doing"]
        if doing is None:
            return "stopping"
        if doing.startswith("step"):
            return f"finishing {doing}, then a checkpoint of it and stop"
        return f"finishing {doing}, then stop"

    def _interrupted(self, progress: dict, name: str) -> TrainingInterrupted:
        done, saved = progress["done"], progress["saved"]
        if not done:
            return TrainingInterrupted(f"stopped by {name} before the first step completed: nothing to save; run "
                                       "the same command again to start over", 0, None, name)
        ckpt = self.run_dir / "checkpoints" / f"step_{saved:06d}"
        if done == self.cfg.run.steps:   # the signal came during the last step, which was finished
            return TrainingInterrupted(f"stopped by {name} after the last step, {done}/{done} (checkpoint {ckpt}): "
                                       f"the run is complete; `accord train --resume {self.run_dir} run.steps=N` "
                                       "trains it further", done, ckpt, name)
        return TrainingInterrupted(f"stopped by {name} after step {done}/{self.cfg.run.steps} (checkpoint {ckpt}); "
                                   f"continue with `accord train --resume {self.run_dir}`", done, ckpt, name)


def train(cfg: Config, *, resume: bool = False, overwrite: bool = False, callbacks=None,
          allow_unverified: bool = False) -> Path:
    """Build a trainer from a config, run it (calling ``callbacks``, see :mod:`accord.callbacks`), and return
    the run directory (``overwrite``: delete an earlier run in the same directory first; without it that is
    an error). ``resume`` of a run that already reached ``run.steps`` logs that there is nothing to do and how
    to extend it, and returns before any model loads (``Trainer(cfg, resume=True)`` loads such a run, with no
    step left to train); ``allow_unverified`` lets it load a checkpoint without a manifest."""
    try:
        trainer = Trainer(cfg, resume=resume, overwrite=overwrite, callbacks=callbacks,
                          allow_unverified=allow_unverified, stop_if_finished=True)
    except RunComplete as done:
        logger.warning("%s", done)
        return cfg.run_dir
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer.run_dir
