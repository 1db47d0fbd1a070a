"""Cross-play evaluation (``accord eval --crossplay RUN [RUN ...]``): how much a trained agent depends on the
partner it was trained with.

Self-play evaluation scores agents with the partners they co-adapted to. Cross-play pairs each role's
trained policy with other partners and scores the team on the same held-out instances:

- **sources**: ``base`` (the first run's initial weights) and each run's latest checkpoint (several runs of
  one config with different seeds are the usual input);
- **matrix**, one per role ``i``: cell ``[s, t]`` is the team's score when role ``i`` plays source ``s``'s
  policy for that role and every other role plays source ``t``'s; the diagonal ``[s, s]`` is plain
  evaluation of source ``s`` (shared by all roles);
- **roles swapped**: each run's policies played in a cyclic shift of the roles (with two agents: each
  agent's policy in the other's role); a shared-policy run only changes prompts there, so its swapped
  score equals its self-play score;
- **co-adaptation gap** of run ``X`` and role ``i``: self-play ``[X, X]`` minus the mean over the other
  runs ``Y`` of ``[X, Y]`` (``gap_vs_seeds``; needs two runs or more), and ``[X, X] - [X, base]``
  (``gap_vs_base``). A positive gap means role ``i``'s policy relies on conventions of its own partner.

Scores: ``greedy`` (one trajectory or joint action per instance) and ``sampled`` (``--samples`` per
instance at the evaluation temperature), the team reward or return as in ``accord eval``. Intervals are
95 % percentile bootstraps over the held-out instances (2000 resamples, seed 0); a gap's interval
resamples the paired per-instance differences. The gaps use ``sampled`` when ``--samples`` > 0, else
``greedy``.

Exactness: a diagonal cell seeds every policy's evaluation stream as ``accord eval`` does with that run's
own ``run.seed``, and maps roles to policies as that run did, so it equals ``accord eval`` of the run (on
the first run's held-out instances: the same ones whenever the task's held-out split does not depend on
``run.seed``). Off-diagonal cells use the first run's seed.

Cost: one evaluation per distinct role-to-source assignment: ``S + N x S x (S - 1)`` with S sources and N
roles (two roles: ``S^2``, the matrices of the two roles are transposes), plus one per run for the
swap; every run's policies are held in memory at once. Runs with ``specialization: lora`` are not
supported (their adapters share one base).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from pathlib import Path
from typing import Any

from accord.checkpoint import load_policy, verified_checkpoint
from accord.config import Config, ConfigError, load_config
from accord.config.schema import MIN_TEMPERATURE
from accord.evaluate import check_samples, scratch_run, warn_task_change, warn_unread_overrides
from accord.seeding import eval_stream_seed
from accord.tracking.registry import _atomic_write_text

logger = logging.getLogger(__name__)

BOOTSTRAP = 2000


def bootstrap_ci(values: list[float], resamples: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
    """95 % percentile bootstrap interval of the mean of ``values``."""
    if not values:
        raise ValueError("no values to bootstrap")
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    return means[int(0.025 * resamples)], means[min(resamples - 1, int(0.975 * resamples))]


@dataclasses.dataclass
class Source:
    """Where a role's weights come from: a run's checkpoint, or the first run's initial weights."""

    name: str
    cfg: Config
    agent_policy: dict[str, str]
    policies: dict[str, Any]


def _load_run(path: Path, overrides: list[str], allow_unverified: bool = False) -> tuple[Config, Path]:
    if not (path / "config.yaml").is_file():
        raise ConfigError(f"--crossplay {path}: no config.yaml there; pass run directories of `accord train`")
    cfg = load_config(path / "config.yaml", list(overrides) + ["run.backend=local"])
    if cfg.specialization == "lora":
        raise ConfigError(f"--crossplay {path}: specialization=lora runs share one base between their adapters; "
                          "cross-play needs runs with specialization shared or separate")
    ckpt = verified_checkpoint(path, allow_unverified)
    if ckpt is None:
        raise ConfigError(f"--crossplay {path} has no checkpoint; train it (run.checkpoint_every or the end of the run "
                          "writes one) before cross-play")
    return cfg, ckpt


