"""Command line: ``accord train | sft | compare | plan | eval | report | audit | export | envs``.

    accord train                         # the embedded default: writing task, SmolLM2-135M, two agents
    accord train examples/tiny.yaml rollout.batch_size=8 run.steps=20
    accord train --resume runs/writing-pydoc [run.steps=30]
    accord sft examples/sft_planpath.yaml                # warm start: writes runs/sft-planpath/sft/main
    accord train --overwrite examples/tiny.yaml   # start runs/tiny over (deletes the earlier run there)
    accord eval runs/writing-pydoc --samples 8           # base vs latest checkpoint, greedy + sampled
    accord compare examples/compare/relay.yaml          # methods at an equal token budget, seeds, verdicts
    accord compare --merge s0/compare.json s1/compare.json --out merged   # seeds run apart, one comparison
    accord eval examples/magrpo_writing.yaml --pipeline discussion   # untrained agents, one round of discussion
    accord eval --crossplay runs/seed0 runs/seed1        # each role with base / own / other seed's partners
    accord report runs/writing-pydoc
    accord audit runs/writing-pydoc                      # rollout integrity: exit 1 on a violation
    accord export runs/writing-pydoc [--step 10] [--out DIR]   # Hugging Face model dirs (or PEFT adapters)
    accord envs
"""

from __future__ import annotations

import argparse
import errno
import inspect
import json
import os
import logging
import math
import re
import sys
from pathlib import Path

from accord.config import ConfigError, describe, is_config_file, layout_change, load_config
from accord.data import not_a_file
from accord.tracking.console import configure_logging, printable

logger = logging.getLogger("accord")

# Errors that are bad input or a broken environment, not bugs: one line and exit code 2 (--debug: the
# traceback). Looked up lazily so that a config error is reported before torch is imported.
_USER_ERRORS = {
    "accord.config": ("ConfigError",),
    "accord.checkpoint": ("CheckpointError",),
    "accord.envs.registry": ("TaskError",),
    "accord.envs.external.base": ("ReplayError", "TextObservationError"),
    "accord.envs.check": ("EnvCheckError",),
    "accord.config.rules": ("TreeTooLargeError",),
    "accord.models.common": ("ModelNotFoundError",),
    "accord.policies": ("PromptTooLongError",),
    "accord.tracking.jsonl": ("MetricsFileError",),
    "accord.audit": ("AuditError",),
    "accord.policies.protocol": ("TrainingError",),
    "accord.data": ("DataFileError",),
    "accord.envs.single_turn": ("RewardError",),
    "accord.algorithms.advantages": ("ExtensionError",),
    "accord.envs.protocol": ("EnvOutputError",),
    "accord.generation.hf": ("GenerationError",),
}
_OVERRIDE = re.compile(r"^[A-Za-z_][\w.\-]*=")


MAX_PLAN_GPUS = 1024   # accord plan --gpus: each planned GPU is a row of the plan


def _stopped_by(stopped: KeyboardInterrupt) -> str:
    """The signal that stopped a command: accord's stops name theirs (Ctrl-C or SIGTERM); a plain
    KeyboardInterrupt is a Ctrl-C."""
    return getattr(stopped, "signal_name", "Ctrl-C")


def _user_errors() -> tuple[type, ...]:
    """The user-facing error classes of the modules imported so far (an unimported module raised nothing)."""
    found = [getattr(sys.modules[m], name) for m, names in _USER_ERRORS.items() if m in sys.modules for name in names]
    return (OSError, *found)


def _out(text: str) -> None:
    """Write a command's result on stdout, terminal controls (a model's text in a table) shown as escapes."""
    sys.stdout.write(printable(text))


def _one_line(err: BaseException) -> str:
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        if err.filename:
            return f"disk full writing {err.filename} ({err.strerror}); free space on its disk and run the command again"
        return f"disk full ({err.strerror}); free space on the disk of the command's output and run the command again"
    if isinstance(err, OSError) and err.errno == errno.EROFS and err.filename:
        return (f"{err.filename}: {err.strerror}; write elsewhere (`--out DIR` of accord eval, report and export) or "
                "on a writable copy of the run")
    if isinstance(err, OSError) and err.strerror and err.filename:
        return f"{err.filename}: {err.strerror}; check the path and its permissions"
    return " ".join(str(err).split("\n")) or type(err).__name__


