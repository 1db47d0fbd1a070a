"""``humaneval``: MAGRPO's coding task -- a ``helper`` writes ``aux``, a ``main`` agent writes the entry point.

Two agents see the same problem (imports, given helper functions, the entry point's signature and
docstring; data in :mod:`accord.envs.coding.data`). ``helper`` writes one function named ``aux``;
``main`` writes the entry-point function, which may call ``aux`` and must not define it. The program
that is tested is ``preamble + helper's code + main's code`` (the preamble holds the problem's imports
and given helper functions).

Options (``task.options``): ``dataset`` (``humaneval`` | ``coophumaneval`` | ``mbpp``), ``source``
(``auto`` | ``hub`` | ``package``) and ``data_files`` (see :mod:`accord.envs.coding.data`), ``multi_turn``
(false), ``max_turns`` (2) and ``feedback`` (``tests`` | ``passfail`` | ``revise``) for the multi-turn
variant, ``timeout_s`` (3.0: the sandbox's wall-clock limit per program run).

Reading the outputs (static, in the trainer process; nothing is executed)
------------------------------------------------------------------------
Each output goes through :func:`accord.envs.coding.common.extract_code` (Markdown fences, prose
stripped, cut-off code dropped) and :func:`~accord.envs.coding.common.normalise` (only imports,
``def``/``class`` and assignments kept at the top level: example calls and ``__main__`` blocks never run).

Team reward (max :data:`REWARD_MAX` = 4.5), the levels of MAGRPO's reference
-----------------------------------------------------------------------------
- **Format gate** -- else the total is 0: each output, normalised, has exactly one top-level
  ``def``, and that function has a ``return <value>`` in its own body (nested helpers inside it are
  allowed). ``main`` must also not bind the name ``aux`` anywhere in its code, in its function or at the
  top level (nested ``def aux``, ``aux = ...``, a parameter or import named ``aux``): "must not redefine
  it" is part of the format.
- **+0.4** the helper's function is named ``aux``; **+0.6** main's function is named after the entry
  point. Without the entry point nothing can be tested: the total stops here.
- **+0.5** the combined program parses (else stop).
- **+1.0 x pass rate**: the share of the reference asserts that pass (:meth:`Sandbox.run_tests`
  counts every top-level statement of ``check``'s body that contains an ``assert`` as one test;
  HumanEval's ``assert True, "..."`` filler lines are removed by the loader). Every test is judged
  outside the program's process: the program only returns plain values for recorded inputs, and the
  comparison with the expected values happens in the trainer or in a sandbox that runs trusted code
  only (:mod:`accord.sandbox.harness`), so patched builtins, forged reports, early exits and objects
  that compare equal to everything earn nothing.
- **-0.2** when the run timed out (``status == "timeout"``: wall clock or CPU limit).
- Collaboration bonuses, only when ``aux`` is defined, main calls it and at least one test passes
  (the reference's "at least one test passes" gate): **+1.0** ``aux`` is called by main (a call
  ``aux(...)`` anywhere in main's body, static); **+1.0** main is not a trivial wrapper
  (:func:`~accord.envs.coding.common.is_trivial_wrapper`: main's body, docstring removed, is only
  ``return aux(ARGS)`` or ``r = aux(ARGS); return r`` with every argument a bare parameter of main or a
  constant; and :func:`judge_wrapper`: the helper's ``aux`` run as the entry point itself, in the same
  sandbox call, passes every reference test that main's program passes, so ``return aux(x) + 0`` or
  ``int(aux(x))`` is a wrapper too); **-0.5** aux's return value is ignored (some call ``aux(...)`` is a
  whole expression statement, its value thrown away). Calls of ``aux`` do not count when main's program passes
  every reference test it passes with the helper's ``aux`` swapped for a stub that does nothing (one returning
  None, one returning its first argument; :func:`judge_aux_use`, in the same sandbox call): an identity or
  constant ``aux`` that main calls and then solves the problem alone (``numbers = aux(numbers)``, ``_ = aux()``)
  would earn the full 4.5 in the reference's levels, more than a real split, and an ``aux`` whose value is thrown
  away counts only for what it does to its arguments. Nor do calls of ``aux`` count when either agent's
  code can reach the program's names at run time
  (:func:`~accord.envs.coding.common.reaches_names`: ``globals``, ``eval``, ``exec``, ``getattr``,
  ``setattr``, a dunder name or attribute such as ``__code__``, an import of ``sys``, ``inspect``,
  ``builtins``...): with them main could swap the helper's ``aux`` for its own (``globals()['aux'] = f``)
  and aux could tell whether main called it.
- **Cap 2.0** whenever main does not call a defined ``aux`` -- applied whatever the pass rate (the
  reference states it for passing tests; applying it always keeps a partly passing solo ``main`` from
  out-earning a fully passing one). So a correct solution that ignores the helper earns 2.0 and a
  correct collaboration 4.5.
- The total is clipped below at 0.

As in the reference, the collaboration bonuses (up to 2.0) outweigh correctness (1.0): a pair that
calls ``aux`` non-trivially and passes one test in seven earns ~3.6, more than a correct solo ``main``
(2.0): the reward teaches cooperation first, as the paper's does.

"Called" is static: a call in a branch that never runs still counts (as in the reference).

Execution: all programs of a reward batch run in ONE :meth:`Sandbox.run_tests_many` call (identical
``(program, tests)`` pairs once), concurrently, in the sandbox -- never in the trainer. A program that
does not parse, loops forever, floods its output or returns something that is not plain data gets its
status and 0 passes for the affected tests, not an exception. A multi-turn step with ``feedback: tests``
runs its program twice in that call, on the hidden tests and on the examples (a second process of about
20 ms of CPU); the canonical solution runs once per problem on its examples. A pair whose main calls ``aux``
adds up to three programs to the call, on the reference tests: main with each of the two stubs
(:func:`judge_aux_use`) and the helper's ``aux`` alone (:func:`judge_wrapper`).

Single-model baseline (``single_agent: true``): :class:`SingleCoderTask`
-------------------------------------------------------------------------
MAGRPO's single-model baseline: one agent, ``coder``, writes both functions in one completion. The
completion is read like an agent's output (:func:`~accord.envs.coding.common.extract_code`,
:func:`~accord.envs.coding.common.normalise`) and split by :func:`split_single`: the top-level ``def aux``
is the helper's part, the entry-point function main's part, and the completion's top-level imports go
with both; any other top-level statement is dropped. The parts get the team reward above unchanged (a
missing function is an empty part: the format gate gives 0), so the rows of a run read like the
two-agent rows. Single-turn only (with ``multi_turn: true`` use ``algorithm.baseline: centralized``).

Multi-turn variant (``multi_turn: true``): :class:`HelperMainEnv`
------------------------------------------------------------------
A simultaneous environment with the same two roles. Each step takes both outputs, scores the pair as
above and shows each agent feedback in its next observation (with both agents' latest code):

Which tests are which: the problem's **reference tests** (``test``) stay hidden and alone decide the
reward, ``info["success"]`` and ``done``; the feedback of ``tests`` mode comes from the **examples** of
the problem statement, which the agents already see in the prompt
(:func:`statement_examples`: the docstring's doctests and one-line ``f(x) ==> y`` forms, read
statically, kept when the canonical solution passes them), run as their own sandbox job on the same
program. Showing failing hidden asserts would let a policy paste their expected values into a lookup
table (measured before this split: 4.15 of 4.5 on average and "solved" on 11 of the 32 eval problems
at turn 2 without solving any).

- ``feedback: tests``: the agent's static-check messages (e.g. "your function is named `f`, it must be
  named `aux`", "main does not call aux") plus, for the examples, the run's status, ``passed/total``
  and the first three failing examples with their error -- the value the function returned
  (``AssertionError: got 3``) or what it raised. Nothing of the hidden tests: not their sources,
  results, count or status (the examples are not among the hidden tests:
  :func:`~accord.envs.coding.data.drop_shown_tests`). A problem without readable examples (37 of
  HumanEval's 163, e.g. 32, 38, 41) gets the static messages only.
- ``feedback: passfail``: only "all tests passed" / "some tests failed" about the hidden tests, which
  says no more than ``done`` (an episode goes on only while they do not all pass);
- ``feedback: revise``: only "Revise your code.".

The **team reward of a step is the improvement** of the pair's score over the previous step's (the
first step's baseline is 0), so the undiscounted return of an episode is the final score and, with
``gamma < 1`` in MAGRPO's tree (``G = r + gamma * mean(G children)``), reaching a score earlier is
worth slightly more; rewarding the new total at every step would instead pay an episode for lasting
longer. ``done`` when all reference tests pass or after ``max_turns`` turns; ``info["success"]`` = all
reference tests pass. **Local rewards** are improvements too, of each agent's own score: helper
``0.5 * [its output passes the format and defines aux] + 0.5 * [that, and main uses aux's value, and
at least one test passes]`` (max 1); main ``0.5 * [its output passes the format and defines the entry
point] + 1.0 * pass rate`` (max 1.5).
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from accord.envs.registry import Messages, TaskError, register_task
from accord.envs.coding.common import (
    CodeRun,
    TestCache,
    binds_name,
    calls_to,
    docstring_examples,
    extract_code,
    function_defs,
    ignored_calls,
    is_trivial_wrapper,
    normalise,
    reaches_names,
    returns_value,
    safe_parse,
    shorten,
)
from accord.envs.coding.data import DATASETS, SOURCES, load_problems, suite_of
from accord.envs.protocol import StepResult, check_step_actions
from accord.sandbox import SandboxConfig, TestPlan
from accord.sandbox.harness import literal_plan

logger = logging.getLogger(__name__)

__all__ = [
    "AGENTS",
    "FEEDBACK_MODES",
    "REWARD_MAX",
    "HelperMainEnv",
    "HelperMainTask",
    "PairCheck",
    "check_pair",
    "judge_aux_use",
    "judge_wrapper",
    "make_humaneval",
    "pair_levels",
]

AGENTS = ("helper", "main")
AUX = "aux"
REWARD_MAX = 4.5
FEEDBACK_MODES = ("tests", "passfail", "revise")
AUX_DEFINED, MAIN_DEFINED, PARSES, TESTS = 0.4, 0.6, 0.5, 1.0
TIMEOUT_PENALTY, AUX_CALLED, NOT_WRAPPER, IGNORED_PENALTY, NO_AUX_CAP = 0.2, 1.0, 1.0, 0.5, 2.0
SHOWN_FAILURES = 3
# stand-ins for the helper's aux that do nothing (judge_aux_use): main passing as well with one means aux did nothing
AUX_STUBS = ("def aux(*args, **kwargs):\n    return None",
             "def aux(*args, **kwargs):\n    return args[0] if args else next(iter(kwargs.values()), None)")


# --------------------------------------------------------------------------------------------------
# Static checks of one joint action
# --------------------------------------------------------------------------------------------------

@dataclass
class PairCheck:
    """Static analysis of one (helper, main) pair; ``program`` is what the sandbox runs (None: nothing)."""

    helper_code: str = ""
    main_code: str = ""
    helper_ok: bool = False      # format gate of the helper's output
    main_ok: bool = False        # format gate of main's output (includes: does not bind aux)
    aux_defined: bool = False
    main_defined: bool = False
    parses: bool = False
    program: str | None = None
    alone: str | None = None     # the helper's aux run as the entry point itself (see judge_wrapper)
    stubbed: tuple[str, ...] = ()   # main's program with aux swapped for a stub that does nothing (judge_aux_use)
    aux_called: bool = False
    aux_ignored: bool = False
    trivial_wrapper: bool = False
    messages: dict[str, list[str]] = field(default_factory=lambda: {a: [] for a in AGENTS})

    @property
    def gate(self) -> bool:
        return self.helper_ok and self.main_ok


def _single_def(text: str, messages: list[str]) -> tuple[str, ast.FunctionDef | None, ast.Module | None]:
    """(normalised code, its one function, its tree) of an output, or (code, None, tree) with a message why not."""
    code = extract_code(text)
    norm = normalise(code) if code else None
    if norm is None:
        messages.append("No Python code could be read from your answer (write it in one ```python block)."
                        if not code else "Your code does not parse.")
        return "", None, None
    source, tree = norm
    defs = function_defs(tree)
    if len(defs) != 1:
        names = ", ".join(f"`{d.name}`" for d in defs) or "none"
        messages.append(f"Write exactly one top-level function; found {len(defs)} ({names}).")
        return source, None, tree
    if not returns_value(defs[0]):
        messages.append(f"Your function `{defs[0].name}` has no `return <value>` statement.")
        return source, None, tree
    return source, defs[0], tree


def check_pair(helper_text: str, main_text: str, problem: dict[str, Any]) -> PairCheck:
    """Everything about a pair that needs no execution: format gate, names, parse, aux usage."""
    entry = problem["entry_point"]
    c = PairCheck()
    c.helper_code, aux_def, helper_tree = _single_def(helper_text, c.messages["helper"])
    c.main_code, main_def, main_tree = _single_def(main_text, c.messages["main"])
    c.helper_ok = aux_def is not None
    # anywhere in main's code: a top-level `aux = ...` (or import as aux) ran after the helper's code and replaced
    # its aux, so main's own aux earned the collaboration bonuses (4.5 with a helper that returned None)
    if main_def is not None and binds_name(main_tree, AUX):
        c.messages["main"].append("Do not define or assign `aux` in your code: call your teammate's `aux`.")
        main_def = None
    c.main_ok = main_def is not None
    c.aux_defined = aux_def is not None and aux_def.name == AUX
    c.main_defined = main_def is not None and main_def.name == entry
    if aux_def is not None and not c.aux_defined:
        c.messages["helper"].append(f"Your function is named `{aux_def.name}`; it must be named `aux`.")
    if main_def is not None and not c.main_defined:
        c.messages["main"].append(f"Your function is named `{main_def.name}`; it must be named `{entry}`.")
    if not (c.gate and c.main_defined):
        return c
    program = "\n\n".join(p for p in (problem.get("preamble") or "", c.helper_code, c.main_code) if p) + "\n"
    c.parses = safe_parse(program) is not None
    if not c.parses:
        return c
    c.program = program
    c.aux_called = bool(calls_to(main_def, AUX))
    c.aux_ignored = bool(ignored_calls(main_def, AUX))
    # code that can reach the program's names at run time could swap aux for another function (globals()['aux'])
    # or rewrite it (aux.__code__), or let aux tell whether main called it: its calls of aux are not counted
    reaching = {a: reaches_names(tree) for a, tree in (("helper", helper_tree), ("main", main_tree))}
    for a, found in reaching.items():
        if found is not None and c.aux_called:
            c.messages[a].append(f"Do not use `{found}`: code that reaches the program's names at run time does not "
                                 "count as calling `aux`.")
    if any(found is not None for found in reaching.values()):
        c.aux_called = c.aux_ignored = False
    c.trivial_wrapper = c.aux_called and is_trivial_wrapper(main_def, AUX)
    if c.aux_called and c.aux_defined and not c.trivial_wrapper:
        parts = (problem.get("preamble") or "", c.helper_code, f"{entry} = {AUX}")
        c.alone = "\n\n".join(p for p in parts if p) + "\n"
    if c.aux_called and c.aux_defined:
        c.stubbed = tuple("\n\n".join(p for p in (problem.get("preamble") or "", stub, c.main_code) if p) + "\n"
                          for stub in AUX_STUBS)
    if not c.aux_called:
        for a in AGENTS:
            c.messages[a].append("`main` does not call `aux`: the team earns at most 2.0 without it.")
    if c.aux_ignored:
        c.messages["main"].append("You call `aux(...)` but throw its return value away; use it.")
    if c.trivial_wrapper:
        c.messages["main"].append("Your function only forwards to `aux`; do part of the work in it.")
    return c


def judge_aux_use(c: PairCheck, run: CodeRun | None, stubbed: Sequence[CodeRun]) -> None:
    """Count ``c``'s calls of ``aux`` as not made when main's program passes every reference test it passes (``run``)
    with the helper's ``aux`` swapped for a stub that does nothing (``c.stubbed``: one returning None, one returning
    its first argument): the helper's code then did nothing the tests see, however main calls it
    (``numbers = aux(numbers)`` with an identity ``aux``, ``_ = aux()`` with a constant one), and the pair is
    capped as a solo main."""
    if not c.aux_called or run is None or run.passed == 0 or not stubbed:
        return
    for stub in stubbed:
        if all(stub.case(i)[0] for i in range(run.total) if run.case(i)[0]):
            c.aux_called = False
            for a in AGENTS:
                c.messages[a].append("`main` passes the same tests when `aux` is replaced by a function that does "
                                     "nothing: `aux`'s work does not count, and the team earns at most 2.0.")
            return


def judge_runs(c: PairCheck, run: CodeRun | None, probes: Sequence[CodeRun]) -> None:
    """Apply :func:`judge_aux_use` and :func:`judge_wrapper` to ``c`` from the runs of its probes (``c.stubbed``
    then ``c.alone``, as :func:`probe_programs` lists them)."""
    judge_aux_use(c, run, probes[:len(c.stubbed)])
    if c.alone is not None and c.aux_called:
        judge_wrapper(c, run, probes[len(c.stubbed)])


def probe_programs(c: PairCheck) -> list[str]:
    """The programs run beside ``c.program`` on the reference tests to judge it: main with ``aux`` stubbed
    (:func:`judge_aux_use`), then the helper's ``aux`` alone (:func:`judge_wrapper`)."""
    return list(c.stubbed) + ([c.alone] if c.alone is not None else [])