def _source_names(paths: list[Path]) -> list[str]:
    names = [p.name for p in paths]
    if len(set(names)) < len(names) or "base" in names:
        names = [f"run{i}:{p.name}" for i, p in enumerate(paths)]
    return names


def run_crossplay(runs: list[str | Path], overrides: list[str] = (), *, samples: int = 4,
                  temperature: float | None = None, out: str | Path | None = None,
                  allow_unverified: bool = False) -> Path:
    """Cross-play matrices, swapped roles and co-adaptation gaps of ``runs`` (see the module docstring);
    writes ``OUT/crossplay.json`` and ``OUT/crossplay.md`` (default OUT: the first run's ``crossplay/``).
    Each run's newest checkpoint that verifies is played (``allow_unverified``: also one without a manifest)."""
    import math

    paths = [Path(r) for r in runs]
    if not paths:
        raise ConfigError("--crossplay needs at least one run directory")
    check_samples(samples)
    seen: dict[Path, Path] = {}
    for p in paths:   # one run given twice would be cross-played against itself as if it were another seed
        key = p.resolve()
        if key in seen:
            raise ConfigError(f"--crossplay: {p} and {seen[key]} are the same run; give each run once")
        seen[key] = p
    loaded = [_load_run(p, list(overrides), allow_unverified) for p in paths]
    warn_unread_overrides(overrides, "accord eval --crossplay")
    cfg0 = loaded[0][0]
    if temperature is None:
        temperature = cfg0.rollout.eval_temperature or cfg0.rollout.temperature
    if not math.isfinite(temperature) or temperature < MIN_TEMPERATURE:
        raise ConfigError(f"--temperature={temperature} must be a finite number >= {MIN_TEMPERATURE} for sampled "
                          "evaluation (below it the sampler's float32 arithmetic breaks down)")
    for p, (cfg, _) in zip(paths[1:], loaded[1:]):
        if (cfg.task.name, cfg.task.options) != (cfg0.task.name, cfg0.task.options) or \
                cfg.algorithm.baseline != cfg0.algorithm.baseline:
            raise ConfigError(f"--crossplay: {p} trains task {cfg.task.name!r} {cfg.task.options} "
                              f"(baseline {cfg.algorithm.baseline}) but {paths[0]} trains {cfg0.task.name!r} "
                              f"{cfg0.task.options} (baseline {cfg0.algorithm.baseline}); cross-play pairs runs of "
                              "one task and baseline")
    warn_task_change(paths[0], cfg0, paths[0])
    out_dir = Path(out) if out else paths[0] / "crossplay"
    with scratch_run(out_dir, "accord eval --crossplay") as work:
        cfg0.run = dataclasses.replace(cfg0.run, run_dir=str(work))
        report = _crossplay(cfg0, paths, loaded, samples=samples, temperature=temperature)
        report.update(runs=[str(p) for p in paths], task=cfg0.task.name, task_options=cfg0.task.options,
                      samples=samples, temperature=temperature)
        _atomic_write_text(out_dir / "crossplay.json", json.dumps(report, indent=2))
        _atomic_write_text(out_dir / "crossplay.md", markdown(report))
    return out_dir


