"""Input that must not destroy a user's files or end in a traceback: directories that only look like runs, copies
a user keeps beside the checkpoints, policy names that are paths, merges refused after deleting, and config
values that YAML would silently change."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from accord.checkpoint import (
    MANIFEST,
    checkpoint_step,
    checkpoints,
    claim_run_dir,
    latest_checkpoint,
    prune_checkpoints,
)
from accord.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "examples" / "tiny.yaml"


def _fake_checkpoint(run: Path, name: str) -> Path:
    path = run / "checkpoints" / name
    path.mkdir(parents=True)
    (path / MANIFEST).write_text("{}")
    return path


def test_a_directory_that_only_looks_like_a_run_is_not_started_over(tmp_path):
    """Another tool's config.yaml and tb/ beside the user's eval/ and report/: refused, nothing deleted, no lock
    file left that would make the next attempt take the directory for accord's."""
    project = tmp_path / "project"
    for name in ("eval", "report", "tb"):
        (project / name).mkdir(parents=True)
        (project / name / "mine.txt").write_text("keep")
    (project / "config.yaml").write_text("lr: 0.1  # another tool's\n")
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"holds config\.yaml, tb but is not a run directory of accord's"):
            claim_run_dir(project, resume=False, overwrite=False)
    assert sorted(p.name for p in project.iterdir()) == ["config.yaml", "eval", "report", "tb"]
    release = claim_run_dir(project, resume=False, overwrite=True)   # asked for: deleted
    release()
    assert sorted(p.name for p in project.iterdir()) == [".accord.lock"]


def test_checkpoints_are_step_directories_only(tmp_path):
    """A user's copies beside the checkpoints (step_000001_best, step_000002.bak) are never the run's: not the
    latest, not pruned, and their names do not stop a resume."""
    run = tmp_path / "run"
    ones = [_fake_checkpoint(run, f"step_{s:06d}") for s in (1, 2, 3)]
    best = _fake_checkpoint(run, "step_000001_best")
    bak = _fake_checkpoint(run, "step_000009.bak")
    assert checkpoints(run) == ones and latest_checkpoint(run) == ones[-1]
    assert [checkpoint_step(p) for p in checkpoints(run)] == [1, 2, 3]
    prune_checkpoints(run, 1, ones[-1])
    assert checkpoints(run) == [ones[-1]] and best.is_dir() and bak.is_dir()


def test_a_seven_digit_step_sorts_after_six(tmp_path):
    run = tmp_path / "run"
    small, large = _fake_checkpoint(run, "step_999999"), _fake_checkpoint(run, "step_1000000")
    assert checkpoints(run) == [small, large]


@pytest.mark.parametrize("name", ["../../escaped", "", ".", "a/b", "a b"])
def test_a_policy_name_is_not_a_path(name):
    with pytest.raises(ConfigError, match="names the policy's checkpoint directory"):
        load_config(None, [f"policies={{{json.dumps(name)}: {{model: tiny-qwen2}}}}", "agents=[]",
                           "specialization=shared"])


def _comparison(path: Path, seeds: list[int], runs: list[dict] | None = None, **extra) -> Path:
    path.mkdir(parents=True)
    from accord.compare import FORMAT

    runs = [{"method": "a", "seed": s} for s in seeds] if runs is None else runs
    (path / "compare.json").write_text(json.dumps({"format": FORMAT, "settings": {"x": 1}, "seeds": seeds,
                                                   "runs": runs, "total_s": 1.0, **extra}))
    return path


def test_merge_refused_keeps_the_earlier_merge(tmp_path):
    """--overwrite deletes the earlier merge only once every input has been read and checked."""
    from accord.compare import CompareError, merge

    one = _comparison(tmp_path / "one", [0])
    out = tmp_path / "merged"
    out.mkdir()
    (out / "compare.json").write_text("{}")
    (out / "compare.md").write_text("the earlier merge")
    with pytest.raises(CompareError, match=r"seed\(s\) \[0\] are already in an earlier file"):
        merge([one, one], out, overwrite=True)
    assert (out / "compare.md").read_text() == "the earlier merge"


