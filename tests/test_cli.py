"""The command line, run as a user would: real subprocesses, real files."""

import pytest
import json
import yaml
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def accord(*args, cwd):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "accord.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_train_report_resume_from_the_cli(tmp_path):
    example = REPO / "examples" / "tiny.yaml"
    run = accord("train", str(example), "run.steps=3", "run.checkpoint_every=2", f"run.output_dir={tmp_path}",
                 "task.eval_size=4", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    run_dir = tmp_path / "tiny"
    assert f"tensorboard --logdir {run_dir / 'tb'}" in run.stderr   # how to look at the curves
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]
    assert (run_dir / "config.yaml").is_file() and list((run_dir / "tb").iterdir())
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000002", "step_000003"]

    more = accord("train", "--resume", str(run_dir), "run.steps=4", cwd=tmp_path)
    assert more.returncode == 0, more.stderr
    assert "resumed" in more.stderr and "since the checkpoint of step" not in more.stderr
    # config.yaml edited between two sessions (a resume of the edited run said nothing): named against the
    # checkpoint's copy of the config
    text = (run_dir / "config.yaml").read_text()
    lr = yaml.safe_load(text)["training"]["lr"]
    (run_dir / "config.yaml").write_text(text.replace(f"lr: {lr}\n", "lr: 0.5\n", 1))
    more = accord("train", "--resume", str(run_dir), "run.steps=5", cwd=tmp_path)
    assert more.returncode == 0, more.stderr
    assert (f"config.yaml changes training.lr from {lr!r} to 0.5 since the checkpoint of step 4 was written (the file "
            "was edited, or a resume's overrides rewrote it)") in more.stderr, more.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4, 5]

    rep = accord("report", str(run_dir), cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    report_dir = run_dir / "report"
    assert {"reward.png", "loss.png", "report.md"} <= {p.name for p in report_dir.iterdir()}
    assert "team/reward" in (report_dir / "report.md").read_text()


def test_envs_lists_tasks(tmp_path):
    out = accord("envs", cwd=tmp_path)
    assert out.returncode == 0
    assert "writing" in out.stdout and "letters" in out.stdout


@pytest.mark.slow
def test_bad_input_is_a_clear_error_not_a_traceback(tmp_path):
    bad_key = accord("train", "rollout.bach_size=3", cwd=tmp_path)
    assert bad_key.returncode == 2
    assert "did you mean 'rollout.batch_size'" in bad_key.stderr and "Traceback" not in bad_key.stderr
    missing = accord("train", "policies.main.model=/no/such/model", "task.name=letters", cwd=tmp_path)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "/no/such/model" in missing.stderr
    no_run = accord("train", "--resume", str(tmp_path / "nothing"), cwd=tmp_path)
    assert no_run.returncode == 2 and "no config.yaml" in no_run.stderr


def test_a_config_file_or_folder_whose_name_holds_an_equals_sign_is_no_override(tmp_path):
    """`accord plan lr=1e-3.yaml` read the file name as an override (unknown key 'lr'), and an option's value
    that looks like key=value (`--out eval=v2`) was taken from the option."""
    (tmp_path / "lr=1e-3.yaml").write_text((REPO / "examples" / "tiny.yaml").read_text())
    out = accord("plan", "lr=1e-3.yaml", "run.seed=2", cwd=tmp_path)
    assert out.returncode == 0 and "the run fits" in out.stdout, out.stderr[-2000:]
    out = accord("eval", "nothing", "--out", "eval=v2", "--samples", "0", cwd=tmp_path)
    assert out.returncode == 2 and "nothing is neither a config file nor a run directory" in out.stderr, out.stderr
    assert "expected one argument" not in out.stderr and not (tmp_path / "eval=v2").exists()


def test_version(tmp_path):
    from accord import __version__

    out = accord("--version", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"accord {__version__} (torch ") and "transformers" in out.stdout, out.stdout


def test_user_files_are_not_overwritten_and_empty_runs_are_one_line_errors(tmp_path):
    """A config file that is the run's own config.yaml (run_dir: .) is refused, not replaced by the resolved
    config; `accord report` on a run with no logged step or on a file, and a batch larger than the training set:
    one line each, exit code 2."""
    text = ("run: {name: t, run_dir: ., steps: 1, threads: 1}\n"
            "policies: {main: {model: tiny-qwen2, model_kwargs: {hidden_size: 64, num_layers: 2}}}\n"
            "task: {name: letters, eval_size: 0}\n")
    (tmp_path / "config.yaml").write_text(text)
    own = accord("train", "config.yaml", cwd=tmp_path)
    assert own.returncode == 2 and "Traceback" not in own.stderr, own.stderr[-2000:]
    assert "config.yaml is where the run writes its resolved config" in own.stderr
    assert (tmp_path / "config.yaml").read_text() == text and sorted(p.name for p in tmp_path.iterdir()) == [
        "config.yaml"]
    run = tmp_path / "killed"
    run.mkdir()
    (run / "metrics.jsonl").write_text("\n")
    for target, message in ((run, "contains no logged steps"), (tmp_path / "config.yaml", "is a file, not a run")):
        res = accord("report", str(target), cwd=tmp_path)
        assert res.returncode == 2 and "Traceback" not in res.stderr and message in res.stderr, res.stderr[-2000:]
    big = accord("train", "config.yaml", "run.run_dir=big", "task.train_size=3", "rollout.batch_size=8", cwd=tmp_path)
    assert big.returncode == 2 and "Traceback" not in big.stderr, big.stderr[-2000:]
    assert "rollout.batch_size=8 is more than the 3 training instances" in big.stderr


def test_a_resume_keeps_its_name_and_says_what_its_overrides_change(tmp_path, caplog):
    """run.name picks the directory as run.run_dir does: refused on a resume. Another changed setting is applied
    with a warning naming the old and new value (the steps trained so far used the old); run.steps says nothing."""
    from accord.cli import _say_resume_changes
    from accord.config import load_config, save_config

    run = tmp_path / "run"
    run.mkdir()
    save_config(load_config(overrides=["task.name=letters", f"run.run_dir={run}"]), run / "config.yaml")
    renamed = accord("train", "--resume", str(run), "run.name=other", cwd=tmp_path)
    assert renamed.returncode == 2 and "Traceback" not in renamed.stderr, renamed.stderr[-2000:]
    assert "run.name=other: a resumed run stays in its directory" in renamed.stderr
    recorded = load_config(run / "config.yaml", [f"run.run_dir={run}"])
    changed = load_config(run / "config.yaml", [f"run.run_dir={run}", "rollout.batch_size=4", "run.steps=99"])
    with caplog.at_level("WARNING", logger="accord"):
        _say_resume_changes(recorded, changed)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"--resume changes rollout.batch_size from {recorded.rollout.batch_size} to 4 for the steps from "
                     "here on (the steps trained so far used the first; config.yaml will record the second)"], lines


