#!/usr/bin/env python
"""Does the quickstart visibly learn? The default job (`accord train` with no config) on several seeds, judged
by the quickstart's two criteria, with the time it took on this CPU.

    python bench/quickstart_seeds.py --seeds 0 1 2                 # three fresh runs under runs/quickstart-seeds/
    python bench/quickstart_seeds.py --seeds 0 --set training.lr=1e-4 run.steps=12   # a variant of the job
    python bench/quickstart_seeds.py --runs runs/writing-tldr runs/writing-seed1     # judge finished runs only

Per seed: the held-out team reward at step 0 and at the last evaluation, their per-text paired difference
with its 95 % Student-t interval (the same held-out texts at both steps: `eval_completions/step_N.jsonl`), the
sampled training team reward's mean over the first and the last third of the steps, how many different answers
each agent wrote over the held-out texts at the last evaluation (far fewer than the texts: one answer for every
text, which the writing task's lexical reward can still pay for; it does not decide the verdict), the seconds per
step (generating + updating, from `time/*`), the run's wall time and the load average before and after. A seed
passes when the held-out reward rose by at least ``--min-gain`` (0.4 of the nominal 3.0) and the last third's
training reward lies above the first third's. Each run goes through the real CLI in a subprocess, so the wall
time includes loading the model and writing the final checkpoint; set-up (`scripts/setup.sh`, about 2.5 min on
a fresh machine, seconds with the venv in place) and `accord report` (about 5 s) are not in it: add them.

The machine's other load inflates the times: the load average is printed next to them; measure on a quiet
machine for numbers to publish. The runs get this process's environment as it is (``OMP_WAIT_POLICY`` is not
set for them, as `scripts/quickstart.sh` does not set it: on a quiet 2-core AVX2 CPU ``PASSIVE`` made the default
job's generation 1.5x slower, bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from accord.stats import paired
from accord.tracking import read_metrics
from accord.tracking.console import training_thirds
from accord.tracking.eval_completions import eval_completions_path

REPO = Path(__file__).resolve().parents[1]


def eval_rewards(run_dir: Path, step: int) -> dict[str, float]:
    """Held-out team reward per text (instance id) at ``step``: the joint action's reward, one per instance."""
    path = eval_completions_path(run_dir, step)
    out: dict[str, float] = {}
    for line in path.read_text(encoding="utf-8").split("\n"):
        if not line:
            continue
        row = json.loads(line)
        out[str(row["instance"])] = float(row["reward"])
    return out


def distinct_answers(run_dir: Path, step: int) -> dict[str, int]:
    """Per agent, how many different completions it wrote over the held-out texts at ``step``: far fewer than
    the texts means one answer for every text, which a lexical reward can still pay for (docs/quickstart.md)."""
    seen: dict[str, set[str]] = {}
    for line in eval_completions_path(run_dir, step).read_text(encoding="utf-8").split("\n"):
        if not line:
            continue
        row = json.loads(line)
        seen.setdefault(str(row["agent"]), set()).add(row["completion"])
    return {agent: len(texts) for agent, texts in seen.items()}


def judge_run(run_dir: str | Path, min_gain: float = 0.4) -> dict:
    """The quickstart's criteria and times of one finished run, from its metrics and evaluation completions."""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    evals = sorted({r["step"] for r in rows if isinstance(r.get("eval/team/reward"), (int, float))})
    if len(evals) < 2:
        raise ValueError(f"{run_dir}: needs a held-out evaluation before and after training, found steps {evals}; "
                         "keep run.eval_before and run.eval_after true")
    before, after = eval_rewards(run_dir, evals[0]), eval_rewards(run_dir, evals[-1])
    if before.keys() != after.keys():
        raise ValueError(f"{run_dir}: steps {evals[0]} and {evals[-1]} evaluated different texts; the paired "
                         "difference needs the same held-out set")
    ids = sorted(before)
    diff = paired([after[i] for i in ids], [before[i] for i in ids])
    thirds = training_thirds(rows)
    if thirds is None:
        raise ValueError(f"{run_dir}: fewer than two training steps logged")
    _, first, _, last = thirds
    train = {r["step"]: r for r in rows if isinstance(r.get("team/reward"), (int, float))}

    def mean_of(key: str) -> float:
        values = [r[key] for r in train.values() if isinstance(r.get(key), (int, float))]
        return sum(values) / len(values) if values else math.nan

    return {
        "run_dir": str(run_dir), "eval_steps": evals, "texts": len(ids),
        "held_out": {str(s): sum(eval_rewards(run_dir, s).values()) / len(ids) for s in evals},
        "held_out_gain": diff, "train_first_third": first, "train_last_third": last,
        "steps": len(train), "s_per_step": mean_of("time/step"), "s_gen": mean_of("time/gen"),
        "s_update": mean_of("time/update"), "distinct_answers": distinct_answers(run_dir, evals[-1]),
        "passes": diff["mean"] >= min_gain and last > first,
    }


