r"""Final answers in model text: extraction, normalisation and equivalence checking.

    from accord.envs.maths.answer import extract_answer, answers_equal, check_answer

    extract_answer(r"... so the result is \boxed{\dfrac{3}{4}}.")   # '\\dfrac{3}{4}'
    answers_equal("0.75", r"\frac34")                               # True
    check_answer(r"The answer is $\frac{131}{319}$.", "131/319", mode="reduced_fraction")

Nothing here executes model text: expressions are tokenised by our own regular expressions, parsed with
:func:`ast.parse` (which only builds a syntax tree), checked against a small whitelist of node types
and evaluated by our own walker over :class:`fractions.Fraction`, ``float`` and ``complex`` values.
No ``eval``, no ``sympify``, no ``parse_latex``.

Extraction (:func:`extract_answer`), first match wins
-----------------------------------------------------
1. the **last complete** ``\boxed{...}`` or ``\fbox{...}`` (nested braces and escaped ``\{ \}`` are
   matched; a truncated box with no closing brace is skipped in favour of an earlier complete one;
   ``\boxed 5`` also works);
2. GSM8K's ``#### 42`` (the last one);
3. the last ``final answer is ...`` / ``the answer is ...`` / ``Answer: ...`` (any case; Markdown bold
   and backticks dropped; the first ``$...$`` or ``\(...\)`` on the line if there is one, else the text
   up to the end of the sentence or a ``because``/``since``/``so``); the candidate must contain a digit
   or a LaTeX command or be at most two words, so "the answer is that we ..." is no answer.

No fallback to "the last number in the text": an output without any of these has no answer.
:func:`tool_answer` reads a program's stdout: its last non-empty line (through the same extraction if
that line carries a box or an answer marker, e.g. ``Answer: 42``).

Normalisation (:func:`normalize_answer`)
----------------------------------------
Unicode minus/times/division/root/pi/infinity/degree signs; ``$...$``, ``$$...$$``, ``\(...\)``,
``\[...\]`` wrappers; currency ``\$``; ``\text{}``, ``\textbf{}``, ``\mathrm{}``, ``\mbox{}``,
``\operatorname{}`` (content kept); ``\left``/``\right``/``\big`` sizing; spacing ``\, \; \: \! \quad``;
``\dfrac``/``\tfrac`` -> ``\frac``; degrees ``^\circ``, ``^{\circ}``, ``\degree``; ``\%``; trailing
punctuation; a leading ``x =`` / ``f(x) =`` (also in each item of ``a = 1, b = 2``); trailing unit words
(``5 cm``, ``12 square units``, ``5\text{ cm}^2``, ``10 dollars``: words of two or more letters after
a number, and any ``\text{...}`` of letters at the end after a number); thousands separators
(``1,234``, ``1{,}234``, ``1\,234``) when the whole answer is one such number -- a bare ``1,234`` is
one thousand two hundred thirty-four, not the list (1, 234); write ``1, 234`` for a list.

Equivalence (:func:`answers_equal`)
-----------------------------------
- **numbers**: integers, decimals, scientific notation, ``a/b``, ``\frac{a}{b}``, ``\frac34``, mixed
  numbers (``2\frac{1}{2}`` = 5/2 when that is the whole answer), signs. Exact rationals are compared
  exactly (``0.75 == 3/4``). **An integer matches only an integer**: when either side is an exact
  integer, the other must be that integer exactly -- or a double's rounding noise of it, within 4 ulps
  (``3.0000000000000004`` and ``\sin(\pi)`` pass for 3 and 0) -- so ``1000001 != 1000000``,
  ``123456789.5 != 123456790``, ``1.9999999999 != 2``, ``10000000000\cdot\pi/\pi != 10000000099`` and
  ``1e-13 != 0``. Otherwise values are compared with ``rel_tol`` (default 1e-8) and ``abs_tol``
  (1e-12), so a printed float (``0.30000000000000004``, ``1.4142135623730951``) matches ``3/10`` or
  ``\sqrt{2}``, but a rounded decimal (``0.333``, ``3.1416``) does not match ``1/3`` or ``\pi``.
- **expressions**: ``+ - * / ^ **``, braces and parentheses, implicit multiplication (``2\sqrt3``,
  ``3x``, ``2\pi``, ``(x+1)(x-1)``), ``\sqrt{}``, ``\sqrt[n]{}``, ``\pi``, ``\infty``, ``\cdot``,
  ``\times``, ``\div``, ``\sin \cos \tan \ln \log \exp`` applied to a parenthesised or braced argument
  (``\log`` is the natural logarithm). Constant expressions are evaluated (exactly while the operations
  stay rational: ``\sqrt{9/4} == 3/2``, ``2^{10} == 1024``); expressions with variables (single letters)
  are compared by evaluating both sides at three fixed points (numeric identity testing:
  ``(x+1)^2 == x^2+2x+1``). ``e`` and ``i`` are ordinary variables. Adjacent letters are a word, not
  a product (``xy`` and ``Monday`` are compared as strings); ``^`` followed by digits takes all of
  them (``2^10`` is 1024, the plain-text habit, not LaTeX's ``2^1 0``).
- **percentages**: ``50\%`` equals ``50`` and ``0.5``.
- **degrees**: ``60^\circ`` equals ``60`` (and not ``\pi/3``).
- **tuples and intervals**: ``(1, 2)``, ``[1, 3)``, ``(-\infty, 2]``, ``\left( 1, 2 \right)``: same
  brackets, same length, items equal in order; unions ``A \cup B`` in order.
- **sets and bare lists**: ``\{1, 2\}`` and ``1, 2`` are compared as multisets (order-free); a
  one-element set equals its element.
- **anything else** (words): whitespace-free, case-insensitive string equality after normalisation.
  A multiple-choice letter is a single letter, so a variable: ``(C)``, ``\text{(C)}`` and ``C`` are the same
  letter, ``c`` is another.

Safety limits (every check of model text is bounded here; :mod:`.timebox` adds a hard deadline on top):
answers longer than 400 characters are compared as strings; numbers longer than 200 characters or with
a decimal exponent beyond +-1000 (``1e-999999999``) are not parsed as numbers (compared as strings);
at most 6 powers per expression; every exact value, intermediate results included, stays under
20,000 bits (numerator plus denominator), larger ones continue in floating point (overflow -> the
expression is not a value and is compared as a string), so ``9^{9^{9^9}}`` returns at once; at most
32 boxes and 32 answer markers are tried, reading 1,600 characters after a marker; the regular
expressions cannot backtrack exponentially. Any string is handled without an exception (a trailing
backslash, ``5\`` or ``\boxed{5\ }``, is dropped).

Not handled: numbers in words ("forty-two"), ``\pm``, inequalities and relations (``x < 3``,
``x \in [1, 2]``), absolute values ``|x|``, factorials, ``\binom``, matrices, subscripted variables,
``\log_b``, functions applied without brackets (``\sin x``), units written as single letters
(``5 m``), complex numbers as such (``i`` is a variable, so ``i^2 != -1``), equations other than a
leading single-variable assignment, and decimal approximations of irrational answers (by design).
"""

