"""The names of the metrics a run logs, in one place.

A metric name is a path of ``/``-separated parts: a family (``team``, ``agent``, ``eval``, ``loss`` ...),
then, in the per-agent, per-policy, per-critic and per-turn families, whose value it is, then what is
measured: ``team/reward``, ``agent/alice/completion_len``, ``loss/main/pg``, ``critic/main/value_loss``.
The held-out evaluation logs its values under ``eval/`` (``eval/team/reward``). docs/metrics.md says what
each one means.

The trainer, the policies and critics, the rollouts and the evaluation make the names with the constants
and builders of this module; the report (:mod:`accord.report`), the console's closing lines
(:mod:`accord.tracking.console`) and ``accord compare`` read them back with the same constants and with the
patterns at the end. The names are part of every run's ``metrics.jsonl``: a name changed here is changed in
the runs written afterwards, and the report of an older run no longer finds it.

This module imports nothing from accord, so that every layer can use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

SEP = "/"

# --------------------------------------------------------------------------- families (the first part)

TEAM = "team"            # the team's reward, return and success
AGENT = "agent"          # one agent's values: agent/<agent>/<what>
EVAL = "eval"            # the held-out evaluation: eval/<a training name>
REWARD = "reward"        # the team reward's named parts: reward/<part>
TURN = "turn"            # multi-turn: turn/<t>/reward
EPISODE = "episode"      # multi-turn: episode/turns
ADV = "adv"              # advantages
LOSS = "loss"            # one policy's update: loss/<policy>/<stat>
CRITIC = "critic"        # one critic (iac, maac): critic/<critic>/<what>
PREF = "pref"            # madpo's preference pairs and joint DPO loss
RM = "rm"                # marlhf's reward model
CREDIT = "credit"        # counterfactual credit (algorithm.credit)
ROLLOUT = "rollout"      # the rollout's controls (dynamic sampling, overlong shaping)
SCHEDULE = "schedule"    # algorithm.alternate_every
AUDIT = "audit"          # training.audit
TIME = "time"            # seconds per phase: time/<phase>
PERF = "perf"            # throughput
MEM = "mem"              # memory high-water marks
SFT = "sft"              # accord sft


def _join(*parts: object) -> str:
    return SEP.join(str(p) for p in parts)


# --------------------------------------------------------------------------- the team

TEAM_REWARD = _join(TEAM, "reward")
"""Mean team reward of the step's joint actions (multi-turn: of its turns)."""
TEAM_REWARD_BEST = _join(TEAM, "reward_best")
"""Mean over the step's instances of the best joint action's team reward."""
TEAM_RETURN = _join(TEAM, "return")
"""Multi-turn: the episodes' team return."""
TEAM_SUCCESS = _join(TEAM, "success")
"""The share of episodes that succeed (tasks with a success check)."""
EPISODE_TURNS = _join(EPISODE, "turns")
"""Multi-turn: episode length in turns."""


def turn_key(turn: int, what: str = "reward") -> str:
    """``turn/<turn>/<what>``: multi-turn, the mean reward of turn ``turn`` (counted from 0)."""
    return _join(TURN, turn, what)


def component_key(part: str) -> str:
    """``reward/<part>``: a named part of the team reward (tasks with ``reward_components``)."""
    return _join(REWARD, part)


# --------------------------------------------------------------------------- each agent: agent/<agent>/<what>

AGENT_REWARD = "reward"                  # the mean return credited to the agent's samples
AGENT_COMPLETION_LEN = "completion_len"  # completion length in tokens
AGENT_STOP_FRAC = "stop_frac"            # the share of completions ending with EOS
AGENT_TEAM_REWARD = "team_reward"        # AT-GRPO: the team term of the candidates' rewards
AGENT_LOCAL_REWARD = "local_reward"      # AT-GRPO: the agent's own term
AGENT_LOCAL_RETURN = "local_return"      # a played episode's record: the agent's own return
AGENT_RETURN = "return"                  # eval/agent/<agent>/return: the held-out episodes' local return


def agent_key(agent: str, what: str) -> str:
    """``agent/<agent>/<what>``, e.g. ``agent_key("alice", AGENT_COMPLETION_LEN)``."""
    return _join(AGENT, agent, what)


# --------------------------------------------------------------------------- the held-out evaluation

EVAL_PREFIX = EVAL + SEP


def eval_key(key: str) -> str:
    """The name of a training metric's held-out counterpart: ``eval/<key>`` (``eval/team/reward``)."""
    return EVAL_PREFIX + key


EVAL_TEAM_REWARD = eval_key(TEAM_REWARD)
"""Held-out team reward (multi-turn: the episode's team return)."""
EVAL_SUCCESS = eval_key("success")
"""Held-out success rate."""
EVAL_TURNS = eval_key("turns")
"""Multi-turn: held-out episode length in turns."""


