"""``code``: AT-GRPO's coding task -- a ``coder`` writes the solution, a ``tester`` writes unit tests.

A turn-based environment (agents ``("coder", "tester")``, in that order) over one problem of
:mod:`accord.envs.coding.data` (HumanEval, MBPP or local files; the problem needs a canonical solution,
so CoopHumanEval, which has none, is refused). The reference tests stay hidden from both agents.

Options (``task.options``): ``dataset`` (``humaneval`` | ``mbpp``; ``coophumaneval`` only with
``data_files`` whose records carry a canonical solution), ``source``, ``data_files`` (see
:mod:`accord.envs.coding.data`), ``max_turns`` (3), ``single_agent`` (false), ``max_tests`` (20: tests of
the tester counted), ``timeout_s`` (3.0: the sandbox's wall-clock limit per program run).

Turn ``t``: the coder sees the problem, its previous code and the tester's latest tests with their
results on that code, and writes a solution; the tester sees the problem and the coder's latest code
(and how its previous tests fared on it) and writes ``assert`` statements.

Reading the outputs (static, nothing executed in the trainer)
-------------------------------------------------------------
Both go through :func:`~accord.envs.coding.common.extract_code`. The **coder's** code is normalised
(top-level imports, ``def``/``class`` and assignments kept) and must define the entry point at the top
level; the program run is ``preamble + code``. A coder output without the entry point is not run: it
passes nothing. The **tester's** tests (:func:`read_tests`): its top-level asserts that pin a value,
``assert ENTRY(ARGS) == EXPECTED`` (either side) or ``assert ENTRY(ARGS) is True``/``False``/``None``,
whose arguments and expected value are literals, at most ``max_tests`` of them (the first ones);
everything else is dropped (``assert True``, ``assert ENTRY(x)``, ``!=``, ``is not None``, asserts about
other things, setup code, computed expected values). **No code of the tester ever runs**: a test is an input and an expected
value, and whether it passes on a program is decided in the trainer by comparing the expected value with
the plain value the program returned (:mod:`accord.sandbox.harness`). A test that inspects its own source,
the program or the harness cannot even be written in this form.

Rewards
-------
- **Team** (an increment): at a coder step, the coder's new pass rate on the reference tests minus its
  previous one (0 before the first step), so the team return of an episode is the final pass rate; a
  tester step changes no code and earns 0 team reward.
- **Coder, local**: the pass rate of the reference tests on the code it just wrote (in [0, 1]).
- **Tester, local** (in [0, 1]): ``u * (0.5 + 0.5 * catch)`` where

  * ``u`` = the share of its tests that are *useful*: they pass on the canonical solution (the test is
    right) **and fail on a stub** of the entry point that returns ``None`` (the test checks something:
    ``assert f(1) == f(1)`` or ``assert f(x) is not 5`` pass on the stub and are worth nothing). With no
    tests, ``u = 0``: asserting nothing earns nothing.
  * ``catch`` = 1 if the coder's current code is right (passes every reference test: nothing to catch)
    or if at least one useful test fails on it (the tests caught the bug); else 0 -- right tests that
    miss the coder's bug earn half.

Local rewards are the score of the step's own action (the per-candidate signal AT-GRPO compares within
a group of K candidates from one state), not increments; the rollout computes ``alpha * team + local``.
(Under MAGRPO's tree with the independent-learner baseline, which sums local rewards over turns, a
coder's local return therefore grows with the number of turns it takes.)

Episode end
-----------
As in the paper, the episode ends when the generated tests pass on the generated code: after any step
where the tester has at least one test and all of them pass on the coder's latest code (checked after
the coder's step with the tester's previous tests, and after the tester's step); otherwise after
``max_turns`` turns. ``info["success"]`` = the coder's latest code passes all reference tests.

``single_agent: true`` gives one ``coder`` (the single-agent baseline): no tests to end on, so its
episode ends when its code passes the reference tests or after ``max_turns`` turns; between turns it
sees its previous code and is asked to review it (no test results are shown).

Execution: each step runs its jobs (coder step: reference tests and the tester's tests on the new code;
tester step: the new tests on the canonical solution, on the stub and on the coder's code) in ONE
:meth:`Sandbox.run_tests_many` call; the reference tests are judged as in the ``humaneval`` task (outside
the program's process). Results are cached per ``(program, suite)`` in a cache that clones share (pure
results: a clone's steps never change the original's future).
"""

