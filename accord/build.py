"""From a config to a run's parts: environment, policies, rollout, generation, backend, data, sinks.

:func:`build_run` does everything a run needs before its first step, in this order: import the modules
under ``imports:`` and check ``logging.report_to`` against the sink registry, claim the run directory
(fail fast, before any model loads), seed, build the environment (:func:`build_env`), check
the config against it (:func:`check_run`, the one place for the rules that need the environment; the
rules of the config alone are checked when it is built; the tiers and where each rule lives:
:mod:`accord.config.rules`), split the data, build the rollout (which checks the environment's kind, see
:mod:`accord.rollout.base`), the policies (locally, as LoRA adapters of one base, or in Ray actors) and the
generator, then resume. The :class:`~accord.trainer.Trainer` runs the loop over these parts; ``accord eval`` evaluates them
(:mod:`accord.evaluate`).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from accord import envs  # noqa: F401  (registers the built-in tasks)
from accord.algorithms.advantages import ADVANTAGE_ESTIMATORS, check_advantage_config
from accord.algorithms.losses import LOSS_SPECS, POLICY_LOSSES, LossSpec, resolve_loss_agg
from accord.audit import AuditRecorder, prune_after
from accord.checkpoint import (check_still_new, checkpoint_step, checkpointed_steps, claim_run_dir,
                               discard_uncheckpointed, hold_run_dir, last_logged_step, prune_checkpoints,
                               resume_checkpoint, verified_checkpoint)
from accord.config import Config, ConfigError, layout_change, save_config
from accord.config.rules import EnvInfo, check_rollout
from accord.config.ignored import warn_ignored
from accord.devices import policy_devices
from accord.distributed.data_parallel import LocalGroups, wants_data_parallel
from accord.envs.registry import TaskBuilder, as_env, import_modules
from accord.envs.centralized import centralize
from accord.envs.protocol import task_instances
from accord.envs.single_turn import SingleTurnEnv, declared
from accord.policies.agents import AgentGenerator
from accord.generation.backends import GENERATION_BACKENDS
from accord.policies import Policy, PromptTooLongError
from accord.policies.lora import build_lora_policies
from accord.policies.model import build_policy
from accord.rollout.base import Rollout, make_rollout, rollout_name
from accord.rollout.sample import agent_sampling
from accord.seeding import setup_process
from accord.trainer_steps import build_parts, check_files

logger = logging.getLogger(__name__)


@dataclass
class Run:
    """A run's parts, as :func:`build_run` made them."""

    cfg: Config
    env: Any                              # the environment (protocol of accord.envs.protocol)
    make_env: Callable[[], Any]           # a fresh environment per episode (an EnvFactory)
    agents: tuple[str, ...]
    agent_policy: dict[str, str]
    rollout: Rollout
    policies: dict[str, Policy]           # name -> its policy (accord.policies.Policy: local, LoRA, ranks, Ray)
    generate: AgentGenerator
    train_rows: list[dict]
    eval_rows: list[dict]
    run_dir: Path
    start_step: int = 0
    backend: Any = None                   # Ray actors or data-parallel ranks (None: policies in this process)
    releases: list = dataclasses.field(default_factory=list)   # of the run directory's lock (hold_run_dir)
    resume_state: dict | None = None      # the trainer state of the checkpoint resumed from (None: a new run)
    parts: dict = field(default_factory=dict)   # critics, pair buffer, reward model (accord.trainer_steps)

    def close(self) -> None:
        """Release the backend (Ray actors and a local Ray cluster the run started, or data-parallel ranks; a
        no-op for policies in this process) and the run directory's lock."""
        try:
            if self.backend is not None:
                self.backend.close()
                self.backend = None
        finally:
            while self.releases:
                self.releases.pop()()


class RunComplete(Exception):
    """``--resume`` of a run whose newest checkpoint is already at ``run.steps``: there is nothing to train. The
    message says so and how to extend the run; :func:`accord.trainer.train` logs it and returns."""


