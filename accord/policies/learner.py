"""What every learner of the package shares: the AdamW over fp32 master weights, the LR schedule, the split of a
mini-batch into micro-batches, the model switches an update needs (gradient checkpointing, whether dropout is
active), the optimizer step that a zero gradient skips, and the copy of a shared prompt pass's KV cache rows to
the samples built on it.
:class:`accord.policies.model.ModelPolicy`, :class:`accord.policies.lora.LoraPolicy` and the value heads of
:mod:`accord.critics` use them, so an optimizer or schedule setting means the same thing everywhere."""

from __future__ import annotations

import logging
import math
import warnings

import torch

from accord.config import ConfigError, TrainingConfig
from accord.generation.fast_decode import SHARE_MIN_TOKENS, PrefixNode, prefix_tree
from accord.generation.hf import left_pad, supports_own_loop
from accord.models.common import cache_kwargs
from accord.rollout.sample import Sample

logger = logging.getLogger(__name__)


def lr_lambda(warmup: int, total: int, schedule: str):
    """Multiplier of the base LR at optimizer step ``s``: linear warm-up, then constant/linear/cosine."""

    def f(s: int) -> float:
        if warmup and s < warmup:
            return (s + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (s - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def make_adamw(params: list[torch.nn.Parameter], lr: float, training: TrainingConfig) -> torch.optim.AdamW:
    """AdamW over the fp32 master weights: torch's fused kernel where it covers the parameters' device
    (CPU from torch 2.4), else the foreach one (slower; docs/performance.md, *Measured numbers*)."""
    kwargs = dict(lr=lr, betas=training.betas, weight_decay=training.weight_decay, eps=training.eps)
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except RuntimeError as err:  # torch < 2.4 on CPU, or a device without the fused kernel
        logger.debug("fused AdamW unavailable (%s); using foreach", err)
        return torch.optim.AdamW(params, foreach=True, **kwargs)


def optimizer_step(optimizer: torch.optim.Optimizer, grad_norm: float, skip_zero_grad: bool) -> bool:
    """One optimizer step on the gradients in place, or none when ``skip_zero_grad`` is set and the gradient's
    norm is exactly 0: AdamW's step on a zero gradient still moves each weight by its decaying momentum, a move
    no sample of this mini-batch asked for (on a gated reward, every group scoring the same can follow one bad
    update, and the momentum then carries the policy further the same way). Whether it stepped."""
    if skip_zero_grad and grad_norm == 0.0:
        return False
    optimizer.step()
    return True


def schedule_to_run_step(scheduler: torch.optim.lr_scheduler.LRScheduler, step: int, per_step: int) -> None:
    """Move an LR schedule forward to the first optimizer step of run step ``step`` (``per_step`` of them a run
    step: ``algorithm.ppo_epochs`` x ``training.num_mini_batches``). Every learner's schedule spans the run's
    optimizer steps, so one that took fewer (not trained in some steps: ``algorithm.alternate_every``, fewer
    samples or pairs than mini-batches) catches up here: warm-up and decay keep to the run's clock. Never moves
    a schedule back."""
    position = step * per_step
    if scheduler.last_epoch < position:
        scheduler.last_epoch = position - 1
        scheduler_step(scheduler)


def scheduler_step(scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    """Advance the LR schedule by one optimizer step, taken or skipped (:func:`optimizer_step`). torch warns
    when a schedule advances before its optimizer's first step, which is what a skipped first step is here, on
    purpose: that warning is not shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before",
                                category=UserWarning)
        scheduler.step()


def read_saved_state(path, keys: tuple[str, ...]) -> dict:
    """A ``torch.save``'d dict of a checkpoint (a learner's ``optimizer.pt``: optimizer, schedule, random stream;
    the preference buffer's ``pairs.pt``), read weights-only onto the CPU and checked to hold ``keys``: a
    ValueError naming what is missing where it does not (a file of another program, or of an older or damaged
    checkpoint, loaded unverified)."""
    state = torch.load(path, weights_only=True, map_location="cpu")
    if not isinstance(state, dict):
        raise ValueError(f"{path.name} holds a {type(state).__name__}, not the dict of names accord saves")
    missing = [k for k in keys if k not in state]
    if missing:
        raise ValueError(f"{path.name} holds no {', '.join(missing)}")
    return state


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved, what: str) -> None:
    """Load an optimizer's saved ``state_dict`` once :func:`check_optimizer_state` finds it fits ``optimizer``."""
    check_optimizer_state(optimizer, saved, what)
    optimizer.load_state_dict(saved)


def check_optimizer_state(optimizer: torch.optim.Optimizer, saved, what: str) -> None:
    """A ValueError naming the first mismatch unless a saved optimizer ``state_dict`` fits ``optimizer``: parameter
    groups of the same sizes and kinds of settings, each saved moment a tensor of its parameter's (global) shape.
    torch checks only the group sizes: a moment of another shape failed (or broadcast) at the next step, a list or
    a string where a dict belongs was a TypeError."""
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    moments = saved.get("state") if isinstance(saved, dict) else None
    if not (isinstance(groups, list) and isinstance(moments, dict)
            and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)):
        raise ValueError(f"{what}: the saved optimizer state is not an optimizer's (no parameter groups or moments)")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    ids = [i for g in groups for i in g["params"]]
    if len(ids) != len(params) or [len(g["params"]) for g in groups] != [len(g["params"]) for g in
                                                                          optimizer.param_groups]:
        raise ValueError(f"{what}: the saved optimizer holds {len(ids)} tensors in {len(groups)} group(s), this one "
                         f"{len(params)} in {len(optimizer.param_groups)}")
    if ids != list(range(len(params))) or not set(moments) <= set(ids):   # as torch numbers them
        raise ValueError(f"{what}: the saved optimizer numbers its tensors {str(ids)[:40]}, with moments of "
                         f"{str(sorted(moments, key=str))[:40]}, not 0 to {len(params) - 1}")
    for saved_group, group in zip(groups, optimizer.param_groups):
        for key in saved_group.keys() & group.keys() - {"params"}:
            if not _same_kind(saved_group[key], group[key]):
                raise ValueError(f"{what}: the saved optimizer's {key} is {str(saved_group[key])[:40]!r}, not a "
                                 f"{type(group[key]).__name__} like this one's")
    for i, p in zip(ids, params):
        entry = moments.get(i, {})
        if not isinstance(entry, dict):
            raise ValueError(f"{what}: the saved moments of tensor {i} are a {type(entry).__name__}, not a dict")
        for key, value in entry.items():
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"{what}: the saved {key} of tensor {i} is a {type(value).__name__}, not a tensor")
            if value.dim() > 0 and value.shape != p.shape:
                raise ValueError(f"{what}: the saved {key} of tensor {i} has shape {list(value.shape)}, its parameter "
                                 f"{list(p.shape)}")


def _same_kind(saved, current) -> bool:
    """Whether a saved optimizer setting can stand for the current one: a number for a number, a pair of numbers
    for a pair (lists and tuples alike), a flag for a flag, None or a string where the current is one."""
    number = (int, float)
    if isinstance(current, bool) or current is None or isinstance(current, str):
        return type(saved) is type(current) or saved is None or current is None
    if isinstance(current, number):
        return isinstance(saved, number) and not isinstance(saved, bool)
    if isinstance(current, (tuple, list)):
        return (isinstance(saved, (tuple, list)) and len(saved) == len(current)
                and all(_same_kind(a, b) for a, b in zip(saved, current)))
    if isinstance(current, torch.Tensor):
        return isinstance(saved, (torch.Tensor, *number))
    return True


def load_scheduler_state(scheduler: torch.optim.lr_scheduler.LRScheduler, saved, what: str) -> None:
    """Load a schedule's saved ``state_dict`` once it is a dict with an integer step, a base LR per parameter group,
    and no key that would replace one of the schedule's methods (``LambdaLR.load_state_dict`` copies the dict into
    the object: a string step, or a ``step`` key, failed at the next step). Other keys pass: torch's versions save
    different ones."""
    methods = [k for k in saved if callable(getattr(type(scheduler), str(k), None))] if isinstance(saved, dict) else []
    if not isinstance(saved, dict) or methods:
        raise ValueError(f"{what}: the saved LR schedule is not this schedule's state")
    lrs = saved.get("base_lrs", scheduler.base_lrs)
    if not (isinstance(lrs, list) and len(lrs) == len(scheduler.base_lrs)
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in lrs)):
        raise ValueError(f"{what}: the saved LR schedule's base LRs are {str(lrs)[:40]!r}, not one number per "
                         f"parameter group ({len(scheduler.base_lrs)})")
    step = saved.get("last_epoch")
    if not isinstance(step, int) or isinstance(step, bool) or step < -1:
        raise ValueError(f"{what}: the saved LR schedule's step is {str(step)[:40]!r}, not a count of steps")
    scheduler.load_state_dict(saved)