@pytest.mark.parametrize("fields, problem", [
    ({"runs": [5]}, "wrong type"),
    ({"total_s": "x"}, "wrong type"),
    ({"seeds": "17"}, "wrong type"),
    ({"seeds": [7]}, r"its runs are of seeds \[1\], its seeds field says \[7\]"),
])
def test_merge_names_a_compare_json_of_the_wrong_shape(tmp_path, fields, problem):
    from accord.compare import CompareError, merge

    seeds = fields.pop("seeds", [1])
    path = _comparison(tmp_path / "bad", seeds, runs=fields.pop("runs", [{"method": "a", "seed": 1}]), **fields)
    with pytest.raises(CompareError, match=problem):
        merge([path], tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("override, problem", [
    ("run.name=my run #2", r"YAML reads the value as 'my run', not as written"),
    # YAML 1.1 reads a leading 0 as octal and a colon as base 60, in every key (a seed of 010 trained as seed 8)
    ("run.name=0755", r"'run.name': the number 0755 reads as 493 \(a leading 0 makes it octal\); .*run.name='0755'$"),
    ("run.name=1:30", r"'run.name': the number 1:30 reads as 90 \(a colon makes it base 60\); .*run.name='1:30'$"),
    ("run.seed=010", r"'run.seed': the number 010 reads as 8 \(a leading 0 makes it octal\); write the number in "),
    ("run.steps=1:00", r"'run.steps': the number 1:00 reads as 60 \(a colon makes it base 60\)"),
    ("training.lr=1:30.5", r"'training.lr': the number 1:30.5 reads as 90.5 \(a colon makes it base 60\)"),
    ("run.output_dir=2024.10", r"run.output_dir=2024.1: YAML read this value as a number"),
    ("algorithm.tis=off", r"algorithm.tis=False: YAML read this value as a boolean .*algorithm.tis='off'$"),
    ("training.audit=no", r"training.audit=False: YAML read this value as a boolean .*training.audit='off'$"),
    ("run.name=yes", r"run.name=True: YAML read this value as a boolean .*run.name='on'$"),
    ('run.name="a\\0b"', r"run.name holds the character '\\x00'"),
    ('run.name="a\\ud800"', r"run.name holds the character '\\ud800'"),
    ("run.run_dir=", r"run.run_dir is an empty string \(an unset shell variable\?\)"),
    ("run.threads=100000", r"run.threads=100000 is more than 1024"),
    ("rollout.temperature=1e-300", r"rollout.temperature=1e-300 is below 0.0001"),
    ("rollout.top_p=1e-300", r"rollout.top_p=1e-300 must be in \[1e-06, 1\]"),
    ("rollout.eval_temperature=1e-300", r"rollout.eval_temperature=1e-300 is below 0.0001"),
    ("task.options.x=" + "[" * 2000 + "]" * 2000, r"nested too deeply to read"),
])
def test_config_values_yaml_would_change_or_that_break_later_are_refused(override, problem):
    with pytest.raises(ConfigError, match=problem):
        load_config(TINY, [override])


def test_quoted_text_keeps_what_was_written():
    cfg = load_config(TINY, ["run.name='0755'", "run.output_dir='my runs #2'", "algorithm.tis='off'"])
    assert cfg.run.name == "0755" and cfg.run.output_dir == "my runs #2" and cfg.algorithm.tis == "off"


def test_a_section_after_a_key_inside_it_is_refused_the_other_order_refines():
    with pytest.raises(ConfigError, match=r"sets all of run, replacing 'run.steps=3' given before it"):
        load_config(TINY, ["run.steps=3", "run={name: x}"])
    cfg = load_config(TINY, ["run={name: x}", "run.steps=3"])
    assert (cfg.run.name, cfg.run.steps) == ("x", 3)


def test_json_integers_too_long_to_convert_are_one_line_errors(tmp_path):
    from accord.data import DataFileError, json_lines
    from accord.tracking import read_metrics
    from accord.tracking.jsonl import MetricsFileError

    big = "9" * 5000
    data = tmp_path / "d.jsonl"
    data.write_text('{"x": %s}\n' % big)
    with pytest.raises(DataFileError, match="line 1: not valid JSON here"):
        json_lines(data, "demonstrations file")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "x": %s}\n{"step": 2}\n' % big)
    with pytest.raises(MetricsFileError, match=r"metrics.jsonl:1: invalid JSON \(ValueError\)"):
        read_metrics(tmp_path)


def test_damaged_audit_records_are_audit_errors(tmp_path):
    from accord.audit import AuditError, read_step

    for text in (b'{"kind": "step"}\n', b"[1]\n", b'{"kind": "sample"}\n\xff\xfe\n', b'{"x": %s}\n' % (b"9" * 5000)):
        path = tmp_path / "step_000001.jsonl"
        path.write_bytes(text)
        with pytest.raises(AuditError, match="the file is damaged"):
            read_step(path)


def _metrics_run(tmp_path: Path, last: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps({"step": s, "team/reward": 0.1 * s, "time/step": 1.0}) for s in range(3)]
    (run / "metrics.jsonl").write_bytes(("\n".join(lines) + "\n").encode() + last.encode("utf-8", "surrogateescape"))
    return run


@pytest.mark.parametrize("last, problem", [
    ("{\"step\": 3, \"x\": \udcff}\n", r"metrics.jsonl:4: not UTF-8 text \(byte 0xff\)"),
    ('{"step": %d}\n' % 10**30, r"metrics.jsonl:4: expected a JSON object with an integer 'step' field in"),
    ('{"step": 3, "x": %s}\n' % ("1" + "0" * 400), r"metrics.jsonl:4: x=1000.* is larger than a metric can be"),
])
def test_a_damaged_metrics_file_is_one_line_for_the_report(tmp_path, last, problem):
    from accord.report import write_report
    from accord.tracking.jsonl import MetricsFileError

    with pytest.raises(MetricsFileError, match=problem):
        write_report(_metrics_run(tmp_path, last))


def test_the_report_takes_odd_but_readable_files(tmp_path):
    """A step that took 1e300 s, a completions row whose joint id is a list, a config.yaml that is not UTF-8: the
    report is written (the time shown as seconds, the row on its own, the config left out with its reason)."""
    from accord.report import write_report

    run = _metrics_run(tmp_path, '{"step": 3, "team/reward": 0.3, "time/step": 1e300}\n')
    (run / "completions").mkdir()
    rows = [{"prompt": "p", "agent": "a", "completion": "c", "reward": 1.0, "joint": [1, 2]},
            {"prompt": "p", "agent": "b", "completion": "d", "reward": 0.0, "joint": 5}]
    (run / "completions" / "step_000003.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.yaml").write_bytes(b"\xff\xfe")
    text = write_report(run).read_text(encoding="utf-8")
    assert "1e+300 s" in text and "2 scored" in text
    assert oct((run / "report" / "report.md").stat().st_mode & 0o777) != oct(0o600)   # not mkstemp's mode


