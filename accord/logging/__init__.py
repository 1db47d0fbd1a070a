"""Metric logging for accord runs: sinks (JSONL, TensorBoard, console) and helpers.

Note: this package is ``accord.logging``; modules inside it still get the
standard library's ``logging`` from ``import logging`` (absolute imports).
"""

if __name__ != "accord.logging":  # pragma: no cover - only when sys.path is wrong
    raise ImportError(
        f"accord/logging/ was imported as the top-level module {__name__!r}, shadowing the standard "
        "library's logging: the accord/ package directory itself is on sys.path (a script was run from "
        "inside accord/). Run from the repository root instead, e.g. `python -m accord.<module>`."
    )

from accord.logging.sinks import (  # noqa: E402
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