def micro_batches(samples: list[Sample], size: int, max_tokens: int | None = None) -> list[list[Sample]]:
    """Split a mini-batch (in order) into micro-batches of ``size`` sequences, or, with ``max_tokens``,
    into runs whose padded size (sequences x longest prompt+completion) stays within ``max_tokens``;
    a sequence longer than the budget runs alone. The loss does not depend on the split: it is
    normalised by the whole mini-batch's token and sequence counts."""
    if max_tokens is None:
        return [samples[i:i + size] for i in range(0, len(samples), size)]
    out: list[list[Sample]] = []
    cur: list[Sample] = []
    width = 0
    for s in samples:
        n = len(s.prompt_ids) + len(s.completion_ids)
        if cur and (len(cur) + 1) * max(width, n) > max_tokens:
            out.append(cur)
            cur, width = [], 0
        cur.append(s)
        width = max(width, n)
    if cur:
        out.append(cur)
    return out


def dropout_in_training(model) -> bool:
    """Whether the model's forward in training mode drops activations (an ``nn.Dropout`` with p > 0, e.g. LoRA's,
    or an attention dropout in its config): the learner's log-probs then differ from the sampler's."""
    config = getattr(model, "config", None)
    if config is not None and float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0:
        return True
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def right_aligned(rows: list, width: int, device=None) -> torch.Tensor:
    """(len(rows), width) float tensor with each row's values at its right end (zeros before them)."""
    out = torch.zeros((len(rows), width))
    for i, values in enumerate(rows):
        if len(values):
            out[i, width - len(values):] = torch.as_tensor(values, dtype=out.dtype)
    return out if device is None else out.to(device)