def test_a_merge_stopped_half_way_is_not_taken_for_another_directory(tmp_path):
    """What a full disk left of a merge (its plot and table) does not make the retry ask for a new directory:
    the retry goes on to read its inputs (here refused for their own reason)."""
    from accord.compare import CompareError, merge

    one = _comparison(tmp_path / "one", [0])
    out = tmp_path / "merged"
    out.mkdir()
    (out / "compare.png").write_bytes(b"\x89PNG truncated")
    (out / "compare.md").write_text("# cut")
    with pytest.raises(CompareError, match=r"seed\(s\) \[0\] are already in an earlier file"):
        merge([one, one], out)
    (out / "notes.txt").write_text("the user's")
    with pytest.raises(CompareError, match="is not empty and holds no comparison"):
        merge([one], out, overwrite=True)
    assert (out / "notes.txt").is_file()


def test_exit_in_a_task_is_an_error_not_a_silent_end(tmp_path):
    from accord.build import build_env
    from accord.envs.registry import TaskError

    with pytest.raises(TaskError, match=r"task 'builtins:exit' called exit\(None\) while being built"):
        build_env(load_config(TINY, ["task.name=builtins:exit"]))


def test_a_symbolic_link_loop_as_run_directory_is_named(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(ConfigError, match="is a symbolic link that leads nowhere"):
        claim_run_dir(loop / "run", resume=False, overwrite=False)


def test_a_list_index_is_ascii_digits():
    with pytest.raises(ConfigError, match=r"'²' is not an index of a list"):
        load_config(TINY, ["agents.².name=x"])


def test_sizes_that_fill_the_memory_before_a_run_starts_are_refused():
    from accord.build import build_env
    from accord.envs.registry import TaskError

    with pytest.raises(TaskError, match=r"task.options.size=10000000000000: must be an integer in \[1, 1000000\]"):
        build_env(load_config(TINY, ["task.options.size=10000000000000"]))
    with pytest.raises(ConfigError, match="num_generations=100000000 is more than 4096"):
        load_config(TINY, ["algorithm.num_generations=100000000"])
    with pytest.raises(ConfigError, match=r"vocab_size=1000000000 is more than 1000000"):
        load_config(TINY, ["policies.main.model_kwargs.vocab_size=1000000000"])


def test_a_huge_demonstration_is_judged_on_its_prefix(tmp_path):
    """A 5 MB completion against max_new_tokens=16: refused from a prefix, not tokenized whole (2 GB, 14 s)."""
    from accord.sft import DemoError, _policies, encode_demos, read_demos

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"agent": "e", "prompt": "hi", "completion": "e " * 2_500_000}) + "\n")
    cfg = load_config(TINY, [f"run.run_dir={tmp_path / 'run'}"])
    (pol, _), = _policies(cfg).values()
    with pytest.raises(DemoError, match="has at least"):
        encode_demos(pol, read_demos(data, ("e", "o")), cfg.rollout.max_new_tokens)


@pytest.mark.parametrize("flags, problem", [
    (["--gpu-memory-gb", "nan"], "--gpu-memory-gb nan: give each GPU's memory"),
    (["--gpus", "3"], "--gpus plans for GPUs of another machine and needs their memory"),
    (["--prompt-tokens", "-5"], "--prompt-tokens -5: give a prompt length >= 1"),
])
def test_plan_flags_are_checked(flags, problem, caplog):
    from accord.cli import main

    assert main(["plan", str(TINY), *flags]) == 2
    assert any(problem in r.getMessage() for r in caplog.records)


def test_a_run_given_twice_is_not_cross_played_against_itself(tmp_path):
    from accord.crossplay import run_crossplay

    (tmp_path / "run").mkdir()
    with pytest.raises(ConfigError, match="are the same run; give each run once"):
        run_crossplay([tmp_path / "run", f"{tmp_path}/run/"])


def test_a_home_relative_output_dir_is_expanded():
    cfg = load_config(TINY, ["run.output_dir='~/runs'"])
    assert cfg.run.output_dir == str(Path.home() / "runs")


@pytest.mark.parametrize("override, suggestion", [
    ("training.learning_rate=0.1", "did you mean 'training.lr'?"),
    ("rollout.max_completion_length=5", "did you mean 'rollout.max_new_tokens'?"),
    ("algorithm.beta=0.1", "did you mean 'algorithm.kl_coef'?"),
    ("learning_rate=0.1", "did you mean 'training.lr'?"),                     # at the top level
    ("max_completion_length=5", "did you mean 'rollout.max_new_tokens'?"),
    ("training.beta=0.1", "did you mean 'algorithm.kl_coef'?"),               # not AdamW's betas
    ("training.max_completion_length=5", "did you mean 'rollout.max_new_tokens'?"),   # in another section
    ("sft.learning_rate=0.1", "did you mean 'sft.lr'?"),                      # the section's own
])
def test_a_key_by_trls_name_is_given_accords(override, suggestion):
    with pytest.raises(ConfigError, match=suggestion):
        load_config(TINY, [override])


def test_eval_leaves_a_directory_named_work_alone(tmp_path):
    """The evaluating run's scratch directory is a fresh one: a user's _work (or a run trained into OUT/_work)
    is not deleted."""
    from accord.evaluate import SCRATCH_PREFIX, scratch_run_dir

    (tmp_path / "_work").mkdir()
    (tmp_path / "_work" / "notes.txt").write_text("mine")
    left = tmp_path / f"{SCRATCH_PREFIX}killed"
    left.mkdir()
    work = scratch_run_dir(tmp_path)
    assert work.parent == tmp_path and work.name.startswith(SCRATCH_PREFIX) and not left.exists()
    assert (tmp_path / "_work" / "notes.txt").read_text() == "mine"


def test_exit_at_import_is_an_error(tmp_path, monkeypatch):
    from accord.envs.registry import TaskError, import_modules

    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TaskError, match=r"called exit\(0\) while being imported"):
        import_modules(["exits_at_import"])