def judge_wrapper(c: PairCheck, run: CodeRun | None, alone: CodeRun | None) -> None:
    """Mark ``c``'s main a trivial wrapper also when the helper's ``aux``, run as the entry point itself
    (``c.alone``), passes every reference test that main's program (``run``) passes: main's own code then added
    nothing the tests see, however it is written (``return aux(x) + 0``, ``int(aux(x))``, ``aux(*[x])``)."""
    if c.trivial_wrapper or run is None or alone is None or run.passed == 0:
        return
    if all(alone.case(i)[0] for i in range(run.total) if run.case(i)[0]):
        c.trivial_wrapper = True
        c.messages["main"].append("Your function adds nothing to what `aux` returns; do part of the work in it.")


def pair_levels(c: PairCheck, run: CodeRun | None) -> dict[str, float]:
    """Each reward level of a checked pair given its test run (None when nothing ran); ``total`` is the
    team reward (see the module docstring)."""
    lv = dict.fromkeys(("aux", "main", "parse", "tests", "timeout", "aux_called", "not_wrapper", "ignored",
                        "cap", "total"), 0.0)
    if not c.gate:
        return lv
    lv["aux"] = AUX_DEFINED * c.aux_defined
    lv["main"] = MAIN_DEFINED * c.main_defined
    if c.main_defined and c.parses and run is not None:
        lv["parse"] = PARSES
        lv["tests"] = TESTS * run.fraction
        lv["timeout"] = -TIMEOUT_PENALTY if run.status == "timeout" else 0.0
        if c.aux_defined and c.aux_called and run.passed > 0:
            lv["aux_called"] = AUX_CALLED
            lv["not_wrapper"] = 0.0 if c.trivial_wrapper else NOT_WRAPPER
            lv["ignored"] = -IGNORED_PENALTY if c.aux_ignored else 0.0
    total = sum(v for k, v in lv.items() if k not in ("cap", "total"))
    if not (c.aux_defined and c.aux_called) and total > NO_AUX_CAP:
        lv["cap"] = NO_AUX_CAP - total
        total = NO_AUX_CAP
    lv["total"] = max(0.0, total)
    return lv


