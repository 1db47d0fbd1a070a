"""``accord eval``: held-out evaluation of a config or a trained run, and base-vs-checkpoint comparison.

For each model variant (the base weights of the config; for a run directory also its latest
checkpoint) on the held-out split:

- **greedy**: one joint action (single-turn task) or one trajectory (multi-turn environment) per
  instance, no branching: team reward or return, success rate, per-agent metrics;
- **sampled**: ``n`` independent samples per instance at ``temperature``: mean team reward, success
  rate and **pass@k** for every requested k <= n with the unbiased estimator of Chen et al. (2021),
  ``1 - C(n - c, k) / C(n, k)`` for c successes out of n, averaged over instances.

Success comes from the environment's ``info["success"]`` (multi-turn) or, for a single-turn task,
from an optional ``success`` method with the reward's keyword contract that returns one bool per
joint action; tasks without it (the writing task: its reward is a lexical score, not a pass/fail
check) report no success or pass@k, and the table says so rather than inventing a threshold.

Results go to ``OUT/eval.json`` and ``OUT/eval.md`` (one table, one column per variant).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

from accord import metric_names as mn
from accord.checkpoint import CheckpointError, in_checkpoints, load_policy, rotated_away, verified_checkpoint
from accord.config import Config, ConfigError, load_config
from accord.config.schema import MAX_GENERATIONS, MIN_TEMPERATURE
from accord.seeding import eval_seed, eval_stream_seed, seeded_torch
from accord.tracking.registry import _atomic_write_text, folder_problem, hold_output_dir, made_dirs, remove_empty

logger = logging.getLogger(__name__)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``c`` successes in ``n`` samples: ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # the product form avoids huge binomials: C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))



def seed_eval_streams(run) -> int:
    """Start every policy's ``eval`` random stream (the same at every evaluation); returns the eval seed."""
    for pname, pol in run.policies.items():
        pol.seed_stream("eval", eval_stream_seed(run.cfg.run.seed, pname))
    return eval_seed(run.cfg.run.seed)


def play(run, rows: list[dict], *, n: int, greedy: bool, temperature: float, success: bool = True):
    """``n`` unbranched trajectories (or joint actions) per held-out row with the run's rollout."""
    generate = functools.partial(run.generate, temperature=temperature, stream="eval")
    return run.rollout.play(rows, generate, n=n, greedy=greedy, seed=eval_seed(run.cfg.run.seed),
                            success=success)


def evaluate_run(run, step: int | None = None) -> dict[str, float]:
    """Held-out instances of a run, no branching: one joint action (single-turn) or one episode (multi-turn)
    each, greedy unless rollout.eval_temperature > 0. ``eval/team/reward`` is the team reward (single-turn)
    or the episode's team return (multi-turn). With ``step``, the completions are written to
    ``RUN_DIR/eval_completions/step_N.jsonl`` (see :mod:`accord.tracking.eval_completions`)."""
    from accord.tracking import MetricAccumulator
    from accord.tracking.eval_completions import write_eval_completions

    if not run.eval_rows:
        return {}
    temp = run.cfg.rollout.eval_temperature
    acc = MetricAccumulator()
    t = time.perf_counter()
    seed = seed_eval_streams(run)
    with seeded_torch(seed):
        played = play(run, run.eval_rows, n=1, greedy=temp == 0, temperature=temp or 1.0, success=False)
    records = [per[0] for per in played.results]
    for key in records[0]:
        name = mn.played_eval_key(key)
        for rec in records:
            acc.add(name, rec[key])
    for key, value in played.components.items():
        acc.add(mn.eval_key(mn.component_key(key)), value)
    if step is not None:
        write_eval_completions(run.run_dir, step, played.table)
    acc.add(mn.TIME_EVAL, time.perf_counter() - t)
    return acc.mean()


