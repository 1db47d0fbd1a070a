"""Reward components (the optional ``reward_components`` of a task) and the writing task's faithfulness term."""

from __future__ import annotations

import random

import pytest
import torch

from accord.envs import make_task
from accord.envs.registry import TaskError
from accord.envs.coding.humaneval import TESTS
from accord.envs.oracles import oracle_for
from accord.envs.writing.core import source_faithfulness, writing_team_reward
from accord.rollout.magrpo import RewardError, score_joint_actions

SOURCE = ("The city council voted on Tuesday to close the old library on Main Street next spring. Council members "
          "said the building needs repairs that would cost more than a new branch. A new library will open near "
          "the train station in two years, and the books will move there. Residents who opposed the closure "
          "asked the council to keep a reading room open downtown until the new branch is ready.")
# near-verbatim: sentences of the source, lightly cut
FAITHFUL = ("The city council voted to close the old library on Main Street next spring because the building "
            "needs repairs.",
            "The city council voted on Tuesday to close the old library on Main Street next spring. Council members "
            "said the building needs repairs that would cost more than a new branch. However, a new library will "
            "open near the train station in two years, and the books will move there. Residents who opposed the "
            "closure asked the council to keep a reading room open downtown.")
# fluent, about something else, written to please the paper's lexical levels (transitions, shared words)
UNRELATED = ("Volcanic islands form quickly when hot lava cools under the ocean surface near the edges of moving "
             "tectonic plates.",
             "Volcanic islands form when lava cools under the ocean, and however slowly they grow, they "
             "eventually rise above the surface. Furthermore, tectonic plates move these islands away from hot "
             "spots; therefore chains of islands appear over millions of years. For example, coral reefs then "
             "grow around them, and finally the volcanic peaks sink again beneath the waves of the ocean.")


def _reward(task, pair):
    return task.reward(completions={"concise": [pair[0]], "detailed": [pair[1]]}, agents=("concise", "detailed"),
                       text=[SOURCE])[0]


def test_source_faithfulness_scores_copying_high_and_other_topics_low():
    assert source_faithfulness(FAITHFUL[1], SOURCE) > 0.8
    assert source_faithfulness(UNRELATED[1], SOURCE) < 0.1
    assert source_faithfulness("", SOURCE) == 0.0
    assert source_faithfulness(SOURCE, SOURCE) == 1.0


def test_faithfulness_option_ranks_a_faithful_summary_above_a_fluent_unrelated_one():
    paper, faithful = make_task("writing", {"source": "offline"}), make_task("writing", {"source": "offline",
                                                                                         "faithfulness": 1.0})
    # the paper's reward compares the two texts with each other only: the unrelated pair wins
    assert _reward(paper, UNRELATED) > _reward(paper, FAITHFUL)
    # the option adds the faithfulness term: the faithful pair wins
    assert _reward(faithful, FAITHFUL) > _reward(faithful, UNRELATED)
    assert _reward(faithful, FAITHFUL) - _reward(paper, FAITHFUL) > 0.8
    assert _reward(faithful, UNRELATED) - _reward(paper, UNRELATED) < 0.1


def test_default_is_the_papers_reward_and_parts_add_up():
    task = make_task("writing", {"source": "offline"})
    rows = task.rows("train", limit=3)
    rng = random.Random(0)
    words = SOURCE.split()
    firsts = [" ".join(words[: rng.randint(5, 30)]) for _ in range(6)]
    seconds = [" ".join(words[: rng.randint(10, 70)]) for _ in range(6)]
    texts = [rows[j % 3]["text"] for j in range(6)]
    comps = {"concise": firsts, "detailed": seconds}
    parts = task.reward_components(completions=comps, agents=("concise", "detailed"), text=texts)
    paper = writing_team_reward(completions=comps, agents=("concise", "detailed"))
    assert task.reward(completions=comps, agents=("concise", "detailed"), text=texts) == paper
    for p, r in zip(parts, paper):
        assert p["total"] == r and p["faithfulness"] == 0.0
        assert p["l1"] + p["l2"] + p["l3"] + p["l4"] == pytest.approx(r)
        assert 0.0 <= p["source_overlap"] <= 1.0
    # without the source text the paper's reward still works (it never reads it) ...
    assert task.reward(completions=comps, agents=("concise", "detailed")) == paper
    # ... but the faithfulness term needs it
    with pytest.raises(ValueError, match="source text"):
        make_task("writing", {"faithfulness": 1.0}).reward(completions=comps, agents=("concise", "detailed"))


