#!/usr/bin/env python
"""Expected wall time of each example under examples/ on this machine.

    python bench/example_times.py                          # every example that `accord train` runs
    python bench/example_times.py atgrpo_planpath magrpo_writing --json /tmp/times.json

A full run of a SmolLM2 example takes tens of minutes, so each example runs for one step instead:
``accord train EXAMPLE run.steps=1 run.eval_every=0 run.eval_after=false`` in a subprocess (its own run
directory under a temporary folder), timed from the command's start to its exit. Its ``metrics.jsonl``
gives the evaluation before training (``time/eval``), the step (``time/step``) and the checkpoint
(``time/checkpoint``); everything else (imports, model loading, data, start-up) is the rest of the wall
time. The full run is then estimated from the example's own config:

    start-up + steps x step + evaluations x evaluation + checkpoints x checkpoint

with the evaluations and checkpoints the trainer makes (before training, every ``run.eval_every`` steps
and after the last; every ``run.checkpoint_every`` steps and at the end). The first step of a run is
the only one measured, and multi-turn steps vary with how long the episodes last, so the estimate is
what to expect, not a bound. The name ``default`` is the job ``accord train`` runs without a config (the
quickstart's). An example with an ``sft:`` section (``sft_planpath.yaml``) first runs ``accord sft`` on it,
timed whole, and its RL step starts from the exported checkpoint, as its header says. The GPU recipes under
``examples/gpu/`` are not listed: they need CUDA.

``--set KEY=VALUE`` applies a config override to every example measured (and to its estimate).
``--isa avx2`` estimates an AVX2-only CPU (an older AMD EPYC, where ``training.bf16: auto`` picks fp32)
on a newer one: torch's kernels, oneDNN and MKL are limited to AVX2 through their environment variables
and the updates run in fp32. The limits are the libraries' own, so the result is close to, not equal to,
an AVX2-only machine of the same clock (bench/README.md compares the two).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from accord.config import load_config  # noqa: E402

DEFAULT = "default"  # the job `accord train` runs without a config file


def schedule(cfg) -> tuple[int, int]:
    """(evaluations, checkpoints) of a full run of ``cfg``."""
    run = cfg.run
    evals = 1 if (run.eval_before and cfg.task.eval_size) else 0
    ckpts = 0
    for n in range(1, run.steps + 1):
        final = n == run.steps
        if cfg.task.eval_size and ((run.eval_every and n % run.eval_every == 0) or (final and run.eval_after)):
            evals += 1
        if (run.checkpoint_every and n % run.checkpoint_every == 0) or final:
            ckpts += 1
    return evals, ckpts


# What `--isa avx2` sets: torch's kernels, oneDNN and MKL limited to AVX2 (an AVX2-only CPU such as an
# older AMD EPYC), with the updates in fp32 as `training.bf16: auto` picks there.
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
AVX2_OVERRIDES = ["training.bf16=false"]


def _run(cmd: list[str], extra_env: dict[str, str]) -> tuple[float, str | None]:
    """Run ``cmd`` from the repository; (wall seconds, the last line of its output if it failed)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **extra_env)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return wall, tail[0]
    return wall, None


