"""``accord compare``: several methods trained at an equal budget of generated tokens, over several seeds,
evaluated on the same held-out instances before and after, with paired 95 % intervals and a win/tie/loss
verdict per pair of methods.

    accord compare examples/compare_relay.yaml                  # methods under compare: in one config
    accord compare a.yaml b.yaml compare.seeds=[0,1] compare.budget_tokens=4000   # one method per file
    accord compare --merge s0/compare.json s1/compare.json --out merged   # seeds run apart, one comparison

**Methods** are configs that differ only in the method keys (:data:`METHOD_KEYS`: the algorithm, the
baseline, the specialisation level and the policies and agents it needs) and in the keys declared under
``compare.knobs``; any other difference is refused before a model loads, naming the key, so that no method
is tuned more than another by accident. They come either from one config with ``compare.methods`` (name ->
``key=value`` overrides of that config) or from several config files (one method each, named by the file).

**Per seed and method** (:func:`run_one`), in ``compare.output_dir``:

1. the method's run is built by the :class:`~accord.trainer.Trainer` (``runs/<method>/seed_<s>``; run.seed
   is the seed, every policy starts from ``compare.warm_start`` when one is given);
2. *before*: its starting weights play the held-out instances (:func:`accord.evaluate.evaluate_episodes`:
   greedy, or ``compare.eval_samples`` sampled episodes per instance). Methods whose evaluation would be
   the same (same starting weights, environment and evaluation settings; e.g. AT-GRPO and MAGRPO on one
   shared model) share one, stored under ``before/``;
3. training (:meth:`Trainer.train`) until the completions the method generated for training reach
   ``compare.budget_tokens`` tokens (``perf/gen_tokens`` of each step); the step that crosses the budget is
   the last. A budget that a method's first step already reaches is an error: the methods would then get
   one step each, not equal budgets;
4. *after*: the trained weights on the same instances; the result (every episode, the steps and tokens,
   the training reward per step) is written atomically to ``results/<method>/seed_<s>.json``.

A killed comparison started again with the same settings skips every finished (method, seed) and resumes
an unfinished run from its newest checkpoint (``run.checkpoint_every``); other settings in the same
directory are an error naming the key. The statistics (:func:`summarise`, :func:`verdicts`; intervals from
:mod:`accord.stats`) treat the (seed, held-out instance) pairs as independent units; see ``docs/compare.md``.
Output: ``compare.json`` (settings, summary, verdicts and every episode's values), ``compare.md`` (the
tables) and ``compare.png`` (the plot).
"""

from __future__ import annotations

import copy
import gc
import hashlib
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accord import metric_names as mn
from accord.config import (CompareConfig, Config, ConfigError, apply_overrides, config_from_dict, is_config_file,
                           read_yaml)
from accord.config.base import covered as _covered, first_difference, flat_keys as _flat
from accord.stats import average, paired, rate, verdict

logger = logging.getLogger(__name__)

# what makes a method: the algorithm and baseline, and the specialisation level with the policies and agents
# it needs (their names and mapping; each policy's own settings must still be the same, see _policy_rows)
METHOD_KEYS = ("algorithm.name", "algorithm.baseline", "algorithm.joint_mode", "algorithm.norm_scope",
               "algorithm.parse_penalty", "specialization", "agents", "lora")
# keys the comparison sets itself, or that change where and how a run logs but not what it learns
FREE_KEYS = ("run.name", "run.output_dir", "run.run_dir", "run.seed", "run.steps", "run.eval_before",
             "run.eval_after", "run.eval_every", "run.threads", "run.retain_freed_memory", "run.checkpoint_every",
             "run.keep_checkpoints", "logging", "sft", "compare.methods")
# keys every run's config gets from the comparison itself (Plan.config): a method may not set them
SET_KEYS = ("run.name", "run.run_dir", "run.seed", "run.steps", "run.eval_before", "run.eval_after", "run.eval_every")
# the sampled evaluation's keys, which greedy evaluation does not read (accord.config.ignored warns of them)
GREEDY_UNREAD = ("eval_samples", "eval_temperature")
# settings that may differ between comparisons that are merged: their seeds and where their warm starts lay
MERGE_FREE = ("compare.warm_start",)
FORMAT = "accord-compare-1"


class CompareError(ConfigError):
    """A comparison cannot go on as asked (settings that differ, a budget below a first step, files that are
    not a comparison's); the message says how to fix it."""


# --- the plan: methods, settings, checks (no model is loaded) ------------------------------------------------

@dataclass
class Plan:
    """A comparison: each method's config data (before the seed, run directory and warm start are set), the
    compare settings and the output directory."""

    methods: dict[str, dict]
    compare: CompareConfig
    out: Path

    def config(self, method: str, seed: int) -> Config:
        """The config of ``method``'s run for ``seed``: its run directory, the seed, the step cap, no
        evaluation of its own (the comparison evaluates before and after), the warm start."""
        data = copy.deepcopy(self.methods[method])
        run = data.setdefault("run", {}) or {}
        data["run"] = run
        run.update(name=f"{method}-seed{seed}", run_dir=str(self.run_dir(method, seed)), seed=seed,
                   steps=self.compare.max_steps, eval_before=False, eval_after=False, eval_every=0)
        if self.compare.warm_start:
            policies = data.get("policies") or {"main": {}}
            for name, pol in policies.items():
                pol = dict(pol or {})
                pol.update(model=warm_start_model(self.compare.warm_start, seed, name), model_kwargs={})
                policies[name] = pol
            data["policies"] = policies
        return config_from_dict(data)

    def run_dir(self, method: str, seed: int) -> Path:
        return self.out / "runs" / method / f"seed_{seed}"

    def result_path(self, method: str, seed: int) -> Path:
        return self.out / "results" / method / f"seed_{seed}.json"