def check_registered(cfg: Config) -> None:
    """``algorithm.advantage`` (and each agent's ``advantage``), ``algorithm.loss`` and
    ``rollout.generation_backend`` name registered functions and backends (after ``imports:``); the loss's
    aggregation agrees with ``algorithm.loss_agg``; what needs the sampler's log-probs has a backend that
    stores them."""
    for key, name, registry, register in (
            ("algorithm.advantage", cfg.algorithm.advantage, ADVANTAGE_ESTIMATORS,
             "accord.algorithms.register_advantage"),
            *((f"agents.{a.name}.advantage", a.advantage, ADVANTAGE_ESTIMATORS, "accord.algorithms.register_advantage")
              for a in cfg.agents if a.advantage is not None),
            ("algorithm.loss", cfg.algorithm.loss, POLICY_LOSSES, "accord.algorithms.register_loss"),
            ("rollout.generation_backend", cfg.rollout.generation_backend, GENERATION_BACKENDS,
             "accord.generation.backends.register_backend")):
        if name not in registry:
            close = difflib.get_close_matches(name, list(registry), n=1)
            hint = f" did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{key}={name!r} is not registered;{hint} registered: {sorted(registry)}. Register "
                              f"your own with {register} in a module listed under imports:")
    algo = cfg.algorithm
    try:
        resolve_loss_agg(algo.loss, algo.loss_agg)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    backend = cfg.rollout.generation_backend
    if not getattr(GENERATION_BACKENDS[backend], "sampling_logprobs", True):
        if LOSS_SPECS.get(algo.loss, LossSpec()).sampling_logprobs:
            raise ConfigError(f"algorithm.loss={algo.loss} reads the sampler's stored log-probs, but generation backend "
                              f"{backend!r} stores none; choose a loss that does not (e.g. grpo) or a backend that "
                              "stores them (hf, vllm)")
        if algo.tis in ("truncate", "mask"):
            raise ConfigError(f"algorithm.tis={algo.tis} weights tokens by pi_learner / pi_sampler, but generation "
                              f"backend {backend!r} stores no sampling log-probs; set algorithm.tis=off (or auto)")


def note_dapo_recipe(cfg: Config) -> None:
    """``loss: dapo`` is DAPO's loss; its paper's recipe also has a wider upper clip, dynamic sampling and overlong
    shaping, which are their own keys: name those left off, once."""
    algo = cfg.algorithm
    if algo.loss != "dapo":
        return
    off = []
    if algo.epsilon_high is None or algo.epsilon_high <= algo.epsilon:
        off.append("algorithm.epsilon_high (the paper: 0.28 with epsilon 0.2)")
    if not cfg.rollout.drop_flat_groups:
        off.append("rollout.drop_flat_groups=true")
    if not algo.overlong.window:
        off.append("algorithm.overlong.window (the paper: 4096 of 20480 tokens)")
    if off:
        logger.warning("algorithm.loss=dapo is DAPO's token-level loss; the rest of the paper's recipe is off here: "
                       "set %s for it", ", ".join(off))


def check_context(cfg: Config, policies: dict[str, Policy]) -> None:
    """:func:`prompt_room` of the built policies' model contexts."""
    prompt_room(cfg, {name: getattr(p, "context_len", None) for name, p in policies.items()})


def prompt_room(cfg: Config, contexts: dict[str, int | None]) -> dict[str, int]:
    """Every agent's length cap leaves room for a prompt in its policy's model context (``contexts``: each
    policy's, None where unknown); a ``rollout.max_prompt_tokens`` that a context cannot hold beside an agent's
    cap is warned of, once per policy. Returns the longest prompt each policy with a known context can take
    beside its agents' caps."""
    sampling = agent_sampling(cfg)
    room: dict[str, int] = {}
    for a in cfg.agents:
        context = contexts.get(a.policy)
        cap = sampling[a.name].max_new_tokens
        key = (f"agents.{a.name}.sampling.max_new_tokens" if a.sampling.max_new_tokens is not None
               else "rollout.max_new_tokens")
        if context and cap >= context:
            raise ConfigError(f"{key}={cap} leaves no room for a prompt in the context of {context} tokens of "
                              f"the model of policy {a.policy!r}; give a cap below {context} minus the prompt length")
        if context:
            room[a.policy] = min(room.get(a.policy, context), context - cap)
    for name, fits in room.items():
        if fits < cfg.rollout.max_prompt_tokens:
            logger.warning("rollout.max_prompt_tokens=%d does not fit the %d-token context of the model of policy %r "
                           "beside its agents' length caps: its prompts can have at most %d tokens (a longer one is "
                           "refused as too long); set rollout.max_prompt_tokens to %d or less",
                           cfg.rollout.max_prompt_tokens, contexts[name], name, fits, fits)
    return room


