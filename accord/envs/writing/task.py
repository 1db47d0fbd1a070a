"""Registers MAGRPO's collaborative writing tasks (TLDR summaries, arXiv expansion) as tasks.

``single_agent: true`` is MAGRPO's single-model baseline: one agent, ``writer``, writes both parts in one
completion, under one heading per part (``Concise:`` / ``Detailed:`` for tldr, ``Background:`` /
``Methods:`` for arxiv; any case, Markdown ``**`` or ``#`` around it, the word ``summary`` after it
allowed). :func:`split_parts` cuts the completion at the headings; with no heading the first paragraph
(up to the first blank line) is the first part and the rest the second. The parts are scored by the same
team reward as the two agents' outputs; a part that is missing is empty and fails the reward's first
level (the total is then 0).

``faithfulness`` (a weight, default 0: the paper's reward) adds a lexical term that scores each text
against the source text (:func:`accord.envs.writing.core.writing_reward_parts`). The task defines
``reward_components``, so runs log the levels ``l1``..``l4``, ``faithfulness`` and ``source_overlap``
as ``reward/<name>``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from accord.envs.registry import Messages, TaskError, register_task
import math

from accord.envs.writing.core import (_INSTRUCTIONS, _SOURCES, ARXIV_AGENTS, TLDR_AGENTS, _as_text, load_writing_rows,
                                 writing_min_words, writing_prompt, writing_reward_parts)

WRITER = "writer"


@functools.lru_cache(maxsize=None)
def heading_pattern(roles: tuple[str, str]) -> re.Pattern:
    """The heading of a role's part: a line's start, optional ``#`` and ``*`` marks, the role (and ``summary``),
    a colon. One way to read each run of blanks (no two optional runs side by side), so that a line that nearly
    matches fails in time linear in its length."""
    names = "|".join(re.escape(r) for r in roles)
    return re.compile(rf"(?im)^[ \t]*(?:#+[ \t]*)?(?:\*+[ \t]*)?({names})(?:[ \t]+summary)?[ \t]*(?:\*+[ \t]*)?:"
                      r"[ \t]*\**")


def split_parts(text: str, roles: tuple[str, str]) -> dict[str, str]:
    """One completion cut into the two roles' parts (see the module docstring); never raises."""
    text = text if isinstance(text, str) else ""
    heading = heading_pattern(tuple(roles))
    marks = list(heading.finditer(text))
    parts = dict.fromkeys(roles, "")
    if marks:
        for i, m in enumerate(marks):
            end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
            role = m.group(1).lower()
            if not parts[role]:   # the first section of a role counts
                parts[role] = text[m.end():end].strip()
        return parts
    chunks = re.split(r"\n[ \t]*\n", text.strip(), maxsplit=1)
    parts[roles[0]] = chunks[0].strip()
    parts[roles[1]] = chunks[1].strip() if len(chunks) > 1 else ""
    return parts


