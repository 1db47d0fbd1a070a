"""Experiment trackers as metric sinks: Weights & Biases and MLflow (``logging.report_to``).

Both packages are optional extras (``pip install 'accord[wandb]'``, ``pip install 'accord[mlflow]'``).
Each sink receives what every sink receives (see :class:`accord.tracking.sinks.MetricsSink`): the
metrics of each step and the completion tables; at the start it records the run's resolved config
as the run's parameters.

- :class:`WandbSink`: ``wandb.init(project, entity, name=run.name, dir=RUN_DIR, config=<config>)``;
  metrics with ``run.log(metrics, step=step)``; completion tables as a ``wandb.Table`` under the key
  ``completions``. ``WANDB_MODE=offline`` writes the run under ``RUN_DIR/wandb/offline-run-*`` only.
- :class:`MlflowSink`: an :class:`mlflow.MlflowClient` on ``logging.mlflow_tracking_uri``; a run named
  ``run.name`` in ``logging.mlflow_experiment``; the config flattened to dotted parameter names
  (``rollout.batch_size``); metrics with ``log_batch`` at each step; completion tables with
  ``log_table`` as the artifact ``completions/step_NNNNNN.json``.

Resume: each sink writes its tracker's run id to ``RUN_DIR/trackers.json``; a resumed run
(``accord train --resume``) continues that tracker run. Steps after the checkpoint that the
interrupted process had already logged are logged again: W&B ignores a step lower than one it has
seen (it warns), MLflow keeps both values of such a step.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from accord.config import Config, ConfigError
from accord.tracking.sinks import (
    _COMPLETION_COLUMNS,
    MetricsSink,
    MultiSink,
    _check_step,
    _clean_metrics,
    _json_default,
    _SinkBase,
    make_sinks,
    register_sink,
)

__all__ = ["TRACKERS_FILENAME", "MlflowSink", "WandbSink", "check_report_to", "run_sinks"]

_logger = logging.getLogger(__name__)

TRACKERS_FILENAME = "trackers.json"

# report_to name -> (modules it imports, the pip install that provides them)
_PACKAGES = {
    "wandb": (("wandb",), "pip install 'accord[wandb]' (or pip install wandb)"),
    "mlflow": (("mlflow", "pandas"), "pip install 'accord[mlflow]' (or pip install mlflow-skinny pandas)"),
}


def _missing(name: str) -> list[str]:
    return [m for m in _PACKAGES[name][0] if importlib.util.find_spec(m) is None]


def check_report_to(report_to: Sequence[str]) -> None:
    """Every tracker in ``report_to`` has its package installed (checked before any model loads)."""
    for name in report_to:
        if name in _PACKAGES and _missing(name):
            raise ConfigError(f"logging.report_to includes {name!r}, but {' and '.join(_missing(name))} "
                              f"is not installed; {_PACKAGES[name][1]}, or remove {name!r} from logging.report_to")


def _require(name: str) -> None:
    check_report_to([name])


def _read_ids(run_dir: Path) -> dict:
    path = run_dir / TRACKERS_FILENAME
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path} is not valid JSON ({err.msg}); fix it or delete it (a resumed run then starts "
                          "new tracker runs)") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object of tracker -> run id; fix it or delete it")
    return data


def _write_id(run_dir: Path, tracker: str, record: dict) -> None:
    data = _read_ids(run_dir)
    old = data.get(tracker)
    if old is not None and old != record:
        _logger.warning("%s: replacing the %s run %s with the new run %s", run_dir / TRACKERS_FILENAME, tracker,
                        old, record)
    data[tracker] = record
    (run_dir / TRACKERS_FILENAME).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _resume_id(run_dir: Path, tracker: str, resume: bool) -> dict | None:
    """The tracker run to continue when resuming, if an earlier process recorded one."""
    if not resume:
        return None
    record = _read_ids(run_dir).get(tracker)
    if record is None:
        _logger.warning("resuming %s, but %s records no %s run; starting a new one", run_dir, TRACKERS_FILENAME,
                        tracker)
    return record


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Completion table columns: the usual ones first, then any other keys in order of appearance."""
    columns = [c for c in _COMPLETION_COLUMNS if any(c in row for row in rows)]
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    return columns


def _cell(value: Any) -> Any:
    """A table cell: scalars and None as they are, anything else (lists, dicts, arrays) as JSON text."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy / torch scalars
        return value.item()
    return json.dumps(value, default=_json_default, ensure_ascii=False)


def _table(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TypeError(f"completion row {i} is a {type(row).__name__}, expected a dict")
    columns = _columns(rows)
    return columns, [[_cell(row.get(c)) for c in columns] for row in rows]


def flatten_config(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config data as dotted names -> text (lists and None as JSON), for parameter tables."""
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_config(value, name + "."))
        elif isinstance(value, str):
            out[name] = value
        else:
            out[name] = json.dumps(value, default=_json_default)
    return out


