#!/usr/bin/env python
"""What the cooperation extras cost: the rollout audit (``training.audit``) and counterfactual credit
(``algorithm.credit``), measured side by side in one process.

    python bench/coop_overheads.py                     # tiny model, letters (MAGRPO) and relay (AT-GRPO)
    python bench/coop_overheads.py --steps 6 --rounds 3

Two parts:

1. **Step time.** For each setting a trainer on a tiny random Qwen2 (hidden 64, 2 layers) runs
   ``--steps`` training steps; settings run in alternating order for ``--rounds`` rounds and the median
   step time of each is printed with its ratio to the baseline of its group (audit off / credit team).
2. **Fingerprints.** The audit's per-step cost in multi-turn rollouts is one state fingerprint per prompt
   state and per clone stepped. For every built-in multi-turn environment: microseconds per
   :func:`accord.audit.state_fingerprint` against microseconds per ``clone()`` of the same state (both
   are paid per candidate), median of 200. With ``--adapters``, also the verified clone (seed + replay) of
   the adapters of other libraries' games (docs/pettingzoo.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from accord.audit import state_fingerprint
from accord.config import config_from_dict
from accord.envs import make_env
from accord.trainer import Trainer

SETTINGS = {
    "letters magrpo, audit off": ("letters", {"name": "magrpo"}, "off"),
    "letters magrpo, audit record": ("letters", {"name": "magrpo"}, "record"),
    "letters magrpo, audit strict": ("letters", {"name": "magrpo"}, "strict"),
    "letters magrpo, credit counterfactual": ("letters", {"name": "magrpo", "credit": "counterfactual"}, "off"),
    "relay atgrpo, audit off": ("relay", {"name": "atgrpo"}, "off"),
    "relay atgrpo, audit strict": ("relay", {"name": "atgrpo"}, "strict"),
    "relay magrpo tree, audit off": ("relay", {"name": "magrpo"}, "off"),
    "relay magrpo tree, credit counterfactual": ("relay", {"name": "magrpo", "credit": "counterfactual"}, "off"),
}
BASELINE = {"letters magrpo": "letters magrpo, audit off", "relay atgrpo": "relay atgrpo, audit off",
            "relay magrpo tree": "relay magrpo tree, audit off"}


def trainer(name: str, root: Path, threads: int) -> Trainer:
    task, algorithm, audit = SETTINGS[name]
    cfg = {
        "run": {"name": "b", "run_dir": str(root / name.replace(" ", "_").replace(",", "")), "steps": 1000,
                "threads": threads, "eval_before": False, "eval_after": False, "eval_every": 0},
        "specialization": "shared",
        "policies": {"main": {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}},
        "task": {"name": task, "eval_size": 0},
        "algorithm": {"num_generations": 4, **algorithm},
        "rollout": {"batch_size": 4, "max_new_tokens": 16, "temperature": 1.0},
        "training": {"lr": 1e-3, "micro_batch_size": 16, "audit": audit},
        "logging": {"console": False, "report_to": [], "completions_every": 0},
    }
    return Trainer(config_from_dict(cfg))


def step_times(args) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {name: trainer(name, Path(tmp), args.threads) for name in SETTINGS}
        step = {name: 0 for name in SETTINGS}
        for _ in range(args.rounds):
            for name, tr in trainers.items():
                for _ in range(args.steps):
                    t = time.perf_counter()
                    tr.train_step(step[name])
                    times[name].append(time.perf_counter() - t)
                    step[name] += 1
        for tr in trainers.values():
            tr.close()
    return times


def fingerprint_costs(repeats: int = 200) -> dict[str, dict[str, float]]:
    out = {}
    for name in ("relay", "planpath", "sudoku", "sokoban", "code", "math"):
        env = make_env(name)
        env.reset(env.tasks("train", limit=1)[0], seed=0)
        env.step({env.acting()[0]: "x = 1"})
        clone, fp = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            env.clone()
            clone.append(time.perf_counter() - t)
            t = time.perf_counter()
            state_fingerprint(env)
            fp.append(time.perf_counter() - t)
        out[name] = {"clone_us": statistics.median(clone) * 1e6, "fingerprint_us": statistics.median(fp) * 1e6}
    return out


ADAPTERS = {"pettingzoo:tictactoe_v3": ["0", "3", "1", "4"], "pettingzoo:classic.connect_four_v3": ["0", "1", "2", "3"],
            "textarena:TicTacToe-v0": ["[0]", "[3]", "[1]", "[4]"], "gymnasium:FrozenLake-v1": ["1", "1", "2", "2"]}


def adapter_clone_costs(repeats: int = 100) -> dict[str, float]:
    """Milliseconds per verified clone (seed + replay) of each adapter after its four moves (needs accord[envs])."""
    out = {}
    for name, moves in ADAPTERS.items():
        env = make_env(name)
        env.reset(env.tasks("train", limit=1)[0])
        for move in moves:
            if env.step({env.acting()[0]: move}).done:
                break
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            env.clone()
            times.append(time.perf_counter() - t)
        out[name] = statistics.median(times) * 1e3
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4, help="steps per setting per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--adapters", action="store_true", help="also time the PettingZoo / TextArena / Gymnasium "
                   "adapters' clone (seed + replay), median of 100 after four moves")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    fps = fingerprint_costs()
    print("state fingerprint vs clone, median of 200 (microseconds)")
    for name, v in fps.items():
        print(f"  {name:10s} clone {v['clone_us']:9.1f}   fingerprint {v['fingerprint_us']:9.1f}   "
              f"ratio {v['fingerprint_us'] / v['clone_us']:.2f}", flush=True)
    if args.adapters:
        for name, ms in adapter_clone_costs().items():
            print(f"  adapter clone {name:36s} {ms:7.2f} ms", flush=True)
    times = step_times(args)
    print(f"step time, median of {args.steps * args.rounds} steps (ratio to its group's baseline)")
    medians = {name: statistics.median(v) for name, v in times.items()}
    for name, m in medians.items():
        base = medians[BASELINE[name.split(",")[0]]]
        print(f"  {name:44s} {m * 1000:8.1f} ms   x{m / base:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"step_s": times, "median_s": medians, "fingerprints": fps}, indent=2))


if __name__ == "__main__":
    main()
