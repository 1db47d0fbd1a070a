"""Shared pieces of the coding tasks: reading code out of model text, and static checks with ``ast``.

Nothing here executes model code: ``ast.parse`` / ``ast.unparse`` only read and rewrite source text.
Everything that runs code goes through :class:`accord.sandbox.Sandbox` (see :class:`TestCache`).

Code extraction (:func:`extract_code`), in order:

1. ``<think>...</think>`` sections are removed.
2. Markdown fences: every fenced block (```` ```python ... ``` ````, any or no language tag) is a
   candidate; an opening fence with no closing one (output cut at the token limit) runs to the end.
   Without any fence the whole text is the one candidate.
3. Each candidate is *repaired* (:func:`repair`): if it parses it is kept as is; otherwise it is cut
   into top-level chunks (a line at column 0 starts a chunk; indented and blank lines belong to it;
   ``else``/``elif``/``except``/``finally`` continue the previous chunk and decorators join the next)
   and only the chunks that parse on their own are kept. Prose lines ("Here is the function:") and a
   function cut off mid-body do not parse and are dropped; the code around them is kept.
4. The repaired candidates are joined with blank lines.

Normalisation (:func:`normalise`) keeps the top-level statements that define things -- imports,
function and class definitions, assignments -- and drops everything else (calls such as
``print(f(3))``, example usage, ``if __name__ == "__main__":`` blocks, loops, top-level asserts): they
are not part of an answer and would only run, and possibly hang, before the tests.
"""

from __future__ import annotations

import ast
import logging
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Optional, Union

from accord.envs.text import without_sections
from accord.sandbox import Sandbox, SandboxConfig, TestPlan, TestRun

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_CODE_CHARS",
    "CodeRun",
    "Suite",
    "TestCache",
    "binds_name",
    "calls_to",
    "case_sources",
    "docstring_examples",
    "extract_code",
    "function_defs",
    "ignored_calls",
    "is_trivial_wrapper",
    "normalise",
    "own_scope",
    "reaches_names",
    "repair",
    "returns_value",
    "safe_parse",
    "shorten",
    "split_tests",
]

#: Longer extracted code is treated as unreadable (no model answer to a coding task is this long).
MAX_CODE_CHARS = 50_000

_FENCE_OPEN = re.compile(r"^[ \t]*```+[ \t]*([A-Za-z0-9_+.-]*)[^\n]*$", re.MULTILINE)
_CONTINUATION = ("else", "elif", "except", "finally")
_DEFINING = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
             ast.AnnAssign)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def safe_parse(code: str) -> ast.Module | None:
    """``ast.parse(code)``, or None when it does not parse (syntax error, null bytes, nesting too deep,
    longer than :data:`MAX_CODE_CHARS`). Never raises on model text; its syntax warnings are silenced."""
    if not isinstance(code, str) or len(code) > MAX_CODE_CHARS:
        return None
    try:
        with warnings.catch_warnings():  # e.g. invalid escape sequences in model code: not the trainer's concern
            warnings.simplefilter("ignore")
            return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None


def _unparse(nodes: Sequence[ast.stmt]) -> str | None:
    try:
        return ast.unparse(ast.Module(body=list(nodes), type_ignores=[]))
    except (RecursionError, ValueError, AttributeError):
        return None


def _chunks(lines: list[str]) -> list[str]:
    """Top-level chunks: a column-0 line starts one; indented/blank lines and ``else:``-like lines continue; a
    chunk of decorator lines only takes the next top-level line too. Whether the last chunk is decorators only is
    kept as two flags, so a run of decorator lines costs time linear in its length."""
    chunks: list[list[str]] = []
    decorator = other = False   # the last chunk has a non-blank line starting with "@" / one that does not
    for line in lines:
        stripped = line.strip()
        top = bool(stripped) and not line[0].isspace()
        word = re.match(r"[A-Za-z_]+", stripped)
        continues = top and word is not None and word.group(0) in _CONTINUATION
        if ((top and not continues) or not chunks) and not (decorator and not other):
            chunks.append([line])
            decorator = other = False
        else:
            chunks[-1].append(line)  # indented, continuing, or the definition after a chunk of decorators
        if stripped:
            decorator, other = decorator or stripped.startswith("@"), other or not stripped.startswith("@")
    return ["\n".join(c) for c in chunks]