def played_eval_key(field: str) -> str:
    """The metric of the evaluation during training that a field of a played record becomes (the records of
    :meth:`accord.rollout.base.Rollout.play`): ``team`` -> ``eval/team/reward``, ``success`` ->
    ``eval/success``, ``turns`` -> ``eval/turns``, ``agent/<a>/local_return`` -> ``eval/agent/<a>/return``,
    any other field ``f`` -> ``eval/f``."""
    local = SEP + AGENT_LOCAL_RETURN
    if field.endswith(local):
        return eval_key(field[:-len(local)] + SEP + AGENT_RETURN)
    return {"team": EVAL_TEAM_REWARD, "success": EVAL_SUCCESS, "turns": EVAL_TURNS}.get(field, eval_key(field))


def mode_key(mode: str, field: str) -> str:
    """``accord eval``: ``<mode>/<field>``, the mean of a played field greedy or sampled (``greedy/team``)."""
    return _join(mode, field)


def pass_at_key(k: int) -> str:
    """``accord eval``: ``pass@<k>``, the unbiased share of instances with a success among k samples."""
    return f"pass@{k}"


# --------------------------------------------------------------------------- advantages and the rollout's controls

ADV_ABS_MEAN = _join(ADV, "abs_mean")
"""Mean absolute advantage."""
ADV_ZERO_STD_FRAC = _join(ADV, "zero_std_frac")
"""The share of advantage groups whose returns are all equal (no learning signal)."""
ROLLOUT_FLAT_GROUPS_DROPPED = _join(ROLLOUT, "flat_groups_dropped")
ROLLOUT_EXTRA_ROUNDS = _join(ROLLOUT, "extra_rounds")
ROLLOUT_INFORMATIVE_GROUPS = _join(ROLLOUT, "informative_groups")
ROLLOUT_OVERLONG_PENALTY = _join(ROLLOUT, "overlong_penalty")
ROLLOUT_TRUNCATED_MASKED = _join(ROLLOUT, "truncated_masked")
ROLLOUT_HISTORY_CUT = _join(ROLLOUT, "history_cut")
"""Earlier (user, assistant) exchanges left out of the step's prompts to fit rollout.max_prompt_tokens."""
SCHEDULE_ACTIVE_AGENT = _join(SCHEDULE, "active_agent")
"""algorithm.alternate_every: the index of the agent that trains this step."""

# --------------------------------------------------------------------------- a policy's update: loss/<policy>/<stat>

PG = "pg"                # the surrogate loss
KL = "kl"                # the KL estimate to the reference
ENTROPY = "entropy"      # sampling entropy per token
CLIP_FRAC = "clip_frac"  # the clipped share of tokens
RATIO = "ratio"          # the importance ratio
LOGP_DIFF = "logp_diff"  # |stored - recomputed| log-prob
GRAD_NORM = "grad_norm"  # the gradient norm before clipping
LR = "lr"                # the learning rate
SKIPPED_STEPS = "skipped_steps"  # optimizer steps not taken because the gradient was exactly zero
TIS_WEIGHT = "tis_weight"    # the mismatch correction's mean token weight
TIS_CAPPED = "tis_capped"    # the share of tokens whose weight was capped
MISMATCH_KL = "mismatch_kl"  # a k3 estimate of KL(sampler || learner)


def loss_key(policy: str, stat: str) -> str:
    """``loss/<policy>/<stat>``, e.g. ``loss_key("main", PG)``."""
    return _join(LOSS, policy, stat)


def update_key(policy: str, stat: str) -> str:
    """Where a statistic of a policy's update goes: a memory value (``mem/...``) under its own name, any other
    under ``loss/<policy>/<stat>``."""
    return stat if stat.startswith(MEM + SEP) else loss_key(policy, stat)


# --------------------------------------------------------------------------- critics: critic/<critic>/<what>

VALUE_LOSS = "value_loss"
VALUE_CLIP_FRAC = "value_clip_frac"
VALUE_MEAN = "value_mean"
EXPLAINED_VARIANCE = "explained_variance"
TRUNCATED_FRAC = "truncated_frac"        # the share of inputs cut to the critic's context


def critic_key(critic: str, what: str) -> str:
    """``critic/<critic>/<what>``, e.g. ``critic_key("main", VALUE_LOSS)``."""
    return _join(CRITIC, critic, what)


# --------------------------------------------------------------------------- madpo's pairs, marlhf's reward model

PREF_PAIRS = _join(PREF, "pairs")
PREF_PROMPTS_WITH_PAIRS = _join(PREF, "prompts_with_pairs")
PREF_REWARD_GAP = _join(PREF, "reward_gap")
PREF_SKIPPED = _join(PREF, "skipped")
PREF_LOSS = _join(PREF, "loss")
PREF_ACCURACY = _join(PREF, "accuracy")
PREF_MARGIN = _join(PREF, "margin")
PREF_ROUND_STEP = _join(PREF, "round_step")
RM_PAIRS = _join(RM, "pairs")
RM_TRUNCATED_FRAC = _join(RM, TRUNCATED_FRAC)
RM_LOSS = _join(RM, "loss")
RM_TRAIN_ACCURACY = _join(RM, "train_accuracy")
RM_ACCURACY = _join(RM, "accuracy")
RM_ACCURACY_PAIRS = _join(RM, "accuracy_pairs")
RM_REWARD = _join(RM, "reward")
"""marlhf: the mean reward model score of the step's joint actions (the reward RL trains on)."""

