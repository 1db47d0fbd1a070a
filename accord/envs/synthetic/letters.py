"""A small synthetic cooperative task for tests and quick runs with tiny random models.

Two agents each write a short string; agent ``e`` is credited for the share of its words that contain
the letter "e", agent ``o`` for the share of words that contain "o". The team reward is the mean of
the two shares, so both must improve for the team to reach 1.0. A random model starts well below
that and a policy gradient can raise it within a few dozen steps, which makes it a learning test
that runs in seconds. Instances differ only by a number in the prompt; train and eval use disjoint
ranges of those numbers.
"""

from __future__ import annotations

from typing import Any

from accord.envs.registry import MAX_TASK_SIZE, Messages, check_number, register_task

AGENTS = ("e", "o")


def _share(text: str, letter: str) -> float:
    words = text.split()
    return sum(letter in w.lower() for w in words) / len(words) if words else 0.0


class LettersTask:
    name = "letters"
    agents = AGENTS

    def __init__(self, size: int = 1000):
        self.size = check_number("size", size, 1, MAX_TASK_SIZE, integer=True)

    def rows(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        base = 0 if split == "train" else 10 * self.size  # disjoint id ranges
        n = self.size if limit is None else min(limit, self.size)
        return [{"id": f"{split}-{base + i}", "number": base + i} for i in range(n)]

    def prompt(self, agent: str, row: dict[str, Any]) -> Messages:
        if agent not in AGENTS:
            raise ValueError(f"agent must be one of {AGENTS}, got {agent!r}")
        return [{"role": "user", "content": f"Task {row['number']}: write words with the letter {agent}."}]

    def reward(self, *, prompts=None, completions: dict, agents: tuple[str, ...], **kwargs) -> list[float]:
        es, os_ = completions["e"], completions["o"]
        return [0.5 * (_share(a, "e") + _share(b, "o")) for a, b in zip(es, os_)]


@register_task("letters", "synthetic: agent e writes words with 'e', agent o with 'o'; team reward = mean share")
def make_letters(size: int = 1000) -> LettersTask:
    return LettersTask(size=size)
