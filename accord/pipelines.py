"""Prompt-only multi-agent pipelines for ``accord eval --pipeline``: the papers' untrained multi-agent rows.

MAGRPO (Liu et al., 2025) compares its trained agents with the same untrained models prompted in fixed
collaboration schemes; ``accord eval --pipeline NAME`` runs them on a single-turn task:

- ``parallel`` (the default, plain ``accord eval``): every agent answers its own prompt independently
  (the paper's parallel generation / naive concatenation).
- ``sequential``: a sequential hand-off. Agents answer in the task's agent order; each later agent's
  prompt is its own task prompt followed by the earlier agents' answers (:func:`sequential_prompt`).
- ``discussion``: one round of discussion. Every agent first answers its own prompt independently (this
  round is exactly ``parallel``); then each agent sees its first answer as its own assistant turn, the
  other agents' first answers in a new user turn, and revises once (:func:`discussion_prompt`). The
  revised answers are scored.

The final answers are scored like plain eval's joint actions: the task's own team reward (and its
``success`` check, for success rates and pass@k) with the task's own prompts, through the same reward
path (the single-turn rollout's ``score``, :class:`accord.rollout.magrpo.JointRollout`), so every row of the comparison is scored alike.
Nothing is trained and no weights change. With ``n`` samples per instance a pipeline runs ``n``
independent chains: agent i's j-th answer sees the j-th answers of the others.

Multi-turn environments take no pipeline: their agents already hand off to each other every turn (a
turn-based environment shows an agent the earlier agents' actions; a simultaneous one shows every
agent the others' previous answers), so plain ``accord eval CONFIG`` of the base weights is the
untrained multi-agent row there (AT-GRPO's "multi-agent, untrained" baseline). Asking for one is an
error that says so.

The connecting prompt text is generic (it names the agents by role and quotes their answers); a task
needs nothing new to support pipelines. The greedy pass writes its prompts and answers to a JSONL file
beside ``eval.json`` so that what each agent saw can be read back.
"""

from __future__ import annotations

import difflib
import json
import logging
from pathlib import Path
from typing import Any

from accord.config import ConfigError
from accord.envs.protocol import Messages

logger = logging.getLogger(__name__)

PIPELINES = ("parallel", "sequential", "discussion")
PIPELINE_TEXT = {"sequential": "agents answer in order, each seeing the earlier agents' answers (no training).",
                 "discussion": "agents answer independently, then each revises once after seeing the others' "
                               "first answers (no training)."}


def check_pipeline_name(pipeline: str) -> None:
    """``pipeline`` is one of :data:`PIPELINES`; otherwise a one-line error naming the closest one."""
    if pipeline not in PIPELINES:
        close = difflib.get_close_matches(str(pipeline), PIPELINES, n=1)
        hint = f" did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"--pipeline {pipeline!r} is not a pipeline;{hint} choose one of {', '.join(PIPELINES)}")


def check_pipeline(pipeline: str, task_name: str, agents: tuple[str, ...], multi_turn: bool) -> None:
    """The pipeline applies to this task: a single-turn task, with two or more agents for a discussion."""
    check_pipeline_name(pipeline)
    if pipeline == "parallel":
        return
    if multi_turn:
        raise ConfigError(f"--pipeline {pipeline} applies to single-turn tasks; {task_name!r} is a multi-turn "
                          "environment whose agents already see each other's outputs every turn, so its plain "
                          "evaluation is the untrained multi-agent baseline: drop --pipeline")
    if pipeline == "discussion" and len(agents) < 2:
        raise ConfigError(f"--pipeline discussion needs at least two agents; task {task_name!r} has one "
                          f"({agents[0]!r}; e.g. algorithm.baseline=single_agent or centralized): evaluate it "
                          "without --pipeline")


def _quote(answers: list[tuple[str, str]]) -> str:
    return "\n\n".join(f"--- answer of the {agent} agent ---\n{text.strip()}\n--- end of {agent} ---"
                       for agent, text in answers)


def sequential_prompt(messages: Messages, agent: str, earlier: list[tuple[str, str]]) -> Messages:
    """The task prompt of ``agent`` followed by the answers of the agents before it, as (agent, text)."""
    if not earlier:
        return messages
    block = (f"\n\nYou work in a team; the agents before you have answered:\n\n{_quote(earlier)}\n\n"
             f"Now give your own answer as the {agent} agent, following the instructions above and building "
             "on theirs.")
    return messages[:-1] + [{**messages[-1], "content": messages[-1]["content"] + block}]


def discussion_prompt(messages: Messages, agent: str, first: str, peers: list[tuple[str, str]]) -> Messages:
    """The task prompt of ``agent``, its first answer, and the other agents' first answers with a request to
    revise once."""
    ask = (f"The other agents of your team answered the same task:\n\n{_quote(peers)}\n\n"
           f"Considering their answers, revise your own answer as the {agent} agent, following the original "
           "instructions. Reply with your complete revised answer only.")
    return messages + [{"role": "assistant", "content": first}, {"role": "user", "content": ask}]