@pytest.mark.parametrize("kwargs, problem", [
    ({"samples": 4, "ks": [1, 1]}, r"--k 1 1 gives a k twice"),
    ({"samples": 0, "ks": [5]}, r"--k 5 with --samples 0 \(greedy"),
    ({"samples": 2, "compare_base": False}, r"--no-base skips a run's base weights, but a config file"),
    ({"samples": 2, "temperature": 1e-300}, r"--temperature=1e-300 must be a finite number >= 0.0001"),
    ({"samples": 10 ** 8}, r"--samples=100000000 must be between 0 \(greedy only\) and 4096"),
])
def test_eval_flags_that_would_be_dropped_or_break_later_are_refused(tmp_path, kwargs, problem):
    from accord.evaluate import run_eval

    with pytest.raises(ConfigError, match=problem):
        run_eval(TINY, [], out=tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_audit_refuses_a_step_recorded_twice(tmp_path):
    from accord.audit import AuditError, audit_run

    audit = tmp_path / "audit"
    audit.mkdir()
    record = json.dumps({"kind": "step", "step": 1, "instances": []}) + "\n" + json.dumps({"kind": "sample"}) + "\n"
    (audit / "step_000001.jsonl").write_text(record)
    (audit / "step_1.jsonl").write_text(record)
    with pytest.raises(AuditError, match="both hold the records of step 1; keep one"):
        audit_run(tmp_path)


def test_an_audit_file_cut_back_at_a_line_end_is_damaged(tmp_path):
    """A step's records cut back to the header, or by whole lines, fail the audit instead of passing it (a step
    may hold no samples at all: rollout.drop_flat_groups can drop every group, so the header counts them)."""
    from accord.audit import AuditError, audit_run, write_step

    samples = [{"agent": "a", "group": "g", "instance": "0"}] * 3
    path = write_step(tmp_path, 1, samples, {"k": {"reward": 1.0}}, ["0"])
    lines = path.read_text().split("\n")
    for keep, problem in ((1, "holds 0 scored records but its header counts 1"),
                          (3, "holds 1 samples records but its header counts 3")):
        path.write_text("\n".join(lines[:keep]) + "\n")
        with pytest.raises(AuditError, match=f"{problem} \\(cut short\\?\\); the file is damaged"):
            audit_run(tmp_path)


def test_a_failed_eval_leaves_no_empty_output_directory(tiny_cfg, tmp_path):
    import yaml

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny_cfg(task={"name": "letters", "eval_size": 0})))
    from accord.evaluate import run_eval

    with pytest.raises(ConfigError, match="nothing to evaluate"):
        run_eval(cfg, samples=0, out=tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()
    (tmp_path / "mine").mkdir()   # a directory that was there before stays
    with pytest.raises(ConfigError, match="nothing to evaluate"):
        run_eval(cfg, samples=0, out=tmp_path / "mine")
    assert (tmp_path / "mine").is_dir()


def test_eval_of_a_run_on_another_task_says_so(tiny_cfg, tmp_path, caplog):
    import logging

    import yaml

    from accord.evaluate import run_eval

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(tiny_cfg(task={"name": "letters", "eval_size": 1})))
    with caplog.at_level(logging.WARNING, logger="accord.evaluate"):
        run_eval(run, ["task.eval_size=1"], samples=0, out=tmp_path / "same")
        assert "not the task it trained on" not in caplog.text
        run_eval(run, ["task.name=relay"], samples=0, out=tmp_path / "other")
    assert "on task 'relay' {}, not the task it trained on ('letters' {})" in caplog.text


def _cli(*args, cwd, env=None):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "accord.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, HF_HUB_OFFLINE="1", **(env or {})))


def test_train_neither_resumes_nor_overwrites_a_warm_start_of_sft(tmp_path):
    """An `accord sft` output (config.yaml, metrics.jsonl of its steps, demos.jsonl, the models) resumed or written
    over by `accord train`: its metrics and config were replaced, its models left beside RL checkpoints."""
    from accord.config import save_config

    warm = tmp_path / "runs" / "warm" / "sft"
    (warm / "main").mkdir(parents=True)
    save_config(load_config(TINY, [f"run.run_dir={warm}"]), warm / "config.yaml")
    (warm / "metrics.jsonl").write_text(json.dumps({"step": 1, "sft/main/loss": 2.0}) + "\n")
    (warm / "demos.jsonl").write_text(json.dumps({"agent": "a", "prompt": "p", "completion": "c"}) + "\n")
    before = {p.name: p.read_bytes() for p in warm.iterdir() if p.is_file()}
    resumed = _cli("train", "--resume", str(warm), "rollout.batch_size=1", cwd=tmp_path)
    assert resumed.returncode == 2 and "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    assert f"{warm} holds a warm start of accord sft" in resumed.stderr and "--resume changes" not in resumed.stderr
    for extra in ([], ["--overwrite"]):
        new = _cli("train", str(TINY), f"run.run_dir={warm}", *extra, cwd=tmp_path)
        assert new.returncode == 2 and f"{warm} holds a warm start of accord sft" in new.stderr, new.stderr[-3000:]
    assert {p.name: p.read_bytes() for p in warm.iterdir() if p.is_file()} == before
    assert sorted(p.name for p in warm.iterdir()) == ["config.yaml", "demos.jsonl", "main", "metrics.jsonl"]


