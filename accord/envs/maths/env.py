r"""``math``: AT-GRPO's math task -- a tool agent that writes Python and a reasoner, turn-based.

Roles, in turn order (``agents = ("tool", "reasoner")``):

- **tool**: writes a Python program in a fenced block (```` ```python ... ``` ````; the last such
  block of its reply; a block cut off by the token limit counts). accord runs it in
  :class:`accord.sandbox.Sandbox` -- a separate, contained process with the standard library only,
  no input, no network, ``code_timeout_s`` seconds (default 5) -- never in the trainer. Its answer is
  the last non-empty line of the program's stdout (an ``Answer: 42`` or ``\boxed{42}`` line is read
  through :func:`accord.envs.maths.answer.tool_answer`); a program that fails (exception, syntax error,
  timeout, memory, output flood, signal) has no answer.
- **reasoner**: sees the problem, the tool agent's program, its output (stdout tail, or the failure
  and the last lines of the traceback, truncated) and answer, and gives a final answer in
  ``\boxed{}`` (:func:`accord.envs.maths.answer.extract_answer`).

Every reading and comparison of an answer runs through :mod:`accord.envs.maths.timebox`: in a helper
process, within 2 s per check (past that the check counts as failed: no answer, not correct), so no
model text can raise out of :meth:`MathEnv.step` or stall it.

An episode ends as soon as both agents' latest answers exist and agree
(:func:`accord.envs.maths.answer.answers_equal`), checked after every step, or after ``max_turns``
turns (default 4), as in the paper. ``single_agent=True``: one ``reasoner`` alone (no tool, no
program); its episode ends at its first readable answer, or after ``max_turns`` turns of unreadable
ones. Nobody is told whether an answer is correct: the observations carry the other agent's work and
format feedback only.

Rewards (increments; an agent's latest answer is the one in its latest reply, so a reply without a
readable answer withdraws the previous one)

- **team** = correctness of the reasoner's current answer, as a potential difference: a reasoner step
  earns ``c' - c`` where ``c`` (0 or 1) says whether its answer was correct before the step and ``c'``
  after it. So +1.0 at the step it first becomes correct, 0 while it stays correct or stays wrong,
  and -1.0 if a correct answer is replaced by a wrong or unreadable one; the team return of an episode
  is 1.0 exactly when it ends with a correct reasoner answer (``info["success"]``). Tool steps earn 0
  (the brief asked for "+1.0 at the step it first becomes correct"; the -1 on losing it is our
  addition, so that the return equals success).
- **local**, tool: +1.0 if its printed answer is correct; -0.1 if it wrote a program that failed
  (``error``, ``syntax_error``, ``timeout``, ``memory``, ``output_limit``, ``killed``); 0 for a reply
  without a program, a program that printed nothing, or a sandbox failure of ours.
- **local**, reasoner: +1.0 if its answer is correct, else 0 (no readable answer: 0).

With AT-GRPO's ``r = alpha * team + local`` a reasoner candidate that first gets it right earns
``alpha + 1``, one that keeps a right answer 1, one that loses it ``-alpha``.

``info``: ``success`` (the reasoner's current answer is correct), ``agree``, ``turn``, ``agent``,
``answer`` (what the acting agent's reply was read as), ``parse_error`` per agent (no program / no
answer), and for tool steps ``tool_status`` (a sandbox status or ``no_code``).

Costs: one sandbox run per tool step (a new process; ``bench/README.md`` has its cost). Results are
cached per (program text, timeout) in a process-wide LRU (4096 programs): a program has no input, so
its output depends on its text only; the cache makes branching on clones and repeated candidates
cheap and keeps the answer to a given program the same within a run. Sandbox failures
(``sandbox_error``) are not cached.

Data: :mod:`accord.envs.maths.data` (``source`` = ``auto``, ``reasoning_gym``, ``gsm8k``, ``math``,
``aime``; ``data_files``; ``datasets`` for reasoning-gym). Tasks are ``{"id", "question", "answer",
"source", ...}`` rows; an optional ``check`` selects the answer check
(:func:`accord.envs.maths.answer.check_answer`).
"""

from __future__ import annotations

import copy
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from accord.envs import tool_programs
from accord.envs.registry import TaskError, register_task
from accord.envs.maths.answer import CHECK_MODES
from accord.envs.maths.timebox import answers_equal, check_answer, extract_answer, tool_answer
from accord.envs.maths.data import DEFAULT_RG_DATASETS, SOURCES, load_math_rows
from accord.envs.protocol import StepResult, check_step_actions

logger = logging.getLogger(__name__)

__all__ = ["ERROR_PENALTY", "FAILED_STATUSES", "MathEnv", "ToolRun", "extract_code", "run_program"]