def fitting_rows(cfg: Config, env, policies: dict[str, Policy], rows: list[dict], split: str) -> list[dict]:
    """The instances of a single-turn task whose prompt fits each agent's policy (``rollout.max_prompt_tokens``,
    the model's context); the others are left out with a warning naming their number and one of them, as verl's
    ``filter_overlong_prompts`` does, where a row too long stopped the run when it was drawn. Encoding the prompts
    fills the policies' prompt caches (about 0.6 s for the default job's 774 prompts on a 2-core Xeon)."""
    if not isinstance(env, SingleTurnEnv) or not rows:
        return rows
    sampling = agent_sampling(cfg)
    kept, first = [], None
    for row in rows:
        fits = True
        for a in cfg.agents:
            try:
                policies[a.policy].encode_chat(env.prompt(a.name, row), sampling[a.name].max_new_tokens)
            except PromptTooLongError as err:
                fits = False
                first = first or (row.get("id"), a.name, err)
        if fits:
            kept.append(row)
    if first is not None:
        rid, agent, err = first
        logger.warning("task %r: %d of its %d %s instances have a prompt too long for their policy and are left "
                       "out (e.g. row %r, agent %r: %s)", cfg.task.name, len(rows) - len(kept), len(rows), split, rid,
                       agent, err)
    return kept


def keep_fitting_rows(cfg: Config, run: Run) -> None:
    """``run``'s training and eval instances without those whose prompt is too long (:func:`fitting_rows`); an
    error where too few training instances are left for a batch."""
    run.train_rows = fitting_rows(cfg, run.env, run.policies, run.train_rows, "training")
    run.eval_rows = fitting_rows(cfg, run.env, run.policies, run.eval_rows, "eval")
    if len(run.train_rows) < cfg.rollout.batch_size:
        raise ConfigError(f"task {cfg.task.name!r}: {len(run.train_rows)} training instances have a prompt that fits "
                          f"rollout.max_prompt_tokens={cfg.rollout.max_prompt_tokens} and the model's context, fewer "
                          f"than rollout.batch_size={cfg.rollout.batch_size}; raise rollout.max_prompt_tokens")


class EnvFactory:
    """The environment a config names, resolved once per run: the modules under ``imports:`` imported (their
    tasks and estimators registered), the registries checked, the task's factory looked up and its options
    checked. Each call builds a fresh environment (one per episode) with the baseline variant applied:
    ``single_agent`` is the task's option of that name, ``centralized`` a wrapper
    (:func:`accord.envs.centralized.centralize`)."""

    def __init__(self, cfg: Config) -> None:
        import_modules(cfg.imports)
        check_registered(cfg)
        algo, options = cfg.algorithm, dict(cfg.task.options)
        if algo.baseline == "single_agent":
            options["single_agent"] = True
        self.task = TaskBuilder(cfg.task.name, options)
        self.centralized = algo.baseline == "centralized"
        self.parse_penalty = algo.parse_penalty

    def __call__(self):
        env = as_env(self.task())
        return centralize(env, parse_penalty=self.parse_penalty) if self.centralized else env


def build_env(cfg: Config):
    """One environment of ``cfg`` (:class:`EnvFactory`; a run resolves the factory once and calls it per
    episode)."""
    return EnvFactory(cfg)()


def build_task(cfg: Config):
    """:func:`build_env` in the form the task was written in: a single-turn task's own object (``rows`` /
    ``prompt`` / ``reward``), or the multi-turn environment (for ``accord sft`` and ``accord plan``,
    which treat the two forms differently)."""
    from accord.envs.single_turn import SingleTurnEnv

    env = build_env(cfg)
    return env.task if isinstance(env, SingleTurnEnv) else env


def env_info(env) -> EnvInfo:
    """What the config's rollout rules read of ``env`` (:class:`accord.config.rules.EnvInfo`)."""
    return EnvInfo(name=str(getattr(env, "name", type(env).__name__)), agents=tuple(env.agents),
                   single_turn=isinstance(env, SingleTurnEnv), max_turns=int(getattr(env, "max_turns", 0) or 0),
                   simultaneous=bool(getattr(env, "simultaneous", False)), min_new_tokens=task_floors(env),
                   joint_mode=task_joint_mode(env), top_p=task_top_p(env))


