"""Reading model text in time linear in its length: helpers for the tasks' parsers.

A model writes whatever text it likes, so a parser must not take time that grows faster than the text. A lazy
regular expression such as ``<think>.*?</think>`` rescans to the end of the text from every opening tag that no
closing tag follows (quadratic on a text of many opening tags); :func:`tag_spans` finds the same sections in one
pass over the text per tag.
"""

from __future__ import annotations

import re


def tag_spans(text: str, opening: str, closing: str) -> list[tuple[int, int, int, int]]:
    """The sections of ``text`` from an ``opening`` tag to the first ``closing`` tag after it (case-insensitive),
    scanning on after that closing tag, as ``re.finditer(opening + "(.*?)" + closing, text, re.S | re.I)`` finds
    them: per section (tag start, content start, content end, closing tag end)."""
    opens = [(m.start(), m.end()) for m in re.finditer(re.escape(opening), text, re.IGNORECASE)]
    closes = [(m.start(), m.end()) for m in re.finditer(re.escape(closing), text, re.IGNORECASE)]
    found, c, pos = [], 0, 0
    for start, end in opens:
        if start < pos:          # inside the section just taken
            continue
        while c < len(closes) and closes[c][0] < end:
            c += 1
        if c == len(closes):     # no closing tag after this opening tag, nor after any later one
            break
        found.append((start, end, closes[c][0], closes[c][1]))
        pos = closes[c][1]
    return found


def without_sections(text: str, opening: str, closing: str) -> str:
    """``text`` without its :func:`tag_spans` sections, tags included (``re.sub`` of the lazy pattern by "")."""
    kept, pos = [], 0
    for start, _, _, end in tag_spans(text, opening, closing):
        kept.append(text[pos:start])
        pos = end
    kept.append(text[pos:])
    return "".join(kept)