def evaluate_episodes(run, *, samples: int = 0, temperature: float = 1.0) -> list[dict[str, Any]]:
    """Every held-out episode of the run's current weights, for ``accord compare``: one greedy episode per
    instance (``samples=0``), or ``samples`` episodes per instance sampled at ``temperature``. Each episode
    is ``{"instance", "sample", "team", "success" (where the task has a success check), "turns" (multi-turn),
    per-agent values, "completions"}``; ``completions`` are the rows of :mod:`accord.tracking.eval_completions`
    without the episode's own fields. The evaluation streams are seeded as in :func:`evaluate_run`, so the
    same weights give the same episodes."""
    rows = run.eval_rows
    if not rows:
        raise ConfigError("nothing to evaluate: task.eval_size is 0; set task.eval_size=N")
    ids = [str(row.get("id", b)) for b, row in enumerate(rows)]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"task {run.cfg.task.name!r}: held-out instances share ids, so episodes cannot be paired "
                          "by instance; give every row a unique id")
    n = max(samples, 1)
    reps = [row for row in rows for _ in range(n)]   # one played episode each, so that each has its completions
    seed = seed_eval_streams(run)
    with seeded_torch(seed):
        played = play(run, reps, n=1, greedy=samples == 0, temperature=temperature)
    by_episode: dict[int, list[dict]] = {}
    for line in played.table:
        by_episode.setdefault(line["joint"], []).append(
            {k: v for k, v in line.items() if k not in ("instance", "joint", "reward", "success")})
    episodes = []
    for e, (per, row_id) in enumerate(zip(played.results, (i for i in ids for _ in range(n)))):
        record = {"instance": row_id, "sample": e % n, **{k: float(v) for k, v in per[0].items()}}
        record["completions"] = by_episode.get(e, [])
        episodes.append(record)
    return episodes


def evaluate_parts(run, *, samples: int, ks: list[int], temperature: float, pipeline: str = "parallel",
                   record: Path | None = None) -> dict[str, float]:
    """Greedy and sampled metrics (pass@k where the task has a success check) of a run's current weights
    on its held-out rows; ``pipeline``: see :mod:`accord.pipelines` (``record``: where its greedy prompts
    and answers go)."""
    rows = run.eval_rows
    if not rows:
        raise ConfigError("nothing to evaluate: task.eval_size is 0; set task.eval_size=N")
    player = play
    if pipeline != "parallel":
        from accord.pipelines import pipeline_player

        player = pipeline_player(pipeline, record)
    seed_eval_streams(run)
    metrics: dict[str, float] = {"instances": float(len(rows))}
    t = time.perf_counter()
    for mode, n, greedy in (("greedy", 1, True), ("sampled", samples, False)):
        if n == 0:
            continue
        results = player(run, rows, n=n, greedy=greedy, temperature=temperature).results
        flat = [r for per in results for r in per]
        for key in flat[0]:
            metrics[mn.mode_key(mode, key)] = sum(r[key] for r in flat) / len(flat)
        if mode == "sampled" and "success" in flat[0]:
            for k in ks:
                if k > n:
                    raise ConfigError(f"pass@{k} needs at least {k} samples per instance; pass --samples {k} or more")
                metrics[mn.pass_at_key(k)] = sum(pass_at_k(n, int(sum(r["success"] for r in per)), k)
                                           for per in results) / len(results)
    metrics[mn.TIME_EVAL_S] = time.perf_counter() - t
    return metrics


# what `accord eval` never reads: the update's settings, the warm start's and the comparison's, and when and how long
# a run trains and checkpoints (an evaluation runs no step; these only build objects it does not use)
EVAL_UNREAD_SECTIONS = ("training", "sft", "compare")
EVAL_UNREAD_KEYS = ("run.steps", "run.checkpoint_every", "run.keep_checkpoints", "run.eval_every", "run.eval_before",
                    "run.eval_after")