from __future__ import annotations

import ast
import cmath
import functools
import math
import re
from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "CHECK_MODES",
    "MAX_ANSWER_CHARS",
    "answers_equal",
    "check_answer",
    "extract_answer",
    "extract_boxed",
    "is_reduced_fraction",
    "normalize_answer",
    "tool_answer",
]

MAX_ANSWER_CHARS = 400      # longer answers are compared as strings only
_MAX_NUMBER_CHARS = 200     # longer digit strings are not parsed as numbers
_MAX_POWERS = 6             # more ** in one expression: not evaluated
_MAX_EXPONENT = 1000        # |decimal exponent| of a number literal (1e-999999999 would build 10**999999999)
_MAX_BOXES = 32             # boxes and answer markers tried, from the last one back (bounds the work on hostile text)
_MAX_MARKER_CHARS = 4 * MAX_ANSWER_CHARS  # text read after an answer marker
_MAX_EXACT_BITS = 20_000    # exact values beyond this size (numerator + denominator bits) fall back to floats
REL_TOL, ABS_TOL = 1e-8, 1e-12
CHECK_MODES = ("math", "reduced_fraction")

Number = Fraction | float | complex

# ---------------------------------------------------------------------------------------------------
# extraction
# ---------------------------------------------------------------------------------------------------

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_GSM = re.compile(r"####[ \t]*([^\n]+)")
_MARKER = re.compile(r"(?i)(?:final\s+answer|the\s+answer|answer)\s*(?:is\b|:|=)\s*:?[ \t]*([^\n]*)")
_DOLLAR_MATH = re.compile(r"\$\$?(.+?)\$\$?")
_PAREN_MATH = re.compile(r"\\\((.+?)\\\)")
# a run of blanks is tried from its first blank only (from every blank, a long run not followed by one of the
# words cost time quadratic in its length)
_SENTENCE_END = re.compile(r"(?<!\d)\.(?!\d)|;|(?<!\s)\s+(?:because|since|so|as|which|where)\b"
                           r"|,\s+(?:since|because|so|which)\b")


def _group(text: str, i: int, end: int | None = None) -> tuple[str, int] | None:
    """``text[i]`` is ``{``: its content and the index after the matching ``}``, or None if unbalanced before
    ``end`` (default: the text's end). A backslash escapes the next character (``\\{`` and ``\\}`` do not count)."""
    depth, j, end = 0, i, len(text) if end is None else end
    while j < end:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j], j + 1
        j += 1
    return None


def extract_boxed(text: str) -> str | None:
    r"""The content of the last complete ``\boxed{...}`` / ``\fbox{...}`` in ``text`` (None if none)."""
    if not isinstance(text, str):
        return None
    # an earlier box still open where a later, never-closed box opens never closes either (the later one's
    # braces never balance): its scan stops there, so unclosed boxes do not each scan to the text's end
    limit = len(text)
    for m in list(_BOX.finditer(text))[::-1][:_MAX_BOXES]:
        i = m.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            found = _group(text, i, limit)
            if found is None:
                limit = min(limit, i)
                continue  # truncated box: an earlier complete one may still be the answer
            content = found[0].strip()
        else:
            bare = re.match(r"[^\s$]+", text[i:]) if i > m.end() else None
            content = bare.group(0) if bare else ""
        if content:
            return content
    return None