def load_plan(sources: list[tuple[str, dict]], overrides: list[str] = (), *, out: str | Path | None = None) -> Plan:
    """A :class:`Plan` from config data: one source with ``compare.methods``, or several sources (one method
    each, named by the first item of each pair). ``overrides`` apply to every source. Every check that needs
    no model runs here; see :func:`preflight` for those that need the environment."""
    if not sources:
        raise CompareError("accord compare needs a config: one with compare.methods, or one config file per method")
    datas = []
    for name, data in sources:
        data = copy.deepcopy(data)
        apply_overrides(data, overrides)
        datas.append((name, data, config_from_dict(data)))
    if len(datas) == 1:
        name, data, cfg = datas[0]
        if not cfg.compare.methods:
            raise CompareError(f"{name}: no methods to compare; list them under compare.methods (name: [key=value "
                               "overrides], e.g. compare.methods={grpo: [algorithm.baseline=single_agent], atgrpo: "
                               "[]}) or give one config file per method")
        methods = {m: _method_data(name, data, m, ovr) for m, ovr in cfg.compare.methods.items()}
    else:
        methods = {}
        for name, data, cfg in datas:
            if cfg.compare.methods:
                raise CompareError(f"{name} lists compare.methods, but several config files were given (one method "
                                   "each); give one config with compare.methods, or drop compare.methods from it")
            if name in methods:
                raise CompareError(f"two config files make method {name!r}; method names come from the file names, "
                                   "so give the files different names")
            if not name.replace("_", "").replace("-", "").isalnum():
                raise CompareError(f"config file {name!r} cannot name a method (it names its directories); rename the "
                                   "file to letters, digits, '_' or '-'")
            methods[name] = data
    for name, data, cfg in datas:
        run = data.get("run")
        seed = run.get("seed") if isinstance(run, dict) else None   # set in the file or by an override
        if seed is not None and seed not in cfg.compare.seeds:
            raise CompareError(f"{name}: run.seed={seed} is not one of compare.seeds {cfg.compare.seeds}: each run's "
                               f"seed is a seed of compare.seeds; give compare.seeds=[{seed}] (or add it there), or "
                               "drop run.seed")
    cfgs = {m: config_from_dict(copy.deepcopy(d)) for m, d in methods.items()}
    first = next(iter(cfgs.values()))
    check_knobs(first)
    check_comparable(cfgs, first.compare.knobs)
    settings = first.compare
    if settings.budget_tokens is None:
        raise CompareError("compare.budget_tokens is not set; give the generated training tokens per method and "
                           "seed, e.g. compare.budget_tokens=20000")
    for m, cfg in cfgs.items():
        if cfg.training.schedule != "constant":
            raise CompareError(f"method {m!r}: training.schedule={cfg.training.schedule} decays over run.steps, but "
                               "a token budget does not fix the number of steps; set training.schedule=constant "
                               "(warm-up steps are fine)")
    if out is None:
        out = settings.output_dir or Path(first.run.output_dir) / f"compare-{first.run.name}"
    return Plan(methods, settings, Path(out))


def _method_data(source: str, data: dict, method: str, overrides: list[str]) -> dict:
    """``data`` with the overrides of one entry of compare.methods (which may not set compare.* themselves)."""
    out = copy.deepcopy(data)
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key == "compare" or key.startswith("compare."):
            raise CompareError(f"compare.methods.{method} sets {key}; a method's overrides may not change the "
                               "comparison's own settings: set them once under compare")
        if _covered(key, SET_KEYS) or any(k.startswith(key + ".") for k in SET_KEYS):   # a key, or "run"
            raise CompareError(f"compare.methods.{method} sets {key}, which the comparison sets for every run itself "
                               "(run.seed from compare.seeds, run.steps from the budget, the run's name, directory "
                               "and evaluations); drop it from the method")
    try:
        apply_overrides(out, overrides)   # a key given twice is refused, as on the command line
    except ConfigError as err:
        raise CompareError(f"compare.methods.{method}: {err}") from err
    try:
        config_from_dict(copy.deepcopy(out))
    except ConfigError as err:
        raise CompareError(f"compare.methods.{method} ({source}): {err}") from err
    return out


def check_comparable(cfgs: dict[str, Config], knobs: list[str]) -> None:
    """The methods' configs differ only in the method keys, the free keys and the declared knobs; policies may
    differ in their names (a method key) but not in their settings. Raises :class:`CompareError` naming the
    first key that differs otherwise."""
    allowed = tuple(METHOD_KEYS) + tuple(FREE_KEYS) + tuple(knobs)
    flats = {m: {k: v for k, v in _flat(cfg.to_dict()).items() if not k.startswith("policies.")}
             for m, cfg in cfgs.items()}
    names = list(cfgs)
    learned: dict[str, str] = {}   # what a run learns from: the config without the keys that only log or place it
    for m, cfg in cfgs.items():
        key = repr(sorted((k, repr(v)) for k, v in _flat(cfg.to_dict()).items() if not _covered(k, FREE_KEYS)))
        if key in learned:
            raise CompareError(f"methods {learned[key]!r} and {m!r} make the same run (their configs differ in no "
                               "key but where and how they log); give each method the overrides that make it "
                               "different, or drop one")
        learned[key] = m
    ref = names[0]
    for other in names[1:]:
        for key in sorted(set(flats[ref]) | set(flats[other])):
            a, b = flats[ref].get(key, "<unset>"), flats[other].get(key, "<unset>")
            if a != b and not _covered(key, allowed):
                raise CompareError(_differ(ref, other, key, a, b))
    if _covered("policies", knobs):
        return
    rows = [(m, p, _flat(pol, f"policies.{p}"))
            for m, cfg in cfgs.items() for p, pol in cfg.to_dict()["policies"].items()]
    m0, p0, first = rows[0]
    for m, p, row in rows[1:]:
        for field in sorted({k.split(".", 2)[2] for k in (*first, *row)}):
            a, b = first.get(f"policies.{p0}.{field}", "<unset>"), row.get(f"policies.{p}.{field}", "<unset>")
            if a != b and not _covered(f"policies.{p}.{field}", knobs):
                raise CompareError(f"methods {m0!r} and {m!r} differ in their policies' settings: policies.{p0}."
                                   f"{field}={a!r} against policies.{p}.{field}={b!r}; give every policy the same "
                                   "settings, or add policies to compare.knobs to compare them on purpose")


