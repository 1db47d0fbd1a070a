"""accord compare: the checks that need no model, the statistics of a comparison, and (slow) real comparisons
of two methods on the relay task with a tiny model in subprocesses: the JSON, the token budget, a killed
comparison resumed, a merge of seeds run apart, and the bad inputs."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from accord.compare import (CompareError, check_comparable, load_plan, preflight, summarise, verdicts,
                            warm_start_model)
from accord.config import config_from_dict

REPO = Path(__file__).resolve().parents[1]
# the subprocesses' environment: one torch thread (the model is too small to gain from two) that waits passively, so
# that a machine shared with other jobs does not slow it several times over
ENV = dict(os.environ, HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")

# relay (agents e and o take turns writing words with their letter) on a very small random model
BASE = {
    "run": {"name": "cmp", "threads": 1, "checkpoint_every": 1},
    "policies": {"main": {"model": "tiny-qwen2",
                          "model_kwargs": {"hidden_size": 32, "num_layers": 1, "num_heads": 4, "vocab_size": 512}}},
    "task": {"name": "relay", "options": {"max_turns": 2}, "eval_size": 3},
    "algorithm": {"name": "atgrpo", "num_generations": 2, "normalize_std": True},
    "rollout": {"batch_size": 2, "max_new_tokens": 4, "temperature": 1.0},
    "training": {"lr": 0.02, "micro_batch_size": 16},
    "logging": {"console": False, "report_to": [], "completions_every": 0},
    "compare": {"methods": {"atgrpo": [], "grpo": ["algorithm.baseline=single_agent"]}, "budget_tokens": 150,
                "seeds": [0]},
}


def _with(**sections) -> dict:
    data = json.loads(json.dumps(BASE))
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return data


# --- no model ---------------------------------------------------------------------------------------------

def test_methods_may_differ_only_in_method_keys_and_knobs():
    cfgs = {m: config_from_dict(_with(**extra)) for m, extra in (
        ("a", {}), ("b", {"algorithm": {**BASE["algorithm"], "name": "magrpo", "baseline": "independent"},
                          "specialization": "separate", "run": {**BASE["run"], "name": "other", "threads": 1}}))}
    check_comparable(cfgs, [])   # method keys and keys the comparison sets itself
    cfgs["b"].training.lr = 0.1
    with pytest.raises(CompareError, match=r"differ in training\.lr \(0\.02 against 0\.1\).*compare\.knobs"):
        check_comparable(cfgs, [])
    check_comparable(cfgs, ["training.lr"])
    check_comparable(cfgs, ["training"])          # a section covers its keys
    cfgs["b"].policies["main"].model_kwargs = {"hidden_size": 64}
    with pytest.raises(CompareError, match=r"policies\.main\.model_kwargs\.hidden_size=32 against "
                                           r"policies\.main\.model_kwargs\.hidden_size=64"):
        check_comparable(cfgs, ["training.lr"])
    check_comparable(cfgs, ["training.lr", "policies"])
    # two methods that make the same run (apart from where and how they log) are a mistake in compare.methods
    same = {m: config_from_dict(_with(run={**BASE["run"], "threads": t})) for m, t in (("a", 1), ("a2", 2))}
    with pytest.raises(CompareError, match=r"methods 'a' and 'a2' make the same run .*give each method the overrides"):
        check_comparable(same, [])


def test_plan_from_one_config_or_several(tmp_path):
    plan = load_plan([("base", _with())], ["compare.budget_tokens=500"], out=tmp_path / "o")
    assert list(plan.methods) == ["atgrpo", "grpo"] and plan.compare.budget_tokens == 500
    cfg = plan.config("grpo", 3)
    assert cfg.algorithm.baseline == "single_agent" and cfg.run.seed == 3 and not cfg.run.eval_before
    assert cfg.run_dir == tmp_path / "o" / "runs" / "grpo" / "seed_3" and cfg.run.steps == plan.compare.max_steps
    single = _with(compare={"methods": {}, "budget_tokens": 150})
    plan = load_plan([("x", single), ("y", _with(compare={"methods": {}, "budget_tokens": 150},
                                                 algorithm={**BASE["algorithm"], "name": "magrpo"}))])
    assert list(plan.methods) == ["x", "y"] and plan.out == Path("runs") / "compare-cmp"
    with pytest.raises(CompareError, match="two config files make method 'x'"):
        load_plan([("x", single), ("x", single)])
    with pytest.raises(CompareError, match="y lists compare.methods"):
        load_plan([("x", single), ("y", _with())])
    with pytest.raises(CompareError, match="compare.methods.b sets compare.seeds"):
        load_plan([("base", _with(compare={"methods": {"a": [], "b": ["compare.seeds=[1]"]}, "budget_tokens": 9}))])
    # a key given twice within a method is refused, as on the command line (the last one won without a word)
    with pytest.raises(CompareError, match=r"compare.methods.b: override 'algorithm.name=iac': algorithm.name is "
                                           r"already set by 'algorithm.name=magrpo'; give each key once"):
        load_plan([("base", _with(compare={"methods": {"a": [], "b": ["algorithm.name=magrpo", "algorithm.name=iac"]},
                                           "budget_tokens": 9}))])


@pytest.mark.parametrize("path", sorted((REPO / "examples" / "compare").glob("*.yaml")), ids=lambda p: p.stem)
def test_example_comparisons_pass_every_check_before_a_model_loads(path, tmp_path):
    """Each shipped comparison (its methods' configs comparable, its knobs declared, its budget above a first
    step's least, the same held-out instances for every method of a seed) passes the checks `accord compare`
    makes before it loads a model."""
    plan = load_plan([(path.stem, yaml.safe_load(path.read_text()))], out=tmp_path / "out")
    assert len(plan.methods) >= 2
    ids = preflight(plan)
    assert sorted(ids) == sorted(plan.compare.seeds) and all(ids.values())


def test_greedy_evaluation_warns_of_the_sampled_keys_and_ignores_them_for_resume(tmp_path):
    """Under compare.eval=greedy, eval_samples and eval_temperature are unread: a warning each (the ignored-settings
    rules, logged when a run is built), and the stored settings carry their defaults, so that they never keep a
    resume or a merge apart."""
    from accord.compare import settings_of
    from accord.config.ignored import ignored_settings

    data = _with(compare={"eval": "greedy", "eval_samples": 8, "eval_temperature": 0.5})
    plan = load_plan([("base", data)], out=tmp_path / "o")
    lines = ignored_settings(plan.config("atgrpo", 0))
    assert any(x.startswith("compare.eval_samples=8 has no effect with compare.eval=greedy") for x in lines), lines
    assert any(x.startswith("compare.eval_temperature=0.5 has no effect") for x in lines), lines
    plain = load_plan([("base", _with(compare={"eval": "greedy"}))], out=tmp_path / "o")
    assert settings_of(plan) == settings_of(plain)
    sampled = load_plan([("base", _with(compare={"eval": "sampled", "eval_samples": 8}))], out=tmp_path / "o")
    assert settings_of(sampled)["compare"]["eval_samples"] == 8


def test_warm_start_model_is_found(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert warm_start_model(str(model), 0, "main") == str(model)
    sft = tmp_path / "sft-3"
    for name in ("e", "o"):
        (sft / name).mkdir(parents=True)
        (sft / name / "config.json").write_text("{}")
    template = str(tmp_path / "sft-{seed}")
    assert warm_start_model(template, 3, "e") == str(sft / "e")   # the model named like the policy
    with pytest.raises(CompareError, match="holds 2 models and none named 'main'"):
        warm_start_model(template, 3, "main")
    shutil.rmtree(sft / "o")
    assert warm_start_model(template, 3, "main") == str(sft / "e")   # an sft directory with one model
    with pytest.raises(CompareError, match="sft-4 does not exist"):
        warm_start_model(template, 4, "main")


def _result(method: str, seed: int, before: list[float], after: list[float], success: bool = True) -> dict:
    def episodes(values):
        return [{"instance": f"i{k}", "sample": 0, "team": v, **({"success": float(v > 0.5)} if success else {})}
                for k, v in enumerate(values)]

    return {"method": method, "seed": seed, "steps": 2, "train_tokens": 100, "budget_reached": True,
            "flat_group_frac": 0.5, "train_s": 1.0, "eval_samples": 0, "before": episodes(before),
            "after": episodes(after)}


def test_summary_and_verdicts_pair_the_same_units():
    results = [_result("a", s, [0.0, 1.0, 0.0], [1.0, 1.0, 1.0]) for s in (0, 1)]
    results += [_result("b", s, [0.0, 1.0, 0.0], [0.0, 1.0, 0.0]) for s in (0, 1)]
    results += [_result("c", s, [0.0, 1.0, 0.0], [0.4, 0.6, 0.0]) for s in (0, 1)]
    summary = summarise(results, ["a", "b", "c"])
    assert summary["a"]["units"] == 6 and summary["a"]["seeds"] == [0, 1]
    assert summary["a"]["success_after"]["interval"] == "wilson" and summary["a"]["return_after"]["interval"] == "t"
    assert summary["a"]["return_change"]["mean"] == pytest.approx(2 / 3)   # per-unit differences 1, 0, 1
    pairs = {(p["metric"], p["a"], p["b"]): p for p in verdicts(results, ["a", "b", "c"])}
    assert len(pairs) == 6
    ab = pairs["return", "a", "b"]   # differences 1, 0, 1 twice: interval above 0
    assert ab["diff"]["mean"] == pytest.approx(2 / 3) and ab["diff"]["low"] > 0 and ab["verdict"] == "a wins"
    assert ab["between_seeds"]["mean"] == pytest.approx(2 / 3)
    bc = pairs["return", "b", "c"]   # differences -0.4, 0.4, 0 twice: a tie
    assert bc["diff"]["low"] < 0 < bc["diff"]["high"] and bc["winner"] is None and bc["verdict"] == "tie"
    with pytest.raises(CompareError, match="different seeds or held-out instances"):
        verdicts(results + [_result("a", 2, [0.0], [1.0])], ["a", "b"])
    no_success = [_result(m, 0, [0.0, 1.0], [1.0, 1.0], success=False) for m in ("a", "b")]
    assert {p["metric"] for p in verdicts(no_success, ["a", "b"])} == {"return"}
    assert "success_after" not in summarise(no_success, ["a"])["a"]


# --- real comparisons ---------------------------------------------------------------------------------------

def accord(*args, cwd, timeout=600):
    return subprocess.run([sys.executable, "-m", "accord.cli", *map(str, args)], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def one_line_error(res) -> str:
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, res.stderr[-3000:]
    return errors[0]


def _kill_when(cmd: list[str], cwd: Path, ready, timeout: float = 600) -> None:
    """Run ``cmd``, SIGKILL it as soon as ``ready()`` holds (it must not finish first)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    try:
        while not ready():
            assert proc.poll() is None, f"finished before it could be killed: {proc.stderr.read()[-3000:]}"
            assert time.monotonic() - t0 < timeout
            time.sleep(0.01)
    finally:
        proc.kill()
        proc.communicate()


@pytest.fixture(scope="module")
def comparisons(tmp_path_factory):
    """Seed 0 compared in ``a`` (killed while its second method trains, then run again to the end) and seed 1 in
    ``b``: {"root", "cfg", "a", "b", "resumed" (the second run's stderr), "first" (a's first result, as written
    before the kill)}."""
    root = tmp_path_factory.mktemp("compare")
    cfg = root / "relay.yaml"
    cfg.write_text(yaml.safe_dump(BASE, sort_keys=False))
    a = [sys.executable, "-m", "accord.cli", "compare", str(cfg), f"compare.output_dir={root / 'a'}"]
    _kill_when(a, root, lambda: (root / "a" / "runs" / "grpo" / "seed_0" / "checkpoints" / "step_000001").is_dir())
    assert not (root / "a" / "results" / "grpo" / "seed_0.json").exists()
    first = (root / "a" / "results" / "atgrpo" / "seed_0.json").read_bytes()
    resumed = accord(*a[3:], cwd=root)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    b = accord("compare", cfg, "compare.seeds=[1]", f"compare.output_dir={root / 'b'}", cwd=root)
    assert b.returncode == 0, b.stderr[-3000:]
    return {"root": root, "cfg": cfg, "a": root / "a", "b": root / "b", "resumed": resumed, "first": first}


def _check_comparison(data: dict, methods: list[str], seeds: list[int], eval_size: int) -> None:
    """The JSON of a comparison: its parts, the budget rule, and verdicts that follow from their intervals and
    from the episodes themselves."""
    assert data["methods"] == methods and data["seeds"] == seeds
    budget = data["settings"]["compare"]["budget_tokens"]
    assert sorted((r["method"], r["seed"]) for r in data["runs"]) == sorted((m, s) for m in methods for s in seeds)
    for r in data["runs"]:
        tokens = r["step_tokens"]
        assert r["steps"] == len(tokens) >= 2 and r["train_tokens"] == sum(tokens) >= budget > sum(tokens[:-1])
        assert r["budget_reached"] and len(r["step_team_reward"]) == r["steps"]
        assert [e["instance"] for e in r["before"]] == [e["instance"] for e in r["after"]]
        assert len(r["after"]) == eval_size and {"team", "success", "turns"} <= set(r["after"][0])
        assert "completions" not in r["after"][0]   # the texts stay in results/<method>/seed_<s>.json
    for m in methods:
        s = data["summary"][m]
        assert s["seeds"] == seeds and s["units"] == len(seeds) * eval_size
        for key in ("success_before", "success_after", "success_change", "return_before", "return_after",
                    "return_change"):
            assert s[key]["low"] <= s[key]["mean"] <= s[key]["high"], key
    assert len(data["verdicts"]) == 2 * len(methods) * (len(methods) - 1) // 2
    after = {(r["method"], r["seed"], e["instance"]): e for r in data["runs"] for e in r["after"]}
    for p in data["verdicts"]:
        d = p["diff"]
        field = "team" if p["metric"] == "return" else "success"
        diffs = [after[p["a"], s, i][field] - after[p["b"], s, i][field]
                 for (m, s, i) in after if m == p["a"]]
        assert d["n"] == len(diffs) and math.isclose(d["mean"], sum(diffs) / len(diffs), abs_tol=1e-12)
        expected = p["a"] if d["low"] > 0 else p["b"] if d["high"] < 0 else None
        assert p["winner"] == expected
        assert p["verdict"] == ("tie" if expected is None else f"{expected} wins")
    for metric, per in data["tally"].items():
        assert sum(t["wins"] for t in per.values()) == sum(t["losses"] for t in per.values())


@pytest.mark.slow
def test_compare_writes_every_episode_and_verdicts(comparisons):
    a = comparisons["a"]
    data = json.loads((a / "compare.json").read_text())
    _check_comparison(data, ["atgrpo", "grpo"], [0], 3)
    assert (a / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (a / "compare.md").read_text()
    assert "| atgrpo |" in md and "| return | atgrpo | grpo |" in md
    full = json.loads((a / "results" / "grpo" / "seed_0.json").read_text())
    texts = full["after"][0]["completions"]
    assert [c["agent"] for c in texts] == ["solo", "solo"] and all("completion" in c for c in texts)
    # each method's run is a real training run, logged and checkpointed by the trainer; finished runs drop
    # their checkpoints (compare.keep_checkpoints=false)
    for method in ("atgrpo", "grpo"):
        run = a / "runs" / method / "seed_0"
        steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
        result = next(r for r in data["runs"] if r["method"] == method)
        assert steps == list(range(1, result["steps"] + 1))
        assert not (run / "checkpoints").exists()
    # the two methods got the same budget, in different numbers of steps (a single agent generates less a step)
    steps = {r["method"]: r["steps"] for r in data["runs"]}
    assert steps["grpo"] > steps["atgrpo"]


@pytest.mark.slow
def test_killed_comparison_resumes_where_it_stopped(comparisons):
    """The first method's result (written before the kill) is kept as it was; the second method's run goes on
    from its checkpoint, and logs each step once."""
    a, err = comparisons["a"], comparisons["resumed"].stderr
    assert "compare: atgrpo seed 0 is done" in err
    assert re.search(r"resumed \S+grpo/seed_0 at step [1-9]", err), err[-3000:]
    assert (a / "results" / "atgrpo" / "seed_0.json").read_bytes() == comparisons["first"]
    result = json.loads((a / "results" / "grpo" / "seed_0.json").read_text())
    steps = [json.loads(line)["step"] for line in (a / "runs" / "grpo" / "seed_0" / "metrics.jsonl").read_text()
             .splitlines()]
    assert steps == list(range(1, result["steps"] + 1))
    # the same settings again: nothing left to run
    again = accord("compare", comparisons["cfg"], f"compare.output_dir={a}", cwd=comparisons["root"])
    assert again.returncode == 0 and "grpo seed 0 is done" in again.stderr and "step 1:" not in again.stderr


@pytest.mark.slow
def test_steps_logged_past_the_last_checkpoint_are_not_counted_twice(tmp_path):
    """Killed after logging a step it had not checkpointed, a run resumes from its checkpoint and trains that step
    again: the budget counts it once, so the run still trains to the full budget (it stopped short before)."""
    data = _with(run={"checkpoint_every": 2}, compare={"methods": {"grpo": ["algorithm.baseline=single_agent"]}})
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    metrics = tmp_path / "out" / "runs" / "grpo" / "seed_0" / "metrics.jsonl"

    def past_checkpoint() -> bool:   # an odd step logged: its checkpoint (every 2 steps) is not written
        lines = metrics.read_text().splitlines() if metrics.is_file() else []
        return len(lines) >= 3 and len(lines) % 2 == 1

    cmd = [sys.executable, "-m", "accord.cli", "compare", str(cfg), f"compare.output_dir={tmp_path / 'out'}"]
    _kill_when(cmd, tmp_path, past_checkpoint)
    logged = len(metrics.read_text().splitlines())
    resumed = accord(*cmd[3:], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert re.search(rf"resumed \S+grpo/seed_0 at step {logged - 1}\b", resumed.stderr), resumed.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "results" / "grpo" / "seed_0.json").read_text())
    tokens, budget = result["step_tokens"], result["budget_tokens"]
    assert result["budget_reached"] and sum(tokens) >= budget > sum(tokens[:-1]), (tokens, budget)
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, result["steps"] + 1))


