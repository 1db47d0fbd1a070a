"""What a run says on the console: the logging set-up of the command line, and its closing lines.

:func:`configure_logging` makes the log lines and the progress bar share one console: in a terminal
(stdout and stderr both terminals) the lines go through rich's logging handler on rich's console,
the one the :class:`~accord.tracking.sinks.ConsoleSink` bar draws on, so each line prints above the
live bar instead of into it. Elsewhere (a pipe, a file, CI) they are plain timestamped lines on
stderr.

:func:`held_out_summary` turns a run's ``metrics.jsonl`` rows into the lines ``accord train`` ends
with: the held-out team reward before -> after, the success rate where the task has one, and each
agent's own return where it differs from the team's (multi-turn environments) and completion length.
:func:`training_summary` adds the sampled training reward of the first third of the steps against the
last third: a second, noisier view of learning that needs no held-out set (the quickstart's criterion).
"""

from __future__ import annotations

import logging
import math
import re
import sys

PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
TIME_FORMAT = "%H:%M:%S"


def configure_logging(level: int = logging.INFO) -> logging.Handler:
    """Install one root handler (rich's in a terminal, plain stderr lines elsewhere); return it."""
    from rich import get_console

    console = get_console()
    if console.is_terminal and sys.stderr.isatty():
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(console=console, show_path=False, markup=False,
                                                log_time_format=f"[{TIME_FORMAT}]")
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(PLAIN_FORMAT, datefmt=TIME_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
    return handler


def _fmt(value: float) -> str:
    return f"{value:.4f}" if math.isfinite(value) else str(value)


def _change(before: float, after: float) -> str:
    return f"{_fmt(before)} -> {_fmt(after)} ({after - before:+.4f})"


_AGENT_KEY = re.compile(r"^eval/agent/(?P<agent>[^/]+)/(?P<metric>.+)$")


def held_out_summary(rows: list[dict], *, temperature: float = 0.0) -> list[str]:
    """Closing lines of a run from its metric rows: the first held-out evaluation (step 0 when the
    run evaluated before training) against the last one."""
    evals = [r for r in rows if isinstance(r.get("eval/team/reward"), (int, float))]
    mode = "greedy" if not temperature else f"sampled at temperature {temperature:g}"
    if not evals:
        return ["no held-out evaluation in this run (task.eval_size is 0, or run.eval_before and run.eval_after "
                "are false)"]
    first, last = evals[0], evals[-1]
    if first is last:
        return [f"held-out team reward ({mode}) at step {last['step']}: {_fmt(last['eval/team/reward'])} "
                "(one evaluation: set run.eval_before=true for a before -> after comparison)"]
    span = f"step {first['step']} -> step {last['step']}"
    lines = [f"held-out team reward ({mode}), {span}: {_change(first['eval/team/reward'], last['eval/team/reward'])}"]
    if "eval/success" in first and "eval/success" in last:
        lines.append(f"held-out success rate, {span}: {_change(first['eval/success'], last['eval/success'])}")
    per_agent: dict[str, list[str]] = {}
    for key in last:
        match = _AGENT_KEY.match(key)
        if not match or key not in first:
            continue
        agent, metric = match["agent"], match["metric"]
        if metric == "return" and all(r.get(key) == r["eval/team/reward"] for r in (first, last)):
            continue  # an agent's own return equal to the team's says nothing more
        if metric == "completion_len":
            per_agent.setdefault(agent, []).append(f"length {first[key]:.1f} -> {last[key]:.1f} tokens")
        else:
            per_agent.setdefault(agent, []).append(f"{metric} {_change(first[key], last[key])}")
    for agent, parts in per_agent.items():
        lines.append(f"  agent {agent}: " + ", ".join(parts))
    return lines


def training_thirds(rows: list[dict]) -> tuple[list[int], float, list[int], float] | None:
    """(steps, mean) of the training team reward over the first and the last third of a run's steps,
    or None with fewer than two steps. A third holds ``max(1, n // 3)`` steps, so the two never overlap;
    a step logged twice (a resume) counts once, with its last value."""
    by_step = {r["step"]: r["team/reward"] for r in rows
               if isinstance(r.get("team/reward"), (int, float)) and math.isfinite(r["team/reward"])}
    steps = sorted(by_step)
    if len(steps) < 2:
        return None
    k = max(1, len(steps) // 3)
    first, last = steps[:k], steps[-k:]
    return (first, sum(by_step[s] for s in first) / k, last, sum(by_step[s] for s in last) / k)


def _span(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"


def training_summary(rows: list[dict]) -> list[str]:
    """The closing line on the sampled training team reward: the mean of the first third of the steps ->
    the mean of the last third (no line with fewer than two steps)."""
    thirds = training_thirds(rows)
    if thirds is None:
        return []
    first, before, last, after = thirds
    return [f"training team reward (sampled), mean of the first third ({_span(first)}) -> the last third "
            f"({_span(last)}): {_change(before, after)}"]