def run_pairs(cache: TestCache, checks: Sequence[PairCheck],
              problems: Sequence[dict[str, Any]]) -> list[CodeRun | None]:
    """Test runs of the pairs that have a program, all in one sandbox call with each pair's probes
    (:func:`probe_programs`, judged by :func:`judge_runs`); None for the others."""
    idx = [i for i, c in enumerate(checks) if c.program is not None]
    probes = {i: probe_programs(checks[i]) for i in idx}
    jobs = ([(checks[i].program, suite_of(problems[i])) for i in idx]
            + [(program, suite_of(problems[i])) for i in idx for program in probes[i]])
    runs = cache.run(jobs) if jobs else []
    out: list[CodeRun | None] = [None] * len(checks)
    for i, r in zip(idx, runs):
        out[i] = r
    at = len(idx)
    for i in idx:
        judge_runs(checks[i], out[i], runs[at:at + len(probes[i])])
        at += len(probes[i])
    return out


# --------------------------------------------------------------------------------------------------
# Prompts and feedback
# --------------------------------------------------------------------------------------------------

_ROLE = {
    "helper": ("You are the helper in a two-agent team writing Python. Write ONE helper function named `aux` "
               "that your teammate's function `{entry}` can call to solve the problem. Write only "
               "`def aux(...)` with a `return` statement: no other function, no tests, no example calls. "
               "Put the code in one ```python block."),
    "main": ("You are the main agent in a two-agent team writing Python. Write the function `{entry}` that "
             "solves the problem, with the signature `{signature}`. Your teammate writes a helper "
             "function `aux` that is available to your code: call it, and do not define `aux` yourself. "
             "Write only `def {entry}(...)` with a `return` statement: no other function, no tests, no "
             "example calls. Put the code in one ```python block."),
}
_INSTRUCTIONS = {
    "helper": ("You are the helper in a two-agent Python team. You write one function named `aux` that your "
               "teammate's main function calls. Answer with only `def aux(...)` (with a `return`) in one "
               "```python block."),
    "main": ("You are the main agent in a two-agent Python team. You write the problem's entry-point function; "
             "your teammate's helper `aux` is available to it: call it, never define it. Answer with only "
             "the entry-point function (with a `return`) in one ```python block."),
}


