"""Unit tests judged outside the candidate's process: plans, candidate calls, verdicts.

A candidate's process never decides whether a test passed. Instead:

1. **Plan** (trusted): the tests are split into statements; a statement with an ``assert`` is a test,
   the others are setup. The inputs of every call of the function under test are recorded, and for a
   *simple* test -- ``assert f(ARGS) <op> EXPECTED`` with ``<op>`` one of ``==``, ``!=``, ``is``, ``is
   not`` (either side), ``assert f(ARGS)`` or ``assert not f(ARGS)``, where neither ARGS nor EXPECTED
   calls ``f`` -- the value of EXPECTED too. When every test is simple and its arguments and expected
   value are literals, the plan is read from the source with :func:`ast.literal_eval` and nothing runs.
   Otherwise the tests run once in a sandbox against the reference program (``reference=``), with the
   function under test wrapped by a recorder; that process runs trusted code only. Without a
   reference, a test that is not simple is planned when its calls are *independent*
   (:func:`static_calls`): an ``assert`` whose every use of the function is a call, made exactly once
   whatever the values (no loop, comprehension, ``and``/``or``, ``x if c else y`` or chained comparison
   around it), with arguments that do not call the function -- ``assert abs(f(x) - y) < eps``,
   ``assert math.isclose(f(x), y)``, ``assert sorted(f(x)) == [...]``, ``assert f(1) + f(2) == 5``. Its
   inputs are the arguments, evaluated by trusted code in the order Python would call them. Any other
   test without a reference is refused when it is planned (:class:`~accord.sandbox.api.TestPlanError`,
   naming the test), not failed at scoring.
2. **Calls** (the candidate's process): the program runs, then its function is called on each recorded
   input, and each return value comes back as plain data (:mod:`accord.sandbox.plain`) -- or the
   exception raised. Nothing else comes back; anything that is not plain data fails that call.
3. **Verdicts**: a simple test is decided here, in the caller's process, by comparing the decoded
   return value with the expected value. Any other test (loops, tolerances, helpers of the test code)
   is *replayed* in a fresh sandbox that runs only the trusted test code and the reference program: the
   function under test answers each call with the candidate's recorded return value (or raises what the
   candidate raised). That judge process never runs model-written code.

So patched builtins, frame or ``gc`` walks, forged reports, early exits and objects with their own
``__eq__`` in the candidate's process can change only the values it claims to return; a claim is
worth something only if it is the right value.

What changes against running ``check(candidate)`` in the candidate's process: the test code sees
copies (a test that inspects how the candidate mutated its argument sees the argument unchanged); a
return value that is not plain data fails (a generator, a NumPy array, an instance of the candidate's
class); ``random`` is seeded per statement, identically when planning and judging; a call whose input
depends on an earlier return value of the candidate is judged against the reference's path (it fails if
the paths differ); a test that names the function under test directly (HumanEval/33 compares
``candidate(x)`` with ``sort_third(x)``) calls the reference there, which makes it a real test.
"""

from __future__ import annotations

import ast
import logging
import marshal
import reprlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["Statement", "TestPlan", "compare", "literal_parts", "literal_plan", "needs_reference", "parse_source",
           "parse_tests", "simple_parts", "simple_verdict", "static_calls"]

_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is", ast.IsNot: "is not"}
# CPython 3.11 builds the syntax tree of ``ast.parse`` with a recursion counter shared by all threads: two parses
# at once (the sandbox plans test suites and runs programs on a thread pool) can fail with "SystemError: AST
# constructor recursion depth mismatch" on valid source. One parse at a time.
_PARSE_LOCK = threading.Lock()


def parse_source(source: str, mode: str = "exec") -> ast.AST:
    """``ast.parse(source, mode=mode)``, one call at a time in this process: every parse the sandbox makes on
    its thread pool goes through here (``ast.literal_eval`` of a string parses too: pass it this tree)."""
    with _PARSE_LOCK:
        return ast.parse(source, mode=mode)


PACK = "__accord_pack__"


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: `expected` may be a list
class Statement:
    """One statement of a test suite, as planned."""

    source: str
    kind: str  #: "setup", "simple" (decided by the caller) or "test" (replayed by a judge)
    op: str | None = None  #: simple: "==", "!=", "is", "is not", "truthy", "falsy"
    expected: Any = None  #: simple: the expected value (plain data)
    calls: tuple[int, ...] = ()  #: indices into TestPlan.inputs of the calls this statement makes
    error: str | None = None  #: the statement could not be planned: it fails for every program

    @property
    def is_test(self) -> bool:
        return self.kind != "setup"