def task_top_p(env) -> float | None:
    """The nucleus an environment (or its single-turn task) declares as ``top_p`` for ``rollout.top_p: null``
    (a number in (0, 1]); None where it declares none."""
    top_p = declared(env, "top_p")
    if top_p is None:
        return None
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ConfigError(f"task {getattr(env, 'name', type(env).__name__)!r} declares top_p={top_p!r}; a task may "
                          "declare a nucleus in (0, 1] (or nothing)")
    return float(top_p)


def task_joint_mode(env) -> str | None:
    """The joint mode an environment (or its single-turn task) declares as ``joint_mode`` for
    ``algorithm.joint_mode: null`` ('aligned' or 'cross'); None where it declares none."""
    mode = declared(env, "joint_mode")
    if mode not in (None, "aligned", "cross"):
        raise ConfigError(f"task {getattr(env, 'name', type(env).__name__)!r} declares joint_mode={mode!r}; a task "
                          "may declare 'aligned' or 'cross' (or nothing)")
    return mode


def task_floors(env) -> tuple[tuple[str, int], ...]:
    """The completion floors an environment (or its single-turn task) declares as ``min_new_tokens``: one
    number for every agent or ``{agent: tokens}`` (the fewest tokens a scoring answer can have), as
    (agent, tokens) pairs; () where it declares none."""
    floors = declared(env, "min_new_tokens")
    if not floors:
        return ()
    if isinstance(floors, int):
        floors = {a: floors for a in env.agents}
    return tuple((str(a), int(n)) for a, n in floors.items() if a in env.agents and int(n) > 0)


def check_run(cfg: Config, env) -> dict[str, int]:
    """Every rule of a run that needs the environment but no model, in one place (``accord train``, ``accord
    eval``, ``accord plan``, ``accord compare``'s preflight and the Python API come through here): the
    registered names, the rollout tier (:func:`accord.config.rules.check_rollout`: the agents against the
    environment's, sizes, the rollout's rules), the advantage settings, marlhf's files; then a warning for
    each setting the run does not read (:mod:`accord.config.ignored`). Returns the number of agents per policy.
    The tiers and where each rule lives: :mod:`accord.config.rules`."""
    check_registered(cfg)   # (build_env checked it too; check_run holds every rule a run is checked with)
    check_rollout(cfg, env_info(env))
    for name in {cfg.algorithm.advantage, *(a.advantage for a in cfg.agents if a.advantage)}:
        check_advantage_config(name, cfg.algorithm.normalize_std)
    note_dapo_recipe(cfg)
    check_files(cfg)   # marlhf's preferences and reward model
    warn_ignored(cfg, single_turn=isinstance(env, SingleTurnEnv))
    per_policy: dict[str, int] = defaultdict(int)
    for a in cfg.agents:
        per_policy[a.policy] += 1
    return dict(per_policy)