def _crossplay(cfg0: Config, paths: list[Path], loaded: list, *, samples: int, temperature: float) -> dict[str, Any]:
    """Build the first run's setting, load every run's checkpoint and play the cells."""
    from accord.build import build_run
    from accord.policies.model import build_policy

    run = build_run(cfg0)
    try:
        agents = run.agents
        if len(agents) < 2:
            raise ConfigError(f"--crossplay: task {cfg0.task.name!r} has one agent; cross-play pairs roles")
        rows = run.eval_rows
        if not rows:
            raise ConfigError("nothing to evaluate: task.eval_size is 0; pass task.eval_size=N")
        sources = [Source("base", cfg0, dict(run.agent_policy), run.policies)]
        for name, p, (cfg, ckpt) in zip(_source_names(paths), paths, loaded):
            cfg.resolve_agents(tuple(run.env.agents))
            agent_policy = {a.name: a.policy for a in cfg.agents}
            names = sorted(set(agent_policy.values()))
            policies = {pn: build_policy(cfg, pn, i, 1) for i, pn in enumerate(names)}
            for pn, pol in policies.items():
                load_policy(pol, ckpt, pn, "the files are incomplete or corrupted: cross-play another run")
            eval_ids = [r.get("id") for r in run.env.tasks("eval", limit=cfg.task.eval_size, seed=cfg.run.seed)] \
                if cfg.task.eval_size else []
            if eval_ids and eval_ids != [r.get("id") for r in rows]:
                logger.warning("%s: its own held-out instances differ from %s's; cross-play scores every cell on the "
                               "latter", p, paths[0])
            sources.append(Source(name, cfg, agent_policy, policies))
        report = _play_cells(run, sources, agents, rows, samples=samples, temperature=temperature)
    finally:
        run.close()
    report["instances"] = len(rows)
    return report


def _play_cells(run, sources: list[Source], agents: tuple[str, ...], rows: list[dict], *, samples: int,
                temperature: float) -> dict:
    """Evaluate every distinct role -> (source, policy) assignment once; build matrices, swaps and gaps."""
    from accord.evaluate import play
    from accord.policies.agents import AgentGenerator

    by_name = {s.name: s for s in sources}
    cache: dict[tuple, dict[str, list[float]]] = {}

    def evaluate(assign: tuple[tuple[str, str], ...], seed_from: Source) -> dict[str, list[float]]:
        """Per-instance scores of one assignment: role i plays policy ``assign[i][1]`` of source ``assign[i][0]``."""
        if assign in cache:
            return cache[assign]
        policies = {f"{src}/{pn}": by_name[src].policies[pn] for src, pn in assign}
        agent_map = {a: f"{src}/{pn}" for a, (src, pn) in zip(agents, assign)}
        for key, pol in policies.items():     # as evaluate.seed_eval_streams seeds the run's own policy names
            pol.seed_stream("eval", eval_stream_seed(seed_from.cfg.run.seed, key.split("/", 1)[1]))
        view = dataclasses.replace(run, generate=AgentGenerator(policies, agent_map), policies=policies,
                                   cfg=dataclasses.replace(run.cfg, run=dataclasses.replace(run.cfg.run,
                                                                                          seed=seed_from.cfg.run.seed)))
        scores: dict[str, list[float]] = {}
        for mode, n, greedy in (("greedy", 1, True), ("sampled", samples, False)):
            if n == 0:
                continue
            results = play(view, rows, n=n, greedy=greedy, temperature=temperature).results
            flat = [r["team"] for per in results for r in per]
            scores[mode] = [sum(r["team"] for r in per) / len(per) for per in results]
            scores[f"{mode}_mean"] = [sum(flat) / len(flat)]   # the formula of accord eval's table
        cache[assign] = scores
        return scores

    def own(src: Source, role: str) -> tuple[str, str]:
        return src.name, src.agent_policy[role]

    def cell(role_src: Source, partner_src: Source, i: int) -> dict[str, list[float]]:
        assign = tuple(own(role_src if j == i else partner_src, a) for j, a in enumerate(agents))
        seed_from = role_src if role_src is partner_src else sources[0]
        return evaluate(assign, seed_from)

    modes = ["greedy"] + (["sampled"] if samples else [])
    main = "sampled" if samples else "greedy"
    matrices: dict[str, dict] = {}
    for i, role in enumerate(agents):
        m: dict[str, dict[str, dict]] = {}
        for s in sources:
            m[s.name] = {}
            for t in sources:
                scores = cell(s, t, i)
                m[s.name][t.name] = {mode: _summary(scores[mode], scores[f"{mode}_mean"][0]) for mode in modes}
        matrices[role] = m
    swapped = {}
    for s in sources[1:]:
        assign = tuple(own(s, agents[(j + 1) % len(agents)]) for j in range(len(agents)))
        scores = evaluate(assign, s)
        swapped[s.name] = {mode: _summary(scores[mode], scores[f"{mode}_mean"][0]) for mode in modes}
    gaps: dict[str, dict[str, dict]] = {}
    trained = sources[1:]
    for x in trained:
        gaps[x.name] = {}
        for i, role in enumerate(agents):
            sp = cell(x, x, i)[main]
            entry = {"vs_base": _gap(sp, [cell(x, sources[0], i)[main]])}
            others = [y for y in trained if y is not x]
            if others:
                entry["vs_seeds"] = _gap(sp, [cell(x, y, i)[main] for y in others])
            gaps[x.name][role] = entry
    return {"agents": list(agents), "sources": [s.name for s in sources], "metric": main, "matrices": matrices,
            "swapped": swapped, "gaps": gaps, "evaluations": len(cache)}


