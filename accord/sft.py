"""``accord sft CONFIG``: a warm start -- supervised fine-tuning of each policy on demonstrations.

Demonstrations are (agent, chat prompt, completion) triples from one of two sources:

- **the task's oracle** (:mod:`accord.envs.oracles`; default). Multi-turn environments are played
  episode by episode exactly as evaluation plays them (:func:`accord.rollout.multiturn.play_episodes`:
  agents in turn order, ``rollout.max_turns`` and ``rollout.history_turns``), with the oracle's answer
  as every agent's action; each agent's prompt is built by the rollout's own
  :meth:`~accord.rollout.multiturn.Episode.messages` and encoded by the policy's own
  :meth:`~accord.policies.model.ModelPolicy.encode_chat`, so SFT trains on the very token ids RL will show.
  Single-turn tasks give ``task.prompt(agent, row)`` per instance. A share ``sft.noise`` of the
  training answers is deliberately imperfect (suboptimal or wrong, see the oracles' docstring), so RL
  has room to improve; the episode goes on from the state the imperfect answer leaves, so later
  turns demonstrate recovery. Held-out demonstrations come, noise-free, from the task's eval split.
- **a JSONL file** (``sft.data``): one ``{"agent", "prompt", "completion"}`` object per line; the prompt
  is a list of chat messages (used as given) or a string (the user message, after the system message
  the environment gives that agent, as in a first-turn rollout prompt). Unknown agents, empty
  completions, missing or unknown keys and lines that are not JSON are errors naming the line.

The update is accord's own (not TRL's ``SFTTrainer``): the masked negative log-likelihood of the
completion tokens (the completion text, then the EOS token generation stops on), averaged over the
batch's tokens, at temperature 1, through each policy's model, AdamW, gradient clipping, micro-batches
and bf16 setting of the ``training`` section. The reasons: the prompts must be the rollout's token ids
(our chat messages, our ``encode_chat``, our truncation checks), every specialisation's policies
(``separate`` with different tokenizers included) are already built by accord, and the result must
load back as an accord policy -- TRL would need its own dataset formatting and model wrapping for
each of these. ``trl`` is not installed in accord's environment either.

Output, under ``sft.output_dir`` (default ``RUN_DIR/sft``): one Hugging Face model directory per policy
(``<policy>/``, written by :meth:`ModelPolicy.export`), ``demos.jsonl`` (the training demonstrations, in the
JSONL input format plus ``where`` and ``noisy``), ``metrics.jsonl`` and ``config.yaml``, written into the sibling
``.<name>.partial`` and renamed into place when complete (an existing non-empty one is never overwritten). The
unfinished one is checkpointed every ``sft.checkpoint_every`` steps and at a Ctrl-C (which finishes the step in
progress first; a second Ctrl-C stops at once); the same command run again goes on from its newest checkpoint
with the same result as an uninterrupted run, and other settings or demonstrations are refused there. An RL run
starts from it by naming the directory as the policy's model: ``policies.<name>.model=RUN_DIR/sft/<name>``
(with ``model_kwargs={}`` for tiny models, whose options are in the saved config). Under
``specialization: lora`` the policies share one base model: SFT trains that base (full weights) on
every agent's demonstrations and writes it to ``base/``; every policy of the RL run names it, and its
adapters start from zero over the warm-started base.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from accord import metric_names as mn
from accord.config import Config, ConfigError, save_config
from accord.data import DataFileError, demo_file_problem, json_lines
from accord.envs.oracles import oracle_for
from accord.envs.protocol import Messages, is_env, step_env
from accord.generation.hf import left_pad
from accord.policies.model import ModelPolicy
from accord.policies.protocol import PromptTooLongError
from accord.rollout.multiturn import start_episodes
from accord.seeding import epoch_order_seed, eval_seed, held_out_demo_seed, policy_seed, setup_process

logger = logging.getLogger(__name__)

KEYS = ("agent", "prompt", "completion")
ROLES = ("system", "user", "assistant")


class DemoError(ConfigError):
    """A demonstration is unusable (bad line of a JSONL file, unknown agent, too long); the message says
    where and how to fix it."""


@dataclass
class Demo:
    """One demonstration: ``agent`` answers ``messages`` with ``completion``."""

    agent: str
    messages: Messages
    completion: str
    where: str            # "demos.jsonl line 3" or "oracle planpath-1a2b3c turn 1"
    noisy: bool = False

    def to_json(self) -> dict:
        return {"agent": self.agent, "prompt": self.messages, "completion": self.completion, "where": self.where,
                "noisy": self.noisy}


# --- demonstrations from the oracle -----------------------------------------------------------------------

def oracle_demos(cfg: Config, make_task, rows: list[dict], *, noise: float, seed: int) -> list[Demo]:
    """The oracle's demonstrations on ``rows`` (a share ``noise`` of the answers imperfect)."""
    task = make_task()
    oracle = oracle_for(task)
    if oracle is None:
        raise ConfigError(f"task {task.name!r} has no oracle (oracles: planpath, sudoku, sokoban, code, humaneval, "
                          "handoff); "
                          "give demonstrations as a JSONL file with sft.data=FILE.jsonl")
    rng = random.Random(seed)
    out: list[Demo] = []
    stopped = 0
    if not is_env(task):
        for row in rows:
            for agent in task.agents:
                noisy = rng.random() < noise
                text = oracle(task, agent, row, rng, noisy)
                if text is None:
                    stopped += 1
                    continue
                out.append(Demo(agent, task.prompt(agent, row), text, f"oracle {row.get('id')}", noisy))
    else:
        turns = cfg.rollout.max_turns or task.max_turns
        history = cfg.rollout.history_turns
        episodes = start_episodes(make_task, rows, seed)
        live = [True] * len(episodes)
        # the loop of play_episodes, with the oracle in place of the policies
        for t in range(turns):
            groups = [task.agents] if task.simultaneous else [(a,) for a in task.agents]
            for acting in groups:
                for b, ep in enumerate(episodes):
                    if ep.done or not live[b]:
                        continue
                    actions, demos = {}, []
                    for a in acting:
                        noisy = rng.random() < noise
                        text = oracle(ep.env, a, rows[b], rng, noisy)
                        if text is None:   # no answer from here (e.g. a box pushed into a corner): stop
                            break
                        actions[a] = text
                        demos.append(Demo(a, ep.messages(a, history), text,
                                          f"oracle {rows[b].get('id')} turn {t + 1}", noisy))
                    if len(actions) < len(acting):
                        live[b] = False
                        stopped += 1
                        continue
                    out.extend(demos)
                    ep.apply(actions, step_env(ep.env, actions))
            for ep in episodes:
                ep.turn += 1
    if stopped:
        logger.info("sft: the oracle had no answer in %d states (e.g. after an imperfect answer made the puzzle "
                    "unsolvable, or a problem without a canonical solution); those episodes stop there", stopped)
    return out


