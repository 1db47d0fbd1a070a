"""Registers MAGRPO's collaborative writing tasks (TLDR summaries, arXiv expansion) as tasks."""

from __future__ import annotations

from typing import Any

from accord.envs.base import Messages, register_task
from accord.envs.writing import (ARXIV_AGENTS, TLDR_AGENTS, load_writing_rows, writing_prompt,
                                 writing_team_reward)


class WritingTask:
    """Two writers, one text: see :mod:`accord.envs.writing` for data, prompts and the reward levels."""

    def __init__(self, variant: str = "tldr", source: str = "auto", data_files: str | None = None):
        if variant not in ("tldr", "arxiv"):
            raise ValueError(f"task.options.variant={variant!r}; choose 'tldr' or 'arxiv'")
        self.variant, self.source, self.data_files = variant, source, data_files
        self.name = f"writing-{variant}"
        self.agents = TLDR_AGENTS if variant == "tldr" else ARXIV_AGENTS

    def rows(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        rows = load_writing_rows(self.variant, split, source=self.source, limit=limit, seed=seed,
                                 data_files=self.data_files)
        if self.source == "auto" and rows and self.data_files is None:
            # pin the first choice: train and eval must come from one corpus, even if the hub
            # stops answering between the two calls
            self.source = rows[0]["source"]
        return rows

    def prompt(self, agent: str, row: dict[str, Any]) -> Messages:
        return writing_prompt(agent, row, self.variant)

    def reward(self, *, prompts=None, completions: dict, agents: tuple[str, ...], **kwargs) -> list[float]:
        return writing_team_reward(prompts=prompts, completions=completions, agents=agents, variant=self.variant)


@register_task("writing", "MAGRPO writing: a concise and a detailed summary of one text (tldr) or arXiv expansion")
def make_writing(variant: str = "tldr", source: str = "auto", data_files: str | None = None) -> WritingTask:
    return WritingTask(variant=variant, source=source, data_files=data_files)