def check_knobs(cfg: Config) -> None:
    """Every knob names a key (or a section) of the config; a misspelt knob is a :class:`CompareError` with the
    nearest keys."""
    import difflib

    keys = set(_flat(cfg.to_dict()))
    sections = {k.rsplit(".", i)[0] for k in keys for i in range(1, k.count(".") + 1)}
    for knob in cfg.compare.knobs:
        if knob not in keys and knob not in sections:
            near = difflib.get_close_matches(knob, sorted(keys | sections), n=3)
            hint = f" (did you mean {' or '.join(near)}?)" if near else ""
            raise CompareError(f"compare.knobs: {knob} is not a key of the config{hint}; name a config key such as "
                               "training.lr, or a section such as policies")


def _differ(a: str, b: str, key: str, va: Any, vb: Any) -> str:
    if key.startswith("compare."):
        return (f"methods {a!r} and {b!r} differ in {key} ({va!r} against {vb!r}), a setting of the comparison "
                "itself; give every config file the same compare section, or set it once on the command line "
                f"({key}=...)")
    return (f"methods {a!r} and {b!r} differ in {key} ({va!r} against {vb!r}), which is neither a method key nor "
            f"declared in compare.knobs; make it the same, or add {key} to compare.knobs to compare it on purpose")


def warm_start_model(template: str, seed: int, policy: str) -> str:
    """The model directory policy ``policy`` starts from: ``template`` with {seed} replaced, itself when it is
    a model directory (it holds config.json), else its subdirectory named like the policy, else its only model
    subdirectory (an `accord sft` output directory of a shared or LoRA run)."""
    path = Path(template.replace("{seed}", str(seed)))
    if (path / "config.json").is_file():
        return str(path)
    if not path.is_dir():
        raise CompareError(f"compare.warm_start: {path} does not exist; run `accord sft` first (its output "
                           "directory), or give a Hugging Face model directory")
    if (path / policy / "config.json").is_file():
        return str(path / policy)
    models = sorted(p for p in path.iterdir() if (p / "config.json").is_file())
    if len(models) == 1:
        return str(models[0])
    raise CompareError(f"compare.warm_start: {path} holds {'no model' if not models else f'{len(models)} models'} "
                       f"and none named {policy!r}; give a model directory, or an `accord sft` output directory "
                       "with one model or one per policy name")


def preflight(plan: Plan) -> dict[int, list[str]]:
    """Every check that needs the environment but no model, for every method and seed: the run builds
    (agents, rollout, data), the budget exceeds the least a first step can generate, and the held-out
    instances are the same for every method of a seed. Returns the held-out instance ids per seed."""
    from accord.build import EnvFactory, check_run, split_data
    from accord.rollout.base import make_rollout, rollout_name

    ids: dict[int, list[str]] = {}
    budget = plan.compare.budget_tokens
    for seed in plan.compare.seeds:
        first = None
        for method in plan.methods:
            try:
                cfg = plan.config(method, seed)
                make_env = EnvFactory(cfg)
                env = make_env()
                check_run(cfg, env)
                agents = tuple(a.name for a in cfg.agents)
                make_rollout(rollout_name(cfg, env), cfg, env, make_env, agents,
                             {a.name: a.policy for a in cfg.agents})
                _, rows = split_data(cfg, env)
            except CompareError:
                raise
            except ConfigError as err:
                raise CompareError(f"method {method!r}: {err}") from err
            if not rows:
                raise CompareError(f"method {method!r}: task.eval_size is 0; a comparison needs held-out instances, "
                                   "set task.eval_size=N")
            # every completion holds at least one token (the EOS it stops on), and every step samples K
            # completions of at least one agent for each of its B instances
            least = cfg.rollout.batch_size * cfg.algorithm.num_generations
            if budget <= least:
                raise CompareError(f"compare.budget_tokens={budget} is reached by the first step of method "
                                   f"{method!r}, which generates at least rollout.batch_size x "
                                   f"algorithm.num_generations = {least} tokens; give a budget of several steps")
            these = [str(r.get("id", b)) for b, r in enumerate(rows)]
            if first is None:
                first = (method, these)
            elif these != first[1]:
                raise CompareError(f"seed {seed}: methods {first[0]!r} and {method!r} get different held-out "
                                   "instances from the task, so they cannot be paired; make the task options that "
                                   "choose instances the same")
        ids[seed] = first[1]
    return ids


def settings_of(plan: Plan) -> dict:
    """What must be the same for results to be resumed or merged: the comparison's settings (seeds aside) and
    each method's config (the keys a comparison sets itself aside)."""
    compare = {k: v for k, v in plan.compare.__dict__.items()
               if k not in ("seeds", "output_dir", "methods", "keep_checkpoints")}
    if compare["eval"] == "greedy":   # unread under greedy: their defaults, never keeping a resume or merge apart
        compare.update({k: CompareConfig.__dataclass_fields__[k].default for k in GREEDY_UNREAD})
    methods = {}
    for m, data in plan.methods.items():
        flat = _flat(config_from_dict(copy.deepcopy(data)).to_dict())
        methods[m] = {k: v for k, v in flat.items() if not _covered(k, FREE_KEYS + ("compare",))}
    # as JSON has them (lists, not tuples), so that settings read back from settings.json compare equal
    return json.loads(json.dumps({"format": FORMAT, "compare": compare, "methods": methods}))