# --- demonstrations from a file ---------------------------------------------------------------------------

def read_demos(path: str | os.PathLike, agents: tuple[str, ...], system: dict[str, str] | None = None) -> list[Demo]:
    """Demonstrations of a JSONL file; every problem is a :class:`DemoError` naming its line.

    ``system``: agent -> the system message put before a string prompt (None: the string is the only
    message)."""
    p = Path(path)
    problem = demo_file_problem(p)
    if problem:
        raise DemoError(problem)
    out = []
    try:
        lines = json_lines(p, "demonstrations file")
    except DataFileError as err:
        raise DemoError(f"{err}; each line is one object {{\"agent\": ..., \"prompt\": ..., \"completion\": ...}}"
                        ) from err
    for n, item in lines:
        where = f"{p} line {n}"
        if not isinstance(item, dict):
            raise DemoError(f"{where}: a line must be a JSON object with keys {list(KEYS)}, got {type(item).__name__}")
        missing = [k for k in KEYS if k not in item]
        extra = sorted(set(item) - set(KEYS) - {"where", "noisy"})
        if missing or extra:
            raise DemoError(f"{where}: " + (f"missing key(s) {missing}" if missing else f"unknown key(s) {extra}")
                            + f"; a demonstration has exactly the keys {list(KEYS)}")
        agent, prompt, completion = item["agent"], item["prompt"], item["completion"]
        if agent not in agents:
            raise DemoError(f"{where}: unknown agent {agent!r}; the task's agents are {list(agents)}")
        if not isinstance(completion, str):
            raise DemoError(f"{where}: the completion for agent {agent!r} must be a string, not "
                            f"{type(completion).__name__}; give the answer text the agent should write")
        if not completion.strip():
            raise DemoError(f"{where}: empty completion for agent {agent!r}; give the answer text the agent should "
                            "write (or remove the line)")
        out.append(Demo(agent, _messages(prompt, agent, where, system), completion, where))
    if not out:
        raise DemoError(f"{p} holds no demonstrations; add one JSON object per line")
    return out


