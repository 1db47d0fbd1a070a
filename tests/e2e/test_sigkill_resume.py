"""Crash safety: runs killed with SIGKILL at random moments (and inside checkpoint writes and prunes),
then resumed, log every step exactly once and end with the weights of an uninterrupted run.

The kills are driven by this file run as a script (``python tests/e2e/test_sigkill_resume.py OUT_DIR``): it
imports accord once and forks one child per attempt; each child runs the real command line
(``accord.cli.main(["train", ...])``) and is killed with a real SIGKILL. Forking spares each attempt the
seconds of importing torch, so 30 kills fit in well under a minute on a 2-core CPU. Three windows are hit
on purpose through ``ACCORD_TEST_CRASH_DELAY`` (see :func:`accord.checkpoint._hook`): a checkpoint's files
written but not its manifest; manifest and the step's metrics written but not renamed into place; a pruned
checkpoint renamed to ``.trash_*`` but not yet deleted. The others land uniformly over a whole run.
"""

import pytest
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STEPS = 6
KILLS = 30
CONFIG = f"""\
run: {{name: crash, seed: 3, steps: {STEPS}, threads: 1, checkpoint_every: 1, keep_checkpoints: 2,
      eval_before: true, eval_after: true}}
specialization: shared
policies:
  main: {{model: tiny-qwen2, model_kwargs: {{hidden_size: 32, num_layers: 1, num_heads: 4, vocab_size: 512}}}}
task: {{name: letters, eval_size: 2}}
algorithm: {{num_generations: 2}}
rollout: {{batch_size: 2, max_new_tokens: 4, temperature: 1.0, eval_temperature: 1.0}}
training: {{lr: 0.01, micro_batch_size: 8}}
logging: {{console: false, tensorboard: false, completions_every: 1}}
"""
# what a kill aimed at a window waits for before it fires, and the delay that holds the child there
# (the directories carry the writing process's pid: what an earlier, killed attempt left does not count)
WINDOWS = {
    "manifest": lambda ck, pid: any((d / "state.pt").exists() for d in ck.glob(f".tmp_step_*_{pid}")),
    "commit": lambda ck, pid: any((d / "manifest.json").exists() for d in ck.glob(f".tmp_step_*_{pid}")),
    "discard": lambda ck, pid: any(ck.glob(f".trash_*_{pid}")),
}


def _child(argv: list[str], log: Path, delay: str | None) -> int:
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: the real command line, its output to a log file
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        if delay:
            os.environ["ACCORD_TEST_CRASH_DELAY"] = delay
        from accord.cli import main

        code = main(argv)
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else 1
    except BaseException:  # noqa: BLE001 - a child must never return into the parent's loop
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _argv(cfg: Path, run: Path) -> list[str]:
    if (run / "config.yaml").exists():
        return ["train", "--resume", str(run)]
    return ["train", str(cfg), f"run.run_dir={run}"]


