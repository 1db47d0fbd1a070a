"""Plain data across the sandbox boundary, parent side: the strict decoder.

What a candidate hands back is text in the tagged JSON of :func:`accord.sandbox.child.encode`. It is
parsed here with :func:`json.loads` (which builds only dicts, lists, strings, numbers, booleans and
None: no code runs, whatever the text) and then rebuilt into exact builtin values -- ``None``, ``bool``,
``int``, ``float``, ``complex``, ``str``, ``bytes``, ``list``, ``tuple``, ``dict``, ``set`` and
``frozenset`` -- refusing anything else. Comparing such values never runs code of the candidate.

Inputs for the sandbox are sent the other way with :mod:`marshal` (the child can read it without
importing anything); marshal is never used to read what a sandbox wrote.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["MAX_TEXT", "PlainDataError", "decode"]

MAX_TEXT = 1 << 20  #: longest encoded value accepted, in characters
MAX_ITEMS = 200_000  #: most values (containers and scalars) in one decoded value
MAX_SAME_HASH = 64  #: most members of one set, frozenset or dict that may share one hash value
_MAX_DEPTH = 70
_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class PlainDataError(ValueError):
    """The text is not a value of the sandbox's plain-data encoding."""


def _reject_constant(name: str) -> Any:
    raise PlainDataError(f"bare {name} is not plain data (floats like it are tagged)")


def decode(text: str) -> Any:
    """The value encoded in ``text``; :class:`PlainDataError` when it is anything but plain data.

    Building a set or dict hashes its members, and members with equal hashes make that quadratic (ints
    ``k * (2**61 - 1)`` all hash to 0, and so do tuples built from them): a set, frozenset or dict with
    more than :data:`MAX_SAME_HASH` members of one hash value is refused before it is built, so that
    decoding stays linear in the text whatever a candidate writes.
    """
    if not isinstance(text, str):
        raise PlainDataError(f"expected text, got {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise PlainDataError(f"value longer than {MAX_TEXT} characters")
    try:
        raw = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, the int digit limit, deep nesting
        raise PlainDataError(f"not valid encoded data: {exc}") from None
    return _build(raw, 0, [0])


def _check_hashes(members: list) -> None:
    counts: dict[int, int] = {}
    for member in members:
        h = hash(member)  # hashes of plain values are ints below 2**61 - 1: distinct ones never collide here
        counts[h] = counts.get(h, 0) + 1
        if counts[h] > MAX_SAME_HASH:
            raise PlainDataError(f"more than {MAX_SAME_HASH} members of a set or dict share one hash value")


def _build(raw: Any, depth: int, count: list[int]) -> Any:
    if depth > _MAX_DEPTH:
        raise PlainDataError(f"nested deeper than {_MAX_DEPTH}")
    count[0] += 1
    if count[0] > MAX_ITEMS:
        raise PlainDataError(f"more than {MAX_ITEMS} values")
    kind = type(raw)
    if raw is None or kind in (bool, int, float, str):
        return raw
    if kind is list:
        return [_build(x, depth + 1, count) for x in raw]
    if kind is not dict or len(raw) != 1:
        raise PlainDataError("a JSON object must be one tagged value")
    (tag, body), = raw.items()
    if tag == "F":
        if body not in _FLOATS:
            raise PlainDataError(f"unknown float tag {body!r}")
        return _FLOATS[body]
    if tag == "b":
        if type(body) is not str:
            raise PlainDataError("bytes must be hex text")
        try:
            return bytes.fromhex(body)
        except ValueError as exc:
            raise PlainDataError(f"bytes: {exc}") from None
    if type(body) is not list:
        raise PlainDataError(f"tag {tag!r} needs a list")
    if tag == "c":
        if len(body) != 2 or not all(type(x) in (int, float) or type(x) is dict for x in body):
            raise PlainDataError("complex needs [real, imag]")
        real, imag = (_build(x, depth + 1, count) for x in body)
        if type(real) is not float or type(imag) is not float:
            raise PlainDataError("complex parts must be floats")
        return complex(real, imag)
    items = [_build(x, depth + 1, count) for x in body]
    try:
        if tag == "t":
            return tuple(items)
        if tag in ("s", "f"):
            _check_hashes(items)
            return set(items) if tag == "s" else frozenset(items)
        if tag == "d":
            if not all(type(p) is list and len(p) == 2 for p in items):
                raise PlainDataError("a dict needs [key, value] pairs")
            _check_hashes([k for k, _ in items])
            return {k: v for k, v in items}
    except TypeError as exc:  # an unhashable key or set member (a list, a dict)
        raise PlainDataError(f"tag {tag!r}: {exc}") from None
    raise PlainDataError(f"unknown tag {tag!r}")