def _summary(per_instance: list[float], mean: float) -> dict:
    lo, hi = bootstrap_ci(per_instance)
    return {"mean": mean, "ci95": [lo, hi]}


def _gap(self_play: list[float], cross: list[list[float]]) -> dict:
    diffs = [sp - sum(c[b] for c in cross) / len(cross) for b, sp in enumerate(self_play)]
    lo, hi = bootstrap_ci(diffs)
    return {"mean": sum(diffs) / len(diffs), "ci95": [lo, hi]}


def _fmt(cell: dict) -> str:
    lo, hi = cell["ci95"]
    return f"{cell['mean']:.3f} [{lo:.3f}, {hi:.3f}]"


def markdown(report: dict) -> str:
    """The cross-play report as markdown tables."""
    srcs, metric = report["sources"], report["metric"]
    lines = [f"# Cross-play of {', '.join(report['runs'])}", "",
             f"Task `{report['task']}` {report['task_options'] or ''}; {report['instances']} held-out instances; "
             f"scores are the team reward (mean [95 % bootstrap interval]); greedy = one per instance, sampled = "
             f"{report['samples']} per instance at temperature {report['temperature']}. Gaps use `{metric}`.", ""]
    modes = ["greedy"] + (["sampled"] if report["samples"] else [])
    for role, m in report["matrices"].items():
        for mode in modes:
            lines += [f"## Role `{role}` ({mode}): rows = its policy's source, columns = the partners' source", "",
                      "| role \\ partners | " + " | ".join(srcs) + " |", "|---|" + "---:|" * len(srcs)]
            for s in srcs:
                lines.append(f"| {s} | " + " | ".join(_fmt(m[s][t][mode]) for t in srcs) + " |")
            lines.append("")
    if report["swapped"]:
        lines += ["## Roles swapped (each run's policies in a cyclic shift of the roles)", "",
                  "| run | " + " | ".join(modes) + " |", "|---|" + "---:|" * len(modes)]
        for name, cell in report["swapped"].items():
            lines.append(f"| {name} | " + " | ".join(_fmt(cell[mode]) for mode in modes) + " |")
        lines.append("")
    lines += ["## Co-adaptation gap (self-play minus cross-play; > 0: the role relies on its own partner)", "",
              "| run | role | vs base partners | vs other seeds' partners |", "|---|---|---:|---:|"]
    for name, per_role in report["gaps"].items():
        for role, entry in per_role.items():
            seeds = _fmt(entry["vs_seeds"]) if "vs_seeds" in entry else "- (one run)"
            lines.append(f"| {name} | {role} | {_fmt(entry['vs_base'])} | {seeds} |")
    return "\n".join(lines) + "\n"
