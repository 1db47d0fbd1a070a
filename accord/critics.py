"""Scalar heads on causal LMs: value heads on policies, separate critics, the joint reward model.

A scalar model reads the last-layer hidden state of a causal LM at the **last token** of its input
(inputs are left-padded, so that is the last position) and maps it with a linear head to one number.
The same construction serves three roles:

- **value heads** (``algorithm.name: iac``, ``critic.mode: head``): one head per agent on the agent's own
  policy model (shared trunk). :func:`attach_heads` adds them to a policy where it lives (in its Ray actor
  on that backend: every function here that takes a policy first runs through ``Policy.run``);
  :func:`head_values` reads V(h) at the last prompt token (or Q(h, a) at the last completion token); and
  :func:`head_update` trains actor and heads on **one summed loss**: the clipped policy loss plus
  ``critic.value_coef`` x the value loss, one backward through the shared trunk, then the policy's and the
  heads' optimizer steps;
- **separate critics** (iac with ``critic.mode: separate``, one per agent; maac, one over the joint
  history): a :class:`ScalarModel` with its own optimizer and learning rate;
- **the joint reward model** (marlhf): a :class:`ScalarModel` trained with the Bradley-Terry loss on
  joint texts (:func:`joint_text`), then frozen.

Heads start small (:func:`_head`) from generators of their own, so adding a critic shifts no other random
stream. A separate critic's input is the actor's own tokens when
its tokenizer is the actor's (the same vocabulary), else the actor's prompt text (with its chat markup)
re-tokenized by the critic; the centralised critic's and the reward model's inputs are plain text
(:func:`joint_text`) in their own tokenizer. An input longer than ``max_tokens`` keeps its last
``max_tokens`` tokens (the most recent history and the query, which the value is read at).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model
from transformers import DynamicCache

from accord import metric_names as mn
from accord.algorithms.actor_critic import value_loss
from accord.algorithms.losses import KL_LOSS_ESTIMATORS, LossTotals, policy_loss, tis_weights
from accord.config import ConfigError, CriticConfig, TrainingConfig
from accord.generation.hf import first_occurrences
from accord.devices import resolve_bf16
from accord.models.common import ModelNotFoundError, cache_kwargs
from accord.policies.learner import (can_cache_forward, dropout_in_training, load_optimizer_state, load_scheduler_state,
                                    lr_lambda, make_adamw, micro_batches, prefix_pass, prefix_plan, read_saved_state,
                                    right_aligned, schedule_to_run_step)
from accord.policies.protocol import TrainingError
from accord.seeding import scalar_head_seed, value_head_seed

logger = logging.getLogger(__name__)

VALUE = "value"            # Sample.extra: the critic's value of the sample's history when it was sampled
TARGET = "value_target"    # Sample.extra: the critic's target (the lambda-return)


# --- the last hidden state ----------------------------------------------------------------------------


def last_hidden(model, inputs: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    """(b, hidden) last-layer hidden state (after the final norm) at the last token of each input (left-padded;
    positions count from each input's first real token), from the model's decoder: no logits are computed. A
    prefix that several inputs share (:func:`~accord.policies.learner.prefix_plan`: the instructions of every
    turn's joint history) runs once, its KV cache copied to them.

    Not ``output_hidden_states=True`` on the causal LM: transformers 5 then installs recording hooks on the model
    for good, and later generation calls return log-probs that differ in the last bits (a resumed run would
    no longer replay the uninterrupted one)."""
    decoder = model.get_decoder()   # a PEFT model passes this to its base: the adapters stay in the path
    plan = prefix_plan(inputs) if can_cache_forward(model) else None
    cache = DynamicCache(config=model.config) if plan else None
    ids, attn, positions = prefix_pass(decoder, inputs, pad, device, cache, plan)   # without a plan: the inputs
    on_cache = {**cache_kwargs(decoder, cache), "use_cache": True} if plan else {"use_cache": False}
    out = decoder(input_ids=ids, attention_mask=attn, position_ids=positions, **on_cache)
    return out.last_hidden_state[:, -1]


def _head(hidden: int, device: torch.device, seed: int) -> torch.nn.Linear:
    """A linear scalar head: weights ~ N(0, 1/hidden^2) from a generator of its own (``seed``), bias 0, so the
    first values are near 0 (a normalised hidden state gives values of std ~ 1/sqrt(hidden)) while the trunk
    below already gets a gradient (a zero head would pass none back on the first step)."""
    head = torch.nn.Linear(hidden, 1)
    with torch.no_grad():
        head.weight.copy_(torch.randn(1, hidden, generator=torch.Generator().manual_seed(seed)) / hidden)
        head.bias.zero_()
    return head.to(device)


def _hidden_size(model) -> int:
    config = model.config
    for key in ("hidden_size", "n_embd", "d_model"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    raise ConfigError(f"{type(model).__name__}: its config names no hidden size (hidden_size, n_embd, d_model), so no "
                      "scalar head fits it; use a decoder-only causal LM such as Qwen2 or Llama")


def truncate_left(ids: list[int], limit: int | None) -> tuple[list[int], bool]:
    """``ids`` cut to their last ``limit`` tokens, and whether anything was cut."""
    if limit is None or len(ids) <= limit:
        return ids, False
    return ids[-limit:], True


# --- a separate scalar model: critic or reward model ----------------------------------------------------


class ScalarModel:
    """A causal LM with a linear head on its last token, its tokenizer, AdamW and LR schedule.

    ``name`` appears in errors and metrics; ``max_tokens`` is the input limit (None: the model's context);
    ``schedule`` overrides ``training.schedule`` (the reward model's is constant: its step count is known only
    once its pairs are)."""

    def __init__(self, name: str, spec: str, model_kwargs: dict, lr: float, training: TrainingConfig,
                 total_optimizer_steps: int, seed: int, device: torch.device, max_tokens: int | None = None,
                 schedule: str | None = None):
        from accord.models import load_model_and_tokenizer

        self.name, self.spec, self.training, self.device = name, spec, training, torch.device(device)
        self.model, self.tokenizer = load_model_and_tokenizer(spec, model_kwargs=model_kwargs, seed=seed)
        self.model.to(self.device).train()
        self.head = _head(_hidden_size(self.model), self.device, scalar_head_seed(seed))
        context = getattr(self.model.config, "max_position_embeddings", None)
        self.max_tokens = max_tokens if max_tokens is not None else context
        if max_tokens is not None and context is not None and max_tokens > context:
            raise ConfigError(f"{name}: max_tokens={max_tokens} exceeds the context of its model {spec!r} ({context} "
                              f"tokens); lower it to {context} or less")
        self.params = [p for p in self.model.parameters() if p.requires_grad] + list(self.head.parameters())
        self.optimizer = make_adamw(self.params, lr, training)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(0 if schedule == "constant" else training.warmup_steps, total_optimizer_steps,
                                      schedule or training.schedule))
        self.bf16 = resolve_bf16(training.bf16, self.device)
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._kept: tuple | None = None   # (inputs, values with their graph): see scores(keep=True)

    def autocast(self):
        import contextlib

        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()

    def encode(self, text: str) -> tuple[list[int], bool]:
        """Token ids of a plain text (no chat template) cut to ``max_tokens``, and whether it was cut. A control
        string written in the text (``<|endoftext|>``, from a completion) is encoded as its characters, not as
        the control token."""
        ids = list(self.tokenizer(text, add_special_tokens=True, split_special_tokens=True)["input_ids"])
        if not ids:
            ids = [self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else self.pad]
        return truncate_left(ids, self.max_tokens)

    def translate(self, tokenizer, ids: list[int]) -> tuple[list[int], bool]:
        """Another tokenizer's ``ids`` (an actor's prompt and completion) in this model's vocabulary, cut to
        ``max_tokens``: each run between that tokenizer's special tokens decoded and encoded as text (a control
        string written in it stays text), each special token by its string (this tokenizer's special token of
        that string where it has one, else the string's characters)."""
        specials = {i: t.content for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        own = {t.content: i for i, t in self.tokenizer.added_tokens_decoder.items() if t.special}
        plain = self.tokenizer("a", add_special_tokens=False)["input_ids"]
        marked = self.tokenizer("a", add_special_tokens=True)["input_ids"]
        out = marked[:marked.index(plain[0])] if plain and plain[0] in marked else []   # a BOS where it adds one
        run: list[int] = []

        def text(pieces: str) -> list[int]:
            return self.tokenizer(pieces, add_special_tokens=False, split_special_tokens=True)["input_ids"]

        for i in ids:
            if i not in specials:
                run.append(i)
                continue
            if run:
                out += text(tokenizer.decode(run))
                run = []
            out += [own[specials[i]]] if specials[i] in own else text(specials[i])
        if run:
            out += text(tokenizer.decode(run))
        if not out:
            out = [self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else self.pad]
        return truncate_left(out, self.max_tokens)

    def fit(self, ids: list[int]) -> tuple[list[int], bool]:
        """Token ids already in this model's vocabulary, cut to ``max_tokens``."""
        return truncate_left(list(ids), self.max_tokens)

    def _scores(self, inputs: list[list[int]]) -> torch.Tensor:
        with self.autocast():
            hidden = last_hidden(self.model, inputs, self.pad, self.device)
        return self.head(hidden.float()).squeeze(-1)

    def scores(self, inputs: list[list[int]], keep: bool = False) -> list[float]:
        """The scalar of each input, each distinct input computed once, in micro-batches, without a gradient in
        evaluation mode. With ``keep``, where the distinct inputs are one micro-batch and the model drops nothing
        in training mode (:func:`~accord.policies.learner.dropout_in_training`), they run in training mode with
        their graph kept for :meth:`fit_values`, whose first micro-batch, if it holds the same inputs, then runs
        only the backward (the same values: without dropout the two modes compute the same thing)."""
        self._kept = None
        if not inputs:
            return []
        index, first = first_occurrences([tuple(x) for x in inputs])
        distinct = [inputs[i] for i in first]
        size = self.training.micro_batch_size
        if keep and len(distinct) <= size and not dropout_in_training(self.model):
            self.model.train()
            values = self._scores(distinct)
            self._kept = (tuple(tuple(x) for x in distinct), values)
            out = values.detach().tolist()
            return [out[u] for u in index]
        out = []
        was = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for i in range(0, len(distinct), size):
                    out.extend(self._scores(distinct[i:i + size]).tolist())
        finally:
            self.model.train(was)
        return [out[u] for u in index]

    def _step(self, step: int, what: str) -> float:
        max_norm = self.training.max_grad_norm if self.training.max_grad_norm is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        if not torch.isfinite(norm):
            raise TrainingError(f"step {step}: gradient norm of {self.name} is {norm.item()} ({what}); lower its learning "
                                "rate or check the rewards for extreme values")
        self.optimizer.step()
        self.scheduler.step()
        return float(norm)

    def fit_values(self, inputs: list[list[int]], old: list[float], targets: list[float], *, coef: float,
                   clip: float | None, epochs: int, mini_batches: int, step: int) -> dict[str, float]:
        """Regress the scalar on ``targets`` (a critic): ``epochs`` passes of ``mini_batches`` optimizer steps,
        loss ``coef`` x the (clipped) value loss of :func:`accord.algorithms.actor_critic.value_loss`. Inputs
        repeated within a micro-batch run through the model once."""
        n = len(inputs)
        schedule_to_run_step(self.scheduler, step, epochs * self.training.num_mini_batches)
        sums = {mn.VALUE_LOSS: 0.0, mn.CLIP_FRAC: 0.0}
        norms = []
        kept, self._kept = self._kept, None   # scores(keep=True) ran the first forward
        for epoch in range(epochs):
            for mb in range(mini_batches):
                idx = list(range(mb, n, mini_batches))
                self.optimizer.zero_grad(set_to_none=True)
                for i in range(0, len(idx), self.training.micro_batch_size):
                    part = idx[i:i + self.training.micro_batch_size]
                    # each distinct input once (the K samples of a prompt share V(h)); the loss still counts
                    # every sample, its gradient summed over the copies
                    index, first = first_occurrences([tuple(inputs[j]) for j in part])
                    rows = torch.tensor(index, device=self.device)
                    distinct = [inputs[part[u]] for u in first]
                    if kept is not None and kept[0] == tuple(tuple(x) for x in distinct):
                        values = kept[1].index_select(0, rows)
                    else:
                        values = self._scores(distinct).index_select(0, rows)
                    kept = None
                    loss, stats = value_loss(values, torch.tensor([old[j] for j in part], device=self.device),
                                             torch.tensor([targets[j] for j in part], device=self.device), clip)
                    total = coef * loss.sum() / len(idx)
                    if not torch.isfinite(total):
                        raise TrainingError(f"step {step}: value loss of {self.name} is {total.item()}; lower "
                                            "critic.lr or check the rewards")
                    total.backward()
                    if epoch == 0:
                        sums[mn.VALUE_LOSS] += float(loss.detach().sum())
                        sums[mn.CLIP_FRAC] += float(stats["clipped"])
                norms.append(self._step(step, "value loss"))
        metrics = {k: v / max(1, n) for k, v in sums.items()}
        metrics[mn.GRAD_NORM] = sum(norms) / len(norms)
        return metrics

    def state(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        directory.mkdir(exist_ok=True)
        save_model(self.model, str(directory / "model.safetensors"))
        save_file({k: v.detach().contiguous() for k, v in self.head.state_dict().items()},
                  str(directory / "head.safetensors"))
        torch.save(self.state(), directory / "optimizer.pt")

    def load(self, directory: Path) -> None:
        directory = Path(directory)
        load_model(self.model, str(directory / "model.safetensors"), strict=True, device="cpu")
        self.head.load_state_dict(load_file(str(directory / "head.safetensors"), device="cpu"))
        state = read_saved_state(directory / "optimizer.pt", ("optimizer", "scheduler"))
        load_optimizer_state(self.optimizer, state["optimizer"], f"{directory.name}'s optimizer")
        load_scheduler_state(self.scheduler, state["scheduler"], f"{directory.name}'s LR schedule")

    def export(self, directory: Path) -> None:
        """A Hugging Face directory of the backbone plus ``head.safetensors`` (what ``reward_model.path`` loads)."""
        directory = Path(directory)
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        save_file({k: v.detach().contiguous() for k, v in self.head.state_dict().items()},
                  str(directory / "head.safetensors"))

    def load_exported(self, directory: Path) -> None:
        """The head of an :meth:`export` directory (the backbone was loaded from it as the model spec); a head file
        that cannot be read, or whose weights are not finite (every score would be nan), is a
        :class:`ModelNotFoundError` naming it."""
        path = Path(directory) / "head.safetensors"
        try:
            weights = load_file(str(path), device="cpu")
        except SafetensorError as err:   # a truncated or damaged head file (an interrupted copy or save)
            raise ModelNotFoundError(f"{path} cannot be read ({err}: truncated or not safetensors); copy the reward "
                                     "model directory again, or export it again (a marlhf run writes "
                                     "RUN_DIR/reward_model)") from err
        bad = [k for k, v in weights.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
        if bad:
            raise ModelNotFoundError(f"{path}: the {self.name}'s head holds nan or infinite weights ({bad[0]}), so "
                                     "every score it gives would be nan; copy the reward model directory again, or "
                                     "export it again (a marlhf run writes RUN_DIR/reward_model)")
        self.head.load_state_dict(weights)


def same_vocabulary(a, b) -> bool:
    """Whether two tokenizers map every token to the same id (then token ids pass between them as they are)."""
    return a is b or (len(a) == len(b) and a.get_vocab() == b.get_vocab())


# --- the centralised critic's and the reward model's text ---------------------------------------------


def joint_text(records: list[tuple[int, str, str, str | None]], agent: str | None, turn: int | None,
               agents: tuple[str, ...]) -> str:
    """The joint history as plain text (the centralised critic's input; with ``agent`` None, the reward
    model's joint text of one joint action)::

        Agents: e, o.
        [turn 1] e observes: <observation>
        [turn 1] e acts: <action>
        [turn 1] o observes: <observation>
        [turn 1] o acts: <action>
        Value of agent e at turn 2:

    ``records`` are (turn, agent, observation, action) in acting order; an action of None (an agent that is
    about to act) writes only the observation. The last line names whose value is read at the last token
    (maac: one value per agent and turn); the reward model's text ends with ``Joint score:``."""
    lines = [f"Agents: {', '.join(agents)}."]
    for t, a, obs, action in records:
        lines.append(f"[turn {t + 1}] {a} observes: {obs}")
        if action is not None:
            lines.append(f"[turn {t + 1}] {a} acts: {action}")
    lines.append("Joint score:" if agent is None else f"Value of agent {agent} at turn {turn + 1}:")
    return "\n".join(lines)


# --- value heads on a policy (run where the policy lives: Policy.run) -----------------------------------


def attach_heads(policy, agents: list[str], critic: CriticConfig, total_optimizer_steps: int, seed: int) -> None:
    """One value head per agent on ``policy``'s model (:func:`_head`, seeded by ``seed`` and the agent's name),
    with AdamW (``critic.lr`` or the policy's learning rate) and the policy's LR schedule; idempotent."""
    if getattr(policy, "value_heads", None) is not None:
        return
    hidden = _hidden_size(policy.model)
    policy.value_heads = torch.nn.ModuleDict({a: _head(hidden, policy.device, value_head_seed(seed, a))
                                              for a in agents})
    params = list(policy.value_heads.parameters())
    tr = policy.training
    policy.head_optimizer = make_adamw(params, critic.lr or policy.cfg.lr or tr.lr, tr)
    policy.head_scheduler = torch.optim.lr_scheduler.LambdaLR(
        policy.head_optimizer, lr_lambda(tr.warmup_steps, total_optimizer_steps, tr.schedule))
    policy.critic_cfg = critic


def _activate(policy) -> None:
    group = getattr(policy, "group", None)   # a LoRA adapter: make it the active one
    if group is not None:
        group.activate(policy.name)


def _head_inputs(samples, at_completion: bool) -> list[list[int]]:
    return [s.prompt_ids + s.completion_ids if at_completion else s.prompt_ids for s in samples]


def _head_forward(policy, samples) -> torch.Tensor:
    """(b,) values of ``samples`` by their agents' heads (with gradient); each distinct input runs once."""
    at_completion = policy.critic_cfg.value_at == "completion"
    inputs = _head_inputs(samples, at_completion)
    index, first = first_occurrences([(s.agent, tuple(x)) for s, x in zip(samples, inputs)])
    pad = policy.tokenizer.pad_token_id if policy.tokenizer.pad_token_id is not None else 0
    with policy.autocast():
        hidden = last_hidden(policy.model, [inputs[i] for i in first], pad, policy.device)
    hidden = hidden.float()
    values = torch.stack([policy.value_heads[samples[i].agent](hidden[u]).squeeze(-1) for u, i in enumerate(first)])
    return values[torch.tensor(index, device=values.device)]


@torch.no_grad()
def head_values(policy, samples) -> list[float]:
    """The value of each sample by its agent's head on this policy (no gradient, eval mode)."""
    _activate(policy)
    was = policy.model.training
    policy.model.eval()
    out: list[float] = []
    try:
        for micro in micro_batches(samples, policy.training.micro_batch_size, policy.training.micro_batch_tokens):
            out.extend(_head_forward(policy, micro).tolist())
    finally:
        policy.model.train(was)
    return out


def head_update(policy, samples, step: int) -> dict[str, float]:
    """``algorithm.ppo_epochs`` passes of the summed loss over this policy's samples: the policy loss on each
    sample's advantage exactly as :meth:`accord.policies.model.ModelPolicy.update` computes it (``algorithm.loss`` with
    its aggregation and length caps, the old log-probs, the sampler/learner mismatch correction) plus
    ``critic.value_coef`` x the mean (clipped) value loss of its agent's head against
    ``extra["value_target"]``; one backward through the shared trunk, the gradient of trunk and heads
    clipped together, then both optimizers step."""
    _activate(policy)
    algo, tr, critic = policy.algo, policy.training, policy.critic_cfg
    for scheduler in (policy.scheduler, policy.head_scheduler):
        schedule_to_run_step(scheduler, step, algo.ppo_epochs * tr.num_mini_batches)
    fresh, n_mb, tis, stored_ok, spec, default, order = policy.update_setup(samples)
    params = policy.params + list(policy.value_heads.parameters())
    kl_in_loss = algo.kl_coef > 0 and algo.kl_estimator in KL_LOSS_ESTIMATORS
    sums: dict[str, float] = {}
    tokens_total, grad_norms = 0, []
    policy.model.train()
    learner_old = None
    if not fresh and (tis != "off" or not stored_ok):
        learner_old = policy._learner_logprobs([samples[i] for i in order])
    for epoch in range(algo.ppo_epochs):
        for mb in range(n_mb):
            mb_samples = [samples[i] for i in order[mb::n_mb]]
            totals = LossTotals(num_tokens=max(1, sum(len(s.completion_ids) for s in mb_samples)),
                                num_seqs=len(mb_samples))
            policy.optimizer.zero_grad(set_to_none=True)
            policy.head_optimizer.zero_grad(set_to_none=True)
            for micro in micro_batches(mb_samples, tr.micro_batch_size, tr.micro_batch_tokens):
                bonus = algo.entropy_coef > 0
                logp, ent, mask, *full = policy._forward_completion(
                    policy.model, micro, want_entropy=epoch == 0 or bonus, kl_too=kl_in_loss, entropy_grad=bonus)
                c = mask.size(1)
                stored = right_aligned([s.logprobs for s in micro], c, policy.device)
                if fresh:
                    old = logp.detach()
                elif learner_old is not None:
                    old = right_aligned([learner_old.get(id(s), []) for s in micro], c, policy.device)
                else:
                    old = stored
                weights = over = None
                if tis != "off":
                    weights, over = tis_weights(old, stored, algo.tis_cap, tis)
                ref = policy._reference_logprobs(micro) if kl_in_loss else None
                adv = torch.tensor([s.advantage for s in micro], dtype=logp.dtype, device=policy.device)
                max_lens = torch.tensor([(s.sampling or default).max_new_tokens for s in micro], dtype=logp.dtype,
                                        device=policy.device)
                loss, stats = policy_loss(
                    logp, old, adv, mask, totals, epsilon=algo.epsilon, epsilon_high=algo.epsilon_high,
                    agg=algo.loss_agg, kl_coef=algo.kl_coef if kl_in_loss else 0.0, ref_logp=ref,
                    kl_estimator=algo.kl_estimator, kl_logp=full[0] if full else None, loss=algo.loss,
                    weights=weights, max_lens=max_lens, sampling_logp=stored if spec.sampling_logprobs else None,
                    entropy=ent if bonus else None, entropy_coef=algo.entropy_coef)
                values = _head_forward(policy, micro)
                old_v = torch.tensor([s.extra[VALUE] for s in micro], dtype=values.dtype, device=values.device)
                target = torch.tensor([s.extra[TARGET] for s in micro], dtype=values.dtype, device=values.device)
                vloss, vstats = value_loss(values, old_v, target, critic.value_clip)
                total = loss + critic.value_coef * vloss.sum() / totals.num_seqs
                if not torch.isfinite(total):
                    raise TrainingError(f"step {step}: actor-critic loss of policy {policy.name!r} is {total.item()} "
                                        f"(epoch {epoch}, mini-batch {mb}); lower training.lr or critic.lr, or check "
                                        "the rewards")
                total.backward()
                if epoch == 0:
                    fm = mask.float()
                    stats[mn.ENTROPY] = (ent.detach() * fm).sum()
                    if stored_ok:
                        stats[mn.LOGP_DIFF] = ((logp.detach() - stored).abs() * fm).sum()
                    if weights is not None:
                        log_r = old - stored   # log pi_learner - log pi_sampler
                        stats[mn.TIS_WEIGHT] = (weights * fm).sum()
                        stats[mn.TIS_CAPPED] = (over.float() * fm).sum()
                        stats[mn.MISMATCH_KL] = ((log_r.exp() - 1.0 - log_r) * fm).sum()
                    tokens_total += int(fm.sum())
                    for key, v in stats.items():
                        sums[key] = sums.get(key, 0.0) + float(v)
                    sums["@value_loss"] = sums.get("@value_loss", 0.0) + float(vloss.detach().sum())
                    sums["@clip_frac"] = sums.get("@clip_frac", 0.0) + float(vstats["clipped"])
            max_norm = tr.max_grad_norm if tr.max_grad_norm is not None else float("inf")
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            if not torch.isfinite(norm):
                raise TrainingError(f"step {step}: gradient norm of policy {policy.name!r} and its value heads is "
                                    f"{norm.item()}; lower training.lr or check the rewards")
            grad_norms.append(float(norm))
            policy.optimizer.step()
            policy.scheduler.step()
            policy.head_optimizer.step()
            policy.head_scheduler.step()
    policy.optimizer.zero_grad(set_to_none=True)
    policy.head_optimizer.zero_grad(set_to_none=True)
    metrics = {k: v / max(1, tokens_total) for k, v in sums.items() if not k.startswith("@")}
    metrics[mn.VALUE_LOSS] = sums.get("@value_loss", 0.0) / max(1, len(samples))
    metrics[mn.VALUE_CLIP_FRAC] = sums.get("@clip_frac", 0.0) / max(1, len(samples))
    metrics[mn.GRAD_NORM] = sum(grad_norms) / len(grad_norms)
    metrics[mn.LR] = policy.scheduler.get_last_lr()[0]
    return metrics


def save_heads(policy, directory: Path) -> None:
    """The value heads of ``policy`` and their optimizer and schedule, under ``directory``."""
    directory = Path(directory)
    directory.mkdir(exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in policy.value_heads.state_dict().items()},
              str(directory / "heads.safetensors"))
    torch.save({"optimizer": policy.head_optimizer.state_dict(), "scheduler": policy.head_scheduler.state_dict()},
               directory / "heads_optimizer.pt")


def load_heads(policy, directory: Path) -> None:
    directory = Path(directory)
    tensors = load_file(str(directory / "heads.safetensors"), device="cpu")
    if set(tensors) != set(policy.value_heads.state_dict()):
        raise ConfigError(f"{directory}: the saved value heads {sorted({k.split('.')[0] for k in tensors})} are not "
                          f"those of this run's agents {sorted(policy.value_heads)}; resume with the config the "
                          "checkpoint was trained with")
    policy.value_heads.load_state_dict(tensors)
    state = read_saved_state(directory / "heads_optimizer.pt", ("optimizer", "scheduler"))
    load_optimizer_state(policy.head_optimizer, state["optimizer"], f"{directory.name}'s value heads")
    load_scheduler_state(policy.head_scheduler, state["scheduler"], f"{directory.name}'s value heads")


# --- sequence log-probs for preference learning (run where the policy lives) ----------------------------


def ensure_reference(policy) -> None:
    """A frozen copy of the initial weights as DPO's reference, unless the policy has one (``kl_coef > 0``) or is
    a LoRA adapter (its reference is the base with adapters off). Called before any update."""
    if getattr(policy, "group", None) is None and policy.ref_model is None:
        policy.ref_model = policy._reference_model()


def _signature(samples) -> tuple:
    """What identifies a list of samples between two calls to one policy (objects are copies on Ray)."""
    return tuple((s.instance, s.agent, s.turn, tuple(s.prompt_ids), tuple(s.completion_ids)) for s in samples)


def sequence_logprobs(policy, samples, reference: bool = False, keep: bool = False) -> list[float]:
    """Sum over each sample's completion tokens of its log-prob under the untruncated distribution at the
    sampling temperature: of the policy's current weights, or (``reference``) of its frozen reference.

    With ``keep``, where the samples are one micro-batch and the model drops nothing in training mode
    (:func:`~accord.policies.learner.dropout_in_training`), the forward runs in training mode with its graph,
    kept on the policy for :func:`weighted_logprob_update` of the same samples, which then only runs the
    backward (the same log-probs: without dropout the two modes compute the same thing); else it runs without
    a gradient in evaluation mode and the update runs its own forward."""
    _activate(policy)
    policy._kept_logprobs = None
    micros = list(micro_batches(samples, policy.training.micro_batch_size, policy.training.micro_batch_tokens))
    if keep and not reference and len(micros) == 1 and not dropout_in_training(policy.model):
        policy.model.train()
        logp, _, mask = policy._forward_completion(policy.model, micros[0], want_entropy=False, untruncated=True)
        sums = (logp * mask).sum(-1)
        policy._kept_logprobs = (_signature(micros[0]), sums)
        return sums.detach().tolist()
    out: list[float] = []
    was = policy.model.training
    policy.model.eval()
    try:
        with torch.no_grad():
            for micro in micros:
                if reference:
                    logp = policy._reference_logprobs(micro)
                    mask = torch.zeros_like(logp, dtype=torch.bool)
                    for i, s in enumerate(micro):
                        mask[i, mask.size(1) - len(s.completion_ids):] = True
                else:
                    logp, _, mask = policy._forward_completion(policy.model, micro, want_entropy=False,
                                                               untruncated=True)
                out.extend((logp * mask).sum(-1).tolist())
    finally:
        policy.model.train(was)
    return out


def weighted_logprob_update(policy, samples, weights: list[float], step: int) -> dict[str, float]:
    """One optimizer step on ``sum_s weights[s] * log pi(s)`` (the sum over each completion's tokens; see
    :func:`accord.algorithms.preference.joint_dpo`: with the joint loss's weights its gradient is the joint DPO
    gradient), over micro-batches."""
    _activate(policy)
    tr = policy.training
    schedule_to_run_step(policy.scheduler, step, policy.algo.ppo_epochs * tr.num_mini_batches)
    policy.model.train()
    policy.optimizer.zero_grad(set_to_none=True)
    by_id = {id(s): w for s, w in zip(samples, weights)}
    kept, policy._kept_logprobs = getattr(policy, "_kept_logprobs", None), None
    for micro in micro_batches(samples, tr.micro_batch_size, tr.micro_batch_tokens):
        if kept is not None and kept[0] == _signature(micro):   # sequence_logprobs ran this forward
            sums = kept[1]
        else:
            logp, _, mask = policy._forward_completion(policy.model, micro, want_entropy=False, untruncated=True)
            sums = (logp * mask).sum(-1)
        kept = None
        w = torch.tensor([by_id[id(s)] for s in micro], dtype=sums.dtype, device=sums.device)
        loss = (w * sums).sum()
        if not torch.isfinite(loss):
            raise TrainingError(f"step {step}: preference loss of policy {policy.name!r} is {loss.item()}; lower "
                                "training.lr or preference.beta")
        loss.backward()
    max_norm = tr.max_grad_norm if tr.max_grad_norm is not None else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(policy.params, max_norm)
    if not torch.isfinite(norm):
        raise TrainingError(f"step {step}: gradient norm of policy {policy.name!r} is {norm.item()}; lower training.lr")
    policy.optimizer.step()
    policy.scheduler.step()
    policy.optimizer.zero_grad(set_to_none=True)
    return {mn.GRAD_NORM: float(norm), mn.LR: policy.scheduler.get_last_lr()[0]}
