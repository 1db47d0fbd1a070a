"""Shared helpers of :mod:`accord.models`: the cache directory and the loader's error type."""

from __future__ import annotations

import inspect
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
    where = f"ACCORD_CACHE={env}" if env else "accord's model cache ~/.cache/accord"
    try:
        path = pathlib.Path(env).expanduser() if env else pathlib.Path.home() / ".cache" / "accord"
        path.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError) as err:   # a file in the way, no permission, a ~user or home that is not there
        raise ModelNotFoundError(f"{where} cannot be used as a directory ({getattr(err, 'strerror', None) or err}); "
                                 "set ACCORD_CACHE to a writable directory") from err
    return path


def cache_kwargs(model, cache) -> dict:
    """The forward keyword that passes a KV cache to ``model``: ``cache`` where its forward names it
    (transformers 5.24 names it so and deprecates ``past_key_values`` with a FutureWarning on every call), else
    ``past_key_values``. A PEFT model is looked through to the model it wraps."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        params = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        params = {}
    return {"cache": cache} if "cache" in params else {"past_key_values": cache}
