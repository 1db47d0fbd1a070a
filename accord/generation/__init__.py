"""Generation backends. ``hf``: batched Hugging Face ``generate`` (default)."""

from accord.generation.hf import Generation, generate

__all__ = ["Generation", "generate"]