from __future__ import annotations

import ast
import logging
from typing import Any

from accord.envs.registry import TaskError, register_task
from accord.envs.coding.common import (
    CodeRun,
    TestCache,
    case_sources,
    extract_code,
    function_defs,
    normalise,
    safe_parse,
    shorten,
)
from accord.envs.coding.data import DATASETS, SOURCES, load_problems, suite_of
from accord.envs.protocol import StepResult, check_step_actions
from accord.sandbox import SandboxConfig, TestPlan
from accord.sandbox.harness import literal_parts, literal_plan

logger = logging.getLogger(__name__)

__all__ = ["CodeEnv", "make_code", "read_tests", "stub_program"]

_SETUP = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
SHOWN_TESTS = 8

_INSTRUCTIONS = {
    "coder": ("You are the coder in a two-agent Python team. You write a complete, correct implementation of the "
              "requested function; a teammate writes unit tests for it, and you see how your code fares on them. "
              "Answer with the code in one ```python block (imports and helper functions allowed; no tests, no "
              "example calls)."),
    "tester": ("You are the unit-test writer in a two-agent Python team. A teammate writes the function; you write "
               "`assert` statements that check it on inputs whose correct output you are sure of, including edge "
               "cases, so that a wrong implementation fails. Answer with one ```python block of top-level assert "
               "lines that call the function, e.g. `assert f(2) == 4` (no test framework, no function "
               "definition)."),
    "solo": ("You write a complete, correct Python implementation of the requested function. Answer with the code "
             "in one ```python block (imports and helper functions allowed; no tests, no example calls)."),
}


def stub_program(problem: dict[str, Any]) -> str:
    """The problem's preamble plus an entry point that returns ``None`` for any input."""
    stub = f"def {problem['entry_point']}(*args, **kwargs):\n    return None\n"
    return "\n\n".join(p for p in (problem.get("preamble") or "", stub) if p)


def read_tests(text: str, entry_point: str, max_tests: int) -> tuple[str, list[str]]:
    """(test code, source of each test) from a tester's answer; ``("", [])`` when it has none.

    A test states an exact expected value: a top-level ``assert ENTRY(ARGS) == EXPECTED`` (either side),
    or ``assert ENTRY(ARGS) is True`` / ``False`` / ``None``, whose arguments and expected value are
    literals; at most ``max_tests`` of them, the first ones. Everything else is dropped: checks that do
    not pin a value (``assert ENTRY(x)``, ``!= v``, ``is not None``: a stub fails them, so they would
    pass as useful while checking almost nothing), computed values, setup code. Nothing of the tester's
    code ever runs: its tests are judged by comparing values (see the module docstring).
    """
    tree = safe_parse(extract_code(text))
    if tree is None:
        return "", []
    sources = []
    for stmt in tree.body:
        if len(sources) >= max_tests:
            break
        parts = literal_parts(stmt, entry_point)
        if parts is None:
            continue
        op, _, _, expected = parts
        if not (op == "==" or (op == "is" and any(expected is v for v in (True, False, None)))):
            continue
        try:
            sources.append(ast.unparse(stmt))
        except (RecursionError, ValueError, AttributeError):
            continue
    if not sources:
        return "", []
    return "\n".join(sources) + "\n", sources


