"""The rules that relate two parts of a run, one named function per tier.

A rule is checked in the first tier that has what it reads; each error is one line naming the keys and the fix.

=============  ==========================================================================================
tier           where its rules are
=============  ==========================================================================================
section        within one section: each section's ``__post_init__`` (:mod:`accord.config.schema`);
               :class:`~accord.config.schema.Config` checks its own fields there (``specialization``,
               ``imports``, each policy, the agents list)
run            between sections of the config alone: :func:`check_config` (``Config.__post_init__`` calls it,
               so no Config is built invalid) and its part :func:`check_agents` (run again by
               ``Config.resolve_agents`` once the task has filled ``agents``)
rollout        the config against the environment (its agents, single-turn or not, turns, simultaneous
               moves): :func:`check_rollout` with an :class:`EnvInfo` of plain values; its parts
               :func:`check_sizes` and :func:`check_tree_size`. :func:`accord.build.check_run` calls it, the
               one place a run is checked: ``accord train``, ``accord eval``, ``accord plan``, ``accord
               compare`` (its preflight) and the Python API (``Trainer``, ``build_run``) all pass through it
distributed    the config against processes and hardware, given as counts: :func:`check_distributed`
               (replicas, torchrun's world, GPUs and CPU cores;
               :func:`accord.distributed.data_parallel.check_replicas` calls it with what it detects) and
               :func:`check_ray_devices` (a Ray actor's GPU reservation against its policy's device;
               :mod:`accord.distributed.ray_backend` calls it)
=============  ==========================================================================================

Rules that need a live object (a registry filled by ``imports:``, torch, built models, a Ray cluster, files)
stay where that object is:

- :func:`accord.build.check_registered`: ``algorithm.advantage``, ``agents[].advantage``, ``algorithm.loss``
  and ``rollout.generation_backend`` are registered; the loss's aggregation fits ``algorithm.loss_agg``; a
  loss or ``algorithm.tis`` that reads sampling log-probs has a backend that stores them.
- :func:`accord.algorithms.advantages.check_advantage_config`: an estimator's own constraints
  (``normalize_std``), from :func:`accord.build.check_run`.
- :func:`accord.tracking.report_to.check_report_to`: ``logging.report_to`` names registered sinks whose
  packages are installed (:func:`accord.build.build_run`).
- :func:`accord.trainer_steps.check_files`: marlhf's files (``reward_model.preferences`` read and checked
  against the agents; ``reward_model.path`` holds a reward model), from :func:`accord.build.check_run`.
- ``Rollout.check`` (:mod:`accord.rollout`): the environment object is of the kind the rollout drives (a
  protocol environment; a single-turn task).
- :func:`accord.build.check_context`: each agent's length cap leaves room in its policy's model context (the
  built policies).
- :mod:`accord.devices`: ``resolve_device`` (a device setting against this machine's GPUs), ``policy_devices``
  (``specialization: lora`` on one resolved device) and ``check_vllm_devices`` (vLLM engines per GPU, sleep
  mode), on torch devices.
- :func:`accord.distributed.fsdp.check_fsdp_support`: ``training.fsdp`` against this torch build (FSDP2's
  methods, NCCL, gloo).
- :func:`accord.distributed.ray_backend.check_resources`: the actors' CPU and GPU requests against the Ray
  cluster.
- :func:`accord.build.resume_point`: ``run.steps`` against the checkpoint resumed from.

Settings that are valid but have no effect in a run are warnings, not rules: :mod:`accord.config.ignored`.

This module imports no accord module but :mod:`accord.config.base`: what a rule needs of a higher layer is
passed in as plain values (names, counts, :class:`EnvInfo`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from accord.config.base import ACTOR_CRITIC, PREFERENCE, ConfigError, algorithm_phrase, check_device_setting

# An accord.config.schema.Config. Not imported, not even for type checkers: the schema imports this module
# (Config.__post_init__ runs check_config), and an import back would close a cycle (tests/test_imports.py).
_Config = Any

logger = logging.getLogger(__name__)


# --- run: between sections of the config ------------------------------------------------------------------


def check_config(cfg: _Config) -> None:
    """The run tier: every rule between sections of ``cfg`` (agents and policies, specialization, backend,
    data parallelism, the algorithm against the other sections). ``Config.__post_init__`` calls it."""
    for a in cfg.agents:
        if a.policy not in cfg.policies:
            raise ConfigError(
                f"agent {a.name!r} uses policy {a.policy!r}, which is not defined; defined policies: "
                f"{sorted(cfg.policies)}. Add policies.{a.policy}.model=... or set the agent's policy"
            )
    if cfg.agents:
        used = {a.policy for a in cfg.agents}
        unused = sorted(set(cfg.policies) - used)
        if unused:
            raise ConfigError(f"policies {unused} are used by no agent; remove them or assign them to an agent")
        if cfg.specialization == "shared" and len(used) > 1:
            raise ConfigError(
                f"specialization=shared trains one model, but agents use policies {sorted(used)}; "
                "map every agent to one policy or set specialization=separate"
            )
    if cfg.specialization == "lora":
        check_lora_policies(cfg)
    if cfg.run.backend == "ray" and cfg.specialization == "lora":
        raise ConfigError("run.backend=ray places one actor per policy, but specialization=lora keeps all adapters "
                          "on one shared base model in one process; use run.backend=local with lora, or "
                          "specialization=separate on Ray")
    _check_fsdp(cfg)
    check_agents(cfg)
    if cfg.rollout.drop_flat_groups and cfg.algorithm.norm_scope == "agent":
        raise ConfigError("rollout.drop_flat_groups=true drops advantage groups with equal returns, but "
                          "algorithm.norm_scope=agent pools all of an agent's samples of a step into one group; "
                          "use norm_scope=group or prompt, or drop_flat_groups=false")
    _check_actor_critic_and_preference(cfg)


def check_agents(cfg: _Config) -> None:
    """The run tier's agent rules: frozen agents, the alternation schedule and per-agent length caps (again once
    the task has filled ``agents``: ``Config.resolve_agents``)."""
    _check_actor_critic_and_preference_agents(cfg)
    window = cfg.algorithm.overlong.window
    for a in cfg.agents:
        cap = a.sampling.max_new_tokens or cfg.rollout.max_new_tokens
        floor = a.sampling.min_new_tokens if a.sampling.min_new_tokens is not None else cfg.rollout.min_new_tokens
        if floor and floor >= cap:
            key = (f"agents.{a.name}.sampling.min_new_tokens" if a.sampling.min_new_tokens is not None
                   else "rollout.min_new_tokens")
            raise ConfigError(f"{key}={floor} is not below the length cap of agent {a.name!r}, {cap} tokens: every "
                              "completion would run to the cap; lower the floor or raise max_new_tokens")
        if window and window >= cap:
            key = (f"agents.{a.name}.sampling.max_new_tokens" if a.sampling.max_new_tokens
                   else "rollout.max_new_tokens")
            raise ConfigError(f"algorithm.overlong.window={window} is not shorter than {key}={cap}, the length cap "
                              "it ends at; give a window below the cap (DAPO: a quarter of it)")
    if not cfg.agents:
        return
    trained = [a.name for a in cfg.agents if a.trainable]
    if not trained:
        raise ConfigError(f"every agent ({[a.name for a in cfg.agents]}) has trainable=false, so nothing would be "
                          "trained; set trainable=true for at least one agent (or evaluate with `accord eval`)")
    by_policy: dict[str, set[bool]] = {}
    for a in cfg.agents:
        by_policy.setdefault(a.policy, set()).add(a.trainable)
    for policy, flags in sorted(by_policy.items()):
        if len(flags) > 1:
            frozen = [a.name for a in cfg.agents if a.policy == policy and not a.trainable]
            trained_here = [a.name for a in cfg.agents if a.policy == policy and a.trainable]
            raise ConfigError(f"policy {policy!r} acts for frozen agents {frozen} and trained agents "
                              f"{trained_here}: training it would change the frozen ones too; give the frozen "
                              "agents a policy of their own (specialization=separate or lora)")
    if cfg.algorithm.alternate_every and len(trained) < 2:
        raise ConfigError(f"algorithm.alternate_every={cfg.algorithm.alternate_every} trains agents in turns, but "
                          f"only {trained} is trainable; set alternate_every=0 or make another agent trainable")


def check_lora_policies(cfg: _Config) -> None:
    """specialization=lora: every policy is an adapter over one common base model."""
    bases = {(p.model, repr(sorted(p.model_kwargs.items()))) for p in cfg.policies.values()}
    layers = {p.trainable_layers for p in cfg.policies.values()}
    if len(bases) == 1 and len(layers) > 1:
        desc = ", ".join(f"{n}: {p.trainable_layers}" for n, p in sorted(cfg.policies.items()))
        raise ConfigError(f"specialization=lora puts every policy's adapter on the same blocks of one base model, but "
                          f"the policies' trainable_layers differ ({desc}); give every policy the same value")
    if len(bases) > 1:
        desc = ", ".join(f"{n}: {p.model!r}" + (f" {p.model_kwargs}" if p.model_kwargs else "")
                         for n, p in sorted(cfg.policies.items()))
        raise ConfigError(
            f"specialization=lora trains one LoRA adapter per policy over one shared base model, but the "
            f"policies name different base models ({desc}); give every policy the same model (and "
            "model_kwargs), or set specialization=separate for different models")


def _check_fsdp(cfg: _Config) -> None:
    """training.fsdp shards a policy across its replicas: every policy needs at least two."""
    if not cfg.training.fsdp:
        return
    few = {n: p.replicas for n, p in sorted(cfg.policies.items()) if (p.replicas or 1) < 2}
    if few:
        raise ConfigError(f"training.fsdp=true shards each policy across its data-parallel ranks, but policies "
                          f"{few} (name: replicas) have fewer than 2; set policies.<name>.replicas=2 or more for "
                          "every policy, or training.fsdp=false")
    if cfg.specialization == "lora":
        raise ConfigError("training.fsdp=true does not support specialization=lora (replicas do not either); use "
                          "specialization=separate or shared, or training.fsdp=false")
    if cfg.rollout.generation_backend == "vllm":
        raise ConfigError("training.fsdp=true does not support rollout.generation_backend=vllm (vLLM would need "
                          "the whole model per rank); use generation_backend=hf or training.fsdp=false")


def _check_actor_critic_and_preference(cfg: _Config) -> None:
    """Combinations of iac, maac, madpo and marlhf with the other sections that do not apply."""
    algo = cfg.algorithm
    if algo.name not in ACTOR_CRITIC + PREFERENCE:
        return
    stage = cfg.reward_model.rl if algo.name == "marlhf" else algo.name
    if algo.name == "marlhf" and stage == "magrpo" and algo.num_generations < 2:
        raise ConfigError(f"algorithm.num_generations={algo.num_generations}: marlhf with reward_model.rl=magrpo "
                          "needs K >= 2 samples per group; set algorithm.num_generations=4, or reward_model.rl=iac")
    if (algo.name == "marlhf" and algo.num_generations < 2 and not cfg.reward_model.path
            and not cfg.reward_model.preferences):
        raise ConfigError(f"algorithm.num_generations={algo.num_generations}: marlhf's stage 1 learns its reward "
                          "model from pairs of a prompt's candidates, and one candidate makes no pair; set "
                          "algorithm.num_generations >= 2, or give reward_model.preferences or reward_model.path")
    if algo.joint_mode == "cross":
        raise ConfigError(f"algorithm.joint_mode=cross does not apply to algorithm.name={algo.name} (its critics, "
                          "candidates and reward model see aligned joint actions, the j-th samples of all agents); "
                          "set algorithm.joint_mode=aligned")
    if stage == "maac" and cfg.critic.mode == "head":
        raise ConfigError("critic.mode=head does not apply to maac: its critic is one centralised model over the "
                          "joint history of all agents, not a head on one agent's policy; leave critic.mode null "
                          "(or 'separate'), or use algorithm.name=iac for value heads")
    if stage == "iac" and cfg.critic.mode in (None, "head") and cfg.critic.model is not None:
        models = sorted({p.model for p in cfg.policies.values()})
        if models != [cfg.critic.model] or cfg.critic.model_kwargs:
            raise ConfigError(f"critic.mode=head (iac's default) puts each agent's value head on its own policy model "
                              f"{models} (its tokenizer), but critic.model={cfg.critic.model!r} names another; set "
                              "critic.mode=separate to train that model as the critic, or drop critic.model")
    if stage in ACTOR_CRITIC and cfg.critic.value_at == "completion" and algo.num_generations < 2:
        raise ConfigError(f"critic.value_at=completion makes the advantage Q minus the mean Q of a prompt's K "
                          f"samples, but algorithm.num_generations={algo.num_generations}; set num_generations "
                          ">= 2 or critic.value_at=prompt")
    if algo.name == "madpo" and algo.entropy_coef > 0:
        raise ConfigError(f"algorithm.entropy_coef={algo.entropy_coef} does not apply to madpo (its loss is DPO's on "
                          "preference pairs, not a policy gradient); set entropy_coef=0")
    if algo.name == "madpo" and algo.kl_coef > 0:
        raise ConfigError(f"algorithm.kl_coef={algo.kl_coef} does not apply to madpo (DPO's margins already hold "
                          "the policy to its reference: preference.reference_free=false); set kl_coef=0")
    replicas = sorted(n for n, p in cfg.policies.items() if p.replicas is not None)
    if replicas or cfg.training.fsdp:
        raise ConfigError(f"algorithm.name={algo.name} does not support data-parallel policies (policies "
                          f"{replicas} set replicas{', training.fsdp=true' if cfg.training.fsdp else ''}): its "
                          "critics and pair buffers live in one process; drop policies.<name>.replicas and "
                          "training.fsdp, or use magrpo/atgrpo")
    if cfg.rollout.generation_backend == "vllm":
        raise ConfigError(f"algorithm.name={algo.name} is not supported with rollout.generation_backend=vllm yet "
                          "(its reference and value forwards run on the learner); use generation_backend=hf")
    # main's group-relative controls: each needs a step these algorithms do not run
    if algo.credit != "team":
        raise ConfigError(f"algorithm.credit={algo.credit} splits MAGRPO's team return among agents; it does not "
                          f"apply to algorithm.name={algo.name} (critics, pairs or a reward model assign credit "
                          "there); set algorithm.credit=team")
    if cfg.rollout.drop_flat_groups:
        raise ConfigError(f"rollout.drop_flat_groups drops advantage groups of equal returns (magrpo, atgrpo); "
                          f"algorithm.name={algo.name} has no such groups (madpo already skips tied candidates); "
                          "set rollout.drop_flat_groups=false")
    if algo.name != "marlhf" or stage != "magrpo":   # marlhf's magrpo stage runs MAGRPO's own phases
        if algo.overlong.window or algo.overlong.mask_truncated:
            raise ConfigError(f"algorithm.overlong (DAPO's length shaping) is applied by MAGRPO's and AT-GRPO's "
                              f"step, not by algorithm.name={algo.name}; set algorithm.overlong.window=0 and "
                              "mask_truncated=false")
    if algo.name == "madpo":
        if algo.loss not in ("grpo", "clip"):
            raise ConfigError(f"algorithm.loss={algo.loss} is a policy-gradient loss; madpo trains on the joint DPO "
                              "loss (preference.*): leave algorithm.loss at grpo")
        if algo.tis not in ("auto", "off"):
            raise ConfigError(f"algorithm.tis={algo.tis} corrects policy-gradient ratios; madpo's DPO margins use "
                              "the learner's own log-probs: set algorithm.tis=auto")


def _check_actor_critic_and_preference_agents(cfg: _Config) -> None:
    """Per-agent settings iac, maac, madpo and marlhf's actor-critic stage do not apply (again once the task
    has filled ``agents``)."""
    algo = cfg.algorithm
    if algo.name not in ACTOR_CRITIC + PREFERENCE:
        return
    if algo.name == "marlhf" and cfg.reward_model.rl == "magrpo":
        return   # MAGRPO's update: per-agent estimators, frozen and alternating agents apply
    own = [a.name for a in cfg.agents if a.advantage]
    if own:
        raise ConfigError(f"agents {own} set their own advantage estimator, a group-relative one (magrpo, atgrpo, "
                          f"marlhf with reward_model.rl=magrpo); {algorithm_phrase(cfg)} takes its advantages from "
                          "critics or preference pairs: drop agents[].advantage")
    frozen = [a.name for a in cfg.agents if not a.trainable]
    if frozen or algo.alternate_every:
        what = f"agents {frozen} set trainable=false" if frozen else f"algorithm.alternate_every={algo.alternate_every}"
        raise ConfigError(f"{what}, but algorithm.name={algo.name} updates every agent each step (its critics, "
                          "value heads or DPO update run per policy); train all agents, or use magrpo, atgrpo or "
                          "marlhf with reward_model.rl=magrpo")


# --- rollout: the config against the environment -------------------------------------------------------------


@dataclass(frozen=True)
class EnvInfo:
    """What the rollout tier reads of a run's environment, as plain values (:func:`accord.build.env_info`
    makes it from an environment)."""

    name: str                        # the environment's name (env.name)
    agents: tuple[str, ...]          # its agents, in turn order
    single_turn: bool                # a single-turn task (accord.envs.single_turn.SingleTurnEnv)
    max_turns: int = 1               # its turn limit (rollout.max_turns overrides it)
    simultaneous: bool = False       # every agent acts at once in a turn
    min_new_tokens: tuple[tuple[str, int], ...] = ()   # (agent, floor) pairs the task declares (rollout.min_new_tokens)
    joint_mode: str | None = None    # the joint mode the task declares for algorithm.joint_mode: null (None: aligned)
    top_p: float | None = None       # the nucleus the task declares for rollout.top_p: null (None: 1.0)


EPISODE_ALGORITHMS = ("iac", "maac", "madpo")   # sample independent episodes on a multi-turn environment


def rollout_for(algorithm: str, single_turn: bool) -> str:
    """The rollout (:mod:`accord.rollout`) that ``algorithm`` runs on a single-turn task or a multi-turn
    environment: AT-GRPO's, sampled episodes (actor-critic and preference learning on a multi-turn
    environment), MAGRPO's joint actions (single-turn) or its tree (multi-turn)."""
    if algorithm == "atgrpo":
        return "atgrpo"
    if algorithm in EPISODE_ALGORITHMS and not single_turn:
        return "episodes"
    return "magrpo_joint" if single_turn else "magrpo_tree"


