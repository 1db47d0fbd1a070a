"""``logging.report_to``: the sinks of a training run, built through the sink registry.

:func:`run_sinks` builds ``metrics.jsonl`` (always), each sink ``logging.report_to`` names, in its order,
and the console (``logging.console``), each with its class's ``from_run(cfg, run_dir, *, start_step)``
(see :mod:`accord.tracking.registry`). :func:`check_report_to` checks the names before any model loads:
each is a registered sink (the built-in ``tensorboard``, ``wandb`` and ``mlflow``, or one registered with
:func:`accord.tracking.register_sink`) whose packages are installed. A sink of your own is registered when
its module is imported, so list that module under ``imports:`` (imported before the check) or import it
before calling :func:`accord.train`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from pathlib import Path

from accord import metric_names as mn
from accord.config import Config, ConfigError
from accord.tracking.console import ConsoleSink
from accord.tracking.jsonl import JsonlSink
from accord.tracking.registry import SINKS, MetricsSink, MultiSink, _check_step, check_packages
from accord.tracking.tensorboard import TensorBoardSink
from accord.tracking.trackers import TRACKERS_FILENAME

__all__ = ["TRACKERS_FILENAME", "check_report_to", "make_sinks", "run_sinks"]

# sinks every run has, set elsewhere than in report_to
_NOT_LISTED = {"jsonl": "RUN_DIR/metrics.jsonl is always written; remove it from logging.report_to",
               "console": "set logging.console (true or false) and remove it from logging.report_to"}


def _sink_class(name: str) -> type:
    """The registered sink class of a ``logging.report_to`` name (a one-line :class:`ConfigError` if none)."""
    if name in _NOT_LISTED:
        raise ConfigError(f"logging.report_to: {name!r} is not a sink of logging.report_to; {_NOT_LISTED[name]}")
    sink = SINKS.get(name)
    if sink is None:
        known = sorted(n for n in SINKS if n not in _NOT_LISTED)
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f" did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"logging.report_to: {name!r} is not a registered sink;{hint} registered: {known}. Register "
                          "your own with accord.tracking.register_sink in a module listed under imports:, or remove "
                          f"{name!r} from logging.report_to")
    if not callable(getattr(sink, "from_run", None)):
        raise ConfigError(f"logging.report_to: sink {name!r} ({sink.__module__}.{sink.__qualname__}) has no "
                          "from_run(cfg, run_dir, *, start_step) classmethod; add one that builds the sink for a run")
    return sink


def check_report_to(report_to: Sequence[str]) -> None:
    """Every name of ``logging.report_to`` is a registered sink that builds itself for a run and whose packages
    are installed (:func:`accord.build.build_run` checks this after importing ``imports:``, before any model
    loads)."""
    for name in report_to:
        check_packages(name, _sink_class(name))


def run_sinks(cfg: Config, run_dir: str | Path, *, start_step: int = 0) -> MultiSink:
    """All sinks of a training run, each built with ``from_run(cfg, run_dir, start_step=start_step)``:
    metrics.jsonl, the sinks of ``logging.report_to`` in its order, and the console (``logging.console``).
    ``start_step > 0`` is a resume after that step: metrics.jsonl is cut back to it, TensorBoard hides the later
    events and the trackers continue their runs."""
    start_step = _check_step(start_step, "start_step")
    report_to = list(cfg.logging.report_to)
    check_report_to(report_to)
    console = ["console"] if cfg.logging.console else []
    built: dict[str, MetricsSink] = {}
    try:   # the sinks of report_to first: a tracker that cannot start fails before metrics.jsonl is cut back
        for name in [*report_to, "jsonl", *console]:
            sink = SINKS[name].from_run(cfg, Path(run_dir), start_step=start_step)
            if not isinstance(sink, MetricsSink):
                raise TypeError(f"sink {name!r}: {SINKS[name].__qualname__}.from_run must return a sink with log(), "
                                f"log_completions() and close(), got {type(sink).__name__!r}")
            built[name] = sink
    except BaseException:
        MultiSink(built.values()).close()
        raise
    return MultiSink(built[name] for name in ["jsonl", *report_to, *console])


def make_sinks(
    run_dir: str | Path,
    *,
    total_steps: int,
    start_step: int = 0,
    tensorboard: bool = True,
    console: bool = True,
    jsonl: bool = True,
    resume_from_step: int | None = None,
    console_keys: Sequence[str] = (mn.TEAM_REWARD,),
    console_every: int = 1,
    console_heartbeat_s: float = 60.0,
    extra: Iterable[MetricsSink] = (),
) -> MultiSink:
    """Build the standard sinks for a run directory.

    ``start_step`` is the first step this process runs. When it is > 0 (a
    resume) and ``resume_from_step`` is not given, metrics of steps
    ``> start_step`` are removed from metrics.jsonl (``resume_from_step =
    start_step``: step n is logged after n updates, step 0 before training) and hidden in TensorBoard.
    ``extra`` sinks are appended. A training run builds its sinks from its config instead
    (:func:`run_sinks`).
    """
    start_step = _check_step(start_step, "start_step")
    if resume_from_step is None and start_step > 0:
        resume_from_step = start_step
    sinks: list[MetricsSink] = []
    if jsonl:
        sinks.append(JsonlSink(run_dir, resume_from_step=resume_from_step))
    if tensorboard:
        purge = None if resume_from_step is None else resume_from_step + 1
        sinks.append(TensorBoardSink(run_dir, purge_step=purge))
    if console:
        sinks.append(ConsoleSink(total_steps, start_step=start_step, keys=console_keys, every=console_every,
                                heartbeat_s=console_heartbeat_s))
    sinks.extend(extra)
    return MultiSink(sinks)
