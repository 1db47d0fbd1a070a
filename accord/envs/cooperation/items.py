"""How the cooperation tasks read an agent's text: items carried by words, and hedge-proof scores.

A task names a few **letters** (its candidates or its cycle). A word *carries* the candidate letters
it contains (case-insensitive); a word that carries at least one is an **item**, *clean* when it
carries exactly one. An agent's text is read as the sequence of its items, in order; words that
carry no candidate are ignored, so a random text scores near 0 rather than always failing: the
scores below are dense enough for a tiny random model's policy gradient.

Every score lies in [-1, 1] and charges each item that is not what the score asks for as much as it
pays for one that is: naming every candidate equally often (a hedge, in one word or in several) scores
at most 0, no better than silence, and a mix of candidates never scores more in expectation than
naming the likeliest one alone (a score is linear in the mix).

A text is read up to its first :data:`SHOWN` characters, which is also all that a partner's view
shows of it: a score never reads what the partner could not see, and a very long reply costs no more
than a short one (never an error).
"""

from __future__ import annotations

SHOWN = 60   # characters of an agent's text that are read: scored, and shown to a partner


def shown(text: str) -> str:
    """The part of ``text`` that counts: its first :data:`SHOWN` characters."""
    return text[:SHOWN]


def items(text: str, letters: str) -> list[str]:
    """The candidate letters each item of ``text`` carries, in order: one string per item (``"b"`` for a
    clean item, ``"bp"`` for a word carrying both ``b`` and ``p``)."""
    out = []
    for word in shown(text).lower().split():
        carried = "".join(c for c in letters if c in word)
        if carried:
            out.append(carried)
    return out


def vote(found: list[str], target: str) -> float:
    """How cleanly the items name ``target``: (clean items of ``target`` - every other item) / items.

    1 exactly when every item names ``target`` alone; 0 without items; a text that names every
    candidate equally often (in one word or in several) scores at most 0."""
    if not found:
        return 0.0
    hits = sum(i == target for i in found)
    return (2 * hits - len(found)) / len(found)


def names(found: list[str], target: str) -> bool:
    """The items name ``target`` and nothing else (at least one item, every one clean and equal to it)."""
    return bool(found) and all(i == target for i in found)


def naming(found: list[str]) -> float:
    """Format only: how cleanly the items name *one* candidate, whichever it is (the best :func:`vote`
    over the candidates found). It reads no secret and no partner."""
    clean = {i for i in found if len(i) == 1}
    return max((vote(found, c) for c in clean), default=0.0 if not found else -1.0)


def walk(found: list[str], expected: list[str]) -> float:
    """How well the items follow ``expected`` position by position: (2 * matches - items) / max(items,
    len(expected)), where a match is a clean item equal to the expected letter at its position. 1
    exactly when the items are ``expected``; extra items, hedges and wrong letters each cost one match."""
    if not expected:
        raise ValueError("walk() needs at least one expected item")
    hits = sum(f == e for f, e in zip(found, expected))
    return (2 * hits - len(found)) / max(len(found), len(expected))