def _version() -> str:
    """accord's version and those of the packages a bug report needs, read without importing them."""
    from importlib.metadata import PackageNotFoundError, version

    from accord import __version__

    def installed(name: str) -> str:
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            return f"{name} not installed"

    return (f"accord {__version__} ({installed('torch')}, {installed('transformers')}, "
            f"Python {sys.version.split()[0]})")


def _split_overrides(argv: list[str], valued: frozenset[str] = frozenset()) -> tuple[list[str], list[str]]:
    """``train``/``eval``/``compare``/``sft``/``plan``/``envs``: take ``key=value`` overrides out of argv wherever
    they stand (after ``--k 1 4`` or ``--write-demos FILE`` too), except the value of an option of ``valued`` (the
    options that take one value: ``--out eval=v2`` names a folder) and an existing ``.yaml`` file."""
    cmd = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if cmd is None or argv[cmd] not in ("train", "eval", "compare", "sft", "plan", "envs"):
        return argv, []
    head, overrides = [], []
    for i, a in enumerate(argv[cmd + 1:], start=cmd + 1):
        (overrides if _OVERRIDE.match(a) and argv[i - 1] not in valued and not is_config_file(a) else head).append(a)
    return argv[:cmd + 1] + head, overrides


def _say_resume_changes(recorded, cfg) -> None:
    """A warning for each setting a resume's overrides change (``run.steps`` aside, the usual one): the steps
    trained so far ran with the recorded values, and config.yaml will record the new ones."""
    from accord.config.base import flat_keys

    before, after = flat_keys(recorded.to_dict()), flat_keys(cfg.to_dict())
    for key in sorted(set(before) | set(after)):
        if key != "run.steps" and before.get(key, "<unset>") != after.get(key, "<unset>"):
            logger.warning("--resume changes %s from %r to %r for the steps from here on (the steps trained so far "
                           "used the first; config.yaml will record the second)", key, before.get(key, "<unset>"),
                           after.get(key, "<unset>"))


