"""The docs site: the generated reference pages are current, and the strict mkdocs build (a broken link, a
page left out of the navigation, a missing anchor) passes. No test ties the prose's numbers (times, rewards)
to measurements: those pages say when and where each number was measured."""

from __future__ import annotations

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
