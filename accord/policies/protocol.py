"""The policy interface: what the trainer, the rollouts, the evaluation and the critics may call on a policy.

A *policy* is one trainable unit that one or more agents act with (``policies`` in the config; an agent names its
policy). :class:`Policy` lists what every implementation offers, whichever way it holds its weights:

- :class:`accord.policies.model.ModelPolicy`: a whole model in this process (``specialization: shared`` or
  ``separate``);
- :class:`accord.policies.lora.LoraPolicy`: one LoRA adapter over a frozen base shared with the run's other
  adapters (``specialization: lora``);
- :class:`accord.distributed.ranks.DataParallelPolicy` and :class:`accord.distributed.fsdp.FsdpPolicy`: one rank of
  a data-parallel (or sharded) policy (``policies.<name>.replicas``, ``training.fsdp``);
- :class:`accord.distributed.ray_backend.RemotePolicy` and ``RemoteGroup``: a proxy in the trainer's process for a
  policy (or its ranks) living in Ray actors (``run.backend: ray``).

``tests/policies/test_protocol.py`` checks that each of them has every member below with the same parameters.
Code that needs more than this interface (the value heads and preference losses of :mod:`accord.critics`, which
need the model's forward with gradients) sends a function to where the policy lives with :meth:`Policy.run`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from accord.config import AlgorithmConfig, PolicyConfig, RolloutConfig, TrainingConfig
    from accord.generation import Generation
    from accord.rollout.sample import Sample, Sampling


class TrainingError(RuntimeError):
    """The update cannot go on (non-finite loss or gradient); the message names step and policy."""


class PromptTooLongError(ValueError):
    """A prompt does not fit the configured or model context."""


@runtime_checkable
class Policy(Protocol):
    """One trainable policy, as its users see it (see the module docstring for the implementations)."""

    name: str                      #: the policy's name (a key of the config's ``policies``)
    cfg: PolicyConfig              #: its section of the config (model, lr, device, ...)
    training: TrainingConfig
    algo: AlgorithmConfig
    rollout: RolloutConfig
    tokenizer: Any                 #: the model's tokenizer (a copy, in the trainer's process, for a remote policy)
    context_len: int | None        #: the model's context length (None: unbounded or unknown)
    device: torch.device           #: where the model's weights are (in the actor's process for a remote policy)

    # --- prompts ---------------------------------------------------------------------------------
    def encode_chat(self, messages: list[dict[str, str]], max_new_tokens: int | None = None) -> list[int]:
        """Token ids of a chat prompt ending with the assistant turn's opening; :class:`PromptTooLongError` when
        it leaves no room for ``max_new_tokens`` in the context or exceeds ``rollout.max_prompt_tokens``."""
        ...

    def decode(self, ids: list[int]) -> str:
        """The text of generated token ids (special tokens dropped)."""
        ...

    # --- sampling ----------------------------------------------------------------------------------
    def seed_stream(self, stream: str, seed: int) -> None:
        """(Re)start the named random stream ``stream`` (e.g. ``eval``); the training stream is left as is."""
        ...

    def generate(self, prompts: list[list[int]], *, greedy: bool, temperature: float, stream: str | None = None,
                 sampling: list[Sampling] | None = None) -> Sequence[Generation]:
        """One completion per tokenised prompt (token ids, their sampling log-probs, finish reason), drawn from the
        policy's training stream or the named ``stream``; ``sampling``: each prompt's own settings."""
        ...

    # --- scoring -----------------------------------------------------------------------------------
    def logprobs(self, samples: list[Sample]) -> list[list[float]]:
        """Each sample's completion-token log-probs under the current weights and the sample's sampling settings
        (the learner's computation, without gradients)."""
        ...

    def kl_rewards(self, samples: list[Sample]) -> list[tuple[float, int]]:
        """Per sample, the summed log-ratio of the current weights to the KL reference over its completion and the
        completion's token count (``algorithm.kl_estimator: k1`` as a reward penalty)."""
        ...

    # --- learning ----------------------------------------------------------------------------------
    def update(self, samples: list[Sample], step: int) -> dict[str, float]:
        """The optimizer steps of training step ``step`` (the run's, from 0; the LR schedule is moved forward to
        it first) over ``samples`` (with advantages); the update's metrics. :class:`TrainingError` on a non-finite
        loss or gradient."""
        ...

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(policy, *args, **kwargs)`` where the policy lives (in its Ray actor on that backend)."""
        ...

    # --- state -------------------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        """Write weights (or the adapter), optimizer, schedule and random streams: what resuming needs. The
        checkpoint writer makes ``directory``'s parent; a save makes ``directory`` only (not its parents)."""
        ...

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote, whichever device wrote it."""
        ...

    def export(self, directory: Path) -> None:
        """Write a directory other tools load: a Hugging Face model, or a PEFT adapter for a LoRA policy."""
        ...