def claim_output(plan: Plan, settings: dict, *, overwrite: bool) -> None:
    """Make the output directory ours: new, or a comparison of the same settings (resumed), or (``overwrite``)
    an earlier comparison deleted first. Anything else is a :class:`CompareError` naming the fix."""
    out = plan.out
    stored = out / "settings.json"
    if out.exists() and not out.is_dir():
        raise CompareError(f"compare.output_dir {out} is a file; give a directory")
    if stored.is_file():
        if overwrite:
            logger.warning("--overwrite: deleting the earlier comparison in %s", out)
            shutil.rmtree(out)
        else:
            try:
                old = json.loads(stored.read_text(encoding="utf-8"))
                if not isinstance(old, dict) or not isinstance(old.get("methods", {}), dict):
                    raise ValueError(f"a JSON {type(old).__name__} without a methods table, not the settings of a "
                                     "comparison")
            except (OSError, ValueError) as err:
                raise CompareError(f"{stored} cannot be read ({err}); use another compare.output_dir or --overwrite") \
                    from err
            added = [m for m in settings["methods"] if m not in old.get("methods", {})]
            gone = [m for m in old.get("methods", {}) if m not in settings["methods"]]
            if added or gone:
                what = "; ".join(part for part in (
                    f"method(s) {added} not in it" if added else "", f"method(s) {gone} of it not given now" if gone
                    else "") if part)
                raise CompareError(f"{out} holds a comparison of other methods ({what}); use another "
                                   "compare.output_dir (merge the two later with --merge only if their methods "
                                   "agree), or --overwrite to delete it")
            diff = first_difference(old, settings)
            if diff is not None:
                key, was, now = diff
                raise CompareError(f"{out} holds a comparison with other settings: {key}={was!r} there, {now!r} now; "
                                   "use another compare.output_dir, or --overwrite to delete it")
    elif out.is_dir() and any(out.iterdir()):
        raise CompareError(f"{out} is not empty and holds no comparison (no settings.json); use another "
                           "compare.output_dir")
    out.mkdir(parents=True, exist_ok=True)
    _write_json(stored, settings)


def _write_json(path: Path, data: Any) -> None:
    from accord.tracking.registry import _atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write_text(path, json.dumps(data, indent=1))


# --- running ----------------------------------------------------------------------------------------------

def run_compare(plan: Plan, *, overwrite: bool = False) -> dict:
    """Run every (method, seed) not finished yet, then summarise, write compare.json/.md/.png and return the
    comparison (see the module docstring)."""
    t0 = time.perf_counter()
    ids = preflight(plan)
    settings = settings_of(plan)
    claim_output(plan, settings, overwrite=overwrite)
    logger.info("compare: %d methods x %d seeds, %d held-out instances each, budget %d generated tokens; in %s",
                len(plan.methods), len(plan.compare.seeds), len(next(iter(ids.values()))),
                plan.compare.budget_tokens, plan.out)
    logger.info("compare: each method's run trains to the budget (run.steps becomes the cap compare.max_steps=%d) "
                "and evaluates nothing itself (run.eval_before/eval_after/eval_every off): the comparison "
                "evaluates before and after", plan.compare.max_steps)
    results = []
    for seed in plan.compare.seeds:
        for method in plan.methods:
            path = plan.result_path(method, seed)
            if path.is_file():
                logger.info("compare: %s seed %d is done (%s)", method, seed, path)
                results.append(_read_result(path))
                leftover = plan.config(method, seed).run_dir / "checkpoints"   # a kill after storing the result
                if not plan.compare.keep_checkpoints and leftover.is_dir():
                    shutil.rmtree(leftover)
                continue
            results.append(run_one(plan, method, seed))
    seeds = list(plan.compare.seeds)
    earlier = stored_seeds(plan, exclude=seeds)
    if earlier:   # the same settings (claim_output checked them): the directory's report covers every seed run
        logger.info("compare: the report also holds seed(s) %s, finished earlier in %s", earlier, plan.out)
        results += [_read_result(plan.result_path(m, s)) for s in earlier for m in plan.methods]
        seeds = sorted(seeds + earlier)
    return report(settings, seeds, results, plan.out, total_s=time.perf_counter() - t0)


def _read_result(path: Path) -> dict:
    """A stored result or before-evaluation; a damaged one is a :class:`CompareError` saying how to redo it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not a result")
        return data
    except (OSError, ValueError) as err:
        raise CompareError(f"{path} cannot be read ({type(err).__name__}: {err}); delete it to run that method and "
                           "seed (or its before-evaluation) again") from err


def stored_seeds(plan: Plan, exclude: list[int] = ()) -> list[int]:
    """Seeds outside ``exclude`` whose results are stored in the output directory for every method."""
    per_method = []
    for method in plan.methods:
        folder = plan.out / "results" / method
        names = [p.stem for p in folder.glob("seed_*.json")] if folder.is_dir() else []
        per_method.append({int(n[5:]) for n in names if n[5:].isdigit()})
    found = set.intersection(*per_method) if per_method else set()
    return sorted(found - set(exclude))


def _eval_settings(plan: Plan, cfg: Config) -> tuple[int, float]:
    """(samples per instance, 0 for greedy; temperature) of the comparison's evaluation of ``cfg``."""
    c = plan.compare
    if c.eval == "greedy":
        return 0, 1.0
    return c.eval_samples, c.eval_temperature or cfg.rollout.eval_temperature or cfg.rollout.temperature