@pytest.mark.parametrize("bad", [-1.0, "yes", True, float("nan")])
def test_faithfulness_option_is_checked(bad):
    with pytest.raises(TaskError, match=r"task.options.faithfulness=.*0, the default, is the paper's reward"):
        make_task("writing", {"faithfulness": bad})


def test_single_agent_writing_reports_the_same_parts():
    task = make_task("writing", {"source": "offline", "single_agent": True, "faithfulness": 0.5})
    text = f"Concise: {FAITHFUL[0]}\n\nDetailed: {FAITHFUL[1]}"
    (parts,) = task.reward_components(completions={"writer": [text]}, agents=("writer",), text=[SOURCE])
    pair = make_task("writing", {"source": "offline", "faithfulness": 0.5}).reward_components(
        completions={"concise": [FAITHFUL[0]], "detailed": [FAITHFUL[1]]}, agents=("concise", "detailed"),
        text=[SOURCE])[0]
    assert parts == pair and parts["faithfulness"] > 0.4


def test_humaneval_stages_through_the_rollout():
    task = make_task("humaneval", {})
    rows = task.rows("train", limit=2)
    rng = random.Random(0)
    oracle = oracle_for(task)
    texts = {"helper": [[oracle(task, "helper", r, rng, False), "no code"] for r in rows],
             "main": [[oracle(task, "main", r, rng, False), "no code"] for r in rows]}
    prompts = {a: [task.prompt(a, r)[-1]["content"] for r in rows] for a in ("helper", "main")}
    batch = score_joint_actions(task, ("helper", "main"), rows, texts, prompts, 2, "aligned")
    assert batch.rewards == [3.5, 0.0, 3.5, 0.0]
    assert [c["tests"] for c in batch.components] == [TESTS, 0.0, TESTS, 0.0]   # the canonical pair passes all
    assert set(batch.components[1].values()) == {0.0}                          # no code: the format gate fails
    assert set(batch.components[0]) == {"aux", "main", "parse", "tests", "timeout", "aux_called", "not_wrapper",
                                        "ignored", "cap"}
    means = batch.component_means()
    assert means["tests"] == pytest.approx(sum(c["tests"] for c in batch.components) / 4)


class _Parts:
    """A user's task whose reward_components is given per test."""

    name = "parts"
    agents = ("a", "b")

    def __init__(self, components):
        self.components = components

    def prompt(self, agent, row):
        return [{"role": "user", "content": row["text"]}]

    def reward(self, *, prompts, completions, agents, **columns):
        return [1.0] * len(completions["a"])

    def reward_components(self, *, prompts, completions, agents, **columns):
        return self.components


@pytest.mark.parametrize("components,message", [
    ([{"x": 1.0}, {"total": 1.0}], "the key 'total'"),
    ([{"total": 1.0, "x": 1.0}, {"total": 1.0, "y": 1.0}], "give every joint action the same parts"),
    ([{"total": 1.0, "x": float("inf")}, {"total": 1.0, "x": 1.0}], "finite float"),
    ([{"total": 1.0, "x": True}, {"total": 1.0, "x": 1.0}], "'x': True for joint action 0 .*finite float"),
    ([{"total": 1.0, "x": "0.5"}, {"total": 1.0, "x": 1.0}], "'x': '0.5' for joint action 0 .*finite float"),
    ([{"total": 1.0}], "returned 1 values for 2 joint actions"),
    (5, "returned int for 2 joint actions"),
])
def test_bad_components_are_errors_naming_the_joint_action(components, message):
    rows = [{"id": "r0", "text": "t"}]
    texts = {"a": [["x", "y"]], "b": [["x", "y"]]}
    with pytest.raises(RewardError, match=message):
        score_joint_actions(_Parts(components), ("a", "b"), rows, texts, {"a": ["t"], "b": ["t"]}, 2, "aligned")


