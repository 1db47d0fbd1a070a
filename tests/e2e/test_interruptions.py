"""A run meets the outside world: Ctrl-C, a full disk, a damaged metrics file, a start that failed, a second
process in the same directory, a tracker that will not start. Each is the real command line in a subprocess
(a real SIGINT, a real full tmpfs), ending in one line that says what happened and what to do, with nothing
lost."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "examples" / "tiny.yaml")
SMALL = ["policies.main.model_kwargs={hidden_size: 32, num_layers: 1, num_heads: 4, vocab_size: 512}",
         "rollout.batch_size=2", "algorithm.num_generations=2", "rollout.max_new_tokens=4", "task.eval_size=2",
         "logging.console=false", "run.threads=1", "run.eval_every=0"]


def _env(**extra) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **extra)
    for key in ("WANDB_API_KEY", "WANDB_MODE", "MLFLOW_TRACKING_URI", "ACCORD_TEST_CRASH_DELAY"):
        if key not in extra:
            env.pop(key, None)
    return env


def accord(*args, cwd, timeout=300, **env):
    return subprocess.run([sys.executable, "-m", "accord.cli", *map(str, args)], cwd=cwd, env=_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def start(*args, cwd, log: Path, **env) -> subprocess.Popen:
    out = open(log, "w")  # noqa: SIM115 - the child writes to it; closed with the test's tmp_path
    return subprocess.Popen([sys.executable, "-m", "accord.cli", *map(str, args)], cwd=cwd, env=_env(**env),
                            stdout=out, stderr=subprocess.STDOUT, text=True)


def steps_of(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]


def wait_for(condition, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, "the run ended before the moment the test waits for"
        assert time.monotonic() < end, "timed out waiting for the run"
        time.sleep(0.05)


def one_line(text: str, needle: str) -> str:
    lines = [line for line in text.splitlines() if needle in line]
    assert len(lines) == 1, text[-3000:]
    return lines[0]


def _weights(run: Path, step: int) -> bytes:
    return (run / "checkpoints" / f"step_{step:06d}" / "policies" / "main" / "model.safetensors").read_bytes()


# --- Ctrl-C (item 6) -----------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("sig, name, code", [(signal.SIGINT, "Ctrl-C", 130), (signal.SIGTERM, "SIGTERM", 143)])
def test_ctrl_c_finishes_the_step_checkpoints_it_and_the_resume_is_exact(tmp_path, sig, name, code):
    """A real SIGINT (or SIGTERM, as a scheduler sends) mid-run (no checkpoint scheduled before step 60): the step
    in progress is finished and checkpointed, one line says how to resume, exit code 130 (143); the resumed run
    ends with the weights and the metrics steps of an uninterrupted one."""
    run = tmp_path / "run"
    proc = start("train", TINY, f"run.run_dir={run}", "run.steps=60", "run.checkpoint_every=0", *SMALL,
                 cwd=tmp_path, log=tmp_path / "train.log")
    wait_for(lambda: len(steps_of(run)) >= 3, proc)   # the eval before training and two steps logged
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == code
    log = (tmp_path / "train.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    assert f"{name}: finishing step" in log
    line = one_line(log, "--resume")
    done = steps_of(run)[-1]
    assert f"stopped by {name} after step {done}/60" in line and f"accord train --resume {run}" in line, line
    assert steps_of(run) == list(range(done + 1))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [f"step_{done:06d}"]

    end = done + 2
    resumed = accord("train", "--resume", run, f"run.steps={end}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    reference = accord("train", TINY, f"run.run_dir={tmp_path / 'reference'}", f"run.steps={end}",
                       "run.checkpoint_every=0", *SMALL, cwd=tmp_path)
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert steps_of(run) == list(range(end + 1))
    assert _weights(run, end) == _weights(tmp_path / "reference", end)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_a_run_directory_removed_or_replaced_mid_run_stops_the_run(tmp_path, how):
    """The run's folder deleted (or moved away and a new one made in its place) while it trains: the run went on
    and exited 0, its metrics written into the deleted file and its checkpoints into a folder it recreated, with
    no config.yaml to resume from. Now it stops at the next step in one line; a moved run resumes from its new
    path."""
    run = tmp_path / "run"
    proc = start("train", TINY, f"run.run_dir={run}", "run.steps=400", "run.checkpoint_every=2", *SMALL,
                 "logging.report_to=[]", "logging.completions_every=0", "training.audit='off'",
                 cwd=tmp_path, log=tmp_path / "train.log")
    wait_for(lambda: (run / "checkpoints" / "step_000002").is_dir(), proc)
    if how == "removed":   # (renamed first: rmtree alone can race the run's next checkpoint into the folder)
        run.rename(tmp_path / "trash")
        shutil.rmtree(tmp_path / "trash", ignore_errors=True)
    else:
        run.rename(tmp_path / "moved")
        run.mkdir()
    assert proc.wait(timeout=120) == 2
    log = (tmp_path / "train.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    line = one_line(log, " ERROR ")
    assert f"run directory {run} was removed or replaced while the run was going on" in line, line
    assert how == "removed" and not run.exists() or not any(run.iterdir())   # nothing written after
    if how == "replaced":
        done = int(sorted((tmp_path / "moved" / "checkpoints").iterdir())[-1].name.split("_")[1])
        resumed = accord("train", "--resume", tmp_path / "moved", f"run.steps={done + 1}", cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert steps_of(tmp_path / "moved")[-1] == done + 1


@pytest.mark.slow
def test_a_run_directory_removed_while_a_checkpoint_is_written_stops_the_run(tmp_path):
    """Removed while the checkpoint of step 4 is being written (held for 5 s before its policies are saved): the
    policy's save made its folder with its parents, so the run directory came back with a checkpoint written into
    it. Now the save fails on the missing folder and the run stops in one line, with nothing made again."""
    run = tmp_path / "run"
    proc = start("train", TINY, f"run.run_dir={run}", "run.steps=6", "run.checkpoint_every=2", *SMALL,
                 "logging.report_to=[]", "logging.completions_every=0", "training.audit='off'",
                 cwd=tmp_path, log=tmp_path / "train.log", ACCORD_TEST_CRASH_DELAY="policies:5")
    wait_for(lambda: (run / "checkpoints" / "step_000002").is_dir(), proc)
    wait_for(lambda: any((run / "checkpoints").glob(".tmp_step_000004_*")), proc)
    run.rename(tmp_path / "trash")
    shutil.rmtree(tmp_path / "trash")
    assert proc.wait(timeout=120) == 2
    log = (tmp_path / "train.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    line = one_line(log, " ERROR ")
    assert f"run directory {run} was removed or replaced while the run was going on" in line, line
    assert "writing the checkpoint of step 4 failed" in line, line
    assert not run.exists()


def test_a_run_directory_removed_inside_a_policys_save_stops_the_run(tiny_cfg, tmp_path, monkeypatch):
    """Removed after a policy's save made its folder, before the weights are written: safetensors' own error
    (not an OSError) went past the run's check and ended the run with a traceback. Now it is the same one line."""
    import accord.policies.model as model_module
    from accord.checkpoint import CheckpointError
    from accord.config import config_from_dict
    from accord.trainer import Trainer

    run = tmp_path / "run"
    real = model_module.save_model
    calls = []

    def remove_then_save(model, filename):
        calls.append(filename)
        if len(calls) == 2:   # the checkpoint of step 2
            run.rename(tmp_path / "trash")
            shutil.rmtree(tmp_path / "trash")
        return real(model, filename)

    monkeypatch.setattr(model_module, "save_model", remove_then_save)
    trainer = Trainer(config_from_dict(tiny_cfg(run={"steps": 3, "checkpoint_every": 1})))
    with pytest.raises(CheckpointError, match="was removed or replaced while the run was going on") as err:
        trainer.train()
    assert "writing the checkpoint of step 2 failed: SafetensorError" in str(err.value)
    assert len(calls) == 2 and not run.exists()