def enable_gradient_checkpointing(model) -> None:
    """HF gradient checkpointing, non-reentrant: correct when the inputs need no grad (frozen
    embeddings under LoRA), and active only in training mode (generation is unaffected)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(f"training.gradient_checkpointing=true: {type(model).__name__} does not support gradient "
                         "checkpointing; set it to false")
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 (the old name is deprecated)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def decoder_blocks(model, n: int) -> torch.nn.ModuleList:
    """The decoder blocks of ``model`` (``model.get_decoder().layers``) that ``trainable_layers=n`` chooses the last
    of; a ConfigError naming the setting when the model has no such list."""
    blocks = getattr(model.get_decoder(), "layers", None) if hasattr(model, "get_decoder") else None
    if not isinstance(blocks, torch.nn.ModuleList):
        raise ConfigError(f"trainable_layers={n}: {type(model).__name__} has no list of decoder blocks "
                          "(model.get_decoder().layers) to choose the last ones from; set the policy's "
                          "trainable_layers to null to train the whole model")
    return blocks


def train_last_layers(model, n: int) -> str:
    """``policies.<name>.trainable_layers``: freeze what lies below the last ``n`` decoder blocks of ``model`` (the
    blocks before them and the input embeddings); its last ``n`` blocks, final norm and an output head of its own
    train. No activation below the lowest trained block then requires grad, so autograd's backward stops there.
    An output head tied to the input embeddings stays frozen with them (training it would take the backward
    through every block). With ``n`` at least the model's blocks nothing lies below them: the whole model trains.
    Returns what trains, for the log."""
    blocks = decoder_blocks(model, n)
    total = sum(p.numel() for p in model.parameters())
    if n >= len(blocks):
        return f"the whole model ({len(blocks)} blocks, trainable_layers={n}; {total / 1e6:.1f}M parameters)"
    model.requires_grad_(False)
    for block in blocks[len(blocks) - n:]:
        block.requires_grad_(True)
    norm = getattr(model.get_decoder(), "norm", None)
    if isinstance(norm, torch.nn.Module):
        norm.requires_grad_(True)
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and head.weight is not embeddings.weight:
        head.requires_grad_(True)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    head_state = ("and its output head" if head is not None and head.weight.requires_grad
                  else "(its output head tied to the frozen embeddings)")
    return (f"the last {n} of {len(blocks)} blocks and the final norm {head_state}: {trained / 1e6:.1f}M of "
            f"{total / 1e6:.1f}M parameters")


def can_cache_forward(model) -> bool:
    """Whether a forward of ``model`` can run on top of a KV cache, as prompt and prefix sharing need: a plain
    full-attention cache (as in generation) and no gradient checkpointing (which turns the cache off in
    training)."""
    checkpointing = getattr(model, "is_activation_checkpointing", None)   # transformers >= 5
    if checkpointing is None:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    return not checkpointing and supports_own_loop(model)


def prefix_plan(prompts: list[list[int]]) -> tuple[list[list[int]], list[int]] | None:
    """How a forward (the update's, a critic's) runs the distinct ``prompts`` in two passes: ``(prefixes, of)``: the
    distinct ``prefixes`` run first, once each, and prompt ``u`` then runs its tokens after ``prefixes[of[u]]`` on
    top of that prefix's cache. A prompt's prefix is the longest one it shares with other prompts that
    :func:`~accord.generation.fast_decode.prefix_tree` finds worth sharing (the instructions and opening lines
    every turn of an agent repeats); a prompt that shares none has all but its last token as its own. None when
    that spares fewer than ``SHARE_MIN_TOKENS`` positions, padding included, of one pass over the left-padded
    prompts."""
    if len(prompts) < 2:
        return None
    end = [0] * len(prompts)

    def assign(nodes: list[PrefixNode]) -> None:
        for node in nodes:
            for child in node.children:
                if child.children:
                    assign([child])
                else:
                    end[child.members[0]] = node.end

    assign(prefix_tree(prompts))
    # a prompt that shares no prefix worth it runs all but its last token in the first pass, as its own prefix:
    # the second pass's width is then that of the shared prefixes' continuations
    end = [n if n else len(p) - 1 for p, n in zip(prompts, end)]
    keys = [tuple(p[:n]) for p, n in zip(prompts, end)]
    index: dict[tuple, int] = {}
    of = [index.setdefault(k, len(index)) for k in keys]
    prefixes = [list(k) for k in index]
    if not all(prefixes):   # a one-token prompt: no first-pass row for it (an all-padding row attends to nothing)
        return None
    one_pass = len(prompts) * max(map(len, prompts))
    two_passes = (len(prefixes) * max(map(len, prefixes))
                  + len(prompts) * max(len(p) - n for p, n in zip(prompts, end)))
    return (prefixes, of) if one_pass - two_passes >= SHARE_MIN_TOKENS else None


def prefix_pass(model, prompts: list[list[int]], pad: int, device: torch.device, cache, plan, **kwargs
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first of the two passes of ``plan`` (:func:`prefix_plan` of the distinct ``prompts``; None: one pass):
    the shared prefixes run once each through ``model`` (``kwargs`` go to its call) into ``cache``, whose rows are
    then copied to the prompts that start with them. Returns what the second pass runs on top of ``cache``: the
    rest of each prompt left-padded (ids), the attention mask over the prefix and the rest, and the positions
    (without a plan: the whole prompts, ``cache`` untouched)."""
    prefixes, of = plan if plan else ([[]], [0] * len(prompts))
    ids, attn = left_pad([p[len(prefixes[u]):] for p, u in zip(prompts, of)], pad)
    positions = torch.tensor([len(p) for p in prefixes])[of][:, None] + (attn.cumsum(-1) - 1).clamp(min=0)
    ids, attn, positions = ids.to(device), attn.to(device), positions.to(device)
    if plan:
        prefix_ids, prefix_attn = (t.to(device) for t in left_pad(prefixes, pad))
        model(input_ids=prefix_ids, attention_mask=prefix_attn, position_ids=(prefix_attn.cumsum(-1) - 1).clamp(min=0),
              **cache_kwargs(model, cache), use_cache=True, **kwargs)
        rows = torch.tensor(of, device=device)
        select_cache_rows(cache, rows)
        attn = torch.cat([prefix_attn.index_select(0, rows), attn], dim=1)
    return ids, attn, positions


def select_cache_rows(cache, rows: torch.Tensor) -> None:
    """Replace each layer's cached keys and values by their rows ``rows`` (a 1-D index, repeats allowed), with
    ``index_select``, whose backward sums the gradients of a repeated row in index order. The advanced indexing
    of ``DynamicCache.batch_select_indices`` would sum them with atomic adds on a CPU with several threads, in an
    order that changes from one process to the next: the same run would end with different last bits."""
    for layer in cache.layers:
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        layer.keys = layer.keys.index_select(0, rows)
        layer.values = layer.values.index_select(0, rows)
