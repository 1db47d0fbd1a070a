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


@pytest.mark.parametrize("hook", ["on_evaluate", "on_step_end"])
def test_a_callback_that_ends_training_keeps_its_step(tiny_cfg, hook):
    """A SystemExit from on_evaluate at step 2 of 3 (the documented way to stop early) lost step 2: its metrics
    and evaluation were never logged and no checkpoint held it. The step is logged and checkpointed, then the
    callback's exception goes on up; a resume starts after it."""
    class StopAtTwo(Callback):
        def __init__(self):
            self.calls = []

        def on_evaluate(self, step, metrics):
            self.calls.append(("evaluate", step))
            if hook == "on_evaluate" and step == 2:
                raise SystemExit("solved at step 2")

        def on_step_end(self, step, metrics):
            self.calls.append(("step_end", step))
            if hook == "on_step_end" and step == 2:
                raise SystemExit("solved at step 2")

    stopper = StopAtTwo()
    data = tiny_cfg(run={"steps": 3, "eval_every": 1, "eval_before": True, "checkpoint_every": 0},
                    task={"name": "letters", "eval_size": 2})
    trainer = Trainer(config_from_dict(data), callbacks=[stopper])
    with pytest.raises(SystemExit, match="solved at step 2"):
        trainer.train()
    logged = read_metrics(trainer.run_dir)
    assert [m["step"] for m in logged] == [0, 1, 2] and all("eval/team/reward" in m for m in logged)
    assert "team/reward" in logged[2]
    assert sorted(p.name for p in (trainer.run_dir / "checkpoints").iterdir()) == ["step_000002"]
    assert ("step_end", 2) not in stopper.calls if hook == "on_evaluate" else ("step_end", 2) in stopper.calls
    resumed = Trainer(config_from_dict(data), resume=True)
    assert resumed.start_step == 2
    resumed.train()
    assert [m["step"] for m in read_metrics(trainer.run_dir)] == [0, 1, 2, 3]