def test_the_advice_after_a_stop_without_a_checkpoint_is_one_that_works(tmp_path):
    """A Ctrl-C while `--overwrite` deleted the earlier run (config.yaml goes first) left its checkpoints without a
    config: `--resume`, which the line advised, cannot read such a run; running the command again can."""
    from accord.cli import _after_interrupt

    run = tmp_path / "run"
    (run / "checkpoints" / "step_000003").mkdir(parents=True)
    assert _after_interrupt(run).endswith("cannot be resumed; run the same command again to start over")
    (run / "config.yaml").write_text("run: {steps: 4}\n")
    assert _after_interrupt(run).endswith(f"continue with `accord train --resume {run}`")


def test_a_read_only_file_system_names_the_way_around_it():
    import errno

    from accord.cli import _one_line

    line = _one_line(OSError(errno.EROFS, "Read-only file system", "/runs/a/eval"))
    assert line.startswith("/runs/a/eval: Read-only file system; write elsewhere (`--out DIR`")
    assert _one_line(OSError(errno.EACCES, "Permission denied", "/x")).endswith("check the path and its permissions")


def test_a_config_that_cannot_be_written_leaves_no_temporary_file(tmp_path, monkeypatch):
    import accord.config.loading as loading
    from accord.config import Config

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(loading.os, "fsync", full)
    with pytest.raises(OSError):
        loading.save_config(Config(), tmp_path / "config.yaml")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["my run #2", "2024.10", "x: y"])
def test_resume_takes_the_run_directory_literally(tiny_cfg, tmp_path, name):
    """`accord train --resume DIR` put DIR into a run.run_dir=DIR override, which YAML read: 'my run #2' lost its
    '#2' as a comment, '2024.10' became the number 2024.1 and 'x: y' a mapping, each an error about an override the
    user never typed (and its fix refused as moving the run)."""
    from accord.cli import main
    from accord.config import config_from_dict
    from accord.tracking import read_metrics
    from accord.trainer import Trainer

    run_dir = tmp_path / name
    Trainer(config_from_dict(tiny_cfg(run={"steps": 1, "run_dir": str(run_dir)}))).train()
    assert main(["train", "--resume", str(run_dir), "run.steps=2"]) in (0, None)
    assert [m["step"] for m in read_metrics(run_dir)][-2:] == [1, 2]


def test_resume_of_a_run_whose_config_is_empty_or_a_folder_says_so(tmp_path):
    """An empty config.yaml on --resume was "config file ... is empty; add config keys, or run `accord train`
    without a file for the defaults" (a fix that starts another job); a config.yaml folder was "has no config.yaml"."""
    run = tmp_path / "run"
    run.mkdir()
    def resume():
        out = subprocess.run([sys.executable, "-m", "accord.cli", "train", "--resume", str(run)], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        return out.stderr

    (run / "config.yaml").write_text("\n")
    assert "config.yaml is empty, so the run's settings are lost; restore it" in resume()
    (run / "config.yaml").unlink()
    (run / "config.yaml").mkdir()
    assert "has a config.yaml that is a directory, not a file; --resume needs" in resume()