@dataclass(frozen=True, eq=False)  # hashed by identity, so that it can key a cache
class TestPlan:
    """Everything needed to judge a program against a test suite without trusting its process."""

    __test__ = False  # not a pytest test class

    function: str  #: name of the function under test, as the program defines it
    binding: str  #: name the tests call it by ("candidate" in HumanEval's check, else ``function``)
    statements: tuple[Statement, ...]
    inputs: tuple[bytes, ...]  #: marshal of ``(args list, kwargs dict)`` per call
    context: tuple[str, ...] = ()  #: trusted code run before the tests when replaying (setup, reference)

    @property
    def total(self) -> int:
        return sum(1 for s in self.statements if s.is_test)

    @property
    def needs_judge(self) -> bool:
        return any(s.kind == "test" and s.error is None for s in self.statements)

    def judge_statements(self) -> list[tuple[str, str, tuple[int, ...]]]:
        return [(s.source, s.kind, s.calls) for s in self.statements]


# --------------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------------

def _mentions(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def _is_call(node: ast.AST, binding: str) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == binding
            and not any(_mentions(a, binding) for a in node.args)
            and not any(_mentions(k.value, binding) for k in node.keywords))


def simple_parts(stmt: ast.stmt, binding: str) -> tuple[str, ast.Call, ast.expr | None] | None:
    """``(op, call, expected expression)`` of a simple test (see the module docstring), else None."""
    if not isinstance(stmt, ast.Assert):
        return None
    test = stmt.test
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _OPS:
        op, left, right = _OPS[type(test.ops[0])], test.left, test.comparators[0]
        if _is_call(left, binding) and not _mentions(right, binding):
            return op, left, right
        if _is_call(right, binding) and not _mentions(left, binding):
            return op, right, left
        return None
    if _is_call(test, binding):
        return "truthy", test, None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and _is_call(test.operand, binding):
        return "falsy", test.operand, None
    return None


def _is_test(stmt: ast.stmt) -> bool:
    return not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and any(
        isinstance(n, ast.Assert) for n in ast.walk(stmt))


# Expressions whose parts Python evaluates each exactly once, in the order of their fields (a dict's keys
# and values interleave; a call evaluates its function, positional arguments, then keywords).
_ONCE_IN_ORDER = (ast.Call, ast.keyword, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Subscript, ast.Attribute, ast.Slice,
                  ast.Tuple, ast.List, ast.Set, ast.Dict, ast.Starred, ast.JoinedStr, ast.FormattedValue, ast.Name,
                  ast.Constant, ast.expr_context, ast.operator, ast.unaryop, ast.cmpop)


def static_calls(stmt: ast.stmt | None, binding: str) -> list[ast.Call] | None:
    """The calls of the function under test in a test statement, in the order Python makes them, when the
    statement can be planned without a reference (see the module docstring), else None."""
    if not isinstance(stmt, ast.Assert) or (stmt.msg is not None and _mentions(stmt.msg, binding)):
        return None
    calls: list[ast.Call] = []

    def visit(node: ast.AST) -> bool:
        if not _mentions(node, binding):
            return True  # evaluated or not, it makes no call of the function
        if not isinstance(node, _ONCE_IN_ORDER) or isinstance(node, ast.Name):
            return False  # a call inside a loop, a condition or a lambda; or the function used as a value
        if isinstance(node, ast.Compare) and len(node.ops) > 1:
            return False  # a chained comparison stops early
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == binding:
            if not _is_call(node, binding):
                return False  # its arguments depend on another call's result
            calls.append(node)
            return True
        if isinstance(node, ast.Dict):
            return all((k is None or visit(k)) and visit(v) for k, v in zip(node.keys, node.values))
        return all(visit(child) for child in ast.iter_child_nodes(node))

    return calls if visit(stmt.test) else None


def needs_reference(tests: str | Sequence[str], function: str) -> list[str]:
    """Sources of the tests that can only be planned against a reference program (neither simple nor
    with independent calls, see :func:`static_calls`); ``[]`` when a plan needs no reference."""
    binding, parsed = parse_tests(tests, function)
    return [source for source, kind, node in parsed if kind == "test" and static_calls(node, binding) is None]


def _calls_check(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "check")


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def parse_tests(tests: str | Sequence[str], function: str) -> tuple[str, list[tuple[str, str, ast.stmt | None]]]:
    """``(binding, [(source, kind, node)])`` of trusted test code; ``kind`` is "setup", "simple" or "test".

    With a ``def check(candidate)`` in ``tests`` (HumanEval), the other top-level statements (but the
    ``check(...)`` call) are setup and the body of ``check`` holds the tests, which call the function by
    ``check``'s parameter name. Otherwise the top-level statements are the tests and setup, and call
    the function by its own name. A list of strings is one test per string.
    """
    if not isinstance(function, str) or not function.isidentifier():
        raise ValueError(f"function={function!r} is not an identifier: name the function under test")
    out: list[tuple[str, str, ast.stmt | None]] = []
    if not isinstance(tests, str):
        items = list(tests)
        if not all(isinstance(t, str) for t in items):
            raise TypeError("tests must be a string of statements or a sequence of strings")
        for t in items:
            body = parse_source(t).body  # raise on broken tests here, not as a candidate failure
            node = body[0] if len(body) == 1 else None
            kind = "simple" if node is not None and simple_parts(node, function) else "test"
            out.append((t, kind, node))
        return function, out
    body = list(parse_source(tests).body)
    binding = function
    check = next((s for s in body if isinstance(s, ast.FunctionDef) and s.name == "check"), None)
    if check is not None:
        binding = check.args.args[0].arg if check.args.args else "candidate"
        out += [(ast.unparse(s), "setup", s) for s in body if s is not check and not _calls_check(s)]
        body = list(check.body)
    for stmt in body:
        if _is_docstring(stmt):
            continue
        kind = ("simple" if simple_parts(stmt, binding) else "test") if _is_test(stmt) else "setup"
        out.append((ast.unparse(stmt), kind, stmt))
    return binding, out