def _messages(prompt: Any, agent: str, where: str, system: dict[str, str] | None) -> Messages:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DemoError(f"{where}: empty prompt; give the observation text or a list of chat messages")
        head = [{"role": "system", "content": system[agent]}] if system else []
        return head + [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise DemoError(f"{where}: prompt must be a string or a non-empty list of chat messages "
                        '[{"role": "system"|"user"|"assistant", "content": "..."}]')
    for m in prompt:
        if not (isinstance(m, dict) and set(m) == {"role", "content"} and m["role"] in ROLES
                and isinstance(m["content"], str)):
            raise DemoError(f"{where}: chat message {m!r} must be {{\"role\": one of {list(ROLES)}, \"content\": "
                            "\"text\"}")
    if prompt[-1]["role"] != "user":
        raise DemoError(f"{where}: the prompt's last message must be the user's (the completion answers it), "
                        f"got {prompt[-1]['role']!r}")
    return [dict(m) for m in prompt]


def write_demos(demos: list[Demo], path: str | os.PathLike) -> None:
    """Write ``demos`` as JSONL to a new file ``path`` (an existing file is a :class:`DemoError`: it may be
    someone's demonstrations)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        f = open(path, "x", encoding="utf-8")
    except FileExistsError as err:
        raise DemoError(f"{path} already exists; give a new path for the demonstrations (or delete it)") from err
    try:
        with f:
            f.write(_demos_text(demos))
    except OSError:   # a full disk: no cut file left that the next try would refuse as existing
        Path(path).unlink(missing_ok=True)
        raise


def held_out_rows(cfg: Config) -> list[dict]:
    """The ``sft.eval_size`` eval-split instances the oracle's held-out demonstrations come from."""
    from accord.build import build_task

    task = build_task(cfg)
    split = task.tasks if is_env(task) else task.rows
    return split("eval", limit=cfg.sft.eval_size, seed=cfg.run.seed)


def collect_demos(cfg: Config) -> tuple[list[Demo], list[Demo]]:
    """(training, held-out) demonstrations as ``cfg.sft`` says; the task's agents resolved into ``cfg``."""
    from accord.build import build_task

    task = build_task(cfg)
    cfg.resolve_agents(tuple(task.agents))
    s, seed = cfg.sft, cfg.run.seed
    make = lambda: build_task(cfg)  # noqa: E731  (a fresh environment per episode, as the rollout makes them)
    if s.data is None:
        if s.eval_data is not None:
            raise DemoError(f"sft.eval_data={s.eval_data} is read only with sft.data (demonstrations from a file); "
                            "with the task's oracle the held-out demonstrations are its noise-free answers on "
                            "sft.eval_size eval instances: drop sft.eval_data, or give sft.data too")
        split = task.tasks if is_env(task) else task.rows
        rows = split("train", limit=s.instances, seed=seed)
        held = split("eval", limit=s.eval_size, seed=seed) if s.eval_size else []
        for key, asked, got, which in (("instances", s.instances, len(rows), "train"),
                                       ("eval_size", s.eval_size, len(held), "eval")):
            if asked and got < asked:
                logger.warning("sft.%s=%d: the task's %s split holds %d instances; using those %d", key, asked,
                               which, got, got)
        train = oracle_demos(cfg, make, rows, noise=s.noise, seed=seed)
        evals = oracle_demos(cfg, make, held, noise=0.0, seed=held_out_demo_seed(seed)) if held else []
    else:
        system = {a: task.instructions(a) for a in task.agents} if is_env(task) else None
        train = read_demos(s.data, tuple(task.agents), system)
        evals = read_demos(s.eval_data, tuple(task.agents), system) if s.eval_data else []
        _check_held_out(s.data, s.eval_data, train, evals)
    if not train:
        raise DemoError("sft: no training demonstrations (the oracle answered no state); check task.options")
    return train, evals


def _check_held_out(data: str, eval_data: str | None, train: list[Demo], evals: list[Demo]) -> None:
    """A :class:`DemoError` where ``sft.eval_data`` is the file ``sft.data`` or repeats its demonstrations (same
    agent, prompt and completion): their NLL would measure memorisation, not the held-out fit (as the RL splits,
    the two are kept disjoint)."""
    if eval_data is None:
        return
    if os.path.samefile(data, eval_data):
        raise DemoError(f"sft.data and sft.eval_data name the same file ({data}); the held-out demonstrations must "
                        "be others than the training ones: give sft.eval_data a separate file, or drop it")

    def key(d: Demo) -> tuple[str, str, str]:
        return d.agent, json.dumps(d.messages, sort_keys=True), d.completion

    seen: dict[tuple[str, str, str], str] = {}
    for d in train:
        seen.setdefault(key(d), d.where)
    both = [(d.where, seen[key(d)]) for d in evals if key(d) in seen]
    if both:
        raise DemoError(f"sft.eval_data: {len(both)} of the {len(evals)} held-out demonstrations are also training "
                        f"demonstrations of sft.data (same agent, prompt and completion; e.g. {both[0][0]} = "
                        f"{both[0][1]}); keep the held-out demonstrations disjoint from the training ones")


# --- training ---------------------------------------------------------------------------------------------

@dataclass
class Encoded:
    prompt_ids: list[int]
    completion_ids: list[int]


def _eos_id(policy: ModelPolicy) -> int:
    """The first token generation stops on (generation_config's EOS, else the tokenizer's)."""
    eos = policy.model.generation_config.eos_token_id
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    eos = eos if eos is not None else policy.tokenizer.eos_token_id
    if eos is None:
        raise ConfigError(f"policy {policy.name!r}: its tokenizer and model define no EOS token; a demonstration "
                          "must end with one so that the policy learns to stop")
    return int(eos)


# more characters than a token of any tokenizer holds: a completion longer than this many per allowed token is
# judged on its prefix of that length first
CHARS_PER_TOKEN = 64


def encode_demos(policy: ModelPolicy, demos: list[Demo], max_new_tokens: int) -> list[Encoded]:
    """Token ids as the rollout makes them: ``encode_chat`` of the messages, then the completion's tokens
    and the EOS token (generated completions end with it too)."""
    eos = _eos_id(policy)
    out = []
    for d in demos:
        # written control strings stay text (split_special_tokens), as the prompts keep them (chat_ids)
        text, ids = d.completion, None
        if len(text) > CHARS_PER_TOKEN * max_new_tokens:   # a first look at a prefix: a 50 MB completion is not
            # tokenized whole to find it too long (that took 9 GB)
            ids = policy.tokenizer(text[:CHARS_PER_TOKEN * max_new_tokens], add_special_tokens=False,
                                   split_special_tokens=True)["input_ids"]
            ids = ids + [eos] if len(ids) > max_new_tokens else None
        least = "" if ids is None else "at least "   # the prefix's count
        if ids is None:
            ids = policy.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"] + [eos]
        if len(ids) > max_new_tokens:
            raise DemoError(f"{d.where}: the completion of agent {d.agent!r} has {least}{len(ids)} tokens (with EOS), more "
                            f"than rollout.max_new_tokens={max_new_tokens}: RL could never write it; raise "
                            "rollout.max_new_tokens or shorten the completion")
        chars = sum(len(m.get("content") or "") for m in d.messages if isinstance(m, dict))
        limit = policy.rollout.max_prompt_tokens
        if chars > CHARS_PER_TOKEN * limit:   # more tokens than the limit whatever the tokenizer: not tokenized
            # (a 10 MB prompt took 5 GB to find too long)
            raise DemoError(f"{d.where}: the prompt of agent {d.agent!r} has {chars} characters, so more than "
                            f"rollout.max_prompt_tokens={limit} tokens: RL could never be shown it; shorten the "
                            "demonstration's prompt or raise that limit")
        if len(d.messages) > limit:   # each message takes the chat template's tokens, empty or not (600,000 empty
            # messages took 4 GB and a minute to find too long)
            raise DemoError(f"{d.where}: the prompt of agent {d.agent!r} has {len(d.messages)} chat messages, so more "
                            f"than rollout.max_prompt_tokens={limit} tokens (each message takes the chat template's "
                            "tokens): RL could never be shown it; shorten the demonstration's prompt or raise that "
                            "limit")
        try:
            prompt = policy.encode_chat(d.messages)
        except PromptTooLongError as err:   # the rollout's limit: name the demonstration, and that it is its prompt
            raise DemoError(f"{d.where}: the prompt of agent {d.agent!r} is too long for RL to be shown it ({err}); "
                            "shorten the demonstration's prompt or raise that limit") from err
        out.append(Encoded(prompt, ids))
    return out


def nll_sums(policy: ModelPolicy, batch: list[Encoded]) -> tuple[torch.Tensor, int]:
    """Summed negative log-likelihood (temperature 1) of the completion tokens of ``batch``, and their count.
    The batch is built on the CPU and moved once to the policy's device."""
    c = max(len(e.completion_ids) for e in batch)
    pad = policy.tokenizer.pad_token_id if policy.tokenizer.pad_token_id is not None else 0
    ids, attn = left_pad([e.prompt_ids + e.completion_ids for e in batch], pad)
    targets = torch.full((len(batch), c), -100, dtype=torch.long)
    for i, e in enumerate(batch):
        targets[i, c - len(e.completion_ids):] = torch.tensor(e.completion_ids)
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    ids, attn, positions, targets = (t.to(policy.device) for t in (ids, attn, positions, targets))
    kwargs = {"logits_to_keep": c + 1} if policy._keep_arg else {}
    with policy.autocast():
        logits = policy.model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=False,
                              **kwargs).logits[:, -(c + 1):-1]
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1),
                                             ignore_index=-100, reduction="sum")
    return loss, int((targets != -100).sum())


