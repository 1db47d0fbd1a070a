import pytest

from accord.config import config_from_dict
from accord.tracking import read_metrics
from accord.trainer import Trainer


class SeededRuns:
    """What :func:`learn_seeds` ran: ``reached`` {seed: (held-out team reward before, after)}, rounded to 3
    places, and ``metrics``, each run's metrics records in seed order."""

    def __init__(self) -> None:
        self.reached: dict[int, tuple[float, float]] = {}
        self.metrics: list[list[dict]] = []

    def mean_after(self) -> float:
        return sum(after for _, after in self.reached.values()) / len(self.reached)

    def mean_rise(self) -> float:
        return sum(after - before for before, after in self.reached.values()) / len(self.reached)


def reached_on_average(key: str, threshold: float, window: int = 5):
    """``Trainer.train``'s ``stop_when``: True once the training metric ``key`` (a step's mean over its sampled
    episodes) averages at least ``threshold`` over the last ``window`` steps. Those episodes are sampled as the
    held-out evaluation samples (temperature 1), so the training mean estimates the held-out one; a run that
    never gets there runs all its steps."""
    recent: list[float] = []

    def stop(step: int, metrics: dict[str, float]) -> bool:
        recent.append(metrics[key])
        return len(recent) >= window and sum(recent[-window:]) / window >= threshold

    return stop


@pytest.fixture
def learn_seeds(tiny_cfg, tmp_path):
    """``learn_seeds(seeds, stop_at=None, **sections)``: a tiny run on letters (unless ``task`` says otherwise) for
    each seed, each in its own run directory, with held-out evaluation before and after; a :class:`SeededRuns`.
    ``sections`` update the base sections key by key; ``stop_at=(key, threshold)`` stops a run early where
    :func:`reached_on_average` says."""

    def learn(seeds, stop_at: tuple[str, float] | None = None, **sections) -> SeededRuns:
        out = SeededRuns()
        for seed in seeds:
            base = dict(run={"steps": 20, "eval_before": True, "eval_after": True, "eval_every": 0},
                        task={"name": "letters", "eval_size": 16},
                        rollout={"batch_size": 8, "max_new_tokens": 12, "temperature": 1.0, "eval_temperature": 1.0},
                        training={"lr": 2e-2, "micro_batch_size": 64})
            for key, value in sections.items():
                base[key] = {**base.get(key, {}), **value}
            base["run"].update(seed=seed, run_dir=str(tmp_path / f"run{seed}"))
            trainer = Trainer(config_from_dict(tiny_cfg(**base)))
            trainer.train(stop_when=None if stop_at is None else reached_on_average(*stop_at))
            recs = read_metrics(trainer.run_dir)
            evals = [r["eval/team/reward"] for r in recs if "eval/team/reward" in r]
            assert len(evals) == 2, evals   # before and after
            out.reached[seed] = (round(evals[0], 3), round(evals[-1], 3))
            out.metrics.append(recs)
        return out

    return learn
