"""The tasks' parsers read model text in time linear in its length, and read it as the code they replace did.
The hostile inputs are those two fuzzing passes found (2026-11-30, 2-core Intel Xeon): the writing task's heading
pattern took 5.5 s for 1,500 blanks around a role name and did not finish within 20 s for 30,000 tabs; the maths
tool's fence pattern 2.2-2.7 s for a 50,000-character fence line (each tool step of math and of the puzzles' tool
agents); the coding tasks' ``<think>`` pattern 12 s per humaneval step for 8,000 unclosed tags and their chunking
27 s for 48,000 characters of decorator lines; the maths answer's unit pattern 2.7 s for an 83-character answer
(exponential), its marker cleaning and box scan about 1.2 s together for a 52,000-character completion.
Time is checked as growth (4x the text must cost well under 16x, quadratic's growth), the best of 5 CPU times."""

from __future__ import annotations

import random
import re
import time

import pytest

from accord.envs.coding.common import _chunks, _inline_example, extract_code as extract_python
from accord.envs.external.base import first_int
from accord.envs.maths import answer
from accord.envs.maths.env import _fences, extract_code
from accord.envs.text import tag_spans, without_sections
from accord.envs.writing.core import _without_tldr_cue
from accord.envs.writing.task import heading_pattern, split_parts

ROLES = ("concise", "detailed")


def _growth(parse, make) -> tuple[float, float]:
    def cost(n: int) -> float:
        text, best = make(n), float("inf")
        for _ in range(5):
            start = time.process_time()
            parse(text)
            best = min(best, time.process_time() - start)
        return best
    return cost(10_000), cost(40_000)