def _looks_like_answer(s: str) -> bool:
    return bool(s) and (any(c.isdigit() for c in s) or "\\" in s or len(s.split()) <= 2)


def _inline_math(s: str) -> str | None:
    r"""The first ``$...$`` / ``$$...$$`` / ``\(...\)`` content of a line (no newline in ``s``), as the pattern
    ``\$\$?(.+?)\$\$?|\\\((.+?)\\\)`` finds it, in linear time: the lazy ``\(`` scan starts at the first ``\(``
    only (if no ``\)`` follows that one, none follows a later one)."""
    dollar = _DOLLAR_MATH.search(s)
    start = s.find("\\(")
    paren = _PAREN_MATH.match(s, start) if start >= 0 else None
    found = [m for m in (dollar, paren) if m is not None]
    return min(found, key=lambda m: m.start()).group(1) if found else None


def _clean_marker(s: str) -> str | None:
    s = s.replace("**", "").replace("`", "").strip()
    math = _inline_math(s)
    if math is not None:
        s = math.strip()
    else:
        s = _SENTENCE_END.split(s, maxsplit=1)[0]
    s = s.strip().rstrip(".,;:!").strip()
    return s if _looks_like_answer(s) else None


def extract_answer(text: str) -> str | None:
    """The final answer written in ``text`` (see the module docstring for the rules), or None."""
    if not isinstance(text, str) or not text.strip():
        return None
    boxed = extract_boxed(text)
    if boxed:
        return boxed[:MAX_ANSWER_CHARS]
    hits = _GSM.findall(text)
    if hits:
        found = _clean_marker(hits[-1][:_MAX_MARKER_CHARS])
        if found:
            return found[:MAX_ANSWER_CHARS]
    for m in list(_MARKER.finditer(text))[::-1][:_MAX_BOXES]:
        found = _clean_marker(m.group(1)[:_MAX_MARKER_CHARS])
        if found:
            return found[:MAX_ANSWER_CHARS]
    return None


def tool_answer(stdout: str) -> str | None:
    """A program's answer: the last non-empty line it printed (None when it printed nothing)."""
    if not isinstance(stdout, str):
        return None
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        return None
    last = lines[-1][:MAX_ANSWER_CHARS]
    return extract_answer(last) or last


# ---------------------------------------------------------------------------------------------------
# normalisation
# ---------------------------------------------------------------------------------------------------

_UNICODE = {"\u2212": "-", "\u2013": "-", "\u2014": "-", "\u00d7": "*", "\u00b7": "*", "\u22c5": "*",
            "\u00f7": "/", "\u221a": "\\sqrt", "\u03c0": "\\pi", "\u221e": "\\infty", "\u00b0": "^\\circ",
            "\uff05": "%", "\u00a0": " ", "\u2009": " ", "\u202f": " ", "\u200b": ""}
_TEXT_CMDS = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|textup|mathrm|mathbf|mathit|mbox|"
                        r"operatorname|hbox)\s*(?=\{)")
_TEXT_UNIT_TAIL = re.compile(r"^(.*?[0-9}%])\s*\\(?:text|textrm|mathrm|mbox|textnormal)\s*\{\s*[A-Za-z][A-Za-z .]*\}"
                             r"\s*(?:\^\s*\{?\s*\d\s*\}?)?\s*$", re.S)
_SIZING = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|big|Big|bigg|Bigg)(?![A-Za-z])\s*\.?")
_SPACING = re.compile(r"\\(?:quad|qquad|displaystyle|textstyle|scriptstyle|mathstrut|nonumber|limits)(?![A-Za-z])"
                      r"|\\[;: ]")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![A-Za-z])|\\circ(?![A-Za-z])|\\degree(?![A-Za-z])")
_LHS = re.compile(r"^\s*(?:[A-Za-z]|[A-Za-z]\s*\(\s*[A-Za-z]\s*\)|\\[A-Za-z]+)\s*=\s*(?!=)(.+)$", re.S)
# Every alternative after \s+ starts with a non-space, and a closing brace is taken only when present, so
# the spaces between two unit words can be split only one way (no exponential backtracking).
# (the blanks before an exponent's brace belong to the brace: two optional runs of blanks side by side, repeated
# under the "+", made a failing match try 2^n ways: 2.7 s for an 83-character answer)
_UNIT_WORDS = re.compile(r"^(.*?[0-9)\]}%])((?:\s+(?:[A-Za-z]{2,}\.?|\^\s*(?:\{\s*)?\d+(?:\s*\})?|/))+)\s*$", re.S)
_MATH_WORDS = {"sqrt", "pi", "infty", "sin", "cos", "tan", "ln", "log", "exp", "cup", "cap", "frac", "oo"}
_TRAILING_BACKSLASHES = re.compile(r"(?:\\\s*)+$")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?%?")


def _unwrap_math(s: str) -> str:
    while True:
        s = s.strip()
        for left, right in (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$")):
            if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left):-len(right)]
                break
        else:
            return s


