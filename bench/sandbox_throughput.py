#!/usr/bin/env python
"""Throughput of accord.sandbox: sandboxed candidates per second with the default worker pool.

    python bench/sandbox_throughput.py                  # 200 candidates per workload
    python bench/sandbox_throughput.py --n 400 --site-packages --json /tmp/sandbox.json

Workloads (each a batch of ``--n`` candidates through ``run_many`` / ``run_tests_many``):

- ``trivial``: ``print(1)``;
- ``humaneval``: a HumanEval-like program (a small function with a loop and a helper) checked by the
  test harness with 5 literal asserts (planned without running anything; one subprocess per candidate,
  verdicts in this process);
- ``judged``: the same program with a ``for`` loop of asserts, which a judge replays: two subprocesses
  per candidate (the candidate's calls, then the trusted judge);
- ``humaneval_164``: the canonical solutions of the 164 HumanEval problems against their own tests
  (``--n`` of them, cycling), plans made once beforehand (9 of the problems need the judge);
- ``mix_10pct_timeouts``: the humaneval workload where every tenth candidate is ``while True: pass``,
  with ``--short-timeout`` seconds of wall clock (default 1 s).

Every candidate is a fresh process with the full isolation the machine allows (printed first). One
warm-up batch (the one-off isolation probe and page cache) is excluded; each workload runs
``--rounds`` times and the best round is reported, with the median alongside, plus the CPU time
(user + system, this process and all sandbox processes) per candidate, which does not depend on what
else the machine is running. The load average is printed last: timings on a busy machine are lower.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from accord.sandbox import Sandbox, SandboxConfig

PROGRAM = '''
def _is_vowel(ch):
    return ch.lower() in "aeiou"


def count_vowels(s: str) -> int:
    """Return the number of vowels in s; 'y' counts only at the end."""
    total = 0
    for i, ch in enumerate(s):
        if _is_vowel(ch) or (ch in "yY" and i == len(s) - 1):
            total += 1
    return total
'''

TESTS = '''
def check(candidate):
    assert candidate("abcde") == 2
    assert candidate("Alone") == 3
    assert candidate("key") == 2
    assert candidate("bye") == 1
    assert candidate("ACEDY") == 3

check(count_vowels)
'''

JUDGED_TESTS = TESTS.replace("    assert candidate(\"ACEDY\") == 3\n",
                             "    for word, n in [(\"ACEDY\", 3), (\"sky\", 1)]:\n        assert candidate(word) == n\n")


def _cpu_s() -> float:
    """CPU seconds of this process and of every (reaped) descendant: the sandboxes' cost, load-independent."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _measure(fn, n: int, rounds: int) -> dict:
    rates, cpu = [], []
    for _ in range(rounds):
        start, cpu_start = time.perf_counter(), _cpu_s()
        fn()
        rates.append(n / (time.perf_counter() - start))
        cpu.append((_cpu_s() - cpu_start) / n * 1000)
    return {"best": max(rates), "median": statistics.median(rates), "rounds": [round(r, 1) for r in rates],
            "cpu_ms_per_candidate": round(min(cpu), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="candidates per workload and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=None, help="pool size (default: os.cpu_count())")
    parser.add_argument("--short-timeout", type=float, default=1.0, help="timeout_s of the mix workload")
    parser.add_argument("--site-packages", action="store_true", help="let the code import site-packages (no -S)")
    parser.add_argument("--json", type=str, default=None, help="also write the results to this file")
    args = parser.parse_args()

    common = {"site_packages": args.site_packages}
    if args.workers is not None:
        common["workers"] = args.workers
    box = Sandbox(SandboxConfig(**common))
    short = Sandbox(SandboxConfig(timeout_s=args.short_timeout, **common))
    print(f"isolation: {box.isolation.summary()}   workers: {box.config.workers}   cpus: {os.cpu_count()}   "
          f"site-packages: {box.config.site_packages}")

    n = args.n
    trivial = ["print(1)"] * n
    humaneval = [(PROGRAM, TESTS, "count_vowels")] * n
    judged_plan = box.plan_tests(JUDGED_TESTS, "count_vowels", reference=PROGRAM)
    assert judged_plan.needs_judge
    judged = [(PROGRAM, judged_plan)] * n
    from accord.envs.coding.data import humaneval_problems, suite_of

    problems = humaneval_problems()
    plans = box.plan_tests_many([suite_of(p) for p in problems])
    real = [(problems[i % 164]["canonical"], plans[i % 164]) for i in range(n)]
    mix = [(("while True:\n    pass\n" if i % 10 == 9 else PROGRAM), TESTS, "count_vowels") for i in range(n)]

    # warm-up, and a check that the workloads do what they claim
    assert {r.status for r in box.run_many(trivial[:8])} == {"ok"}
    assert {(r.passed, r.total) for r in box.run_tests_many(humaneval[:4])} == {(5, 5)}
    assert {(r.passed, r.total) for r in box.run_tests_many(judged[:4])} == {(5, 5)}
    assert all(r.passed == r.total for r in box.run_tests_many(real[:8]))
    statuses = [r.result.status for r in short.run_tests_many(mix[:10])]
    assert statuses.count("timeout") == 1 and statuses.count("ok") == 9, statuses

    results = {
        "trivial": _measure(lambda: box.run_many(trivial), n, args.rounds),
        "humaneval_5_asserts": _measure(lambda: box.run_tests_many(humaneval), n, args.rounds),
        "judged_loop_asserts": _measure(lambda: box.run_tests_many(judged), n, args.rounds),
        "humaneval_164_canonical": _measure(lambda: box.run_tests_many(real), n, args.rounds),
        "mix_10pct_timeouts": _measure(lambda: short.run_tests_many(mix), n, args.rounds),
    }
    for name, r in results.items():
        print(f"{name:22s} {r['best']:7.1f} candidates/s (best of {args.rounds}; median {r['median']:.1f})"
              f"   {r['cpu_ms_per_candidate']:.1f} CPU-ms/candidate")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (other jobs share the CPUs)")
    payload = {"isolation": box.isolation.summary(), "workers": box.config.workers, "n": n,
               "site_packages": box.config.site_packages, "short_timeout_s": args.short_timeout,
               "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2))
    print(json.dumps(payload))


if __name__ == "__main__":
    main()