def joint_mode_for(cfg: _Config, kind: str, n_agents: int, declared: str | None = None) -> str:
    """What ``algorithm.joint_mode: null`` stands for in a run of rollout ``kind`` (:func:`rollout_for`) with
    ``n_agents`` agents on a task that declares the joint mode ``declared`` (its ``joint_mode`` attribute):
    ``cross`` where the task declares it and the run can use it (single-turn MAGRPO with team credit, two or
    more agents, K^N joint actions within ``algorithm.max_cross_joint``), ``aligned`` everywhere else: a task
    that declares nothing, a MAGRPO tree (cross would branch K^N ways per node), counterfactual credit (it splits
    aligned joint actions), the actor-critic and preference trainers (their critics, candidates and reward model
    see aligned joint actions). Cross credits each sample with its mean over all the partners' samples, so a
    partner's draw does not decide its advantage; aligned pairs reward both members of a pair that agreed in the
    same step, and on a convention game (the single-turn handoff) aligned learned where cross did not
    (docs/magrpo.md)."""
    algo = cfg.algorithm
    if (declared == "cross" and kind == "magrpo_joint" and algo.name == "magrpo" and algo.credit == "team"
            and n_agents >= 2 and algo.num_generations ** n_agents <= algo.max_cross_joint):
        return "cross"
    return "aligned"


