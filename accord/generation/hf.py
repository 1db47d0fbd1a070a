"""Batched generation for the HF backend, returning sampling log-probs.

Every token is drawn by :class:`_Sampler`, which applies
:func:`accord.algorithms.losses.process_logits` (through ``sampling_logits``: the same logits, and top-p's kept
tokens) and records the drawn token's log-prob, so the distribution sampled from is exactly the one the learner
evaluates.

Three drivers share that sampler:

* the direct decoding loop (:func:`_decode_direct`) for the models
  :class:`accord.generation.fast_decode.DecodeStep` covers (Llama, Qwen2, Mistral, Qwen3 in fp32, plain
  LoRA adapters included, no hooks or sliding windows): each distinct prompt is prefilled once by ``DecodeStep.prefill``
  (a prefix shared by several prompts once for all of them, no padding), its keys and values are shared
  by its K rows (:class:`accord.generation.fast_decode.SharedPrefixCache`), each decoding step runs as
  ``DecodeStep``, and a row that emitted EOS leaves the batch; models that hold their first layers frozen and
  equal (policies of one model under ``trainable_layers``) run that loop together (:func:`generate_together`),
  those layers once per step for all their rows;
* accord's loop through the model's forward (:func:`_decode`: other models whose cache is a plain
  full-attention ``DynamicCache``, and rows with per-row forward arguments, such as PEFT's
  ``adapter_names`` on adapters ``DecodeStep`` does not cover): the distinct prompts are prefilled once and
  their cache copied K times, and the cache grows in place by doubling instead of being concatenated anew at
  every token;
* Hugging Face ``generate`` for every other model (sliding-window or hybrid caches, state-space
  layers, encoder-decoders), in greedy mode with a neutral generation config and the sampler as its
  only logits processor.

All three consume the random stream identically (one uniform number per row per step, finished rows
included, until every row has finished), so they draw the same tokens wherever the logits agree to
within the draw's margin (their products round differently in the last bits; ``bench/generation_speed.py``
counts the rows that differ). It measures the drivers against each other and against the code before
issue 25.

Prompts are left-padded (the direct loop keeps each prompt's own length instead). The boundary
between prompt and completion is the padded prompt width (a count, never a search for a pad or EOS
id), and a completion ends after its first EOS token: everything after it is dropped, so padding never
enters the loss.
"""

from __future__ import annotations

import functools
import inspect
import logging
from dataclasses import dataclass

import torch
from transformers import (DynamicCache, GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria,
                          StoppingCriteriaList)

try:  # per-layer caches (transformers >= 4.56)
    from transformers.cache_utils import DynamicLayer
except ImportError:  # pragma: no cover - older transformers: Hugging Face generate drives every model
    DynamicLayer = None

from accord.algorithms.losses import sampling_logits
from accord.generation.fast_decode import (DecodeStep, SharedPrefixCache, decode_together, peft_base,
                                           unsupported_reason)

logger = logging.getLogger(__name__)