def test_a_directory_of_run_files_without_a_config_is_not_offered_a_resume(tmp_path):
    """A foreign metrics.jsonl with steps: --resume could not continue it (no config.yaml), so it is not named."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.jsonl").write_text(json.dumps({"step": 3}) + "\n")
    with pytest.raises(ConfigError, match=r"holds metrics\.jsonl without the config\.yaml of a run of accord's, so "
                                          r"nothing there can be resumed") as err:
        claim_run_dir(other, resume=False, overwrite=False)
    assert "--resume" not in str(err.value)


def test_a_ctrl_c_while_the_trainer_loads_stops_with_one_line(monkeypatch, caplog):
    """The trainer's import inside the handler's try left its names unbound on a Ctrl-C (UnboundLocalError)."""
    import sys

    from accord.cli import main

    class Loading:   # a Ctrl-C arriving while `from accord.trainer import ...` runs
        def __getattr__(self, name):
            raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "accord.trainer", Loading())
    with caplog.at_level("WARNING", logger="accord"):
        assert main(["train", str(TINY)]) == 130
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == ["stopped by Ctrl-C"]


@pytest.mark.parametrize("where", ["_config_help", "configure_logging"])
def test_a_ctrl_c_before_the_command_begins_is_one_line(monkeypatch, capsys, where):
    """A Ctrl-C while the command line's parser was built (every config key's help) or the logging set up came
    out as a traceback with exit status 1 or -2."""
    import accord.cli as cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, where, interrupted)
    assert cli.main(["report", str(TINY)]) == 130
    assert capsys.readouterr().err == "accord: stopped by Ctrl-C\n"
    with pytest.raises(KeyboardInterrupt):
        cli.main(["--debug", "report", str(TINY)])


def test_a_checkpoint_rotated_away_while_read_names_the_running_run(tmp_path):
    import subprocess
    import sys

    from accord.checkpoint import CheckpointError, rotated_away, run_in_use

    run = tmp_path / "run"
    kept = _fake_checkpoint(run, "step_000002")
    gone = run / "checkpoints" / "step_000001"
    assert run_in_use(run) is None   # no lock file: the run ended, and a newer checkpoint says it went on meanwhile
    assert str(rotated_away(gone, run, "it was exported")).startswith(
        f"checkpoint {gone} was deleted while it was exported: the run of {run} went on meanwhile and kept only its "
        "newest checkpoints (now step_000002); run the command again")
    assert rotated_away(run / "checkpoints" / "step_000003", run, "it was exported") is None   # none newer
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom pathlib import Path\nfrom accord.checkpoint import hold_run_dir\n"
        f"hold_run_dir(Path({str(run)!r}))\nprint('held', flush=True)\ntime.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        owner = run_in_use(run)
        assert owner is not None and str(holder.pid) in owner
        err = rotated_away(gone, run, "it was exported")
        assert isinstance(err, CheckpointError) and str(err).startswith(
            f"checkpoint {gone} was deleted while it was exported: {run} is in use by a running accord ({owner})")
        assert rotated_away(kept, run, "it was exported") is None   # still there: another problem, said as it is
    finally:
        holder.kill()
        holder.wait()
    assert run_in_use(run) is None


@pytest.mark.parametrize("value, problem", [
    ("file", "ACCORD_CACHE={path} cannot be used as a directory"),
    ("~no-such-user-of-accord/cache", "ACCORD_CACHE=~no-such-user-of-accord/cache cannot be used as a directory"),
])
def test_accord_cache_that_cannot_be_a_directory_is_one_line(tmp_path, monkeypatch, value, problem):
    from accord.models.common import ModelNotFoundError, accord_cache_dir

    path = tmp_path / "a-file"
    path.write_text("")
    monkeypatch.setenv("ACCORD_CACHE", str(path) if value == "file" else value)
    with pytest.raises(ModelNotFoundError) as err:
        accord_cache_dir()
    message = str(err.value)
    assert message.startswith(problem.format(path=path)) and "\n" not in message
    assert message.endswith("set ACCORD_CACHE to a writable directory")


def test_plan_for_more_gpus_than_it_lists_is_refused(caplog):
    """Each planned GPU is a row: a billion took minutes and hundreds of GB before."""
    from accord.cli import main

    with caplog.at_level("ERROR", logger="accord"):
        assert main(["plan", str(TINY), "--gpus", "1025", "--gpu-memory-gb", "80"]) == 2
    assert [r.getMessage() for r in caplog.records] == [
        "--gpus 1025: give a number of GPUs from 1 to 1024 (the plan lists each one)"]


def test_a_dotted_key_in_a_file_is_told_how_to_nest(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run.steps: 5\npolicies.main.lr: 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'run.steps'; a dotted key is one key to YAML: nest its "
                                          r"parts, each indented beneath the one before \(`run:`, then `steps:`\)"):
        load_config(path)


def test_a_ctrl_c_while_torch_imports_adds_no_lines_of_torch(tmp_path):
    """A Ctrl-C half-way through torch's import left torch's loggers at the root's INFO level, and the atexit hook
    of a module already loaded (FakeTensor's cache statistics) logged three INFO lines after 'stopped by Ctrl-C'.
    The CLI's logging set-up, then an INFO record of such a module with torch not imported, as the hook logs it."""
    import subprocess
    import sys

    code = ("import logging, sys\n"
            "from accord.tracking.console import configure_logging\n"
            "configure_logging()\n"
            "assert 'torch' not in sys.modules\n"
            "logging.getLogger('torch._subclasses.fake_tensor').info('FakeTensor cache stats:')\n"
            "logging.getLogger('accord').info('accord line')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "accord line" in done.stderr and "FakeTensor" not in done.stderr, done.stderr


def test_a_note_in_an_unverified_checkpoints_policies_does_not_get_it_deleted(tmp_path):
    """A checkpoint of an older accord (no manifest) holding every policy's optimizer state, with a user's note
    beside the policy folders: still a complete checkpoint. The clean-up took the note for a policy missing its
    optimizer state, deleted the checkpoint as half pruned, and the resume started the run over."""
    from accord.checkpoint import clean_checkpoints

    ckpt = tmp_path / "run" / "checkpoints" / "step_000012"
    (ckpt / "policies" / "concise").mkdir(parents=True)
    (ckpt / "policies" / "concise" / "optimizer.pt").write_bytes(b"x")
    (ckpt / "state.pt").write_bytes(b"x")
    (ckpt / "policies" / "README.txt").write_text("notes")
    assert clean_checkpoints(tmp_path / "run") == [] and ckpt.is_dir()


def test_a_finished_run_whose_checkpoints_are_gone_is_not_started_over(tmp_path):
    """A run that logged all of its run.steps ended with a checkpoint, whatever run.checkpoint_every: a resume that
    finds none (checkpoints/ removed, or a file in its place) is refused before anything is deleted; the resume
    started the run over from step 0, deleting its logs."""
    from accord.build import resume_point
    from accord.config import ConfigError

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "team/reward": 0.5}) + "\n" for s in range(13)))
    (run / "config.yaml").write_text("run:\n  steps: 12\n")
    cfg = load_config(TINY, [f"run.run_dir={run}", "run.steps=24", "run.checkpoint_every=0"])
    with pytest.raises(ConfigError, match=r"logged all 12 steps of its run.steps=12 but holds no checkpoint.*"
                                          r"checkpoints/ removed.*--overwrite"):
        resume_point(cfg, run)
    (run / "checkpoints").write_text("not a folder")
    with pytest.raises(ConfigError, match=r"checkpoints is not a directory.*move it away"):
        resume_point(cfg, run)
    (run / "checkpoints").unlink()
    # killed before the end with run.checkpoint_every=0: no checkpoint was ever written, replayed from step 0
    (run / "config.yaml").write_text("run:\n  steps: 40\n")
    assert resume_point(cfg, run) is None