def _problem_block(problem: dict[str, Any]) -> str:
    body = problem["prompt"].strip("\n").rstrip()
    return f"Problem:\n```python\n{body}\n```"


def _ask(agent: str, problem: dict[str, Any]) -> str:
    return _ROLE[agent].format(entry=problem["entry_point"], signature=problem["signature"])


def _example_lines(examples: TestPlan | None, run: CodeRun | None, limit: int = SHOWN_FAILURES) -> list[str]:
    """Results of the problem statement's own examples (never of the hidden tests, which decide success)."""
    if examples is None:
        return ["The problem statement has no examples that can be run (the tests that decide success are "
                "hidden)."]
    if run is None:
        return ["Examples: not run (fix the problems above first)."]
    lines = []
    if run.status not in ("ok", "not_run"):
        what = {"timeout": "timed out (an infinite loop or too slow)", "syntax_error": "has a syntax error",
                "output_limit": "printed too much output", "memory": "ran out of memory",
                "error": "raised an exception before the examples", "killed": "was killed"}
        lines.append(f"On the examples, the program {what.get(run.status, run.status)}.")
    lines.append(f"Examples from the problem statement: {run.passed}/{run.total} passed (the tests that decide "
                 "success are hidden).")
    sources = [st.source for st in examples.statements if st.is_test]
    shown = 0
    for i in range(run.total):
        ok, err = run.case(i)
        if ok:
            continue
        src = sources[i] if i < len(sources) else f"example {i}"
        lines.append(f"FAILED: {shorten(src, 160)} -> {shorten(err or 'did not run', 120)}")
        shown += 1
        if shown >= limit:
            break
    return lines