def warn_unread_overrides(overrides: list[str] | tuple[str, ...], command: str = "accord eval") -> list[str]:
    """A warning for each override that an evaluation does not read (``training.lr=0.5``, ``run.steps=9``): it is
    accepted, as in the run's config, but changes no number of the evaluation. Returns the warned overrides."""
    warned = []
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key.split(".", 1)[0] in EVAL_UNREAD_SECTIONS or key in EVAL_UNREAD_KEYS:
            logger.warning("%s has no effect on %s: it sets training (the update, warm start, comparison, steps or "
                           "checkpoints), and an evaluation runs no training step; remove it", item, command)
            warned.append(item)
    return warned


def _load(target: Path, overrides: list[str],
          allow_unverified: bool = False) -> tuple[Config, Path | None, Path | None]:
    """Config, run directory and latest checkpoint (that verifies; ``allow_unverified``: or has no manifest) of
    a CONFIG.yaml or a RUN_DIR."""
    if target.is_dir():
        if not (target / "config.yaml").is_file():
            raise ConfigError(f"{target} has no config.yaml; pass a run directory of `accord train` or a config file")
        cfg = load_config(target / "config.yaml", overrides)
        return cfg, target, verified_checkpoint(target, allow_unverified)
    if not target.is_file():
        raise FileNotFoundError(f"{target} is neither a config file nor a run directory")
    return load_config(target, overrides), None, None


def check_samples(samples: int) -> None:
    """``--samples`` of ``accord eval``: 0 (greedy only) to :data:`MAX_GENERATIONS` per instance."""
    if samples < 0 or samples > MAX_GENERATIONS:
        raise ConfigError(f"--samples={samples} must be between 0 (greedy only) and {MAX_GENERATIONS} completions per "
                          "instance (the rows of one generation call grow with it)")


def warn_task_change(target: Path, cfg: Config, run_dir: Path | None) -> None:
    """Warn when overrides evaluate a run's checkpoint on another task than the one it trained on."""
    if run_dir is None:
        return
    trained = load_config(run_dir / "config.yaml", [])
    if (trained.task.name, trained.task.options) != (cfg.task.name, cfg.task.options):
        logger.warning("evaluating %s on task %r %s, not the task it trained on (%r %s): the overrides changed it; "
                       "the results are a transfer, not the run's held-out score", target, cfg.task.name,
                       cfg.task.options, trained.task.name, trained.task.options)


