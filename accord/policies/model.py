"""A whole model as a policy (:class:`ModelPolicy`): model + tokenizer + optimizer + LR schedule, its log-probs,
update and state. It implements :class:`accord.policies.protocol.Policy`; LoRA adapters
(:mod:`accord.policies.lora`) and data-parallel ranks (:mod:`accord.distributed.ranks`) subclass it.

Weights are fp32 (master weights); ``training.bf16`` runs forward/backward under bf16 autocast.
The KL reference, when ``algorithm.kl_coef > 0``, is a frozen copy of the initial weights; the KL uses
its and the policy's untruncated distributions at the sampling temperature (no top-k / top-p).

Each sample's log-probs are recomputed with its own sampling settings (``Sample.sampling``: its agent's
temperature, top-k and top-p), so agents with different settings can share a policy and a batch.

Old log-probs and the sampler/learner correction (``algorithm.tis``, :meth:`ModelPolicy.update`). The ratio of
the loss is taken to the *learner's* log-probs before the update: with one epoch and one mini-batch those
are the current log-probs (detached; no extra forward), otherwise, where the sampler may differ from the
learner, one no-grad forward over the batch before the first optimizer step computes them. With the
correction on, each token's policy-gradient term is weighted by ``r = pi_learner / pi_sampler`` (the
learner's old log-prob over the stored sampling one) truncated at ``algorithm.tis_cap`` (or set to 0
beyond it: ``mask``); ``auto`` turns it on exactly where the two computations differ
(:meth:`ModelPolicy.sampler_mismatch`).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import re
from array import array
from collections import OrderedDict
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model
from transformers import DynamicCache

from accord import metric_names as mn
from accord.algorithms.losses import (KL_LOSS_ESTIMATORS, LOSS_SPECS, LossSpec, LossTotals, floor_mask,
                                      logprobs_and_entropy, policy_loss, process_logits, tis_weights)
from accord.allocator import bound_retained_memory
from accord.config import AlgorithmConfig, ConfigError, PolicyConfig, RolloutConfig, TrainingConfig
from accord.devices import make_generator, resolve_bf16, restore_generator
from accord.generation import Generation
from accord.generation.backends import HFBackend, make_backend, settings
from accord.generation.hf import DecodeJob, eos_ids, first_occurrences, left_pad, supports_own_loop
from accord.models import load_model_and_tokenizer
from accord.models.common import cache_kwargs
from accord.policies.learner import (can_cache_forward, dropout_in_training, enable_gradient_checkpointing,
                                    load_optimizer_state, load_scheduler_state, lr_lambda, make_adamw, micro_batches,
                                    optimizer_step, prefix_pass, prefix_plan, read_saved_state, right_aligned,
                                    schedule_to_run_step, scheduler_step, select_cache_rows,
                                    train_last_layers)
from accord.policies.protocol import PromptTooLongError, TrainingError
from accord.rollout.sample import Sample, Sampling, rollout_sampling
from accord.seeding import policy_seed, sampling_stream_seed

logger = logging.getLogger(__name__)

# the token statistics the update adds to those of the loss (entropy, the sampler/learner mismatch)
_EVERY_EPOCH = (mn.ENTROPY, mn.LOGP_DIFF, mn.TIS_WEIGHT, mn.TIS_CAPPED, mn.MISMATCH_KL)


CHAT_CACHE_SIZE = 2048   # distinct prompts whose token ids a policy keeps (the least recently used goes first)


def control_strings(tokenizer) -> tuple[str, ...]:
    """The texts ``tokenizer`` reads as one of its special tokens wherever they occur in a text (``<|im_end|>``,
    ``<|endoftext|>``, ...), longest first. Added tokens that are not special (a Qwen tokenizer's
    ``<tool_call>``, ``<think>``) are not among them: the tokenizer reads those as their tokens in any text."""
    found = vars(tokenizer).get("_accord_control_strings")
    if found is None:
        decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        found = tuple(sorted({t.content for t in decoder.values() if getattr(t, "special", False) and t.content},
                             key=len, reverse=True))
        vars(tokenizer)["_accord_control_strings"] = found
    return found


def holds_control(tokenizer, messages: list[dict]) -> bool:
    """Whether a message's text content holds one of the tokenizer's :func:`control_strings`."""
    strings = control_strings(tokenizer)
    return bool(strings) and any(isinstance(m.get("content"), str) and any(c in m["content"] for c in strings)
                                 for m in messages if isinstance(m, dict))


_PLACE = re.compile("\ue000(\\d{1,9})\ue001")   # a placeholder of _literal_chat_ids (a longer number is not one)


def _literal_chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The chat template's ids with each message's content kept as written: a control string in a content is
    tokenized as its characters, not as the control token.

    The template is rendered with a placeholder for each non-empty text content, which tells the template's own
    text from the contents: every placeholder the rendering shows becomes its content as written (a template
    that leaves a message out shows none of it; one that changes a content, such as trimming it, is not
    followed, and one that branches on a content's text sees the placeholder's). The text is cut at the template's own control strings only (as the tokenizer cuts a text at each
    of them before its subword model), each part between them tokenized whole with the control strings it holds
    split. No text of a content can reach the rendering but through its placeholders."""
    shown = [{**m, "content": f"\ue000{i}\ue001"} if isinstance(m.get("content"), str) and m["content"] else m
             for i, m in enumerate(messages)]
    text = str(tokenizer.apply_chat_template(shown, add_generation_prompt=True, tokenize=False))
    pieces, at = [], 0
    for place in _PLACE.finditer(text):
        i = int(place.group(1))
        if i < len(messages) and shown[i] is not messages[i]:
            pieces += [(text[at:place.start()], False), (messages[i]["content"], True)]
            at = place.end()
    pieces.append((text[at:], False))
    cut = re.compile("|".join(re.escape(c) for c in control_strings(tokenizer)))
    ids: list[int] = []
    part = ""
    for piece, content in pieces:
        if content:
            part += piece
            continue
        start = 0
        for match in cut.finditer(piece):
            part += piece[start:match.start()]
            if part:
                ids += tokenizer(part, add_special_tokens=False, split_special_tokens=True)["input_ids"]
            ids.append(tokenizer.convert_tokens_to_ids(match.group()))
            part, start = "", match.end()
        part += piece[start:]
    if part:
        ids += tokenizer(part, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return ids


def _template_ids(tokenizer, messages: list[dict]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def chat_ids(tokenizer, messages: list[dict], cache: OrderedDict | None = None) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template and the assistant turn's opening
    (without a template: the contents joined by blank lines). ``cache`` maps messages seen before to their ids:
    a task shows the same prompt many times (every evaluation, every epoch, several agents or instances alike),
    and rendering the template costs more than a small model's step; messages with a field that is not a string
    are rendered every time.

    A message whose content holds a control string of the tokenizer (``<|im_end|>`` written out, by a task or
    by a partner agent's completion in a multi-turn history) keeps it as text, tokenized as ordinary tokens, so
    that no text can open or close a turn of the prompt (:func:`_literal_chat_ids`); prompts without such text
    are the template's own ids."""
    key = None
    if cache is not None:
        try:
            key = tuple(tuple(sorted(m.items())) for m in messages)
            hash(key)
        except (AttributeError, TypeError):   # not dicts, or a field that cannot be hashed (a list of parts)
            key = None
    if key is not None and (hit := cache.get(key)) is not None:
        cache.move_to_end(key)
        return hit.tolist()
    literal = holds_control(tokenizer, messages)
    if tokenizer.chat_template:
        ids = _literal_chat_ids(tokenizer, messages) if literal else _template_ids(tokenizer, messages)
    else:
        text = "\n\n".join(m["content"] for m in messages) + "\n\n"
        ids = tokenizer(text, add_special_tokens=True, split_special_tokens=literal)["input_ids"]
    ids = list(ids)
    if key is not None:
        cache[key] = array("q", ids)
        if len(cache) > CHAT_CACHE_SIZE:
            cache.popitem(last=False)
    return ids


class ModelPolicy:
    """One trainable model used by one or more agents (full fine-tuning)."""

    def __init__(self, name: str, cfg: PolicyConfig, training: TrainingConfig, algo: AlgorithmConfig,
                 rollout: RolloutConfig, total_optimizer_steps: int, seed: int, device: torch.device | None = None):
        self._settings(name, cfg, training, algo, rollout)
        self.device = torch.device("cpu") if device is None else torch.device(device)
        # loaded (and a tiny model initialised) on the CPU, then moved: the same weights on every device
        self.model, self.tokenizer = load_model_and_tokenizer(cfg.model, model_kwargs=cfg.model_kwargs, seed=seed)
        if cfg.trainable_layers is not None:
            logger.info("policy %s trains %s", name, train_last_layers(self.model, cfg.trainable_layers))
        self.model = self._place_model(self.model)
        self.backend = make_backend(rollout)   # rollout.generation_backend; see accord.generation.backends
        self._adapter: str | None = None       # the LoRA adapter a backend selects (LoraPolicy: its name)
        if training.gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        self.model.train()
        self.ref_model = None
        if algo.kl_coef > 0:
            self.ref_model = self._reference_model()
        self._start_learner([p for p in self.model.parameters() if p.requires_grad], total_optimizer_steps, seed)
        self.bf16 = resolve_bf16(training.bf16, self.device)
        self._keep_arg = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self.context_len = getattr(self.model.config, "max_position_embeddings", None)

    def _settings(self, name: str, cfg: PolicyConfig, training: TrainingConfig, algo: AlgorithmConfig,
                  rollout: RolloutConfig) -> None:
        self.name, self.cfg, self.training, self.algo, self.rollout = name, cfg, training, algo, rollout

    def _start_learner(self, params: list[torch.nn.Parameter], total_optimizer_steps: int, seed: int) -> None:
        """The policy's own sampling stream, and an AdamW with its LR schedule over ``params`` (what this policy
        trains: the whole model, or one adapter)."""
        self.generator = make_generator(self.device, sampling_stream_seed(seed))
        self._streams: dict[str, torch.Generator] = {}
        self.params = params
        self.optimizer = make_adamw(self.params, self.cfg.lr or self.training.lr, self.training)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(
            self.training.warmup_steps, total_optimizer_steps, self.training.schedule))

    # --- prompts -------------------------------------------------------------------------------
    def encode_chat(self, messages: list[dict[str, str]], max_new_tokens: int | None = None) -> list[int]:
        """Token ids of a chat prompt ending with the assistant turn's opening; it must leave room in the
        model's context for ``max_new_tokens`` (default ``rollout.max_new_tokens``: an agent's own cap)."""
        ids = chat_ids(self.tokenizer, messages, vars(self).setdefault("_chat_ids", OrderedDict()))
        limit = self.rollout.max_prompt_tokens
        if len(ids) > limit:
            raise PromptTooLongError(
                f"a prompt of policy {self.name!r} has {len(ids)} tokens, more than rollout.max_prompt_tokens="
                f"{limit}; raise rollout.max_prompt_tokens or shorten the task's texts")
        new = self.rollout.max_new_tokens if max_new_tokens is None else max_new_tokens
        if self.context_len and len(ids) + new > self.context_len:
            raise PromptTooLongError(
                f"a prompt of policy {self.name!r} has {len(ids)} tokens; with max_new_tokens={new} (rollout's, or "
                f"the agent's sampling.max_new_tokens) it exceeds the model context of {self.context_len}; lower "
                "max_new_tokens or rollout.max_prompt_tokens")
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # --- generation ------------------------------------------------------------------------------
    def seed_stream(self, stream: str, seed: int) -> None:
        """(Re)start a named random stream for sampling outside training (e.g. ``eval``)."""
        self._streams[stream] = make_generator(self.device, seed)

    def generate(self, prompts: list[list[int]], *, greedy: bool, temperature: float,
                 stream: str | None = None, sampling: list[Sampling] | None = None) -> list[Generation]:
        """Complete tokenised prompts in batches (fp32 even with training.bf16: bf16 autocast slows CPU
        decoding); sampling settings other than the temperature come from the rollout config, or each
        prompt's from ``sampling`` (temperature included: its agent's settings).

        Sampling draws from this policy's own random stream (saved in checkpoints), so a policy samples
        the same tokens whether it runs in the trainer's process or in a Ray actor; ``stream`` names
        a stream started by :meth:`seed_stream` instead, which leaves the training stream untouched.
        """
        return self.backend.generate(self.model, self.tokenizer, prompts, greedy=greedy, temperature=temperature,
                                     generator=self._stream(stream), name=self.name, adapter=self._adapter,
                                     sampling=sampling)

    def _stream(self, stream: str | None) -> torch.Generator:
        if stream is not None and stream not in self._streams:
            raise KeyError(f"policy {self.name!r} has no random stream {stream!r}; call seed_stream first")
        return self.generator if stream is None else self._streams[stream]

    def decode_job(self, prompts: list[list[int]], *, greedy: bool, temperature: float, stream: str | None = None,
                   sampling: list[Sampling] | None = None) -> DecodeJob | None:
        """:meth:`generate`'s call as a job that :func:`accord.generation.hf.generate_together` can run beside
        other policies' (same tokens, same log-probs, same stream), or None where this policy's generation
        is not one call of the hf backend's loop: another backend, a LoRA adapter, data-parallel ranks, more
        prompts than ``rollout.generation_batch_size``, a model that accord's own loop does not decode."""
        if (type(self).generate is not ModelPolicy.generate or type(self.backend) is not HFBackend
                or self._adapter is not None or len(prompts) > self.rollout.generation_batch_size
                or not supports_own_loop(self.model)):
            return None
        return DecodeJob(self.model, self.tokenizer, prompts, greedy, self._stream(stream), self.name,
                         settings(self.rollout, temperature, sampling))

    # --- log-probs -------------------------------------------------------------------------------
    def autocast(self):
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _forward_completion(self, model, batch: list[Sample], want_entropy: bool, *, untruncated: bool = False,
                            kl_too: bool = False, entropy_grad: bool = False):
        """Log-probs of each sample's completion tokens, right-aligned in a (b, C) tensor.

        Sequences are left-padded so that every completion ends at the last position; only the last
        C + 1 positions' logits are computed (C = longest completion). When a prompt occurs more than
        once in ``batch`` (the K samples of one prompt), or distinct prompts share a long enough prefix,
        :meth:`_forward_shared_prompts` computes each prompt, and each such prefix, once.

        ``untruncated``: the log-probs are those of the untruncated distribution at the sampling
        temperature (no top-k / top-p), as the KL reference uses. ``kl_too``: also return, as a fourth
        value, the untruncated log-probs from the same forward (the KL penalty's side of the policy).
        ``entropy_grad``: the entropies keep their gradient (the entropy bonus, ``algorithm.entropy_coef``).
        """
        if self._can_share_prompts(model):
            layout = self._prompt_layout(batch)
            if len(layout[1]) < len(batch) or layout[2]:
                return self._forward_shared_prompts(model, batch, want_entropy, untruncated=untruncated,
                                                    kl_too=kl_too, entropy_grad=entropy_grad, layout=layout)
        c = max(len(s.completion_ids) for s in batch)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids, attn = left_pad([s.prompt_ids + s.completion_ids for s in batch], pad)
        targets = torch.full((len(batch), c), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), c), dtype=torch.bool)
        for i, s in enumerate(batch):
            n = len(s.completion_ids)
            targets[i, c - n:] = torch.tensor(s.completion_ids)
            mask[i, c - n:] = True
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        ids, attn, positions, targets, mask = (t.to(self.device) for t in (ids, attn, positions, targets, mask))
        kwargs = {"logits_to_keep": c + 1} if self._keep_arg else {}
        with self.autocast():
            logits = model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=False,
                           **kwargs).logits
        logp, ent, full = self._completion_logprobs(logits[:, -(c + 1):-1], targets, want_entropy, untruncated,
                                                    kl_too, self._row_settings(batch), entropy_grad,
                                                    self._floor_mask(batch, c, right_aligned=True))
        return (logp, ent, mask, full) if kl_too else (logp, ent, mask)

    def _row_settings(self, batch: list[Sample]) -> tuple:
        """(temperature, top_k, top_p) of the batch's samples as they were drawn: numbers when every sample
        has the same, else one value per sample (tensors)."""
        default = rollout_sampling(self.rollout)
        rows = [(x.temperature, x.top_k, x.top_p) for x in (s.sampling or default for s in batch)]
        if all(r == rows[0] for r in rows):
            return rows[0]
        temperature, top_k, top_p = zip(*rows)
        return (torch.tensor(temperature, dtype=torch.float32, device=self.device),
                torch.tensor(top_k, device=self.device), torch.tensor(top_p, dtype=torch.float32, device=self.device))

    def _floor_mask(self, batch: list[Sample], c: int, right_aligned: bool) -> torch.Tensor | None:
        """(b, C) bool: the completion positions where a sample's ``min_new_tokens`` held EOS back when it was
        drawn (completions right-aligned in C columns, or left-aligned); None when no sample had a floor."""
        default = rollout_sampling(self.rollout).min_new_tokens
        floors = [(s.sampling.min_new_tokens if s.sampling is not None else default) for s in batch]
        if not any(floors):
            return None
        lengths = torch.tensor([len(s.completion_ids) for s in batch])
        return floor_mask(lengths, torch.tensor(floors), c, right_aligned).to(self.device)

    def _eos(self) -> torch.Tensor:
        """The EOS ids generation holds back under ``min_new_tokens`` (those :func:`accord.generation.hf.generate`
        stops at)."""
        if getattr(self, "_eos_cache", None) is None:
            self._eos_cache = torch.tensor(eos_ids(self.model, self.tokenizer), device=self.device)
        return self._eos_cache

    def _completion_logprobs(self, logits: torch.Tensor, targets: torch.Tensor, want_entropy: bool,
                             untruncated: bool = False, kl_too: bool = False, settings: tuple | None = None,
                             entropy_grad: bool = False, blocked: torch.Tensor | None = None):
        """Log-probs of ``targets`` (and entropies) under the sampling transform of ``logits`` (b, C, V)
        (without its top-k / top-p truncation when ``untruncated``), and, with ``kl_too``, the
        untruncated log-probs as a third value (the same tensor when sampling is not truncated).
        ``settings``: (temperature, top_k, top_p) from :meth:`_row_settings` (None: the rollout config's).
        ``blocked`` (b, C): where EOS was held back (:meth:`_floor_mask`), in both distributions."""
        r = self.rollout
        if settings is None:
            s = rollout_sampling(r)
            settings = (s.temperature, s.top_k, s.top_p)
        temperature, top_k, top_p = settings
        if isinstance(top_k, torch.Tensor):
            truncated = bool((top_k > 0).any()) or bool((top_p < 1.0).any())
        else:
            truncated = top_k > 0 or top_p < 1.0
        truncated = truncated and not untruncated
        floor = {} if blocked is None else {"blocked": blocked, "blocked_ids": self._eos()}
        processed = process_logits(logits, temperature, top_k if truncated else 0, top_p if truncated else 1.0,
                                   keep=targets if truncated else None, **floor)
        # a held-back EOS is a -inf logit too: the entropy skips it as it skips truncated tokens
        logp, ent = logprobs_and_entropy(processed, targets, want_entropy, truncated or blocked is not None,
                                         entropy_grad)
        full = None
        if kl_too:
            full = logp if not truncated else logprobs_and_entropy(
                process_logits(logits, temperature, **floor), targets, want_entropy=False, truncated=False)[0]
        return logp, ent, full

    def _can_share_prompts(self, model) -> bool:
        """Prompt sharing needs a KV cache through the forward (:func:`can_cache_forward`)."""
        return can_cache_forward(model)

    @staticmethod
    def _prompt_layout(batch: list[Sample]) -> tuple[list[int], list[list[int]], tuple | None]:
        """(each sample's distinct-prompt number, the distinct prompts in order of first appearance, their
        :func:`prefix_plan`)."""
        index, first = first_occurrences([tuple(s.prompt_ids) for s in batch])
        distinct = [batch[r].prompt_ids for r in first]
        return index, distinct, prefix_plan(distinct)

    def _forward_shared_prompts(self, model, batch: list[Sample], want_entropy: bool, *, untruncated: bool = False,
                                kl_too: bool = False, entropy_grad: bool = False, layout: tuple | None = None):
        """:meth:`_forward_completion` with each distinct prompt run once.

        When distinct prompts share prefixes long enough to be worth it (:func:`prefix_plan`: the instructions
        and opening lines every turn of an agent repeats), each such prefix runs once first and its cache is
        copied to the prompts that start with it (:func:`prefix_pass`); the rest of each distinct prompt
        (left-padded) then runs on top. The distinct prompts' pass keeps its KV cache, whose rows are then copied
        to the samples (:func:`select_cache_rows`, so gradients from every sample flow back into the one
        prompt pass, summed in a fixed order), and the completions (right-padded) run on top of them. The
        last prompt position's logits predict each completion's first token. Same log-probs as the full-sequence
        forward up to float rounding, with the prompt's compute paid once instead of K times. ``layout``: the
        batch's :meth:`_prompt_layout`, when the caller has it.
        """
        index, distinct, plan = layout or self._prompt_layout(batch)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        c = max(len(s.completion_ids) for s in batch)
        rows = torch.tensor(index)
        lengths = torch.tensor([len(s.completion_ids) for s in batch])
        completion = torch.full((len(batch), c), pad, dtype=torch.long)
        for i, s in enumerate(batch):
            completion[i, :len(s.completion_ids)] = torch.tensor(s.completion_ids)
        left_mask = torch.arange(c)[None, :] < lengths[:, None]           # (b, C), completions left-aligned
        rows, lengths, completion, left_mask = (t.to(self.device) for t in (rows, lengths, completion, left_mask))
        cache = DynamicCache(config=model.config)
        kwargs = {"logits_to_keep": 1} if self._keep_arg else {}
        with self.autocast():
            ids, attn, positions = prefix_pass(model, distinct, pad, self.device, cache, plan, **kwargs)
            head = model(input_ids=ids, attention_mask=attn, position_ids=positions, **cache_kwargs(model, cache),
                         use_cache=True, **kwargs).logits[:, -1:].index_select(0, rows)
            if c > 1:
                select_cache_rows(cache, rows)
                full_attn = torch.cat([attn.index_select(0, rows), left_mask[:, :c - 1].long()], dim=1)
                rest = model(input_ids=completion[:, :c - 1], attention_mask=full_attn,
                             position_ids=positions[rows, -1:] + 1 + torch.arange(c - 1, device=self.device)[None, :],
                             **cache_kwargs(model, cache), use_cache=True).logits
                logits = torch.cat([head, rest], dim=1)
            else:
                logits = head
        logp, ent, full = self._completion_logprobs(logits, completion, want_entropy, untruncated, kl_too,
                                                    self._row_settings(batch), entropy_grad,
                                                    self._floor_mask(batch, c, right_aligned=False))
        # right-align like the full-sequence forward: column j holds completion token j - (C - n)
        steps = torch.arange(c, device=self.device)[None, :]
        source = (steps - (c - lengths)[:, None]).clamp(min=0)
        mask = steps >= (c - lengths)[:, None]
        logp = logp.gather(1, source).masked_fill(~mask, 0.0)
        if ent is not None:
            ent = ent.gather(1, source).masked_fill(~mask, 0.0)
        if kl_too:
            return logp, ent, mask, full.gather(1, source).masked_fill(~mask, 0.0)
        return logp, ent, mask

    @torch.no_grad()
    def _reference_logprobs(self, batch: list[Sample]) -> torch.Tensor:
        """Log-probs of the KL reference (the frozen initial weights) under the untruncated distribution at
        the sampling temperature: truncated like the sampler, the reference would give -inf to every
        token the moved policy samples outside the reference's own top-k / top-p set."""
        return self._forward_completion(self.ref_model, batch, want_entropy=False, untruncated=True)[0]

    @torch.no_grad()
    def logprobs(self, samples: list[Sample]) -> list[list[float]]:
        """Each sample's completion-token log-probs under the current weights, with its own sampling settings
        (the computation the update's ratio uses; eval mode is not set, so active dropout applies as in the update)."""
        out: list[list[float]] = []
        for micro in micro_batches(samples, self.training.micro_batch_size, self.training.micro_batch_tokens):
            logp, _, mask = self._forward_completion(self.model, micro, want_entropy=False)
            c = mask.size(1)
            out.extend(logp[i, c - len(s.completion_ids):].float().tolist() for i, s in enumerate(micro))
        return out

    @torch.no_grad()
    def kl_rewards(self, samples: list[Sample]) -> list[tuple[float, int]]:
        """``kl_estimator: k1`` as a reward penalty: per sample, the sum over its completion tokens of
        log pi - log ref (both untruncated at the sampling temperature; pi = the current weights, which
        sampled them) and its token count. Called before the update, so it is the sampling policy's KL."""
        out = []
        for micro in micro_batches(samples, self.training.micro_batch_size, self.training.micro_batch_tokens):
            logp, _, mask = self._forward_completion(self.model, micro, want_entropy=False, untruncated=True)
            ref = self._reference_logprobs(micro)
            sums = ((logp - ref) * mask).sum(-1).tolist()
            out.extend((v, len(s.completion_ids)) for v, s in zip(sums, micro))
        return out

    # --- sampler / learner ---------------------------------------------------------------------
    def sampler_mismatch(self) -> str | None:
        """Why this policy's sampler may give other log-probs than its learner (None: both are the same fp32
        computation on the same weights, up to float rounding)."""
        reasons = []
        if self.bf16:
            reasons.append("training.bf16: the update runs under bf16 autocast, generation in fp32")
        if self.backend.name != "hf":
            reasons.append(f"generation backend {self.backend.name!r} samples with its own kernels")
        if dropout_in_training(self.model):
            reasons.append("dropout is active in the update (training mode), not in generation")
        return "; ".join(reasons) or None

    @property
    def tis_mode(self) -> str:
        """``algorithm.tis`` for this policy: ``off``, ``truncate`` or ``mask`` (``auto`` resolved once, logged)."""
        mode = getattr(self, "_tis", None)
        if mode is None:
            mode = self.algo.tis
            if mode == "auto":
                why = self.sampler_mismatch()
                if why and not self.backend.sampling_logprobs:
                    logger.warning("policy %s: the sampler may differ from the learner (%s), but generation backend %r "
                                   "stores no sampling log-probs: no mismatch correction", self.name, why,
                                   self.backend.name)
                    why = None
                mode = "truncate" if why else "off"
                logger.info("policy %s: algorithm.tis=auto -> %s (%s)", self.name, mode,
                            why or "sampler and learner are the same fp32 computation")
            self._tis = mode
        return mode

    @torch.no_grad()
    def _learner_logprobs(self, samples: list[Sample]) -> dict[int, torch.Tensor]:
        """The learner's log-probs of every sample's completion before the update (this process's part of each
        mini-batch; by ``id(sample)``), computed once as the ratio's denominator."""
        out: dict[int, torch.Tensor] = {}
        n_mb = self.training.num_mini_batches
        for mb in range(n_mb):
            for micro, real in self._micro_batches(samples[mb::n_mb]):
                logp, _, mask = self._forward_completion(self.model, micro, want_entropy=False)
                if real:
                    c = mask.size(1)
                    for i, s in enumerate(micro):
                        out[id(s)] = logp[i, c - len(s.completion_ids):].float()
        return out

    # --- update ----------------------------------------------------------------------------------
    def update_setup(self, samples: list[Sample]) -> tuple[bool, int, str, bool, LossSpec, Sampling, list[int]]:
        """What every update over ``samples`` starts with (the policy update and the value-head update of
        :mod:`accord.critics`): the generation backend releases its memory (vLLM's sleep mode: the engine's GPU
        memory is the update's until it wakes), then (fresh, mini-batches, tis mode, stored sampling
        log-probs available, loss spec, default sampling settings, sample order). Fresh: one epoch and one
        mini-batch, so the ratio is exactly 1. The order is by prompt length, then prompt, then completion
        length: the K samples of a prompt sit together, so a micro-batch computes each of its prompts once
        (see _forward_shared_prompts), and lengths stay near ascending for micro_batch_tokens packing."""
        algo, tr = self.algo, self.training
        self.backend.before_update()
        tis, stored_ok = self.tis_mode, self.backend.sampling_logprobs
        if tis != "off" and not stored_ok:
            raise ConfigError(f"algorithm.tis={tis} weights tokens by pi_learner / pi_sampler, but generation backend "
                              f"{self.backend.name!r} stores no sampling log-probs; set algorithm.tis=off")
        order = sorted(range(len(samples)), key=lambda i: (len(samples[i].prompt_ids), samples[i].prompt_ids,
                                                           len(samples[i].completion_ids)))
        fresh = algo.ppo_epochs == 1 and tr.num_mini_batches == 1
        return (fresh, tr.num_mini_batches, tis, stored_ok, LOSS_SPECS.get(algo.loss, LossSpec()),
                rollout_sampling(self.rollout), order)

    def update(self, samples: list[Sample], step: int) -> dict[str, float]:
        """``ppo_epochs`` passes of the registered policy loss over this policy's samples.

        With one epoch and one mini-batch the samples are fresh: the ratio is exactly 1, so the
        current log-probs (detached) serve as the old ones and no extra forward is paid; the stored
        sampling log-probs are then only compared to them (``logp_diff``) and, with the mismatch
        correction on, give each token's weight. Otherwise the old log-probs are the stored sampling ones,
        or, with the correction on (or a backend that stores none), the learner's, computed once first.
        """
        algo, tr = self.algo, self.training
        schedule_to_run_step(self.scheduler, step, algo.ppo_epochs * tr.num_mini_batches)
        fresh, n_mb, tis, stored_ok, spec, default, order = self.update_setup(samples)
        sums: dict[str, float] = {}
        tokens_total = 0
        grad_norms = []
        skipped = 0
        self.model.train()
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        learner_old = None
        if not fresh and (tis != "off" or not stored_ok):
            learner_old = self._learner_logprobs([samples[i] for i in order])
        for epoch in range(algo.ppo_epochs):
            for mb in range(n_mb):
                idx = order[mb::n_mb]
                mb_samples = [samples[i] for i in idx]
                totals = LossTotals(num_tokens=max(1, sum(len(s.completion_ids) for s in mb_samples)),
                                    num_seqs=max(1, len(mb_samples)))
                self.optimizer.zero_grad(set_to_none=True)
                for micro, real in self._micro_batches(mb_samples):
                    kl_in_loss = algo.kl_coef > 0 and algo.kl_estimator in KL_LOSS_ESTIMATORS
                    bonus = algo.entropy_coef > 0
                    logp, ent, mask, *full = self._forward_completion(
                        self.model, micro, want_entropy=epoch == 0 or bonus, kl_too=kl_in_loss, entropy_grad=bonus)
                    c = mask.size(1)
                    stored = right_aligned([s.logprobs for s in micro], c, self.device)
                    if fresh:
                        old = logp.detach()
                    elif learner_old is not None:
                        old = right_aligned([learner_old[id(s)] if id(s) in learner_old else [] for s in micro], c,
                                            self.device)
                    else:
                        old = stored
                    weights = over = None
                    if tis != "off":
                        weights, over = tis_weights(old, stored, algo.tis_cap, tis)
                    ref = None
                    if kl_in_loss:
                        ref = self._reference_logprobs(micro)
                    adv = torch.tensor([s.advantage for s in micro], dtype=logp.dtype, device=self.device)
                    max_lens = torch.tensor([(s.sampling or default).max_new_tokens for s in micro],
                                            dtype=logp.dtype, device=self.device)
                    loss, stats = policy_loss(
                        logp, old, adv, mask, totals, epsilon=algo.epsilon, epsilon_high=algo.epsilon_high,
                        agg=algo.loss_agg, kl_coef=algo.kl_coef if kl_in_loss else 0.0, ref_logp=ref,
                        kl_estimator=algo.kl_estimator, kl_logp=full[0] if full else None, loss=algo.loss,
                        weights=weights, max_lens=max_lens, sampling_logp=stored if spec.sampling_logprobs else None,
                        entropy=ent if bonus else None, entropy_coef=algo.entropy_coef)
                    if not real:  # a filler micro-batch (FSDP): its collectives run, its gradient is zero
                        loss.mul(0.0).backward()
                        continue
                    if not torch.isfinite(loss):
                        raise TrainingError(
                            f"step {step}: loss of policy {self.name!r} is {loss.item()} (epoch {epoch}, mini-batch "
                            f"{mb}); lower training.lr, enable training.max_grad_norm, or check the rewards")
                    loss.backward()
                    if epoch == 0:
                        fm = mask.float()
                        stats[mn.ENTROPY] = (ent.detach() * fm).sum()
                        if stored_ok:
                            stats[mn.LOGP_DIFF] = ((logp.detach() - stored).abs() * fm).sum()
                        if weights is not None:
                            log_r = old - stored   # log pi_learner - log pi_sampler: k3 estimate of KL(sampler||learner)
                            stats[mn.TIS_WEIGHT] = (weights * fm).sum()
                            stats[mn.TIS_CAPPED] = (over.float() * fm).sum()
                            stats[mn.MISMATCH_KL] = ((log_r.exp() - 1.0 - log_r) * fm).sum()
                        tokens_total += int(fm.sum())
                    for key, v in stats.items():
                        if key in _EVERY_EPOCH or epoch == 0:
                            sums[key] = sums.get(key, 0.0) + float(v)
                self._sync_gradients()
                max_norm = tr.max_grad_norm if tr.max_grad_norm is not None else float("inf")
                norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
                if not torch.isfinite(norm):
                    raise TrainingError(
                        f"step {step}: gradient norm of policy {self.name!r} is {norm.item()}; lower training.lr "
                        "or check the rewards for extreme values")
                grad_norms.append(float(norm))
                if not optimizer_step(self.optimizer, float(norm), tr.skip_zero_grad):
                    skipped += 1
                scheduler_step(self.scheduler)
        self.optimizer.zero_grad(set_to_none=True)
        bound_retained_memory()   # run.retain_freed_memory: heap growth beyond the steady state goes back to the OS
        sums, tokens_total = self._reduce_stats(sums, tokens_total)
        denom = max(1, tokens_total)
        metrics = {key: v / denom for key, v in sums.items()}
        metrics[mn.GRAD_NORM] = sum(grad_norms) / len(grad_norms)
        metrics[mn.LR] = self.scheduler.get_last_lr()[0]
        metrics[mn.SKIPPED_STEPS] = float(skipped)
        if cuda:  # the update's peak on this policy's GPU (logged as mem/<policy>/cuda_peak_mb)
            metrics[mn.mem_key(self.name, mn.CUDA_PEAK_MB)] = torch.cuda.max_memory_allocated(self.device) / 2**20
            # what torch's allocator held at its peak: the gap to the line above is fragmentation (accord plan)
            reserved = torch.cuda.max_memory_reserved(self.device) / 2**20
            metrics[mn.mem_key(self.name, mn.CUDA_RESERVED_PEAK_MB)] = reserved
        return metrics

    def run(self, fn, *args, **kwargs):
        """``fn(self, *args, **kwargs)`` where this policy lives (in its Ray actor on that backend): how the
        value heads and preference updates of :mod:`accord.critics` reach the model without a method here."""
        return fn(self, *args, **kwargs)

    # placement hooks (FSDP shards here: accord.distributed.fsdp)
    def _place_model(self, model):
        """The freshly loaded (CPU) model on this policy's device."""
        return model.to(self.device)

    def _reference_model(self):
        """The frozen KL reference: a copy of the initial weights."""
        return copy.deepcopy(self.model).eval().requires_grad_(False)

    # data-parallel hooks (see accord.distributed.data_parallel): a single process trains on everything
    def _micro_batches(self, mini_batch: list[Sample]) -> list[tuple[list[Sample], bool]]:
        """This process's micro-batches of a mini-batch, each with whether it counts (False: a filler
        that only keeps collectives in step; its loss is multiplied by 0)."""
        tr = self.training
        return [(m, True) for m in micro_batches(self._local_samples(mini_batch), tr.micro_batch_size,
                                                   tr.micro_batch_tokens)]

    def _local_samples(self, mini_batch: list[Sample]) -> list[Sample]:
        """The part of a mini-batch this process computes the loss of (normalised by the whole mini-batch)."""
        return mini_batch

    def _sync_gradients(self) -> None:
        """Make the gradients those of the whole mini-batch before clipping and the optimizer step."""

    def _reduce_stats(self, sums: dict[str, float], tokens: int) -> tuple[dict[str, float], int]:
        """The update's loss statistics (sums) and token count over the whole batch."""
        return sums, tokens

    # --- state -----------------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        directory.mkdir(exist_ok=True)
        save_model(self.model, str(directory / "model.safetensors"))
        torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                    "generator": self.generator.get_state(), "generator_device": self.device.type},
                   directory / "optimizer.pt")

    def load(self, directory: Path) -> None:
        """Restore from :meth:`save`'s files, whichever device wrote them: tensors are read onto the CPU
        and copied into the model and the optimizer state on this policy's device."""
        load_model(self.model, str(directory / "model.safetensors"), strict=True, device="cpu")
        state = read_saved_state(directory / "optimizer.pt", ("optimizer", "scheduler", "generator"))
        groups = state["optimizer"].get("param_groups") if isinstance(state["optimizer"], dict) else None
        if isinstance(groups, list) and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
            saved = sum(len(group["params"]) for group in groups)
            if saved != len(self.params):
                raise ConfigError(f"{directory}: the checkpoint's optimizer trained {saved} tensors of policy "
                                  f"{self.name!r}, this run trains {len(self.params)}; resume with the "
                                  f"trainable_layers the run was trained with (policies.{self.name}.trainable_layers "
                                  "in its config.yaml)")
        what = f"policy {self.name!r}"
        load_optimizer_state(self.optimizer, state["optimizer"], what)   # moves the moments to the parameters' device
        load_scheduler_state(self.scheduler, state["scheduler"], what)
        restore_generator(self.generator, state["generator"], state.get("generator_device"), f"policy {self.name!r}")

    def export(self, directory: Path) -> None:
        """Save as a Hugging Face model directory (loadable with from_pretrained or as a policy model)."""
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)


def build_policy(cfg, name: str, index: int, total_optimizer_steps: int, device=None) -> ModelPolicy:
    """Policy ``name`` of a config; ``index`` is its position among the sorted policy names (its seed:
    :func:`accord.seeding.policy_seed`); ``device`` where its model lives (default the CPU; see
    :mod:`accord.devices`). The Ray backend calls this inside each policy's actor, so both backends build the
    same."""
    return ModelPolicy(name, cfg.policies[name], cfg.training, cfg.algorithm, cfg.rollout, total_optimizer_steps,
                       seed=policy_seed(cfg.run.seed, index), device=device)