def check_rollout(cfg: _Config, env: EnvInfo) -> None:
    """The rollout tier: the config against the environment. Fills or checks ``agents`` against the
    environment's (``Config.resolve_agents``), then the rules of the algorithm and of the rollout it runs
    there (:func:`rollout_for`): the rollout integrity audit, marlhf's single-turn joint actions, a
    single-turn task's team reward, sizes that split into mini-batches, counterfactual credit's agents, cross
    mode's joint actions, a MAGRPO tree's size, AT-GRPO's turn-based environment."""
    cfg.resolve_agents(env.agents)
    if cfg.rollout.top_p is None:   # null: the task's nucleus (written into the config: config.yaml records it)
        cfg.rollout.top_p = 1.0 if env.top_p is None else env.top_p
        if env.top_p is not None:
            logger.info("rollout.top_p=null: task %r samples from the nucleus %.2f", cfg.task.name, env.top_p)
    if cfg.rollout.min_new_tokens is None:   # null: the task's floors, for agents that set none
        floors = dict(env.min_new_tokens)
        for a in cfg.agents:
            floor = floors.get(a.name, 0)
            if a.sampling.min_new_tokens is not None or not floor:
                continue
            cap = a.sampling.max_new_tokens or cfg.rollout.max_new_tokens
            if floor < cap:
                a.sampling.min_new_tokens = floor
            else:
                logger.warning("agent %r: task %r declares a completion floor of %d tokens, which its length cap of %d "
                               "leaves no room for, so it gets none; answers this short may never score: raise "
                               "max_new_tokens above %d (or set rollout.min_new_tokens=0 to silence this)",
                               a.name, cfg.task.name, floor, cap, floor)
    algo = cfg.algorithm
    kind = rollout_for(algo.name, env.single_turn)
    if cfg.training.audit == "strict" and kind == "episodes":
        raise ConfigError(f"training.audit=strict checks the scored joint actions MAGRPO's and AT-GRPO's rollouts "
                          f"record; algorithm.name={algo.name} on the multi-turn {cfg.task.name!r} samples whole "
                          "episodes and records none: set training.audit=off (or record), or use magrpo/atgrpo")
    if cfg.training.audit == "record" and kind == "episodes":
        logger.info("training.audit=record: algorithm.name=%s on the multi-turn %r samples whole episodes, which the "
                    "audit does not record (docs/algorithms-actor-critic.md)", algo.name, cfg.task.name)
    if algo.name == "marlhf" and not env.single_turn:
        raise ConfigError(f"algorithm.name=marlhf needs a single-turn task (its reward model scores one joint action "
                          f"of all agents); {cfg.task.name!r} is a multi-turn environment: use madpo, iac or maac")
    agents = [a.name for a in cfg.agents]
    if algo.joint_mode is None and kind != "atgrpo":   # null: written into the config (config.yaml records it)
        algo.joint_mode = joint_mode_for(cfg, kind, len(agents), env.joint_mode)
        logger.info("algorithm.joint_mode=null: %s joint actions (docs/magrpo.md)", algo.joint_mode)
    if kind == "magrpo_joint":
        if algo.baseline == "independent":
            raise ConfigError(f"algorithm.baseline=independent needs per-agent local rewards; the single-turn task "
                              f"{cfg.task.name!r} has only a team reward")
        per_policy: dict[str, int] = {}
        for a in cfg.agents:
            per_policy[a.policy] = per_policy.get(a.policy, 0) + 1
        check_sizes(cfg, per_policy)
        if algo.credit == "counterfactual" and len(agents) < 2:
            raise ConfigError(f"algorithm.credit=counterfactual splits the team reward among agents; task "
                              f"{cfg.task.name!r} has one agent ({agents[0]!r}): set algorithm.credit=team")
        if algo.joint_mode == "cross" and algo.num_generations ** len(agents) > algo.max_cross_joint:
            raise ConfigError(
                f"cross mode makes K^N = {algo.num_generations}^{len(agents)} joint actions per instance, "
                f"more than algorithm.max_cross_joint={algo.max_cross_joint}; lower algorithm.num_generations "
                "or use joint_mode=aligned")
    elif kind == "magrpo_tree":
        if algo.joint_mode == "cross" and not env.simultaneous:
            raise ConfigError("algorithm.joint_mode=cross needs a simultaneous environment (in a turn-based "
                              "one later agents see earlier actions); use joint_mode=aligned")
        if algo.credit == "counterfactual" and len(agents) < 2:
            raise ConfigError(f"algorithm.credit=counterfactual splits the team reward among agents; "
                              f"{env.name!r} has one agent: set algorithm.credit=team")
        check_tree_size(cfg.rollout.batch_size, len(agents), algo.num_generations,
                        cfg.rollout.max_turns or env.max_turns, algo.joint_mode, cfg.rollout.max_tree_generations)
    elif kind == "atgrpo":
        if env.single_turn:
            raise ConfigError(f"algorithm.name=atgrpo needs a multi-turn environment; {cfg.task.name!r} is a "
                              "single-turn task: use algorithm.name=magrpo (see `accord envs`)")
        if env.simultaneous:
            raise ConfigError(f"algorithm.name=atgrpo needs a turn-based environment; {env.name!r} is "
                              "simultaneous (set its option simultaneous=false if it has one, or use magrpo)")


