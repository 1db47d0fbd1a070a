#!/usr/bin/env python
"""The default job's steps with ``run.retain_freed_memory`` on and off, side by side.

    python bench/allocator.py                       # the default job (accord train, no config), 4 steps each
    python bench/allocator.py --steps 6 --set rollout.batch_size=2
    python bench/allocator.py --set specialization=lora --json /tmp/alloc.json

Two worker processes build the same run (the default job, or it with ``--set`` overrides; no evaluation, no
checkpoints), one with glibc's malloc left as it is and one with :func:`accord.allocator.retain_freed_memory`
(the setting is per process and cannot be undone, hence two processes). The steps alternate between the
workers (step 1 of one, step 1 of the other, step 2 of one, ...), so that the load of a shared machine falls on
both alike. Each step's generation, update and whole time are printed per setting, with the ratio off / on, and
whether the two runs drew the same team reward and update statistics at every step (the allocator must not
change a single number). The first step is printed but left out of the ratios: both processes fault in
their pages there. Each worker's resident peak (``mem/peak_rss_mb``) is printed too: retaining memory keeps it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SETTINGS = ("off", "on")
TIMES = ("time/gen", "time/update", "time/step")


def worker_main(setting: str, overrides: list[str], threads: int) -> None:
    """Build the run, then run one training step per line read on stdin; answers are JSON lines on stdout."""
    out = sys.stdout
    sys.stdout = sys.stderr  # library chatter stays off the answer channel
    from accord.allocator import retain_freed_memory
    from accord.config import load_config
    from accord.trainer import Trainer

    run_dir = tempfile.mkdtemp(prefix=f"accord-alloc-{setting}-")
    cfg = load_config(None, [f"run.run_dir={run_dir}", "run.eval_before=false", "run.eval_after=false",
                             f"run.retain_freed_memory={'true' if setting == 'on' else 'false'}",
                             f"run.threads={threads}", *overrides])
    trainer = Trainer(cfg, overwrite=True)
    out.write(json.dumps({"retained": retain_freed_memory() if setting == "on" else False}) + "\n")
    out.flush()
    for step, _ in enumerate(sys.stdin):
        metrics, _ = trainer.train_step(step)
        out.write(json.dumps({k: float(v) for k, v in metrics.items()}) + "\n")
        out.flush()


class Worker:
    def __init__(self, setting: str, overrides: list[str], threads: int):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
        self.setting = setting
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", setting, "--threads", str(threads),
                                      "--set", *overrides], env=env, cwd=tempfile.gettempdir(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.setting!r} exited with {self.proc.wait()}")
        return json.loads(line)

    def step(self) -> dict:
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def outcome_keys(metrics: dict) -> list[str]:
    """The metrics that say what the step computed (rewards, losses, gradient norms), not how fast."""
    return sorted(k for k in metrics if k.startswith(("team/", "loss/", "reward/", "agent/", "adv/")))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides of the default job")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--worker", choices=SETTINGS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker_main(args.worker, args.set, args.threads)
        return
    if args.steps < 2:
        p.error("--steps must be at least 2: the first step is left out of the ratios")
    load = os.getloadavg()[0]
    workers = {s: Worker(s, args.set, args.threads) for s in SETTINGS}
    try:
        rows = {s: [] for s in SETTINGS}
        for _ in range(args.steps):
            for s in SETTINGS:
                rows[s].append(workers[s].step())
    finally:
        for w in workers.values():
            w.close()
    same = all(all(a.get(k) == b.get(k) for k in outcome_keys(a)) and outcome_keys(a) == outcome_keys(b)
               for a, b in zip(rows["off"], rows["on"]))
    print(f"default job{' with ' + ' '.join(args.set) if args.set else ''}: {args.steps} steps per setting, "
          f"{args.threads} threads; load average {load:.1f} before, {os.getloadavg()[0]:.1f} after; "
          f"retained in the 'on' worker: {workers['on'].ready['retained']}")
    print(f"{'step':>4} " + " ".join(f"{t.split('/')[1] + ' ' + s:>12}" for t in TIMES for s in SETTINGS)
          + f" {'peak RSS MB off':>15} {'on':>7}")
    for i in range(args.steps):
        cells = " ".join(f"{rows[s][i][t]:12.2f}" for t in TIMES for s in SETTINGS)
        rss = [rows[s][i].get("mem/peak_rss_mb", float("nan")) for s in SETTINGS]
        print(f"{i + 1:>4} {cells} {rss[0]:15.0f} {rss[1]:7.0f}")
    ratios = {t: statistics.median(rows["off"][i][t] / rows["on"][i][t] for i in range(1, args.steps)) for t in TIMES}
    print("off / on, median over steps 2-" + str(args.steps) + ": "
          + ", ".join(f"{t.split('/')[1]} {r:.2f}x" for t, r in ratios.items()))
    print(f"same rewards, losses and gradient norms at every step: {same}")
    result = {"steps": rows, "ratios": ratios, "same": same, "threads": args.threads, "overrides": args.set,
              "load_before": load, "load_after": os.getloadavg()[0]}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps({"ratios": ratios, "same": same}))


if __name__ == "__main__":
    main()