def _before_key(trainer, samples: int, temperature: float) -> str:
    """A digest of what decides the before-evaluation: the starting weights (models, policies, agents,
    seed, specialisation), the environment (task, a baseline that changes it), the rollout's evaluation and
    settings, the evaluation's own settings. Methods with the same digest would play the same episodes."""
    d = trainer.cfg.to_dict()
    baseline = d["algorithm"]["baseline"]   # single_agent and centralized change the environment; independent not
    key = {"run": {k: d["run"][k] for k in ("seed", "device", "backend")},
           "env": [baseline, d["algorithm"]["parse_penalty"]] if baseline in ("single_agent", "centralized") else [],
           # the rollouts' evaluation: AT-GRPO and multi-turn MAGRPO play held-out episodes with one function
           "play": type(trainer.run.rollout).play.__qualname__, "eval": [samples, temperature],
           **{k: d[k] for k in ("specialization", "policies", "agents", "task", "imports", "rollout", "lora")}}
    return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_one(plan: Plan, method: str, seed: int) -> dict:
    """Build, evaluate before, train to the budget, evaluate after, and store one (method, seed). A full disk
    says to run the comparison again (a run's own advice, ``accord train --resume``, would train it past its
    budget)."""
    from accord.checkpoint import DiskFullError

    try:
        return _run_one(plan, method, seed)
    except DiskFullError as err:
        raise DiskFullError(f"{err.what} and run the same `accord compare` command again: it goes on from the last "
                            "checkpoint", err.what) from err


def _run_one(plan: Plan, method: str, seed: int) -> dict:
    from accord.evaluate import evaluate_episodes
    from accord.trainer import Trainer
    from accord.tracking.jsonl import read_metrics

    cfg = plan.config(method, seed)
    run_dir = cfg.run_dir
    started = (run_dir / "config.yaml").is_file()
    budget = plan.compare.budget_tokens
    trainer = Trainer(cfg, resume=started)
    try:
        samples, temperature = _eval_settings(plan, trainer.cfg)
        key = _before_key(trainer, samples, temperature)
        cache = plan.out / "before" / f"seed_{seed}" / f"{key}.json"
        if cache.is_file():
            shared = _read_result(cache)
            before, before_s, before_by = shared["episodes"], 0.0, shared["method"]
            logger.info("compare: %s seed %d: before-evaluation shared with %s", method, seed, before_by)
        elif trainer.start_step > 0:
            raise CompareError(f"{run_dir} has trained but its before-evaluation ({cache}) is gone; delete {run_dir} "
                               "to run it again")
        else:
            t = time.perf_counter()
            before = evaluate_episodes(trainer.run, samples=samples, temperature=temperature)
            before_s, before_by = time.perf_counter() - t, method
            _write_json(cache, {"method": method, "seed": seed, "episodes": before})
            logger.info("compare: %s seed %d before: %s (%.1fs)", method, seed, _brief(before), before_s)
        # a run killed after logging a step but before checkpointing it resumes from the checkpoint: the steps
        # logged past it are trained again, so only those up to it count (the trainer drops the rest on resuming)
        done = sum(r.get(mn.PERF_GEN_TOKENS, 0) for r in read_metrics(run_dir)
                   if r.get("step", 0) <= trainer.start_step) if trainer.start_step else 0
        last_step = trainer.start_step

        def stop_when(step: int, metrics: dict) -> bool:
            nonlocal done
            done += int(metrics[mn.PERF_GEN_TOKENS])
            if step == 1 and done >= budget:
                raise CompareError(f"compare.budget_tokens={budget} is reached by the first step of method "
                                   f"{method!r} (seed {seed}: {done} tokens); give a budget of several of its steps")
            logger.info("compare: %s seed %d step %d: %d/%d tokens, team reward %.3f (%.1fs)", method, seed, step,
                        done, budget, metrics.get(mn.TEAM_REWARD, float("nan")), metrics.get(mn.TIME_STEP, 0.0))
            return done >= budget

        if done < budget and trainer.start_step < cfg.run.steps:
            trainer.train(stop_when=stop_when)
            last_step = None   # the metrics file now ends at the last step trained
        t = time.perf_counter()
        after = evaluate_episodes(trainer.run, samples=samples, temperature=temperature)
        after_s = time.perf_counter() - t
    finally:
        trainer.close()
        del trainer
        gc.collect()
    if [e["instance"] for e in after] != [e["instance"] for e in before]:
        raise CompareError(f"{method} seed {seed}: the held-out instances after training differ from those before; "
                           f"delete {plan.out / 'before'} and run again")
    rows = [r for r in read_metrics(run_dir)
            if mn.PERF_GEN_TOKENS in r and (last_step is None or r.get("step", 0) <= last_step)]
    tokens = [int(r[mn.PERF_GEN_TOKENS]) for r in rows]
    if sum(tokens[:-1]) >= budget:
        raise CompareError(f"{run_dir} trained past its budget ({len(tokens)} steps, {sum(tokens)} tokens, the budget "
                           f"{budget} reached before its last step): it was resumed outside accord compare; delete "
                           "it to run that method and seed again")
    if sum(tokens) < budget:
        logger.warning("compare: %s seed %d stopped at compare.max_steps=%d with %d of %d tokens: its budget is "
                       "smaller than the others'", method, seed, len(rows), sum(tokens), budget)
    result = {"method": method, "seed": seed, "steps": len(rows), "train_tokens": sum(tokens),
              "budget_tokens": budget, "budget_reached": sum(tokens) >= budget, "step_tokens": tokens,
              "step_team_reward": [r.get(mn.TEAM_REWARD) for r in rows],
              "flat_group_frac": _mean([r.get(mn.ADV_ZERO_STD_FRAC, 0.0) for r in rows]),
              "train_s": round(sum(r.get(mn.TIME_STEP, 0.0) for r in rows), 2),
              "eval_s": {"before": round(before_s, 2), "after": round(after_s, 2)}, "before_from": before_by,
              "eval": "greedy" if samples == 0 else "sampled", "eval_samples": samples,
              "eval_temperature": None if samples == 0 else temperature,
              "warm_start": cfg.policies[next(iter(cfg.policies))].model if plan.compare.warm_start else None,
              "run_dir": str(run_dir), "before": before, "after": after}
    _write_json(plan.result_path(method, seed), result)
    if not plan.compare.keep_checkpoints and (run_dir / "checkpoints").is_dir():
        shutil.rmtree(run_dir / "checkpoints")   # the result is stored; a finished run is never resumed
    logger.info("compare: %s seed %d: %d steps, %d tokens; after: %s", method, seed, len(rows), sum(tokens),
                _brief(after))
    return result