TOOL, REASONER = "tool", "reasoner"
ERROR_PENALTY = -0.1
FAILED_STATUSES = frozenset({"error", "syntax_error", "timeout", "memory", "output_limit", "killed"})
NO_CODE = "no_code"
_SHOW_STDOUT, _SHOW_ERROR, _SHOW_CODE, _SHOW_REPLY = 600, 400, 1500, 500


# ---------------------------------------------------------------------------------------------------
# programs
# ---------------------------------------------------------------------------------------------------

_TAG = re.compile(r"[ \t]*([A-Za-z0-9_+.-]*)")


def _fences(text: str) -> list[tuple[str, str]]:
    r"""(tag, body) of each closed fenced block: ```` ``` ```` and a tag after optional blanks, the rest of that line,
    then the body up to the next ```` ``` ````, scanning on after it: what ``re.findall(r"```[ \t]*([A-Za-z0-9_+.-]*)
    [^\n]*\n(.*?)```", text, re.S)`` finds, in one pass (that regex backtracks quadratically on a long first
    line without a newline)."""
    found, pos = [], 0
    while (start := text.find("```", pos)) >= 0:
        newline = text.find("\n", start + 3)
        close = -1 if newline < 0 else text.find("```", newline + 1)
        if close < 0:   # no later fence has a newline and a closing fence after it either
            break
        found.append((_TAG.match(text, start + 3, newline).group(1), text[newline + 1:close]))
        pos = close + 3
    return found


_PY_TAGS = {"python", "py", "python3", ""}


def extract_code(text: str) -> str | None:
    """The program in ``text``: the last closed ```` ```python ```` (or untagged) block, else a trailing
    block that was never closed (cut off by the token limit); None when there is none or it is blank."""
    if not isinstance(text, str):
        return None
    blocks = [body for tag, body in _fences(text) if tag.lower() in _PY_TAGS]
    if blocks:
        code = blocks[-1]
    else:
        fences = [m.end() for m in re.finditer(r"```", text)]
        if len(fences) % 2 == 0:
            return None
        header, _, code = text[fences[-1]:].partition("\n")
        if header.strip().lower() not in _PY_TAGS:
            return None
    code = code.strip("\n")
    return code if code.strip() else None


@dataclass(frozen=True)
class ToolRun:
    """What one tool program did, as the env keeps it."""

    status: str                 # a sandbox status (accord.sandbox.STATUSES) or "no_code"
    stdout: str = ""
    error: str = ""             # failure summary: the last lines of stderr, paths of the sandbox removed
    answer: str | None = None   # the last line printed, when the program succeeded


def run_program(code: str, timeout_s: float = 5.0) -> ToolRun:
    """Run ``code`` in the sandbox (cached per program text and timeout: :mod:`accord.envs.tool_programs`)."""
    result = tool_programs.run_program(code, timeout_s=timeout_s, memory_mb=512, what="math")
    answer = tool_answer(result.stdout) if result.status == "ok" else None
    error = "" if result.status == "ok" else tool_programs.clean_error(result.stderr, result.exception, _SHOW_ERROR)
    return ToolRun(result.status, result.stdout, error, answer)


def _describe(run: ToolRun, timeout_s: float) -> str:
    if run.status == NO_CODE:
        return "No ```python block was found in the tool agent's reply, so nothing ran."
    if run.status == "ok":
        out = run.stdout.strip("\n")
        if not out.strip():
            return "The program ran and printed nothing."
        if len(out) > _SHOW_STDOUT:
            out = f"[... {len(out) - _SHOW_STDOUT} characters cut]\n" + out[-_SHOW_STDOUT:]
        return f"The program ran. Output:\n{out}"
    what = {"error": "stopped with an error", "syntax_error": "has a syntax error",
            "timeout": f"timed out (limit {timeout_s:g} s) and was stopped", "memory": "ran out of memory",
            "output_limit": "printed too much and was stopped", "killed": "was killed",
            "sandbox_error": "could not be run (sandbox failure)"}.get(run.status, run.status)
    return f"The program {what}; no answer." + (f"\n{run.error}" if run.error else "")


# ---------------------------------------------------------------------------------------------------
# the environment
# ---------------------------------------------------------------------------------------------------

_TOOL_PROMPT = (
    "You are the tool agent of a two-agent team solving a math problem. Write one Python program that "
    "computes the answer and prints it, in a single ```python fenced block. The last line your program "
    "prints is your answer, so print the final value last (exact when possible: an integer, or a "
    "fractions.Fraction). The program runs with the Python standard library only (math, fractions, "
    "itertools, ...), without input, for at most {timeout:g} seconds. Your teammate, the reasoner, sees your "
    "program and its output; you see the reasoner's answer. The task ends when your two answers agree.")