def split_data(cfg: Config, env) -> tuple[list[dict], list[dict]]:
    """Train and eval instances; errors for an empty training set or instances in both splits."""
    train_rows = task_instances(env, "train", limit=cfg.task.train_size, seed=cfg.run.seed)
    eval_rows = task_instances(env, "eval", limit=cfg.task.eval_size, seed=cfg.run.seed) if cfg.task.eval_size else []
    if not train_rows:
        raise ConfigError(f"task {cfg.task.name!r} has no training instances; check task.options and task.train_size")
    for key, asked, rows in (("train_size", cfg.task.train_size, train_rows), ("eval_size", cfg.task.eval_size,
                                                                              eval_rows)):
        if asked and len(rows) < asked:
            logger.warning("task.%s=%d: task %r holds %d such instances; using those %d", key, asked, cfg.task.name,
                           len(rows), len(rows))
    if cfg.rollout.batch_size > len(train_rows):
        raise ConfigError(f"rollout.batch_size={cfg.rollout.batch_size} is more than the {len(train_rows)} training "
                          f"instances of task {cfg.task.name!r}, so each step would repeat some of them; lower "
                          "rollout.batch_size (algorithm.num_generations samples each instance several times) or "
                          "raise task.train_size")
    for split, rows in (("train", train_rows), ("eval", eval_rows)):
        bad = next((row for row in rows if not isinstance(row, dict)), None)
        if bad is not None:
            raise ConfigError(f"task {cfg.task.name!r}: its {split} instances must be dicts, got a "
                              f"{type(bad).__name__} ({bad!r:.80}); return a list of dicts from rows() / tasks()")
    for split, rows in (("train", train_rows), ("eval", eval_rows)):
        odd = [r["id"] for r in rows if isinstance(r["id"], bool) or not isinstance(r["id"], (str, int))][:1]
        if odd:
            odd = odd[0]
            raise ConfigError(f"task {cfg.task.name!r}: its {split} instances' ids must be text or integers, got "
                              f"{type(odd).__name__} {odd!r:.60}; give each instance an 'id' of text")
        counts = Counter(r["id"] for r in rows)
        repeated = [(i, n) for i, n in counts.items() if n > 1]
        if repeated:
            i, n = repeated[0]
            raise ConfigError(f"task {cfg.task.name!r}: its {split} split repeats {len(repeated)} instance ids (e.g. "
                              f"{i!r} {n} times; an instance without an 'id' is identified by its content); give each "
                              "instance its own id or drop the repeats")
    overlap = {r["id"] for r in train_rows} & {r["id"] for r in eval_rows}
    if overlap:
        raise ConfigError(f"task {cfg.task.name!r}: {len(overlap)} instances are in both train and eval splits "
                          f"(e.g. id {sorted(overlap)[0]!r}); keep the splits disjoint")
    return train_rows, eval_rows


def note_short_warmup(cfg: Config, total_opt: int) -> str | None:
    """A warning (returned too) where the policies' linear warm-up is so long that the run's ``total_opt``
    optimizer steps end below half of ``training.lr``; None otherwise."""
    warmup = cfg.training.warmup_steps
    if not warmup or 2 * total_opt >= warmup:
        return None
    line = (f"training.warmup_steps={warmup} is longer than the run's {total_opt} optimizer steps (run.steps x "
            f"algorithm.ppo_epochs x training.num_mini_batches): the learning rate ends at {total_opt / warmup:.0%} "
            f"of training.lr={cfg.training.lr:g}; lower training.warmup_steps")
    logger.warning("%s", line)
    return line


def build_policies(cfg: Config, per_policy: dict[str, int]) -> tuple[dict[str, Policy], Any]:
    """The policies (and the backend that holds them, or None): one actor per policy (N with
    ``replicas: N``) with ``run.backend: ray``, N data-parallel ranks of a policy with ``replicas: N``
    (under torchrun, or ``replicas: 1`` in this process), one frozen base with an adapter per policy with ``specialization: lora``, else
    one model per policy on its device."""
    total_opt = cfg.run.steps * cfg.algorithm.ppo_epochs * cfg.training.num_mini_batches
    note_short_warmup(cfg, total_opt)
    names = sorted(per_policy)
    if cfg.run.backend == "ray":  # one actor per policy, built there with build_policy
        from accord.distributed.ray_backend import RayBackend

        backend = RayBackend(cfg.ray)
        return backend.start_policies(cfg, names, total_opt), backend
    if wants_data_parallel(cfg, names):  # policies.<name>.replicas, or launched by torchrun
        backend = LocalGroups(cfg)
        return backend.start_policies(cfg, names, total_opt, build_policy), backend
    devices = policy_devices(cfg, names)  # checked before any model is loaded
    if cfg.specialization == "lora":  # one frozen base, one adapter per policy
        return build_lora_policies(cfg, names, total_opt, seed=cfg.run.seed, device=devices[min(per_policy)]), None
    return {name: build_policy(cfg, name, i, total_opt, device=devices[name]) for i, name in enumerate(names)}, None