def test_a_stopped_run_whose_checkpoints_are_gone_is_not_started_over(tmp_path):
    """SIGTERM after step 2 of 4 with run.checkpoint_every=0 writes a checkpoint of step 2 (its metrics line carries
    time/checkpoint); with checkpoints/ removed the resume said "no checkpoint yet: starting the run over" and
    deleted steps 1-2. Refused now. A kill while that checkpoint was being renamed into place (its partial save
    left in checkpoints/) still replays the run from step 0."""
    from accord.build import resume_point
    from accord.config import ConfigError

    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": 1, "team/reward": 0.5}, {"step": 2, "team/reward": 0.5, "time/checkpoint": 0.1}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (run / "config.yaml").write_text("run:\n  steps: 4\n")
    cfg = load_config(TINY, [f"run.run_dir={run}", "run.steps=4", "run.checkpoint_every=0"])
    with pytest.raises(ConfigError, match=r"logged a checkpoint at step 2 but holds none \(was checkpoints/ removed"):
        resume_point(cfg, run)
    (run / "checkpoints").mkdir()   # as a kill in the rename leaves it (the resume's clean-up took the partial save)
    assert resume_point(cfg, run) is None
    lines.append({"step": 3, "team/reward": 0.5})   # a later step logged: step 2's checkpoint was in place
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(ConfigError, match=r"logged a checkpoint at step 2 but holds none"):
        resume_point(cfg, run)


def test_a_lock_file_that_is_a_link_is_not_written_through(tmp_path):
    """RUN/.accord.lock a symbolic link to a user's file: refused with the fix; the file keeps its text (the pid
    was written into it)."""
    from accord.checkpoint import LOCK_FILE, hold_run_dir

    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("important data\n")
    (run / LOCK_FILE).symlink_to(victim)
    with pytest.raises(ConfigError, match=r"\.accord\.lock is a symbolic link.*delete the link"):
        hold_run_dir(run)
    assert victim.read_text() == "important data\n"


def test_a_report_folder_that_is_a_link_is_refused(tmp_path):
    """RUN/report a symbolic link to a user's folder: the report deleted what it took for its stale plots there
    and wrote into it. Refused with the fix (--out names another folder); the user's files stay."""
    from accord.report import write_report

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "team/reward": 0.5}) + "\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "success.png").write_text("precious")
    (run / "report").symlink_to(mine)
    with pytest.raises(ConfigError, match=r"report is a symbolic link .*--out"):
        write_report(run)
    assert (mine / "success.png").read_text() == "precious" and sorted(p.name for p in mine.iterdir()) == [
        "success.png"]
    # named with --out, the folder is still the user's: its success.png, which no report of accord's wrote, is refused
    with pytest.raises(ConfigError, match=r"holds success.png, and no report.md of accord's there wrote them"):
        write_report(run, out_dir=mine)
    assert (mine / "success.png").read_text() == "precious"


def test_a_users_copy_in_the_audit_folder_does_not_break_a_resume(tmp_path):
    """audit/step_backup.jsonl beside the step files (a user's copy): a resume's prune of the records after the
    checkpoint ended in a ValueError traceback; the copy is left alone, the later steps' files go."""
    from accord.audit import AUDIT_DIR, prune_after

    audit = tmp_path / AUDIT_DIR
    audit.mkdir()
    for name in ("step_000001.jsonl", "step_000005.jsonl", "step_backup.jsonl"):
        (audit / name).write_text("{}\n")
    prune_after(tmp_path, 3)
    assert sorted(p.name for p in audit.iterdir()) == ["step_000001.jsonl", "step_backup.jsonl"]