def _replace_text_commands(s: str) -> str:
    out, i = [], 0
    for m in _TEXT_CMDS.finditer(s):
        if m.start() < i:
            continue
        found = _group(s, m.end())
        if found is None:
            continue
        out.append(s[i:m.start()])
        out.append(" " + found[0] + " ")
        i = found[1]
    out.append(s[i:])
    return "".join(out)


def _strip_lhs(s: str) -> str:
    m = _LHS.match(s)
    if m and "=" not in m.group(1):
        return m.group(1).strip()
    parts = _split_top(s, ",")
    if len(parts) > 1:
        stripped = [_LHS.match(p) for p in parts]
        if all(x and "=" not in x.group(1) for x in stripped):
            return ", ".join(x.group(1).strip() for x in stripped)
    return s


def _strip_units(s: str) -> str:
    m = _TEXT_UNIT_TAIL.match(s)
    if m:
        return m.group(1).strip()
    m = _UNIT_WORDS.match(s)
    if m:
        words = [w.strip(".^{} 0123456789").lower() for w in m.group(2).split()]
        if any(w for w in words) and not any(w in _MATH_WORDS for w in words):
            return m.group(1).strip()
    return s


def normalize_answer(s: str) -> str:
    """A canonical LaTeX-light form of an answer string (see the module docstring); '' for None."""
    if not isinstance(s, str):
        return ""
    s = s.strip()[:MAX_ANSWER_CHARS]
    for k, v in _UNICODE.items():
        s = s.replace(k, v)
    s = _unwrap_math(s)
    s = s.replace("\\$", " ").replace("$", " ").replace("`", "")
    s = _strip_units(s.strip())              # \text{ cm} tails first, while the \text is still visible
    s = _replace_text_commands(s)
    s = re.sub(r"\\left\s*\.|\\right\s*\.", "", s)
    s = _SIZING.sub("", s)
    s = s.replace("\\,", "").replace("\\!", "").replace("{,}", "")
    s = _SPACING.sub(" ", s)
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    s = s.replace("\\lbrace", "\\{").replace("\\rbrace", "\\}")
    s = _DEGREES.sub("", s)
    s = s.replace("\\%", "%")
    s = _TRAILING_BACKSLASHES.sub("", s)     # what is left of a spacing command cut by a strip: 5\ -> 5\
    s = re.sub(r"\s+", " ", s).strip().rstrip(".,;:!?").strip()
    s = _strip_lhs(s)
    s = _strip_units(s)
    if _THOUSANDS.fullmatch(s):
        return s.replace(",", "")
    s = re.sub(r"([(\[])\s+", r"\1", s)
    s = re.sub(r"\s+([)\]])", r"\1", s)
    return re.sub(r"\s*,\s*", ", ", s)


# ---------------------------------------------------------------------------------------------------
# structure: sets, tuples, intervals
# ---------------------------------------------------------------------------------------------------

_OPEN, _CLOSE = "([{", ")]}"


def _split_top(s: str, sep: str) -> list[str]:
    """``s`` split on ``sep`` outside any bracket (round, square or curly, escaped or not)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(s[start:])
    return [p.strip() for p in parts]


def _encloses(s: str) -> bool:
    """The first character's bracket closes at the last character (``(1,2)`` yes, ``(1)(2)`` no)."""
    depth = 0
    for i, c in enumerate(s):
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth == 0 and i != len(s) - 1:
                return False
    return depth == 0


def _balanced(s: str) -> bool:
    depth = 0
    for c in s:
        depth += (c in _OPEN) - (c in _CLOSE)
        if depth < 0:
            return False
    return depth == 0


# ---------------------------------------------------------------------------------------------------
# expressions: LaTeX -> a Python-syntax string -> a whitelisted syntax tree -> values
# ---------------------------------------------------------------------------------------------------

_FUNCS = {"sqrt": 1, "root": 2, "sin": 1, "cos": 1, "tan": 1, "log": 1, "ln": 1, "exp": 1}
_CONSTS = {"pi", "oo"}
_COMMANDS = {"cdot": "*", "times": "*", "ast": "*", "div": "/", "pi": " pi ", "infty": " oo ", "infinity": " oo ",
             "sin": " sin ", "cos": " cos ", "tan": " tan ", "ln": " ln ", "log": " log ", "exp": " exp "}
_PLAIN = set("0123456789.+-*/(), ") | set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class _NotMath(ValueError):
    """The text is not an expression this module evaluates."""


def _latex_arg(s: str, i: int) -> tuple[str, int]:
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        raise _NotMath("missing argument")
    if s[i] == "{":
        found = _group(s, i)
        if found is None:
            raise _NotMath("unbalanced braces")
        return _latex_to_py(found[0]), found[1]
    if s[i] == "\\":
        m = re.match(r"\\[A-Za-z]+", s[i:])
        if not m:
            raise _NotMath("bad command argument")
        return _latex_to_py(m.group(0)), i + len(m.group(0))
    if s[i] == "-" and i + 1 < len(s) and s[i + 1].isalnum():
        return "-" + s[i + 1], i + 2
    if s[i].isalnum():
        return s[i], i + 1
    raise _NotMath(f"bad argument {s[i]!r}")


_COMMAND = re.compile(r"\\([A-Za-z]+|.)", re.S)