class CodeEnv:
    """Coder + unit-test writer (see the module docstring)."""

    simultaneous = False

    def __init__(self, dataset: str = "humaneval", source: str = "auto", data_files: str | None = None,
                 max_turns: int = 3, single_agent: bool = False, max_tests: int = 20, timeout_s: float = 3.0,
                 cache: TestCache | None = None):
        if dataset not in DATASETS:
            raise TaskError(f"task.options.dataset={dataset!r}; choose one of {list(DATASETS)}")
        if dataset == "coophumaneval" and data_files is None:
            raise TaskError("task `code` rewards the tester against a canonical solution and CoopHumanEval has none: "
                            "use task.options.dataset=humaneval or mbpp, or data_files=<records with "
                            "canonical_solution>")
        if source not in SOURCES:
            raise TaskError(f"task.options.source={source!r}; choose one of {list(SOURCES)}")
        if not isinstance(max_turns, int) or max_turns < 1:
            raise TaskError(f"task.options.max_turns={max_turns!r} must be an int >= 1")
        if not isinstance(max_tests, int) or max_tests < 1:
            raise TaskError(f"task.options.max_tests={max_tests!r} must be an int >= 1")
        self.dataset, self.source, self.data_files = dataset, source, data_files
        self.max_turns, self.max_tests, self.single_agent = max_turns, max_tests, single_agent
        self.agents = ("coder",) if single_agent else ("coder", "tester")
        self.name = "code" if dataset == "humaneval" else f"code-{dataset}"
        self.cache = cache if cache is not None else TestCache(SandboxConfig(timeout_s=timeout_s))
        self._problem: dict[str, Any] | None = None
        self._reset_state()

    def _reset_state(self) -> None:
        self._slot = 0            # actions taken (one per step)
        self._turn = 0
        self._done = False
        self._code = ""           # coder's latest normalised code
        self._program: str | None = None
        self._ref: CodeRun | None = None   # coder's latest code on the reference tests
        self._tests = ""          # tester's latest test code
        self._plan: TestPlan | None = None  # its plan: literal inputs and expected values
        self._test_srcs: list[str] = []
        self._gen: CodeRun | None = None   # tester's latest tests on the coder's latest code

    # --- data ------------------------------------------------------------------------------------
    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        """Problems of ``split`` that have a canonical solution (see :mod:`accord.envs.coding.data`)."""
        problems = load_problems(self.dataset, split, source=self.source, data_files=self.data_files, seed=seed)
        usable = [p for p in problems if p.get("canonical")]
        if len(usable) < len(problems):
            logger.warning("%s: %d %s problems have no canonical solution and are left out (the tester's reward "
                           "needs one)", self.name, len(problems) - len(usable), split)
        if problems and not usable:
            raise TaskError(f"{self.name}: no {split} problem has a canonical solution; add canonical_solution "
                            "(HumanEval format) or code (MBPP format) to the records")
        return usable if limit is None else usable[:limit]

    def instructions(self, agent: str) -> str:
        return _INSTRUCTIONS["solo" if self.single_agent else agent]

    # --- observations ----------------------------------------------------------------------------
    def _header(self) -> str:
        body = self._problem["prompt"].strip("\n").rstrip()
        turn = min(self._turn, self.max_turns - 1) + 1
        return f"Problem:\n```python\n{body}\n```\n\nTurn {turn} of {self.max_turns}."

    def _test_lines(self) -> list[str]:
        if not self._test_srcs or self._gen is None:
            return []
        lines = [f"{self._gen.passed}/{self._gen.total} of the tester's tests pass on the current code"
                 + (f" (the program {self._gen.status})" if self._gen.status not in ("ok", "not_run") else "") + ":"]
        for i, src in enumerate(self._test_srcs[:SHOWN_TESTS]):
            ok, err = self._gen.case(i)
            lines.append(f"{'PASS' if ok else 'FAIL'}: {shorten(src, 160)}"
                         + ("" if ok else f" -> {shorten(err or 'did not run', 100)}"))
        if len(self._test_srcs) > SHOWN_TESTS:
            lines.append(f"... and {len(self._test_srcs) - SHOWN_TESTS} more")
        return lines

    def _observe(self, agent: str) -> str:
        p = self._problem
        entry = p["entry_point"]
        parts = [self._header()]
        code = f"```python\n{self._code or '# (no readable code)'}\n```"
        if agent == "coder":
            if self._slot > 0:
                parts.append(f"Your latest code:\n{code}")
            if self.single_agent:
                if self._slot > 0:
                    parts.append("Review your code against the problem and write an improved version.")
            elif self._test_srcs:
                parts.append("\n".join(self._test_lines()))
            elif self._slot > 1:
                parts.append("The tester has written no usable tests yet.")
            parts.append(f"Write the complete function `{p['signature']}` in one ```python block.")
        else:
            parts.append(f"The coder's latest code:\n{code}")
            if self._test_srcs:
                parts.append("Your previous tests on it:\n" + "\n".join(self._test_lines()))
            parts.append(f"Write `assert` statements that call `{entry}` and check its results, in one "
                         "```python block.")
        return "\n\n".join(parts)

    def reset(self, task: dict[str, Any], seed: int = 0) -> dict[str, str]:
        missing = [k for k in ("prompt", "entry_point", "test", "signature", "canonical") if k not in task]
        if missing:
            raise TaskError(f"{self.name}: a task needs {missing} (use the rows of tasks())")
        if not task["canonical"]:
            raise TaskError(f"{self.name}: task {task.get('id')!r} has no canonical solution; the tester's reward "
                            "needs one")
        self._problem = dict(task)
        self._ref_total = len(case_sources(task["test"], task.get("test_entry_point") or None))
        self._reset_state()
        return {a: self._observe(a) for a in self.agents}

    def acting(self) -> tuple[str, ...]:
        return (self.agents[self._slot % len(self.agents)],)

    # --- steps -----------------------------------------------------------------------------------
    def _coder_step(self, text: str) -> tuple[float, float]:
        p = self._problem
        norm = normalise(extract_code(text))
        self._code = norm[0] if norm else ""
        defines = norm is not None and any(d.name == p["entry_point"] for d in function_defs(norm[1]))
        self._program = "\n\n".join(x for x in (p.get("preamble") or "", self._code) if x) + "\n" if defines else None
        jobs = []
        if self._program is not None:
            jobs.append((self._program, suite_of(p)))
            if self._plan is not None:
                jobs.append((self._program, self._plan))
        runs = self.cache.run(jobs) if jobs else []
        previous = self._ref.fraction if self._ref is not None else 0.0
        self._ref = runs[0] if runs else CodeRun.not_run(self._ref_total)
        if self._tests:
            self._gen = runs[1] if len(runs) > 1 else CodeRun.not_run(len(self._test_srcs))
        return self._ref.fraction - previous, self._ref.fraction

    def _tester_step(self, text: str) -> float:
        p = self._problem
        self._tests, self._test_srcs = read_tests(text, p["entry_point"], self.max_tests)
        if not self._tests:
            self._plan, self._gen = None, None
            return 0.0
        self._plan = literal_plan(self._test_srcs, p["entry_point"])
        jobs = [(p["canonical"], self._plan), (stub_program(p), self._plan)]
        if self._program is not None:
            jobs.append((self._program, self._plan))
        runs = self.cache.run(jobs)
        canon, stub = runs[0], runs[1]
        self._gen = runs[2] if len(runs) > 2 else CodeRun.not_run(len(self._test_srcs))
        n = len(self._test_srcs)
        useful = [canon.case(i)[0] and not stub.case(i)[0] for i in range(n)]
        coder_right = self._ref is not None and self._ref.all_passed
        catch = coder_right or any(u and not self._gen.case(i)[0] for i, u in enumerate(useful))
        return sum(useful) / n * (0.5 + 0.5 * catch)

    def step(self, actions: dict[str, str]) -> StepResult:
        check_step_actions(self, actions, started=self._problem is not None, done=self._done)
        agent = self.acting()[0]
        text = actions[agent]
        local = {a: 0.0 for a in self.agents}
        team = 0.0
        if agent == "coder":
            team, local["coder"] = self._coder_step(text)
        else:
            local["tester"] = self._tester_step(text)
        self._slot += 1
        if self._slot % len(self.agents) == 0:
            self._turn += 1
        success = self._ref is not None and self._ref.all_passed
        tests_pass = bool(self._test_srcs) and self._gen is not None and self._gen.all_passed
        ended = success if self.single_agent else tests_pass
        self._done = ended or self._turn >= self.max_turns
        info = {"success": success, "pass_rate": self._ref.fraction if self._ref else 0.0,
                "tests_pass": tests_pass, "n_tests": len(self._test_srcs)}
        return StepResult({a: self._observe(a) for a in self.agents}, team, local, self._done, info)

    def clone(self) -> CodeEnv:
        """An independent copy of the episode state; the result cache (pure results) is shared."""
        other = CodeEnv.__new__(CodeEnv)
        other.__dict__.update(self.__dict__)
        other._problem = dict(self._problem) if self._problem is not None else None
        other._test_srcs = list(self._test_srcs)
        return other


@register_task("code", "AT-GRPO coding: coder writes the function, tester writes asserts (HumanEval, MBPP); "
                       "ends when the generated tests pass on the generated code")
def make_code(dataset: str = "humaneval", source: str = "auto", data_files: str | None = None, max_turns: int = 3,
              single_agent: bool = False, max_tests: int = 20, timeout_s: float = 3.0) -> CodeEnv:
    """The coder + tester environment (``single_agent=True``: the coder alone)."""
    return CodeEnv(dataset=dataset, source=source, data_files=data_files, max_turns=max_turns,
                   single_agent=single_agent, max_tests=max_tests, timeout_s=timeout_s)
