"""Settings a run does not read: one warning for each (issue 26).

A config may set a key that the chosen algorithm, baseline, specialization or task form never reads:
AT-GRPO's ``algorithm.alpha`` under magrpo, the ``critic`` section outside iac and maac, a MAGRPO tree's
``rollout.max_tree_generations`` on a single-turn task. Such a key is not an error (one YAML file may serve
several algorithms, as under ``accord compare``), but it changes nothing, and a user who set it should be told.

:func:`ignored_settings` lists every key that the config sets to a value other than its default (the
dataclass default, nested sections alike) and that a :class:`Rule` of :data:`RULES` says is not read here,
one line each: the key, its value, the condition under which it does nothing, what it does where it is
read, and the fix. :func:`warn_ignored` logs them as warnings, each distinct line once per process (a
comparison builds every method's run once per seed); :func:`accord.build.check_run` calls it when a run is
built, and ``accord plan`` when it plans one. Each rule was checked against every reader of its keys (the
rollouts, the trainer's steps, the policies' updates, the critics); a key that some branch of the code
reads under the condition is not listed. The rules read only the config and, when known, whether the
task is single-turn.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accord.config.base import ACTOR_CRITIC, algorithm_phrase
from accord.config.schema import Config

logger = logging.getLogger(__name__)

# condition(cfg, single_turn) -> the phrase "under ..." / "with ..." when the rule's keys have no effect, else None
Condition = Callable[[Config, bool | None], str | None]


@dataclass(frozen=True)
class Rule:
    """Keys that have no effect under a condition.

    ``keys``: dotted keys, or a section's name for all of its keys; ``when``: the condition in words (the
    docs' table); ``where``: the condition itself, returning the phrase that names it in the message
    (``"under algorithm.name=magrpo"``) or None where the keys are read; ``why``: what the keys do where
    they are read; ``fix``: what to do. ``why`` and ``fix`` may be functions of the config."""

    keys: tuple[str, ...]
    when: str
    where: Condition
    why: str | Callable[[Config], str]
    fix: str | Callable[[Config], str]


# --- conditions --------------------------------------------------------------------------------------


def _stage(cfg: Config) -> str:
    """The algorithm whose update a step runs: marlhf's online RL stage (``reward_model.rl``), else the
    algorithm itself (as :func:`accord.trainer_steps.stage_of`)."""
    return cfg.reward_model.rl if cfg.algorithm.name == "marlhf" else cfg.algorithm.name


def _under(cfg: Config) -> str:
    """``under algorithm.name=X``, with marlhf's stage."""
    return f"under {algorithm_phrase(cfg)}"


def _single_turn(cfg: Config, single_turn: bool | None) -> bool:
    """Whether the task is known to be single-turn (marlhf runs only on single-turn tasks)."""
    return single_turn is True or cfg.algorithm.name == "marlhf"


def _on_single_turn(cfg: Config) -> str:
    return f"on the single-turn task {cfg.task.name!r}"


def _own_lrs(cfg: Config, _: bool | None) -> str | None:
    """``with every policy's own lr (...)`` where no optimizer reads ``training.lr``: every policy sets ``lr``, and
    no critic model (maac's, iac's separate ones) goes without ``critic.lr``."""
    if any(p.lr is None for p in cfg.policies.values()):
        return None
    critic_model = _stage(cfg) == "maac" or (_stage(cfg) == "iac" and cfg.critic.mode == "separate")
    if critic_model and cfg.critic.lr is None:
        return None
    own = ", ".join(f"policies.{n}.lr={_show(p.lr)}" for n, p in cfg.policies.items())
    return f"with every policy's own lr ({own})"


def _name_not(*names: str) -> Condition:
    return lambda cfg, _: None if cfg.algorithm.name in names else f"under algorithm.name={cfg.algorithm.name}"


def _name_in(*names: str) -> Condition:
    return lambda cfg, _: f"under algorithm.name={cfg.algorithm.name}" if cfg.algorithm.name in names else None


def _group_relative(cfg: Config) -> bool:
    """Whether a step computes MAGRPO's and AT-GRPO's group-relative advantages (trainer._policy_gradient)."""
    return _stage(cfg) in ("magrpo", "atgrpo")