def repair(code: str) -> str:
    """``code`` itself if it parses, else the concatenation of its top-level chunks that parse alone."""
    if safe_parse(code) is not None:
        return code.strip("\n")
    if len(code) > MAX_CODE_CHARS:
        return ""
    kept = [chunk for chunk in _chunks(code.splitlines()) if chunk.strip() and safe_parse(chunk) is not None]
    return "\n".join(kept).strip("\n")


def _fenced_blocks(text: str) -> list[str]:
    blocks = []
    pos = 0
    while True:
        opening = _FENCE_OPEN.search(text, pos)
        if opening is None:
            break
        start = opening.end() + 1
        closing = re.compile(r"^[ \t]*```", re.MULTILINE).search(text, start)
        if closing is None:
            blocks.append(text[start:])
            break
        blocks.append(text[start:closing.start()])
        pos = closing.end()
    return blocks


def extract_code(text: str) -> str:
    """The Python code in a model's answer (see the module docstring); ``""`` when there is none."""
    if not isinstance(text, str):
        return ""
    text = without_sections(text.replace("\r\n", "\n"), "<think>", "</think>")   # linear, unlike a lazy regex
    blocks = _fenced_blocks(text) if "```" in text else []
    candidates = blocks if blocks else [text]
    parts = [repair(block) for block in candidates]
    return "\n\n".join(p for p in parts if p.strip())


def normalise(code: str) -> tuple[str, ast.Module] | None:
    """Keep the defining top-level statements of ``code`` (module docstring); None if it does not parse.

    Returns ``(source, tree)`` where ``source`` is ``ast.unparse`` of the kept statements.
    """
    tree = safe_parse(code)
    if tree is None:
        return None
    kept = [stmt for stmt in tree.body if isinstance(stmt, _DEFINING)]
    source = _unparse(kept)
    if source is None:
        return None
    return source, ast.Module(body=kept, type_ignores=[])


def own_scope(node: ast.AST) -> Iterable[ast.AST]:
    """Nodes inside ``node``'s body, not descending into nested functions, lambdas or classes."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        yield child
        if not isinstance(child, _SCOPES):
            stack.extend(ast.iter_child_nodes(child))


def function_defs(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The top-level ``def`` / ``async def`` statements of a module."""
    return [s for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]


def returns_value(func: ast.AST) -> bool:
    """Whether ``func`` has a ``return <value>`` in its own scope (a bare ``return`` does not count)."""
    return any(isinstance(n, ast.Return) and n.value is not None for n in own_scope(func))


def calls_to(node: ast.AST, name: str) -> list[ast.Call]:
    """Every call ``name(...)`` anywhere inside ``node`` (nested functions included)."""
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id == name]


def binds_name(func: ast.AST, name: str) -> bool:
    """Whether ``func`` (anywhere inside, itself excluded) defines or rebinds ``name``: a nested
    ``def``/``class``, an assignment or loop target, a parameter, an import alias, ``global``/``nonlocal``."""
    for n in ast.walk(func):
        if n is not func and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name:
            return True
        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, (ast.Store, ast.Del)):
            return True
        if isinstance(n, ast.arg) and n.arg == name:
            return True
        if isinstance(n, ast.alias) and (n.asname or n.name.split(".")[0]) == name:
            return True
        if isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names:
            return True
    return False


# Builtins and modules through which code reads or rebinds a program's names, or changes a function's insides, at
# run time (``globals()['aux'] = f``, ``aux.__code__ = ...``, ``sys.modules[...]``): what no reading of the source's
# own bindings and calls sees.
_REACHING_BUILTINS = frozenset({"globals", "locals", "vars", "exec", "eval", "compile", "getattr", "setattr",
                                "delattr", "breakpoint"})