def _wait(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _exited(pid: int) -> int | None:
    """The child's exit code if it has ended (reaping it), else None."""
    done, status = os.waitpid(pid, os.WNOHANG)
    return os.waitstatus_to_exitcode(status) if done else None


def drive(out: Path, kills: int, seed: int) -> dict:
    """The reference run, then ``kills`` SIGKILLs over as many runs as it takes, each run then resumed to its end."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import threading

    import accord.cli  # noqa: F401
    import accord.trainer  # noqa: F401  (torch, transformers: imported once, before any fork)
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401  (2 s of lazy import)
    from accord.models.tiny import _trained_tokenizer_json

    _trained_tokenizer_json(511)  # the tiny tokenizer's BPE, cached in this process and so in every child

    assert threading.active_count() == 1, "the parent must not start threads before forking"
    cfg = out / "crash.yaml"
    cfg.write_text(CONFIG)
    logs = out / "logs"
    logs.mkdir()
    t = time.perf_counter()
    rc = _wait(_child(_argv(cfg, out / "reference"), logs / "reference.log", None))
    ref_s = time.perf_counter() - t
    assert rc == 0, (logs / "reference.log").read_text()
    rng = random.Random(seed)
    plan = [w for w in WINDOWS for _ in range(4)] + ["random"] * (kills - 4 * len(WINDOWS))
    rng.shuffle(plan)
    runs = [out / "run_0"]
    record = []
    attempt = 0
    t0 = time.perf_counter()
    for kind in plan:
        while True:
            run = runs[-1]
            attempt += 1
            log = logs / f"attempt_{attempt:03d}.log"
            pid = _child(_argv(cfg, run), log, None if kind == "random" else f"{kind}:60")
            started = time.perf_counter()
            deadline = started + rng.uniform(0, ref_s) if kind == "random" else None
            ck = run / "checkpoints"
            rc = _exited(pid)
            while rc is None and (time.perf_counter() < deadline if deadline else not WINDOWS[kind](ck, pid)):
                time.sleep(0.005)
                rc = _exited(pid)
            if rc is None:
                os.kill(pid, signal.SIGKILL)
                rc = _wait(pid)
            if rc == -signal.SIGKILL:
                record.append({"kind": kind, "run": run.name, "after_s": round(time.perf_counter() - started, 3),
                               "left_tmp": bool(list(ck.glob(".tmp_step_*"))),
                               "left_trash": bool(list(ck.glob(".trash_*")))})
                break
            assert rc == 0, log.read_text()
            runs.append(out / f"run_{len(runs)}")  # that run finished before the kill: the next kill starts another
    for run in runs:  # each run resumed, uninterrupted, to its end
        attempt += 1
        log = logs / f"attempt_{attempt:03d}.log"
        rc = _wait(_child(_argv(cfg, run), log, None))
        assert rc == 0, log.read_text()
    return {"kills": record, "runs": [r.name for r in runs], "reference_s": round(ref_s, 2),
            "kill_phase_s": round(time.perf_counter() - t0, 2), "attempts": attempt}


def _weights(run: Path) -> dict:
    from safetensors.torch import load_file

    (ckpt,) = sorted((run / "checkpoints").glob(f"step_{STEPS:06d}"))
    return load_file(str(ckpt / "policies" / "main" / "model.safetensors"))


def _same_metrics(a: dict, b: dict) -> bool:
    volatile = ("time/", "perf/", "mem/")
    keys = {k for k in a if not k.startswith(volatile)} | {k for k in b if not k.startswith(volatile)}
    return all(a.get(k) == b.get(k) for k in keys)


@pytest.mark.slow
def test_sigkill_at_30_moments_loses_and_repeats_nothing(tmp_path):
    import torch

    from accord.tracking import read_metrics

    t = time.perf_counter()
    seed = os.environ.get("ACCORD_CRASH_TEST_SEED", "0")  # other seeds: other kill moments
    proc = subprocess.run([sys.executable, __file__, str(tmp_path), str(KILLS), seed], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    kills = summary["kills"]
    assert len(kills) == KILLS
    assert sum(k["left_tmp"] for k in kills) >= 4, kills          # killed inside checkpoint writes
    assert sum(k["left_trash"] for k in kills) >= 4, kills        # and inside prunes
    reference = read_metrics(tmp_path / "reference")
    ref_weights = _weights(tmp_path / "reference")
    assert [r["step"] for r in reference] == list(range(STEPS + 1))
    for name in summary["runs"]:
        run = tmp_path / name
        recs = read_metrics(run)
        assert [r["step"] for r in recs] == list(range(STEPS + 1)), name   # every step exactly once
        assert "eval/team/reward" in recs[0] and "eval/team/reward" in recs[-1], name  # before and final evaluation
        assert all(_same_metrics(a, b) for a, b in zip(reference, recs)), name
        w = _weights(run)
        assert all(torch.equal(ref_weights[k], w[k]) for k in ref_weights), name     # bit for bit
        ck = run / "checkpoints"
        left = sorted(p.name for p in ck.iterdir())
        assert left == [f"step_{STEPS - 1:06d}", f"step_{STEPS:06d}"], (name, left)
        tables = sorted(p.name for p in (run / "completions").iterdir())
        assert tables == [f"step_{s:06d}.jsonl" for s in range(1, STEPS + 1)], (name, tables)
    sys.stderr.write(f"crash test: {len(kills)} kills over {len(summary['runs'])} runs, {summary['attempts']} "
                     f"attempts, reference run {summary['reference_s']} s, {time.perf_counter() - t:.1f} s in all\n")


if __name__ == "__main__":
    result = drive(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
    sys.stdout.write(json.dumps(result) + "\n")


def _cli(*args, cwd):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "accord.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_second_train_into_a_run_is_refused_and_overwrite_starts_over(tmp_path):
    from accord.tracking import read_metrics

    cfg = tmp_path / "crash.yaml"
    cfg.write_text(CONFIG)
    run = tmp_path / "run"
    first = _cli("train", cfg, f"run.run_dir={run}", "run.steps=3", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    weights = (run / "checkpoints" / "step_000003" / "policies" / "main" / "model.safetensors").read_bytes()
    again = _cli("train", cfg, f"run.run_dir={run}", "run.steps=2", cwd=tmp_path)
    assert again.returncode == 2 and "already holds a run" in again.stderr
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2, 3]          # untouched
    assert (run / "checkpoints" / "step_000003" / "policies" / "main" / "model.safetensors").read_bytes() == weights
    over = _cli("train", cfg, f"run.run_dir={run}", "run.steps=2", "--overwrite", cwd=tmp_path)
    assert over.returncode == 0, over.stderr[-3000:]
    assert "--overwrite: deleting the earlier run" in over.stderr
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
