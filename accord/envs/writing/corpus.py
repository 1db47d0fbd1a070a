"""Offline English prose corpus built from the Python standard library.

The writing task (``accord.envs.writing.core``) needs a few hundred English passages
to summarise when the Hugging Face Hub cannot be reached.  CPython ships the
text of its language reference in ``pydoc_data.topics.topics`` (a dict from
topic name to a plain-text documentation page), so every Python install has a
corpus of technical English prose on disk.  This module turns those pages into
self-contained passages:

* pages are visited in sorted topic order and split at blank lines;
* blocks that look like code or grammar (``>>>`` prompts, ``::=`` productions,
  or fewer than 80% of tokens being ordinary words) are dropped, and so is any
  block ending in a colon or comma (it leads into a listing that was dropped);
* line-wrap hyphenation and list bullets are undone and whitespace collapsed;
* consecutive short prose blocks of one page are joined until a passage has at
  least ``MIN_WORDS`` words (never more than ``MAX_WORDS``); blocks longer than
  ``MAX_WORDS`` are cut at sentence ends into pieces of ``MIN_WORDS``+ words;
* exact duplicates are removed, first occurrence kept.

The result is deterministic for a given Python version (the pages change a
little between CPython releases), and about 500 passages on CPython 3.11.
"""

from __future__ import annotations

import functools
import re

__all__ = ["MIN_WORDS", "MAX_WORDS", "stdlib_passages"]

MIN_WORDS = 40
MAX_WORDS = 200

# Share of a block's tokens that must look like ordinary words for it to count
# as prose rather than code, tables or grammar.
_MIN_PROSE_FRACTION = 0.8

_BLOCK_SPLIT = re.compile(r"\n[ \t]*\n")
_WRAP_HYPHEN = re.compile(r"(\w)-\n[ \t]*(\w)")
_BULLET = re.compile(r"^\s*[*\-]\s+")
_PLAIN_WORD = re.compile(r"^[A-Za-z][A-Za-z'\-]*[.,;:!?)]*$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def _load_topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:  # stripped-down Python builds omit pydoc_data
        raise RuntimeError(
            "The offline writing corpus needs the standard-library module "
            "'pydoc_data.topics', which this Python build lacks. Install the full "
            "standard library (e.g. the distribution's python3 stdlib package), or "
            "pass data_files=<local JSON/JSONL file> to load_writing_rows."
        ) from exc
    return dict(topics)


def _prose_fraction(flat: str) -> float:
    tokens = flat.split()
    if not tokens:
        return 0.0
    plain = sum(1 for tok in tokens if _PLAIN_WORD.match(tok.strip("(\"'*“”")))
    return plain / len(tokens)


def _looks_like_code(block: str) -> bool:
    for line in block.splitlines():
        stripped = line.lstrip()
        if stripped.startswith((">>>", "...")) or "::=" in stripped:
            return True
    return False


def _flatten(block: str) -> str:
    block = _WRAP_HYPHEN.sub(r"\1-\2", block)
    block = _BULLET.sub("", block)
    return " ".join(block.split())


def _n_words(text: str) -> int:
    return len(text.split())


def _cut_long(flat: str) -> list[str]:
    """Cut an over-long block at sentence ends into pieces of MIN_WORDS+ words."""
    pieces: list[str] = []
    current: list[str] = []
    for sentence in _SENTENCE_END.split(flat):
        current.append(sentence)
        if _n_words(" ".join(current)) >= 2 * MIN_WORDS:
            pieces.append(" ".join(current))
            current = []
    tail = " ".join(current)
    if _n_words(tail) >= MIN_WORDS:
        pieces.append(tail)
    return [p for p in pieces if _n_words(p) <= MAX_WORDS]


def _page_passages(page: str) -> list[str]:
    passages: list[str] = []
    pending: list[str] = []
    for block in _BLOCK_SPLIT.split(page):
        flat = _flatten(block)
        n = _n_words(flat)
        if (
            n == 0
            or _looks_like_code(block)
            or flat.endswith((":", ","))
            or _prose_fraction(flat) < _MIN_PROSE_FRACTION
        ):
            pending = []  # never join across something that was dropped
            continue
        if n > MAX_WORDS:
            passages.extend(_cut_long(flat))
            pending = []
            continue
        pending.append(flat)
        if _n_words(" ".join(pending)) > MAX_WORDS:
            pending = [flat]
        joined = " ".join(pending)
        if _n_words(joined) >= MIN_WORDS:
            passages.append(joined)
            pending = []
    return passages


@functools.lru_cache(maxsize=1)
def _passages_cached() -> tuple[str, ...]:
    topics = _load_topics()
    seen: dict[str, None] = {}
    for name in sorted(topics):
        for passage in _page_passages(topics[name]):
            seen.setdefault(passage, None)
    return tuple(seen)


def stdlib_passages() -> list[str]:
    """Prose passages of MIN_WORDS..MAX_WORDS words from Python's bundled docs.

    Deterministic for a given Python version; see the module docstring for how
    passages are cut and filtered.
    """
    return list(_passages_cached())