_REACHING_MODULES = frozenset({"sys", "builtins", "importlib", "inspect", "gc", "ctypes", "types", "operator",
                               "__main__"})


def reaches_names(tree: ast.AST) -> str | None:
    """The first construct in ``tree`` through which its code can reach the program's names or a function's insides
    at run time (one of :data:`_REACHING_BUILTINS`, a dunder name or attribute such as ``__globals__``, an import of
    one of :data:`_REACHING_MODULES`), as source text; None when there is none."""
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and (n.id in _REACHING_BUILTINS or n.id.startswith("__")):
            return n.id
        if isinstance(n, ast.Attribute) and n.attr.startswith("__"):
            return f".{n.attr}"
        if isinstance(n, ast.Import):
            found = next((a.name for a in n.names if a.name.split(".")[0] in _REACHING_MODULES), None)
            if found is not None:
                return f"import {found}"
        if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] in _REACHING_MODULES:
            return f"from {n.module} import"
    return None


def ignored_calls(node: ast.AST, name: str) -> list[ast.Call]:
    """Calls ``name(...)`` whose value is thrown away: the call is a whole expression statement."""
    return [s.value for s in ast.walk(node) if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
            and isinstance(s.value.func, ast.Name) and s.value.func.id == name]


def _params(func: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    a = func.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return set(names)


def _forwarding_call(node: ast.AST | None, aux: str, params: set[str]) -> bool:
    """``aux(...)`` whose every argument is a parameter name of the wrapper or a constant (``*args``
    and ``**kwargs`` of parameters included)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == aux):
        return False
    values = list(node.args) + [kw.value for kw in node.keywords]
    for v in values:
        if isinstance(v, ast.Starred):
            v = v.value
        if not ((isinstance(v, ast.Name) and v.id in params) or isinstance(v, ast.Constant)):
            return False
    return True


def is_trivial_wrapper(func: ast.FunctionDef | ast.AsyncFunctionDef, aux: str = "aux") -> bool:
    """Whether ``func`` only forwards to ``aux``.

    True when, a leading docstring removed, the body is exactly ``return aux(ARGS)`` or
    ``NAME = aux(ARGS)`` followed by ``return NAME``, where every ARG (positional, keyword, ``*`` or
    ``**``) is a bare parameter name of ``func`` or a constant. Any other statement or any computation
    on the arguments or the result (``return aux(x) + 1``, ``return aux(sorted(x))``) makes it not
    trivial.
    """
    body = list(func.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    params = _params(func)
    if len(body) == 1 and isinstance(body[0], ast.Return):
        return _forwarding_call(body[0].value, aux, params)
    if len(body) == 2 and isinstance(body[0], ast.Assign) and isinstance(body[1], ast.Return):
        targets = body[0].targets
        return (len(targets) == 1 and isinstance(targets[0], ast.Name)
                and _forwarding_call(body[0].value, aux, params)
                and isinstance(body[1].value, ast.Name) and body[1].value.id == targets[0].id)
    return False


def _is_test(stmt: ast.stmt) -> bool:
    return not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and any(
        isinstance(n, ast.Assert) for n in ast.walk(stmt))


def split_tests(tests: str, entry_point: str | None = None) -> list[tuple[str, bool]]:
    """``[(statement source, is_test)]`` of trusted test code, the way :meth:`Sandbox.run_tests` splits
    it: with ``entry_point`` the statements of ``def check(candidate)``'s body, else the top-level ones;
    a statement is a test when it contains an ``assert`` and is not a ``def``/``class``. Returns ``[]``
    when the code does not parse."""
    tree = safe_parse(tests)
    if tree is None:
        return []
    body = tree.body
    if entry_point is not None:
        check = next((s for s in body if isinstance(s, ast.FunctionDef) and s.name == "check"), None)
        if check is None:
            return []
        body = check.body
    out = []
    for stmt in body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            continue
        out.append((_unparse([stmt]) or "", _is_test(stmt)))
    return out


def case_sources(tests: str, entry_point: str | None = None) -> list[str]:
    """Source of each test of ``tests`` in the order :meth:`Sandbox.run_tests` numbers them."""
    return [src for src, is_test in split_tests(tests, entry_point) if is_test]


# the value is group 1 with its trailing blanks cut by the caller (a lazy group before "\s*$" took time quadratic
# in a run of blanks inside the line)
_EXAMPLE_ARROW = re.compile(r"^\s*(?:==>|=>|==|\u279e|->|\u2192|#\s*returns?|returns?|should\s+return|"
                            r"should\s+be|the\s+output\s+should\s+be)\s*:?\s*(.+)$", re.IGNORECASE)
_EXAMPLE_WORDS = {"true": True, "false": False}
MAX_EXAMPLES = 10


def _example_call(text: str, entry_point: str) -> str | None:
    """``text`` if it is exactly a call of ``entry_point`` with literal arguments (normalised), else None."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == entry_point):
        return None
    try:
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            ast.literal_eval(arg)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        return None
    return ast.unparse(node)


def _example_value(text: str) -> str | None:
    """The source of the literal ``text`` denotes (a trailing full stop dropped; ``true``/``false`` read as
    booleans), or None."""
    for candidate in (text.strip().rstrip(".").rstrip(), text.strip()):
        if candidate.lower() in _EXAMPLE_WORDS:
            return repr(_EXAMPLE_WORDS[candidate.lower()])
        try:
            return repr(ast.literal_eval(candidate)) if candidate else None
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
    return None


def _inline_example(line: str, entry_point: str) -> str | None:
    """``assert CALL == VALUE`` from a docstring line such as ``f(3) ==> 4``, ``f(3) returns 4`` or
    ``Example: assert f(3) == 4``; None when the line holds no such example."""
    start = line.find(entry_point + "(")
    if start < 0 or (start > 0 and (line[start - 1].isalnum() or line[start - 1] in "_.")):
        return None
    for end in (i for i, c in enumerate(line) if c == ")" and i > start):
        call = _example_call(line[start:end + 1], entry_point)
        if call is None:
            continue
        arrow = _EXAMPLE_ARROW.match(line[end + 1:])
        value = _example_value(arrow.group(1).rstrip() or arrow.group(1)) if arrow else None
        return f"assert {call} == {value}" if value is not None else None
    return None


def docstring_examples(prompt: str, entry_point: str) -> list[str]:
    """The examples of a problem's own docstring as tests, ``assert ENTRY(ARGS) == VALUE`` with literal
    arguments and value (at most :data:`MAX_EXAMPLES`, in order, duplicates dropped). Read statically:
    doctests (``>>> ENTRY(ARGS)`` and the lines after it up to a blank line) and one-line forms such as
    ``ENTRY(ARGS) ==> VALUE`` / ``=>`` / ``==`` / ``->`` / ``returns`` / ``should return``; anything else (prose,
    ``print(...)``, computed values, calls spread over lines) is skipped. These are what the model already
    sees in the prompt, so running them reveals nothing hidden."""
    tree = safe_parse(prompt)
    entry = next((s for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and s.name == entry_point), None) if tree is not None else None
    doc = ast.get_docstring(entry) if entry is not None else None
    if not doc:
        return []
    lines = doc.splitlines()
    found: list[str] = []
    i = 0
    while i < len(lines) and len(found) < MAX_EXAMPLES:
        line = lines[i].strip()
        i += 1
        if line.startswith(">>>"):
            expected = []
            while i < len(lines) and lines[i].strip() and not lines[i].strip().startswith(">>>"):
                expected.append(lines[i].strip())
                i += 1
            code = line[3:].split("  #")[0]
            call, value = _example_call(code, entry_point), _example_value(" ".join(expected))
            test = f"assert {call} == {value}" if call is not None and value is not None else None
        else:
            test = _inline_example(line, entry_point)
        if test is not None and test not in found:
            found.append(test)
    return found


def shorten(text: str, limit: int = 200) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    one = " ".join(str(text).split())
    return one if len(one) <= limit else one[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------------
# Running code: the sandbox, with a cache of results
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CodeRun:
    """What one sandboxed test run gave: counts, status, and per-test outcomes (index -> (ok, error))."""

    passed: int
    total: int
    status: str
    cases: tuple[tuple[bool, str | None], ...] = ()

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total

    def case(self, i: int) -> tuple[bool, str | None]:
        """(passed, error) of test ``i``; a test that did not report failed (``None`` error)."""
        return self.cases[i] if i < len(self.cases) else (False, None)

    @staticmethod
    def not_run(total: int, status: str = "not_run") -> CodeRun:
        return CodeRun(0, total, status, tuple((False, None) for _ in range(total)))

    @staticmethod
    def from_test_run(run: TestRun) -> CodeRun:
        by_index = {c.index: (c.passed, c.error) for c in run.result.test_cases}
        cases = tuple(by_index.get(i, (False, None)) for i in range(run.total))
        return CodeRun(run.passed, run.total, run.result.status, cases)


#: A suite of tests: ``(tests, function, reference program or None, setup code or None)`` -- trusted code,
#: planned by :meth:`Sandbox.plan_tests` -- or a ready :class:`~accord.sandbox.TestPlan`.
Suite = Union[tuple[str, str, Optional[str], Optional[str]], TestPlan]


@dataclass
class TestCache:
    """Runs ``(program, suite)`` jobs through one :meth:`Sandbox.run_tests_many` call per :meth:`run` and
    remembers the results by program and suite (a job's result depends on nothing else).

    Every test is judged outside the program's process (:mod:`accord.sandbox.harness`): the program only
    returns plain values for the inputs the suite's plan recorded. The sandbox is built on first use;
    plans are cached by the sandbox. Clones of an environment share one cache: entries are pure results,
    so sharing changes no environment's future, and AT-GRPO's K clones of a state do not re-run the code
    they have in common. When an insertion would pass ``max_entries`` the cache is emptied first (with 0
    it holds only the last call's results).
    """

    __test__ = False  # not a pytest test class

    config: SandboxConfig = field(default_factory=lambda: SandboxConfig(timeout_s=3.0))
    max_entries: int = 4096
    results: dict = field(default_factory=dict)
    calls: int = 0  #: run_tests_many calls made
    jobs_run: int = 0  #: jobs sent to the sandbox (cache misses)
    _box: Sandbox | None = field(default=None, repr=False)

    def fingerprint(self) -> str:
        """The rollout audit's view of this cache (:func:`accord.audit.state_fingerprint`): pure results that
        clones share are not episode state, so a sibling candidate that fills the cache does not make two
        equal states look different."""
        return "TestCache"

    @property
    def sandbox(self) -> Sandbox:
        if self._box is None:
            self._box = Sandbox(self.config)
        return self._box

    def run(self, jobs: Sequence[tuple[str, Suite]]) -> list[CodeRun]:
        """Results of ``(program, suite)`` jobs, in order; misses run concurrently in one call."""
        keys = [(program, suite) for program, suite in jobs]
        found = {k: self.results[k] for k in keys if k in self.results}
        missing = [k for k in dict.fromkeys(keys) if k not in found]
        if missing:
            runs = self.sandbox.run_tests_many([(program, suite) if isinstance(suite, TestPlan) else (program, *suite)
                                                for program, suite in missing])
            self.calls += 1
            self.jobs_run += len(missing)
            fresh = {key: CodeRun.from_test_run(run) for key, run in zip(missing, runs)}
            found.update(fresh)
            if len(self.results) + len(fresh) > self.max_entries:
                self.results.clear()
            self.results.update(fresh)
        return [found[k] for k in keys]