# --- the rules -----------------------------------------------------------------------------------------

RULES: tuple[Rule, ...] = (
    # rollout/multiturn.py ATGRPORollout.collect is alpha's only reader
    Rule(("algorithm.alpha",), "algorithm.name is not atgrpo", _name_not("atgrpo"),
         "it weighs the team reward in AT-GRPO's candidate reward, alpha * team + local",
         "remove it or set algorithm.name=atgrpo"),
    Rule(("algorithm.alpha",), "algorithm.name=atgrpo with algorithm.baseline=independent",
         lambda cfg, _: "under algorithm.baseline=independent" if cfg.algorithm.name == "atgrpo"
         and cfg.algorithm.baseline == "independent" else None,
         "the independent baseline sets AT-GRPO's alpha to 0: each candidate earns its agent's local reward only",
         "remove it or set algorithm.baseline=none"),
    # read by the single-turn joint rollout and the MAGRPO tree, not by AT-GRPO's rollout (cross mode is an
    # error under iac, maac, madpo and marlhf)
    Rule(("algorithm.joint_mode",), "algorithm.name=atgrpo", _name_in("atgrpo"),
         "it pairs the agents' samples into MAGRPO's joint actions; AT-GRPO samples one agent's K candidates at "
         "a time from one state", "remove it or set algorithm.name=magrpo"),
    # read by rollout/magrpo.py JointRollout.check in cross mode, and by rules.joint_mode_for when it resolves
    # joint_mode: null for a task that declares cross (where K^N exceeds it, it may be why null became aligned:
    # no line then)
    Rule(("algorithm.max_cross_joint",), "algorithm.joint_mode=aligned",
         lambda cfg, _: "with algorithm.joint_mode=aligned" if cfg.algorithm.joint_mode == "aligned"
         and cfg.algorithm.num_generations ** max(len(cfg.agents), 2) <= cfg.algorithm.max_cross_joint else
         "under algorithm.name=atgrpo" if cfg.algorithm.joint_mode is None and cfg.algorithm.name == "atgrpo" else None,
         "it caps the K^N joint actions per instance of cross mode",
         lambda cfg: "remove it" if cfg.algorithm.name == "atgrpo" else "remove it or set algorithm.joint_mode=cross"),
    Rule(("algorithm.max_cross_joint",), "cross mode under atgrpo, or on a multi-turn task",
         lambda cfg, st: None if cfg.algorithm.joint_mode != "cross" else
         "under algorithm.name=atgrpo" if cfg.algorithm.name == "atgrpo" else
         f"on the multi-turn task {cfg.task.name!r}" if st is False else None,
         "it caps the joint actions of single-turn MAGRPO in cross mode; rollout.max_tree_generations caps a "
         "MAGRPO tree", "remove it"),
    # gamma: the MAGRPO tree's returns and iac's and maac's GAE (trainer_steps.advantages_and_targets)
    Rule(("algorithm.gamma",), "algorithm.name is atgrpo or madpo", _name_in("atgrpo", "madpo"),
         lambda cfg: "it discounts later turns in MAGRPO trees and in iac's and maac's GAE; " + (
             "AT-GRPO trains each candidate on its own step's reward" if cfg.algorithm.name == "atgrpo"
             else "madpo ranks candidates by their episodes' undiscounted team returns"), "remove it"),
    Rule(("algorithm.gamma",), "a single-turn task (marlhf's always are)",
         lambda cfg, st: _on_single_turn(cfg) if cfg.algorithm.name in ("magrpo", "iac", "maac", "marlhf")
         and _single_turn(cfg, st) else None,
         "an episode of a single-turn task is one step: there is no later turn to discount", "remove it"),
    Rule(("critic.gae_lambda",), "a single-turn task under iac or maac (marlhf's tasks are single-turn)",
         lambda cfg, st: _on_single_turn(cfg) if _stage(cfg) in ACTOR_CRITIC and _single_turn(cfg, st) else None,
         "an episode of a single-turn task is one step: GAE has no later advantage to weigh", "remove it"),
    # read by rollout/multiturn.py TreeRollout only: multi-turn magrpo
    Rule(("algorithm.early_stop_reward", "rollout.max_tree_generations"), "algorithm.name is not magrpo",
         _name_not("magrpo"), "it applies to multi-turn MAGRPO's tree of joint actions",
         "remove it or set algorithm.name=magrpo"),
    Rule(("algorithm.early_stop_reward", "rollout.max_tree_generations"), "magrpo on a single-turn task",
         lambda cfg, st: _on_single_turn(cfg) if cfg.algorithm.name == "magrpo" and st is True else None,
         "it applies to multi-turn MAGRPO's tree of joint actions; a single-turn task's joint actions are one "
         "turn", "remove it"),
    Rule(("rollout.max_turns", "rollout.history_turns"), "a single-turn task",
         lambda cfg, st: _on_single_turn(cfg) if _single_turn(cfg, st) else None,
         "a single-turn task is one turn, with no earlier exchange to keep", "remove it"),
    # read only when credit=counterfactual (rollout/magrpo.py, rollout/multiturn.py)
    Rule(("algorithm.credit_orderings",), "algorithm.credit=team",
         lambda cfg, _: "with algorithm.credit=team" if cfg.algorithm.credit == "team" else None,
         "it sets how many agent orderings counterfactual credit's Shapley value samples",
         "remove it or set algorithm.credit=counterfactual"),
    # read by build.build_env only for the centralized baseline
    Rule(("algorithm.parse_penalty",), "algorithm.baseline is not centralized",
         lambda cfg, _: None if cfg.algorithm.baseline == "centralized" else
         f"with algorithm.baseline={cfg.algorithm.baseline}",
         "it penalises the role sections of the centralized baseline's one completion that cannot be parsed",
         "remove it or set algorithm.baseline=centralized"),
    # trainer.Trainer._advantages: magrpo, atgrpo and marlhf's magrpo stage
    Rule(("algorithm.advantage", "algorithm.normalize_std", "algorithm.group_std", "algorithm.norm_scope"),
         "iac, maac and madpo (and marlhf with reward_model.rl iac or maac)",
         lambda cfg, _: None if _group_relative(cfg) else _under(cfg),
         lambda cfg: "it shapes the group-relative advantages of magrpo and atgrpo; this algorithm's advantages "
         "come from " + ("preference pairs" if cfg.algorithm.name == "madpo" else "its critics"), "remove it"),
    Rule(("rollout.max_extra_rounds",), "rollout.drop_flat_groups=false",
         lambda cfg, _: None if cfg.rollout.drop_flat_groups else "with rollout.drop_flat_groups=false",
         "it bounds the extra rounds of dynamic sampling",
         lambda cfg: "remove it or set rollout.drop_flat_groups=true" if _group_relative(cfg) else "remove it"),
    Rule(("algorithm.overlong.penalty",), "algorithm.overlong.window=0",
         lambda cfg, _: None if cfg.algorithm.overlong.window else "with algorithm.overlong.window=0",
         "it is the overlong penalty at the length cap, ramped in over the window before the cap",
         lambda cfg: "remove it or set algorithm.overlong.window above 0" if _group_relative(cfg) else "remove it"),
    # policies.Policy.update and critics.head_update: tis_cap only when tis is on; madpo calls neither
    Rule(("algorithm.tis_cap",), "algorithm.tis=off",
         lambda cfg, _: "with algorithm.tis=off" if cfg.algorithm.tis == "off" and cfg.algorithm.name != "madpo"
         else None,
         "it caps the importance weight of the sampler/learner mismatch correction",
         "remove it or set algorithm.tis=truncate (or mask)"),
    Rule(("algorithm.kl_estimator",), "algorithm.kl_coef=0",
         lambda cfg, _: "with algorithm.kl_coef=0" if cfg.algorithm.kl_coef == 0 and cfg.algorithm.name != "madpo"
         else None,
         "it picks the estimator of the KL penalty, which is off", "remove it or set algorithm.kl_coef above 0"),
    Rule(("algorithm.epsilon", "algorithm.epsilon_high", "algorithm.loss_agg", "algorithm.tis", "algorithm.tis_cap",
          "algorithm.kl_estimator"), "algorithm.name=madpo", _name_in("madpo"),
         "it shapes the clipped policy-gradient update; madpo's update is the joint DPO loss of preference.*",
         "remove it"),
    # the sections of other algorithms (trainer_steps.build_parts builds critics, pairs and reward models)
    Rule(("critic",), "algorithm.name is not iac or maac (nor marlhf with reward_model.rl iac or maac)",
         lambda cfg, _: None if _stage(cfg) in ACTOR_CRITIC else _under(cfg),
         "the critic section configures the critics of iac and maac",
         lambda cfg: "remove it or set reward_model.rl=iac or maac" if cfg.algorithm.name == "marlhf"
         else "remove it or set algorithm.name=iac or maac"),
    # trainer_steps.Critics builds a critic model from critic.model_kwargs only when critic.model names one; else
    # from its policy's model and that policy's model_kwargs (iac's heads sit on the policy itself)
    Rule(("critic.model_kwargs",), "iac or maac with critic.model=null",
         lambda cfg, _: "with critic.model=null" if _stage(cfg) in ACTOR_CRITIC and cfg.critic.model is None
         else None,
         "it sizes the critic model critic.model names; without one a critic is its policy's model, built with that "
         "policy's model_kwargs", "remove it or set critic.model (with critic.mode=separate under iac)"),
    Rule(("critic.max_tokens",), "iac's value heads (critic.mode head or null)",
         lambda cfg, _: f"with critic.mode={cfg.critic.mode or 'null'}"
         if _stage(cfg) == "iac" and cfg.critic.mode in (None, "head") else None,
         "it cuts the input of a separate critic model; iac's value heads read their policy's own prompt",
         "remove it or set critic.mode=separate"),
    # the policies' updates (and iac's value heads) split by micro_batch_tokens when it is set; the critic models
    # (critics.ScalarModel: iac's separate critics, maac's centralised one) and marlhf's reward model always by
    # micro_batch_size
    Rule(("training.micro_batch_size",), "training.micro_batch_tokens is set and no critic or reward model is "
         "trained (iac with critic.mode head or null, or neither iac, maac nor marlhf)",
         lambda cfg, _: "with training.micro_batch_tokens set"
         if cfg.training.micro_batch_tokens is not None and cfg.algorithm.name != "marlhf"
         and not (_stage(cfg) == "maac" or (_stage(cfg) == "iac" and cfg.critic.mode == "separate")) else None,
         "it sizes the update's micro-batches, which micro_batch_tokens packs by tokens instead; critic models "
         "and marlhf's reward model still read it", "remove it or set training.micro_batch_tokens=null"),
    # policies.learner.optimizer_step reads it in ModelPolicy.update only: madpo's joint DPO step
    # (critics.weighted_logprob_update) and iac's head update (critics.head_update) step unconditionally
    Rule(("training.skip_zero_grad",), "madpo, or iac's value heads (critic.mode head or null)",
         lambda cfg, _: _under(cfg) if cfg.algorithm.name == "madpo" else (
             f"with critic.mode={cfg.critic.mode or 'null'}"
             if _stage(cfg) == "iac" and cfg.critic.mode in (None, "head") else None),
         "it skips the policy-gradient update's optimizer step on an exactly zero gradient; the joint DPO step and "
         "a value head's joint update (whose value loss has a gradient) always step",
         "remove it"),
    Rule(("preference",), "algorithm.name is not madpo or marlhf", _name_not("madpo", "marlhf"),
         "the preference section configures madpo's pairs and joint DPO loss, and the pairs marlhf's reward model "
         "learns from", "remove it or set algorithm.name=madpo"),
    Rule(("preference.beta", "preference.reference_free", "preference.rounds_every"), "algorithm.name=marlhf",
         _name_in("marlhf"), "it configures madpo's joint DPO loss and its rounds; marlhf takes only the selection "
         "of its reward model's pairs from the preference section", "remove it or set algorithm.name=madpo"),
    Rule(("preference.pair_selection", "preference.max_pairs_per_prompt", "preference.min_gap"),
         "marlhf with reward_model.path or reward_model.preferences",
         lambda cfg, _: None if cfg.algorithm.name != "marlhf" else "with reward_model.path set"
         if cfg.reward_model.path else "with reward_model.preferences set" if cfg.reward_model.preferences else None,
         "it selects the reward model's pairs from rollouts of the initial policies, which a trained reward model "
         "or a preference file replaces", "remove it"),
    Rule(("reward_model",), "algorithm.name is not marlhf", _name_not("marlhf"),
         "the reward_model section configures marlhf's joint reward model", "remove it or set algorithm.name=marlhf"),
    Rule(("reward_model.model", "reward_model.model_kwargs", "reward_model.preferences", "reward_model.prompts",
          "reward_model.eval_frac", "reward_model.epochs", "reward_model.batch_size", "reward_model.lr"),
         "marlhf with reward_model.path",
         lambda cfg, _: "with reward_model.path set" if cfg.algorithm.name == "marlhf" and cfg.reward_model.path
         else None,
         "it configures stage 1, which trains a reward model; reward_model.path loads a trained one instead",
         "remove it or set reward_model.path=null"),
    # trainer_steps.RewardModel: reward_model.model_kwargs only with reward_model.model, else the first policy's
    Rule(("reward_model.model_kwargs",), "marlhf with reward_model.model=null",
         lambda cfg, _: "with reward_model.model=null" if cfg.algorithm.name == "marlhf" and not cfg.reward_model.path
         and cfg.reward_model.model is None else None,
         "it sizes the backbone reward_model.model names; without one the reward model is the first policy's model, "
         "built with that policy's model_kwargs", "remove it or set reward_model.model"),
    Rule(("reward_model.prompts",), "marlhf with reward_model.preferences (and no path)",
         lambda cfg, _: "with reward_model.preferences set" if cfg.algorithm.name == "marlhf"
         and cfg.reward_model.preferences and not cfg.reward_model.path else None,
         "it sets how many training instances give stage 1's pairs from rollouts, which the preference file "
         "replaces", "remove it or set reward_model.preferences=null"),
    Rule(("lora",), "specialization is not lora",
         lambda cfg, _: None if cfg.specialization == "lora" else f"with specialization={cfg.specialization}",
         "the lora section configures the adapters of specialization=lora", "remove it or set specialization=lora"),
    # generation.backends builds the vLLM engine from them; devices.check_vllm_devices and plan read them only
    # under generation_backend=vllm (``plan_vllm``: accord plan of a vLLM config where vLLM is not installed,
    # built with the hf backend and planned as vLLM)
    Rule(("rollout.vllm_gpu_memory_utilization", "rollout.vllm_kwargs", "rollout.vllm_sleep"),
         "rollout.generation_backend is not vllm",
         lambda cfg, _: None if cfg.rollout.generation_backend == "vllm" or getattr(cfg, "plan_vllm", False)
         else f"with rollout.generation_backend={cfg.rollout.generation_backend}",
         "it configures the vLLM engine that generation_backend=vllm samples with",
         "remove it or set rollout.generation_backend=vllm"),
    # build.build_policies starts a RayBackend only under run.backend=ray; plan places actors only then
    Rule(("ray",), "run.backend is not ray",
         lambda cfg, _: None if cfg.run.backend == "ray" else f"with run.backend={cfg.run.backend}",
         "the ray section configures the cluster and the policy actors of run.backend=ray",
         "remove it or set run.backend=ray"),
    # distributed/ray_backend.py reads them when it places a policy's actor; plan likewise under ray only
    Rule(("policies.*.num_cpus", "policies.*.num_gpus"), "run.backend is not ray",
         lambda cfg, _: None if cfg.run.backend == "ray" else f"with run.backend={cfg.run.backend}",
         "it is what the policy's Ray actor reserves under run.backend=ray", "remove it or set run.backend=ray"),
    # policies.model (make_adamw: the policy's lr or training.lr), critics (head: critic.lr, its policy's lr or
    # training.lr; a critic model, maac's or iac's separate ones: critic.lr or training.lr)
    Rule(("training.lr",), "every policy sets its own lr (and no critic model falls back on training.lr)", _own_lrs,
         "it is the learning rate of a policy (or critic model) that sets none",
         lambda cfg: "remove it or set " + " / ".join(f"policies.{n}.lr" for n in cfg.policies) + " instead"),
    # tracking.wandb: the wandb sink alone reads them
    Rule(("logging.wandb_project", "logging.wandb_entity"), "logging.report_to has no wandb",
         lambda cfg, _: None if "wandb" in cfg.logging.report_to else "without wandb in logging.report_to",
         "it names the W&B project or entity of the wandb sink", "remove it or add wandb to logging.report_to"),
    # trainer.evaluate plays task.eval_size held-out instances; with none, run.eval_every has none to play
    Rule(("run.eval_every",), "task.eval_size=0",
         lambda cfg, _: "with task.eval_size=0" if cfg.task.eval_size == 0 else None,
         "it evaluates on the task.eval_size held-out instances every N steps",
         "remove it or set task.eval_size to a number of held-out instances"),
    # tracking.mlflow: the mlflow sink alone reads them
    Rule(("logging.mlflow_tracking_uri", "logging.mlflow_experiment"), "logging.report_to has no mlflow",
         lambda cfg, _: None if "mlflow" in cfg.logging.report_to else "without mlflow in logging.report_to",
         "it names the MLflow server or experiment of the mlflow sink", "remove it or add mlflow to logging.report_to"),
    # compare.run_one: _eval_settings reads them only for eval=sampled (settings_of stores their defaults)
    Rule(("compare.eval_samples", "compare.eval_temperature"), "compare.eval=greedy",
         lambda cfg, _: "with compare.eval=greedy" if cfg.compare.eval == "greedy" else None,
         "they set accord compare's sampled evaluation; greedy plays one episode per instance",
         "remove it or set compare.eval=sampled"),
)