def _latex_to_py(s: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            m = _COMMAND.match(s, i)
            if m is None:  # a backslash at the very end: ``5\``
                raise _NotMath("a lone backslash")
            name = m.group(1)
            i += len(m.group(0))
            if name == "frac":
                a, i = _latex_arg(s, i)
                b, i = _latex_arg(s, i)
                out.append(f"(({a})/({b}))")
            elif name == "sqrt":
                while i < len(s) and s[i] == " ":
                    i += 1
                index = None
                if i < len(s) and s[i] == "[":
                    end = s.find("]", i)
                    if end < 0:
                        raise _NotMath("unclosed root index")
                    index = _latex_to_py(s[i + 1:end])
                    i = end + 1
                a, i = _latex_arg(s, i)
                out.append(f" sqrt({a})" if index is None else f" root({a},{index})")
            elif name in _COMMANDS:
                out.append(_COMMANDS[name])
            else:
                raise _NotMath(f"unsupported command \\{name}")
        elif c == "{":
            found = _group(s, i)
            if found is None:
                raise _NotMath("unbalanced braces")
            out.append("(" + _latex_to_py(found[0]) + ")")
            i = found[1]
        elif c == "^":
            if s.startswith("^^", i):
                raise _NotMath("double power")
            digits = re.match(r"\s*(-?\d+)", s[i + 1:])
            if digits:  # 2^10 is 1024 (plain-text habit), not LaTeX's 2^1 followed by 0
                a, i = digits.group(1), i + 1 + len(digits.group(0))
            else:
                a, i = _latex_arg(s, i + 1)
            out.append(f"**({a})")
        elif c in "[]":
            out.append("(" if c == "[" else ")")
            i += 1
        elif c in _PLAIN:
            out.append(c)
            i += 1
        else:
            raise _NotMath(f"unsupported character {c!r}")
    return "".join(out)


_TOKEN = re.compile(r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)|"
                    r"(?P<name>sqrt|root|sin|cos|tan|log|ln|exp|pi|oo|[A-Za-z])|(?P<op>\*\*|[-+*/(),]))")


def _tokens_to_python(expr: str) -> tuple[str, tuple[Fraction, ...]]:
    """Insert implicit multiplications and replace number literals by ``_nK`` placeholders (exact values)."""
    for word in re.findall(r"[A-Za-z]{2,}", expr):
        if word not in _FUNCS and word not in _CONSTS:
            raise _NotMath(f"{word!r} is a word, not a product of variables")
    out: list[str] = []
    nums: list[Fraction] = []
    prev = None  # kind of the previous token: 'value' (number, variable, constant, ')'), 'func', 'op', '('
    pos = 0
    expr = expr.rstrip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise _NotMath(f"cannot read {expr[pos:pos + 10]!r}")
        pos = m.end()
        if m.group("num") is not None:
            text = m.group("num")
            if len(text) > _MAX_NUMBER_CHARS:
                raise _NotMath("number too long")
            if prev == "num":
                raise _NotMath("two numbers in a row")
            if prev in ("value",):
                out.append("*")
            if prev == "func":
                raise _NotMath("function without brackets")
            out.append(f"_n{len(nums)}")
            nums.append(_fraction(text))
            prev = "num"
        elif m.group("name") is not None:
            name = m.group("name")
            if prev in ("value", "num"):
                out.append("*")
            if prev == "func":
                raise _NotMath("function without brackets")
            out.append(name)
            prev = "func" if name in _FUNCS else "value"
        else:
            op = m.group("op")
            if op == "(":
                if prev in ("value", "num"):
                    out.append("*")
                prev = "("
            elif op == ")":
                prev = "value"
            else:
                if prev == "func":
                    raise _NotMath("function without brackets")
                prev = "op"
            out.append(op)
    return " ".join(out), tuple(nums)


_ALLOWED_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Name, ast.Call, ast.Load, ast.Add, ast.Sub,
                  ast.Mult, ast.Div, ast.Pow, ast.USub, ast.UAdd, ast.Tuple)