def run_seed(seed: int, out: Path, overrides: list[str], threads: int | None) -> tuple[Path, float, tuple, tuple]:
    """`accord train` of the default job (plus ``overrides``) with ``seed`` into ``out/seed-N``: (run directory,
    wall seconds, load average before, after)."""
    run_dir = out / f"seed-{seed}"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "accord.cli", "train", f"run.seed={seed}", f"run.run_dir={run_dir}",
           "logging.console=false", *overrides, "--overwrite"]
    if threads is not None:
        cmd.insert(4, f"run.threads={threads}")
    load_before = os.getloadavg()
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"seed {seed}: accord train failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return run_dir, wall, load_before, os.getloadavg()


def _ci(d: dict) -> str:
    return f"{d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}]"


def table(results: list[dict]) -> str:
    """Markdown table of judged runs."""
    lines = ["| run | held-out before -> after (texts) | paired gain, 95 % t | train first -> last third | "
             "distinct answers at the last evaluation | s/step (gen + update) | wall | load avg before / after | passes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        steps = r["eval_steps"]
        held = " -> ".join(f"{r['held_out'][str(s)]:.2f}" for s in steps)
        wall = f"{r['wall_s'] / 60:.1f} min" if "wall_s" in r else "—"
        load = (f"{r['load_before'][0]:.1f} / {r['load_after'][0]:.1f}" if "load_before" in r else "—")
        distinct = ", ".join(f"{agent} {n}/{r['texts']}" for agent, n in r["distinct_answers"].items())
        lines.append(f"| {Path(r['run_dir']).name} | {held} (steps {', '.join(map(str, steps))}; {r['texts']}) | "
                     f"{_ci(r['held_out_gain'])} | {r['train_first_third']:.2f} -> {r['train_last_third']:.2f} | "
                     f"{distinct} | "
                     f"{r['s_per_step']:.1f} ({r['s_gen']:.1f} + {r['s_update']:.1f}) | {wall} | {load} | "
                     f"{'yes' if r['passes'] else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides of the default job")
    p.add_argument("--runs", nargs="+", help="judge these finished run directories instead of training")
    p.add_argument("--out", default=str(REPO / "runs" / "quickstart-seeds"))
    p.add_argument("--threads", type=int, help="run.threads of each run (default: torch's)")
    p.add_argument("--min-gain", type=float, default=0.4)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    if args.runs and args.set:
        p.error("--set applies to new runs; --runs judges finished ones: give one of them")
    if len(set(args.seeds)) != len(args.seeds):
        p.error(f"--seeds {args.seeds}: a seed given twice; give each once")
    results = []
    if args.runs:
        try:
            results = [judge_run(r, args.min_gain) for r in args.runs]
        except (ValueError, FileNotFoundError) as exc:   # an unfinished or missing run: one line, exit 2
            p.error(str(exc))
    else:
        for seed in args.seeds:
            run_dir, wall, before, after = run_seed(seed, Path(args.out), args.set, args.threads)
            result = judge_run(run_dir, args.min_gain)
            result.update(seed=seed, wall_s=wall, load_before=before, load_after=after, overrides=args.set)
            results.append(result)
            print(table([result]).splitlines()[-1], flush=True)
    print(table(results))
    print(f"all pass: {all(r['passes'] for r in results)} (held-out gain >= {args.min_gain} and the last third's "
          "training reward above the first third's, on every run)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