@torch.no_grad()
def mean_nll(policy: ModelPolicy, data: list[Encoded], micro: int) -> float:
    """Per-token NLL of ``data`` under the policy (eval mode: no dropout)."""
    policy.model.eval()
    total, n = 0.0, 0
    for i in range(0, len(data), micro):
        loss, k = nll_sums(policy, data[i:i + micro])
        total, n = total + float(loss), n + k
    policy.model.train()
    return total / max(1, n)


def sft_step(policy: ModelPolicy, batch: list[Encoded], micro: int, max_grad_norm: float | None, step: int) -> dict:
    """One optimizer step on the token-mean NLL of ``batch`` (gradients accumulated over micro-batches)."""
    from accord.policies.protocol import TrainingError

    policy.model.train()
    policy.optimizer.zero_grad(set_to_none=True)
    n_tokens = sum(len(e.completion_ids) for e in batch)
    total = 0.0
    for i in range(0, len(batch), micro):
        loss, _ = nll_sums(policy, batch[i:i + micro])
        if not torch.isfinite(loss):
            raise TrainingError(f"sft step {step}: loss of policy {policy.name!r} is {loss.item()}; lower sft.lr")
        (loss / n_tokens).backward()
        total += float(loss.detach())
    norm = torch.nn.utils.clip_grad_norm_(policy.params, max_grad_norm if max_grad_norm is not None else math.inf)
    if not torch.isfinite(norm):
        raise TrainingError(f"sft step {step}: gradient norm of policy {policy.name!r} is {norm.item()}; lower sft.lr")
    policy.optimizer.step()
    policy.scheduler.step()
    policy.optimizer.zero_grad(set_to_none=True)
    return {"loss": total / n_tokens, "grad_norm": float(norm), "lr": policy.scheduler.get_last_lr()[0]}


def sft_devices(cfg: Config) -> dict[str, torch.device]:
    """Device of each policy SFT trains, as ``accord train`` places them (``run.device``, ``policies.<name>.device``;
    checked before any model is loaded); under lora, ``base`` on the adapters' one device."""
    from accord.devices import policy_devices

    names = sorted({a.policy for a in cfg.agents})
    devices = policy_devices(cfg, names)
    if cfg.specialization == "lora":
        return {"base": devices[names[0]]}
    return devices