def check_sizes(cfg: _Config, num_agents_per_policy: dict[str, int]) -> None:
    """Each policy's samples of a step split evenly into ``training.num_mini_batches`` (single-turn MAGRPO)."""
    k = cfg.algorithm.num_generations
    for policy, n_agents in num_agents_per_policy.items():
        n = cfg.rollout.batch_size * k * n_agents
        if n % cfg.training.num_mini_batches:
            raise ConfigError(
                f"policy {policy!r} gets {n} samples per step (batch_size {cfg.rollout.batch_size} x K {k} x "
                f"{n_agents} agents), not divisible by training.num_mini_batches={cfg.training.num_mini_batches}; "
                "choose a divisor"
            )


class TreeTooLargeError(ValueError):
    """The MAGRPO tree would exceed the configured generation cap; raised before any generation."""


def tree_generations(batch: int, n_agents: int, k: int, turns: int, mode: str, limit: int | None = None) -> int:
    """Completions a full MAGRPO tree samples per step (before episodes end early); with ``limit``, a count above it
    is given as ``limit + 1`` without summing the rest of the tree (a million turns are not summed)."""
    branching = k if mode == "aligned" else k ** n_agents
    per_node = batch * n_agents * k
    if branching == 1:
        total = per_node * turns
        return total if limit is None or total <= limit else limit + 1
    nodes, width = 0, 1
    for _ in range(turns):
        nodes += width
        if limit is not None and per_node * nodes > limit:
            return limit + 1
        width *= branching
    return per_node * nodes


