"""Shared helpers of :mod:`accord.models`: the cache directory and the loader's error type."""

from __future__ import annotations

import os
import pathlib


class ModelNotFoundError(RuntimeError):
    """A requested model (or what is needed to build it) is not available locally.

    The message always says what was missing and how to fix it.
    """


def accord_cache_dir() -> pathlib.Path:
    """Return accord's cache directory, creating it if needed.

    ``$ACCORD_CACHE`` when set (``~`` is expanded), else ``~/.cache/accord``.
    """
    env = os.environ.get("ACCORD_CACHE")
    path = pathlib.Path(env).expanduser() if env else pathlib.Path.home() / ".cache" / "accord"
    path.mkdir(parents=True, exist_ok=True)
    return path