def _brief(episodes: list[dict]) -> str:
    text = f"team return {_mean([e['team'] for e in episodes]):.3f}"
    if all("success" in e for e in episodes):
        text = f"success {_mean([e['success'] for e in episodes]):.3f}, " + text
    return text


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


# --- statistics -------------------------------------------------------------------------------------------

METRICS = (("success", "success"), ("return", "team"))


def units(episodes: list[dict], seed: int, field: str) -> dict[str, float]:
    """Per held-out instance of a seed (the unit ``"seed/instance"``), the mean of ``field`` over its episodes
    (one when greedy, ``eval_samples`` when sampled)."""
    out: dict[str, list[float]] = {}
    for e in episodes:
        out.setdefault(f"{seed}/{e['instance']}", []).append(float(e[field]))
    return {u: sum(v) / len(v) for u, v in out.items()}


def _has(results: list[dict], field: str) -> bool:
    return all(field in e for r in results for e in r["before"] + r["after"])


def summarise(results: list[dict], methods: list[str]) -> dict[str, dict]:
    """Per method: before and after with 95 % intervals (success: Wilson; return: t), the paired change over
    the same units, and the per-seed values."""
    out = {}
    for method in methods:
        rs = sorted((r for r in results if r["method"] == method), key=lambda r: r["seed"])
        s: dict[str, Any] = {"seeds": [r["seed"] for r in rs], "steps": _mean([r["steps"] for r in rs]),
                             "train_tokens": _mean([r["train_tokens"] for r in rs]),
                             "train_s": _mean([r["train_s"] for r in rs]),
                             "flat_group_frac": _mean([r["flat_group_frac"] for r in rs]),
                             "budget_reached": all(r["budget_reached"] for r in rs), "per_seed": []}
        for name, field in METRICS:
            if not _has(rs, field):
                continue
            before, after = {}, {}
            for r in rs:
                before.update(units(r["before"], r["seed"], field))
                after.update(units(r["after"], r["seed"], field))
            keys = sorted(before)
            b, a = [before[k] for k in keys], [after[k] for k in keys]
            if name == "success":   # one 0/1 episode per unit (greedy): Wilson; a share of sampled ones: t
                binary = all(r["eval_samples"] <= 1 for r in rs)
                s[f"{name}_before"], s[f"{name}_after"] = rate(b, binary=binary), rate(a, binary=binary)
            else:
                s[f"{name}_before"], s[f"{name}_after"] = average(b), average(a)
            s[f"{name}_change"] = paired(a, b)
            s["units"] = len(keys)
        for r in rs:
            row = {"seed": r["seed"], "steps": r["steps"], "train_tokens": r["train_tokens"],
                   "budget_reached": r["budget_reached"]}
            for name, field in METRICS:
                if _has([r], field):
                    row[f"{name}_before"] = _mean([e[field] for e in r["before"]])
                    row[f"{name}_after"] = _mean([e[field] for e in r["after"]])
            s["per_seed"].append(row)
        out[method] = s
    return out


def verdicts(results: list[dict], methods: list[str]) -> list[dict]:
    """Per pair of methods and metric: the paired interval of the difference of their after-values over the
    same (seed, instance) units, the interval of the per-seed mean differences (between training runs), and
    the verdict: the method the first interval favours, or a tie when it holds 0."""
    out = []
    for name, field in METRICS:
        if not _has(results, field):
            continue
        after = {m: {} for m in methods}
        for r in results:
            if r["method"] in after:
                after[r["method"]].update(units(r["after"], r["seed"], field))
        for i, a in enumerate(methods):
            for b in methods[i + 1:]:
                if set(after[a]) != set(after[b]):
                    raise CompareError(f"methods {a!r} and {b!r} were evaluated on different seeds or held-out "
                                       "instances; compare runs of the same seeds")
                keys = sorted(after[a])
                diff = paired([after[a][k] for k in keys], [after[b][k] for k in keys])
                per_seed: dict[str, list[float]] = {}
                for k in keys:
                    per_seed.setdefault(k.split("/", 1)[0], []).append(after[a][k] - after[b][k])
                seeds = [_mean(v) for v in per_seed.values()]
                v = verdict(diff)
                out.append({"metric": name, "a": a, "b": b, "diff": diff,
                            "between_seeds": average(seeds) if len(seeds) > 1 else None,
                            "winner": a if v > 0 else b if v < 0 else None,
                            "verdict": f"{a} wins" if v > 0 else f"{b} wins" if v < 0 else "tie"})
    return out