def check_tree_size(batch: int, n_agents: int, k: int, turns: int, mode: str, cap: int) -> int:
    """Refuse a tree past ``cap`` generations, naming which of K, N, T to lower and what it would give."""
    def size(n=n_agents, kk=k, t=turns, m=mode):
        return tree_generations(batch, n, kk, t, m, limit=cap)

    total = size()
    if total <= cap:
        return total
    options = []
    if turns > 1 and size(t=1) <= cap:   # the most turns that fit, by bisection (the size grows with T)
        low, high = 1, turns - 1
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if size(t=mid) <= cap else (low, mid - 1)
        options.append(f"rollout.max_turns={low} (T; gives {size(t=low)})")
    for kk in range(k - 1, 1, -1):
        if size(kk=kk) <= cap:
            options.append(f"algorithm.num_generations={kk} (K; gives {size(kk=kk)})")
            break
    if mode == "cross" and size(m="aligned") <= cap:
        options.append("algorithm.joint_mode=aligned (K children per node instead of K^N)")
    if n_agents > 1 and size(n=n_agents - 1) <= cap:
        options.append(f"fewer agents (N={n_agents - 1} gives {size(n=n_agents - 1)})")
    hint = "; ".join(options) if options else "lower algorithm.num_generations, rollout.max_turns or the number of agents"
    exact = tree_generations(batch, n_agents, k, turns, mode, limit=10 ** 12)
    count = exact if exact <= 10 ** 12 else "more than 10^12"
    raise TreeTooLargeError(
        f"the MAGRPO tree samples {count} completions per step (batch {batch} x N {n_agents} agents x K {k} x "
        f"nodes over T {turns} turns, {mode} mode), more than rollout.max_tree_generations={cap}. Lower one of: "
        f"{hint}; or raise rollout.max_tree_generations")


