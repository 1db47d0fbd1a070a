"""``logging.report_to``: the sinks of a training run besides metrics.jsonl and the console.

:func:`run_sinks` builds every sink of a run; :func:`check_report_to` checks the list before any model loads.
The tracker sinks are :class:`accord.tracking.wandb.WandbSink` and :class:`accord.tracking.mlflow.MlflowSink`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from accord.config import Config
from accord.tracking.console import ConsoleSink
from accord.tracking.jsonl import JsonlSink
from accord.tracking.mlflow import MlflowSink
from accord.tracking.registry import MetricsSink, MultiSink, _check_step
from accord.tracking.tensorboard import TensorBoardSink
from accord.tracking.trackers import TRACKERS_FILENAME, check_packages
from accord.tracking.wandb import WandbSink

__all__ = ["TRACKERS_FILENAME", "MlflowSink", "WandbSink", "check_report_to", "make_sinks", "run_sinks"]


def check_report_to(report_to: Sequence[str]) -> None:
    """Every tracker in ``report_to`` has its package installed (checked before any model loads)."""
    check_packages(report_to)


def tracker_sinks(cfg: Config, run_dir: Path, *, resume: bool) -> list[MetricsSink]:
    """The W&B / MLflow sinks that ``cfg.logging.report_to`` names, in its order."""
    lg, out = cfg.logging, []
    check_report_to(lg.report_to)
    config = cfg.to_dict()
    try:
        for name in lg.report_to:
            if name == "wandb":
                out.append(WandbSink(run_dir, config=config, name=cfg.run.name, project=lg.wandb_project,
                                     entity=lg.wandb_entity, resume=resume))
            elif name == "mlflow":
                out.append(MlflowSink(run_dir, config=config, name=cfg.run.name, tracking_uri=lg.mlflow_tracking_uri,
                                      experiment=lg.mlflow_experiment, resume=resume))
    except BaseException:
        MultiSink(out).close()
        raise
    return out


def make_sinks(
    run_dir: str | Path,
    *,
    total_steps: int,
    start_step: int = 0,
    tensorboard: bool = True,
    console: bool = True,
    jsonl: bool = True,
    resume_from_step: int | None = None,
    console_keys: Sequence[str] = ("team/reward",),
    console_every: int = 1,
    console_heartbeat_s: float = 60.0,
    extra: Iterable[MetricsSink] = (),
) -> MultiSink:
    """Build the standard sinks for a run directory.

    ``start_step`` is the first step this process runs. When it is > 0 (a
    resume) and ``resume_from_step`` is not given, metrics of steps
    ``> start_step`` are removed from metrics.jsonl (``resume_from_step =
    start_step``: step n is logged after n updates, step 0 before training) and hidden in TensorBoard. ``extra`` sinks (e.g. a
    future wandb sink) are appended.
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


def run_sinks(cfg: Config, run_dir: Path, *, start_step: int = 0) -> MultiSink:
    """All sinks of a training run: metrics.jsonl, the console (``logging.console``) and the sinks of
    ``logging.report_to``. ``start_step > 0`` is a resume (see :func:`accord.tracking.make_sinks`)."""
    trackers = tracker_sinks(cfg, Path(run_dir), resume=start_step > 0)
    try:
        return make_sinks(run_dir, total_steps=cfg.run.steps, start_step=start_step,
                          tensorboard="tensorboard" in cfg.logging.report_to, console=cfg.logging.console,
                          resume_from_step=start_step if start_step else None, extra=trackers)
    except BaseException:
        MultiSink(trackers).close()
        raise