# --------------------------------------------------------------------------- counterfactual credit and the audit

CREDIT_EVALUATIONS = _join(CREDIT, "evaluations")
CREDIT_INTERACTION_SHARE = _join(CREDIT, "interaction_share")
CREDIT_SKIPPED_GROUPS = _join(CREDIT, "skipped_groups")


CREDIT_MEAN = "mean"                      # credit/<agent>/mean: the agent's mean credit
CREDIT_VARIANCE_SHARE = "variance_share"  # its share of the team reward's variance
CREDIT_FREE_RIDER = "free_rider"          # 1 - (agents x that share), in [0, 1]


def credit_key(agent: str, what: str) -> str:
    """``credit/<agent>/<what>``, e.g. ``credit_key("alice", CREDIT_MEAN)``."""
    return _join(CREDIT, agent, what)


AUDIT_VIOLATIONS = _join(AUDIT, "violations")
AUDIT_SINGLETON_GROUP_SHARE = _join(AUDIT, "singleton_group_share")
AUDIT_ALL_EQUAL_GROUP_SHARE = _join(AUDIT, "all_equal_group_share")

# --------------------------------------------------------------------------- time, throughput, memory


def time_key(phase: str) -> str:
    """``time/<phase>``: seconds spent in a phase of the step (``gen``, ``reward``, ``adv``, ``update`` ...)."""
    return _join(TIME, phase)


TIME_STEP = time_key("step")
TIME_GEN = time_key("gen")
TIME_ROLLOUT = time_key("rollout")
TIME_EVAL = time_key("eval")
TIME_CHECKPOINT = time_key("checkpoint")
TIME_EVAL_S = time_key("eval_s")         # accord eval: seconds of the whole evaluation
PERF_GEN_TOKENS_PER_S = _join(PERF, "gen_tokens_per_s")
PERF_COMPLETIONS_PER_S = _join(PERF, "completions_per_s")
PERF_SAMPLES = _join(PERF, "samples")
PERF_GEN_TOKENS = _join(PERF, "gen_tokens")
PERF_TOKENS = _join(PERF, "tokens")                  # accord sft: trained tokens of the step
PERF_TOKENS_PER_S = _join(PERF, "tokens_per_s")      # accord sft
MEM_PEAK_RSS_MB = _join(MEM, "peak_rss_mb")
MEM_RSS_MB = _join(MEM, "rss_mb")
MEM_PEAK_IS_PER_STEP = _join(MEM, "peak_is_per_step")
MEM_CUDA_PEAK_MB = _join(MEM, "cuda_peak_mb")
CUDA_PEAK_MB = "cuda_peak_mb"
CUDA_RESERVED_PEAK_MB = "cuda_reserved_peak_mb"


def mem_key(policy: str, what: str) -> str:
    """``mem/<policy>/<what>``: a policy's own memory high-water mark (``cuda_peak_mb``)."""
    return _join(MEM, policy, what)


# --------------------------------------------------------------------------- accord sft


def sft_key(key: str) -> str:
    """``sft/<key>``: the warm start's metrics (``sft/<policy>/eval_nll``, ``sft/eval/team/reward``)."""
    return _join(SFT, key)


def sft_policy_key(policy: str, what: str) -> str:
    """``sft/<policy>/<what>``: one policy's fine-tuning (``loss``, ``grad_norm``, ``eval_nll``)."""
    return sft_key(_join(policy, what))


SFT_EVAL_PREFIX = sft_key(EVAL_PREFIX)
EVAL_NLL = "eval_nll"   # sft/<policy>/eval_nll: held-out negative log-likelihood per token

# --------------------------------------------------------------------------- patterns, for reading names back

_NAME = r"[^/]+"


def agent_pattern(what: str | None = None, *, held_out: bool = False) -> re.Pattern[str]:
    """``agent/<agent>/<what>`` (``eval/agent/...`` when ``held_out``); group 1 (``agent``) is the agent and,
    without ``what``, group 2 (``metric``) what is measured."""
    metric = re.escape(what) if what is not None else ".+"
    prefix = re.escape(EVAL_PREFIX) if held_out else ""
    return re.compile(rf"^{prefix}{AGENT}/(?P<agent>{_NAME})/(?P<metric>{metric})$")


def loss_pattern(stats: Iterable[str]) -> re.Pattern[str]:
    """``loss/<policy>/<stat>`` for the given stats; group 1 is the policy, group 2 the stat."""
    return re.compile(rf"^{LOSS}/(.+)/({'|'.join(re.escape(s) for s in stats)})$")


COMPONENT_PATTERN = re.compile(rf"^({re.escape(EVAL_PREFIX)})?{REWARD}/(.+)$")
"""A reward part, training or held-out; group 2 is the part."""
TIME_PATTERN = re.compile(rf"^{TIME}/(.+)$")
"""Seconds of a phase; group 1 is the phase."""
LEARNED_PATTERN = re.compile(rf"^({CRITIC}|{PREF}|{RM})/")
"""What the learned parts report: critics, madpo's pairs, marlhf's reward model."""