def _compile(py: str) -> ast.Expression:
    try:
        tree = ast.parse(py, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise _NotMath(f"not an expression: {err}") from err
    powers = 0
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise _NotMath(f"{type(node).__name__} is not allowed")
        if isinstance(node, ast.Tuple) and node is tree.body:
            raise _NotMath("a tuple is not a scalar")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            powers += 1
        if isinstance(node, ast.Call) and (not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS
                                           or node.keywords or len(node.args) != _FUNCS[node.func.id]):
            raise _NotMath("unsupported call")
        if isinstance(node, ast.Name) and node.id in _FUNCS and not _is_call_target(tree, node):
            raise _NotMath("function used as a value")
    if powers > _MAX_POWERS:
        raise _NotMath("too many powers")
    if any(isinstance(n, ast.Tuple) for n in ast.walk(tree)):
        raise _NotMath("commas inside an expression")
    return tree


def _is_call_target(tree: ast.AST, name: ast.Name) -> bool:
    return any(isinstance(n, ast.Call) and n.func is name for n in ast.walk(tree))


def _exact_root(x: Fraction, n: int) -> Fraction | None:
    if x < 0 or n < 1 or n > 64:
        return None
    num, den = x.numerator, x.denominator
    if num.bit_length() > 4096 or den.bit_length() > 4096:
        return None
    rn, rd = _int_root(num, n), _int_root(den, n)
    if rn is None or rd is None:
        return None
    return Fraction(rn, rd)


def _int_root(v: int, n: int) -> int | None:
    if v in (0, 1):
        return v
    r = round(v ** (1.0 / n)) if v.bit_length() < 1000 else None
    if r is None:
        return None
    for cand in (r - 1, r, r + 1):
        if cand >= 0 and cand ** n == v:
            return cand
    return None


def _bounded(x: Number) -> Number:
    """``x``, or its float when it is an exact value of more than ``_MAX_EXACT_BITS`` bits: every operand
    of exact arithmetic stays small, so no operation on exact values can take long (a float that
    overflows raises ``OverflowError``: the expression is then not a value)."""
    if isinstance(x, Fraction) and x.numerator.bit_length() + x.denominator.bit_length() > _MAX_EXACT_BITS:
        return float(x)
    return x


def _real_or_complex(x: Number) -> Number:
    if isinstance(x, Fraction):
        return float(x)
    return x


def _pow(a: Number, b: Number) -> Number:
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        if b.denominator == 1:
            e = b.numerator
            size = (a.numerator.bit_length() + a.denominator.bit_length()) * abs(e)
            if size <= _MAX_EXACT_BITS:
                if a == 0 and e < 0:
                    raise ZeroDivisionError("0 to a negative power")
                return a ** e
        elif a >= 0 and b.denominator <= 64 and abs(b.numerator) <= 64:
            r = _exact_root(a, b.denominator)
            if r is not None:
                return _pow(r, Fraction(b.numerator))
    fa, fb = _real_or_complex(a), _real_or_complex(b)
    if isinstance(fa, float) and isinstance(fb, float) and fa < 0 and not fb.is_integer():
        fa = complex(fa)
    result = fa ** fb
    if isinstance(result, float) and math.isinf(result) and not (math.isinf(fa) or math.isinf(fb)):
        raise OverflowError("power overflow")
    return result


def _call(name: str, args: list[Number]) -> Number:
    x = args[0]
    if name == "sqrt":
        if isinstance(x, Fraction):
            exact = _exact_root(x, 2)
            if exact is not None:
                return exact
        x = _real_or_complex(x)
        return math.sqrt(x) if isinstance(x, float) and x >= 0 else cmath.sqrt(x)
    if name == "root":
        n = args[1]
        if not (isinstance(n, Fraction) and n.denominator == 1 and 1 <= n <= 64):
            raise ValueError("root index must be a small positive integer")
        k = int(n)
        if isinstance(x, Fraction):
            exact = _exact_root(abs(x), k)
            if exact is not None and (x >= 0 or k % 2 == 1):
                return exact if x >= 0 else -exact
        fx = _real_or_complex(x)
        if isinstance(fx, float):
            if fx >= 0:
                return fx ** (1.0 / k)
            if k % 2 == 1:
                return -((-fx) ** (1.0 / k))
        return complex(fx) ** (1.0 / k)
    fx = _real_or_complex(x)
    real = isinstance(fx, float)
    if name in ("log", "ln"):
        if real and fx > 0:
            return math.log(fx)
        return cmath.log(fx)
    fn = {"sin": (math.sin, cmath.sin), "cos": (math.cos, cmath.cos), "tan": (math.tan, cmath.tan),
          "exp": (math.exp, cmath.exp)}[name]
    return fn[0](fx) if real else fn[1](fx)


def _evaluate(node: ast.AST, nums: tuple[Fraction, ...], env: dict[str, float]) -> Number:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, nums, env)
    if isinstance(node, ast.Name):
        if node.id.startswith("_n"):
            return nums[int(node.id[2:])]
        if node.id == "pi":
            return math.pi
        if node.id == "oo":
            return math.inf
        return env[node.id]
    if isinstance(node, ast.UnaryOp):
        v = _evaluate(node.operand, nums, env)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a = _evaluate(node.left, nums, env)
        b = _evaluate(node.right, nums, env)
        if isinstance(node.op, ast.Add):
            return _bounded(a + b)
        if isinstance(node.op, ast.Sub):
            return _bounded(a - b)
        if isinstance(node.op, ast.Mult):
            return _bounded(a * b)
        if isinstance(node.op, ast.Div):
            return _bounded(a / b)
        return _bounded(_pow(a, b))
    if isinstance(node, ast.Call):
        return _bounded(_call(node.func.id, [_evaluate(arg, nums, env) for arg in node.args]))
    raise _NotMath(f"unexpected node {type(node).__name__}")


def _variables(tree: ast.AST) -> frozenset[str]:
    return frozenset(n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not n.id.startswith("_n")
                     and n.id not in _CONSTS and n.id not in _FUNCS)


_BASES = (0.6180339887, 1.4142135623, -0.5772156649)