def test_components_take_the_numbers_a_reward_takes():
    """A part or total given as a numpy scalar or a 0-d tensor counts as its float, as in a task's reward (they
    were refused as not finite floats)."""
    import numpy as np

    rows = [{"id": "r0", "text": "t"}]
    texts = {"a": [["x", "y"]], "b": [["x", "y"]]}
    batch = score_joint_actions(_Parts([{"total": np.float32(2.0), "p": torch.tensor(0.5)},
                                        {"total": 0, "p": np.int64(1)}]), ("a", "b"), rows, texts,
                                {"a": ["t"], "b": ["t"]}, 2, "aligned")
    assert batch.rewards == [2.0, 0.0] and batch.components == [{"p": 0.5}, {"p": 1.0}]
    assert all(type(v) is float for v in batch.rewards + [c["p"] for c in batch.components])


def test_a_success_check_gives_bools_where_a_reward_may_not():
    """A task's success check returns one bool per joint action (accord eval's pass@k); the same bools from its
    reward stop the run."""
    from accord.envs.single_turn import SingleTurnEnv

    class Checked(_Parts):
        reward_components = None   # scored by its reward

        def success(self, *, prompts, completions, agents, **columns):
            return [c == "x" for c in completions["a"]]

        def reward(self, *, prompts, completions, agents, **columns):
            return self.success(prompts=prompts, completions=completions, agents=agents)

    env, rows = SingleTurnEnv(Checked(None)), [{"id": "r0", "text": "t"}] * 2
    texts, prompts = {"a": ["x", "y"], "b": ["x", "y"]}, {"a": ["t", "t"], "b": ["t", "t"]}
    assert env.success(rows, prompts, texts) == [True, False]
    with pytest.raises(RewardError, match=r"returned bool True for joint action 0; .*float\(passed\)"):
        env.score(rows, prompts, texts)


@pytest.mark.parametrize("answer, message", [
    (["yes", "no"], r"the success check of task 'parts' returned str 'yes' for joint action 0; return a list of bools$"),
    ([True], r"the success check of task 'parts' returned 1 values for 2 joint actions; return one bool per joint"),
    ([True, float("nan")], r"the success check of task 'parts' is nan for joint action 1 .*; return a bool for every"),
    (None, r"the success check of task 'parts' returned a NoneType; return a list of bools, one per joint action"),
])
def test_a_bad_success_check_is_named_as_such(answer, message):
    """The errors of a success check name the check and ask for bools, not the reward's floats."""
    from accord.envs.single_turn import SingleTurnEnv

    class Checked(_Parts):
        def success(self, *, prompts, completions, agents, **columns):
            return answer

    env, rows = SingleTurnEnv(Checked(None)), [{"id": "r0", "text": "t"}] * 2
    with pytest.raises(RewardError, match=message):
        env.success(rows, {"a": ["t", "t"], "b": ["t", "t"]}, {"a": ["x", "y"], "b": ["x", "y"]})


def test_components_are_used_instead_of_the_reward():
    rows = [{"id": "r0", "text": "t"}]
    texts = {"a": [["x", "y"]], "b": [["x", "y"]]}
    batch = score_joint_actions(_Parts([{"total": 2.0, "p": 0.5}, {"total": 0.0, "p": 1.5}]), ("a", "b"), rows, texts,
                                {"a": ["t"], "b": ["t"]}, 2, "aligned")
    assert batch.rewards == [2.0, 0.0] and batch.components == [{"p": 0.5}, {"p": 1.5}]
    assert batch.component_means() == {"p": 1.0}