# --- the settings a config changed ------------------------------------------------------------------


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING


def _expand(cfg: Config, key: str) -> list[str]:
    """A dotted key, or every key of a section (nested sections included); ``policies.*.KEY``: KEY of each
    policy."""
    if key.startswith("policies.*."):
        return [k for name in cfg.policies for k in _expand(cfg, f"policies.{name}.{key[len('policies.*.'):]}")]
    node: Any = cfg
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    if not dataclasses.is_dataclass(node):
        return [key]
    return [k for f in dataclasses.fields(node) for k in _expand(cfg, f"{key}.{f.name}")]


def _changed(cfg: Config, key: str) -> tuple[bool, Any]:
    """(whether ``key`` differs from its dataclass default, its value)."""
    node: Any = cfg
    default: Any = None
    for part in key.split("."):
        if isinstance(node, dict):   # a mapping of sections (policies): its entries have no default of their own
            node = node[part]
            continue
        default = _default(next(f for f in dataclasses.fields(node) if f.name == part))
        node = getattr(node, part)
    return node != default, node


def _show(value: Any) -> str:
    """A value as one would write it in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _text(text: str | Callable[[Config], str], cfg: Config) -> str:
    return text(cfg) if callable(text) else text


def ignored_settings(cfg: Config, single_turn: bool | None = None) -> list[str]:
    """One line per key ``cfg`` sets to a value other than its default although the run does not read it
    (the rules of :data:`RULES`). ``single_turn``: whether the task is single-turn (None: unknown, the rules
    that depend on it are skipped)."""
    out: list[str] = []
    for rule in RULES:
        where = rule.where(cfg, single_turn)
        if where is None:
            continue
        for key in (k for group in rule.keys for k in _expand(cfg, group)):
            changed, value = _changed(cfg, key)
            if changed:
                out.append(f"{key}={_show(value)} has no effect {where} ({_text(rule.why, cfg)}); "
                           f"{_text(rule.fix, cfg)}")
    return out


_warned: set[str] = set()


def warn_ignored(cfg: Config, single_turn: bool | None = None) -> list[str]:
    """Log :func:`ignored_settings` as warnings, each distinct line once per process; returns them all."""
    lines = ignored_settings(cfg, single_turn)
    for line in lines:
        if line not in _warned:
            _warned.add(line)
            logger.warning("%s", line)
    return lines


def rules_table() -> list[tuple[str, str]]:
    """(keys, when they have no effect) of every rule, for the config reference."""
    return [(", ".join(f"`{k.replace('policies.*.', 'policies.<name>.')}`" if "." in k else f"`{k}.*`"
                       for k in rule.keys), rule.when) for rule in RULES]