def _point(p: int, names: frozenset[str]) -> dict[str, float]:
    """Assignment ``p`` of the variables of both sides (``names``): irrational-looking values, the same for both
    sides and distinct for distinct names (each value follows the name's rank among ``names``, so two letters never
    share one, as ``x`` and ``C`` did when the value followed the letter's code)."""
    return {v: _BASES[p] * (1.0 + 0.1371 * math.sqrt(2 + rank)) + 0.0731 * p for rank, v in enumerate(sorted(names))}


# ---------------------------------------------------------------------------------------------------
# parsed answers
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scalar:
    text: str                          # canonical string form (fallback comparison)
    tree: ast.Expression | None        # None: not an expression we evaluate
    nums: tuple[Fraction, ...] = ()
    names: frozenset[str] = frozenset()
    percent: bool = False

    def values(self, point: dict[str, float]) -> Number | None:
        if self.tree is None:
            return None
        try:
            v = _evaluate(self.tree, self.nums, point)
        except (ArithmeticError, ValueError, KeyError, TypeError, _NotMath):
            return None
        if isinstance(v, complex):
            if cmath.isnan(v):
                return None
            if abs(v.imag) <= ABS_TOL * max(1.0, abs(v.real)):
                v = v.real
        if isinstance(v, float) and math.isnan(v):
            return None
        return v


@dataclass(frozen=True)
class _Seq:
    brackets: str                      # "()", "[)", ... or "cup" for unions
    items: tuple


@dataclass(frozen=True)
class _Bag:
    items: tuple                       # order-free (sets and bare comma lists)


def _string_key(s: str) -> str:
    key = re.sub(r"\s+", "", s).lower().replace("\\{", "{").replace("\\}", "}")
    m = re.fullmatch(r"\(?([a-z])\)?", key)
    return m.group(1) if m else key


def _fraction(text: str) -> Fraction:
    """The exact value of a number literal, refusing exponents whose exact value would be huge to build."""
    mantissa, _, exponent = text.lower().partition("e")
    if exponent and abs(int(exponent)) > _MAX_EXPONENT:
        raise _NotMath(f"exponent {exponent} out of range")
    if len(mantissa) > _MAX_NUMBER_CHARS:
        raise _NotMath("number too long")
    return Fraction(text)


_MIXED = re.compile(r"([-+]?)(\d+)\s*\\frac\s*(?:\{\s*(\d+)\s*\}|(\d))\s*(?:\{\s*(\d+)\s*\}|(\d))")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _scalar(s: str) -> _Scalar:
    percent = s.endswith("%")
    if percent:
        s = s[:-1].strip()
    text = _string_key(s)
    compact = s.replace(" ", "")
    if len(compact) <= _MAX_NUMBER_CHARS and _NUMBER.fullmatch(compact):
        tree = ast.Expression(body=ast.Name(id="_n0", ctx=ast.Load()))
        try:
            return _Scalar(text, tree, (_fraction(compact),), frozenset(), percent)
        except (ValueError, ZeroDivisionError):  # _NotMath included
            return _Scalar(text, None, percent=percent)
    m = _MIXED.fullmatch(compact)
    if m:
        whole, num, den = int(m.group(2)), int(m.group(3) or m.group(4)), int(m.group(5) or m.group(6))
        if den and num < den:
            value = whole + Fraction(num, den)
            tree = ast.Expression(body=ast.Name(id="_n0", ctx=ast.Load()))
            return _Scalar(text, tree, (-value if m.group(1) == "-" else value,), frozenset(), percent)
    try:
        py, nums = _tokens_to_python(_latex_to_py(s))
        tree = _compile(py)
    except (_NotMath, ValueError, ZeroDivisionError):
        return _Scalar(text, None, percent=percent)
    return _Scalar(text, tree, nums, _variables(tree), percent)


@functools.lru_cache(maxsize=8192)
def _parse(s: str, depth: int = 0) -> _Scalar | _Seq | _Bag | None:
    s = s.strip()
    if not s:
        return None
    if len(s) > MAX_ANSWER_CHARS or depth > 4:
        return _Scalar(_string_key(s), None)
    parts = _split_top(s, "\\cup")
    if len(parts) > 1:
        items = tuple(_parse(p, depth + 1) for p in parts)
        return None if None in items else _Seq("cup", items)
    if s.startswith("\\{") and s.endswith("\\}") and _balanced(s[2:-2]):
        items = tuple(_parse(p, depth + 1) for p in _split_top(s[2:-2], ","))
        return None if None in items else _Bag(items)
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _encloses(s):
        inner = _split_top(s[1:-1], ",")
        if len(inner) > 1:
            items = tuple(_parse(p, depth + 1) for p in inner)
            return None if None in items else _Seq(s[0] + s[-1], items)
    parts = _split_top(s, ",")
    if len(parts) > 1:
        items = tuple(_parse(p, depth + 1) for p in parts)
        return None if None in items else _Bag(items)
    return _scalar(s)


_FLOAT_NOISE_ULPS = 4


