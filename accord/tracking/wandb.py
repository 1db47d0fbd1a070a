"""Weights & Biases as a metric sink (``logging.report_to: [wandb]``; ``pip install 'accord[wandb]'``).

:class:`WandbSink`: ``wandb.init(project, entity, name=run.name, dir=RUN_DIR, config=<config>)``; metrics with
``run.log(metrics, step=step)``; completion tables as a ``wandb.Table`` under the key ``completions``.
``WANDB_MODE=offline`` writes the run under ``RUN_DIR/wandb/offline-run-*`` only. The W&B run id is kept in
``RUN_DIR/trackers.json`` and a resumed run continues it (:mod:`accord.tracking.trackers`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accord.config import Config, ConfigError
from accord.tracking.registry import _check_step, _clean_metrics, _SinkBase, check_packages, register_sink
from accord.tracking.trackers import _first_line, _resume_id, _table, _write_id

__all__ = ["WandbSink"]


@register_sink("wandb")
class WandbSink(_SinkBase):
    """Weights & Biases: one W&B run per accord run (see the module docstring)."""

    packages = ("wandb",)
    install = "pip install 'accord[wandb]' (or pip install wandb)"

    def __init__(self, run_dir: str | Path, *, config: Mapping[str, Any], name: str, project: str = "accord",
                 entity: str | None = None, resume: bool = False) -> None:
        check_packages("wandb", type(self))
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

    @classmethod
    def from_run(cls, cfg: Config, run_dir: str | Path, *, start_step: int) -> WandbSink:
        """A W&B run named ``run.name`` in ``logging.wandb_project`` / ``logging.wandb_entity``; a resume
        (``start_step > 0``) continues the run ``trackers.json`` records."""
        lg = cfg.logging
        return cls(run_dir, config=cfg.to_dict(), name=cfg.run.name, project=lg.wandb_project,
                   entity=lg.wandb_entity, resume=start_step > 0)

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
