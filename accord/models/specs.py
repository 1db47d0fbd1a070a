"""The built-in tiny models' names, options and shape rule, without torch: the config checks
``policies.<name>.model_kwargs`` with them before anything heavy is imported (:mod:`accord.models.tiny` builds
the models, :mod:`accord.models.loading` loads them by name)."""

from __future__ import annotations

TINY_SPECS = {"tiny-qwen2": "qwen2", "tiny-llama": "llama", "tiny-qwen3": "qwen3"}
"""The random tiny models by name, and the architecture :func:`accord.models.tiny.build_tiny_model` gives each."""
TINY_OPTIONS = {"hidden_size": int, "num_layers": int, "num_heads": int, "vocab_size": int, "pad_is_eos": bool,
                "max_position_embeddings": int, "tie_word_embeddings": bool}
"""``policies.<name>.model_kwargs`` of a tiny model: :func:`accord.models.tiny.build_tiny_model`'s keyword
arguments (but ``arch`` and ``seed``) and their types, here so that a config is checked without importing torch
(a test keeps the two equal)."""
TINY_MIN_VOCAB = 256 + 4
"""The smallest tiny vocabulary: the 256 bytes of byte-level BPE and the special tokens."""


def tiny_shape_problem(hidden_size: int = 64, num_heads: int = 4, vocab_size: int = 2048) -> str | None:
    """What is wrong with a tiny model's shape (None: nothing); the config checks it before building."""
    for name, value in (("hidden_size", hidden_size), ("num_heads", num_heads)):
        if value < 1:
            return f"{name}={value} must be >= 1"
    if hidden_size % num_heads or (hidden_size // num_heads) % 2:
        return (f"hidden_size={hidden_size} must be a multiple of num_heads={num_heads} with an even "
                "head dimension (needed by rotary embeddings); e.g. hidden_size=64, num_heads=4.")
    if vocab_size < TINY_MIN_VOCAB:
        return (f"vocab_size={vocab_size} is too small: byte-level BPE needs at least {TINY_MIN_VOCAB} "
                "(256 bytes + special tokens); pass a larger vocab_size.")
    return None
