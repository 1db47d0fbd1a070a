"""The ```python blocks of the README and the docs pages run as a reader would paste them: each in a fresh
interpreter, from a scratch directory that holds the repository's examples/, with accord importable.

Every block is either run or listed in NOT_RUN with the reason (a fragment, the reader's own class, a job of
minutes that another test runs), so a new block cannot go unchecked by being forgotten."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

# (page, the block's first line) -> why it is not run here
NOT_RUN = {
    ("docs/own-task.md", "def reward(self, *, prompts, completions, agents, **columns) -> list[float]:"):
        "a method's signature, not a program",
    ("docs/multi-turn.md", "from accord.envs.check import check_env"):
        "MyEnv is the reader's own environment; tests/rollout/test_multiturn.py and the task tests run check_env on the built-in ones",
    ("docs/compare.md", "import yaml"):
        "a whole comparison (minutes); tests/test_compare.py runs real comparisons (slow)",
}


def _blocks() -> list[tuple[str, str, str]]:
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in re.findall(r"^```python\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE):
            first = next(line for line in block.splitlines() if line.strip() and not line.startswith("#"))
            out.append((str(page.relative_to(REPO)), first, block))
    return out


BLOCKS = _blocks()


def _params():
    for page, first, block in BLOCKS:
        if (page, first) in NOT_RUN:
            continue
        yield pytest.param(block, id=f"{page}:{first[:40]}")


def test_every_block_is_run_or_says_why_not():
    found = {(page, first) for page, first, _ in BLOCKS}
    stale = set(NOT_RUN) - found
    assert not stale, f"NOT_RUN names blocks that no page holds any more: {stale}"
    assert any(page == "README.md" for page, _, _ in BLOCKS), "the README shows no Python example"


@pytest.mark.slow  # a fresh interpreter that imports torch (the README's and callbacks' blocks train two steps)
@pytest.mark.parametrize("block", list(_params()))
def test_python_block_runs(block, tmp_path):
    (tmp_path / "examples").symlink_to(REPO / "examples")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