@dataclass
class Generation:
    """One completion: token ids (through the first EOS, inclusive), their sampling log-probs, and
    why it ended (``stop``: EOS emitted; ``length``: max_new_tokens reached)."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: str


class GenerationError(RuntimeError):
    """The model produced non-finite logits while generating."""


class _Sampler(LogitsProcessor):
    """Draws each next token itself and records its log-prob under the sampling distribution.

    ``generate`` runs in greedy mode and this processor returns a score row that is 0 at the chosen
    token and -inf elsewhere, so the argmax is the token drawn here. Drawing here rather than
    through ``generate``'s ``torch.multinomial`` keeps the chosen token and its log-prob together
    (no bookkeeping across steps) and is cheaper: inverse-CDF sampling draws one uniform number per
    row, while multinomial (and an exponential race) draw one per vocabulary entry.
    """

    def __init__(self, temperature: float | torch.Tensor, top_k: int | torch.Tensor, top_p: float | torch.Tensor,
                 greedy: bool, name: str, generator: torch.Generator | None = None,
                 row_generators: list[torch.Generator] | None = None, caps: torch.Tensor | None = None,
                 floors: int | torch.Tensor = 0, eos: list[int] | None = None):
        # temperature / top_k / top_p: one number, or one value per row (rows of agents with their own settings)
        self.temperature, self.top_k, self.top_p, self.greedy, self.name = temperature, top_k, top_p, greedy, name
        # floors: min_new_tokens, one number or one per row: no token of ``eos`` is drawn before that many tokens
        self.floors = floors
        self.eos = None if eos is None else torch.tensor(eos)
        self.longest_floor = int(floors.max()) if isinstance(floors, torch.Tensor) and floors.numel() else int(floors)
        if self.longest_floor and self.eos is None:
            raise ValueError("min_new_tokens needs the EOS ids to hold back")
        self.generator = generator
        self.row_generators = row_generators
        self.caps = caps   # (rows,) each row's length cap, or None: every row runs to max_new_tokens
        self.logprobs: list[torch.Tensor] = []

    def draw(self, scores: torch.Tensor, rows: torch.Tensor | None = None, total: int | None = None) -> torch.Tensor:
        """The next token of each row of ``scores`` (rows, vocab), shape (rows, 1); records its log-prob.

        ``rows``: which of the batch's ``total`` rows ``scores`` holds (the others have finished and left
        the batch); the random stream advances for all ``total`` rows all the same, so a row draws the same
        number whether or not finished rows are still computed beside it. Per-row settings are those of
        the rows held.
        """
        temperature, top_k, top_p = self.temperature, self.top_k, self.top_p
        if isinstance(temperature, torch.Tensor):
            if temperature.device != scores.device:
                self.temperature, self.top_k, self.top_p = (t.to(scores.device) for t in (temperature, top_k, top_p))
                temperature, top_k, top_p = self.temperature, self.top_k, self.top_p
            if rows is not None:
                temperature, top_k, top_p = temperature[rows], top_k[rows], top_p[rows]
        blocked = None
        step = len(self.logprobs)
        if step < self.longest_floor:   # min_new_tokens: this step's rows still under their floor draw no EOS
            floors = self.floors
            if isinstance(floors, torch.Tensor):
                floors = floors.to(scores.device)
                if rows is not None:
                    floors = floors[rows]
                blocked = step < floors
            else:
                blocked = torch.ones(scores.size(0), dtype=torch.bool, device=scores.device)
        processed, support = sampling_logits(scores, temperature, top_k, top_p, blocked=blocked, blocked_ids=self.eos)
        log_probs = torch.log_softmax(processed, dim=-1)
        if self.greedy:
            logp, tokens = log_probs.max(dim=-1, keepdim=True)
        else:
            # inverse-CDF sampling: one uniform number per row; searching right of u never lands on
            # a zero-probability (truncated) token, whose CDF step is flat. Over top-p's support only where
            # it truncates every row: a truncated token adds an exact 0 to the running sum, so the sums at
            # the kept tokens, and the token found, are those of the whole vocabulary's (bit for bit where the
            # sum runs in order, as on the CPU; a GPU's parallel scan may differ in the last bits of fp64)
            vocab = log_probs.size(-1)
            if support is None:
                cdf = log_probs.exp().double().cumsum_(dim=-1)
            else:
                padded = support == vocab
                cdf = log_probs.gather(1, support.clamp(max=vocab - 1)).masked_fill_(
                    padded, float("-inf")).exp_().double().cumsum_(dim=-1)
            n = scores.size(0) if total is None else total
            if self.row_generators is not None:  # one stream per row: a row's draws do not depend on its batch
                u = torch.cat([torch.rand((1, 1), dtype=torch.float64, device=cdf.device, generator=g)
                               for g in self.row_generators])
            else:
                u = torch.rand((n, 1), dtype=torch.float64, device=cdf.device, generator=self.generator)
            if rows is not None:
                u = u[rows]
            tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
            if support is None:
                tokens.clamp_(max=vocab - 1)
            else:  # (u * sum rounding up to the sum itself: the last kept token)
                tokens = support.gather(1, torch.minimum(tokens, (~padded).sum(1, keepdim=True) - 1))
            logp = log_probs.gather(1, tokens)
        logp = logp.squeeze(1)
        if rows is not None:  # finished rows record 0 (their tokens after EOS are dropped)
            logp = logp.new_zeros(total).index_copy_(0, rows, logp)
        self.logprobs.append(logp)
        return tokens

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        tokens = self.draw(scores)
        return torch.full_like(scores, float("-inf")).scatter_(1, tokens, 0.0)


class _GrowingLayer(DynamicLayer or object):
    """A full-attention cache layer whose keys and values are views into buffers that grow by doubling.

    ``DynamicLayer`` concatenates the whole cache with each new token, which made decoding quadratic
    in the length: at 16 rows and 350 cached tokens, SmolLM2-135M spent two thirds of each decoding
    step in ``torch.cat``. Here a token costs one write into spare room.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self._keys = self._values = None
        self._length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self._length + key_states.size(-2)
        if self._keys is None or end > self._keys.size(-2):
            room = max(end, self.capacity, 2 * (self._keys.size(-2) if self._keys is not None else 0))
            self._keys = self._grow(self._keys, key_states, room)
            self._values = self._grow(self._values, value_states, room)
            self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
        self._keys[..., self._length:end, :] = key_states
        self._values[..., self._length:end, :] = value_states
        self._length = end
        self.keys, self.values = self._keys[..., :end, :], self._values[..., :end, :]
        return self.keys, self.values

    def _grow(self, old: torch.Tensor | None, new: torch.Tensor, room: int) -> torch.Tensor:
        shape = list(new.shape)
        shape[-2] = room
        buffer = new.new_empty(shape)
        if old is not None:
            buffer[..., :self._length, :] = old[..., :self._length, :]
        return buffer

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` of the batch (repeats allowed: one prompt's prefill serving K samples)."""
        self._keys, self._values = self._keys.index_select(0, index), self._values.index_select(0, index)
        self.keys, self.values = self._keys[..., :self._length, :], self._values[..., :self._length, :]

    def get_seq_length(self) -> int:
        return self._length


def eos_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the tokenizer and model define no EOS token; set tokenizer.eos_token before training")
    return ids


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    batch_size: int = 64,
    name: str = "model",
    generator: torch.Generator | None = None,
    row_args: dict[str, list] | None = None,
    row_generators: list[torch.Generator] | None = None,
    row_sampling: list | None = None,
    min_new_tokens: int = 0,
) -> list[Generation]:
    """Generate one completion per prompt (repeat a prompt K times for K samples).

    Prompts are token-id lists (already chat-formatted). Batches of ``batch_size`` rows are decoded
    together. Greedy decoding records the log-probs of the untransformed distribution.
    ``generator`` is the random stream sampling draws from (default: torch's global one).
    ``row_args`` are per-row keyword arguments of the model's forward (one list entry per prompt),
    such as PEFT's ``adapter_names``; rows share a prefill only when their prompt and their
    ``row_args`` are equal. ``row_generators``: one random stream per prompt instead of ``generator``
    (a row then samples the same tokens whichever batch, or data-parallel rank, decodes it; see
    :mod:`accord.distributed.data_parallel`). ``row_sampling``: one object per prompt with ``temperature``,
    ``top_k``, ``top_p``, ``max_new_tokens`` and ``min_new_tokens`` (:class:`accord.rollout.sample.Sampling`)
    that replace the scalar settings row by row, so agents with different settings share one batch; a row draws
    and records what the scalar settings would give it, and ends at its own cap (``finish_reason`` length).
    ``min_new_tokens``: no EOS id is drawn before this many tokens (greedy too); the recorded log-probs are
    those of the distribution without EOS there.
    """
    _check_settings(prompts, max_new_tokens, min_new_tokens, row_sampling)
    if row_generators is not None and len(row_generators) != len(prompts):
        raise ValueError(f"row_generators has {len(row_generators)} entries for {len(prompts)} prompts; give one per prompt")
    row_args = dict(row_args or {})
    for key, values in row_args.items():
        if len(values) != len(prompts):
            raise ValueError(f"row_args[{key!r}] has {len(values)} entries for {len(prompts)} prompts; give one per prompt")
    eos = eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    own_loop = supports_own_loop(model)
    # the direct decoding step takes one per-row forward argument: PEFT's LoRA adapter names
    reason = unsupported_reason(model) if own_loop else None
    if reason is None and set(row_args) - {"adapter_names"} or row_args and not peft_base(model)[1]:
        reason = f"per-row forward arguments {sorted(row_args)}"
    direct = own_loop and reason is None
    if own_loop and not direct:
        logger.debug("decoding %s through its forward: %s", type(model).__name__, reason)
    was_training = model.training
    model.eval()
    out: list[Generation] = []
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start:start + batch_size]
            args = {k: v[start:start + batch_size] for k, v in row_args.items()}
            rows = None if row_generators is None else row_generators[start:start + batch_size]
            sampler, steps = _sampler(greedy, temperature, top_k, top_p, max_new_tokens, min_new_tokens,
                                      None if row_sampling is None else row_sampling[start:start + batch_size],
                                      name, generator, rows, eos)
            decode = _decode_direct if direct else _decode if own_loop else _hf_generate
            completions = decode(model, chunk, args, eos, pad, steps, sampler)
            out.extend(_finish(completions, sampler, eos, name))
    finally:
        model.train(was_training)
    return out


def _sampler(greedy: bool, temperature: float, top_k: int, top_p: float, max_new_tokens: int, min_new_tokens: int,
             row_sampling: list | None, name: str, generator, rows, eos: list[int]) -> tuple[_Sampler, int]:
    """The sampler of one batch and its decoding steps: the scalar settings, or each row's (``row_sampling``)."""
    if row_sampling is not None:
        return _row_sampler(row_sampling, greedy, name, generator, rows, eos)
    return _Sampler(1.0 if greedy else temperature, 0 if greedy else top_k, 1.0 if greedy else top_p, greedy, name,
                    generator, rows, floors=min_new_tokens, eos=eos), max_new_tokens


def _check_settings(prompts: list, max_new_tokens: int, min_new_tokens: int, row_sampling: list | None) -> None:
    empty = next((i for i, p in enumerate(prompts) if len(p) == 0), None)
    if empty is not None:
        raise ValueError(f"prompt {empty} is empty; a completion continues at least one token (a chat template's "
                         "or the tokenizer's BOS)")
    if row_sampling is None and max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: give at least 1")
    if min_new_tokens < 0 or (row_sampling is None and 0 < max_new_tokens <= min_new_tokens):
        raise ValueError(f"min_new_tokens={min_new_tokens} must be >= 0 and below max_new_tokens={max_new_tokens}")
    if row_sampling is not None and len(row_sampling) != len(prompts):
        raise ValueError(f"row_sampling has {len(row_sampling)} entries for {len(prompts)} prompts; give one per prompt")


@dataclass
class DecodeJob:
    """One model's prompts for :func:`generate_together`, with :func:`generate`'s settings (``settings``: its
    keyword arguments ``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``, ``min_new_tokens`` and
    ``row_sampling``) and random stream."""

    model: object
    tokenizer: object
    prompts: list[list[int]]
    greedy: bool
    generator: torch.Generator | None
    name: str
    settings: dict


def generate_together(jobs: list[DecodeJob], trunk: int) -> list[list[Generation]]:
    """Each job's completions, as :func:`generate` of that job alone (one batch) returns them, token for token
    and log-prob for log-prob, from models that share their first ``trunk`` decoder layers
    (:func:`accord.generation.fast_decode.shared_trunk`): every decoding step runs those layers once for the
    rows of all jobs. Each job draws from its own stream with its own settings, and stops drawing when its rows
    have finished, as its own call would."""
    blocks = []
    for job in jobs:
        kw = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_new_tokens": 0, "row_sampling": None,
              **job.settings}
        _check_settings(job.prompts, kw["max_new_tokens"], kw["min_new_tokens"], kw["row_sampling"])
        eos = eos_ids(job.model, job.tokenizer)
        pad = job.tokenizer.pad_token_id if job.tokenizer.pad_token_id is not None else eos[0]
        sampler, steps = _sampler(job.greedy, kw["temperature"], kw["top_k"], kw["top_p"], kw["max_new_tokens"],
                                  kw["min_new_tokens"], kw["row_sampling"], job.name, job.generator, None, eos)
        blocks.append(_Block(job.prompts, eos, pad, steps, sampler))
    modes = [job.model.training for job in jobs]
    for job in jobs:
        job.model.eval()
    try:
        _decode_together([job.model for job in jobs], blocks, trunk)
    finally:
        for job, mode in zip(jobs, modes):
            job.model.train(mode)
    return [_finish(b.tokens, b.sampler, b.eos, job.name) for b, job in zip(blocks, jobs)]


@dataclass
class _Block:
    """One job's batch in :func:`_decode_together`: its settings, then its decoding state."""

    prompts: list[list[int]]
    eos: list[int]
    pad: int
    steps: int
    sampler: _Sampler
    adapters: list[str] | None = None    # each row's LoRA adapter (PEFT's adapter_names), alone in its call
    tokens: torch.Tensor | None = None   # (rows, steps) drawn so far; at the end cut after the last step drawn
    rows: torch.Tensor | None = None     # the unfinished rows, in the cache's order
    token: torch.Tensor | None = None
    position: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    caps: torch.Tensor | None = None
    eos_t: torch.Tensor | None = None
    step: DecodeStep | None = None
    cache: SharedPrefixCache | None = None


def _decode_together(models: list, blocks: list[_Block], trunk: int) -> None:
    """The direct decoding loop over every block at once (one block alone: :func:`_decode_direct`), leaving each
    block's (rows, steps) token ids in its ``tokens``: the first ``trunk`` layers of each step run for the rows of
    every unfinished block together (:func:`accord.generation.fast_decode.decode_together`), each block's
    model runs the rest."""
    device = next(models[0].parameters()).device
    total = sum(len(b.prompts) for b in blocks)
    positions = max(len(p) for b in blocks for p in b.prompts) + max(b.steps for b in blocks)
    first = None
    for model, b in zip(models, blocks):
        n, adapters = len(b.prompts), b.adapters
        index, unique_rows = first_occurrences([(tuple(p), None if adapters is None else adapters[i])
                                                for i, p in enumerate(b.prompts)])
        # rows of one prompt adjacent (the cache's layout); ``rows`` maps them back to the caller's order
        order = sorted(range(n), key=index.__getitem__)
        b.rows = torch.tensor(order, device=device)
        row_prompt = torch.tensor([index[r] for r in order], device=device)
        b.step = DecodeStep(model, positions, rows=total if first is None else n,
                            row_adapters=None if adapters is None else [adapters[r] for r in order],
                            trunk=None if first is None else (first, trunk))
        if first is None:
            first = b.step
        logits, prefix, lengths = b.step.prefill([b.prompts[r] for r in unique_rows],
                                                 None if adapters is None else [adapters[r] for r in unique_rows])
        b.cache = SharedPrefixCache(prefix, lengths, row_prompt, max(b.steps - 1, 0), b.step.row_tags,
                                    b.step.compiled)
        del prefix
        b.logits, b.position = logits[row_prompt], lengths.to(device)[row_prompt]
        b.eos_t = torch.tensor(b.eos, device=device)
        b.caps = None if b.sampler.caps is None else b.sampler.caps.to(device)
        b.tokens = torch.full((n, b.steps), b.pad, dtype=torch.long, device=device)
    live, t = [b for b in blocks if b.steps > 0], 0
    while live:
        going_blocks = []
        for b in live:
            token = b.sampler.draw(b.logits.float(), b.rows, len(b.prompts)).squeeze(1)
            b.tokens[b.rows, t] = token
            if t + 1 == b.steps:
                continue
            going = ~torch.isin(token, b.eos_t)
            if b.caps is not None:   # rows with their own length cap end there
                going &= b.caps[b.rows] > t + 1
            if not bool(going.all()):  # rows that emitted EOS or reached their cap leave the batch
                if not bool(going.any()):
                    b.tokens = b.tokens[:, :t + 1]
                    continue
                b.rows, token, b.position = b.rows[going], token[going], b.position[going]
                b.cache.keep(going)
            b.token = token
            going_blocks.append(b)
        live = going_blocks
        if len(live) == 1:
            live[0].logits = live[0].step(live[0].token, live[0].position, live[0].cache)
        elif live:
            outs = decode_together([b.step for b in live], trunk, [b.token for b in live],
                                   [b.position for b in live], [b.cache for b in live])
            for b, logits in zip(live, outs):
                b.logits = logits
        for b in live:
            b.position = b.position + 1
        t += 1


def _row_sampler(settings: list, greedy: bool, name: str, generator, rows, eos: list[int]) -> tuple[_Sampler, int]:
    """A sampler with each row's own settings, and the decoding steps (the largest cap); rows whose cap is
    that largest one need no cap of their own (``caps`` None when every row has it)."""
    caps = torch.tensor([s.max_new_tokens for s in settings])
    floors = torch.tensor([s.min_new_tokens for s in settings])
    steps = int(caps.max())
    if greedy:
        temperature, top_k, top_p = 1.0, 0, 1.0
    else:
        temperature = torch.tensor([float(s.temperature) for s in settings], dtype=torch.float32)
        top_k = torch.tensor([int(s.top_k) for s in settings])
        top_p = torch.tensor([float(s.top_p) for s in settings], dtype=torch.float32)
    return _Sampler(temperature, top_k, top_p, greedy, name, generator, rows,
                    None if bool((caps == steps).all()) else caps, floors, eos), steps


class _RowCaps(StoppingCriteria):
    """Hugging Face ``generate``'s per-row end at each row's own length cap."""

    def __init__(self, caps: torch.Tensor, prompt_width: int):
        self.caps, self.prompt_width = caps, prompt_width

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        return (input_ids.size(1) - self.prompt_width) >= self.caps.to(input_ids.device)


def supports_own_loop(model) -> bool:
    """Whether accord's decoding loop applies: a decoder-only model whose default cache is a
    ``DynamicCache`` of plain full-attention layers (not sliding-window, hybrid or recurrent)."""
    if DynamicLayer is None or getattr(model.config, "is_encoder_decoder", False):
        return False
    try:
        layers = DynamicCache(config=model.config).layers
    except (TypeError, ValueError, KeyError, AttributeError) as err:  # a config the cache cannot read
        logger.debug("decoding %s with Hugging Face generate: DynamicCache cannot read its config (%s)",
                     type(model).__name__, err)
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def left_pad(prompts: list[list[int]], pad: int, extra: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of left-padded prompts; the mask has ``extra`` more (zero) columns."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompts), width + extra), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        attention[i, width - len(p):width] = 1
    return ids, attention


def first_occurrences(keys: list) -> tuple[list[int], list[int]]:
    """``(index, first)``: ``index[i]`` numbers the distinct value of ``keys[i]`` (in order of first
    appearance) and ``first[u]`` is the position where distinct value ``u`` first occurs."""
    seen: dict = {}
    index, first = [], []
    for row, key in enumerate(keys):
        if key not in seen:
            seen[key] = len(first)
            first.append(row)
        index.append(seen[key])
    return index, first


def _decode(model, prompts, row_args, eos, pad, max_new_tokens, sampler) -> torch.Tensor:
    """accord's decoding loop through the model's forward (models :class:`DecodeStep` does not cover, per-row
    forward arguments such as PEFT's ``adapter_names``): (rows, steps) token ids, pad after a row's first EOS."""
    device = next(model.parameters()).device
    index, unique_rows = first_occurrences([(tuple(p),) + tuple(_hashable(v[i]) for v in row_args.values())
                                            for i, p in enumerate(prompts)])
    ids, attention = left_pad([prompts[r] for r in unique_rows], pad, extra=max_new_tokens)
    width = ids.size(1)
    ids, attention = ids.to(device), attention.to(device)
    positions = (attention[:, :width].cumsum(-1) - 1).clamp_(min=0)
    cache = DynamicCache(config=model.config)
    cache.layers = [_GrowingLayer(width + max_new_tokens) for _ in cache.layers]
    unique_args = {k: [v[r] for r in unique_rows] for k, v in row_args.items()}
    # no padding (prompts of one length): no mask at all, which spares the model building a 4-D mask
    # per forward
    padded = not bool(attention[:, :width].all())
    logits = model(input_ids=ids, attention_mask=attention[:, :width] if padded else None, position_ids=positions,
                   use_cache=True, **{_cache_kwarg(model): cache}, **_keep_last(model), **unique_args).logits[:, -1]
    if len(unique_rows) < len(prompts):  # K samples of one prompt: copy its prefilled cache K times
        expand = torch.tensor(index, device=device)
        for layer in cache.layers:
            layer.select_rows(expand)
        logits, attention, positions = logits[expand], attention[expand], positions[expand]
    n = len(prompts)
    eos_t = torch.tensor(eos, device=device)
    finished = torch.zeros(n, dtype=torch.bool, device=device)
    caps = None if sampler.caps is None else sampler.caps.to(device)
    tokens = torch.full((n, max_new_tokens), pad, dtype=torch.long, device=device)
    position = positions[:, -1:]
    # generated tokens (pads after EOS included) are attended, like in generate
    attention[:, width:] = 1
    for t in range(max_new_tokens):
        token = sampler.draw(logits.float()).squeeze(1).masked_fill_(finished, pad)
        tokens[:, t] = token
        finished |= torch.isin(token, eos_t)
        if caps is not None:   # rows with their own length cap end there
            finished |= caps <= t + 1
        if t + 1 == max_new_tokens or bool(finished.all()):
            return tokens[:, :t + 1]
        position = position + 1
        logits = model(input_ids=token[:, None], attention_mask=attention[:, :width + t + 1] if padded else None,
                       position_ids=position, use_cache=True, **{_cache_kwarg(model): cache}, **row_args).logits[:, -1]
    return tokens


def _decode_direct(model, prompts, row_args, eos, pad, max_new_tokens, sampler) -> torch.Tensor:
    """The decoding loop with :class:`DecodeStep` (see :mod:`accord.generation.fast_decode`): each distinct
    prompt (and LoRA adapter, ``row_args["adapter_names"]``) prefilled once and its keys and values shared by
    its rows, finished rows dropped from the batch; returns (rows, steps) token ids, pad after a row's first
    EOS."""
    block = _Block(prompts, eos, pad, max_new_tokens, sampler, adapters=row_args.get("adapter_names"))
    _decode_together([model], [block], 0)
    return block.tokens


@functools.lru_cache(maxsize=None)
def _cache_kwarg_of(forward) -> str:
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def _cache_kwarg(model) -> str:
    """The forward's name for the KV cache argument (``cache`` from transformers 5.x, which warns about the
    older ``past_key_values``)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT passes it through
    return _cache_kwarg_of(type(base).forward)


def _hashable(value):
    return tuple(value) if isinstance(value, list) else value


def _keep_last(model) -> dict:
    """``logits_to_keep=1`` where the model's forward takes it (the prefill then skips the output head
    for every prompt token but the last)."""
    try:
        params = inspect.signature(model.get_base_model().forward if hasattr(model, "get_base_model")
                                   else model.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {"logits_to_keep": 1} if "logits_to_keep" in params else {}


def _hf_generate(model, prompts, row_args, eos, pad, max_new_tokens, sampler) -> torch.Tensor:
    """Hugging Face ``generate`` as the driver, with the sampler as its only logits processor."""
    device = next(model.parameters()).device
    input_ids, attention = left_pad(prompts, pad)
    # generate() fills unset fields from model.generation_config (a checkpoint's file may set
    # sampling options or a repetition penalty) and then from global defaults. In greedy mode no
    # warper runs after our processor, and the model's config is swapped for a neutral one during
    # the call so that no penalty or suppression list from a checkpoint's file applies either.
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                              use_cache=True)
    saved = model.generation_config
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    stop = {} if sampler.caps is None else {"stopping_criteria": StoppingCriteriaList([_RowCaps(sampler.caps,
                                                                                                 input_ids.size(1))])}
    try:
        seqs = model.generate(
            input_ids=input_ids.to(device), attention_mask=attention.to(device), generation_config=config,
            logits_processor=LogitsProcessorList([sampler]), **stop, **row_args,
        )
    finally:
        model.generation_config = saved
    return seqs[:, input_ids.size(1):]


def _finish(completions: torch.Tensor, sampler: _Sampler, eos: list[int], name: str) -> list[Generation]:
    """Cut each row after its first EOS and pair it with its recorded log-probs."""
    completions = completions.cpu()
    n = completions.size(0)
    logprobs = torch.stack(sampler.logprobs, dim=1).float().cpu() if sampler.logprobs else torch.zeros(n, 0)
    # NaN logits make NaN log-probs; checking once here instead of per decoding step saves a full pass
    # over the vocabulary and a synchronisation at every step
    bad = torch.isnan(logprobs).any(dim=0).nonzero()
    if bad.numel():
        raise GenerationError(
            f"policy {name!r} produced non-finite (NaN) logits at generation step {int(bad[0])}; its weights have "
            "diverged: lower training.lr or resume from an earlier checkpoint")
    if logprobs.size(1) != completions.size(1):
        raise RuntimeError(
            f"generate returned {completions.size(1)} new tokens but {logprobs.size(1)} log-probs were recorded; "
            "another logits processor or a generation config default interfered"
        )
    is_eos = torch.zeros_like(completions, dtype=torch.bool)
    for e in eos:
        is_eos |= completions == e
    results = []
    for i in range(n):
        cap = completions.size(1) if sampler.caps is None else min(int(sampler.caps[i]), completions.size(1))
        hits = is_eos[i, :cap].nonzero()   # after a row's own cap come pads, which may be the EOS id
        if hits.numel():
            length = int(hits[0]) + 1
            reason = "stop"
        else:
            length = cap
            reason = "length"
        results.append(Generation(completions[i, :length].tolist(), logprobs[i, :length].tolist(), reason))
    return results