def test_a_checkpoint_whose_state_is_of_another_step_is_not_resumed(tmp_path):
    """A checkpoint renamed (step_000012 moved to step_000020), or a state.pt of another step put in: the resume
    trusted either, at the name's step or the state's, and cut the run's logs there. Refused, naming both steps;
    a state.pt without a step too (it ended in a KeyError traceback)."""
    import torch

    from accord.checkpoint import CheckpointError, load_checkpoint, rng_state

    ckpt = tmp_path / "checkpoints" / "step_000020"
    ckpt.mkdir(parents=True)
    torch.save({"step": 12, "rng": rng_state()}, ckpt / "state.pt")
    with pytest.raises(CheckpointError, match=r"state.pt is of step 12, its name of step 20 \(renamed"):
        load_checkpoint(ckpt, {})
    torch.save({"rng": rng_state()}, ckpt / "state.pt")
    with pytest.raises(CheckpointError, match=r"state.pt is of step None, its name of step 20"):
        load_checkpoint(ckpt, {})
    torch.save({"step": 20, "rng": rng_state()}, ckpt / "state.pt")
    assert load_checkpoint(ckpt, {})["step"] == 20


def test_a_renamed_checkpoint_does_not_verify(tmp_path):
    """step_000012 renamed step_000020: its manifest names step 12, so it does not verify (a resume with
    run.steps=20 said "nothing to do" and export wrote step 12's weights as step 20's)."""
    from accord.checkpoint import verify_checkpoint

    ckpt = tmp_path / "checkpoints" / "step_000020"
    ckpt.mkdir(parents=True)
    (ckpt / "state.pt").write_bytes(b"x")
    files = {"state.pt": {"bytes": 1, "sha256": __import__("hashlib").sha256(b"x").hexdigest()}}
    (ckpt / MANIFEST).write_text(json.dumps({"format": 1, "step": 12, "files": files}))
    assert verify_checkpoint(ckpt) == ("its manifest.json is of step 12, its name of step 20 (renamed? put it back as "
                                       "it was written)")
    (ckpt / MANIFEST).write_text(json.dumps({"format": 1, "step": 20, "files": files}))
    assert verify_checkpoint(ckpt) is None


def test_weights_of_another_model_are_named_as_such_and_damaged_ones_load_nowhere(tmp_path):
    """A policy's intact weights that do not fit the config's model (config.yaml edited to another model, or an
    override) are a config problem, not "incomplete or corrupted" files; damaged files are a CheckpointError with
    the caller's fix, whichever command loads them (eval and cross-play let a SafetensorError or an
    UnpicklingError through as a traceback)."""
    import pickle

    from safetensors import SafetensorError

    from accord.checkpoint import CheckpointError, load_policy

    class Policy:
        def __init__(self, err):
            self.err = err

        def load(self, src):
            raise self.err

    mismatch = RuntimeError("Error(s) in loading state_dict for LlamaForCausalLM:\n\tsize mismatch for lm_head.weight: "
                            "copying a param with shape [49152, 576] from checkpoint, the shape in current model is "
                            "[2048, 64].")
    with pytest.raises(ConfigError, match=r"weights of policy 'a' do not fit the model this config builds \(size "
                                          r"mismatch for lm_head.weight.*\); use the model settings"):
        load_policy(Policy(mismatch), tmp_path, "a", "fix it")
    for err in (SafetensorError("header too large"), pickle.UnpicklingError("Weights only load failed")):
        with pytest.raises(CheckpointError, match=rf"policy 'a' cannot be loaded \({type(err).__name__}: .*\); fix it"):
            load_policy(Policy(err), tmp_path, "a", "fix it")
    # torch's advice to load with weights_only=False (which would run the file's code) is not repeated
    advice = pickle.UnpicklingError("Weights only load failed. Re-running `torch.load` with `weights_only` set to "
                                    "`False` will likely succeed, but it can result in arbitrary code execution.")
    with pytest.raises(CheckpointError) as refused:
        load_policy(Policy(advice), tmp_path, "a", "fix it")
    assert "weights_only" not in str(refused.value) and "Python objects other than tensors" in str(refused.value)


def test_links_in_the_checkpoints_folder_are_not_the_runs(tmp_path):
    """A user's symbolic links in checkpoints/ (to another run's checkpoint, to a folder, named as a checkpoint or
    as an interrupted save): never loaded, pruned or cleaned up. They ended every resume with "Cannot call rmtree
    on a symbolic link" (a prune left a linked .trash_ behind that blocked every later one); their targets stay."""
    from accord.checkpoint import clean_checkpoints

    run = tmp_path / "run"
    _fake_checkpoint(run, "step_000012")
    other = _fake_checkpoint(tmp_path / "other", "step_000011")
    mine = tmp_path / "mine"
    mine.mkdir()
    (run / "checkpoints" / "step_000011").symlink_to(other)
    (run / "checkpoints" / "step_000005").symlink_to(mine)
    (run / "checkpoints" / ".tmp_step_000013_1234").symlink_to(mine)
    (run / "checkpoints" / "step_000013").write_text("a file of a checkpoint's name")   # "it has steps [13]"
    assert clean_checkpoints(run) == [] and [p.name for p in checkpoints(run)] == ["step_000012"]
    prune_checkpoints(run, 1, run / "checkpoints" / "step_000012")
    assert other.is_dir() and mine.is_dir() and sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        ".tmp_step_000013_1234", "step_000005", "step_000011", "step_000012", "step_000013"]


def test_a_pipe_or_a_huge_file_among_the_records_is_not_read(tmp_path):
    """completions/step_N.jsonl or audit/step_N.jsonl a named pipe (`accord report` and `accord audit` waited
    forever) or larger than any step writes (read whole: twice its size in memory): the report leaves it out with
    a warning, the audit refuses it in one line."""
    import os

    from accord.audit import AuditError, audit_run
    from accord.report import write_report

    run = tmp_path / "run"
    (run / "completions").mkdir(parents=True)
    (run / "audit").mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "team/reward": 0.5}) + "\n")
    os.mkfifo(run / "completions" / "step_000001.jsonl")
    os.mkfifo(run / "audit" / "step_000001.jsonl")
    assert "Sample completions" in write_report(run).read_text()
    with pytest.raises(AuditError, match=r"step_000001.jsonl is not a regular file, not a step's records"):
        audit_run(run)
    for folder in ("completions", "audit"):
        (run / folder / "step_000001.jsonl").unlink()
        with open(run / folder / "step_000001.jsonl", "wb") as fh:
            fh.truncate(3 << 30)   # sparse: no disk used
    assert "Sample completions" in write_report(run).read_text()
    with pytest.raises(AuditError, match=r"larger than 1024 MiB"):
        audit_run(run)


