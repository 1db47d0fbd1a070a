"""Trainer callbacks: user code called at points of the training loop.

Subclass :class:`Callback` and override the hooks you need (the others do nothing), then pass
instances to ``Trainer(cfg, callbacks=[...])`` or ``accord.trainer.train(cfg, callbacks=[...])``.
Steps count completed updates, as in ``metrics.jsonl``: step ``n`` is after ``n`` updates, step 0
is before training.

- ``on_evaluate(step, metrics)``: after each held-out evaluation (``eval/*`` metrics), before the
  step's metrics are logged; step 0 for ``run.eval_before``.
- ``on_checkpoint(step, path)``: after the checkpoint of ``step`` is written (``path`` is its
  directory, ``RUN_DIR/checkpoints/step_NNNNNN``).
- ``on_step_end(step, metrics)``: after the step's metrics (with its evaluation, if any) are logged.
- ``on_train_end(metrics)``: after the last step, with its metrics (and the final evaluation); not
  called when training stops with an error.

Callbacks run in the trainer's process, in the order given. An exception in one (``SystemExit`` to end
training early, or an error of its own) stops training: an exception in ``on_evaluate`` or ``on_step_end``
comes after the step it was raised at is logged and checkpointed (``accord train --resume`` goes on from
it), and the later callbacks of that hook are not called.
The metrics dicts are copies: changing them does not change what is logged.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["HOOKS", "Callback", "CallbackProtocol", "check_callbacks"]

HOOKS = ("on_step_end", "on_evaluate", "on_checkpoint", "on_train_end")


@runtime_checkable
class CallbackProtocol(Protocol):
    """What the trainer calls; :class:`Callback` implements it with hooks that do nothing."""

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None: ...

    def on_evaluate(self, step: int, metrics: dict[str, float]) -> None: ...

    def on_checkpoint(self, step: int, path: Path) -> None: ...

    def on_train_end(self, metrics: dict[str, float]) -> None: ...


class Callback:
    """Base class of trainer callbacks: override any of the four hooks."""

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        """After step ``step``'s metrics are logged."""

    def on_evaluate(self, step: int, metrics: dict[str, float]) -> None:
        """After a held-out evaluation at step ``step``."""

    def on_checkpoint(self, step: int, path: Path) -> None:
        """After the checkpoint of step ``step`` is written to ``path``."""

    def on_train_end(self, metrics: dict[str, float]) -> None:
        """After the last step."""


def check_callbacks(callbacks: Iterable[object] | None) -> list[CallbackProtocol]:
    """The callbacks as a list; each must have the four hooks as methods."""
    if callbacks is None:
        return []
    if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Iterable):
        raise TypeError(f"callbacks must be a list of Callback objects, got {type(callbacks).__name__}")
    out = list(callbacks)
    for cb in out:
        if isinstance(cb, type):
            raise TypeError(f"callbacks holds the class {cb.__name__}; pass an instance, {cb.__name__}()")
        missing = [h for h in HOOKS if not callable(getattr(cb, h, None))]
        if missing:
            raise TypeError(f"callback {type(cb).__name__} lacks {missing}; subclass accord.callbacks.Callback, "
                            "which provides every hook")
    return out