# --- distributed: the config against processes and hardware --------------------------------------------------


def policy_setting(cfg: _Config, name: str) -> tuple[str, str]:
    """(setting, the config key it came from) of policy ``name``: its own ``device`` or ``run.device``."""
    own = cfg.policies[name].device
    return (own, f"policies.{name}.device") if own is not None else (cfg.run.device, "run.device")


def replicated(cfg: _Config, names: list[str]) -> dict[str, int]:
    """Replica count of every named policy that sets ``replicas``."""
    return {n: cfg.policies[n].replicas for n in names if cfg.policies[n].replicas is not None}


def check_distributed(cfg: _Config, names: list[str], *, world: int, cuda_count: int,
                      cpu_count: int) -> dict[str, int]:
    """The distributed tier: data parallelism (``policies.<name>.replicas``) against the processes launched
    and this machine, before any model loads; returns :func:`replicated`.

    ``world``: processes launched (torchrun's WORLD_SIZE; 1 without torchrun, and on Ray); ``cuda_count`` /
    ``cpu_count``: this machine's GPUs and CPU cores (run.backend=local)."""
    reps = replicated(cfg, names)
    if not reps:
        if world > 1 and cfg.run.backend == "local":
            raise ConfigError(f"torchrun started {world} processes, but no policy sets replicas; set "
                              f"policies.<name>.replicas={world} (or run without torchrun)")
        return reps
    if cfg.specialization == "lora":
        raise ConfigError(f"policies {sorted(reps)} set replicas, but specialization=lora keeps every adapter on one "
                          "base model, which data parallelism does not replicate; remove replicas or use "
                          "specialization=separate")
    if cfg.rollout.generation_backend == "vllm":
        raise ConfigError(f"policies {sorted(reps)} set replicas, which rollout.generation_backend=vllm does not "
                          "support; use generation_backend=hf or remove replicas")
    if cfg.run.backend == "local":
        most = max(reps.values())
        if world == 1 and most > 1:
            big = {n: k for n, k in reps.items() if k > 1}
            raise ConfigError(f"policies {big} ask for {most} data-parallel ranks, but run.backend=local without "
                              f"torchrun runs one process; launch `torchrun --nproc_per_node {most} -m accord.cli "
                              "train CONFIG`, or set run.backend=ray (one actor per rank), or set replicas=1")
        if most > world:
            raise ConfigError(f"policies {reps} ask for up to {most} ranks, but torchrun started {world} processes; "
                              f"launch with --nproc_per_node {most} or lower replicas")
        if world > 1 and most < world:
            raise ConfigError(f"torchrun started {world} processes, but no policy has replicas={world} (replicas: "
                              f"{reps}), so processes {most}..{world - 1} would idle; launch with --nproc_per_node "
                              f"{most} or raise a policy's replicas to {world}")
        for n, k in reps.items():
            setting, key = policy_setting(cfg, n)
            on_gpu = setting.startswith("cuda") or (setting == "auto" and cuda_count > 0)
            if on_gpu and k > cuda_count:
                raise ConfigError(f"policies.{n}.replicas={k} puts one rank per GPU, but this machine has {cuda_count} "
                                  f"GPU(s) (available: {['cpu'] + [f'cuda:{i}' for i in range(cuda_count)]}); lower "
                                  f"replicas to {cuda_count} or less, or set {key}=cpu")
            if on_gpu and setting not in ("cuda", "auto"):
                raise ConfigError(f"policies.{n}.replicas={k}: rank r of a data-parallel policy uses cuda:<local rank>, "
                                  f"so {key}={setting} cannot hold; set {key}=cuda (or auto)")
            if not on_gpu and k > cpu_count:
                raise ConfigError(f"policies.{n}.replicas={k} runs {k} CPU ranks, but this machine has {cpu_count} CPU "
                                  f"core(s); lower replicas to {cpu_count} or less")
    return reps


