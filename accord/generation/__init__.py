"""Generation: the backends a policy owns (:mod:`accord.generation.backends`: ``hf``, the default, and the
optional ``vllm``), accord's batched decoding loop (:mod:`accord.generation.hf`) and the agents' prompt-to-
completion calls (:mod:`accord.policies.agents`)."""

from accord.generation.hf import Generation, generate

__all__ = ["Generation", "generate"]