def resume_point(cfg: Config, run_dir: Path, allow_unverified: bool = False,
                 stop_if_finished: bool = False) -> Path | None:
    """The checkpoint a resume will load (the newest that verifies; None: the run has none), checked against
    ``run.steps`` before any model loads: a checkpoint past it is a :class:`ConfigError`; one at it, with
    ``stop_if_finished``, a :class:`RunComplete` (nothing to do)."""
    folder = Path(run_dir) / "checkpoints"
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder} is not a directory, and a resume writes its checkpoints there; move it away "
                          f"(or restore the run's checkpoints in its place)")
    ckpt = verified_checkpoint(run_dir, allow_unverified)
    if ckpt is None:
        # a run killed before its first checkpoint is replayed from step 0; past the first checkpoint's step
        # (committed before the next step is logged) the checkpoints were removed, and the logs would go too
        every, last = cfg.run.checkpoint_every, last_logged_step(run_dir)
        if every and last > every:
            raise ConfigError(f"{run_dir} logged {last} steps but holds no checkpoint (with run.checkpoint_every="
                              f"{every} there was one at step {every}: was checkpoints/ removed?); restore its "
                              f"checkpoints to resume, or start the run over with --overwrite (deletes its logs)")
        # a step's metrics carry time/checkpoint from just before its checkpoint is renamed into place: a later step
        # logged, or no checkpoints/ folder left (a kill in that rename leaves it, with the partial save in it), means
        # the checkpoint was there (one written on a stop, with run.checkpoint_every=0, say)
        written = checkpointed_steps(run_dir)
        if written and (written[-1] < last or not (run_dir / "checkpoints").exists()):
            raise ConfigError(f"{run_dir} logged a checkpoint at step {written[-1]} but holds none (was "
                              f"checkpoints/ removed?); restore its checkpoints to resume, or start the run over "
                              f"with --overwrite (deletes its logs)")
        planned = _planned_steps(run_dir)
        if planned is not None and 0 < planned <= last:   # a run that reached its run.steps ended with a checkpoint
            raise ConfigError(f"{run_dir} logged all {planned} steps of its run.steps={planned} but holds no "
                              f"checkpoint (a finished run ends with one: was checkpoints/ removed, or the run killed "
                              f"while writing it?); restore its checkpoints to resume, or start the run over with "
                              f"--overwrite (deletes its logs)")
        return None
    changed = layout_change(run_dir, cfg)
    if changed is not None:
        raise ConfigError(changed)
    step = checkpoint_step(ckpt)
    if step > cfg.run.steps:
        raise ConfigError(f"run.steps={cfg.run.steps} is below step {step} of the checkpoint {ckpt}; resume with "
                          f"run.steps={step} or more")
    if step == cfg.run.steps and stop_if_finished:
        prune_checkpoints(run_dir, cfg.run.keep_checkpoints, ckpt)   # a kill between the last commit and its prune
        raise RunComplete(f"{run_dir} already reached run.steps={step} (checkpoint {ckpt.name}): nothing to do; to "
                          f"train it further pass a larger run.steps, e.g. `accord train --resume {run_dir} "
                          f"run.steps={2 * step}`")
    return ckpt