def measure(example: Path | None, out: Path, overrides: list[str] = (),
            extra_env: dict[str, str] | None = None) -> dict:
    """Time one step of ``example`` (None: the default job) with ``overrides`` (and ``extra_env`` in the
    environment of its commands) and extrapolate its full run."""
    extra_env = dict(extra_env or {})
    name = example.stem if example is not None else DEFAULT
    label = example.name if example is not None else f"{DEFAULT} (`accord train`)"
    overrides = list(overrides)
    cfg = load_config(example, overrides)
    config_arg = [str(example)] if example is not None else []
    base = [f"run.output_dir={out}", f"run.name={name}"]
    sft_s, extra = 0.0, []
    if example is not None and "sft" in (yaml.safe_load(example.read_text()) or {}):
        sft_s, error = _run([sys.executable, "-m", "accord.cli", "sft", *config_arg, f"run.output_dir={out}",
                             f"run.name={name}-sft", *overrides], extra_env)
        if error:
            return {"example": label, "error": f"accord sft: {error}"}
        extra = [f"policies.{p}.model={out / (name + '-sft') / 'sft' / p}" for p in cfg.policies]
    cmd = [sys.executable, "-m", "accord.cli", "train", *config_arg, *overrides, "run.steps=1", "run.eval_every=0",
           "run.eval_after=false", *base, "logging.console=false", *extra, "--overwrite"]
    wall, error = _run(cmd, extra_env)
    if error:
        return {"example": label, "error": error}
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    eval_s = sum(r.get("time/eval", 0.0) for r in rows if r.get("step") == 0)
    step_rows = [r for r in rows if r.get("step") == 1]
    step_s = sum(r.get("time/step", 0.0) for r in step_rows)
    ckpt_s = sum(r.get("time/checkpoint", 0.0) for r in step_rows)
    startup = wall - eval_s - step_s - ckpt_s
    evals, ckpts = schedule(cfg)
    total = sft_s + startup + cfg.run.steps * step_s + evals * eval_s + ckpts * ckpt_s
    model = ", ".join(sorted({p.model for p in cfg.policies.values()}))
    return {"example": label, "model": model, "sft_s": round(sft_s, 1), "steps": cfg.run.steps, "evaluations": evals,
            "checkpoints": ckpts, "measured_wall_s": round(wall, 1), "startup_s": round(startup, 1),
            "step_s": round(step_s, 1), "eval_s": round(eval_s, 1), "checkpoint_s": round(ckpt_s, 1),
            "estimated_full_run_s": round(total, 1)}


def minutes(s: float) -> str:
    return f"{s / 60:.0f} min" if s >= 600 else f"{int(s // 60)} min {int(s % 60)} s" if s >= 60 else f"{s:.0f} s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help="example names (file stems of examples/*.yaml, or `default` for the "
                   "job `accord train` runs without a config); default: all of them")
    p.add_argument("--json", dest="json_path", help="also write the results to this file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every example measured (repeatable), e.g. --set run.steps=10; the "
                   "full run is estimated with it too")
    p.add_argument("--isa", choices=["native", "avx2"], default="native",
                   help="avx2: limit torch, oneDNN and MKL to AVX2 and run the updates in fp32 (--set "
                   "training.bf16=false), to estimate an AVX2-only CPU on a newer one (default: native)")
    args = p.parse_args(argv)
    overrides = list(args.overrides)
    extra_env: dict[str, str] = {}
    if args.isa == "avx2":
        extra_env = dict(AVX2_ENV)
        overrides = AVX2_OVERRIDES + overrides
    examples: list[Path | None] = [None, *sorted((REPO / "examples").glob("*.yaml"))]
    if args.names:
        known = {(e.stem if e is not None else DEFAULT): e for e in examples}
        unknown = [n for n in args.names if n not in known]
        if unknown:
            p.error(f"unknown examples {unknown}; choose from {sorted(known)}")
        examples = [known[n] for n in args.names]
    results = []
    with tempfile.TemporaryDirectory(prefix="example_times.") as tmp:
        for example in examples:
            res = measure(example, Path(tmp), overrides, extra_env)
            results.append(res)
            print(json.dumps(res), flush=True)
    load = os.getloadavg()
    print(f"\nmachine: {os.cpu_count()} CPUs; load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"isa: {args.isa}; overrides: {overrides or 'none'}")
    print("| example | model | steps | one step | one evaluation | start-up (+ `accord sft`) | expected full run |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| `{r['example']}` | | | | | | failed: {r['error']} |")
            continue
        sft = f" + {r['sft_s']:.0f} s" if r["sft_s"] else ""
        print(f"| `{r['example']}` | {r['model']} | {r['steps']} | {r['step_s']:.3g} s | {r['eval_s']:.3g} s "
              f"(x{r['evaluations']}) | {r['startup_s']:.0f} s{sft} | {minutes(r['estimated_full_run_s'])} |")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