def check_ray_devices(cfg: _Config, requests: dict[str, tuple[float, float]]) -> None:
    """The distributed tier under run.backend=ray: a policy that asks for CUDA must reserve a GPU for its actor
    (checked on the driver, which may have no GPU itself); ``requests`` are (CPUs, GPUs) per policy."""
    for n, (_, gpus) in requests.items():
        setting, key = policy_setting(cfg, n)
        check_device_setting(key, setting)
        if setting.startswith("cuda") and gpus <= 0:
            raise ConfigError(f"{key}={setting}, but the Ray actor of policy {n!r} reserves no GPU; set "
                              f"policies.{n}.num_gpus=1 (or ray.num_gpus_per_policy=1), or {key}=auto")
        index = int(setting.partition(":")[2] or 0) if setting.startswith("cuda") else 0
        if index and index >= max(1, int(gpus)):
            raise ConfigError(f"{key}={setting}: inside its Ray actor policy {n!r} sees only the {max(1, int(gpus))} "
                              f"GPU(s) it reserves, numbered from cuda:0; set {key}=cuda (or auto)")


__all__ = ["EPISODE_ALGORITHMS", "EnvInfo", "TreeTooLargeError", "check_agents", "check_config", "check_distributed",
           "check_lora_policies", "check_ray_devices", "check_rollout", "check_sizes", "check_tree_size", "joint_mode_for",
           "policy_setting", "replicated", "rollout_for", "tree_generations"]
