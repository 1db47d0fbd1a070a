"""accord.allocator (``run.retain_freed_memory``): a freed large block is reused without faulting its pages in
again, the heap growth that retention can cause is bounded by :func:`bound_retained_memory`, and a run's set-up
applies the setting only when it is on.

Each check runs in a fresh interpreter: the setting is per process and cannot be undone."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="glibc's malloc only")

ROUNDS = 16
BLOCK_MB = 256
PAGES = (BLOCK_MB << 20) // 4096   # the block in 4 KiB pages
KEPT_MB = 320   # the block kept after each large one: larger than any freed block, so it comes from the top


def probe(setup: str = "", retain: bool = False, keep_after: bool = False, guard: bool = False) -> dict:
    """Allocate, touch and free a 256 MiB block ROUNDS times in a fresh interpreter (after ``setup``); with
    ``guard`` :func:`bound_retained_memory` is called after each round. With ``keep_after``, the pattern that
    makes a heap grow: each round's block is 1 MiB larger than the last (so no freed block can hold it) and a
    block allocated after it, never touched, is kept (so the freed one is never the heap's top). A small kept
    block grows the heap only where it lands after the large one, which the heap's layout at start-up decides.
    Each round's minor page faults and resident MiB, and whether retention applies."""
    code = textwrap.dedent(f"""
        import json, resource
        import torch
        import accord.allocator as al
        {setup}
        if {retain}:
            al.retain_freed_memory()
        faults, rss, keep = [], [], []
        for i in range({ROUNDS}):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t = torch.empty(({BLOCK_MB} + i * {keep_after}) << 18, dtype=torch.float32)
            t.fill_(1.0)
            if {keep_after}:
                keep.append(torch.empty({KEPT_MB} << 18))
            del t
            if {guard}:
                al.bound_retained_memory()
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
            rss.append(al.resident_bytes() >> 20)
        print(json.dumps({{"faults": faults, "rss_mb": rss, "retained": al._applied}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_freed_block_is_reused_without_faulting_its_pages_again():
    default = probe()
    retained = probe(retain=True)
    assert default["retained"] is None and retained["retained"] is True
    # glibc by default maps and unmaps such a block each time: every round faults every page in again
    assert min(default["faults"]) > PAGES // 2, default
    # retained: once the heap has grown (torch's aligned blocks leave gaps at first), freed blocks are reused
    # without a page faulted in again, and the resident size stops growing
    assert max(retained["faults"][-4:]) < PAGES // 20, retained
    assert len(set(retained["rss_mb"][-4:])) == 1, retained


def test_the_guard_bounds_the_heap_growth_that_retention_can_cause():
    # each round's large block too large for the one freed before, and a block kept after it: the heap grows
    from accord.allocator import GROWTH, WARMUP_CALLS

    def bound(rss_mb: list[int]) -> float:
        # GROWTH over the largest size of the first calls, plus the one block a round allocates before the guard
        # (the last round's, the largest: BLOCK_MB + ROUNDS - 1 MiB)
        return max(rss_mb[:WARMUP_CALLS]) * (1 + GROWTH) + BLOCK_MB + ROUNDS - 1

    unguarded = probe(retain=True, keep_after=True)
    # unguarded, every round grows the heap by a block: it ends well past the bound the guard keeps
    assert unguarded["rss_mb"][-1] > bound(unguarded["rss_mb"]) + 4 * BLOCK_MB, unguarded
    guarded = probe(retain=True, keep_after=True, guard=True)
    assert max(guarded["rss_mb"]) <= bound(guarded["rss_mb"]), guarded


def test_the_guard_does_nothing_without_retention():
    out = probe(keep_after=True, guard=True)
    assert out["retained"] is None
    assert min(out["faults"]) > PAGES // 2, out


@pytest.mark.parametrize("setting", [True, False])
def test_a_runs_set_up_applies_the_setting_only_when_it_is_on(setting, tmp_path):
    setup = textwrap.dedent(f"""
        from accord.build import build_run
        from accord.config import load_config
        cfg = load_config("examples/tiny.yaml", ["run.run_dir={tmp_path / 'run'}", "run.steps=1",
                                                "run.retain_freed_memory={str(setting).lower()}"])
        build_run(cfg).close()
    """).replace("\n", "\n        ")
    out = probe(setup)
    if setting:
        assert out["retained"] is True
        assert max(out["faults"][-4:]) < PAGES // 20, out
    else:
        assert out["retained"] is None
        assert min(out["faults"]) > PAGES // 2, out