@pytest.mark.slow
def test_merge_combines_seeds_run_apart(comparisons):
    root, a, b = comparisons["root"], comparisons["a"], comparisons["b"]
    res = accord("compare", "--merge", a / "compare.json", b, "--out", root / "m", cwd=root)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads((root / "m" / "compare.json").read_text())
    _check_comparison(data, ["atgrpo", "grpo"], [0, 1], 3)
    assert data["merged_from"] == [str(a / "compare.json"), str(b)]
    assert "| atgrpo |" in res.stdout and (root / "m" / "compare.png").is_file()
    seed1 = json.loads((b / "compare.json").read_text())
    assert [r for r in data["runs"] if r["seed"] == 1] == seed1["runs"]


@pytest.mark.slow
def test_bad_input_on_finished_comparisons(comparisons):
    """Resuming into a directory of other settings, merging comparisons of different settings, and a seed in two
    merged files: one line each, naming the key or the seed."""
    root, a, b = comparisons["root"], comparisons["a"], comparisons["b"]
    line = one_line_error(accord("compare", comparisons["cfg"], f"compare.output_dir={a}",
                                 "compare.budget_tokens=200", cwd=root))
    assert "holds a comparison with other settings: compare.budget_tokens=150 there, 200 now" in line
    assert "--overwrite" in line
    other = json.loads((b / "compare.json").read_text())
    other["settings"]["methods"]["grpo"]["training.lr"] = 0.5
    (root / "lr.json").write_text(json.dumps(other))
    line = one_line_error(accord("compare", "--merge", a, root / "lr.json", "--out", root / "x", cwd=root))
    assert "methods.grpo.training.lr=0.5" in line and "merge only comparisons of one setting" in line
    line = one_line_error(accord("compare", "--merge", a, a, "--out", root / "x", cwd=root))
    assert "seed(s) [0] are already in an earlier file" in line
    (root / "junk.json").write_text("[1, 2]")
    line = one_line_error(accord("compare", "--merge", root / "junk.json", "--out", root / "x", cwd=root))
    assert "not a compare.json of accord compare" in line
    # the merged comparison never lands on one of its inputs, nor on a directory that holds something
    before = (a / "compare.json").read_bytes()
    line = one_line_error(accord("compare", "--merge", a, b, "--out", a, cwd=root))
    assert f"--out {a} holds one of the comparisons being merged" in line
    line = one_line_error(accord("compare", "--merge", a, b, "--out", root, "--overwrite", cwd=root))
    assert f"--out {root} holds one of the comparisons being merged" in line
    (root / "full").mkdir()
    (root / "full" / "notes.txt").write_text("mine")
    for extra in ((), ("--overwrite",)):   # files that are not a comparison: refused, --overwrite or not
        line = one_line_error(accord("compare", "--merge", a, b, "--out", root / "full", *extra, cwd=root))
        assert "is not empty and holds no comparison" in line
    assert (a / "compare.json").read_bytes() == before and (root / "full" / "notes.txt").read_text() == "mine"
    # a damaged stored result: one line naming the file and how to redo it
    damaged = root / "damaged"
    shutil.copytree(b, damaged)
    path = damaged / "results" / "grpo" / "seed_1.json"
    path.write_text(path.read_text()[:200])
    line = one_line_error(accord("compare", comparisons["cfg"], "compare.seeds=[1]", f"compare.output_dir={damaged}",
                                 cwd=root))
    assert f"{path} cannot be read" in line and "delete it to run that method and seed" in line