@pytest.mark.slow
@pytest.mark.parametrize("first, second, name, code", [(signal.SIGINT, signal.SIGINT, "Ctrl-C", 130),
                                                       (signal.SIGTERM, signal.SIGTERM, "SIGTERM", 143)])
def test_a_second_ctrl_c_stops_at_once(tmp_path, first, second, name, code):
    """The second SIGINT (SIGTERM) lands while the checkpoint the first one asked for is being written (held there
    for 60 s by the crash-test hook): the run stops at once, exit code 130 (143), one line, no traceback, and
    nothing half written is left under checkpoints/."""
    run = tmp_path / "run"
    proc = start("train", TINY, f"run.run_dir={run}", "run.steps=60", "run.checkpoint_every=0", *SMALL,
                 cwd=tmp_path, log=tmp_path / "train.log", ACCORD_TEST_CRASH_DELAY="manifest:60")
    wait_for(lambda: len(steps_of(run)) >= 2, proc)
    proc.send_signal(first)
    wait_for(lambda: any((run / "checkpoints").glob(".tmp_step_*/state.pt")), proc)
    t = time.monotonic()
    proc.send_signal(second)
    assert proc.wait(timeout=30) == code
    assert time.monotonic() - t < 15
    log = (tmp_path / "train.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    line = one_line(log, f"stopped at once by {name}")
    assert f"no checkpoint yet: `accord train --resume {run}` starts it over from step 0" in line, line
    assert list((run / "checkpoints").iterdir()) == []
    again = accord("train", "--resume", run, "run.steps=2", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert steps_of(run) == [0, 1, 2]


# --- a full disk and a damaged metrics file (item 8) -------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 12 MiB tmpfs (root only): the disk that fills up."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mount)], capture_output=True,
                         text=True)
    if res.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path, leave: int) -> Path:
    """Fill ``disk`` up to ``leave`` bytes free with one file; return it."""
    st = os.statvfs(disk)
    filler = disk / "filler"
    with open(filler, "wb") as fh:
        fh.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return filler


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_keeps_the_last_one_and_says_so(tmp_path, small_disk):
    run = small_disk / "run"
    first = accord("train", TINY, f"run.run_dir={run}", "run.steps=2", *SMALL, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    saved = _weights(run, 2)
    metrics = (run / "metrics.jsonl").read_bytes()
    filler = _fill(small_disk, leave=64 * 1024)  # the step's logs fit, its checkpoint does not
    full = accord("train", "--resume", run, "run.steps=4", cwd=tmp_path)
    assert full.returncode == 2, full.stderr[-3000:]
    assert "Traceback" not in full.stderr, full.stderr[-3000:]
    line = one_line(full.stderr, " ERROR ")
    assert "disk full while writing the checkpoint of step" in line, line
    assert f"the last checkpoint, {run / 'checkpoints' / 'step_000002'}, is intact (verified)" in line, line
    assert f"accord train --resume {run}" in line, line
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002"]   # no partial directory
    assert _weights(run, 2) == saved
    assert (run / "metrics.jsonl").read_bytes().startswith(metrics)
    filler.unlink()
    again = accord("train", "--resume", run, "run.steps=4", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert steps_of(run) == [0, 1, 2, 3, 4]


@pytest.mark.slow
def test_a_full_disk_at_set_up_is_one_line_whose_advice_works(tmp_path, small_disk):
    """Room for the config but not for TensorBoard's first events: one line (tensorboard's writer thread printed
    its own traceback beside it), and its advice is to run the command again, which a --resume of a run without
    its config.yaml could not do."""
    for leave in (0, 8 * 1024):   # no room for the config; room for it but not for the events
        run = small_disk / f"run{leave}"
        filler = _fill(small_disk, leave=leave)
        command = ["train", TINY, f"run.run_dir={run}", "run.steps=1", *SMALL, "logging.report_to=[tensorboard]"]
        full = accord(*command, cwd=tmp_path)
        assert full.returncode == 2, full.stderr[-3000:]
        assert "Traceback" not in full.stderr and "Exception in thread" not in full.stderr, full.stderr[-3000:]
        line = one_line(full.stderr, " ERROR ")
        assert "disk full" in line, line
        configured = (run / "config.yaml").is_file()
        assert configured == (leave > 0)
        assert line.endswith(f"`accord train --resume {run}`" if configured else "run the same command again"), line
        filler.unlink()
        again = accord(*(["train", "--resume", run] if configured else command), cwd=tmp_path)
        assert again.returncode == 0, again.stderr[-3000:]
        assert steps_of(run)[-1] == 1


@pytest.mark.slow
def test_a_full_disk_while_logging_is_one_line(tmp_path, small_disk):
    """ENOSPC from our own writes (metrics, completion tables): one line naming the last checkpoint."""
    run = small_disk / "run"
    first = accord("train", TINY, f"run.run_dir={run}", "run.steps=1", *SMALL, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    _fill(small_disk, leave=0)
    full = accord("train", "--resume", run, "run.steps=3", "logging.completions_every=1", cwd=tmp_path)
    assert full.returncode == 2, full.stderr[-3000:]
    assert "Traceback" not in full.stderr, full.stderr[-3000:]
    line = one_line(full.stderr, " ERROR ")
    assert "disk full" in line and f"accord train --resume {run}" in line, line
    assert "step_000001" in line and "is intact (verified)" in line, line


SFT = """run: {name: warm, threads: 1, steps: 2, eval_before: false, eval_after: false}
specialization: shared
policies:
  main: {model: tiny-qwen2, model_kwargs: {hidden_size: 64, num_layers: 2, max_position_embeddings: 4096}}
task: {name: planpath, options: {size: 5, max_turns: 2, workflow: direct}, eval_size: 2}
algorithm: {name: atgrpo, num_generations: 2}
rollout: {batch_size: 2, max_new_tokens: 96, max_prompt_tokens: 2048}
training: {micro_batch_size: 16, bf16: false}
logging: {console: false, report_to: []}
sft: {instances: 24, eval_size: 2, steps: 30, batch_size: 16, lr: 0.003, checkpoint_every: 5, eval_success: false}
"""


@pytest.mark.slow
def test_a_full_disk_during_sft_says_to_run_sft_again(tmp_path, small_disk):
    """The advice of an RL run's checkpoint (`accord train --resume` in the unfinished warm start) would train RL
    there; sft's own is to run the same command again, which then finishes the warm start."""
    (tmp_path / "sft.yaml").write_text(SFT)
    out = small_disk / "w"
    filler = _fill(small_disk, leave=3 * 2**20)
    full = accord("sft", "sft.yaml", f"sft.output_dir={out}", cwd=tmp_path)
    assert full.returncode == 2, full.stderr[-3000:]
    line = one_line(full.stderr, " ERROR ")
    assert "disk full while writing the checkpoint of step" in line, line
    assert "run the same `accord sft` command again" in line and "accord train" not in line, line
    filler.unlink()
    again = accord("sft", "sft.yaml", f"sft.output_dir={out}", cwd=tmp_path)
    assert again.returncode == 0 and "resuming" in again.stderr, again.stderr[-3000:]
    assert (out / "main" / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_full_disk_during_export_is_one_line_and_leaves_nothing(trained, tmp_path, small_disk):
    _fill(small_disk, leave=16 * 1024)
    full = accord("export", trained, "--out", small_disk / "exp", cwd=tmp_path)
    assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr[-3000:]
    line = one_line(full.stderr, " ERROR ")
    assert "disk full while exporting" in line and "nothing was written there" in line, line
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["eval", "report"])
def test_a_full_disk_in_eval_or_report_names_the_file_it_was_writing(trained, tmp_path, small_disk, command):
    out = small_disk / "out"
    _fill(small_disk, leave=0)
    extra = ["--samples", "0", "--no-base"] if command == "eval" else []
    full = accord(command, trained, "--out", out, *extra, cwd=tmp_path)
    assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr[-3000:]
    line = one_line(full.stderr, " ERROR ")
    assert f"disk full writing {out}/" in line and "free space on its disk and run the command again" in line, line
    assert not [p for p in out.rglob("*") if p.is_file()]   # no half-written file left behind


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trained")
    res = accord("train", TINY, f"run.run_dir={tmp / 'run'}", "run.steps=2", "run.checkpoint_every=1",
                 "run.eval_before=true", *SMALL, cwd=tmp)
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp / "run"


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    (dst / "config.yaml").write_text((dst / "config.yaml").read_text().replace(str(run), str(dst)))
    return dst


@pytest.mark.slow
@pytest.mark.parametrize("garbage", ["{not json\n", '"step"\n', '{"loss": 1}\n'])
def test_a_damaged_metrics_line_is_one_line_and_changes_nothing(trained, tmp_path, garbage):
    run = _copy(trained, tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    damaged = "".join(lines[:2] + [garbage] + lines[2:])
    (run / "metrics.jsonl").write_text(damaged)
    for args in (["train", "--resume", run, "run.steps=3"], ["report", run]):
        res = accord(*args, cwd=tmp_path)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
        line = one_line(res.stderr, " ERROR ")
        assert f"{run / 'metrics.jsonl'}:3:" in line and "fix or delete that line" in line, line
        assert (run / "metrics.jsonl").read_text() == damaged


# --- a start that failed, a directory in use (item 9) ------------------------------------------------------

BROKEN_TASK = '''
from pathlib import Path


class Flaky:
    """A task whose reward has a bug while the file BUG exists."""
    name = "flaky"
    agents = ("a", "b")

    def rows(self, split, limit=None, seed=0):
        return [{"id": f"{split}-{i}", "n": i} for i in range(8)]

    def prompt(self, agent, row):
        return [{"role": "user", "content": f"{agent}: say {row['n']}"}]

    def reward(self, *, prompts, completions, agents, **columns):
        if Path("BUG").exists():
            raise ZeroDivisionError("division by zero")
        return [0.5] * len(completions["a"])
'''


@pytest.mark.slow
def test_a_run_that_failed_at_start_does_not_block_the_same_command(tmp_path):
    """The reward raised in the evaluation before training: config.yaml was written, no step completed. After
    the fix, the very same command runs (it used to be refused as "already holds a run")."""
    (tmp_path / "flaky.py").write_text(BROKEN_TASK)
    (tmp_path / "BUG").write_text("")
    args = ["train", TINY, "task.name=flaky:Flaky", "agents=[]", "run.steps=1", *SMALL]
    failed = accord(*args, cwd=tmp_path, PYTHONPATH=str(tmp_path))
    assert failed.returncode != 0 and "ZeroDivisionError" in failed.stderr, failed.stderr[-3000:]
    assert (tmp_path / "runs" / "tiny" / "config.yaml").is_file()
    (tmp_path / "BUG").unlink()
    again = accord(*args, cwd=tmp_path, PYTHONPATH=str(tmp_path))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "stopped before completing a step" in again.stderr and "starting it over" in again.stderr
    assert steps_of(tmp_path / "runs" / "tiny") == [0, 1]
    refused = accord(*args, cwd=tmp_path, PYTHONPATH=str(tmp_path))   # now it holds a step: protected
    assert refused.returncode == 2 and "already holds a run" in refused.stderr, refused.stderr[-3000:]


def test_a_directory_in_use_by_another_process_is_refused(tmp_path):
    """Starting over a run without a completed step must not pull the files from under a process still starting
    it: the directory's lock, held by another process, is refused with one line naming it."""
    from accord.checkpoint import claim_run_dir
    from accord.config import ConfigError

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("run: {name: x}\n")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time\n"
        f"fh = open({str(run / '.accord.lock')!r}, 'a+')\n"
        "fcntl.flock(fh, fcntl.LOCK_EX)\nfh.write('pid 4242\\n'); fh.flush()\n"
        "print('held', flush=True)\ntime.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for kwargs in ({"resume": False, "overwrite": False}, {"resume": True, "overwrite": False},
                       {"resume": False, "overwrite": True}):
            with pytest.raises(ConfigError, match=r"is in use by a running accord \(pid 4242\)"):
                claim_run_dir(run, **kwargs)
        assert (run / "config.yaml").is_file()
    finally:
        holder.kill()
        holder.wait()
    release = claim_run_dir(run, resume=False, overwrite=False)   # the holder is gone: started over
    try:
        assert not (run / "config.yaml").exists()
        with open(run / ".accord.lock") as other:   # held by this process now
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        release()


# --- trackers that do not start (item 12) ------------------------------------------------------------------

@pytest.mark.slow
def test_wandb_without_a_key_is_one_line(tmp_path):
    pytest.importorskip("wandb")
    res = accord("train", TINY, "run.steps=1", "logging.report_to=[wandb]", *SMALL, cwd=tmp_path,
                 HOME=str(tmp_path), WANDB_DIR=str(tmp_path), NETRC=str(tmp_path / "netrc"))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    line = one_line(res.stderr, " ERROR ")
    assert "logging.report_to=wandb: W&B did not start a run (UsageError: No API key configured" in line, line
    assert "wandb login" in line and "WANDB_MODE=offline" in line, line


@pytest.mark.slow
def test_mlflow_default_uri_is_one_clear_line(tmp_path):
    pytest.importorskip("mlflow")
    if __import__("importlib").util.find_spec("sqlalchemy") is not None:
        pytest.skip("the full mlflow package is installed: its default sqlite store works")
    res = accord("train", TINY, "run.steps=1", "logging.report_to=[mlflow]", *SMALL, cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    line = one_line(res.stderr, " ERROR ")
    assert f"MLflow cannot use the tracking URI sqlite:///{tmp_path}/mlflow.db (MLflow's default)" in line, line
    assert "set logging.mlflow_tracking_uri" in line and "pip install mlflow" in line, line
    assert "See https" not in line and "  " not in line.split(" ERROR ", 1)[1], line


# --- resuming a finished run (item 10) ---------------------------------------------------------------------

@pytest.mark.slow
def test_resuming_a_finished_run_says_there_is_nothing_to_do(trained, tmp_path):
    run = _copy(trained, tmp_path)
    before = {name: (run / name).read_bytes() for name in ("metrics.jsonl", "config.yaml")}
    # a kill between the last step's commit and its prune leaves one checkpoint too many (keep_checkpoints=2):
    # resuming the finished run prunes it (a SIGKILL test's run once ended with three)
    shutil.copytree(run / "checkpoints" / "step_000001", run / "checkpoints" / "step_000000")
    res = accord("train", "--resume", run, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    line = one_line(res.stderr, "nothing to do")
    assert f"{run} already reached run.steps=2 (checkpoint step_000002)" in line, line
    assert f"accord train --resume {run} run.steps=4" in line, line
    assert "resumed" not in res.stderr and "loading" not in res.stderr.lower()
    assert {name: (run / name).read_bytes() for name in before} == before


# --- checkpoints that cannot be verified (item 7) ----------------------------------------------------------

def _flip_low_bits(path: Path, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    for i in range(n):
        data[len(data) - 8 * (i + 1)] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_a_checkpoint_without_its_manifest_is_not_loaded_unless_allowed(trained, tmp_path):
    """Deleting manifest.json beside bit-rotted weights used to resume from them silently: now the checkpoint is
    skipped like a corrupted one (the run falls back to the last verified checkpoint), and loaded only with
    --allow-unverified."""
    run = _copy(trained, tmp_path)
    newest = run / "checkpoints" / "step_000002"
    (newest / "manifest.json").unlink()
    _flip_low_bits(newest / "policies" / "main" / "model.safetensors")
    res = accord("train", "--resume", run, "run.steps=3", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    skipped = one_line(res.stderr, "skipping checkpoint")
    assert f"{newest}: no manifest.json, so its files cannot be verified" in skipped, skipped
    assert "--allow-unverified" in skipped, skipped
    assert f"resumed {run} at step 1 of 3" in res.stderr
    assert steps_of(run) == [0, 1, 2, 3]


@pytest.mark.slow
def test_no_verifiable_checkpoint_is_one_line_naming_the_flag_that_loads_one(trained, tmp_path):
    run = _copy(trained, tmp_path)
    for ckpt in (run / "checkpoints").iterdir():
        (ckpt / "manifest.json").unlink()
    refused = accord("train", "--resume", run, "run.steps=3", cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    line = one_line(refused.stderr, " ERROR ")
    assert "none of the 2 checkpoint(s)" in line and "pass --allow-unverified to load it anyway" in line, line
    allowed = accord("train", "--resume", run, "run.steps=3", "--allow-unverified", cwd=tmp_path)
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert "has no manifest.json: loading it unverified (--allow-unverified)" in allowed.stderr
    assert f"resumed {run} at step 2 of 3" in allowed.stderr


@pytest.mark.slow
def test_eval_skips_a_checkpoint_without_its_manifest_unless_allowed(trained, tmp_path):
    run = _copy(trained, tmp_path)
    (run / "checkpoints" / "step_000002" / "manifest.json").unlink()
    ev = accord("eval", run, "--samples", "0", "--no-base", cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "| step_000001 |" in ev.stdout and "skipping checkpoint" in ev.stderr
    assert not list((run / "eval").glob(".accord-work.*"))   # the evaluating run's scratch directory is gone
    ev = accord("eval", run, "--samples", "0", "--no-base", "--allow-unverified", cwd=tmp_path)
    assert ev.returncode == 0 and "| step_000002 |" in ev.stdout, ev.stderr[-3000:]


def test_checkpoint_state_loads_weights_only(tmp_path):
    """state.pt holds plain containers and tensors (NumPy's random state as a list): torch.load with
    weights_only=True reads it; a state.pt of an older accord (a NumPy array inside) still loads, weights-only;
    a crafted pickle is refused without running its code."""
    import numpy as np
    import torch

    from accord.checkpoint import (CheckpointError, load_checkpoint, load_state, rng_state, set_rng_state,
                                   write_checkpoint)

    tmp = write_checkpoint(tmp_path, 3, {}, {"data_position": 12})
    state = torch.load(tmp / "state.pt", weights_only=True)
    assert state["step"] == 3 and state["data_position"] == 12
    np.random.seed(5)
    set_rng_state(state["rng"])
    assert np.random.get_state()[1].tolist() == state["rng"]["numpy"][1]

    old = dict(rng_state(), numpy=np.random.get_state())
    torch.save({"step": 1, "rng": old}, tmp_path / "old.pt")
    assert isinstance(load_state(tmp_path / "old.pt")["rng"]["numpy"][1], np.ndarray)

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    bad = tmp_path / "bad"
    (bad / "policies").mkdir(parents=True)
    torch.save({"step": 1, "rng": Evil()}, bad / "state.pt")
    with pytest.raises(CheckpointError, match="state.pt cannot be loaded"):
        load_checkpoint(bad, {})
    assert not (tmp_path / "pwned").exists()