def _matches_integer(n: Fraction, v: Number) -> bool:
    """Whether ``v`` denotes the integer ``n``: exactly, or as a double's rounding noise of it
    (``3.0000000000000004``: within a few ulps of ``n`` and nearer to ``n`` than to any other integer).
    Tolerances meant for irrational values never apply: ``123456789.5`` is not 123456790, nor is a
    float expression whose value lands 99 away from 10000000099."""
    if isinstance(v, complex):
        return False  # a complex with a negligible imaginary part was made real by _Scalar.values
    if isinstance(v, float):
        if not math.isfinite(v):
            return False
        v = Fraction(v)
    if v == n:
        return True
    gap = abs(v - n)
    noise = Fraction(math.ulp(max(abs(float(n)), 1.0))) * _FLOAT_NOISE_ULPS if abs(n) < 2 ** 1000 else Fraction(0)
    return gap < Fraction(1, 2) and gap <= noise


def _close(a: Number, b: Number, rel_tol: float, abs_tol: float) -> bool:
    if isinstance(a, Fraction) and a.denominator == 1:
        return _matches_integer(a, b)
    if isinstance(b, Fraction) and b.denominator == 1:
        return _matches_integer(b, a)
    if isinstance(a, Fraction) and isinstance(b, Fraction) and a == b:
        return True
    try:
        ca, cb = complex(a), complex(b)
    except OverflowError:
        return False
    if any(math.isinf(x) for x in (ca.real, ca.imag, cb.real, cb.imag)):
        return ca == cb
    return abs(ca - cb) <= max(rel_tol * max(abs(ca), abs(cb)), abs_tol)


def _scalars_equal(a: _Scalar, b: _Scalar, rel_tol: float, abs_tol: float) -> bool:
    if a.tree is None or b.tree is None:
        return a.text == b.text and a.percent == b.percent
    names = a.names | b.names
    points = [_point(p, names) for p in range(len(_BASES))] if names else [{}]
    scales = [(Fraction(1), Fraction(1))]
    if a.percent != b.percent:
        scales.append((Fraction(1, 100), Fraction(1)) if a.percent else (Fraction(1), Fraction(1, 100)))
    for sa, sb in scales:
        checked, ok = 0, True
        for point in points:
            va, vb = a.values(point), b.values(point)
            if va is None or vb is None:
                continue
            checked += 1
            if not _close(va * sa, vb * sb, rel_tol, abs_tol):
                ok = False
                break
        if checked and ok:
            return True
    if not any(a.values(p) is not None and b.values(p) is not None for p in points):
        return a.text == b.text and a.percent == b.percent
    return False


def _equal(a, b, rel_tol: float, abs_tol: float) -> bool:
    if isinstance(a, _Bag) and len(a.items) == 1 and not isinstance(b, _Bag):
        a = a.items[0]
    if isinstance(b, _Bag) and len(b.items) == 1 and not isinstance(a, _Bag):
        b = b.items[0]
    if type(a) is not type(b):
        return False
    if isinstance(a, _Scalar):
        return _scalars_equal(a, b, rel_tol, abs_tol)
    if len(a.items) != len(b.items) or len(a.items) > 64:
        return False
    if isinstance(a, _Seq):
        return a.brackets == b.brackets and all(_equal(x, y, rel_tol, abs_tol) for x, y in zip(a.items, b.items))
    unused = list(b.items)
    for x in a.items:
        match = next((k for k, y in enumerate(unused) if _equal(x, y, rel_tol, abs_tol)), None)
        if match is None:
            return False
        unused.pop(match)
    return True


def answers_equal(a: str | None, b: str | None, *, rel_tol: float = REL_TOL, abs_tol: float = ABS_TOL) -> bool:
    """Whether two extracted answers denote the same value (see the module docstring). None is never equal."""
    if a is None or b is None:
        return False
    pa, pb = _parse(normalize_answer(str(a))), _parse(normalize_answer(str(b)))
    if pa is None or pb is None:
        return False
    return _equal(pa, pb, rel_tol, abs_tol)


_REDUCED = re.compile(r"([-+]?)(?:\\frac\s*(?:\{\s*(\d+)\s*\}|(\d))\s*(?:\{\s*(\d+)\s*\}|(\d))|(\d+)\s*/\s*(\d+)|(\d+))")


def is_reduced_fraction(answer: str | None) -> bool:
    r"""True for an integer or a fraction ``p/q`` / ``\frac{p}{q}`` in lowest terms (q > 0)."""
    if answer is None:
        return False
    s = normalize_answer(answer).replace(" ", "")
    m = _REDUCED.fullmatch(s)
    if not m:
        return False
    if m.group(8) is not None:
        return True
    num = int(m.group(2) or m.group(3) or m.group(6))
    den = int(m.group(4) or m.group(5) or m.group(7))
    return den > 0 and math.gcd(num, den) == 1


def check_answer(answer: str | None, reference: str, mode: str = "math") -> bool:
    """Whether an extracted ``answer`` is correct for ``reference``.

    ``mode='math'``: :func:`answers_equal`. ``mode='reduced_fraction'``: equal *and* written as an integer
    or a fraction in lowest terms (reasoning-gym's fraction simplification: ``2/4`` is not an answer to
    "simplify 2/4")."""
    if mode not in CHECK_MODES:
        raise ValueError(f"unknown check mode {mode!r}; use one of {CHECK_MODES}")
    if not answers_equal(answer, reference):
        return False
    return mode == "math" or is_reduced_fraction(answer)