def _planned_steps(run_dir: Path) -> int | None:
    """``run.steps`` of the config the run directory holds (what its last run was set to reach; the resume
    rewrites it later), or None where it does not read as one."""
    import yaml

    try:
        saved = yaml.safe_load((Path(run_dir) / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    run = saved.get("run") if isinstance(saved, dict) else None
    steps = run.get("steps") if isinstance(run, dict) else None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


# where a run is and how long it goes: a resume may move the first and raise the second without it being an edit
_RESUME_FREE = ("run.run_dir", "run.output_dir", "run.name", "run.steps")


def warn_config_edits(run_dir: Path, recorded: str | None, step: int) -> list[str]:
    """A warning for each setting the run's ``config.yaml`` changes against ``recorded``, the config a checkpoint
    holds (the file's text when it was written; None in checkpoints that predate it): the file was edited after
    the steps so far ran, and the steps from here on use it (a resume's overrides are reported by the CLI before).
    Returns the keys."""
    import yaml

    from accord.config.base import covered, flat_keys

    if not isinstance(recorded, str):
        return []
    try:
        before = yaml.safe_load(recorded)
        after = yaml.safe_load((Path(run_dir) / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):   # the build read the file already: only the old text
        return []
    if not isinstance(before, dict) or not isinstance(after, dict):
        return []
    was, now = flat_keys(before), flat_keys(after)
    changed = [k for k in sorted(set(was) | set(now)) if not covered(k, _RESUME_FREE)
               and was.get(k, "<unset>") != now.get(k, "<unset>")]
    for key in changed:
        logger.warning("%s/config.yaml changes %s from %r to %r since the checkpoint of step %d was written (the "
                       "file was edited, or a resume's overrides rewrote it): the steps from here on use the second",
                       run_dir, key, was.get(key, "<unset>"), now.get(key, "<unset>"), step)
    return changed


def resume_run(cfg: Config, run_dir: Path, policies: dict[str, Policy], parts: dict[str, Any] | None = None,
               allow_unverified: bool = False, verified: Path | None = None) -> dict | None:
    """Load the latest checkpoint into ``policies`` (and the run's ``parts``: critics, pair buffer, reward
    model); its trainer state (``step``: the step to continue from), or None without one. ``verified``: a
    checkpoint :func:`resume_point` verified already (not hashed again)."""
    state = resume_checkpoint(run_dir, policies, parts, allow_unverified, verified=verified)
    if state is None:  # killed before its first checkpoint: the same seed replays it exactly
        logger.warning("%s has no checkpoint yet: starting the run over from step 0", run_dir)
        discard_uncheckpointed(run_dir)
        return None
    step = state["step"]
    warn_config_edits(run_dir, state.get("config"), step)
    prune_checkpoints(run_dir, cfg.run.keep_checkpoints, state["path"])  # a kill before the prune
    prune_after(run_dir, step)   # audit records of the steps after the checkpoint are re-run
    logger.info("resumed %s at step %d of %d", run_dir, step, cfg.run.steps)
    return state


def build_run(cfg: Config, *, resume: bool = False, overwrite: bool = False, allow_unverified: bool = False,
              stop_if_finished: bool = False) -> Run:
    """Every part of a run of ``cfg`` (see the module docstring); ``resume`` continues from the latest
    checkpoint (``allow_unverified``: also one without a manifest; ``stop_if_finished``: a checkpoint at
    ``run.steps`` is a :class:`RunComplete` before any model loads, instead of a run with no step left),
    ``overwrite`` deletes an earlier run in the same directory."""
    from accord.tracking.report_to import check_report_to

    import_modules(cfg.imports)   # their sinks registered before report_to is checked
    check_report_to(cfg.logging.report_to)  # an unknown sink or a missing package: say so before models load
    existed = Path(cfg.run_dir).is_dir()
    releases = [claim_run_dir(cfg.run_dir, resume=resume, overwrite=overwrite)]  # before the (slow) build: fail fast
    run = None
    try:
        verified = resume_point(cfg, cfg.run_dir, allow_unverified, stop_if_finished) if resume else None
        setup_process(cfg.run.seed, cfg.run.threads, cfg.run.retain_freed_memory)
        make_env_fn = EnvFactory(cfg)
        env = make_env_fn()
        per_policy = check_run(cfg, env)
        agents = tuple(a.name for a in cfg.agents)
        agent_policy = {a.name: a.policy for a in cfg.agents}
        name = rollout_name(cfg, env)
        rollout = make_rollout(name, cfg, env, make_env_fn, agents, agent_policy)
        if cfg.training.audit != "off" and name != "episodes":   # the episodes rollout records nothing (trainer_steps)
            rollout.recorder = AuditRecorder()
        train_rows, eval_rows = split_data(cfg, env)
        policies, backend = build_policies(cfg, per_policy)
        run = Run(cfg, env, make_env_fn, agents, agent_policy, rollout, policies,
                  AgentGenerator(policies, agent_policy, agent_sampling(cfg)), train_rows, eval_rows, cfg.run_dir,
                  backend=backend, releases=releases)
        check_context(cfg, policies)
        keep_fitting_rows(cfg, run)
        run.parts = build_parts(cfg, run)   # critics, pair buffer, reward model: before a resume loads them
        if resume:
            run.resume_state = resume_run(cfg, run.run_dir, policies, run.parts, allow_unverified, verified=verified)
            run.start_step = run.resume_state["step"] if run.resume_state else 0
        run.run_dir.mkdir(parents=True, exist_ok=True)
        releases.append(hold_run_dir(run.run_dir))   # held from here on, also where the directory is new
        if not existed and not resume:
            check_still_new(run.run_dir)
        save_config(cfg, run.run_dir / "config.yaml")  # on resume too: overrides (e.g. run.steps) are part of the run
    except BaseException:
        if run is not None:
            run.close()
        else:
            for release in releases:
                release()
        raise
    return run
