"""Trainer callbacks: each hook fires at the right point with the right arguments (a real tiny run)."""

import pytest

from accord.callbacks import Callback, check_callbacks
from accord.config import config_from_dict
from accord.tracking import read_metrics
from accord.trainer import Trainer, train


class Recorder(Callback):
    def __init__(self):
        self.events = []

    def on_step_end(self, step, metrics):
        self.events.append(("step_end", step, metrics))

    def on_evaluate(self, step, metrics):
        self.events.append(("evaluate", step, metrics))

    def on_checkpoint(self, step, path):
        self.events.append(("checkpoint", step, path))

    def on_train_end(self, metrics):
        self.events.append(("train_end", None, metrics))


@pytest.mark.slow
def test_hooks_fire_in_order_with_the_logged_metrics(tiny_cfg):
    data = tiny_cfg(run={"steps": 3, "checkpoint_every": 2, "eval_every": 2, "eval_before": True,
                         "eval_after": True},
                    task={"name": "letters", "eval_size": 2})
    rec, quiet = Recorder(), Callback()  # a bare Callback: every hook does nothing
    run_dir = train(config_from_dict(data), callbacks=[rec, quiet])
    assert [(kind, step) for kind, step, _ in rec.events] == [
        ("evaluate", 0),
        ("step_end", 1),
        ("evaluate", 2), ("checkpoint", 2), ("step_end", 2),
        ("evaluate", 3), ("checkpoint", 3), ("step_end", 3),
        ("train_end", None),
    ]
    logged = {m["step"]: {k: v for k, v in m.items() if k != "step"} for m in read_metrics(run_dir)}
    assert sorted(logged) == [0, 1, 2, 3]
    for kind, step, arg in rec.events:
        if kind == "evaluate":
            assert "eval/team/reward" in arg and all(k.startswith("eval/") or k == "time/eval" for k in arg)
            assert arg == {k: v for k, v in logged[step].items() if k.startswith("eval/") or k == "time/eval"}
        elif kind == "checkpoint":
            assert arg == run_dir / "checkpoints" / f"step_{step:06d}" and (arg / "state.pt").is_file()
        elif kind == "step_end":
            assert arg == logged[step]
        else:
            assert arg == logged[3]  # the last step's metrics, with the final evaluation
    assert "eval/team/reward" in rec.events[-1][2]


def test_metrics_given_to_callbacks_are_copies(tiny_cfg):
    class Spoiler(Callback):
        def on_step_end(self, step, metrics):
            metrics.clear()

    trainer = Trainer(config_from_dict(tiny_cfg(run={"steps": 1})), callbacks=[Spoiler()])
    last = trainer.train()
    assert "team/reward" in last and "team/reward" in read_metrics(trainer.run_dir)[-1]


def test_bad_callbacks_are_type_errors():
    class Partial:
        def on_step_end(self, step, metrics):
            pass

    with pytest.raises(TypeError, match=r"lacks \['on_evaluate', 'on_checkpoint', 'on_train_end'\]"):
        check_callbacks([Partial()])
    with pytest.raises(TypeError, match=r"pass an instance, Recorder\(\)"):
        check_callbacks([Recorder])
    with pytest.raises(TypeError, match="must be a list"):
        check_callbacks(Recorder())
    assert check_callbacks(None) == []