def tally(pairs: list[dict], methods: list[str]) -> dict[str, dict[str, dict[str, int]]]:
    """Per metric and method: wins, ties and losses over its pairs."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for p in pairs:
        per = out.setdefault(p["metric"], {m: {"wins": 0, "ties": 0, "losses": 0} for m in methods})
        for m in (p["a"], p["b"]):
            per[m]["ties" if p["winner"] is None else "wins" if p["winner"] == m else "losses"] += 1
    return out


# --- output -----------------------------------------------------------------------------------------------

def _ci(s: dict | None, digits: int = 2, sign: bool = False) -> str:
    if s is None:
        return "-"
    f = f"+.{digits}f" if sign else f".{digits}f"
    return f"{s['mean']:{f}} [{s['low']:{f}}, {s['high']:{f}}]"


def markdown(data: dict) -> str:
    """The tables of a comparison: per method, per seed, and the verdicts."""
    summary, pairs, c = data["summary"], data["verdicts"], data["settings"]["compare"]
    metrics = [name for name, _ in METRICS if any(f"{name}_after" in s for s in summary.values())]
    lines = [f"# accord compare: {', '.join(summary)}", "",
             f"Seeds {data['seeds']}; budget {c['budget_tokens']} generated training tokens per method and seed; "
             + ("greedy held-out evaluation (one episode per instance); 95 % intervals (success: Wilson"
                if c["eval"] == "greedy" else f"sampled held-out evaluation ({c['eval_samples']} episodes per "
                "instance); 95 % intervals (success: t over the instances' success shares")
             + "; return: t; change and differences: paired t over the same seed x instance units).", ""]
    head = "| method | steps | tokens | train s | flat |"
    rule = "|---|---:|---:|---:|---:|"
    for name in metrics:
        head += f" {name} before | {name} after | {name} change |"
        rule += "---|---|---|"
    lines += [head, rule]
    for m, s in summary.items():
        row = (f"| {m}{'' if s['budget_reached'] else ' (short of the budget)'} | {s['steps']:.1f} | "
               f"{s['train_tokens']:.0f} | {s['train_s']:.0f} | {s['flat_group_frac']:.2f} |")
        for name in metrics:
            row += f" {_ci(s.get(name + '_before'))} | {_ci(s.get(name + '_after'))} | " \
                   f"{_ci(s.get(name + '_change'), sign=True)} |"
        lines.append(row)
    lines += ["", "Per seed (" + ", ".join(f"{n} before -> after" for n in metrics) + ", steps, tokens):", ""]
    for m, s in summary.items():
        cells = []
        for p in s["per_seed"]:
            vals = ", ".join(f"{p[n + '_before']:.2f} -> {p[n + '_after']:.2f}" for n in metrics if n + "_after" in p)
            cells.append(f"seed {p['seed']}: {vals}, {p['steps']} steps, {p['train_tokens']} tokens")
        lines.append(f"- {m}: " + "; ".join(cells))
    if pairs:
        lines += ["", "Verdicts: A - B of the after-values, paired over the same seeds and held-out instances; a "
                  "method wins when the interval excludes 0 in its favour. 'between seeds': the t interval of the "
                  "per-seed mean differences, which also holds the spread between training runs.", "",
                  "| metric | A | B | A - B | between seeds | verdict |", "|---|---|---|---|---|---|"]
        for p in pairs:
            lines.append(f"| {p['metric']} | {p['a']} | {p['b']} | {_ci(p['diff'], 3, True)} | "
                         f"{_ci(p['between_seeds'], 3, True)} | {p['verdict']} |")
        lines += ["", "| metric | method | wins | ties | losses |", "|---|---|---:|---:|---:|"]
        for metric, per in data["tally"].items():
            for m, t in per.items():
                lines.append(f"| {metric} | {m} | {t['wins']} | {t['ties']} | {t['losses']} |")
    return "\n".join(lines) + "\n"


def plot(data: dict, path: Path) -> None:
    """Per metric: before/after per method with intervals (top), and each pair's after-difference (bottom)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    summary, pairs = data["summary"], data["verdicts"]
    methods = list(summary)
    metrics = [name for name, _ in METRICS if any(f"{name}_after" in s for s in summary.values())]
    rows = 2 if pairs else 1
    fig = Figure(figsize=(max(6.0, 3.5 + 1.4 * len(methods)) * len(metrics) / 1.5, 4.2 * rows))
    FigureCanvasAgg(fig)
    for col, name in enumerate(metrics):
        ax = fig.add_subplot(rows, len(metrics), col + 1)
        xs = list(range(len(methods)))
        for offset, when, color in ((-0.17, "before", "#9aa5b1"), (0.17, "after", "#1f77b4")):
            stats = [summary[m][f"{name}_{when}"] for m in methods]
            means = [s["mean"] for s in stats]
            err = [[s["mean"] - s["low"] for s in stats], [s["high"] - s["mean"] for s in stats]]
            ax.bar([x + offset for x in xs], means, width=0.34, color=color, label=when, yerr=err, capsize=3)
        ax.set_xticks(xs, methods, rotation=20)
        ax.set_title(f"held-out {'success rate' if name == 'success' else 'team return'} (95 %)", fontsize=10)
        ax.axhline(0, color="black", linewidth=0.6)
        if name == "success":
            ax.set_ylim(0, 1.05)
        ax.legend(fontsize=8, loc="best")
        if not pairs:
            continue
        ax = fig.add_subplot(rows, len(metrics), len(metrics) + col + 1)
        mine = [p for p in pairs if p["metric"] == name]
        for y, p in enumerate(mine):
            d = p["diff"]
            color = "#2ca02c" if p["winner"] == p["a"] else "#d62728" if p["winner"] == p["b"] else "#7f7f7f"
            ax.errorbar([d["mean"]], [y], xerr=[[d["mean"] - d["low"]], [d["high"] - d["mean"]]], fmt="o",
                        color=color, capsize=3)
        ax.axvline(0, color="black", linewidth=0.6)
        ax.set_yticks(list(range(len(mine))), [f"{p['a']} - {p['b']}" for p in mine], fontsize=8)
        ax.invert_yaxis()
        ax.set_title("after: A - B, paired 95 % (green: A wins, red: B wins)", fontsize=9)
    fig.suptitle(f"seeds {data['seeds']}, budget {data['settings']['compare']['budget_tokens']} generated tokens",
                 fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    from accord.tracking.registry import _atomic_save

    _atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=110))


