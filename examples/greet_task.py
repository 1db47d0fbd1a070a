"""A task of your own, outside the accord package: used by examples/own_task.yaml.

Two agents share one team reward: the ``host`` greets a visitor by name, the ``guest`` answers with
thanks. Run it from the repository root (the current directory is on the import path):

    accord train examples/own_task.yaml

``imports: [examples.greet_task]`` in the config imports this module, so its ``@register_task("greet")``
makes ``task.name: greet`` known; ``task.name: examples.greet_task:GreetTask`` names the class directly.
"""

from __future__ import annotations

from typing import Any

from accord.envs import register_task

NAMES = ("Ada", "Alan", "Grace", "Edsger", "Barbara", "Donald", "Frances", "John", "Margaret", "Ken")


class GreetTask:
    """host greets the visitor by name; guest thanks the host; team reward in [0, 1]."""

    name = "greet"
    agents = ("host", "guest")

    def __init__(self, size: int = 200):
        self.size = size

    def rows(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        base = 0 if split == "train" else 10 * self.size  # disjoint ids: train and eval never overlap
        n = self.size if limit is None else min(limit, self.size)
        return [{"id": f"{split}-{base + i}", "visitor": NAMES[(base + i) % len(NAMES)]} for i in range(n)]

    def prompt(self, agent: str, row: dict[str, Any]) -> list[dict[str, str]]:
        if agent == "host":
            return [{"role": "user", "content": f"{row['visitor']} arrives. Greet them by name in one sentence."}]
        return [{"role": "user", "content": f"You are {row['visitor']}, a guest. Thank your host in one sentence."}]

    def reward(self, *, prompts, completions, agents, visitor, **columns) -> list[float]:
        # completions["host"][j] and completions["guest"][j] form joint action j; visitor[j] is its row's field
        return [0.5 * (name.lower() in host.lower()) + 0.5 * ("thank" in guest.lower())
                for host, guest, name in zip(completions["host"], completions["guest"], visitor)]


@register_task("greet", "example of your own task: host greets the visitor by name, guest thanks the host")
def make_greet(size: int = 200) -> GreetTask:
    return GreetTask(size=size)
