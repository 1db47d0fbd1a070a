"""MLflow as a metric sink (``logging.report_to: [mlflow]``; ``pip install 'accord[mlflow]'``).

:class:`MlflowSink`: an :class:`mlflow.MlflowClient` on ``logging.mlflow_tracking_uri``; a run named ``run.name``
in ``logging.mlflow_experiment``; the config flattened to dotted parameter names (``rollout.batch_size``);
metrics with ``log_batch`` at each step; completion tables with ``log_table`` as the artifact
``completions/step_NNNNNN.json``. The MLflow run id is kept in ``RUN_DIR/trackers.json`` and a resumed run
continues it (:mod:`accord.tracking.trackers`).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accord.config import Config, ConfigError
from accord.tracking.registry import _check_step, _clean_metrics, _SinkBase, check_packages, register_sink
from accord.tracking.trackers import _first_line, _resume_id, _table, _write_id, flatten_config

__all__ = ["MlflowSink"]


@register_sink("mlflow")
class MlflowSink(_SinkBase):
    """MLflow: one MLflow run per accord run (see the module docstring)."""

    packages = ("mlflow", "pandas")
    install = "pip install 'accord[mlflow]' (or pip install mlflow-skinny pandas)"

    _BATCH = 100  # parameters per log_batch call (MLflow's limit); metrics allow 1000

    def __init__(self, run_dir: str | Path, *, config: Mapping[str, Any], name: str,
                 tracking_uri: str | None = None, experiment: str = "accord", resume: bool = False) -> None:
        check_packages("mlflow", type(self))
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

    @classmethod
    def from_run(cls, cfg: Config, run_dir: str | Path, *, start_step: int) -> MlflowSink:
        """An MLflow run named ``run.name`` in ``logging.mlflow_experiment`` on ``logging.mlflow_tracking_uri``;
        a resume (``start_step > 0``) continues the run ``trackers.json`` records."""
        lg = cfg.logging
        return cls(run_dir, config=cfg.to_dict(), name=cfg.run.name, tracking_uri=lg.mlflow_tracking_uri,
                   experiment=lg.mlflow_experiment, resume=start_step > 0)

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