@pytest.mark.parametrize("name, parse, make", [
    ("heading, blanks around a role", lambda t: split_parts(t, ROLES), lambda n: " " * n + "concise" + " " * n + "x"),
    ("heading, a run of tabs", lambda t: split_parts(t, ROLES), lambda n: "\t" * n + "detailed" + "\t" * n),
    ("heading, leading blanks", lambda t: split_parts(t, ROLES), lambda n: " " * (4 * n) + "x"),
    ("maths fence line", extract_code, lambda n: "```" + " " * (4 * n) + "x"),
    ("maths fence tag", extract_code, lambda n: "```" + "a" * (4 * n)),
    ("maths many fences", extract_code, lambda n: "```a" * n),
    ("coding unclosed think tags", extract_python, lambda n: "<think>" * n),
    ("coding decorator lines", extract_python, lambda n: "@a\n" * (n // 4)),
    ("answer marker blanks", answer.extract_answer, lambda n: ("answer: a b" + " " * (n // 32) + "c\n") * 32),
    ("answer marker parens", answer.extract_answer, lambda n: ("answer: a b c. " + "\\(" * (n // 64) + "\n") * 32),
    ("answer unclosed boxes", answer.extract_answer, lambda n: "\\boxed{" * 32 + "x" * n),
    # data files' text, not a model's: a TL;DR cue, a docstring's example line
    ("writing TL;DR cue", _without_tldr_cue, lambda n: "a" + " " * (4 * n) + "b"),
    ("docstring example arrow", lambda t: _inline_example(t, "f"), lambda n: "f(1) -> a" + " " * n + "b"),
])
def test_hostile_text_costs_time_linear_in_its_length(name, parse, make):
    small, large = _growth(parse, make)
    assert large < 1.0 and large / max(small, 1e-4) < 10, (name, small, large)


def test_fences_are_those_of_the_regex_they_replace():
    old = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)```", re.S)
    rng = random.Random(0)
    parts = ["```", "`", "python", "py", " ", "\t", "\n", "x = 1", "print(x)", "a.b-c", "``````", "\n\n"]
    for _ in range(5000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))
        assert _fences(text) == old.findall(text), text


def test_think_sections_are_those_of_the_regex_they_replace():
    old = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
    rng = random.Random(1)
    parts = ["<think>", "</think>", "<THINK>", "</Think>", "x", "\n", "<", ">", "/", "think", "<think", "</think"]
    for _ in range(5000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))
        assert without_sections(text, "<think>", "</think>") == old.sub("", text), text
        assert [text[b:c] for _, b, c, _ in tag_spans(text, "<think>", "</think>")] == \
            re.findall(r"<think>(.*?)</think>", text, re.DOTALL | re.IGNORECASE), text


def test_headings_are_those_of_the_pattern_they_replace():
    names = "|".join(ROLES)
    old = re.compile(rf"(?im)^[ \t]*(?:#+[ \t]*)?\**[ \t]*({names})(?:[ \t]+summary)?[ \t]*\**[ \t]*:[ \t]*\**")
    new = heading_pattern(ROLES)
    rng = random.Random(2)
    parts = [" ", "\t", "#", "*", "**", "concise", "Detailed", "summary", " summary", ":", "\n", "x", "##"]
    for _ in range(5000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))
        assert [m.span() + m.groups() for m in new.finditer(text)] == \
            [m.span() + m.groups() for m in old.finditer(text)], text
    text = "## **Concise summary:** a\n\n* Detailed :** b"
    assert split_parts(text, ROLES) == {"concise": "a", "detailed": "b"}


def test_an_exponent_run_in_an_answer_is_read_at_once():
    """``1 ^ 1 ^ 1 ... #`` made the unit pattern try 2^n ways (2.7 s at 83 characters, 10 s at 91); the answer limit
    is 400 characters."""
    text = "1" + " ^ 1" * 99 + " #"
    start = time.process_time()
    assert answer.answers_equal(text, "42") is False
    assert time.process_time() - start < 0.5


def test_answer_patterns_read_as_the_ones_they_replace():
    old_units = re.compile(r"^(.*?[0-9)\]}%])((?:\s+(?:[A-Za-z]{2,}\.?|\^\s*\{?\s*\d+(?:\s*\})?|/))+)\s*$", re.S)
    old_math = re.compile(r"\$\$?(.+?)\$\$?|\\\((.+?)\\\)")
    old_end = re.compile(r"(?<!\d)\.(?!\d)|;|\s+(?:because|since|so|as|which|where)\b|,\s+(?:since|because|so|which)\b")
    rng = random.Random(3)
    units = [" ", "^", "{", "}", "1", "23", "cm", "m.", "/", "%", ")", "x", "\t", "^{", " }"]
    marks = ["\\(", "\\)", "$", "$$", " ", "  ", ".", "1", "a", ";", ",", " because", " so", "which", "x", "\t"]
    for _ in range(5000):
        text = "".join(rng.choice(units) for _ in range(rng.randint(1, 9)))
        a, b = old_units.match(text), answer._UNIT_WORDS.match(text)
        assert (a and a.groups()) == (b and b.groups()), text
        line = "".join(rng.choice(marks) for _ in range(rng.randint(0, 12)))
        m = old_math.search(line)
        assert answer._inline_math(line) == (m and (m.group(1) or m.group(2))), line
        assert answer._SENTENCE_END.split(line, maxsplit=1) == old_end.split(line, maxsplit=1), line


def test_boxes_read_as_before(monkeypatch):
    """The last complete box wins, an unclosed one is skipped: the same answers as when every box's scan ran to the
    text's end (it now stops where a later unclosed box opens)."""
    rng = random.Random(4)
    parts = ["\\boxed", "\\boxed{", "{", "}", "\\{", "\\}", "\\\\", " ", "x", "1", "\\fbox{", "\\boxedx", "$"]
    texts = ["".join(rng.choice(parts) for _ in range(rng.randint(0, 12))) for _ in range(5000)]
    now = [answer.extract_boxed(text) for text in texts]
    group = answer._group
    monkeypatch.setattr(answer, "_group", lambda text, i, end=None: group(text, i))   # each scan to the end
    assert [answer.extract_boxed(text) for text in texts] == now
    assert any(now) and None in now


def test_chunks_are_those_of_the_code_they_replace():
    def old(lines):
        chunks = []
        for line in lines:
            stripped = line.strip()
            top = bool(stripped) and not line[0].isspace()
            word = re.match(r"[A-Za-z_]+", stripped)
            continues = top and word is not None and word.group(0) in ("else", "elif", "except", "finally")
            if (top and not continues) or not chunks:
                previous = [x for x in chunks[-1] if x.strip()] if chunks else []
                if previous and all(x.lstrip().startswith("@") for x in previous):
                    chunks[-1].append(line)
                    continue
                chunks.append([line])
            else:
                chunks[-1].append(line)
        return ["\n".join(c) for c in chunks]

    rng = random.Random(5)
    lines = ["@a", "@b(1)", "  @c", "def f():", "  pass", "", "   ", "else:", "x = 1", "class A:", "elif x:", "  y", "@"]
    for _ in range(5000):
        chosen = [rng.choice(lines) for _ in range(rng.randint(0, 10))]
        assert _chunks(chosen) == old(chosen), chosen


def test_a_move_of_thousands_of_digits_is_no_move():
    """``int()`` refuses more than 4,300 digits: a reply of them raised out of the external games' parsers."""
    assert first_int("play 2") == 2 and first_int("[-3]") == -3
    assert first_int("1" * 5000) is None and first_int("9" * 19) is None and first_int("9" * 18) == int("9" * 18)


def test_tldr_cue_and_example_values_read_as_before():
    assert _without_tldr_cue("  my post\nTL;DR:  \n") == "my post" and _without_tldr_cue("TL;DR: x") == "TL;DR: x"
    assert _inline_example("f(3) ==> 4  ", "f") == "assert f(3) == 4"
    assert _inline_example("f(3) should return  'a b'  ", "f") == "assert f(3) == 'a b'"
