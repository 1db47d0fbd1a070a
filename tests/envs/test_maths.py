"""The math task: answer extraction and equivalence, data loaders, the tool + reasoner environment."""

import json
import re
import time
from pathlib import Path

import pytest

from accord.envs import make_task
from accord.envs.registry import TaskError
from accord.envs.check import check_env
from accord.envs.maths.answer import (answers_equal, check_answer, extract_answer, extract_boxed, is_reduced_fraction,
                                     normalize_answer, tool_answer)
from accord.envs.maths.data import MathDataUnavailable, load_math_rows, reasoning_gym_rows, record_to_row
from accord.envs.maths.env import ERROR_PENALTY, MathEnv, extract_code

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "math"
TASK = {"id": "t-42", "question": "What is 6 times 7?", "answer": "42", "source": "test"}
FRACTION_TASK = {"id": "t-frac", "question": "Simplify 6/8.", "answer": r"$\frac{3}{4}$", "source": "test",
                 "check": "reduced_fraction"}


def program(expr: str) -> str:
    return f"Let me compute it.\n```python\nresult = {expr}\nprint(result)\n```\n"


# ------------------------------------------------------------------------------------------------ extraction

@pytest.mark.parametrize("text,expected", [
    (r"so \boxed{\frac{a}{b}} first, and finally \boxed{\frac{1}{\sqrt{2}}}.", r"\frac{1}{\sqrt{2}}"),
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
    (r"\fbox{7}", "7"),
    (r"first \boxed{5}, then a truncated \boxed{12", "5"),
    ("The answer is $\\boxed{42}$.", "42"),
    ("\\boxed 5$", "5"),
    ("Natalia sold 48/2 = 24 clips.\n#### 1,234", "1,234"),
    ("Answer: $\\frac{3}{4}$", r"\frac{3}{4}"),
    ("The answer is 42.", "42"),
    ("The final answer is: **17**", "17"),
    ("The answer is 42 because 6 * 7 = 42", "42"),
    ("Therefore, the final answer is \\(2\\sqrt{3}\\).", r"2\sqrt{3}"),
    ("the answer is that we need more time", None),
    ("no answer here, just 5 and 6", None),
    ("", None),
    ("lorem " * 500, None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_boxed_and_tool_answer():
    assert extract_boxed(r"\boxed{\left(1, \frac{2}{3}\right)}") == r"\left(1, \frac{2}{3}\right)"
    assert extract_boxed("nothing boxed") is None and extract_boxed(None) is None
    assert tool_answer("step 1\nstep 2\n 0.75 \n\n") == "0.75"
    assert tool_answer("Answer: 42\n") == "42"
    assert tool_answer("x\n\\boxed{7}") == "7"
    assert tool_answer("") is None and tool_answer("\n  \n") is None


# ------------------------------------------------------------------------------------------------ equivalence

EQUIVALENCE = [
    # fractions, decimals, forms of the same rational
    ("0.75", r"\frac34", True), ("0.75", r"\dfrac{3}{4}", True), ("3/4", r"\tfrac{3}{4}", True),
    ("0.7499", "3/4", False), ("1/3", "0.3333333333333333", True), ("1/3", "0.333", False),
    ("3.0", "3", True), ("3.00", "3", True), ("1e-3", "0.001", True), ("073", "73", True),
    ("0.30000000000000004", "3/10", True), ("1000001", "1000000", False), (r"2\frac{1}{2}", "5/2", True),
    # signs
    ("-5", "5", False), ("\u22125", "-5", True), ("- 5", "-5", True),
    # thousands separators and currency
    ("1,234", "1234", True), ("1, 234", "1234", False), ("1,234.5", "1234.5", True), (r"\$1,000", "1000", True),
    ("1{,}000", "1000", True), ("\\$5.00", "5", True),
    # units, trailing text, percentages, degrees
    ("5 cm", "5", True), (r"5\text{ cm}", "5", True), (r"12 \text{ square units}", "12", True),
    (r"5\text{ cm}^2", "5", True), ("42 apples", "42", True), ("42.", "42", True),
    ("50\\%", "50", True), ("50%", "0.5", True), ("50%", "0.05", False),
    (r"60^\circ", "60", True), (r"120^{\circ}", "120", True), (r"\frac{\pi}{3}", r"60^\circ", False),
    # radicals, pi, powers
    (r"2\sqrt3", r"\sqrt{12}", True), (r"\frac{\sqrt{3}}{2}", r"\sqrt3/2", True), (r"2\sqrt{3}", r"3\sqrt{2}", False),
    ("1.4142135623730951", r"\sqrt{2}", True), ("1.41421", r"\sqrt{2}", False),
    (r"4\pi", "12.566370614359172", True), (r"4\pi", "12.57", False), (r"\sqrt[3]{-8}", "-2", True),
    ("10^{3}", "1000", True), ("2^{10}", "1024", True), (r"\frac{9}{\sqrt{4}}", "4.5", True),
    # an integer matches only that integer (or a double's rounding noise of it), however large
    ("123456789.5", "123456790", False), ("10000000000\u00b7\u03c0/\u03c0", "10000000099", False),
    (r"10000000000\cdot\pi/\pi", "10000000000", True), ("1.9999999999", "2", False), ("1e-13", "0", False),
    ("3.0000000000000004", "3", True), ("12.000000000000002", r"2\sqrt{3}\cdot\sqrt{12}", True),
    # expressions with variables, assignments
    ("x = 5", "5", True), ("y = 2x + 3", "2x+3", True), ("2x+3", "3+2x", True), ("x^2+2x+1", "(x+1)^2", True),
    ("(x+1)^2", "x^2+1", False), ("k=3, m=4", "3, 4", True),
    # tuples, intervals, sets, lists
    ("(1,2)", r"\left( 1, 2 \right)", True), ("(1,2)", "(2,1)", False), ("[1,2)", "[1,2]", False),
    (r"(-\infty, 3]", r"(-\infty,3]", True), (r"(-\infty, 3]", r"(-\infty, 3)", False),
    (r"\{1,2,3\}", r"\{3,2,1\}", True), ("1, 2, 3", "3, 1, 2", True), ("1, 2", "1, 2, 3", False),
    (r"(1,2)\cup(3,4)", r"(1, 2) \cup (3, 4)", True), (r"\{5\}", "5", True),
    # words and letters
    (r"\text{(C)}", "C", True), (r"\text{Monday}", "monday", True), ("Monday", "Tuesday", False),
    # nothing to compare
    ("", "5", False), (None, "5", False), (r"\frac{1}{0}", "5", False), ("5", None, False),
]


@pytest.mark.parametrize("a,b,expected", EQUIVALENCE, ids=[f"{a!r}~{b!r}" for a, b, _ in EQUIVALENCE])
def test_answers_equal(a, b, expected):
    assert answers_equal(a, b) is expected
    assert answers_equal(b, a) is expected  # symmetric


def test_distinct_letters_are_never_equal():
    """Each variable gets a value of its own at every point: a letter never passes for another (x once matched C:
    both got the values of their character codes mod 53), also inside expressions, while identities still hold."""
    import string
    letters = [c for c in string.ascii_letters if c not in "ei"] + ["e", "i"]
    for a in letters:
        for b in letters:
            assert answers_equal(a, b) is (a == b), (a, b)
    assert not answers_equal("2x+1", "2C+1") and not answers_equal("(x)", "(C)") and not answers_equal("x+y", "2x")
    assert answers_equal("x+y", "y+x") and answers_equal("(a+b)^2", "a^2+2ab+b^2") is False  # ab: a word
    assert answers_equal("(a+b)^2", "a^2+2a b+b^2") and answers_equal("x y - y x + z", "z")
    assert check_answer(extract_answer(r"The correct option is \boxed{(C)}."), "C")
    assert not check_answer(extract_answer(r"The correct option is \boxed{x}."), "C")


def test_equivalence_table_is_large_and_balanced():
    assert len(EQUIVALENCE) >= 40
    assert sum(e for *_, e in EQUIVALENCE) >= 20 and sum(not e for *_, e in EQUIVALENCE) >= 20


@pytest.mark.parametrize("hostile", [
    "9^{9^{9^{9}}}", "10^{10^{10}}", "2**2**2**2**2**2**2**2", "(" * 300 + "1" + ")" * 300, "9" * 5000,
    r"\frac{" * 100 + "1" + "}{2}" * 100, "x" * 10_000, "__import__('os').system('true')", "().__class__",
    "lambda: 1", "[x for x in range(10**9)]", "exp(exp(exp(100)))",
])
def test_hostile_answers_are_safe_and_fast(hostile):
    start = time.perf_counter()
    assert answers_equal(hostile, "5") is False
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("answer", ["1e-999999999", "1e999999999", "-1E+999999999", "\\frac{1e-99999999}{3}",
                                    "2^{1e99999999}", "\\sqrt{1e999999999}", "10^{10^{10^{10}}}"])
def test_huge_exponents_are_judged_at_once(answer):
    """``1e-999999999`` used to build 10**999999999 exactly (hours); now a literal's exponent is bounded."""
    start = time.perf_counter()
    for text in (answer, f"The answer is \\boxed{{{answer}}}", f"Answer: {answer}"):
        found = extract_answer(text) or text
        assert tool_answer(text + "\n") is not None
        assert not answers_equal(found, "0") and not check_answer(found, "1") and not check_answer(found, "0")
    assert time.perf_counter() - start < 1.0


def test_a_trailing_backslash_is_no_error():
    """``5\\`` and ``\\boxed{5\\ }`` raised AttributeError out of the parser (and out of env.step)."""
    for text in ("\\boxed{5\\ }", "The answer is 5\\", "\\boxed{\\frac{1}{2}\\\\}"):
        found = extract_answer(text)
        assert found is not None and normalize_answer(found) in ("5", "\\frac{1}{2}")
    assert answers_equal("5\\", "5") and check_answer(extract_answer("\\boxed{5\\ }"), "5")
    assert not answers_equal("5\\", "6") and not answers_equal("\\", "5") and not answers_equal("2\\\\3", "6")


def test_regular_expression_traps_are_linear():
    """Two traps measured before the fix: 18 s for the unit-word one, 22 s for the inline-math one."""
    traps = ["1" + " ^1   " * 60 + "!", "Answer: " + "\\(" * 20000, "answer: x y z w\n" * 20000,
             "The answer is " + "  " * 50_000 + "x", "\\boxed{" * 5000, "#### " + "$" * 100_000]
    for trap in traps:
        start = time.perf_counter()
        extract_answer(trap), answers_equal(trap, "5"), tool_answer(trap), normalize_answer(trap)
        assert time.perf_counter() - start < 1.0, trap[:40]


def test_normalize_and_reduced_fractions():
    assert normalize_answer(r"$\left( 1, 2 \right)$") == "(1, 2)"
    assert normalize_answer(r"\$1,234.50") == "1234.50"
    assert normalize_answer("x = 5 meters.") == "5"
    assert is_reduced_fraction(r"\frac{3}{4}") and is_reduced_fraction("3/4") and is_reduced_fraction("7")
    assert not is_reduced_fraction("6/8") and not is_reduced_fraction("0.75") and not is_reduced_fraction(None)
    ref = r"$\frac{3}{4}$"
    assert check_answer("3/4", ref, "reduced_fraction") and check_answer(r"\dfrac{3}{4}", ref, "reduced_fraction")
    assert not check_answer("6/8", ref, "reduced_fraction") and check_answer("6/8", ref)
    with pytest.raises(ValueError, match="check mode"):
        check_answer("1", "1", "fuzzy")


# ------------------------------------------------------------------------------------------------ data

def test_gsm8k_fixture_and_train_eval_files():
    rows = load_math_rows("train", source="gsm8k", data_files={"train": str(FIXTURES / "gsm8k_sample.jsonl")})
    rows += load_math_rows("eval", source="gsm8k", data_files={"train": str(FIXTURES / "gsm8k_sample.jsonl")})
    assert len(rows) == 5  # the record without '####' is skipped; hash split covers all rows once
    answers = {r["question"][:8]: r["answer"] for r in rows}
    assert answers["A town h"] == "1260000" and answers["Mia buys"] == "27"
    assert all(r["id"].startswith("data_files-") and r["source"] == "data_files" for r in rows)
    files = {"train": str(FIXTURES / "gsm8k_sample.jsonl"), "eval": str(FIXTURES / "gsm8k_test_sample.jsonl")}
    train = load_math_rows("train", source="gsm8k", data_files=files)
    evals = load_math_rows("eval", source="gsm8k", data_files=files)
    assert len(train) == 5 and [r["answer"] for r in evals] == ["37"]  # the repeated question is dropped
    # without a format, a plain {question, answer} record is read as it is
    assert len(load_math_rows("train", data_files=files)) == 6
    assert not {r["id"] for r in train} & {r["id"] for r in evals}


def test_math_and_aime_fixtures():
    rows = {r["question"][:12]: r for r in load_math_rows("train", source="math",
                                                           data_files={"train": str(FIXTURES / "math_sample.jsonl")})
            + load_math_rows("eval", source="math", data_files={"train": str(FIXTURES / "math_sample.jsonl")})}
    assert len(rows) == 5  # the solution without a box is skipped
    got = {k: r["answer"] for k, r in rows.items()}
    assert got["What is $\\fr"] == r"\frac{3}{4}" and got["Simplify $\\s"] == r"2\sqrt{3}"
    assert got["What is the "] == r"\dfrac{4}{9}"  # the unclosed \boxed{ later in the text is ignored
    assert answers_equal(got["How many deg"], "120") and rows["Find the sol"]["subject"] == "Algebra"
    aime = str(FIXTURES / "aime_sample.jsonl")
    train, evals = load_math_rows("train", data_files=aime), load_math_rows("eval", data_files=aime)
    assert sorted(r["year"] for r in train) == [2022, 2023] and sorted(r["year"] for r in evals) == [2024, 2024]
    assert {r["answer"] for r in train + evals} == {"24", "400", "43"}  # zero padding removed


def test_record_formats_are_detected():
    assert record_to_row("auto", {"question": "q?", "answer": "so\n#### 3"})["answer"] == "3"
    assert record_to_row("auto", {"problem": "p?", "solution": r"so \boxed{x+1}", "level": "Level 1"})["answer"] == "x+1"
    assert record_to_row("auto", {"Problem": "p?", "Answer": 204})["answer"] == "204"
    assert record_to_row("auto", {"text": "no question"}) is None
    assert record_to_row("gsm8k", {"question": "q", "answer": "no marker"}) is None


def test_data_errors_name_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(MathDataUnavailable, match="source=reasoning_gym"):
        load_math_rows("train", source="gsm8k")
    with pytest.raises(FileNotFoundError, match="data_files"):
        load_math_rows("train", data_files=str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl line 2: not valid JSON"):
        load_math_rows("train", data_files=str(bad))
    with pytest.raises(ValueError, match="conflict"):
        load_math_rows("train", source="reasoning_gym", data_files=str(bad))
    with pytest.raises(ValueError, match="source"):
        load_math_rows("train", source="hub")
    env = MathEnv(source="reasoning_gym", datasets=["chain_summ"])
    with pytest.raises(TaskError, match="chain_sum"):
        env.tasks("train", 2)


def test_answers_that_are_no_number_or_a_bool_are_refused(tmp_path):
    """JSON's NaN, Infinity and 1e400 (too large for a float) became the answers 'nan' and 'inf', which the checker
    matched; a bool answer was skipped with only an INFO line. Each is an error naming the file and the record."""
    from accord.data import DataFileError

    good = '{"question": "What is 2 times 3?", "answer": 6}\n'
    for value, shown in (("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf"), ("1e400", "inf"),
                         ("true", "a bool")):
        path = tmp_path / "answers.jsonl"
        path.write_text(good + "\n" + f'{{"Problem": "What is 1 times 4?", "Answer": {value}}}\n')
        with pytest.raises(DataFileError, match=rf"answers.jsonl record 2: 'Answer' is {re.escape(shown)}.*finite"):
            load_math_rows("train", data_files=str(path))
    path.write_text(good)
    assert [r["answer"] for r in load_math_rows("train", data_files=[str(path)])
            + load_math_rows("eval", data_files=[str(path)])] == ["6"]
    assert record_to_row("auto", {"question": "q?", "answer": float("nan")}) is None


def test_reasoning_gym_splits_are_disjoint_and_deterministic():
    train = reasoning_gym_rows("train", 120, seed=0)
    evals = reasoning_gym_rows("eval", 60, seed=0)
    assert len(train) == 120 and len(evals) == 60
    assert not {r["id"] for r in train} & {r["id"] for r in evals}
    assert not {" ".join(r["question"].split()) for r in train} & {" ".join(r["question"].split()) for r in evals}
    assert [r["id"] for r in reasoning_gym_rows("train", 120, seed=0)] == [r["id"] for r in train]
    assert [r["id"] for r in reasoning_gym_rows("train", 20, seed=1)] != [r["id"] for r in train[:20]]
    assert len({r["dataset"] for r in train}) == 6
    for r in train + evals:  # every reference answer is readable by the checker
        assert check_answer(r["answer"], r["answer"], r.get("check", "math")), r
    assert all(r.get("check") == "reduced_fraction" for r in train if r["dataset"] == "fraction_simplification")
    json.dumps(train)  # plain data


# ------------------------------------------------------------------------------------------------ environment

ACTIONS = [program("6 * 7"), program("Fraction(3, 4)").replace("result =", "from fractions import Fraction\nresult ="),
           "6 times 7 is \\boxed{42}.", "So the answer is $\\boxed{\\frac{3}{4}}$.", "I am not sure.",
           "```python\nprint(1/0)\n```", "The answer is 41."]


@pytest.mark.parametrize("single", [False, True])
def test_check_env(single):
    check_env(lambda: MathEnv(source="reasoning_gym", code_timeout_s=1.0, single_agent=single), actions=ACTIONS)


def test_registered_and_options_validated():
    env = make_task("math", {"source": "reasoning_gym"})
    assert env.agents == ("tool", "reasoner") and env.max_turns == 4 and not env.simultaneous
    assert make_task("math", {"single_agent": True}).agents == ("reasoner",)
    for options, key in [({"source": "hub"}, "source"), ({"max_turns": 0}, "max_turns"),
                         ({"single_agent": "yes"}, "single_agent"), ({"datasets": "chain_sum"}, "datasets"),
                         ({"code_timeout_s": 0}, "code_timeout_s")]:
        with pytest.raises(TaskError, match=key):
            make_task("math", options)


def test_agreeing_correct_answers_end_the_episode_with_success():
    env = MathEnv()
    obs = env.reset(TASK)
    assert "What is 6 times 7?" in obs["tool"] and "has not run a program yet" in obs["reasoner"]
    res = env.step({"tool": program("6 * 7")})
    assert not res.done and res.info["tool_status"] == "ok" and res.info["answer"] == "42"
    assert res.local_rewards == {"tool": 1.0, "reasoner": 0.0} and res.team_reward == 0.0
    assert "result = 6 * 7" in res.observations["reasoner"] and "Output:\n42" in res.observations["reasoner"]
    res = env.step({"reasoner": "The program confirms it: \\boxed{42}"})
    assert res.done and res.info["success"] is True and res.info["agree"] is True
    assert res.team_reward == 1.0 and res.local_rewards == {"tool": 0.0, "reasoner": 1.0}
    with pytest.raises(RuntimeError):
        env.step({"tool": program("1")})


def test_disagreement_continues_and_rewards_track_the_reasoner():
    env = MathEnv(max_turns=3)
    env.reset(TASK)
    env.step({"tool": program("6 + 7")})                                   # wrong tool answer: 13
    res = env.step({"reasoner": "\\boxed{42}"})
    assert not res.done and res.team_reward == 1.0 and res.info["success"] and not res.info["agree"]
    assert "The reasoner's answer: 42" in res.observations["tool"] and "differ" in res.observations["tool"]
    res = env.step({"tool": program("6 + 8")})                             # still wrong: 14
    assert not res.done and res.local_rewards["tool"] == 0.0
    res = env.step({"reasoner": "Hmm, maybe \\boxed{14}"})                 # correct -> wrong: -1
    assert res.team_reward == -1.0 and res.local_rewards["reasoner"] == 0.0 and res.info["success"] is False
    assert res.done and res.info["agree"]                                  # agreeing on a wrong answer ends it
    # a tool that comes round to the reasoner's answer ends the episode on its own step
    env.reset(TASK)
    env.step({"tool": program("13")})
    env.step({"reasoner": "\\boxed{42}"})
    res = env.step({"tool": program("6 * 7")})
    assert res.done and res.info["success"] and res.team_reward == 0.0 and res.local_rewards["tool"] == 1.0


def test_turn_limit_and_unparseable_output():
    env = MathEnv(max_turns=2)
    env.reset(TASK)
    team = 0.0
    for _ in range(2):
        res = env.step({"tool": "I will just think."})
        assert res.info["tool_status"] == "no_code" and res.local_rewards["tool"] == 0.0
        assert res.info["parse_error"] == {"tool": True}
        res = env.step({"reasoner": "lorem ipsum"})
        team += res.team_reward
        assert res.local_rewards["reasoner"] == 0.0 and res.info["parse_error"] == {"reasoner": True}
    assert res.done and team == 0.0 and res.info["success"] is False
    assert "no final answer" in env.clone()._observe("reasoner")


def test_endless_program_times_out_without_crashing():
    env = MathEnv(code_timeout_s=1.0)
    env.reset(TASK)
    start = time.perf_counter()
    res = env.step({"tool": "```python\nwhile True:\n    pass\n```"})
    assert time.perf_counter() - start < 30
    assert res.info["tool_status"] == "timeout" and res.local_rewards["tool"] == pytest.approx(ERROR_PENALTY)
    assert "timed out" in res.observations["reasoner"] and not res.done
    res = env.step({"reasoner": "\\boxed{42}"})
    assert res.info["success"] and not res.done  # no tool answer: no agreement yet


def test_failing_program_shows_a_clean_traceback():
    env = MathEnv()
    env.reset(TASK)
    res = env.step({"tool": "```python\nx = 1\nprint(x / 0)\n```"})
    obs = res.observations["reasoner"]
    assert res.info["tool_status"] == "error" and "ZeroDivisionError" in obs and "accord-sbx" not in obs
    assert 'File "solution.py"' in obs and res.local_rewards["tool"] == pytest.approx(ERROR_PENALTY)
    res = env.step({"reasoner": "\\boxed{42}"})
    res = env.step({"tool": "```python\nprint(6 *\n```"})
    assert res.info["tool_status"] == "syntax_error"


@pytest.mark.parametrize("unit", ["/", 'File "/', "/accord-sbx-", "accord-sbx-/", "a/", 'File "a/accord-sbx-b/'])
def test_clean_error_is_linear_in_hostile_stderr(unit):
    """A program picks its stderr: a run of ``/`` made the old regular expression quadratic (20-33 s of the
    trainer per program at the sandbox's 64 KiB cap). Time must grow like the input: 4x the text, ~4x the
    time (quadratic would be 16x); the best of 5 CPU times, against noise from other processes."""
    from accord.envs.tool_programs import clean_error

    def cost(n: int) -> float:
        text = "Traceback:\n  " + unit * (n // len(unit)) + "\nValueError: x\n"
        best = float("inf")
        for _ in range(5):
            start = time.process_time()  # CPU time of this process: other processes' load counts less
            clean_error(text, "ValueError")
            best = min(best, time.process_time() - start)
        return best

    small, large = cost(20_000), cost(80_000)
    assert large < 0.5 and large / max(small, 1e-4) < 10, (small, large)


def test_reduced_fraction_task_and_single_agent():
    env = MathEnv()
    env.reset(FRACTION_TASK)
    res = env.step({"tool": "```python\nprint('6/8')\n```"})
    assert res.local_rewards["tool"] == 0.0  # equal value, not in lowest terms
    res = env.step({"reasoner": "\\boxed{6/8}"})
    assert res.done and res.info["agree"] and not res.info["success"]
    solo = MathEnv(single_agent=True, max_turns=3)
    obs = solo.reset(FRACTION_TASK)
    assert set(obs) == {"reasoner"} and "tool" not in solo.instructions("reasoner")
    res = solo.step({"reasoner": "not sure"})
    assert not res.done and "no final answer" in res.observations["reasoner"]
    res = solo.step({"reasoner": "\\boxed{\\frac{3}{4}}"})
    assert res.done and res.info["success"] and res.team_reward == 1.0


def test_hostile_answers_neither_raise_out_of_step_nor_stall_it():
    """Before the fix: AttributeError out of step for a trailing backslash, and a step that never returned for
    ``\\boxed{1e-999999999}`` or a program printing ``1e999999999``."""
    zero = dict(TASK, answer="0")
    env = MathEnv()
    start = time.perf_counter()
    env.reset(zero)
    res = env.step({"tool": "```python\nprint('1e999999999')\n```"})
    assert res.info["answer"] == "1e999999999" and res.local_rewards["tool"] == 0.0
    res = env.step({"reasoner": "Tiny: \\boxed{1e-999999999}"})
    assert res.info["answer"] == "1e-999999999" and res.local_rewards["reasoner"] == 0.0 and not res.done
    res = env.step({"tool": "```python\nprint('0\\\\')\n```"})
    assert res.local_rewards["tool"] == 1.0
    res = env.step({"reasoner": "The answer is 0\\"})
    assert res.info["success"] and res.done and res.info["agree"]
    env.reset(TASK)
    env.step({"tool": "```python\nprint(42)\n```"})
    assert env.step({"reasoner": "\\boxed{42\\ }"}).info["success"]
    assert time.perf_counter() - start < 30


def test_timebox_kills_a_check_that_runs_in_c(tmp_path):
    """The deadline holds for work no signal can interrupt: one big-integer power inside C (10**300000000,
    minutes of CPU), the shape of the original ``1e-999999999`` hang. A stand-in checker module runs it,
    since the real one bounds its inputs before it gets there."""
    from accord.envs.maths.timebox import AnswerChecker

    module = tmp_path / "slow_checker.py"
    module.write_text("def extract_answer(text):\n    return text.upper()\n\n"
                      "def check_answer(answer, reference, mode='math'):\n    return 10 ** 300_000_000 == 0\n\n"
                      "tool_answer = answers_equal = extract_answer\n")
    checker = AnswerChecker(module, timeout_s=0.5)
    try:
        assert checker.call("extract_answer", "warm up", default=None) == "WARM UP"
        start = time.perf_counter()
        assert checker.call("check_answer", "1", "1", default="stopped") == "stopped"
        assert time.perf_counter() - start < 10 and checker.timeouts == 1
        assert checker.call("extract_answer", "again", default=None) == "AGAIN"  # a fresh helper
        with pytest.raises(ValueError, match="unknown check"):
            checker.call("eval", "1", default=None)
    finally:
        checker.close()


def test_extract_code():
    assert extract_code("```python\nprint(1)\n```") == "print(1)"
    assert extract_code("```py\nprint(1)\n```\ntext\n```\nprint(2)\n```") == "print(2)"
    assert extract_code("```python\nprint(1)\n```\n```text\nnot code\n```") == "print(1)"
    assert extract_code("Here:\n```python\nx = 3\nprint(x") == "x = 3\nprint(x"  # cut off by the token limit
    assert extract_code("no code") is None and extract_code("```python\n\n```") is None
    assert extract_code("```json\n{}\n") is None


def test_clones_are_independent_and_share_nothing_mutable():
    env = MathEnv()
    env.reset(TASK)
    env.step({"tool": program("6 * 7")})
    twin = env.clone()
    twin.step({"reasoner": "\\boxed{41}"})
    res = env.step({"reasoner": "\\boxed{42}"})
    assert res.done and res.info["success"] and twin._state.reasoner_answer == "41"


# ------------------------------------------------------------------------------------------------ trainer

def test_trainer_smoke_on_math(tiny_cfg):
    from accord.config import config_from_dict
    from accord.trainer import Trainer

    data = tiny_cfg(task={"name": "math", "options": {"source": "reasoning_gym", "max_turns": 1}, "eval_size": 2,
                          "train_size": 8},
                    algorithm={"name": "atgrpo", "num_generations": 2}, run={"steps": 1, "eval_after": True},
                    policies={"main": {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2,
                                                                             "max_position_embeddings": 4096}}},
                    rollout={"max_prompt_tokens": 4096})
    metrics = Trainer(config_from_dict(data)).train()
    # AT-GRPO: batch 2 x 1 turn x 2 agents (tool, reasoner) x K = 2 candidates, each a sample
    assert metrics["perf/samples"] == 2 * 1 * 2 * 2 and metrics["episode/turns"] == 1.0
    assert "agent/tool/local_reward" in metrics and "agent/reasoner/local_reward" in metrics
    assert metrics["eval/turns"] == 1.0 and (metrics["eval/success"] * 2).is_integer()  # 2 held-out problems