def _policies(cfg: Config) -> dict[str, tuple[ModelPolicy, tuple[str, ...]]]:
    """Policy name -> (a full policy on its device, the agents it learns from). Under lora: one ``base`` for
    all agents. Held-out play generates with the hf backend (a vLLM engine per policy is not worth starting
    for a few greedy episodes, and it would need a GPU per policy)."""
    s = cfg.sft
    training = dataclasses.replace(cfg.training, lr=s.lr, warmup_steps=0, schedule="constant")
    algo = dataclasses.replace(cfg.algorithm, kl_coef=0.0)   # no frozen reference copy
    rollout = dataclasses.replace(cfg.rollout, generation_backend="hf")
    devices = sft_devices(dataclasses.replace(cfg, rollout=rollout))
    by_policy: dict[str, list[str]] = {}
    for a in cfg.agents:
        by_policy.setdefault("base" if cfg.specialization == "lora" else a.policy, []).append(a.name)
    out = {}
    for i, name in enumerate(sorted(by_policy)):
        pcfg = cfg.policies[name] if name in cfg.policies else cfg.policies[cfg.agents[0].policy]
        pol = ModelPolicy(name, dataclasses.replace(pcfg, lr=None), training, algo, rollout, s.steps,
                          seed=policy_seed(cfg.run.seed, i), device=devices[name])
        out[name] = (pol, tuple(by_policy[name]))
    return out


def _batches(n: int, size: int, seed: int):
    """Endless batches of ``min(size, n)`` indices into ``n`` items, read in order from a stream of seeded
    permutations (a fresh one per epoch), so every item comes once per epoch and batches span epochs."""
    size, epoch, stream = min(size, n), 0, []
    while True:
        while len(stream) < size:
            perm = list(range(n))
            random.Random(epoch_order_seed(seed, epoch)).shuffle(perm)
            stream.extend(perm)
            epoch += 1
        yield stream[:size]
        stream = stream[size:]


def step_counts(cfg: Config, sizes: dict[str, int]) -> dict[str, int]:
    """Optimizer steps of each policy: ``sft.steps``, or with ``sft.epochs`` ceil(epochs x its demonstrations /
    batch_size) (the batch is at most the number of demonstrations)."""
    s = cfg.sft
    if s.epochs is None:
        return {name: s.steps for name in sizes}
    return {name: max(1, math.ceil(s.epochs * n / min(s.batch_size, n))) for name, n in sizes.items()}


def held_out_play(cfg: Config, policies: dict[str, tuple[ModelPolicy, tuple[str, ...]]], rows: list[dict]) -> dict:
    """Play ``rows`` once each, greedily, with the fine-tuned policies, as ``accord train`` evaluates: the mean
    team reward (return) and, where the task has a success check, the success rate."""
    import functools

    from accord.build import EnvFactory
    from accord.policies.agents import AgentGenerator
    from accord.rollout import make_rollout, rollout_name

    make_env = EnvFactory(cfg)
    env = make_env()
    agents = tuple(a.name for a in cfg.agents)
    agent_policy = {a.name: name for name, (_, mine) in policies.items() for a in cfg.agents if a.name in mine}
    rollout = make_rollout(rollout_name(cfg, env), cfg, env, make_env, agents, agent_policy)
    generate = AgentGenerator({name: pol for name, (pol, _) in policies.items()}, agent_policy)
    for pol, _ in policies.values():
        pol.model.eval()
    try:
        played = rollout.play(rows, functools.partial(generate, temperature=1.0), n=1, greedy=True,
                              seed=eval_seed(cfg.run.seed), success=True)
    finally:
        for pol, _ in policies.values():
            pol.model.train()
    records = [per[0] for per in played.results]
    out = {mn.sft_key(mn.EVAL_TEAM_REWARD): sum(r["team"] for r in records) / len(records)}
    if "success" in records[0]:
        out[mn.sft_key(mn.EVAL_SUCCESS)] = sum(r["success"] for r in records) / len(records)
    return out


def output_dir(cfg: Config) -> Path:
    return Path(cfg.sft.output_dir) if cfg.sft.output_dir else cfg.run_dir / "sft"


def partial_dir(out: Path) -> Path:
    """Where a warm start is written until it is complete (then renamed to ``out``)."""
    return out.parent / f".{out.name}.partial"


def _demos_text(demos: list[Demo]) -> str:
    return "".join(json.dumps(d.to_json(), ensure_ascii=False) + "\n" for d in demos)