def feedback(agent: str, mode: str, c: PairCheck, run: CodeRun | None, examples: TestPlan | None = None,
             example_run: CodeRun | None = None) -> str:
    """The feedback text ``agent`` sees after a joint action (see the module docstring for the modes):
    ``run`` is the hidden tests' run (only ``passfail`` reads it, for what ``done`` already says),
    ``example_run`` the run of ``examples``, the problem statement's own examples."""
    if mode == "revise":
        return "Revise your code."
    if mode == "passfail":
        return "All tests passed." if run is not None and run.all_passed else "Some tests failed."
    return "\n".join(c.messages[agent] + _example_lines(examples, example_run))


class _ExamplePlans:
    """The plans of the statements' examples, by problem, shared by an environment and its clones: pure results
    of the statement, so the rollout audit (:func:`accord.audit.state_fingerprint`) does not count them as
    episode state (a sibling that plans them first does not make two equal states look different)."""

    def __init__(self) -> None:
        self.plans: dict[tuple, TestPlan | None] = {}

    def fingerprint(self) -> str:
        return "ExamplePlans"


def statement_examples(problem: dict[str, Any], cache: TestCache) -> TestPlan | None:
    """The plan of the problem statement's examples (:func:`~accord.envs.coding.common.docstring_examples`)
    that its canonical solution passes (all of them when it has none: HumanEval/47's and /148's own
    docstrings are wrong); None when there are none."""
    entry = problem["entry_point"]
    tests = docstring_examples(problem["prompt"], entry)
    plan = literal_plan(tests, entry) if tests else None
    if plan is not None and problem.get("canonical"):
        run = cache.run([(problem["canonical"], plan)])[0]
        kept = [t for i, t in enumerate(tests) if run.case(i)[0]]
        plan = literal_plan(kept, entry) if kept else None
    return plan