def plan_job_statements(binding: str, parsed: list[tuple[str, str, ast.stmt | None]],
                        has_reference: bool = True) -> list[tuple]:
    """What the planning child needs per statement: ``(source, kind, args source, expected source)``.
    Without a reference a non-simple test goes as kind ``static``: its args source is a tuple of the
    packed arguments of its calls (:func:`static_calls`), evaluated in order to record the inputs."""
    items = []
    for source, kind, node in parsed:
        args_src = expected_src = ""
        if kind == "test" and not has_reference:
            calls = static_calls(node, binding)
            if calls is None:
                raise ValueError(f"test {source!r} needs a reference to be planned")
            packs = [ast.Call(func=ast.Name(id=PACK, ctx=ast.Load()), args=c.args, keywords=c.keywords)
                     for c in calls]
            args_src = ast.unparse(ast.Tuple(elts=packs, ctx=ast.Load())) if packs else "()"
            kind = "static"
        elif kind == "simple":
            _, call, expected = simple_parts(node, binding)
            packed = ast.Call(func=ast.Name(id=PACK, ctx=ast.Load()), args=call.args, keywords=call.keywords)
            args_src = ast.unparse(packed)
            expected_src = ast.unparse(expected) if expected is not None else "None"
        items.append((source, kind, args_src, expected_src))
    return items


def literal_parts(stmt: ast.stmt, binding: str) -> tuple[str, list, dict, Any] | None:
    """``(op, args, kwargs, expected)`` of a simple test whose arguments and expected value are literals
    (read with :func:`ast.literal_eval`, nothing runs), else None."""
    parts = simple_parts(stmt, binding)
    if parts is None:
        return None
    op, call, expected = parts
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    try:
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        value = ast.literal_eval(expected) if expected is not None else None
        marshal.dumps((args, kwargs))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return op, args, kwargs, value


def literal_plan(tests: str | Sequence[str], function: str) -> TestPlan | None:
    """The plan of tests that are all simple with literal arguments and expected values, read without
    running anything; None when any statement is not of that form."""
    binding, parsed = parse_tests(tests, function)
    statements, inputs = [], []
    for source, kind, node in parsed:
        parts = literal_parts(node, binding) if kind == "simple" else None
        if parts is None:
            return None
        op, args, kwargs, value = parts
        statements.append(Statement(source, "simple", op, value, (len(inputs),)))
        inputs.append(marshal.dumps((args, kwargs)))
    return TestPlan(function, binding, tuple(statements), tuple(inputs))


# --------------------------------------------------------------------------------------------------
# Verdicts of simple tests
# --------------------------------------------------------------------------------------------------

def compare(value: Any, op: str, expected: Any) -> bool:
    """``value <op> expected`` on plain data (no user code can run); False if the comparison breaks."""
    try:
        if op == "==":
            return bool(value == expected)
        if op == "!=":
            return bool(value != expected)
        if op == "is":  # decoded None, True and False are the singletons, as the test's literals are
            return value is expected
        if op == "is not":
            return value is not expected
        if op == "truthy":
            return bool(value)
        if op == "falsy":
            return not value
    except RecursionError:
        return False
    raise ValueError(f"unknown comparison {op!r}")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 8, 8, 6, 8
_REPR.maxfrozenset, _REPR.maxstring, _REPR.maxlong, _REPR.maxother = 8, 120, 60, 60


def _shown(value: Any, limit: int = 200) -> str:
    """A bounded repr: a few items of each container, long strings and numbers cut in the middle."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def simple_verdict(statement: Statement, outcome: tuple | None) -> tuple[bool, str | None]:
    """``(passed, error)`` of a simple test given the candidate's outcome of its call:
    ``("ok", value)``, ``("err", text)`` or None (the call never returned)."""
    if statement.error is not None:
        return False, f"not judged: {statement.error}"
    if outcome is None:
        return False, "no return value (the program stopped before this call)"
    if outcome[0] == "err":
        return False, outcome[1]
    if compare(outcome[1], statement.op, statement.expected):
        return True, None
    return False, f"AssertionError: got {_shown(outcome[1])}"
