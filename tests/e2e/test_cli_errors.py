"""Every bad input is one line of error with exit code 2 that names the key or file, the problem and the fix
(``--debug`` shows the traceback): the command line run in a subprocess, as a user would.

The cases of CASES share one subprocess (:data:`BATCH`): it runs each command line through
``accord.cli.main``, as ``python -m accord.cli`` does, in the case's own directory with stdout and stderr of
its own, so torch and transformers are imported once instead of once per case.
``test_a_case_in_its_own_process_prints_the_same_line`` runs a train and an eval case as separate
``python -m accord.cli`` processes and checks that they print the batch's line."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "examples" / "tiny.yaml")
SMALL = ["policies.main.model_kwargs={hidden_size: 32, num_layers: 1, num_heads: 4, vocab_size: 512}",
         "rollout.batch_size=2", "algorithm.num_generations=2", "rollout.max_new_tokens=4", "task.eval_size=2",
         "logging.tensorboard=false", "logging.console=false", "run.threads=1"]


def accord(*args, cwd):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "accord.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def one_line_error(res) -> str:
    """The single ERROR line of a run that failed with exit code 2 and no traceback."""
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, res.stderr[-3000:]
    return errors[0]


def _files(tmp: Path) -> None:
    (tmp / "syntax.yaml").write_text("run:\n  steps: 3\n  name: [a\n")
    (tmp / "latin1.yaml").write_bytes(b"run:\n  name: caf\xe9\n")
    (tmp / "empty.yaml").write_text("")
    (tmp / "list.yaml").write_text("- 1\n- 2\n")
    (tmp / "afile").write_text("not a directory\n")
    (tmp / "dup.yaml").write_text("run:\n  steps: 3\ntask:\n  name: letters\nrun:\n  seed: 4\n")
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"] + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 12)]
    (tmp / "bomb.yaml").write_text("task:\n  options:\n" + "".join(f"    {line}\n" for line in bomb))
    (tmp / "held" / "tiny").mkdir(parents=True)
    (tmp / "held" / "tiny" / "config.yaml").write_text("run: {name: tiny}\n")
    (tmp / "held" / "tiny" / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')   # a completed step


# (id, arguments, what the error line must contain: the key or file, the problem, the fix)
CASES = [
    ("lr-nan", ["train", "training.lr=nan"], ["training.lr", "not a finite number", "finite value"]),
    ("lr-1e309", ["train", "training.lr=1e309"], ["training.lr", "not a finite number"]),
    ("lr-yaml-inf", ["train", "training.lr=.inf"], ["training.lr", "not a finite number"]),
    ("nan-in-list", ["train", "training.betas=[.nan, 0.9]"], ["training.betas.0", "not a finite number"]),
    ("nan-in-options", ["train", "task.options.x=.nan"], ["task.options.x", "not a finite number"]),
    ("nan-in-model-kwargs", ["train", "policies.main.model=tiny-qwen2", "policies.main.model_kwargs.hidden_size=.nan"],
     ["policies.main.model_kwargs.hidden_size", "not a finite number"]),
    ("inf-timeout", ["train", "ray.init_timeout_s=inf"], ["ray.init_timeout_s", "not a finite number"]),
    ("policy-lr-negative", ["train", "policies.main.lr=-1"], ["policies.main.lr", "must be > 0"]),
    ("yaml-syntax", ["train", "syntax.yaml"], ["syntax.yaml", "invalid YAML", "line 4, column 1", "fix the syntax"]),
    ("yaml-not-utf8", ["train", "latin1.yaml"], ["latin1.yaml", "not UTF-8", "0xe9", "save it as UTF-8"]),
    ("yaml-empty", ["train", "empty.yaml"], ["empty.yaml", "is empty", "without a file for the defaults"]),
    ("yaml-list", ["train", "list.yaml"], ["list.yaml", "mapping at the top level"]),
    ("config-missing", ["train", "nope.yaml"], ["nope.yaml", "does not exist", "examples/tiny.yaml"]),
    ("config-is-dir", ["train", "held"], ["held", "is a directory", "--resume"]),
    ("override-bad-yaml", ["train", "rollout.batch_size=[1"], ["rollout.batch_size", "not valid YAML", "column 3"]),
    ("yaml-duplicate-section", ["train", "dup.yaml"], ["dup.yaml", "'run' appears twice (line 1 and line 5)",
                                                       "merge them"]),
    ("yaml-alias-bomb", ["train", "bomb.yaml"], ["bomb.yaml", "more than 100000 values", "aliases"]),
    ("override-duplicate-key", ["train", "task.options={a: 1, a: 2}"], ["task.options", "'a' appears twice"]),
    ("run-name-up", ["train", TINY, "run.name=../x"], ["run.name='../x'", "contains '..'", "run.output_dir"]),
    ("run-name-absolute", ["train", TINY, "run.name=/tmp/x"], ["run.name='/tmp/x'", "absolute path", "run.run_dir"]),
    ("model-typo", ["train", "policies.main.model=smolm2-135m", "task.name=letters"],
     ["policies.main.model='smolm2-135m'", "did you mean 'smollm2-135m'"]),
    ("model-typo-tiny-config", ["train", TINY, "policies.main.model=smolm2-135m"],
     ["policies.main.model='smolm2-135m'", "did you mean 'smollm2-135m'"]),
    ("unknown-model-with-kwargs", ["train", "policies.main.model=nosuch", "policies.main.model_kwargs.hidden_size=32"],
     ["policies.main.model_kwargs", "'nosuch'", "drop model_kwargs or pick a tiny model"]),
    ("unknown-model-kwarg", ["train", "policies.main.model=tiny-qwen2", "policies.main.model_kwargs.hidden_sise=64"],
     ["policies.main.model_kwargs.hidden_sise", "did you mean"]),
    ("hidden-size-negative", ["train", "policies.main.model=tiny-qwen2", "policies.main.model_kwargs.hidden_size=-8"],
     ["policies.main.model_kwargs.hidden_size=-8", "must be >= 1"]),
    ("hidden-size-heads", ["train", "policies.main.model=tiny-qwen2", "policies.main.model_kwargs.hidden_size=30"],
     ["policies.main.model_kwargs", "multiple of num_heads"]),
    ("model-kwarg-type", ["train", "policies.main.model=tiny-qwen2", "policies.main.model_kwargs.num_layers=two"],
     ["policies.main.model_kwargs.num_layers='two'", "not a valid int"]),
    ("output-under-file", ["train", TINY, "run.output_dir=afile/sub"], ["afile is a file", "run.output_dir"]),
    ("override-into-scalar", ["train", TINY, "run.steps.x=1"], ["run.steps.x=1", "run.steps is 20", "run.steps=VALUE"]),
    ("section-not-mapping", ["train", "run=5"], ["run must be a mapping", "run.name=..."]),
    ("policy-not-mapping", ["train", "policies.main=5"], ["policies.main must be a mapping"]),
    ("agents-not-list", ["train", "agents=5"], ["agents must be a list"]),
    ("wrong-type", ["train", "run.steps=abc"], ["run.steps='abc'", "not a valid int"]),
    ("wrong-type-list", ["train", "training.betas=[a, b]"], ["training.betas", "two numbers"]),
    ("seed-negative", ["train", "run.seed=-1"], ["run.seed=-1", "out of range", "[0, 2147483647]"]),
    ("seed-2-40", ["train", f"run.seed={2**40}"], [f"run.seed={2**40}", "out of range"]),
    ("size-zero", ["train", "rollout.batch_size=0"], ["rollout.batch_size=0", "must be >= 1"]),
    ("size-negative", ["train", "rollout.max_new_tokens=-1"], ["rollout.max_new_tokens=-1", "must be >= 1"]),
    ("count-negative", ["train", "task.train_size=-3"], ["task.train_size=-3", "negative", ">= 0"]),
    ("name-empty", ["train", "run.name="], ["run.name is empty"]),
    ("unknown-key", ["train", "rollout.bach_size=3"], ["did you mean 'rollout.batch_size'"]),
    ("run-dir-holds-a-run", ["train", TINY, "run.output_dir=held"],
     ["already holds a run", "--resume held/tiny", "--overwrite", "run.name"]),
    ("resume-and-overwrite", ["train", "--resume", "held/tiny", "--overwrite"],
     ["--resume", "--overwrite", "only one"]),
    ("resume-no-run", ["train", "--resume", "nothing"], ["nothing has no config.yaml"]),
    ("eval-k-zero", ["eval", TINY, "--k", "0"], ["--k 0", "k >= 1", "--k 1 4"]),
    ("eval-k-above-samples", ["eval", TINY, "--samples", "2", "--k", "1", "4"],
     ["pass@4 needs at least 4 samples", "--samples 4"]),
    ("eval-temperature-nan", ["eval", TINY, "--temperature", "nan"], ["--temperature=nan", "finite number >= 0.0001"]),
    # key=value after an option is an override (here a misspelt one, so that the error proves where it went)
    ("eval-override-after-option", ["eval", TINY, "--samples", "2", "task.eval_sise=3"],
     ["task.eval_sise", "did you mean 'task.eval_size'"]),
    ("eval-override-after-k", ["eval", TINY, "--k", "1", "2", "task.eval_sise=3"], ["did you mean 'task.eval_size'"]),
    ("eval-missing-target", ["eval", "nothing.yaml"], ["nothing.yaml", "neither a config file nor a run directory"]),
    # the controls of issue 28 (a loss that needs stored log-probs with a backend without them):
    # tests/test_trainer_controls.py
    ("all-agents-frozen", ["train", TINY, "agents.0.trainable=false", "agents.1.trainable=false"],
     ["every agent", "trainable=false", "set trainable=true for at least one agent"]),
    ("frozen-shares-a-policy", ["train", TINY, "agents.0.trainable=false"],
     ["policy 'main' acts for frozen agents ['e'] and trained agents ['o']", "a policy of their own"]),
    ("agent-cap-above-context", ["train", TINY, *SMALL, "agents.1.sampling.max_new_tokens=4096"],
     ["agents.o.sampling.max_new_tokens=4096", "context of 1024 tokens", "give a cap below 1024"]),
]


# Runs the cases of a JSON file (argv[1]) as `python -m accord.cli ARGS` would and writes each one's exit code,
# stdout and stderr to argv[2]: a fresh root log handler on the case's own stderr, an uncaught exception's
# traceback on its stderr with exit code 1, as the interpreter does.
BATCH = r"""
import contextlib, io, json, logging, os, sys, traceback
from accord.cli import main
results = []
for case in json.load(open(sys.argv[1])):
    os.chdir(case["cwd"])
    for handler in logging.root.handlers[:]:
        logging.root.removeHandler(handler)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(case["args"])
        except SystemExit as exc:
            code = exc.code
        except BaseException:
            traceback.print_exc()
            code = 1
    code = 0 if code is None else code if isinstance(code, int) else 1
    results.append({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
json.dump(results, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """Every case of CASES run in one subprocess, each in a directory of its own: {id: result}."""
    root = tmp_path_factory.mktemp("cases")
    cases = []
    for cid, args, _ in CASES:
        (root / cid).mkdir()
        _files(root / cid)
        cases.append({"id": cid, "args": [str(a) for a in args], "cwd": str(root / cid)})
    (root / "cases.json").write_text(json.dumps(cases))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", BATCH, str(root / "cases.json"), str(root / "results.json")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((root / "results.json").read_text())
    assert len(results) == len(cases)
    return {c["id"]: SimpleNamespace(**r) for c, r in zip(cases, results)}


@pytest.mark.slow
@pytest.mark.parametrize("cid,needles", [(c[0], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_with_the_fix(batch, cid, needles):
    line = one_line_error(batch[cid])
    for needle in needles:
        assert needle in line, (needle, line)


@pytest.mark.slow
@pytest.mark.parametrize("cid", ["lr-nan", "eval-k-zero"])
def test_a_case_in_its_own_process_prints_the_same_line(batch, tmp_path, cid):
    """The batch is faithful: `python -m accord.cli` of a train and an eval case prints the batch's error line
    (the time stamp aside)."""
    _files(tmp_path)
    args = next(c[1] for c in CASES if c[0] == cid)
    line = one_line_error(accord(*args, cwd=tmp_path))
    assert line.split(" ", 1)[1] == one_line_error(batch[cid]).split(" ", 1)[1]


def test_debug_shows_the_traceback(tmp_path):
    res = accord("train", "run=5", "--debug", cwd=tmp_path)
    assert res.returncode != 0 and "Traceback" in res.stderr and "run must be a mapping" in res.stderr


@pytest.mark.parametrize("command", ["sft", "plan", "compare", "eval"])
def test_every_command_takes_debug_after_it(command, tmp_path):
    """--debug after the command (as the docs say), not only before it: the traceback of a config error."""
    res = accord(command, "run=5", "--debug", *(["--samples", "0"] if command == "eval" else []), cwd=tmp_path)
    assert res.returncode != 0 and "Traceback" in res.stderr and "unrecognized arguments" not in res.stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A one-step run with two checkpoints' worth of steps (2 steps, one checkpoint each)."""
    tmp = tmp_path_factory.mktemp("trained")
    res = accord("train", TINY, f"run.run_dir={tmp / 'run'}", "run.steps=2", "run.checkpoint_every=1",
                 "run.eval_before=false", "run.eval_after=false", *SMALL, cwd=tmp)
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp / "run"


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    (dst / "config.yaml").write_text((dst / "config.yaml").read_text().replace(str(run), str(dst)))
    return dst


def _truncate(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size // 2)


def _flip_low_bits(path: Path, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    for i in range(n):
        data[len(data) - 8 * (i + 1)] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.slow
@pytest.mark.parametrize("damage", [_truncate, _flip_low_bits], ids=["truncated", "bits-flipped"])
@pytest.mark.parametrize("command", ["eval", "resume"])
def test_no_intact_checkpoint_is_one_line(trained, tmp_path, damage, command):
    run = _copy(trained, tmp_path)
    for ckpt in (run / "checkpoints").iterdir():
        damage(ckpt / "policies" / "main" / "model.safetensors")
    args = ["eval", run, "--samples", "0"] if command == "eval" else ["train", "--resume", run]
    res = accord(*args, cwd=tmp_path)
    line = one_line_error(res)
    assert "none of the 2 checkpoint(s)" in line and "--overwrite" in line, line
    for name in ("step_000001", "step_000002"):  # each named in a warning
        assert f"skipping checkpoint {run / 'checkpoints' / name}" in res.stderr
    assert "truncated" in res.stderr if damage is _truncate else "SHA-256" in res.stderr


@pytest.mark.slow
def test_eval_falls_back_to_the_newest_intact_checkpoint(trained, tmp_path):
    run = _copy(trained, tmp_path)
    _truncate(run / "checkpoints" / "step_000002" / "policies" / "main" / "model.safetensors")
    res = accord("eval", run, "--samples", "0", "--no-base", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "skipping checkpoint" in res.stderr and "step_000002" in res.stderr
    assert "| step_000001 |" in res.stdout


@pytest.mark.slow
def test_resume_with_fewer_steps_than_the_checkpoint(trained, tmp_path):
    run = _copy(trained, tmp_path)
    line = one_line_error(accord("train", "--resume", run, "run.steps=1", cwd=tmp_path))
    assert "run.steps=1 is below step 2" in line and "run.steps=2 or more" in line, line
