#!/usr/bin/env python
"""Step time and peak memory as the number of agents, K and turns grow, per specialisation level.

    python bench/scaling.py                               # tiny Qwen2 (hidden 128, 4 layers), all grids
    python bench/scaling.py --levels shared lora --agents 1 2 4 --ks 2 4 8 --turns 1 2 3
    python bench/scaling.py --model smollm2-135m --agents 1 2 --ks 4 --turns 1 --steps 2

Each point is a fresh subprocess (so peak RSS belongs to that configuration alone) training AT-GRPO
on the synthetic ``relay`` environment with N agents (``num_agents``; their turns rotate), with B=2 instances, ``--max-new-tokens`` per completion and temperature 1. Reported: the mean
time of the measured steps (after one warm-up step), its generation and update parts, samples per
step, and the process's peak resident memory (VmHWM) at the end. ``shared`` is one model for every
agent, ``lora`` one frozen base with one adapter per agent, ``separate`` one full model per agent.
The last stdout line is all results as JSON.

    python bench/scaling.py --dp 1 2                      # data-parallel rows instead of the grids

``--dp R ...``: the shared level at N=2, K=4, T=2 with ``policies.main.replicas: R`` (R=1 in one process;
R>1 as R processes of ``torchrun``, each with ``--threads // R`` torch threads, so that every row uses the
same cores); the peak RSS is rank 0's (every rank holds a full copy of the model and optimizer).
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

REPO = Path(__file__).resolve().parents[1]
TAG = "@@SCALING@@ "


def _worker(spec: dict) -> dict | None:
    import torch

    if os.environ.get("RANK", "0") != "0":  # torchrun process of a data-parallel row: serve process 0
        from accord.distributed.data_parallel import serve_worker

        torch.set_num_threads(spec["threads"])
        serve_worker()
        return None

    torch.set_num_threads(spec["threads"])
    from accord.config import config_from_dict
    from accord.trainer import Trainer

    agents = list("eoaiu"[:spec["agents"]])   # the relay environment's agent names
    model_kwargs = {"hidden_size": spec["hidden"], "num_layers": spec["layers"]} if spec["model"].startswith("tiny") else {}
    level = spec["level"]
    if level == "separate":
        policies = {a: {"model": spec["model"], "model_kwargs": model_kwargs} for a in agents}
        agent_cfg = [{"name": a, "policy": a} for a in agents]
    elif level == "lora":
        policies = {a: {"model": spec["model"], "model_kwargs": model_kwargs} for a in agents}
        agent_cfg = [{"name": a, "policy": a} for a in agents]
    else:
        policies = {"main": {"model": spec["model"], "model_kwargs": model_kwargs}}
        if spec.get("replicas"):
            policies["main"]["replicas"] = spec["replicas"]
        agent_cfg = [{"name": a, "policy": "main"} for a in agents]
    data = {
        "run": {"name": "scaling", "run_dir": spec["run_dir"], "steps": spec["steps"] + 1, "threads": spec["threads"],
                "eval_before": False, "eval_after": False},
        "specialization": level,
        "policies": policies,
        "agents": agent_cfg,
        "task": {"name": "relay", "options": {"max_turns": spec["turns"], "num_agents": spec["agents"]}, "eval_size": 0},
        "algorithm": {"name": "atgrpo", "num_generations": spec["k"], "normalize_std": True},
        "rollout": {"batch_size": 2, "max_new_tokens": spec["max_new_tokens"], "temperature": 1.0},
        "training": {"lr": 1e-4, "micro_batch_size": 16, "bf16": False},  # fp32, as measured before bf16=auto
        "logging": {"console": False, "tensorboard": False, "completions_every": 0},
    }
    trainer = Trainer(config_from_dict(data))
    rows = []
    try:
        for step in range(spec["steps"] + 1):
            metrics, _ = trainer.train_step(step)
            if step:
                rows.append(metrics)
    finally:
        trainer.close()
    mean = lambda key: sum(r.get(key, 0.0) for r in rows) / len(rows)  # noqa: E731
    peak = 0.0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return {"step_s": mean("time/step"), "gen_s": mean("time/rollout"), "update_s": mean("time/update"),
            "samples": mean("perf/samples"), "peak_rss_mb": peak}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-qwen2")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--levels", nargs="+", default=["shared", "lora", "separate"])
    p.add_argument("--agents", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--ks", nargs="+", type=int, default=[2, 4, 8])
    p.add_argument("--turns", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=2, help="measured steps per point (after one warm-up)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dp", nargs="+", type=int, help="data-parallel rows: these replica counts (see above)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.worker:
        result = _worker(json.loads(args.worker))
        if result is not None:
            sys.stdout.write(TAG + json.dumps(result) + "\n")
        return 0
    if args.dp:
        return _data_parallel(args)
    # vary one factor at a time around the middle values (N=2, K=4, T=2)
    base = {"agents": 2, "k": 4, "turns": 2}
    points = []
    for level in args.levels:
        for n in args.agents:
            points.append((level, {**base, "agents": n}))
        for k in args.ks:
            points.append((level, {**base, "k": k}))
        for t in args.turns:
            points.append((level, {**base, "turns": t}))
    seen, results = set(), []
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1")
    print(f"{'level':9s} {'N':>2s} {'K':>2s} {'T':>2s} {'samples':>8s} {'step s':>7s} {'gen s':>7s} "
          f"{'update s':>8s} {'peak RSS MiB':>12s}", flush=True)
    for level, pt in points:
        key = (level, pt["agents"], pt["k"], pt["turns"])
        if key in seen:
            continue
        seen.add(key)
        with tempfile.TemporaryDirectory(prefix="scaling_") as tmp:
            spec = {**pt, "level": level, "model": args.model, "hidden": args.hidden, "layers": args.layers,
                    "steps": args.steps, "max_new_tokens": args.max_new_tokens, "threads": args.threads,
                    "run_dir": tmp}
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True,
                                  text=True, cwd=REPO, env=env)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(TAG)]
            if proc.returncode or not lines:
                sys.stderr.write(proc.stderr[-3000:])
                raise SystemExit(f"point {key} failed (exit {proc.returncode})")
            res = {"level": level, **pt, **json.loads(lines[-1][len(TAG):]),
                   "wall_s": round(time.perf_counter() - t0, 1)}
        results.append(res)
        print(f"{level:9s} {res['agents']:2d} {res['k']:2d} {res['turns']:2d} {res['samples']:8.0f} "
              f"{res['step_s']:7.2f} {res['gen_s']:7.2f} {res['update_s']:8.2f} {res['peak_rss_mb']:12.0f}",
              flush=True)
    out = {"model": args.model, "hidden": args.hidden, "layers": args.layers, "results": results}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    print(json.dumps(out))
    return 0


def _data_parallel(args) -> int:
    """Rows of ``--dp``: one policy with R replicas (R processes of torchrun for R > 1)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    results = []
    print(f"{'ranks':>5s} {'threads/rank':>12s} {'samples':>8s} {'step s':>7s} {'gen s':>7s} {'update s':>8s} "
          f"{'rank-0 peak RSS MiB':>19s}", flush=True)
    for r in args.dp:
        threads = max(1, args.threads // r)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1",
                   PYTHONPATH=str(REPO))
        with tempfile.TemporaryDirectory(prefix="scaling_dp_") as tmp:
            spec = {"agents": 2, "k": 4, "turns": 2, "level": "shared", "model": args.model, "hidden": args.hidden,
                    "layers": args.layers, "steps": args.steps, "max_new_tokens": args.max_new_tokens,
                    "threads": threads, "run_dir": tmp, "replicas": r}
            launch = [sys.executable] if r == 1 else [str(torchrun), "--nproc_per_node", str(r)]
            proc = subprocess.run(launch + [__file__, "--worker", json.dumps(spec)], capture_output=True, text=True,
                                  cwd=REPO, env=env)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(TAG)]
            if proc.returncode or not lines:
                sys.stderr.write(proc.stderr[-3000:])
                raise SystemExit(f"data-parallel row with {r} ranks failed (exit {proc.returncode})")
            res = {"replicas": r, "threads_per_rank": threads, **json.loads(lines[-1][len(TAG):])}
        results.append(res)
        print(f"{r:5d} {threads:12d} {res['samples']:8.0f} {res['step_s']:7.2f} {res['gen_s']:7.2f} "
              f"{res['update_s']:8.2f} {res['peak_rss_mb']:19.0f}", flush=True)
    out = {"model": args.model, "hidden": args.hidden, "layers": args.layers, "data_parallel": results}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
