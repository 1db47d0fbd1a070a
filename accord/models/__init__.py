"""Models and tokenizers for accord: tiny offline models, the bundled SmolLM2, and a spec-based loader."""

from .common import ModelNotFoundError, accord_cache_dir
from .loading import SMOLLM2_SPEC, TINY_SPECS, load_model_and_tokenizer
from .smollm2 import smollm2_dir
from .tiny import CHAT_TEMPLATE, TINY_ARCHS, build_tiny_model, tiny_tokenizer

__all__ = [
    "CHAT_TEMPLATE",
    "ModelNotFoundError",
    "SMOLLM2_SPEC",
    "TINY_ARCHS",
    "TINY_SPECS",
    "accord_cache_dir",
    "build_tiny_model",
    "load_model_and_tokenizer",
    "smollm2_dir",
    "tiny_tokenizer",
]