def _complete(run, requests, n, greedy, temperature):
    return run.generate(requests, n, greedy, temperature=temperature, stream="eval")


def _run_sequential(run, rows, base, n, greedy, temperature):
    """Per agent, per row, ``n`` completions and the messages each was prompted with."""
    gens: dict[str, list[list[Any]]] = {}
    msgs: dict[str, list[list[Messages]]] = {}
    for i, a in enumerate(run.agents):
        if i == 0:  # the first agent sees only its task prompt: n samples of one request, as plain eval
            out = _complete(run, [(a, base[a][b]) for b in range(len(rows))], n, greedy, temperature)
            gens[a] = [list(c) for c in out]
            msgs[a] = [[base[a][b]] * n for b in range(len(rows))]
            continue
        prompts = [[sequential_prompt(base[a][b], a, [(e, gens[e][b][j].text) for e in run.agents[:i]])
                    for j in range(n)] for b in range(len(rows))]
        out = _complete(run, [(a, m) for per in prompts for m in per], 1, greedy, temperature)
        gens[a] = [[out[b * n + j][0] for j in range(n)] for b in range(len(rows))]
        msgs[a] = prompts
    return gens, msgs, None


def _run_discussion(run, rows, base, n, greedy, temperature):
    """Round one: independent answers (one generate call, as plain eval); round two: each agent revises."""
    agents, nb = run.agents, len(rows)
    out = iter(_complete(run, [(a, base[a][b]) for a in agents for b in range(nb)], n, greedy, temperature))
    first = {a: [list(next(out)) for _ in range(nb)] for a in agents}
    prompts = {a: [[discussion_prompt(base[a][b], a, first[a][b][j].text,
                                      [(p, first[p][b][j].text) for p in agents if p != a])
                    for j in range(n)] for b in range(nb)] for a in agents}
    out = iter(_complete(run, [(a, m) for a in agents for per in prompts[a] for m in per], 1, greedy, temperature))
    gens = {a: [[next(out)[0] for _ in range(n)] for _ in range(nb)] for a in agents}
    return gens, prompts, first


def pipeline_single_turn(run, rows: list[dict], n: int, greedy: bool, temperature: float, *, pipeline: str,
                         record: Path | None = None):
    """``n`` chains of ``pipeline`` per row of a run (:class:`accord.build.Run`), scored like plain eval's joint
    actions: a :class:`accord.rollout.base.Played` whose results have plain eval's single-turn keys. With
    ``record``, the prompts and answers of every chain (instance, sample) go to that file, one JSON line each."""
    from accord.envs.single_turn import SingleTurnEnv

    check_pipeline(pipeline, run.env.name, run.agents, not isinstance(run.env, SingleTurnEnv))
    base = {a: [run.env.prompt(a, row) for row in rows] for a in run.agents}
    chains = {"sequential": _run_sequential, "discussion": _run_discussion}[pipeline]
    gens, msgs, first = chains(run, rows, base, n, greedy, temperature)
    texts = {a: [[c.text for c in per] for per in gens[a]] for a in run.agents}
    # scored with the task's own prompts: the reward sees what it sees in plain eval and in training
    prompt_texts = {a: [m[-1]["content"] for m in base[a]] for a in run.agents}
    played = run.rollout.score(rows, prompt_texts, gens, texts, n)
    if record is not None:
        with open(record, "w") as fh:
            for b, row in enumerate(rows):
                for j in range(n):
                    line = {"id": row.get("id", b), "sample": j, "pipeline": pipeline,
                            "team": played.results[b][j]["team"],
                            "agents": {a: {"messages": msgs[a][b][j], "answer": texts[a][b][j],
                                           **({"first_answer": first[a][b][j].text} if first else {})}
                                       for a in run.agents}}
                    fh.write(json.dumps(line) + "\n")
    return played


def pipeline_player(pipeline: str, record: Path | None = None):
    """``accord eval``'s ``play`` for ``pipeline``; the greedy pass writes its transcript to ``record``."""

    def play(run, rows: list[dict], *, n: int, greedy: bool, temperature: float):
        return pipeline_single_turn(run, rows, n, greedy, temperature, pipeline=pipeline,
                                    record=record if greedy else None)

    return play


def transcript_path(out_dir: Path, variant: str) -> Path:
    """Where the greedy pass of a pipeline writes what each agent saw and answered, per model variant."""
    return out_dir / f"{variant}.pipeline.jsonl"


def load_transcripts(path: str | Path) -> list[dict[str, Any]]:
    """The JSON lines of :func:`transcript_path`: one instance each."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").split("\n") if line.strip()]
