"""Metric tracking for accord runs: sinks (JSONL, TensorBoard, console), the W&B and MLflow sinks of
``report_to`` (:mod:`.report_to`), the eval completions files (:mod:`.eval_completions`) and the console
log setup (:mod:`.console`).
"""

from accord.tracking.sinks import (
    COMPLETIONS_DIRNAME,
    METRICS_FILENAME,
    SINKS,
    TENSORBOARD_DIRNAME,
    ConsoleSink,
    JsonlSink,
    MetricAccumulator,
    MetricsSink,
    MultiSink,
    TensorBoardSink,
    completions_markdown,
    completions_path,
    make_sinks,
    read_metrics,
    register_sink,
)

__all__ = [
    "COMPLETIONS_DIRNAME",
    "METRICS_FILENAME",
    "SINKS",
    "TENSORBOARD_DIRNAME",
    "ConsoleSink",
    "JsonlSink",
    "MetricAccumulator",
    "MetricsSink",
    "MultiSink",
    "TensorBoardSink",
    "completions_markdown",
    "completions_path",
    "make_sinks",
    "read_metrics",
    "register_sink",
]