class WritingTask:
    """Two writers, one text: see :mod:`accord.envs.writing.core` for data, prompts and the reward levels."""

    def __init__(self, variant: str = "tldr", source: str = "auto", data_files: str | None = None,
                 single_agent: bool = False, faithfulness: float = 0.0):
        if variant not in ("tldr", "arxiv"):
            raise TaskError(f"task.options.variant={variant!r}; choose 'tldr' or 'arxiv'")
        if source not in _SOURCES:   # checked here, not when the rows are first read, deep in a run
            raise TaskError(f"task.options.source={source!r}; choose one of {list(_SOURCES)}")
        if not isinstance(single_agent, bool):
            raise TaskError(f"task.options.single_agent={single_agent!r}: must be true or false")
        if isinstance(faithfulness, bool) or not isinstance(faithfulness, (int, float)) \
                or not math.isfinite(faithfulness) or faithfulness < 0:
            raise TaskError(f"task.options.faithfulness={faithfulness!r}: give the weight of the faithfulness term, "
                            "a number >= 0 (0, the default, is the paper's reward; e.g. 1.0)")
        self.faithfulness = float(faithfulness)
        self.variant, self.source, self.data_files = variant, source, data_files
        self.single_agent = single_agent
        self.name = f"writing-{variant}" + ("-single" if single_agent else "")
        self.roles = TLDR_AGENTS if variant == "tldr" else ARXIV_AGENTS
        self.agents = (WRITER,) if single_agent else self.roles
        # rollout.min_new_tokens null: no EOS before L1's word floor (a word takes at least one token in a tokenizer
        # that splits at spaces, so a shorter completion can never score)
        self.min_new_tokens = writing_min_words(variant)
        # algorithm.joint_mode null: cross, each text credited with its mean over the partner's K (docs/magrpo.md:
        # on the default job it gained more held-out reward than aligned on each of seeds 5-9)
        self.joint_mode = "cross"
        # rollout.top_p null: a nucleus of 0.9, within the top-p defaults of MAGRPO's reference trainer (0.6-0.9);
        # on the default job it gained more held-out reward than the whole vocabulary (docs/quickstart.md)
        self.top_p = 0.9

    def rows(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        rows = load_writing_rows(self.variant, split, source=self.source, limit=limit, seed=seed,
                                 data_files=self.data_files)
        if self.source == "auto" and rows and self.data_files is None:
            # pin the first choice: train and eval must come from one corpus, even if the hub
            # stops answering between the two calls
            self.source = rows[0]["source"]
        return rows

    def prompt(self, agent: str, row: dict[str, Any]) -> Messages:
        if not self.single_agent:
            return writing_prompt(agent, row, self.variant)
        if agent != WRITER:
            raise ValueError(f"unknown agent {agent!r}; the single-model writing task has one agent, {WRITER!r}")
        # the first role's message carries the text; the parts' instructions replace its instruction
        base = writing_prompt(self.roles[0], row, self.variant)[0]["content"]
        text = base[len(_INSTRUCTIONS[(self.variant, self.roles[0])]):].lstrip("\n")
        asks = [f"{r.capitalize()}: " + re.sub(r"\s*Reply with the \w+ only\.$", "",
                                                _INSTRUCTIONS[(self.variant, r)]) for r in self.roles]
        head = ("Write two parts for the text below, in one reply, each under its heading:\n" + "\n".join(asks)
                + f"\nAnswer in exactly this form:\n{self.roles[0].capitalize()}:\n<first part>\n\n"
                f"{self.roles[1].capitalize()}:\n<second part>")
        return [{"role": "user", "content": f"{head}\n\n{text}"}]

    def reward(self, *, prompts=None, completions: dict, agents: tuple[str, ...], **kwargs) -> list[float]:
        return [parts["total"] for parts in self.reward_components(prompts=prompts, completions=completions,
                                                                   agents=agents, **kwargs)]

    def reward_components(self, *, prompts=None, completions: dict, agents: tuple[str, ...],
                          **kwargs) -> list[dict[str, float]]:
        """Per joint action: the levels l1..l4, faithfulness, source_overlap and total (the team reward)."""
        if self.single_agent:
            parts = [split_parts(t, self.roles) for t in completions[WRITER]]
            completions = {r: [p[r] for p in parts] for r in self.roles}
            agents = self.roles
        if len(agents) != 2 or any(a not in completions for a in agents):
            raise KeyError(f"the writing task scores two agents' completions {self.roles}; got agents={tuple(agents)} "
                           f"and completions for {sorted(completions)}")
        first, second = completions[agents[0]], completions[agents[1]]
        sources = kwargs.get("text")
        if sources is None and not self.faithfulness:
            sources = [None] * len(first)   # the paper's reward never reads the source text
        if not isinstance(sources, (list, tuple)) or len(sources) != len(first) or len(second) != len(first):
            raise ValueError(f"the writing reward needs one completion per agent and, with task.options.faithfulness, "
                             f"the source text (column 'text') per joint action; got {len(first)} and {len(second)} "
                             f"completions and {len(sources) if isinstance(sources, (list, tuple)) else 'no'} texts")
        return [writing_reward_parts(_as_text(c1), _as_text(c2), None if src is None else str(src), self.variant,
                                     self.faithfulness)
                for c1, c2, src in zip(first, second, sources)]


@register_task("writing", "MAGRPO writing: a concise and a detailed summary of one text (tldr) or arXiv expansion")
def make_writing(variant: str = "tldr", source: str = "auto", data_files: str | None = None,
                 single_agent: bool = False, faithfulness: float = 0.0) -> WritingTask:
    """``single_agent``: MAGRPO's single-model baseline, one ``writer`` writes both parts in one completion.
    ``faithfulness``: weight of the lexical faithfulness term against the source text (0: the paper's reward)."""
    return WritingTask(variant=variant, source=source, data_files=data_files, single_agent=single_agent,
                       faithfulness=faithfulness)