# --------------------------------------------------------------------------------------------------
# Single-turn task
# --------------------------------------------------------------------------------------------------

def _check_options(dataset: str, source: str, feedback_mode: str, max_turns: int) -> None:
    if dataset not in DATASETS:
        raise TaskError(f"task.options.dataset={dataset!r}; choose one of {list(DATASETS)}")
    if source not in SOURCES:
        raise TaskError(f"task.options.source={source!r}; choose one of {list(SOURCES)}")
    if feedback_mode not in FEEDBACK_MODES:
        raise TaskError(f"task.options.feedback={feedback_mode!r}; choose one of {list(FEEDBACK_MODES)}")
    if not isinstance(max_turns, int) or max_turns < 1:
        raise TaskError(f"task.options.max_turns={max_turns!r} must be an int >= 1")


class HelperMainTask:
    """Single-turn MAGRPO coding task: see the module docstring for the reward."""

    agents = AGENTS

    def __init__(self, dataset: str = "humaneval", source: str = "auto", data_files: str | None = None,
                 timeout_s: float = 3.0):
        _check_options(dataset, source, "tests", 1)
        self.dataset, self.source, self.data_files = dataset, source, data_files
        self.name = "humaneval" if dataset == "humaneval" else f"humaneval-{dataset}"
        self.cache = TestCache(SandboxConfig(timeout_s=timeout_s), max_entries=0)

    def rows(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        """Problems of ``split`` (see :func:`accord.envs.coding.data.load_problems`)."""
        return load_problems(self.dataset, split, source=self.source, data_files=self.data_files, limit=limit,
                             seed=seed)

    def prompt(self, agent: str, row: dict[str, Any]) -> Messages:
        """One user message: the agent's role and format, then the problem."""
        if agent not in AGENTS:
            raise ValueError(f"unknown agent {agent!r}; the humaneval task has {AGENTS}")
        return [{"role": "user", "content": f"{_ask(agent, row)}\n\n{_problem_block(row)}"}]

    def score(self, helper_texts: Sequence[str], main_texts: Sequence[str],
              problems: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
        """Reward levels of each (helper, main, problem) triple; one sandbox call for all of them."""
        checks = [check_pair(h, m, p) for h, m, p in zip(helper_texts, main_texts, problems)]
        runs = run_pairs(self.cache, checks, problems)
        return [pair_levels(c, r) for c, r in zip(checks, runs)]

    def reward(self, *, prompts=None, completions: dict, agents: tuple[str, ...], **columns) -> list[float]:
        """Team reward per joint action (TRL-style batch call; ``columns`` carry the problem fields)."""
        return [lv["total"] for lv in self.reward_components(prompts=prompts, completions=completions, agents=agents,
                                                             **columns)]

    def reward_components(self, *, prompts=None, completions: dict, agents: tuple[str, ...],
                          **columns) -> list[dict[str, float]]:
        """The reward's stages per joint action (:func:`pair_levels`; ``total`` is the team reward), logged by
        the trainer as ``reward/<stage>``."""
        missing = [a for a in AGENTS if a not in completions]
        if missing:
            raise KeyError(f"completions lack agent(s) {missing}; the humaneval task's agents are {AGENTS} "
                           f"(got {sorted(completions)})")
        helper, main = completions["helper"], completions["main"]
        if len(helper) != len(main):
            raise ValueError(f"helper and main have {len(helper)} and {len(main)} completions; one each per "
                             "joint action")
        n = len(helper)
        problems = [{k: v[j] for k, v in columns.items()} for j in range(n)]
        return self.score(helper, main, problems)

    def success(self, *, prompts=None, completions: dict, agents: tuple[str, ...], **columns) -> list[bool]:
        """Whether each joint action's combined program passes every test (for ``accord eval``'s pass@k)."""
        helper, main = completions["helper"], completions["main"]
        problems = [{k: v[j] for k, v in columns.items()} for j in range(len(helper))]
        return [lv["tests"] >= TESTS - 1e-9 for lv in self.score(helper, main, problems)]


CODER = "coder"
_SINGLE = ("Write Python that solves the problem in exactly two functions, in one ```python block: a helper "
           "function named `aux` with a `return` statement, and the function `{entry}` with the signature "
           "`{signature}`, which calls `aux` and uses its return value. Do not write tests or example calls.")


def split_single(text: str, entry_point: str) -> tuple[str, str]:
    """(helper part, main part) of one completion that should define ``aux`` and ``entry_point``."""
    norm = normalise(extract_code(text))
    if norm is None:
        return "", ""
    _, tree = norm
    imports = [stmt for stmt in tree.body if isinstance(stmt, (ast.Import, ast.ImportFrom))]
    parts = []
    for name in (AUX, entry_point):
        funcs = [f for f in function_defs(tree) if f.name == name]
        parts.append(ast.unparse(ast.Module(body=imports + funcs[:1], type_ignores=[])) if funcs else "")
    return parts[0], parts[1]


class SingleCoderTask(HelperMainTask):
    """MAGRPO's single-model baseline of the coding task: one ``coder`` writes ``aux`` and the entry point."""

    agents = (CODER,)

    def __init__(self, dataset: str = "humaneval", source: str = "auto", data_files: str | None = None,
                 timeout_s: float = 3.0):
        super().__init__(dataset=dataset, source=source, data_files=data_files, timeout_s=timeout_s)
        self.name += "-single"

    def prompt(self, agent: str, row: dict[str, Any]) -> Messages:
        if agent != CODER:
            raise ValueError(f"unknown agent {agent!r}; the single-model humaneval task has one agent, {CODER!r}")
        ask = _SINGLE.format(entry=row["entry_point"], signature=row["signature"])
        return [{"role": "user", "content": f"{ask}\n\n{_problem_block(row)}"}]

    def _split(self, completions: dict, columns: dict) -> tuple[list[str], list[str], list[dict[str, Any]]]:
        if CODER not in completions:
            raise KeyError(f"completions lack agent {CODER!r}; the single-model humaneval task has one agent "
                           f"(got {sorted(completions)})")
        texts = completions[CODER]
        problems = [{k: v[j] for k, v in columns.items()} for j in range(len(texts))]
        pairs = [split_single(t, p["entry_point"]) for t, p in zip(texts, problems)]
        return [h for h, _ in pairs], [m for _, m in pairs], problems

    def reward(self, *, prompts=None, completions: dict, agents: tuple[str, ...], **columns) -> list[float]:
        """Team reward of each completion's two parts (see the module docstring)."""
        helper, main, problems = self._split(completions, columns)
        return [lv["total"] for lv in self.score(helper, main, problems)]

    def reward_components(self, *, prompts=None, completions: dict, agents: tuple[str, ...],
                          **columns) -> list[dict[str, float]]:
        """The reward's stages of each completion's two parts (``total`` is the team reward)."""
        helper, main, problems = self._split(completions, columns)
        return self.score(helper, main, problems)

    def success(self, *, prompts=None, completions: dict, agents: tuple[str, ...], **columns) -> list[bool]:
        helper, main, problems = self._split(completions, columns)
        return [lv["tests"] >= TESTS - 1e-9 for lv in self.score(helper, main, problems)]


# --------------------------------------------------------------------------------------------------
# Multi-turn environment
# --------------------------------------------------------------------------------------------------

class HelperMainEnv:
    """Multi-turn, simultaneous helper + main coding environment (see the module docstring)."""

    simultaneous = True
    agents = AGENTS

    def __init__(self, dataset: str = "humaneval", source: str = "auto", data_files: str | None = None,
                 max_turns: int = 2, feedback: str = "tests", timeout_s: float = 3.0,
                 cache: TestCache | None = None):
        _check_options(dataset, source, feedback, max_turns)
        self.dataset, self.source, self.data_files = dataset, source, data_files
        self.max_turns, self.feedback = max_turns, feedback
        self.name = "humaneval-mt" if dataset == "humaneval" else f"humaneval-{dataset}-mt"
        self.cache = cache if cache is not None else TestCache(SandboxConfig(timeout_s=timeout_s))
        self._examples = _ExamplePlans()  # per problem; shared with clones (pure results)
        self._problem: dict[str, Any] | None = None
        self._turn = 0
        self._done = False
        self._score = 0.0
        self._local = {a: 0.0 for a in AGENTS}
        self._code = {a: "" for a in AGENTS}
        self._feedback = {a: "" for a in AGENTS}

    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        """Problems of ``split`` (see :func:`accord.envs.coding.data.load_problems`)."""
        return load_problems(self.dataset, split, source=self.source, data_files=self.data_files, limit=limit,
                             seed=seed)

    def instructions(self, agent: str) -> str:
        return _INSTRUCTIONS[agent]

    def _observe(self, agent: str) -> str:
        p = self._problem
        parts = [_problem_block(p), f"Turn {self._turn + 1} of {self.max_turns}."]
        if self._turn > 0:
            other = AGENTS[1 - AGENTS.index(agent)]
            parts.append(f"Your previous code:\n```python\n{self._code[agent] or '# (none readable)'}\n```")
            parts.append(f"Your teammate's ({other}) previous code:\n```python\n"
                         f"{self._code[other] or '# (none readable)'}\n```")
            parts.append(f"Feedback:\n{self._feedback[agent]}")
            parts.append("Write your improved code.")
        parts.append(_ask(agent, p))
        return "\n\n".join(parts)

    def reset(self, task: dict[str, Any], seed: int = 0) -> dict[str, str]:
        for key in ("prompt", "entry_point", "test", "signature"):
            if key not in task:
                raise TaskError(f"{self.name}: a task needs {key!r} (use the rows of tasks())")
        self._problem = dict(task)
        self._turn, self._done, self._score = 0, False, 0.0
        self._local = {a: 0.0 for a in AGENTS}
        self._code = {a: "" for a in AGENTS}
        self._feedback = {a: "" for a in AGENTS}
        return {a: self._observe(a) for a in AGENTS}

    def acting(self) -> tuple[str, ...]:
        return AGENTS

    def step(self, actions: dict[str, str]) -> StepResult:
        check_step_actions(self, actions, started=self._problem is not None, done=self._done)
        texts = {a: actions[a] for a in AGENTS}
        p = self._problem
        c = check_pair(texts["helper"], texts["main"], p)
        examples = self._examples_of(p) if self.feedback == "tests" else None
        jobs = [] if c.program is None else [(c.program, suite_of(p))] + ([(c.program, examples)] if examples else [])
        probes = probe_programs(c) if jobs else []
        jobs += [(program, suite_of(p)) for program in probes]
        runs = self.cache.run(jobs) if jobs else []
        run = runs[0] if runs else None
        example_run = runs[1] if examples and len(runs) > 1 else None
        if probes:
            judge_runs(c, run, runs[len(runs) - len(probes):])
        levels = pair_levels(c, run)
        passed_any = run is not None and run.passed > 0
        local_now = {
            "helper": 0.5 * (c.helper_ok and c.aux_defined)
            + 0.5 * (c.helper_ok and c.aux_defined and c.aux_called and not c.aux_ignored and passed_any),
            "main": 0.5 * (c.main_ok and c.main_defined) + 1.0 * (run.fraction if run is not None else 0.0),
        }
        team = levels["total"] - self._score
        local = {a: local_now[a] - self._local[a] for a in AGENTS}
        self._score, self._local = levels["total"], local_now
        self._code = {"helper": c.helper_code, "main": c.main_code}
        self._feedback = {a: feedback(a, self.feedback, c, run, examples, example_run) for a in AGENTS}
        self._turn += 1
        success = run is not None and run.all_passed
        self._done = success or self._turn >= self.max_turns
        info = {"success": success, "score": levels["total"], "pass_rate": run.fraction if run else 0.0,
                "status": run.status if run else "not_run"}
        return StepResult({a: self._observe(a) for a in AGENTS}, team, local, self._done, info)

    def _examples_of(self, problem: dict[str, Any]) -> TestPlan | None:
        key = tuple(problem.get(k) or "" for k in ("prompt", "entry_point", "canonical"))
        plans = self._examples.plans
        if key not in plans:
            plans[key] = statement_examples(problem, self.cache)
        return plans[key]

    def clone(self) -> HelperMainEnv:
        """An independent copy of the episode state; the result cache (pure results) is shared."""
        other = HelperMainEnv.__new__(HelperMainEnv)
        other.__dict__.update(self.__dict__)
        other._problem = dict(self._problem) if self._problem is not None else None
        other._local, other._code, other._feedback = dict(self._local), dict(self._code), dict(self._feedback)
        return other


@register_task("humaneval", "MAGRPO coding: helper writes aux(), main writes the entry point (HumanEval, "
                            "CoopHumanEval, MBPP); multi_turn=true for turns with feedback on the statement's "
                            "examples")
def make_humaneval(dataset: str = "humaneval", source: str = "auto", data_files: str | None = None,
                   multi_turn: bool = False, max_turns: int = 2, feedback: str = "tests",
                   timeout_s: float = 3.0, single_agent: bool = False):
    """The single-turn task, or with ``multi_turn=True`` the simultaneous multi-turn environment;
    ``single_agent=True``: MAGRPO's single-model baseline (one ``coder`` writes both functions)."""
    if not isinstance(single_agent, bool):
        raise TaskError(f"task.options.single_agent={single_agent!r}: must be true or false")
    if single_agent:
        if multi_turn:
            raise TaskError("task.options.single_agent=true is the single-turn single-model baseline; with "
                            "multi_turn=true use algorithm.baseline=centralized (one model writes both roles)")
        _check_options(dataset, source, feedback, max_turns)
        return SingleCoderTask(dataset=dataset, source=source, data_files=data_files, timeout_s=timeout_s)
    if multi_turn:
        return HelperMainEnv(dataset=dataset, source=source, data_files=data_files, max_turns=max_turns,
                             feedback=feedback, timeout_s=timeout_s)
    _check_options(dataset, source, feedback, max_turns)
    return HelperMainTask(dataset=dataset, source=source, data_files=data_files, timeout_s=timeout_s)
