"""Metric tracking for accord runs: the sink registry and :class:`MultiSink` (:mod:`.registry`), one module
per sink (:mod:`.jsonl`, :mod:`.tensorboard`, :mod:`.console`, :mod:`.wandb`, :mod:`.mlflow`), the sinks of
a run from its ``logging`` config (:mod:`.report_to`), the per-step accumulator (:mod:`.accumulator`), the
eval completions files (:mod:`.eval_completions`) and the console log setup (:mod:`.console`).
"""

from accord.tracking.accumulator import MetricAccumulator
from accord.tracking.console import ConsoleSink
from accord.tracking.eval_completions import EVAL_COMPLETIONS_DIRNAME
from accord.tracking.jsonl import (
    COMPLETIONS_DIRNAME,
    METRICS_FILENAME,
    JsonlSink,
    MetricsFileError,
    completions_path,
    read_metrics,
)
from accord.tracking.mlflow import MlflowSink
from accord.tracking.registry import SINKS, MetricsSink, MultiSink, register_sink
from accord.tracking.report_to import make_sinks, run_sinks
from accord.tracking.tensorboard import TENSORBOARD_DIRNAME, TensorBoardSink, completions_markdown
from accord.tracking.wandb import WandbSink

__all__ = [
    "COMPLETIONS_DIRNAME",
    "EVAL_COMPLETIONS_DIRNAME",
    "METRICS_FILENAME",
    "SINKS",
    "TENSORBOARD_DIRNAME",
    "ConsoleSink",
    "JsonlSink",
    "MetricAccumulator",
    "MetricsFileError",
    "MetricsSink",
    "MlflowSink",
    "MultiSink",
    "TensorBoardSink",
    "WandbSink",
    "completions_markdown",
    "completions_path",
    "make_sinks",
    "read_metrics",
    "register_sink",
    "run_sinks",
]