def report(settings: dict, seeds: list[int], results: list[dict], out: Path, *, total_s: float,
           merged_from: list[str] | None = None) -> dict:
    """Summarise ``results``, write ``out``/compare.json, compare.md and compare.png, and return the data."""
    methods = list(settings["methods"])
    summary = summarise(results, methods)
    pairs = verdicts(results, methods)
    runs = [{**r, "before": _numbers(r["before"]), "after": _numbers(r["after"])}
            for r in sorted(results, key=lambda r: (r["seed"], methods.index(r["method"])))]
    data = {"format": FORMAT, "settings": settings, "seeds": list(seeds), "methods": methods, "summary": summary,
            "verdicts": pairs, "tally": tally(pairs, methods), "total_s": round(total_s, 1),
            "files": {"json": str(out / "compare.json"), "markdown": str(out / "compare.md"),
                      "plot": str(out / "compare.png")},
            **({"merged_from": merged_from} if merged_from else {}), "runs": runs}
    out.mkdir(parents=True, exist_ok=True)
    plot(data, out / "compare.png")
    from accord.tracking.registry import _atomic_write_text

    _atomic_write_text(out / "compare.md", markdown(data))
    _write_json(out / "compare.json", data)
    return data


def _numbers(episodes: list[dict]) -> list[dict]:
    """Episodes without their completions (those stay in results/<method>/seed_<s>.json)."""
    return [{k: v for k, v in e.items() if k != "completions"} for e in episodes]


# --- merge ------------------------------------------------------------------------------------------------

def merge(paths: list[str | Path], out: str | Path, *, overwrite: bool = False) -> dict:
    """One comparison from the compare.json files (or output directories) of comparisons of one setting run
    apart (for example one per seed); differing settings or a seed in two files are a :class:`CompareError`.
    ``out`` must be new or empty (``overwrite``: an earlier merge or comparison there is deleted first), and
    never one of the merged comparisons' directories."""
    out = Path(out)
    inputs = {(p if p.is_dir() else p.parent).resolve() for p in map(Path, paths)}
    if out.exists() and not out.is_dir():
        raise CompareError(f"--out {out} is a file; give a directory for the merged comparison")
    target = out.resolve()
    if any(target == i or target in i.parents for i in inputs):
        raise CompareError(f"--out {out} holds one of the comparisons being merged; give a new directory")
    # what a merge stopped half-way (a full disk) leaves: written again without --overwrite
    leftovers = {"compare.md", "compare.png"}
    if out.is_dir() and any(p.name not in leftovers for p in out.iterdir()):
        if not ((out / "compare.json").is_file() or (out / "settings.json").is_file()):
            raise CompareError(f"--out {out} is not empty and holds no comparison (no compare.json or settings.json), "
                               "so --overwrite would delete files that are not accord's; give a new directory")
        if not overwrite:
            raise CompareError(f"--out {out} holds an earlier comparison; give a new directory, or --overwrite to "
                               "delete it")
    results, seeds, total = [], [], 0.0
    first: tuple[Path, dict] | None = None
    for p in map(Path, paths):
        path = p / "compare.json" if p.is_dir() else p
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            settings, runs, their, spent = data["settings"], data["runs"], data["seeds"], data.get("total_s", 0.0)
            if data.get("format") != FORMAT:
                raise KeyError("format")
            if not (isinstance(settings, dict) and isinstance(runs, list) and isinstance(their, list)
                    and all(isinstance(r, dict) and isinstance(r.get("method"), str) for r in runs)
                    and all(isinstance(s, int) and not isinstance(s, bool) for s in their)
                    and isinstance(spent, (int, float)) and not isinstance(spent, bool)):
                raise TypeError("settings, runs, seeds or total_s of the wrong type")
            if sorted({r.get("seed") for r in runs}, key=repr) != sorted(set(their), key=repr):
                raise ValueError(f"its runs are of seeds {sorted({r.get('seed') for r in runs}, key=repr)}, its "
                                 f"seeds field says {their}")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise CompareError(f"--merge {path}: not a compare.json of accord compare ({type(err).__name__}: {err}); "
                               "give the compare.json files (or the output directories) of comparisons") from err
        if first is None:
            first = (path, settings)
        diff = first_difference(first[1], settings, MERGE_FREE)
        if diff is not None:
            key, was, now = diff
            raise CompareError(f"--merge {path}: {key}={now!r}, but {first[0]} has {was!r}; merge only comparisons "
                               "of one setting (they may differ in their seeds)")
        again = sorted(set(their) & set(seeds))
        if again:
            raise CompareError(f"--merge {path}: seed(s) {again} are already in an earlier file; give each seed once")
        seeds += their
        results += runs
        total += spent
    if first is None:
        raise CompareError("--merge needs the compare.json files of the comparisons to merge")
    if out.is_dir() and any(p.name not in leftovers for p in out.iterdir()):   # every input read and checked: only
        # now the earlier merge goes
        logger.warning("--overwrite: deleting the earlier comparison in %s before writing the merged one", out)
        shutil.rmtree(out)
    return report(first[1], seeds, results, out, total_s=total, merged_from=[str(p) for p in paths])


# --- command line -----------------------------------------------------------------------------------------

def compare_main(args: list[str], *, out: str | None = None, overwrite: bool = False) -> dict:
    """``accord compare CONFIG... [key=value ...]``: the config files (one with compare.methods, or one per
    method) and overrides for all of them."""
    paths = [a for a in args if is_config_file(a)]
    overrides = [a for a in args if a not in paths]
    sources = [(Path(p).stem, read_yaml(Path(p))) for p in paths]
    plan = load_plan(sources, overrides, out=out)
    return run_compare(plan, overwrite=overwrite)


__all__ = ["CompareError", "METHOD_KEYS", "Plan", "check_comparable", "check_knobs", "compare_main", "load_plan",
           "merge", "preflight", "run_compare", "run_one", "summarise", "verdicts"]