def _train(args: argparse.Namespace) -> int:
    if os.environ.get("RANK", "0") != "0":  # torchrun processes 1..N-1 serve process 0's data-parallel policies
        from accord.distributed.data_parallel import serve_worker

        return serve_worker()
    if args.resume and args.overwrite:
        raise ConfigError("--resume continues a run and --overwrite deletes it; pass only one of them")
    if args.allow_unverified and not args.resume:
        raise ConfigError("--allow-unverified lets --resume load a checkpoint without a manifest; a new run loads "
                          "none: drop it, or pass --resume RUN_DIR")
    positional = list(args.args)
    config_path = None
    if positional and is_config_file(positional[0]):
        config_path = positional.pop(0)
    if args.resume:
        run_dir = Path(args.resume)
        if config_path is not None:
            raise ConfigError("--resume takes its config from RUN_DIR/config.yaml; pass only key=value overrides")
        saved = run_dir / "config.yaml"
        if not saved.is_file():
            what = "no config.yaml" if not os.path.lexists(saved) else f"a config.yaml that {not_a_file(saved)}"
            raise ConfigError(f"{run_dir} has {what}; --resume needs the directory of an earlier run")
        if not saved.read_bytes().strip():
            raise ConfigError(f"{saved} is empty, so the run's settings are lost; restore it (each checkpoint's "
                              "state.pt holds the config its steps ran with, under 'config'), then resume")
        moved = [o for o in positional if o.split("=", 1)[0].strip() in ("run.run_dir", "run.output_dir", "run.name")]
        if moved:
            raise ConfigError(f"{moved[0]}: a resumed run stays in its directory ({run_dir}) and keeps its name; drop "
                              "it (to train a copy elsewhere, copy the directory and resume the copy)")
        cfg = load_config(run_dir / "config.yaml", positional + [f"run.run_dir={json.dumps(str(run_dir))}"])
        from accord.checkpoint import warm_start_problem   # after the config: its errors come before torch

        problem = warm_start_problem(run_dir)
        if problem is not None:   # before the resume's changes are reported: there is nothing to resume
            raise ConfigError(problem)
        if positional:
            changed = layout_change(run_dir, cfg)   # before the warnings that other changes apply from here on
            if changed is not None:
                raise ConfigError(changed)
            _say_resume_changes(load_config(run_dir / "config.yaml", [f"run.run_dir={json.dumps(str(run_dir))}"]), cfg)
    else:
        cfg = load_config(config_path, positional)
        try:
            same = config_path is not None and Path(config_path).resolve() == (cfg.run_dir / "config.yaml").resolve()
        except (RuntimeError, OSError) as err:   # a symbolic link that leads to itself
            raise ConfigError(f"run directory {cfg.run_dir} cannot be resolved ({err}); point run.run_dir (or "
                              "run.output_dir) at a directory") from err
        if same:
            raise ConfigError(f"{config_path} is where the run writes its resolved config (run directory {cfg.run_dir}), "
                              "so a new run would replace it; move the file elsewhere or set another run.run_dir (to "
                              f"continue the run that wrote it: accord train --resume {cfg.run_dir})")
    # after the config (its errors come before torch), and outside the try: a Ctrl-C while torch loads leaves the
    # names unbound, and reaches main's handler instead
    from accord.stopping import EXIT_CODES, TrainingInterrupted
    from accord.trainer import train

    try:
        run_dir = train(cfg, resume=bool(args.resume), overwrite=args.overwrite,
                        allow_unverified=args.allow_unverified)
    except TrainingInterrupted as stopped:  # the first Ctrl-C or SIGTERM: the step finished and checkpointed
        if args.debug:
            raise
        logger.warning("%s", stopped)
        return EXIT_CODES[stopped.signal_name]
    except KeyboardInterrupt as stopped:  # a second Ctrl-C or SIGTERM, or a Ctrl-C before training started
        if args.debug:
            raise
        name = _stopped_by(stopped)
        logger.warning("stopped at once by %s; %s", name, _after_interrupt(cfg.run_dir))
        return EXIT_CODES[name]
    except OSError as err:  # a full disk outside the training loop (the resolved config, the lock file)
        from accord.checkpoint import disk_full_error

        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise disk_full_error(cfg.run_dir, "setting up the run", err) from err
    logger.info("run directory: %s (plots: accord report %s)", run_dir, run_dir)
    if "tensorboard" in cfg.logging.report_to and (run_dir / "tb").is_dir():
        logger.info("curves as they are logged: tensorboard --logdir %s", run_dir / "tb")
    _log_held_out(run_dir, cfg.rollout.eval_temperature)
    return 0


def _after_interrupt(run_dir: Path) -> str:
    """How to go on after a run was stopped without a checkpoint of its last step."""
    from accord.checkpoint import checkpoints, completed_step

    if not (run_dir / "config.yaml").is_file():   # never written, or deleted first by an --overwrite stopped midway
        return "the run's config.yaml is not there, so it cannot be resumed; run the same command again to start over"
    if checkpoints(run_dir):
        return f"the steps after its last checkpoint are lost; continue with `accord train --resume {run_dir}`"
    if completed_step(run_dir):
        return f"it has no checkpoint yet: `accord train --resume {run_dir}` starts it over from step 0"
    return "nothing was saved; run the same command again to start over"


def _sft(args: argparse.Namespace) -> int:
    from accord.data import demo_file_problem

    positional = list(args.args)
    config_path = positional.pop(0) if positional and is_config_file(positional[0]) else None
    cfg = load_config(config_path, positional)
    for path in (cfg.sft.data, cfg.sft.eval_data):   # before torch is imported (seconds)
        problem = None if path is None else demo_file_problem(path)
        if problem:
            raise ConfigError(problem)
    from accord.sft import collect_demos, run_sft, write_demos
    if args.write_demos:
        train, _ = collect_demos(cfg)
        write_demos(train, args.write_demos)
        logger.info("wrote %d demonstrations to %s", len(train), args.write_demos)
        return 0
    from accord.stopping import EXIT_CODES, TrainingInterrupted

    try:
        run_sft(cfg)
    except TrainingInterrupted as stopped:   # the first Ctrl-C or SIGTERM: the step finished and checkpointed
        logger.warning("%s", stopped)
        return EXIT_CODES[stopped.signal_name]
    except KeyboardInterrupt as stopped:   # a second Ctrl-C or SIGTERM, or a Ctrl-C before training started
        if getattr(args, "debug", False):
            raise
        name = _stopped_by(stopped)
        logger.warning("stopped at once by %s; run the same command again: it goes on from the newest checkpoint "
                       "of the unfinished warm start (sft.checkpoint_every), or starts over where it has none", name)
        return EXIT_CODES[name]
    return 0


