"""The package's public API: every exported name resolves, ``import accord`` alone imports no torch, and
docs/api.md describes every name."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import accord

REPO = Path(__file__).resolve().parents[1]


def test_every_exported_name_resolves_to_its_definition():
    for name in accord.__all__:
        value = getattr(accord, name)
        if name != "__version__":
            assert value.__name__ == name, name


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Trainr'"):
        accord.Trainr  # noqa: B018


def test_import_accord_is_cheap():
    code = "import sys, accord; print('torch' in sys.modules, accord.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", accord.__version__]


def test_star_import_gives_the_listed_names():
    scope: dict = {}
    exec("from accord import *", scope)   # noqa: S102
    assert set(accord.__all__) <= set(scope)


def test_api_page_names_every_export():
    page = (REPO / "docs" / "api.md").read_text()
    missing = [n for n in accord.__all__ if n != "__version__" and not re.search(rf"`{n}[`(]", page)]
    assert not missing, f"docs/api.md does not describe {missing}"
