"""Where policies run: ``run.backend: local`` (in the trainer's process) or ``ray`` (one Ray actor per policy).

The trainer sees the same interface on both backends (:class:`accord.policies.Policy`, or its Ray proxy
:class:`accord.distributed.ray_backend.RemotePolicy`). To let several policies work at the same time it
issues calls with :func:`submit` and collects them with :func:`gather`::

    futures = [submit(pol, "update", samples[name], step) for name, pol in policies.items()]
    stats = gather(futures)

On the local backend ``submit`` runs the call at once (so the order of work, and the result, is what a
plain loop gives); on the Ray backend it only sends the call to the policy's actor, so every actor
works while the driver waits in ``gather``. Ray is imported only by the Ray backend.
"""

from __future__ import annotations

from typing import Any


class Done:
    """The result of a call that has already run (local backend)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def result(self) -> Any:
        return self.value


def submit(policy: Any, method: str, *args: Any, **kwargs: Any):
    """Start ``policy.<method>(*args, **kwargs)``; returns an object whose ``result()`` is its value.

    A policy with a ``<method>_async`` twin (the Ray proxy) gets the call sent and returns at once;
    any other policy runs the call now."""
    start = getattr(policy, f"{method}_async", None)
    if start is not None:
        return start(*args, **kwargs)
    return Done(getattr(policy, method)(*args, **kwargs))


def gather(futures: list) -> list:
    """The values of :func:`submit`'s results, in order (a remote error is raised as its original type)."""
    return [f.result() for f in futures]


__all__ = ["Done", "gather", "submit"]