def run_eval(target: str | Path, overrides: list[str] = (), *, samples: int = 4, ks: list[int] | None = None,
             temperature: float | None = None, compare_base: bool = True, out: str | Path | None = None,
             pipeline: str = "parallel", allow_unverified: bool = False) -> Path:
    """Evaluate the base weights and (for a run directory) the newest checkpoint that verifies
    (``allow_unverified``: or has no manifest); write eval.json/.md. ``pipeline``: ``parallel`` (agents answer
    independently), ``sequential`` or ``discussion`` (prompt-only multi-agent pipelines of a single-turn task,
    see :mod:`accord.pipelines`). The scratch run directory of the evaluating run, ``OUT/.accord-work.*``
    (:func:`scratch_run`), is removed at the end."""
    from accord.pipelines import check_pipeline_name

    target = Path(target)
    cfg, run_dir, ckpt = _load(target, list(overrides), allow_unverified)
    warn_unread_overrides(overrides)
    warn_task_change(target, cfg, run_dir)
    given = list(ks or [1])
    ks = sorted(set(given))
    check_pipeline_name(pipeline)
    check_samples(samples)
    if len(ks) < len(given):
        raise ConfigError(f"--k {' '.join(map(str, given))} gives a k twice; give each once")
    if samples == 0 and ks != [1]:
        raise ConfigError(f"--k {' '.join(map(str, given))} with --samples 0 (greedy: one answer per instance, no "
                          "pass@k); drop --k, or sample with --samples N")
    if samples == 0 and temperature is not None:
        raise ConfigError(f"--temperature {temperature:g} with --samples 0 (greedy: nothing is sampled); drop "
                          "--temperature, or sample with --samples N")
    if not compare_base and run_dir is None:
        raise ConfigError("--no-base skips a run's base weights, but a config file has only those to evaluate; drop "
                          "--no-base, or pass a run directory")
    if ks[0] < 1:
        raise ConfigError(f"--k {' '.join(map(str, ks))}: pass@k needs k >= 1 (and <= --samples); pass e.g. --k 1 "
                          f"{max(samples, 1)}")
    if samples and ks[-1] > samples:
        raise ConfigError(f"pass@{ks[-1]} needs at least {ks[-1]} samples per instance; pass --samples {ks[-1]} or "
                          "more (--k values are at most --samples)")
    temperature = temperature if temperature is not None else (cfg.rollout.eval_temperature or cfg.rollout.temperature)
    if not math.isfinite(temperature) or temperature < MIN_TEMPERATURE:
        raise ConfigError(f"--temperature={temperature} must be a finite number >= {MIN_TEMPERATURE} for sampled "
                          "evaluation (below it the sampler's float32 arithmetic breaks down)")
    out_dir = Path(out) if out else (run_dir / "eval" if run_dir else Path(cfg.run.output_dir) / f"{cfg.run.name}-eval")
    if not out and pipeline != "parallel":  # beside the plain eval, not over it
        out_dir = out_dir.with_name(f"{out_dir.name}-{pipeline}")
    problem = folder_problem(out_dir)
    if problem is not None:
        raise ConfigError(f"--out {out_dir}: {problem}; give a directory for eval.json and eval.md")
    if run_dir is not None and in_checkpoints(out_dir, run_dir):
        raise ConfigError(f"--out {out_dir} lies in the run's checkpoints/, whose older checkpoints the run deletes as "
                          f"it goes on (run.keep_checkpoints), and the evaluation with them; pass an --out outside it "
                          f"(the default is {run_dir / 'eval'})")
    if (out_dir / "eval.json").exists() or (out_dir / "eval.md").exists():
        logger.warning("%s holds an eval.json or eval.md (an earlier evaluation): they are replaced when this one "
                       "ends; pass --out DIR to keep them", out_dir)
    with scratch_run(out_dir, "accord eval") as work:
        cfg.run = replace(cfg.run, run_dir=str(work))
        variants = _evaluate_variants(cfg, run_dir, ckpt, out_dir, samples=samples, ks=ks, temperature=temperature,
                                      compare_base=compare_base, pipeline=pipeline)
        report = {"target": str(target), "task": cfg.task.name, "task_options": cfg.task.options,
                  "algorithm": cfg.algorithm.name, "baseline": cfg.algorithm.baseline, "samples": samples,
                  "temperature": temperature, "ks": ks, "pipeline": pipeline, "variants": variants}
        _atomic_write_text(out_dir / "eval.json", json.dumps(report, indent=2))
        _atomic_write_text(out_dir / "eval.md", markdown_table(report))
    return out_dir


