"""The docs site: the generated reference pages are current, the strict mkdocs build (a broken link, a
page left out of the navigation, a missing anchor) passes, and the performance page times every example."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_generated_reference_pages_are_current():
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_docs.py"), "--check"], capture_output=True,
                          text=True, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr


def test_strict_site_build(tmp_path):
    pytest.importorskip("mkdocs")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()


def test_strict_build_fails_on_a_broken_link(tmp_path):
    """The check can fail: a copy of the docs with one broken link does not build."""
    pytest.importorskip("mkdocs")
    import shutil

    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    with open(docs / "api.md", "a", encoding="utf-8") as fh:
        fh.write("\n[a page that is not there](nowhere.md)\n")
    (tmp_path / "mkdocs.yml").write_text((REPO / "mkdocs.yml").read_text(encoding="utf-8"), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "nowhere.md" in proc.stderr


def _examples_table(text: str) -> dict[str, str]:
    """example file name -> its row, from the table under the performance page's *Examples* heading."""
    section = text.split("\n## Examples\n", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): line for line in section.splitlines()
            for m in [re.match(r"^\| `([^`]+\.yaml)` \|", line)] if m}


def _untimed(text: str) -> list[str]:
    rows = _examples_table(text)
    return [f.name for f in sorted((REPO / "examples").glob("*.yaml"))
            if not re.search(r"\d[\d.]* (?:s|min|h)\b", rows.get(f.name, ""))]


def test_every_example_has_a_time_on_the_performance_page():
    """Each example under examples/ (the GPU recipes under examples/gpu/ need CUDA) has a row with a measured or
    expected wall time in docs/performance.md's examples table."""
    untimed = _untimed((REPO / "docs" / "performance.md").read_text(encoding="utf-8"))
    assert not untimed, f"examples without a row and a time in docs/performance.md's examples table: {untimed}"


def test_the_examples_check_can_fail():
    """A page whose table lost an example's row, or whose row lost its time, is caught."""
    text = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    no_row = "\n".join(line for line in text.splitlines() if not line.startswith("| `tiny.yaml` |"))
    assert _untimed(no_row) == ["tiny.yaml"]
    no_time = re.sub(r"^(\| `own_task.yaml` \|.*)$", "| `own_task.yaml` | tiny Qwen2 | 10 | | | soon | | |", text,
                     flags=re.MULTILINE)
    assert _untimed(no_time) == ["own_task.yaml"]