def _log_held_out(run_dir: Path, temperature: float) -> None:
    """End the console with what the run learned: held-out results before -> after, then the training
    reward of the first third of the steps -> the last third."""
    from accord.tracking import read_metrics
    from accord.tracking.console import held_out_summary, training_summary

    if (run_dir / "metrics.jsonl").is_file():
        rows = read_metrics(run_dir)
        for line in held_out_summary(rows, temperature=temperature) + training_summary(rows):
            logger.info("%s", line)


def _eval(args: argparse.Namespace) -> int:
    if args.crossplay is not None:
        from accord.crossplay import run_crossplay

        ignored = [flag for flag, given in (("--k", args.k != [1]), ("--no-base", args.no_base),
                                            ("--pipeline", args.pipeline != "parallel")) if given]
        if ignored:
            raise ConfigError(f"{' and '.join(ignored)} do(es) not apply to --crossplay (it plays each role with base, "
                              "own and other runs' partners); drop them")

        runs = ([args.target] if args.target else []) + list(args.crossplay)
        out = run_crossplay(runs, args.overrides, samples=args.samples, temperature=args.temperature, out=args.out,
                            allow_unverified=args.allow_unverified)
        _out((out / "crossplay.md").read_text())
        _out(f"\n{out / 'crossplay.json'}\n")
        return 0
    if args.target is None:
        raise ConfigError("accord eval needs a CONFIG.yaml or RUN_DIR (or --crossplay RUN_DIR [RUN_DIR ...])")
    from accord.evaluate import run_eval

    out = run_eval(args.target, args.overrides, samples=args.samples, ks=args.k, temperature=args.temperature,
                   compare_base=not args.no_base, out=args.out, pipeline=args.pipeline,
                   allow_unverified=args.allow_unverified)
    _out((out / "eval.md").read_text())
    _out(f"\n{out / 'eval.json'}\n")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from accord.compare import CompareError, compare_main, merge

    if args.merge:
        if args.args:
            raise CompareError(f"--merge combines finished comparisons; drop {args.args[0]!r} (configs and overrides "
                               "are for running one)")
        if not args.out:
            raise CompareError("--merge needs --out DIR: where the merged compare.json, compare.md and compare.png go")
        data = merge(args.merge, args.out, overwrite=args.overwrite)
    else:
        try:
            data = compare_main(args.args, out=args.out, overwrite=args.overwrite)
        except KeyboardInterrupt as stopped:   # TrainingInterrupted and StoppedAtOnce name their signal
            if getattr(args, "debug", False):
                raise
            from accord.stopping import EXIT_CODES

            name = _stopped_by(stopped)
            logger.warning("stopped by %s; run the same command again to go on: finished methods and seeds are "
                           "kept, and an unfinished run resumes from its last checkpoint (run.checkpoint_every)", name)
            return EXIT_CODES[name]
    _out(Path(data["files"]["markdown"]).read_text())
    _out(f"\n{data['files']['json']}\n{data['files']['plot']}\n")
    return 0


def _report(args: argparse.Namespace) -> int:
    from accord.report import write_report

    path = write_report(args.run_dir, out_dir=args.out)
    _out(f"{path}\n")
    return 0


def _audit(args: argparse.Namespace) -> int:
    from accord.audit import audit_run, format_run_audit

    result = audit_run(args.run_dir)
    _out(format_run_audit(Path(args.run_dir), result))
    return 1 if result.violations else 0


def _export(args: argparse.Namespace) -> int:
    from accord.export import export_run

    out = export_run(args.run_dir, step=args.step, out=args.out, allow_unverified=args.allow_unverified)
    _out(f"{out}\n")
    return 0