def _claim_partial(cfg: Config, part: Path, train: list[Demo]) -> bool:
    """Make ``part`` (held by this process) this warm start's: new, or an unfinished one of the same config and
    demonstrations (True: resume it). An unfinished one of other settings or demonstrations is a
    :class:`ConfigError` naming the difference when it holds a checkpoint (trained steps that would be lost),
    else started over with a warning (nothing trained is kept there: a run stopped or failed before its first
    checkpoint)."""
    from accord.checkpoint import LOCK_FILE, checkpoints
    from accord.config.base import first_difference
    from accord.tracking.registry import _atomic_write_text

    settings = json.loads(json.dumps(cfg.to_dict(), default=str))
    stored = part / "settings.json"
    if stored.is_file():
        try:
            old = json.loads(stored.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ConfigError(f"{part} holds an unfinished warm start whose settings.json cannot be read ({err}); "
                              "delete it to start over") from err
        diff = first_difference(old, settings, ("run.threads", "run.retain_freed_memory", "logging",
                                                "sft.checkpoint_every"))
        if diff is not None:
            other = f"other settings ({diff[0]}={diff[1]!r} there, {diff[2]!r} now)"
        elif (part / "demos.jsonl").read_text(encoding="utf-8") != _demos_text(train):
            other = "other demonstrations (sft.data changed?)"
        else:
            return True
        if checkpoints(part):
            raise ConfigError(f"{part} holds an unfinished warm start of {other}; run with its settings to finish "
                              "it, or delete it to start over")
        logger.warning("sft: %s holds an unfinished warm start of %s without a checkpoint; starting over", part, other)
    for path in part.iterdir():   # nothing of an earlier start is kept
        if path.name != LOCK_FILE:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    write_demos(train, part / "demos.jsonl")
    save_config(cfg, part / "config.yaml")
    _atomic_write_text(stored, json.dumps(settings, indent=1))   # last: its presence means the rest is there
    return False


def _resume(part: Path, policies: dict, batches: dict, steps: dict[str, int]) -> tuple[int, dict]:
    """Load the newest checkpoint of an unfinished warm start: (its step, its saved state); the batch streams
    are moved past the steps it trained and the metrics after it dropped (they are trained again)."""
    from accord.checkpoint import resume_checkpoint

    state = resume_checkpoint(part, {n: p for n, (p, _) in policies.items()})
    metrics = part / "metrics.jsonl"
    if state is None:   # stopped before its first checkpoint: it starts over
        metrics.unlink(missing_ok=True)
        logger.info("sft: %s has no checkpoint yet; starting it over", part)
        return 0, {}
    if "tokens" not in state:   # an RL run's checkpoint (`accord train --resume` in this directory)
        raise ConfigError(f"{part} holds a checkpoint of step {state['step']} that is not a warm start's (an RL run "
                          "resumed there?); delete that directory to start the warm start over")
    step = int(state["step"])
    for name, stream in batches.items():
        for _ in range(min(step, steps[name])):
            next(stream)
    kept = metrics_through(metrics, step, part)
    from accord.tracking.registry import _atomic_write_text

    _atomic_write_text(metrics, "".join(line + "\n" for line in kept))   # a kill here keeps the old file
    logger.info("sft: resuming %s after step %d", part, step)
    return step, state


def metrics_through(metrics: Path, step: int, part: Path) -> list[str]:
    """The lines of an unfinished warm start's ``metrics`` up to ``step`` (its checkpoint's); a last line cut
    short by a kill is dropped, any other line that is not a metrics record is an error naming it."""
    kept = []
    lines = metrics.read_text(encoding="utf-8", errors="replace").splitlines() if metrics.is_file() else []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            logged = record.get("step", 0) if isinstance(record, dict) else None
        except ValueError:
            logged = None
        if not isinstance(logged, int) or isinstance(logged, bool):
            if number == len(lines):
                continue
            raise ConfigError(f"{metrics}: line {number} is not a metrics record ({line[:60]!r}); remove that line "
                              f"to resume, or delete {part} to start the warm start over")
        if logged <= step:
            kept.append(line)
    return kept


def unread_sft_settings(cfg: Config) -> list[str]:
    """A line for each sft setting changed from its default that this warm start does not read: ``sft.steps``
    where ``sft.epochs`` decides the length, the oracle's ``sft.instances`` with ``sft.data``."""
    s = cfg.sft
    default = {f.name: f.default for f in dataclasses.fields(s)}
    out = []
    if s.epochs is not None and s.steps != default["steps"]:
        out.append(f"sft.steps={s.steps} has no effect with sft.epochs={s.epochs:g} set (the epochs decide the steps: "
                   "ceil(epochs x demonstrations / batch_size)); give only one of them")
    if s.data is not None and s.instances != default["instances"]:
        out.append(f"sft.instances={s.instances} has no effect with sft.data (it sizes the oracle's demonstrations; "
                   "those of sft.data are used as written); drop sft.instances or sft.data")
    return out


def run_sft(cfg: Config) -> dict[str, Any]:
    """Collect demonstrations, fine-tune every policy, export them; returns a summary (see the module
    docstring for the output layout). The warm start is written into ``.<dir>.partial`` beside the output
    directory, checkpointed every ``sft.checkpoint_every`` steps and at a Ctrl-C (the step in progress is
    finished first), and renamed into place when complete: the same command run again after a Ctrl-C or a
    kill goes on from the last checkpoint, as an uninterrupted run would have."""
    from accord.checkpoint import SFT_DEMOS, hold_run_dir

    final = output_dir(cfg)
    if final.exists() and any(final.iterdir()):
        held = "a warm start" if (final / SFT_DEMOS).is_file() else "files of another kind ({})".format(
            ", ".join(sorted(p.name for p in final.iterdir())[:5]))
        raise ConfigError(f"{final} already holds {held}; remove it, or set sft.output_dir (or run.name) to write "
                          "another")
    for line in unread_sft_settings(cfg):
        logger.warning("%s", line)
    setup_process(cfg.run.seed, cfg.run.threads, cfg.run.retain_freed_memory)
    t0 = time.perf_counter()
    train, evals = collect_demos(cfg)
    n_noisy = sum(d.noisy for d in train)
    logger.info("sft: %d training demonstrations (%d imperfect), %d held-out, in %.1fs", len(train), n_noisy,
                len(evals), time.perf_counter() - t0)
    if cfg.run.backend == "ray":
        logger.info("sft: run.backend=ray applies to RL; fine-tuning runs in this process")
    part = partial_dir(final)
    part.parent.mkdir(parents=True, exist_ok=True)
    part.mkdir(exist_ok=True)
    from accord.policies.protocol import TrainingError

    release, failed = hold_run_dir(part), False
    try:
        resumable = _claim_partial(cfg, part, train)
        return _fine_tune(cfg, part, final, train, evals, resumable)
    except TrainingError:   # a non-finite loss: these settings cannot finish, so there is nothing to resume
        failed = True
        raise
    except DemoError:   # a demonstration the policies cannot take (found before the first step): nothing to keep
        from accord.checkpoint import checkpoints

        failed = not checkpoints(part)
        raise
    finally:
        release()
        if failed:
            shutil.rmtree(part, ignore_errors=True)


def _fine_tune(cfg: Config, part: Path, final: Path, train: list[Demo], evals: list[Demo],
               resumable: bool) -> dict[str, Any]:
    """:func:`run_sft` from its demonstrations on: train in ``part`` (resuming its checkpoint when
    ``resumable``), export, and rename it to ``final``."""
    from safetensors import SafetensorError

    from accord.checkpoint import (LOCK_FILE, DiskFullError, checkpoint_step, checkpoints, commit_checkpoint,
                                   is_disk_full, write_checkpoint)
    from accord.stopping import GracefulStop, TrainingInterrupted

    s = cfg.sft
    n_noisy = sum(d.noisy for d in train)
    policies = _policies(cfg)
    max_new = cfg.rollout.max_new_tokens
    data, held = {}, {}
    for name, (pol, agents) in policies.items():
        data[name] = encode_demos(pol, [d for d in train if d.agent in agents], max_new)
        held[name] = encode_demos(pol, [d for d in evals if d.agent in agents], max_new)
        if not data[name]:
            raise DemoError(f"sft: no demonstration for policy {name!r} (agents {list(agents)}); add some for "
                            "these agents")
    micro = cfg.training.micro_batch_size
    steps = step_counts(cfg, {name: len(d) for name, d in data.items()})
    for name, d in data.items():
        if s.batch_size > len(d):
            logger.warning("sft.batch_size=%d: policy %r has %d demonstrations; its batches are all %d of them",
                           s.batch_size, name, len(d), len(d))
    held_rows = held_out_rows(cfg) if s.eval_success and s.eval_size else []
    summary: dict[str, Any] = {"demos": len(train), "noisy": n_noisy, "held_out": len(evals), "steps": steps}
    batches = {n: _batches(len(data[n]), s.batch_size, policy_seed(cfg.run.seed, i))
               for i, n in enumerate(policies)}
    last = max(steps.values())
    every = max(1, last // 10)
    save_every = s.checkpoint_every if s.checkpoint_every is not None else every
    done, state = _resume(part, policies, batches, steps) if resumable else (0, {})
    tokens_total, train_s = state.get("tokens", 0), state.get("train_s", 0.0)
    progress = {"step": done}

    def go_on() -> str:
        """How the same command goes on: from the checkpoint the warm start holds, or from the start."""
        held = checkpoints(part)
        if held:
            return (f"run the same `accord sft` command again: it goes on from its checkpoint of step "
                    f"{checkpoint_step(held[-1])}")
        return "run the same `accord sft` command again: it has no checkpoint, so it starts over"

    def checkpoint(step: int) -> None:
        try:
            tmp = write_checkpoint(part, step, {n: p for n, (p, _) in policies.items()},
                                   {"tokens": tokens_total, "train_s": train_s})
            commit_checkpoint(part, tmp, step, keep=1)
        except DiskFullError as err:   # the advice of an RL run's checkpoint (`accord train --resume`) is not ours
            raise DiskFullError(f"{err.what} and {go_on()}", err.what) from err

    stop = GracefulStop(lambda: f"finishing sft step {progress['step'] + 1}/{last}, then a checkpoint of it and stop"
                        if progress["step"] + 1 < last else "finishing the warm start's last step and its export")
    with stop, open(part / "metrics.jsonl", "a", encoding="utf-8") as log:
        def record(step: int, metrics: dict) -> None:
            log.write(json.dumps({"step": step, **metrics}) + "\n")
            log.flush()

        if done:
            first = (part / "metrics.jsonl").read_text(encoding="utf-8").split("\n", 1)[0]
            try:
                before = json.loads(first)
                before.pop("step")
            except (ValueError, KeyError, AttributeError) as err:
                raise ConfigError(f"{part / 'metrics.jsonl'} has no step-0 evaluation on its first line, which the "
                                  "resumed warm start reports against; delete that directory to start over") from err
        else:
            before = {mn.sft_policy_key(n, mn.EVAL_NLL): mean_nll(p, held[n], micro)
                      for n, (p, _) in policies.items() if held[n]}
            record(0, before)
        for step in range(done + 1, last + 1):   # done < last: a checkpoint is never of the last step
            progress["step"] = step - 1
            t = time.perf_counter()
            metrics, tokens = {}, 0
            for name, (pol, _) in policies.items():
                if step > steps[name]:
                    continue
                batch = [data[name][i] for i in next(batches[name])]
                tokens += sum(len(e.prompt_ids) + len(e.completion_ids) for e in batch)
                for key, v in sft_step(pol, batch, micro, cfg.training.max_grad_norm, step).items():
                    metrics[mn.sft_policy_key(name, key)] = v
            elapsed = time.perf_counter() - t
            tokens_total, train_s = tokens_total + tokens, train_s + elapsed
            metrics.update({mn.TIME_STEP: elapsed, mn.PERF_TOKENS: tokens, mn.PERF_TOKENS_PER_S: tokens / elapsed})
            if step == last:
                metrics.update({mn.sft_policy_key(n, mn.EVAL_NLL): mean_nll(p, held[n], micro)
                                for n, (p, _) in policies.items() if held[n]})
                if held_rows:
                    t = time.perf_counter()
                    played = held_out_play(cfg, policies, held_rows)
                    metrics.update({**played, mn.TIME_EVAL: time.perf_counter() - t})
                    logger.info("sft: held-out greedy play of %d instances: %s", len(held_rows), ", ".join(
                        f"{k.removeprefix(mn.SFT_EVAL_PREFIX)} {v:.3f}" for k, v in played.items()))
            record(step, metrics)
            if step % every == 0 or step == last:
                logger.info("sft step %d/%d: %s (%.2fs, %.0f tokens/s)", step, last, ", ".join(
                    f"{k.split('/')[1]} loss {v:.4f}" for k, v in metrics.items() if k.endswith("/loss")),
                    elapsed, tokens / elapsed)
            if step < last and (stop.requested or (save_every and step % save_every == 0)):
                checkpoint(step)
            if stop.requested and step < last:
                raise TrainingInterrupted(f"stopped by {stop.signal_name} after sft step {step}/{last} (checkpointed "
                                          f"in {part}); run the same command again to go on from there", step,
                                          part / "checkpoints", stop.signal_name)
        after = {k: v for k, v in metrics.items()
                 if k.endswith(mn.SEP + mn.EVAL_NLL) or k.startswith(mn.SFT_EVAL_PREFIX)}
        summary.update({"tokens": tokens_total, "train_s": round(train_s, 2),
                        "tokens_per_s": round(tokens_total / max(train_s, 1e-9), 1)})
        logger.info("sft: %d steps, %d prompt+completion tokens in %.1fs (%.0f tokens/s)", last, tokens_total,
                    train_s, tokens_total / max(train_s, 1e-9))
        log.close()
        try:   # inside the Ctrl-C guard: a Ctrl-C here lets the export finish (the steps since the last
            # checkpoint are in these weights only)
            for name, (pol, _) in policies.items():
                pol.export(part / name)
        except (OSError, RuntimeError, SafetensorError) as err:
            if not is_disk_full(err, part):
                raise
            raise DiskFullError(f"disk full while exporting the warm start into {part} ({type(err).__name__}: "
                                f"{err}); free space on that disk and {go_on()}") from err
        for name in policies:
            nll = mn.sft_policy_key(name, mn.EVAL_NLL)
            if before.get(nll) is not None:
                logger.info("sft: held-out NLL per token of %s: %.4f -> %.4f", name, before[nll], after[nll])
        if final.exists():   # an empty directory (checked above)
            final.rmdir()
        # renamed first, then tidied: a process killed between the two leaves the finished warm start in place
        # (with its checkpoints), where tidying first left a .partial without settings.json, which the next start
        # took for an unfinished one and deleted, the trained models included
        os.replace(part, final)
        shutil.rmtree(final / "checkpoints", ignore_errors=True)
        (final / "settings.json").unlink(missing_ok=True)
        (final / LOCK_FILE).unlink(missing_ok=True)
    summary.update({"output_dir": str(final), "before": before, "after": after,
                    "overrides": rl_overrides(cfg, final)})
    logger.info("sft: wrote %s; start RL from it with: accord train CONFIG %s", final,
                " ".join(summary["overrides"]))
    return summary


def rl_overrides(cfg: Config, out: Path) -> list[str]:
    """The ``key=value`` overrides that start an RL run of ``cfg`` from the warm start in ``out``."""
    overrides = []
    for name, p in sorted(cfg.policies.items()):
        source = out / ("base" if cfg.specialization == "lora" else name)
        overrides.append(f"policies.{name}.model={source}")
        if p.model_kwargs:
            overrides.append(f"policies.{name}.model_kwargs={{}}")
    return overrides


__all__ = ["Demo", "DemoError", "collect_demos", "oracle_demos", "read_demos", "run_sft", "write_demos"]