def test_an_output_folder_behind_a_dangling_link_or_a_file_is_one_line_before_the_work(tmp_path):
    """--out a symbolic link that leads nowhere, or a path under a file: export wrote the models into a temporary
    folder and failed at the end naming it, eval, cross-play and the report failed with "File exists". Each is
    refused first, naming the link or the file; a run's report.md that is a folder names report.md, not the
    temporary file renamed onto it."""
    from accord.evaluate import scratch_run
    from accord.export import export_run
    from accord.report import write_report
    from accord.tracking.registry import folder_problem

    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere" / "x")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    assert folder_problem(dangling) == f"{dangling} is a symbolic link that leads nowhere (or to itself)"
    assert folder_problem(loop / "sub") == f"{loop} is a symbolic link that leads nowhere (or to itself)"
    assert folder_problem(a_file / "sub" / "deeper") == f"{a_file} is a file, not a directory"
    assert folder_problem(tmp_path / "new" / "deeper") is None and folder_problem(tmp_path) is None

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(TINY.read_text())
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "team/reward": 0.5}) + "\n")
    with pytest.raises(ConfigError, match=r"dangling already exists \(a symbolic link to '.*nowhere/x'\)"):
        export_run(run, out=dangling)
    with pytest.raises(ConfigError, match=r"--out .*a_file/x: .*a_file is a file, not a directory"):
        export_run(run, out=a_file / "x")
    with pytest.raises(ConfigError, match=r"output folder .*dangling/sub: .*dangling is a symbolic link that leads "
                                          r"nowhere .*pass --out DIR"):
        with scratch_run(dangling / "sub", "accord eval"):
            pass
    with pytest.raises(ConfigError, match=r"report folder .*dangling: .*leads nowhere .*--out"):
        write_report(run, out_dir=dangling)
    (run / "report" / "report.md").mkdir(parents=True)
    with pytest.raises(IsADirectoryError, match=r"a folder, where this file is written: '.*report/report.md'"):
        write_report(run)
    assert [p.name for p in (run / "report").iterdir() if p.name.startswith(".")] == []   # no temporary file left
    assert a_file.read_text() == "mine" and not (tmp_path / "nowhere").exists()


def test_a_config_yaml_that_does_not_parse_is_one_warning_line_in_the_report(tmp_path, caplog):
    """YAML's error names the place over several lines (the report's warning spanned four); now one."""
    from accord.report import write_report

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "team/reward": 0.5}) + "\n")
    (run / "config.yaml").write_text("run:\n  name: [unclosed\n  steps: 3\n")
    with caplog.at_level("WARNING", logger="accord.report"):
        report = write_report(run)
    warned = [r.getMessage() for r in caplog.records if "could not parse" in r.getMessage()]
    assert len(warned) == 1 and "\n" not in warned[0] and "line 2, column" in warned[0], warned
    assert "config.yaml could not be parsed" in report.read_text()


def test_a_step_folder_without_a_manifest_is_named_not_deleted(tmp_path, caplog):
    """A checkpoint folder with its weights but no manifest.json and no optimizer state (a weights-only copy, a
    trimmed one) was deleted by the resume's clean-up, logged at INFO as "half deleted by an interrupted prune"
    (this accord renames before it deletes, so it never leaves one): it is left, with a warning."""
    import logging

    from accord.checkpoint import clean_checkpoints

    ckpt = tmp_path / "run" / "checkpoints" / "step_000001"
    (ckpt / "policies" / "main").mkdir(parents=True)
    (ckpt / "policies" / "main" / "model.safetensors").write_bytes(b"weights")
    (ckpt / "state.pt").write_bytes(b"x")
    with caplog.at_level(logging.WARNING, logger="accord.checkpoint"):
        assert clean_checkpoints(tmp_path / "run") == []
    assert (ckpt / "policies" / "main" / "model.safetensors").read_bytes() == b"weights"
    assert any("step_000001 has no manifest.json" in r.getMessage() and "left as it is" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("kind", ["file", "link"])
def test_a_users_entry_of_a_checkpoints_name_is_never_replaced(tmp_path, kind):
    """A user's file, or link to a folder, named checkpoints/step_000003: committing step 3 renamed it to .trash_*
    and failed ("Not a directory", "Cannot call rmtree on a symbolic link"), though the docs say such entries are
    never removed. It is left where it is and the error names it and the fix."""
    from accord.checkpoint import CheckpointError, commit_checkpoint

    run = tmp_path / "run"
    tmp = _fake_checkpoint(run, ".tmp_step_000003_1")
    entry = run / "checkpoints" / "step_000003"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    if kind == "file":
        entry.write_text("my notes")
    else:
        entry.symlink_to(mine)
    with pytest.raises(CheckpointError, match=rf"step_000003 is a {'file' if kind == 'file' else 'symbolic link'}.*"
                                              r"move it out of .*--resume") as err:
        commit_checkpoint(run, tmp, 3, 5)
    assert "\n" not in str(err.value)
    assert (entry.read_text() == "my notes") if kind == "file" else (entry.is_symlink() and entry.resolve() == mine)
    assert (mine / "notes.txt").read_text() == "keep" and tmp.is_dir()
    assert not list((run / "checkpoints").glob(".trash_*"))
