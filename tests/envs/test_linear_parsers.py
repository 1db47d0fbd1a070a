"""The tasks' parsers read model text in time linear in its length, and read it as the regular expressions they
replace did. The hostile inputs are those a fuzzing pass found (2026-11-30, 2-core Intel Xeon): the writing
task's heading pattern took 5.5 s for 1,500 blanks around a role name and did not finish within 20 s for 30,000
tabs; the maths tool's fence pattern 2.2-2.7 s for a 50,000-character fence line (each tool step of math and of the
puzzles' tool agents); the coding tasks' ``<think>`` pattern 12 s per humaneval step for 8,000 unclosed tags.
Time is checked as growth (4x the text must cost well under 16x, quadratic's growth), the best of 5 CPU times."""

from __future__ import annotations

import random
import re
import time

import pytest

from accord.envs.coding.common import extract_code as extract_python
from accord.envs.maths.env import _fences, extract_code
from accord.envs.text import tag_spans, without_sections
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
