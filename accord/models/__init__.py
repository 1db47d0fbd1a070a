"""Models and tokenizers for accord: tiny offline models, the bundled SmolLM2, and a spec-based loader.

Names are resolved on first use, so that importing a light submodule (:mod:`accord.models.specs`, which the
config reads) does not import torch and transformers."""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the submodule that defines it
_EXPORTS: dict[str, str] = {
    "CHAT_TEMPLATE": "tiny",
    "ModelNotFoundError": "common",
    "SMOLLM2_SPEC": "loading",
    "TINY_ARCHS": "tiny",
    "TINY_SPECS": "specs",
    "accord_cache_dir": "common",
    "build_tiny_model": "tiny",
    "load_model_and_tokenizer": "loading",
    "smollm2_dir": "smollm2",
    "tiny_tokenizer": "tiny",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accord.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value   # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