@register_sink("wandb")
class WandbSink(_SinkBase):
    """Weights & Biases: one W&B run per accord run (see the module docstring)."""

    def __init__(self, run_dir: str | Path, *, config: Mapping[str, Any], name: str, project: str = "accord",
                 entity: str | None = None, resume: bool = False) -> None:
        _require("wandb")
        import wandb

        self._wandb = wandb
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        previous = _resume_id(self.run_dir, "wandb", resume)
        kwargs: dict[str, Any] = {"id": previous["id"], "resume": "allow"} if previous else {}
        try:
            self.run = wandb.init(project=project, entity=entity, name=name, dir=str(self.run_dir),
                                  config=dict(config), **kwargs)
        except wandb.errors.Error as err:  # no API key, no network, a wrong entity: W&B's own errors
            raise ConfigError(f"logging.report_to=wandb: W&B did not start a run ({type(err).__name__}: "
                              f"{_first_line(err)}); log in with `wandb login` (or set WANDB_API_KEY), keep the run "
                              "on disk with WANDB_MODE=offline, or remove 'wandb' from logging.report_to") from err
        _write_id(self.run_dir, "wandb", {"id": self.run.id, "project": project})
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"WandbSink for {self.run_dir} is closed; create a new sink to keep logging")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._check_open()
        self.run.log(_clean_metrics(metrics), step=_check_step(step))

    def log_completions(self, step: int, rows: list[dict]) -> None:
        self._check_open()
        columns, data = _table(rows)
        self.run.log({"completions": self._wandb.Table(columns=columns, data=data)}, step=_check_step(step))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.run.finish()


@register_sink("mlflow")
class MlflowSink(_SinkBase):
    """MLflow: one MLflow run per accord run (see the module docstring)."""

    _BATCH = 100  # parameters per log_batch call (MLflow's limit); metrics allow 1000

    def __init__(self, run_dir: str | Path, *, config: Mapping[str, Any], name: str,
                 tracking_uri: str | None = None, experiment: str = "accord", resume: bool = False) -> None:
        _require("mlflow")
        from mlflow import MlflowClient
        from mlflow.entities import Metric, Param
        from mlflow.exceptions import MlflowException

        self._metric = Metric
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        previous = _resume_id(self.run_dir, "mlflow", resume)
        try:
            self.client = MlflowClient(tracking_uri=tracking_uri)
            if previous:
                self.run_id = previous["run_id"]
                self.client.update_run(self.run_id, status="RUNNING")
            else:
                found = self.client.get_experiment_by_name(experiment)
                exp_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
                self.run_id = self.client.create_run(exp_id, run_name=name).info.run_id
                params = [Param(k, v) for k, v in flatten_config(config).items()]
                for i in range(0, len(params), self._BATCH):
                    self.client.log_batch(self.run_id, params=params[i:i + self._BATCH])
        except MlflowException as err:
            raise ConfigError(_mlflow_problem(tracking_uri, err)) from err
        _write_id(self.run_dir, "mlflow", {"run_id": self.run_id, "tracking_uri": self.client.tracking_uri})
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"MlflowSink for {self.run_dir} is closed; create a new sink to keep logging")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._check_open()
        step = _check_step(step)
        now = int(time.time() * 1000)
        batch = [self._metric(k, float(v), now, step) for k, v in _clean_metrics(metrics).items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def log_completions(self, step: int, rows: list[dict]) -> None:
        self._check_open()
        columns, data = _table(rows)
        self.client.log_table(self.run_id, {c: [r[i] for r in data] for i, c in enumerate(columns)},
                              artifact_file=f"completions/step_{_check_step(step):06d}.json")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.client.set_terminated(self.run_id)


def _first_line(err: BaseException) -> str:
    """An exception's message as one line, without the links and advice trackers append."""
    text = " ".join(str(getattr(err, "message", None) or err).split())
    return re.split(r"\s+See https?://", text)[0].rstrip(". ") or type(err).__name__


def _mlflow_problem(tracking_uri: str | None, err: BaseException) -> str:
    """One line: the URI MLflow tried (the setting, MLFLOW_TRACKING_URI or MLflow's default), why, and the fix."""
    import os

    import mlflow

    if tracking_uri:
        uri, origin = tracking_uri, "logging.mlflow_tracking_uri"
    elif os.environ.get("MLFLOW_TRACKING_URI"):
        uri, origin = os.environ["MLFLOW_TRACKING_URI"], "$MLFLOW_TRACKING_URI"
    else:
        uri, origin = mlflow.get_tracking_uri(), "MLflow's default"
    fix = ("set logging.mlflow_tracking_uri (e.g. http://host:5000 for a tracking server, or file:///abs/mlruns "
           "with MLFLOW_ALLOW_FILE_STORE=true)")
    if uri.startswith("sqlite") and importlib.util.find_spec("sqlalchemy") is None:
        fix += ", or pip install mlflow (the full package: a sqlite:// store needs its SQLAlchemy)"
    return (f"logging.report_to=mlflow: MLflow cannot use the tracking URI {uri} ({origin}): {_first_line(err)}; "
            f"{fix}, or remove 'mlflow' from logging.report_to")


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