_REASONER_PROMPT = (
    "You are the reasoner of a two-agent team solving a math problem. Your teammate, the tool agent, writes "
    "and runs a Python program for it; you see the program and its output, which may be wrong. Reason step "
    "by step, check the result, and end your reply with your final answer in \\boxed{{}}, for example "
    "\\boxed{{42}}. The task ends when your answer agrees with the tool agent's.")
_SOLO_PROMPT = (
    "Solve the math problem. Reason step by step and end your reply with your final answer in \\boxed{}, "
    "for example \\boxed{42}.")


@dataclass
class MathState:
    question: str
    reference: str
    check: str
    code: str | None = None             # the tool agent's latest program
    run: ToolRun | None = None          # what it did
    tool_answer: str | None = None
    reasoner_reply: str | None = None   # the reasoner's latest reply (shown, cut, to the tool agent)
    reasoner_answer: str | None = None
    reasoner_correct: bool = False
    notes: dict[str, str] = field(default_factory=dict)  # format feedback per agent


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TaskError(f"task.options.{name}={value!r}: must be true or false")
    return value


class MathEnv:
    """The math environment: see the module docstring."""

    name = "math"
    simultaneous = False

    def __init__(self, source: str = "auto", data_files: Any = None, max_turns: int = 4, single_agent: bool = False,
                 datasets: Sequence[Any] = DEFAULT_RG_DATASETS, code_timeout_s: float = 5.0):
        if source not in SOURCES:
            raise TaskError(f"task.options.source={source!r}: choose one of {list(SOURCES)}")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise TaskError(f"task.options.max_turns={max_turns!r}: must be an integer >= 1")
        if isinstance(code_timeout_s, bool) or not isinstance(code_timeout_s, (int, float)) \
                or not 0 < code_timeout_s <= 120:
            raise TaskError(f"task.options.code_timeout_s={code_timeout_s!r}: must be a number of seconds in (0, 120]")
        if isinstance(datasets, (str, dict)) or not isinstance(datasets, (list, tuple)) or not datasets:
            raise TaskError(f"task.options.datasets={datasets!r}: give a non-empty list of reasoning-gym dataset "
                            f"names, e.g. {list(DEFAULT_RG_DATASETS[:3])}")
        self.source = source
        self.data_files = data_files
        self.max_turns = max_turns
        self.single_agent = _check_bool("single_agent", single_agent)
        self.datasets = tuple(datasets)
        self.code_timeout_s = float(code_timeout_s)
        self.agents: tuple[str, ...] = (REASONER,) if single_agent else (TOOL, REASONER)
        self._state: MathState | None = None
        self._slot = 0
        self._turn = 0
        self._done = False

    # data ------------------------------------------------------------------------------------------
    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        """Problems of ``split`` (see :mod:`accord.envs.maths.data`); ``source=auto`` is pinned to the source
        of the first call, so train and eval come from one corpus."""
        try:
            rows = load_math_rows(split, source=self.source, limit=limit, seed=seed, data_files=self.data_files,
                                  datasets=self.datasets)
        except ValueError as err:
            raise TaskError(str(err)) from err
        if self.source == "auto" and rows and self.data_files is None:
            self.source = rows[0]["source"]
        return rows

    def instructions(self, agent: str) -> str:
        if agent not in self.agents:
            raise ValueError(f"math: unknown agent {agent!r}; agents are {list(self.agents)}")
        if self.single_agent:
            return _SOLO_PROMPT
        return _TOOL_PROMPT.format(timeout=self.code_timeout_s) if agent == TOOL else _REASONER_PROMPT.format()

    # protocol --------------------------------------------------------------------------------------
    def reset(self, task: dict[str, Any], seed: int = 0) -> dict[str, str]:
        """Start an episode on ``task`` (nothing is random: ``seed`` changes nothing)."""
        question, reference = task.get("question"), task.get("answer")
        if not isinstance(question, str) or not question.strip() or not isinstance(reference, str) \
                or not reference.strip():
            raise TaskError(f"math: task {task.get('id')!r} needs non-empty 'question' and 'answer' strings "
                            "(rows from MathEnv.tasks or accord.envs.maths.data.load_math_rows)")
        check = task.get("check", "math")
        if check not in CHECK_MODES:
            raise TaskError(f"math: task {task.get('id')!r} has check={check!r}; use one of {list(CHECK_MODES)}")
        self._state = MathState(question.strip(), reference.strip(), check)
        self._slot, self._turn, self._done = 0, 0, False
        return self._observations()

    def acting(self) -> tuple[str, ...]:
        return (self.agents[self._slot],)

    def clone(self) -> "MathEnv":
        """An independent copy: options are shared (immutable), the episode state is deep-copied."""
        other = copy.copy(self)
        other._state = copy.deepcopy(self._state)
        return other

    def step(self, actions: dict[str, str]) -> StepResult:
        check_step_actions(self, actions, started=self._state is not None, done=self._done)
        agent = self.agents[self._slot]
        text = actions[agent]
        s = self._state
        local = dict.fromkeys(self.agents, 0.0)
        team = 0.0
        info: dict[str, Any] = {}
        if agent == TOOL:
            code = extract_code(text)
            run = ToolRun(NO_CODE) if code is None else run_program(code, self.code_timeout_s)
            s.code, s.run, s.tool_answer = code, run, run.answer
            correct = run.answer is not None and check_answer(run.answer, s.reference, s.check)
            local[TOOL] = (1.0 if correct else 0.0) + (ERROR_PENALTY if run.status in FAILED_STATUSES else 0.0)
            s.notes[TOOL] = "" if code is not None else \
                "Your last reply had no ```python block, so nothing ran. Put your whole program in one block."
            info.update(tool_status=run.status, answer=run.answer, parse_error={TOOL: code is None})
            self._slot = 1
        else:
            answer = extract_answer(text)
            correct = answer is not None and check_answer(answer, s.reference, s.check)
            team = float(correct) - float(s.reasoner_correct)
            local[REASONER] = 1.0 if correct else 0.0
            s.reasoner_answer, s.reasoner_correct = answer, correct
            s.reasoner_reply = text
            s.notes[REASONER] = "" if answer is not None else \
                "Your last reply had no final answer; end it with \\boxed{your answer}."
            info.update(answer=answer, parse_error={REASONER: answer is None})
            self._turn += 1
            self._slot = 0
        agree = (not self.single_agent and s.tool_answer is not None and s.reasoner_answer is not None
                 and answers_equal(s.tool_answer, s.reasoner_answer))
        if agree or (self.single_agent and s.reasoner_answer is not None) or \
                (agent == self.agents[-1] and self._turn >= self.max_turns):
            self._done = True
        info.update(success=s.reasoner_correct, agree=agree, turn=self._turn, agent=agent)
        return StepResult(self._observations(), team, local, self._done, info)

    # observations ----------------------------------------------------------------------------------
    def _observations(self) -> dict[str, str]:
        return {a: self._observe(a) for a in self.agents}

    def _observe(self, agent: str) -> str:
        s = self._state
        turn = min(self._turn + 1, self.max_turns)
        parts = [f"Problem:\n{s.question}", f"Turn {turn} of {self.max_turns}."]
        if self._done:
            parts[-1] = "The episode is over."
        if self.single_agent:
            pass  # the problem and the format note below are all a lone reasoner sees
        elif agent == TOOL:
            if s.run is not None:
                parts.append("Your previous program: " + _describe(s.run, self.code_timeout_s))
                parts.append(f"Your previous answer: {s.tool_answer if s.tool_answer is not None else 'none'}")
            if s.reasoner_reply is not None:
                reply = s.reasoner_reply.strip()
                if len(reply) > _SHOW_REPLY:
                    reply = "[...] " + reply[-_SHOW_REPLY:]
                parts.append(f"The reasoner's latest reply (end):\n{reply}")
                parts.append("The reasoner's answer: " + (s.reasoner_answer or "none (no \\boxed{} answer)"))
            else:
                parts.append("The reasoner has not answered yet.")
        else:
            if s.run is None:
                parts.append("The tool agent has not run a program yet.")
            else:
                if s.code is not None:
                    code = s.code if len(s.code) <= _SHOW_CODE else s.code[:_SHOW_CODE] + "\n# [... cut]"
                    parts.append(f"The tool agent's program:\n```python\n{code}\n```")
                parts.append(_describe(s.run, self.code_timeout_s))
                parts.append("The tool agent's answer (last line printed): "
                             + (s.tool_answer if s.tool_answer is not None else "none"))
            if s.reasoner_reply is not None:
                parts.append(f"Your previous answer: {s.reasoner_answer if s.reasoner_answer is not None else 'none'}")
        if not self.single_agent and s.tool_answer is not None and s.reasoner_answer is not None \
                and not self._done:
            parts.append("The two answers differ: check both.")
        note = s.notes.get(agent)
        if note:
            parts.append(note)
        return "\n\n".join(parts)


@register_task("math", "AT-GRPO math: a tool agent's Python (run in the sandbox) and a reasoner's \\boxed{} answer")
def make_math(source: str = "auto", data_files: Any = None, max_turns: int = 4, single_agent: bool = False,
              datasets: Sequence[Any] = DEFAULT_RG_DATASETS, code_timeout_s: float = 5.0) -> MathEnv:
    """Math environment (see :mod:`accord.envs.maths.env`); ``code_timeout_s`` limits each tool program."""
    return MathEnv(source=source, data_files=data_files, max_turns=max_turns, single_agent=single_agent,
                   datasets=datasets, code_timeout_s=code_timeout_s)