@contextlib.contextmanager
def scratch_run(out_dir: Path, command: str) -> Iterator[Path]:
    """Create ``out_dir`` (and its parents), hold it for ``command`` (:func:`hold_output_dir`: one command writes
    its results there at a time) and yield a scratch run directory in it for the run that evaluates
    (:func:`scratch_run_dir`: its config.yaml and lock), removed when the block ends. When the block fails, the
    directories this made are removed too while still empty: a failed command leaves no empty ``--out``."""
    problem = folder_problem(out_dir)
    if problem is not None:
        raise ConfigError(f"output folder {out_dir}: {problem}; pass --out DIR, a folder that exists or can be made")
    made = made_dirs(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    done = False
    try:
        with hold_output_dir(out_dir, command):
            work = scratch_run_dir(out_dir)
            try:
                yield work
                done = True
            finally:
                shutil.rmtree(work, ignore_errors=True)
    finally:
        if not done:
            remove_empty(made)


SCRATCH_PREFIX = ".accord-work."


def scratch_run_dir(out_dir: Path) -> Path:
    """A new scratch run directory in ``out_dir`` for the run that evaluates (removed when it ends); those a killed
    evaluation left (named :data:`SCRATCH_PREFIX`...) go first. Nothing else there is touched: a directory of the
    user's named ``_work`` stays."""
    for leftover in out_dir.glob(f"{SCRATCH_PREFIX}*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=out_dir))


def _evaluate_variants(cfg: Config, run_dir: Path | None, ckpt: Path | None, out_dir: Path, *, samples: int,
                       ks: list[int], temperature: float, compare_base: bool, pipeline: str) -> dict[str, dict]:
    """The base weights' and the checkpoint's results, evaluated by a run of ``cfg`` (its scratch directory)."""
    from accord.build import build_run
    from accord.envs.single_turn import SingleTurnEnv
    from accord.pipelines import transcript_path

    run = build_run(cfg)
    try:
        # a single-turn task has a success check or not (a multi-turn one tells in each step's info)
        single = run.env.task if isinstance(run.env, SingleTurnEnv) else None
        if samples and ks != [1] and single is not None and not callable(getattr(single, "success", None)):
            raise ConfigError(f"--k {' '.join(map(str, ks))}: task {cfg.task.name!r} defines no success check, so "
                              "pass@k cannot be computed; drop --k")
        variants: dict[str, dict[str, float]] = {}
        if ckpt is None or compare_base:
            logger.info("evaluating the base weights on %d held-out instances", len(run.eval_rows))
            variants["base"] = evaluate_parts(run, samples=samples, ks=ks, temperature=temperature,
                                              pipeline=pipeline, record=transcript_path(out_dir, "base"))
        if ckpt is not None:
            for name, pol in run.policies.items():
                try:
                    load_policy(pol, ckpt, name, "evaluate another checkpoint or retrain")
                except CheckpointError as err:  # (unverified ones; or one that rotated away while it was read)
                    rotated = None if run_dir is None else rotated_away(ckpt, run_dir, "it was evaluated")
                    if rotated is not None:
                        raise rotated from err
                    raise
            logger.info("evaluating checkpoint %s", ckpt)
            variants[ckpt.name] = evaluate_parts(run, samples=samples, ks=ks, temperature=temperature,
                                                 pipeline=pipeline, record=transcript_path(out_dir, ckpt.name))
        elif run_dir is not None:
            logger.warning("%s has no checkpoint: only the base weights were evaluated", run_dir)
    finally:
        run.close()
    return variants


def markdown_table(report: dict[str, Any]) -> str:
    variants = report["variants"]
    names = list(variants)
    keys = []
    for v in variants.values():
        keys += [k for k in v if k not in keys]
    lines = [f"# Evaluation of {report['target']}", "",
             f"Task `{report['task']}` {report['task_options'] or ''}; greedy = one trajectory per instance; "
             f"sampled = {report['samples']} samples per instance at temperature {report['temperature']}.", ""]
    if report.get("pipeline", "parallel") != "parallel":
        from accord.pipelines import PIPELINE_TEXT

        lines += [f"Prompt-only pipeline `{report['pipeline']}`: {PIPELINE_TEXT[report['pipeline']]}", ""]
    if not any(k.endswith("/success") for k in keys):
        lines += ["This task defines no success check, so success rates and pass@k are not reported.", ""]
    elif not any(k.startswith("pass@") for k in keys):
        lines += ["pass@k is not reported: it needs sampled completions (--samples N).", ""]
    lines.append("| metric | " + " | ".join(names) + " |")
    lines.append("|---|" + "---:|" * len(names))
    for k in keys:
        cells = [f"{variants[n][k]:.4g}" if k in variants[n] else "-" for n in names]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
