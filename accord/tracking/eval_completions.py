"""Held-out evaluation completions on disk: ``RUN_DIR/eval_completions/step_N.jsonl``.

Every evaluation of ``accord train`` (step 0 before training, every ``run.eval_every`` steps, and the
last step) writes what the agents answered on the held-out instances, one JSON line per completion:

* single-turn tasks: ``instance`` (the row's id), ``joint`` (the joint action's index: one per
  instance), ``agent``, ``prompt`` (the last user message), ``completion``, ``reward`` (the joint
  action's team reward), ``finish_reason``, ``completion_len`` (tokens) and, for tasks with
  ``reward_components``, ``components`` (the reward's named parts);
* multi-turn environments: one line per agent and turn of each episode: ``instance``, ``joint`` (the
  episode's index), ``agent``, ``turn``, ``prompt`` (the observation), ``completion`` (the action),
  ``reward`` (the episode's team return), ``local_return`` (the agent's own) and ``success``.

The rows of one joint action (or episode) share ``joint``. A resume after step k deletes the files of
later steps, as it does with the training completions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accord.tracking.registry import _atomic_write_text, _check_step, json_line

__all__ = ["EVAL_COMPLETIONS_DIRNAME", "eval_completions_path", "write_eval_completions", "joint_completion_rows",
           "episode_completion_rows"]

EVAL_COMPLETIONS_DIRNAME = "eval_completions"


def eval_completions_path(run_dir: str | Path, step: int) -> Path:
    """Path of the evaluation completions of ``step`` inside ``run_dir``."""
    return Path(run_dir) / EVAL_COMPLETIONS_DIRNAME / f"step_{_check_step(step):06d}.jsonl"


def write_eval_completions(run_dir: str | Path, step: int, rows: Sequence[dict[str, Any]]) -> Path:
    """Write ``rows`` as JSON lines (atomically) and return the file's path."""
    path = eval_completions_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write_text(path, "".join(json_line(row) + "\n" for row in rows))
    return path


def joint_completion_rows(rows: Sequence[dict], agents: Sequence[str], prompt_texts: dict[str, list[str]],
                          gens: dict[str, list[list[Any]]], texts: dict[str, list[list[str]]],
                          joint: Any) -> list[dict[str, Any]]:
    """Rows of a single-turn evaluation with one joint action per instance (``joint`` a JointBatch)."""
    out = []
    for b, row in enumerate(rows):
        for a in agents:
            gen = gens[a][b][0]
            rec = {"instance": row.get("id", b), "joint": b, "agent": a, "prompt": prompt_texts[a][b],
                   "completion": texts[a][b][0], "reward": joint.rewards[b], "finish_reason": gen.finish_reason,
                   "completion_len": len(gen.ids)}
            if joint.components:
                rec["components"] = joint.components[b]
            out.append(rec)
    return out


def episode_completion_rows(rows: Sequence[dict], episodes: Sequence[Any]) -> list[dict[str, Any]]:
    """Rows of a multi-turn evaluation: every agent's (observation, action) of each episode."""
    out = []
    for e, (row, ep) in enumerate(zip(rows, episodes)):
        turns = max((len(h) for h in ep.history.values()), default=0)
        for turn in range(turns):   # in playing order: turn by turn, the agents in turn order
            for agent, history in ep.history.items():
                if turn >= len(history):
                    continue
                observation, action = history[turn]
                out.append({"instance": row.get("id", e), "joint": e, "agent": agent, "turn": turn,
                            "prompt": observation, "completion": action, "reward": ep.team_return,
                            "local_return": ep.local_return.get(agent, 0.0), "success": bool(ep.success)})
    return out
