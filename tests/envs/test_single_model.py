"""MAGRPO's single-model baseline on its own tasks (writing, humaneval): one model writes both parts in one
completion, parsed into the roles and scored by the same team reward; `algorithm.baseline: single_agent`
trains it."""

from __future__ import annotations

import math

import pytest

from accord.config import config_from_dict
from accord.envs import make_task
from accord.envs.registry import TaskError
from accord.envs.coding.data import humaneval_problems
from accord.envs.coding.humaneval import REWARD_MAX, split_single
from accord.envs.writing.core import writing_team_reward
from accord.envs.writing.task import split_parts
from accord.trainer import Trainer

AUX = "def aux(a, b):\n    return abs(a - b)"
MAIN = ("def has_close_elements(numbers, threshold):\n    for i, x in enumerate(numbers):\n"
        "        for y in numbers[i + 1:]:\n            if aux(x, y) < threshold:\n"
        "                return True\n    return False")


@pytest.fixture(scope="module")
def problem() -> dict:
    return next(p for p in humaneval_problems() if p["id"] == "HumanEval/0")


def test_humaneval_single_completion_is_split_and_scored_like_the_pair(problem):
    task = make_task("humaneval", {"single_agent": True})
    assert task.agents == ("coder",) and task.name == "humaneval-single"
    prompt = task.prompt("coder", problem)[0]["content"]
    assert "`aux`" in prompt and "has_close_elements" in prompt and "Problem:" in prompt
    both = f"Here it is:\n```python\nimport math\n\n{AUX}\n\n{MAIN}\n\nprint(has_close_elements([1.0], 0.5))\n```"
    helper, main = split_single(both, "has_close_elements")
    assert helper.startswith("import math\n") and "def aux" in helper and "has_close" not in helper
    assert "def has_close_elements" in main and "def aux" not in main and "print" not in main
    only_main = f"```python\n{MAIN.replace('aux(x, y)', 'abs(x - y)')}\n```"
    columns = {k: [problem[k]] * 4 for k in problem}
    rewards = task.reward(completions={"coder": [both, only_main, "no code at all", "```python\ndef f(:\n```"]},
                          agents=("coder",), **columns)
    assert rewards == [REWARD_MAX, 0.0, 0.0, 0.0]   # a missing aux fails the format gate, as for the pair
    assert task.success(completions={"coder": [both, only_main]}, agents=("coder",),
                        **{k: v[:2] for k, v in columns.items()}) == [True, False]
    with pytest.raises(TaskError, match="centralized"):
        make_task("humaneval", {"single_agent": True, "multi_turn": True})


def test_writing_single_completion_is_split_at_headings():
    roles = ("concise", "detailed")
    concise = "The author asks whether to move to a new city for a job offer with higher pay."
    detailed = ("The author received a job offer in another city. However, moving means leaving friends; "
                "therefore the author weighs pay against family, for example rent and travel costs, because "
                "the new salary is higher but the city is expensive. Finally, the author asks for advice.")
    text = f"**Concise summary:**\n{concise}\n\n## Detailed:\n{detailed}"
    assert split_parts(text, roles) == {"concise": concise, "detailed": detailed}
    assert split_parts(f"{concise}\n\n{detailed}", roles) == {"concise": concise, "detailed": detailed}
    assert split_parts("just one paragraph", roles) == {"concise": "just one paragraph", "detailed": ""}
    task = make_task("writing", {"single_agent": True, "source": "offline"})
    assert task.agents == ("writer",)
    row = task.rows("train", limit=1)[0]
    prompt = task.prompt("writer", row)[0]["content"]
    assert "Concise:" in prompt and "Detailed:" in prompt and row["text"][:40] in prompt
    pair = writing_team_reward(completions={"concise": [concise], "detailed": [detailed]}, agents=roles)[0]
    got = task.reward(completions={"writer": [text, "nothing here"]}, agents=("writer",), text=[row["text"]] * 2)
    assert got == [pytest.approx(pair), 0.0] and pair > 1.0
    arxiv = make_task("writing", {"single_agent": True, "source": "offline", "variant": "arxiv"})
    assert "Background:" in arxiv.prompt("writer", row)[0]["content"]


@pytest.mark.parametrize("task", [{"name": "writing", "options": {"source": "offline"}},
                                  {"name": "humaneval", "options": {}}], ids=["writing", "humaneval"])
def test_single_agent_baseline_trains_two_steps(tiny_cfg, task):
    cfg = config_from_dict(tiny_cfg(task={**task, "eval_size": 2}, algorithm={"baseline": "single_agent",
                                                                              "num_generations": 2},
                                    run={"eval_after": True}))
    trainer = Trainer(cfg)
    try:
        assert trainer.agents == ("writer",) if task["name"] == "writing" else ("coder",)
        metrics = trainer.train()
    finally:
        trainer.close()
    assert metrics["perf/samples"] > 0 and "eval/team/reward" in metrics
    assert all(math.isfinite(float(v)) for v in metrics.values())