@pytest.mark.slow
def test_a_run_of_other_seeds_reports_every_seed_of_its_directory(comparisons):
    """Seeds run into one directory one invocation at a time: the report of the last covers them all."""
    root, a, b = comparisons["root"], comparisons["a"], comparisons["b"]
    both = root / "both"
    shutil.copytree(b, both)   # seed 1, then seed 0's results as if an earlier invocation had run them there
    for method in ("atgrpo", "grpo"):
        shutil.copy(a / "results" / method / "seed_0.json", both / "results" / method / "seed_0.json")
    res = accord("compare", comparisons["cfg"], "compare.seeds=[1]", f"compare.output_dir={both}", cwd=root)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "the report also holds seed(s) [0]" in res.stderr
    data = json.loads((both / "compare.json").read_text())
    assert data["seeds"] == [0, 1] and sorted({r["seed"] for r in data["runs"]}) == [0, 1]


@pytest.mark.slow
def test_budget_reached_by_a_first_step_is_refused(tmp_path):
    """Above the least a step can generate (B x K = 4 tokens), below what the first step generated: refused after
    that step, naming the method and its step's tokens."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(BASE))
    line = one_line_error(accord("compare", cfg, "compare.budget_tokens=10", f"compare.output_dir={tmp_path / 'o'}",
                                 cwd=tmp_path))
    assert re.search(r"compare.budget_tokens=10 is reached by the first step of method 'atgrpo' \(seed 0: \d+ "
                     r"tokens\); give a budget of several of its steps", line), line


# the cases of one subprocess: (id, arguments, what the error line must contain); none loads a model
CASES = [
    ("differ", ["compare", "a.yaml", "b.yaml"], ["methods 'a' and 'b' differ in training.lr (0.02 against 0.5)",
                                                 "add training.lr to compare.knobs"]),
    ("override-not-method", ["compare", "base.yaml", "compare.methods={x: [], y: [rollout.max_new_tokens=8]}"],
     ["methods 'x' and 'y' differ in rollout.max_new_tokens (4 against 8)", "compare.knobs"]),
    ("seed-twice", ["compare", "base.yaml", "compare.seeds=[0, 1, 0]"],
     ["compare.seeds=[0, 1, 0] gives seed(s) [0] more than once", "give each seed once"]),
    ("budget-below-a-step", ["compare", "base.yaml", "compare.budget_tokens=4"],
     ["compare.budget_tokens=4 is reached by the first step of method 'atgrpo'", "at least", "= 4 tokens"]),
    ("no-budget", ["compare", "base.yaml", "compare.budget_tokens=null"], ["compare.budget_tokens is not set"]),
    ("no-methods", ["compare", "a.yaml"], ["no methods to compare", "compare.methods"]),
    ("schedule", ["compare", "base.yaml", "training.schedule=cosine"], ["training.schedule=cosine", "constant"]),
    ("warm-start", ["compare", "base.yaml", "compare.warm_start=nowhere/sft"],
     ["compare.warm_start: nowhere/sft does not exist", "accord sft"]),
    ("single-turn-independent", ["compare", "base.yaml", "task.name=letters", "task.options={}",
                                 "compare.methods={x: [algorithm.name=magrpo], "
                                 "y: [algorithm.name=magrpo, algorithm.baseline=independent]}"],
     ["method 'y'", "baseline=independent"]),
    ("merge-without-out", ["compare", "--merge", "a.json"], ["--merge needs --out DIR"]),
    ("method-name", ["compare", "base.yaml", "compare.methods={a/b: []}"], ["'a/b' cannot name a method"]),
    # keys the comparison sets for every run, and knobs that cannot be one
    ("method-sets-seed", ["compare", "base.yaml", "compare.methods={x: [], y: [run.seed=3]}"],
     ["compare.methods.y sets run.seed, which the comparison sets for every run itself", "drop it"]),
    ("method-sets-steps", ["compare", "base.yaml", "compare.methods={x: [], y: [run.steps=2]}"],
     ["compare.methods.y sets run.steps"]),
    ("seed-not-compared", ["compare", "base.yaml", "run.seed=7"],
     ["run.seed=7 is not one of compare.seeds [0]", "compare.seeds=[7]"]),
    ("knob-of-compare", ["compare", "base.yaml", "compare.knobs=[compare.budget_tokens]"],
     ["compare.budget_tokens is a setting of the comparison itself", "cannot be a knob"]),
    ("knob-misspelt", ["compare", "base.yaml", "compare.knobs=[rollout.max_new_token]"],
     ["compare.knobs: rollout.max_new_token is not a key of the config", "did you mean rollout.max_new_tokens"]),
    ("files-differ-in-compare", ["compare", "a.yaml", "c.yaml"],
     ["differ in compare.budget_tokens (150 against 300), a setting of the comparison itself",
      "the same compare section"]),
]

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
    """Every case of CASES through ``accord.cli.main`` in one subprocess, each in its own directory."""
    root = tmp_path_factory.mktemp("cases")
    cases = []
    for cid, args, _ in CASES:
        d = root / cid
        d.mkdir()
        (d / "base.yaml").write_text(yaml.safe_dump(BASE))
        plain = _with(compare={"methods": {}, "budget_tokens": 150})
        (d / "a.yaml").write_text(yaml.safe_dump(plain))
        (d / "b.yaml").write_text(yaml.safe_dump({**plain, "training": {**plain["training"], "lr": 0.5}}))
        (d / "c.yaml").write_text(yaml.safe_dump({**plain, "algorithm": {**plain["algorithm"], "name": "magrpo"},
                                                  "compare": {**plain["compare"], "budget_tokens": 300}}))
        cases.append({"id": cid, "args": args, "cwd": str(d)})
    (root / "cases.json").write_text(json.dumps(cases))
    proc = subprocess.run([sys.executable, "-c", BATCH, str(root / "cases.json"), str(root / "results.json")],
                          cwd=root, env=ENV, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((root / "results.json").read_text())
    return {c["id"]: (r, root / c["id"]) for c, r in zip(cases, results)}


@pytest.mark.slow
@pytest.mark.parametrize("cid,needles", [(c[0], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_before_any_model_loads(batch, cid, needles):
    result, cwd = batch[cid]
    assert result["returncode"] == 2 and "Traceback" not in result["stderr"], result["stderr"][-3000:]
    errors = [line for line in result["stderr"].splitlines() if " ERROR " in line]
    assert len(errors) == 1, result["stderr"][-3000:]
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    assert "policy main on" not in result["stderr"]   # refused before a model was built
    assert not (cwd / "runs").exists()   # and before the output directory was claimed


def test_help_lists_compare_and_its_keys(capsys):
    """`accord --help` names the command (its help is %-formatted by argparse: "95 %" must be escaped), and
    `accord compare --help` lists the compare keys."""
    from accord.cli import main

    for argv, needles in ((["--help"], ["compare", "win/tie/loss verdict"]),
                          (["compare", "--help"], ["compare.budget_tokens (default None)", "compare.knobs",
                                                   "--merge", "examples/compare/relay.yaml"])):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert all(n in out for n in needles), out