def _envs_options(overrides: list[str], checking: bool) -> dict:
    """The ``task.options.KEY=VALUE`` overrides of ``accord envs --check``: the options every checked environment
    is built with (as ``accord train`` builds its task)."""
    from accord.config import apply_override

    if overrides and not checking:
        raise ConfigError(f"{overrides[0]}: options apply to the environments of --check; add --check NAME")
    data: dict = {"task": {"options": {}}}
    for item in overrides:
        if not item.startswith("task.options."):
            raise ConfigError(f"{item}: accord envs --check takes the environments' options only, as "
                              "task.options.KEY=VALUE (e.g. task.options.render=my_module:render)")
        apply_override(data, item)
    return data["task"]["options"]


def _envs(args: argparse.Namespace) -> int:
    from accord.envs.registry import TaskError  # imported lazily, like every command's heavy modules

    from accord.envs import TASKS, make_env, make_task
    from accord.envs.registry import entry_point_names, import_modules, task_factory

    import_modules(args.imports, "--import")
    options = _envs_options(args.overrides, bool(args.check))
    if args.check:
        from accord.envs.check import check_env

        for name in args.check:
            task_factory(name)  # raises TaskError with the closest name, or why a module:attribute does not load
            # a single-turn task is checked as a one-turn environment; adapters of other libraries' games offer
            # example moves (legal ones, so that the checker gets past the first turn)
            examples = getattr(make_env(name, options), "example_actions", ())
            check_env(lambda: make_env(name, options), actions=examples)
            _out(f"{name}: conforms to the environment protocol\n")
        return 0
    failed = {}
    for name in entry_point_names():
        try:
            task_factory(name)
        except TaskError as err:
            failed[name] = str(err)
    # the whole table is made before any of it is printed: a task that does not build is a row saying why,
    # not an error halfway through the listing
    rows = [f"{'NAME':12s} {'KIND':34s} {'ROLES':20s} DESCRIPTION"]
    for name, (factory, description) in sorted(TASKS.items()):
        required = [p.name for p in inspect.signature(factory).parameters.values()
                    if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if required:
            kind, roles = f"(needs options {required})", "-"
        else:
            try:
                kind, roles = _kind_and_roles(make_task(name))
            except TaskError as err:
                kind, roles, description = "(does not build)", "-", str(err)
        rows.append(f"{name:12s} {kind:34s} {roles:20s} {description}")
    rows += [f"{name:12s} {'(does not load)':34s} {'-':20s} {err}" for name, err in sorted(failed.items())]
    rows.append("(kind and roles with the default options; a task's options can change them, e.g. single_agent)")
    rows.append("other libraries' environments: pettingzoo:<env_id>, textarena:<env_id>, gymnasium:<env_id> "
                "(pip install 'accord[envs]'; see docs/pettingzoo.md)")
    _out("\n".join(rows) + "\n")
    return 0


def _kind_and_roles(task) -> tuple[str, str]:
    """``single-turn`` or ``multi-turn, turn-based|simultaneous, N turns``, and the roles in order."""
    from accord.envs.protocol import is_env

    if is_env(task):
        lacks = [a for a in ("simultaneous", "max_turns") if not hasattr(task, a)]
        kind = (f"multi-turn (lacks {', '.join(lacks)}: see accord envs --check)" if lacks else
                f"multi-turn, {'simultaneous' if task.simultaneous else 'turn-based'}, {task.max_turns} turns")
    else:
        kind = "single-turn"
    return kind, ", ".join(map(str, task.agents))


def _plan(args: argparse.Namespace) -> int:
    from accord.plan import PLAN_DOES_NOT_FIT, format_plan, make_plan, present_devices

    from accord.plan import load_plan_config

    if args.gpu_memory_gb is not None and not (math.isfinite(args.gpu_memory_gb) and args.gpu_memory_gb > 0):
        raise ConfigError(f"--gpu-memory-gb {args.gpu_memory_gb}: give each GPU's memory in GiB, a number > 0 (80 for "
                          "an H100)")
    if args.gpus is not None and not 1 <= args.gpus <= MAX_PLAN_GPUS:
        raise ConfigError(f"--gpus {args.gpus}: give a number of GPUs from 1 to {MAX_PLAN_GPUS} (the plan lists each "
                          "one)")
    if args.gpus is not None and args.gpu_memory_gb is None:
        raise ConfigError("--gpus plans for GPUs of another machine and needs their memory: add --gpu-memory-gb "
                          "(80 for an H100)")
    if args.prompt_tokens is not None and args.prompt_tokens < 1:
        raise ConfigError(f"--prompt-tokens {args.prompt_tokens}: give a prompt length >= 1 token")
    positional = list(args.args)
    config_path = positional.pop(0) if positional and is_config_file(positional[0]) else None
    cfg = load_plan_config(config_path, positional)
    plan = make_plan(cfg, prompt_tokens=args.prompt_tokens, cuda=True if args.gpu_memory_gb is not None else None)
    text = format_plan(cfg, plan, present_devices(args.gpu_memory_gb, args.gpus))
    _out(text)
    return 1 if text.rstrip().endswith(PLAN_DOES_NOT_FIT) else 0   # a pre-flight check a script can test


def _config_help() -> str:
    return "\n".join(f"  {key} (default {default!r}): {text}" for key, default, text in describe())


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:   # before the command began (its parser, the logging) or after it ended
        if "--debug" in (sys.argv[1:] if argv is None else argv):
            raise
        sys.stderr.write("accord: stopped by Ctrl-C\n")
        return 130


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="accord", description="Multi-agent RL for cooperating LLM agents.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser.add_argument("--version", action="version", version=_version(), help="show the versions and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    unverified = ("load a checkpoint that has no manifest.json (its files cannot be checked: deleted, or written by "
                  "an older accord); without it such a checkpoint is skipped like a corrupted one")
    p = sub.add_parser("train", help="train agents", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="config keys:\n" + _config_help())
    p.add_argument("args", nargs="*", help="[CONFIG.yaml] [key.sub=value ...]")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its newest checkpoint that "
                   "verifies (a run killed before its first checkpoint starts over)")
    p.add_argument("--overwrite", action="store_true", help="delete an earlier run in the run directory and start "
                   "over (without it, training into a directory that holds a run with a completed step is an error)")
    p.add_argument("--allow-unverified", action="store_true", help="with --resume: " + unverified)
    p.set_defaults(func=_train)
    p = sub.add_parser("sft", help="warm start: fine-tune each policy on demonstrations (the task's oracle or "
                       "sft.data) and export it for RL", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="sft keys:\n" + "\n".join(line for line in _config_help().splitlines()
                                                         if line.startswith("  sft.")))
    p.add_argument("args", nargs="*", help="[CONFIG.yaml] [key.sub=value ...]")
    p.add_argument("--write-demos", metavar="FILE.jsonl", help="only write the training demonstrations as JSONL "
                   "(the input format of sft.data) and exit")
    p.set_defaults(func=_sft)
    p = sub.add_parser("compare", help="train several methods at an equal budget of generated tokens over several "
                       "seeds; held-out before/after with paired 95 %% intervals and a win/tie/loss verdict per pair",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  accord compare examples/compare/relay.yaml\n"
                       "  accord compare a.yaml b.yaml compare.seeds=[0,1] compare.budget_tokens=4000\n"
                       "  accord compare --merge s0/compare.json s1/compare.json --out merged\n"
                       "(docs/compare.md)\n\ncompare keys:\n" + "\n".join(
                           line for line in _config_help().splitlines() if line.startswith("  compare.")))
    p.add_argument("args", nargs="*", help="CONFIG.yaml with compare.methods, or one CONFIG.yaml per method; then "
                   "key.sub=value overrides for all of them")
    p.add_argument("--out", metavar="DIR", help="output directory (default compare.output_dir); with --merge: where "
                   "the merged comparison goes (required)")
    p.add_argument("--overwrite", action="store_true", help="delete an earlier comparison in the output directory "
                   "and start over (without it, other settings there are an error; the same settings resume)")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="run nothing: combine the compare.json files (or output "
                   "directories) of comparisons of one setting run apart, e.g. one per seed")
    p.set_defaults(func=_compare)
    p = sub.add_parser("plan", help="memory and devices a config needs, from the model configs only (no weights); "
                       "exit status 1 when the run does not fit the devices")
    p.add_argument("args", nargs="*", help="[CONFIG.yaml] [key.sub=value ...]")
    p.add_argument("--prompt-tokens", type=int, help="typical prompt length (default rollout.max_prompt_tokens)")
    p.add_argument("--gpu-memory-gb", type=float, help="plan for GPUs of this size instead of the ones present")
    p.add_argument("--gpus", type=int, help="with --gpu-memory-gb: how many such GPUs, 1 to 1024 (default 8)")
    p.set_defaults(func=_plan)
    p = sub.add_parser("eval", help="evaluate a config or a run (base vs latest checkpoint): greedy, sampled, pass@k")
    p.add_argument("target", nargs="?", help="CONFIG.yaml or RUN_DIR")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides (e.g. task.eval_size=50)")
    p.add_argument("--samples", type=int, default=4, help="sampled completions per instance (0: greedy only)")
    p.add_argument("--k", type=int, nargs="+", default=[1], help="pass@k values (each <= --samples)")
    p.add_argument("--temperature", type=float, help="sampling temperature (default: rollout.eval_temperature "
                   "if > 0, else rollout.temperature)")
    p.add_argument("--no-base", action="store_true", help="for a run directory, skip the base weights")
    p.add_argument("--out", help="output directory, not in RUN_DIR/checkpoints (default RUN_DIR/eval for a run, "
                   "run.output_dir/<run.name>-eval for a config; -PIPELINE appended with --pipeline)")
    p.add_argument("--pipeline", default="parallel", metavar="NAME", help="single-turn tasks: how the agents "
                   "collaborate without training: parallel (default: each answers alone), sequential (each sees the "
                   "earlier agents' answers), discussion (each revises once after seeing the others' answers)")
    p.add_argument("--allow-unverified", action="store_true", help=unverified)
    p.add_argument("--crossplay", nargs="+", metavar="RUN_DIR", help="cross-play of trained runs (other seeds of one "
                   "config): each role's policy with the base, its own and the other runs' partners, roles swapped, "
                   "and the co-adaptation gap with 95%% intervals; writes RUN_DIR/crossplay (see docs/crossplay.md)")
    p.set_defaults(func=_eval)
    p = sub.add_parser("report", help="plots and a markdown summary of a run")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="the folder to write the report into (default RUN_DIR/report); an "
                   "earlier report there is replaced and its stale plots deleted; a folder holding report.md or the "
                   "plots' names without an accord report is refused")
    p.set_defaults(func=_report)
    p = sub.add_parser("audit", help="check a run's recorded rollouts (training.audit): one prompt per group where the "
                       "method says so, the state stepped is the one in the prompt, each reward belongs to its sample; "
                       "exit 1 on a violation")
    p.add_argument("run_dir")
    p.set_defaults(func=_audit)
    p = sub.add_parser("export", help="write a checkpoint as one Hugging Face model directory per policy "
                       "(a PEFT adapter per policy, plus the base, under specialization=lora)")
    p.add_argument("run_dir")
    p.add_argument("--step", type=int, help="the checkpoint's step (default: the latest)")
    p.add_argument("--out", help="output directory, must not exist nor lie in RUN_DIR/checkpoints (default "
                   "RUN_DIR/export/step_NNNNNN)")
    p.add_argument("--allow-unverified", action="store_true", help=unverified)
    p.set_defaults(func=_export)
    p = sub.add_parser("envs", help="list the tasks and environments (or check environments' conformance)")
    p.add_argument("--check", nargs="+", metavar="NAME", help="run the conformance checker on these environments")
    p.add_argument("--import", dest="imports", nargs="+", default=[], metavar="MODULE",
                   help="import these modules first (their @register_task tasks are listed and checked)")
    p.set_defaults(func=_envs, overrides=[])   # task.options.KEY=VALUE: the options of the checked environments
    for p in sub.choices.values():   # also after the command: accord train --debug ...
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show the traceback of an error")
    valued = frozenset(s for p in sub.choices.values() for a in p._actions if a.nargs is None for s in a.option_strings)
    head, overrides = _split_overrides(list(sys.argv[1:] if argv is None else argv), valued)
    args = parser.parse_args(head)
    if overrides:
        (args.args if hasattr(args, "args") else args.overrides).extend(overrides)
    configure_logging(logging.DEBUG if args.verbose else logging.INFO)  # shares the progress bar's console
    try:
        return args.func(args)
    except _user_errors() as err:  # evaluated when an error arrives: the modules imported by then
        if args.debug:
            raise
        logger.error("%s", _one_line(err))
        return 2
    except KeyboardInterrupt:
        if args.debug:
            raise
        logger.warning("stopped by Ctrl-C")
        return 130


if __name__ == "__main__":
    sys.exit(main())
