"""One decoding step of a Llama-family model computed directly from its weights, over a KV cache whose
rows share their prompts.

A decoding step feeds one token per row through the whole model. Hugging Face's forward spends a
small model's step in per-call overhead (about a hundred module calls, a rotary computation, mask
construction and output dataclasses per token), and at the sizes of a training step on a CPU
(SmolLM2-135M, 24 rows, prompts of about 200 tokens; ``bench/README.md``, *generation_speed.py*) the
rest goes to four things this module does differently:

- **matrix products**: each row's token meets every weight once per step, so a step is 8-24-row matrix
  products against weights read from memory, with the weights re-laid out once per generation call and the
  q/k/v projections fused into one product. On x86-64 CPUs with AVX2 they run through accord's own kernel
  (:mod:`accord.generation.cpu_gemm`, compiled on the machine; faster than oneDNN at these rows on the AVX2
  CPUs measured in ``bench/README.md``), else through oneDNN on prepacked weights
  (``torch.ops.mkldnn._reorder_linear_weight``); MKL's ``F.linear`` repacks the weight at every call and took
  1.5x (projections) to 3x (the 49k-row output head) oneDNN's time. Both kernels' rows are independent of the
  batch (a row's products do not depend on which rows decode beside it; its attention does in the last bits
  where the batch's longest prompt is longer than its own, over which the scores are padded: up to 4e-7 on a
  tiny model's logits).
- **attention over the prompt**: the K samples of one prompt attend to one copy of the prompt's keys and
  values (:class:`SharedPrefixCache`) instead of K copies; each row's own generated tokens are kept apart. With
  accord's CPU kernels a layer's attention is one call (each row and key head scored, softmaxed and summed
  alone, the prompt's padding skipped); otherwise the two parts are scored with plain matrix products and one
  softmax over both: the CPU's fused attention kernel took 4 ms per layer for 24 single-token queries.
- **operators per layer**: with accord's CPU kernels the norms before the projections and the rotary embedding
  are one call each too (the rotary embedding's bits are torch's; the norm's sum of squares runs in another
  order): a decoding layer is then about a dozen calls, where torch's operators took about sixty.
- **finished rows** leave the batch (:meth:`SharedPrefixCache.keep`): after its EOS a row costs nothing.
- the cache is preallocated for the call's last token (no growth, no copies).
- **layers that models share**: policies that load one model and train only its last layers
  (``trainable_layers``) hold the layers below equal; their batches run those layers as one
  (:func:`shared_trunk`, :func:`decode_together`), one product per weight for all their rows, and an output
  head tied to the frozen embeddings once for all rows too (after each model's own final norm).

The prefill (:meth:`DecodeStep.prefill`) runs on the same prepacked products. Distinct prompts often share a
prefix (a chat template's system turn, a task's instructions: the default job's six prompts share 24 tokens,
and each agent's three 67 or 98): a prefix that spares enough tokens is computed once (:func:`prefix_tree`),
and every depth of the tree is one pass with its nodes' tokens side by side, so the products see hundreds of
rows at a time instead of one prompt's. The default job's prefill went from 1,147 tokens in six forwards to
793 in three passes.

:class:`DecodeStep` runs the Hugging Face modules' arithmetic (RMSNorm, q/k/v projections, Qwen3's per-head
q/k norms, rotary embedding, grouped-query attention, gated SiLU MLP, output head) as plain torch calls on
the model's own parameters, with the rotary table computed once per generation call by the model's own
rotary module. Its logits match the model's forward to rounding (tested); a different product kernel
changes the last bits of the logits, so a token drawn within rounding distance of a probability boundary
can differ from another path's, which the tests' draws never are.

It applies only where the arithmetic is known exactly: ``LlamaForCausalLM``, ``Qwen2ForCausalLM``,
``MistralForCausalLM`` and ``Qwen3ForCausalLM`` (checked by exact class, so quantised or patched layers and
subclasses are excluded), fp32 parameters, SiLU MLPs, RMSNorm, a rotary type whose table does not depend on
the sequence length, SDPA or eager attention, no hooks on any module, torch >= 2.4 (for ``rms_norm``). Such a
model under PEFT qualifies when its adapters are plain LoRA on the attention and MLP projections (no DoRA,
LoRA biases, merged or disabled adapters, nor adapters on the embedding or the output head): each
:class:`Projection` adds the adapters' term itself, per row (PEFT's ``adapter_names``) or for every row (the
active adapter). Everything else goes through the model's forward.
"""

from __future__ import annotations

import functools
import logging
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from accord.generation import cpu_gemm

logger = logging.getLogger(__name__)

_SUPPORTED = {"LlamaForCausalLM": "LlamaRMSNorm", "Qwen2ForCausalLM": "Qwen2RMSNorm",
              "MistralForCausalLM": "MistralRMSNorm", "Qwen3ForCausalLM": "Qwen3RMSNorm"}
# rotary types whose cos/sin at a position do not depend on the sequence length seen so far
_STATIC_ROPE = {"default", "linear", "llama3"}
# Products with fewer weights than this run through F.linear even where a packed kernel is available: a oneDNN call
# costs about 20 us more than MKL's for a few rows against a small weight (the tiny test models' 192 x 64:
# 29 against 9 us), and the prepacked layout wins only from about 2^18 weights (1024 x 256: 0.8-0.9 of
# F.linear's time at 8-24 rows, 2 threads; 2026-11-25, AMD EPYC, AVX2).
PACK_MIN_WEIGHTS = 1 << 18
# scaled_dot_product_attention's enable_gqa (torch >= 2.5): key/value heads shared by query heads, uncopied
_SDPA_GQA = torch.torch_version.TorchVersion(torch.__version__) >= (2, 5)
# A prefix that several distinct prompts share is prefilled once, and the rest of each prompt from its keys and
# values, when that spares at least this many prompt tokens ((prompts sharing it - 1) x its length): each level
# of the prefix tree is one more pass over every weight, about as long as a dozen tokens' products on a CPU
# (twice the GEMM rate over the read bandwidth), plus its per-call overhead.
SHARE_MIN_TOKENS = 64
# The prefill's passes take at most this many tokens (a longer prompt alone), which bounds their activations.
PREFILL_TOKENS = 4096


def _transformers_class(module: nn.Module, name: str) -> bool:
    cls = type(module)
    return cls.__name__ == name and cls.__module__.startswith("transformers.")


def _has_hooks(model: nn.Module) -> bool:
    for module in model.modules():
        if (module._forward_hooks or module._forward_pre_hooks or getattr(module, "_hf_hook", None) is not None
                or "forward" in module.__dict__):
            return True
    return bool(nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks)


def peft_base(model: nn.Module) -> tuple[nn.Module, bool]:
    """(the Hugging Face model, whether it is wrapped by PEFT) of ``model``."""
    if type(model).__module__.startswith("peft.") and hasattr(model, "get_base_model"):
        return model.get_base_model(), True
    return model, False


def _is_lora_linear(module: nn.Module) -> bool:
    cls = type(module)
    return cls.__name__ == "Linear" and cls.__module__.startswith("peft.tuners.lora")


def _projection_reason(module: nn.Module) -> str | None:
    """Why a projection is neither a plain ``nn.Linear`` nor a plain LoRA layer over one."""
    if type(module) is nn.Linear:
        return None
    if not _is_lora_linear(module):
        return f"a projection is a {type(module).__name__}, not a plain nn.Linear or LoRA layer (quantisation?)"
    if type(module.base_layer) is not nn.Linear or module.fan_in_fan_out:
        return "a LoRA layer wraps something else than a plain nn.Linear"
    if module.merged or module.disable_adapters:
        return "LoRA adapters merged into the weights or disabled"
    if (any(module.use_dora.values()) or any(getattr(module, "lora_bias", {}).values())
            or getattr(module, "lora_variant", None)):
        return "DoRA, LoRA biases or another LoRA variant"
    if any(type(a) is not nn.Linear or a.bias is not None for a in (*module.lora_A.values(), *module.lora_B.values())):
        return "a LoRA factor is not a bias-free nn.Linear"
    return None


def unsupported_reason(model: nn.Module) -> str | None:
    """Why :class:`DecodeStep` cannot run ``model`` (``None`` when it can). A PEFT model qualifies when its
    base does and its adapters are plain LoRA on the attention and MLP projections."""
    model, peft = peft_base(model)
    name = type(model).__name__
    if not hasattr(F, "rms_norm"):
        return f"torch {torch.__version__} has no rms_norm (torch >= 2.4 does)"
    if name not in _SUPPORTED or not _transformers_class(model, name):
        return f"{name} is not one of {sorted(_SUPPORTED)}"
    config = model.config
    if getattr(config, "hidden_act", None) != "silu":
        return f"hidden_act is {config.hidden_act!r}, not 'silu'"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp != 1"
    if model.dtype != torch.float32:
        return f"parameters are {model.dtype}, not float32"
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return f"attention implementation {config._attn_implementation!r}"
    inner = model.model
    rope = getattr(inner, "rotary_emb", None)
    if rope is None or getattr(rope, "rope_type", None) not in _STATIC_ROPE:
        return f"rotary type {getattr(rope, 'rope_type', None)!r}"
    norm = _SUPPORTED[name]
    projections = []
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        if name == "Qwen3ForCausalLM":
            norms += [attn.q_norm, attn.k_norm]
        if not all(_transformers_class(n, norm) for n in norms):
            return "a layer norm is not the model's RMSNorm"
        if not (type(mlp.act_fn) is nn.SiLU or _transformers_class(mlp.act_fn, "SiLUActivation")):
            return f"MLP activation {type(mlp.act_fn).__name__}"
        if getattr(attn, "sliding_window", None):
            return "sliding-window attention"
        projections += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    if not _transformers_class(inner.norm, norm) or type(inner.embed_tokens) is not nn.Embedding:
        return "the final norm or the embedding is not the model's own (or carries an adapter)"
    if type(model.lm_head) is not nn.Linear:
        return "the output head is not a plain nn.Linear (adapters, quantisation)"
    for projection in projections:
        reason = _projection_reason(projection) if peft else (
            None if type(projection) is nn.Linear else "a projection is not a plain nn.Linear (adapters, quantisation)")
        if reason is not None:
            return reason
    if _has_hooks(model):
        return "a module has hooks or a patched forward"
    return None


@functools.lru_cache(maxsize=None)
def onednn_linear_available() -> bool:
    """Whether this torch build runs fp32 products through oneDNN with prepacked weights on the CPU (its
    private ``mkldnn`` ops; absent on builds without oneDNN, such as some ARM ones)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        weight = torch.ops.mkldnn._reorder_linear_weight(torch.ones(3, 2), 1)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(1, 2), weight, None, "none", [], "")
    except (AttributeError, RuntimeError) as err:
        logger.debug("oneDNN prepacked products unavailable (%s); decoding with F.linear", err)
        return False
    return bool(torch.equal(out, torch.full((1, 3), 2.0)))


def product_kernel() -> str | None:
    """The kernel of the CPU's decoding products: ``"accord"`` (:mod:`accord.generation.cpu_gemm`, compiled here),
    else ``"onednn"`` (prepacked weights), else None (``F.linear``)."""
    if cpu_gemm.kernel() is not None:
        return "accord"
    return "onednn" if onednn_linear_available() else None


class Projection:
    """Linear layers sharing an input, as one matrix product (their weights concatenated along the output),
    optionally followed by an elementwise step (added to or multiplied with another tensor as the product is
    stored, a SiLU after it), plus their LoRA adapters.

    ``pack``: the kernel (:func:`product_kernel`): with ``"accord"`` (:mod:`accord.generation.cpu_gemm`) or
    ``"onednn"`` the weight is re-laid out once here (a copy the size of the weights, freed with this object; for
    oneDNN, for ``rows`` rows at a time, a hint: any row count works), unless it has fewer than
    ``PACK_MIN_WEIGHTS`` entries; otherwise the product is ``F.linear`` on the concatenated weight, or on the
    layer's own weight when there is only one.
    ``scales``: a factor per layer multiplied into its weight and bias (the attention's query scaling);
    ``columns``: a factor per input feature multiplied into the weights (the weight of the RMSNorm before).

    LoRA layers (PEFT's, over a plain ``nn.Linear``) add ``scaling * B (A x)`` for each adapter: all adapters'
    A stacked into one product and their B side by side into another (B placed at its layer's output rows),
    ``adapters`` numbering the adapters to include (``None``: each layer's active adapters, for every
    row). With numbered adapters, :meth:`lora` keeps each row's own adapter through a 0/1 mask over the
    stacked A's outputs (``tags``: the adapter of each of them), as PEFT's ``adapter_names`` routes rows.
    """

    def __init__(self, modules: list[nn.Module], rows: int, pack: str | None, scales: list[float] | None = None,
                 columns: torch.Tensor | None = None, adapters: dict[str, int] | None = None):
        scales = scales or [1.0] * len(modules)
        bases = [m.base_layer if _is_lora_linear(m) else m for m in modules]
        weights = [b.weight.detach() if f == 1.0 else b.weight.detach() * f for b, f in zip(bases, scales)]
        self.weight = weights[0] if len(weights) == 1 else torch.cat(weights)
        accord = pack == "accord" and self.weight.numel() >= PACK_MIN_WEIGHTS
        if columns is not None and not accord:  # a preceding RMSNorm's weight: W (w * x) = (W diag(w)) x
            self.weight = self.weight * columns.detach()
        biases = [None if b.bias is None else b.bias.detach() if f == 1.0 else b.bias.detach() * f
                  for b, f in zip(bases, scales)]
        self.bias = None
        if any(b is not None for b in biases):
            self.bias = torch.cat([w.new_zeros(w.size(0)) if b is None else b for w, b in zip(weights, biases)])
        self.factors = self._lora_factors(modules, weights, scales, columns, adapters)
        self.packed, self.kernel, self.out_features = None, None, self.weight.size(0)
        if pack and self.weight.numel() >= PACK_MIN_WEIGHTS:
            self.kernel = pack
            if accord:   # the RMSNorm's weight multiplied in as the weight is laid out, the same products
                self.packed, self.weight = cpu_gemm.pack(self.weight, columns), None
            else:
                # laid out for at least two rows: for one, oneDNN picks another kernel, whose row differs in the
                # last bits from the same row's in a larger batch (a one-row call would not give its row's result)
                self.packed, self.weight = torch.ops.mkldnn._reorder_linear_weight(self.weight, max(rows, 2)), None

    @staticmethod
    def _lora_factors(modules, weights, scales, columns, adapters):
        """(stacked A, B side by side, the adapter number of each stacked row) or None without adapters."""
        a_parts, b_parts, tags = [], [], []
        out, start = sum(w.size(0) for w in weights), 0
        for module, weight, f in zip(modules, weights, scales):
            if _is_lora_linear(module):
                names = adapters if adapters is not None else {n: 0 for n in module.active_adapters}
                for name, tag in names.items():
                    if name not in module.lora_A:
                        continue
                    a = module.lora_A[name].weight.detach()
                    b = weight.new_zeros(out, a.size(0))
                    b[start:start + weight.size(0)] = module.lora_B[name].weight.detach() * (module.scaling[name] * f)
                    a_parts.append(a)
                    b_parts.append(b)
                    tags += [tag] * a.size(0)
            start += weight.size(0)
        if not a_parts:
            return None
        a = torch.cat(a_parts)
        if columns is not None:
            a = a * columns.detach()
        return a, torch.cat(b_parts, dim=1), torch.tensor(tags, device=a.device)

    def lora(self, x: torch.Tensor, masks: dict | None) -> torch.Tensor | None:
        """The adapters' contribution for ``x`` (None without adapters); ``masks``: per-step cache of the
        0/1 masks of the rows' adapters (None: every row gets every adapter)."""
        if self.factors is None:
            return None
        a, b, tags = self.factors
        h = F.linear(x, a)
        if masks is not None:
            mask = masks.get(id(tags))
            if mask is None:
                mask = masks[id(tags)] = (masks["rows"][:, None] == tags[None, :]).to(h.dtype)
            h = h * mask
        return F.linear(h, b)

    def __call__(self, x: torch.Tensor, post: str = "none", other: torch.Tensor | None = None,
                 masks: dict | None = None) -> torch.Tensor:
        """``x`` times the weights (plus bias and adapters), then ``post``: ``swish`` (SiLU), ``add`` or ``mul``
        (with ``other``)."""
        delta = self.lora(x, masks)
        if delta is not None:  # the adapters' term joins before the post-op
            if post == "swish":
                return F.silu(self._product(x, "add", delta))
            if post == "mul":
                return self._product(x, "add", delta) * other
            return self._product(x, "add", delta if post == "none" else delta + other)
        return self._product(x, post, other)

    def _product(self, x: torch.Tensor, post: str, other: torch.Tensor | None) -> torch.Tensor:
        if self.kernel == "accord":
            return cpu_gemm.linear(x, self.packed, self.out_features, self.bias, post, other)
        if self.packed is not None:
            if other is not None:
                return torch.ops.mkldnn._linear_pointwise.binary(x, other, self.packed, self.bias, post)
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, post, [], "")
        y = F.linear(x, self.weight, self.bias)
        if post == "swish":
            return F.silu(y)
        if post == "add":
            return y + other
        if post == "mul":
            return y * other
        return y


def shared_trunk(models: list[nn.Module]) -> int:
    """How many first decoder layers every one of ``models`` (two or more) holds frozen and equal to the first
    model's, with equal frozen input embeddings and equal configs (``policies.<name>.trainable_layers`` of
    policies that load one model: the layers below their trained ones); 0 when they share none, or when one
    of them is not a plain model :class:`DecodeStep` covers on one device. Their rows can then run those
    layers as one batch (:func:`decode_together`).

    The weights are compared once (SmolLM2's 20 frozen blocks: about 0.13 s on 2 cores) and the answer kept for
    these models until a parameter it rests on changes: a frozen one written in place or replaced, or one's
    ``requires_grad``."""
    if len(models) < 2 or any(unsupported_reason(m) is not None or peft_base(m)[1] for m in models):
        return 0
    first = models[0]
    config = {k: v for k, v in first.config.to_dict().items() if k != "_name_or_path"}
    device = first.model.embed_tokens.weight.device
    for other in models[1:]:
        if (type(other) is not type(first) or other.model.embed_tokens.weight.device != device
                or {k: v for k, v in other.config.to_dict().items() if k != "_name_or_path"} != config):
            return 0
    key = tuple(map(id, models))
    known = _TRUNKS.get(key)
    if known is not None and all(ref() is m for ref, m in zip(known[0], models)) and known[1] == _trunk_signature(
            models, known[2]):
        return known[2]
    layers = _count_shared_layers(models)
    _TRUNKS.pop(key, None)
    _TRUNKS[key] = ([weakref.ref(m) for m in models], _trunk_signature(models, layers), layers)
    while len(_TRUNKS) > 8:
        del _TRUNKS[next(iter(_TRUNKS))]
    return layers


# shared_trunk's answers: ids of the models -> (weak references to them, the parameters' signature, the answer)
_TRUNKS: dict[tuple[int, ...], tuple[list, tuple, int]] = {}


def _frozen_equal(modules: list[nn.Module]) -> bool:
    params = [list(m.parameters()) for m in modules]
    return all(len(ps) == len(params[0]) for ps in params) and all(
        not p.requires_grad and p.shape == params[0][i].shape and torch.equal(p, params[0][i])
        for ps in params for i, p in enumerate(ps))


def _count_shared_layers(models: list[nn.Module]) -> int:
    if not _frozen_equal([m.model.embed_tokens for m in models]):
        return 0
    layers = 0
    for blocks in zip(*(m.model.layers for m in models)):
        if not _frozen_equal(list(blocks)):
            break
        layers += 1
    return layers


def _trunk_signature(models: list[nn.Module], layers: int) -> tuple:
    """What :func:`_count_shared_layers`'s answer ``layers`` rests on: the embeddings' and the first ``layers`` + 1
    layers' parameters (the last one the layer that ended the trunk), each frozen one by its storage and version
    counter (which an in-place write advances), each trainable one by that alone."""
    return tuple((p.requires_grad, None if p.requires_grad else (p.data_ptr(), p._version))
                 for m in models for module in [m.model.embed_tokens, *m.model.layers[:layers + 1]]
                 for p in module.parameters())


def decode_together(steps: list[DecodeStep], trunk: int, tokens: list[torch.Tensor], positions: list[torch.Tensor],
                    caches: list[SharedPrefixCache]) -> list[torch.Tensor]:
    """One decoding step of several models' batches, each as :meth:`DecodeStep.__call__` would compute it,
    where the models share their first ``trunk`` layers (:func:`shared_trunk`; each step built with
    ``trunk=(steps[0], trunk)``): the rows of every batch run those layers together, one product per weight for
    all of them (a row's product does not depend on the rows beside it), then their own model's layers, and an
    output head tied to the shared embeddings once more for all rows (each batch's rows normalised by its own
    model's final norm first). Returns each batch's logits; advances every cache. No LoRA adapters."""
    sizes = [t.numel() for t in tokens]
    x, rope = steps[0]._inputs(torch.cat(tokens), torch.cat(positions))
    x = steps[0]._layers(x, rope, caches, None, 0, trunk)
    hidden, first = [], 0
    for step, cache, size in zip(steps, caches, sizes):
        rows = slice(first, first + size)
        h = step._layers(x[rows], tuple(t[rows] for t in rope), [cache], None, trunk, len(step.layers))
        cache.advance()
        hidden.append(step._final_norm(h))
        first += size
    if all(step.head is steps[0].head for step in steps):   # a head tied to the trunk's embeddings: one product
        return list(steps[0].head(torch.cat(hidden)).split(sizes))
    return [step.head(h) for step, h in zip(steps, hidden)]


@dataclass
class PrefixNode:
    """Positions ``[start, end)`` of the prompts ``members``, which agree on them and on every position before,
    prefilled once for all of them; a leaf's ``members`` is its one prompt and ``end`` that prompt's length."""

    start: int
    end: int
    members: list[int]
    children: list[PrefixNode]


def prefix_tree(prompts: list[list[int]], start: int = 0, members: list[int] | None = None,
                min_tokens: int | None = None) -> list[PrefixNode]:
    """The nodes that prefill the distinct ``prompts`` numbered ``members`` (default: all), which agree on
    their first ``start`` tokens: a prefix they share becomes a node of its own when that spares at least
    ``min_tokens`` prompt tokens (default ``SHARE_MIN_TOKENS``), and each prompt keeps at least its last
    token for a leaf of its own (whose last position gives the prompt's next-token logits)."""
    members = list(range(len(prompts))) if members is None else members
    min_tokens = SHARE_MIN_TOKENS if min_tokens is None else min_tokens
    if len(members) == 1:
        return [PrefixNode(start, len(prompts[members[0]]), members, [])]
    end, first = min(len(prompts[u]) for u in members) - 1, prompts[members[0]]
    for u in members[1:]:
        prompt, n = prompts[u], start
        while n < end and prompt[n] == first[n]:
            n += 1
        end = n
    parts: dict[int, list[int]] = {}  # the members by their token at ``end``
    for u in members:
        parts.setdefault(prompts[u][end], []).append(u)
    if end > start and (len(members) - 1) * (end - start) >= min_tokens:
        children = [node for part in parts.values() for node in prefix_tree(prompts, end, part, min_tokens)]
        return [PrefixNode(start, end, members, children)]
    if len(parts) == 1:  # nothing worth sharing: a leaf per prompt
        return [PrefixNode(start, len(prompts[u]), [u], []) for u in members]
    # too short to share among all; the prompts that agree past ``end`` may share more among themselves
    return [node for part in parts.values() for node in prefix_tree(prompts, start, part, min_tokens)]


class SharedPrefixCache:
    """Keys and values of a decoding batch whose rows share prompts.

    ``prefix``: per layer, the keys and values of each distinct prompt, (prompts, kv_heads, width, head_dim),
    ``prefix_lengths``: each prompt's true length (positions past it are padding, masked), ``row_prompt``: the
    prompt of each row, in ascending order (rows of one prompt adjacent). Each row's generated tokens go to
    its own preallocated part of ``steps`` positions. ``row_tags``: each row's LoRA adapter, if any.

    Attention of a row is one softmax over [its prompt's positions, its own generated positions]. ``compiled``
    (default: on the CPU in fp32 where :mod:`accord.generation.cpu_gemm` is built): one call of accord's kernel per
    layer computes it, each row and key head alone. Otherwise torch's operators compute it in the prompts' layout,
    ``slots``: the queries of a prompt's rows side by side (padded to the largest number of rows a prompt has), so
    that the prompt part is one matrix product per prompt and key head for all its rows; only the narrow generated
    part moves between the rows' layout and the slots.
    """

    def __init__(self, prefix: list[tuple[torch.Tensor, torch.Tensor]], prefix_lengths: torch.Tensor,
                 row_prompt: torch.Tensor, steps: int, row_tags: torch.Tensor | None = None,
                 compiled: bool | None = None):
        self.prefix = [(k.contiguous(), v.contiguous()) for k, v in prefix]
        self.row_tags = row_tags  # each row's LoRA adapter number (DecodeStep.row_tags), kept with the rows
        prompts, kv_heads, width, head_dim = self.prefix[0][0].shape
        self.prompts, self.width = prompts, width
        device = self.prefix[0][0].device
        if compiled is None:
            compiled = (device.type == "cpu" and self.prefix[0][0].dtype == torch.float32
                        and cpu_gemm.kernel() is not None)
        self.compiled = compiled
        self.prefix_lengths = prefix_lengths.to(device=device, dtype=torch.long).contiguous()
        rows = row_prompt.numel()
        self.generated = [(k.new_empty(rows, kv_heads, steps, head_dim), k.new_empty(rows, kv_heads, steps, head_dim))
                          for k, _ in self.prefix]
        self.length = 0  # generated positions written (and complete for every layer)
        padding = torch.arange(width, device=device)[None, :] >= prefix_lengths.to(device)[:, None]
        self.bias = None  # added to the prompt part's scores: -inf at the padding
        if bool(padding.any()):
            bias = torch.zeros(padding.shape, dtype=self.prefix[0][0].dtype, device=device).masked_fill_(
                padding, float("-inf"))
            self.bias = bias[:, None, None, :].expand(prompts, kv_heads, 1, width).reshape(prompts * kv_heads, 1, width)
        self._layout(row_prompt.to(device))

    def _layout(self, row_prompt: torch.Tensor) -> None:
        """Slots of the rows in the (prompt, row within prompt) layout."""
        self.row_prompt = row_prompt
        counts = torch.bincount(row_prompt, minlength=self.prompts)
        self.per_prompt = int(counts.max())
        starts = torch.cumsum(counts, 0) - counts
        within = torch.arange(row_prompt.numel(), device=row_prompt.device) - starts[row_prompt]
        self.slots = row_prompt * self.per_prompt + within
        # every prompt with the same number of rows: the slots are the rows themselves
        self.identity = row_prompt.numel() == self.prompts * self.per_prompt

    def keep(self, keep: torch.Tensor) -> None:
        """Drop the rows where ``keep`` (rows,) is False (finished rows) from the cache and the layout."""
        t, index = self.length, keep.nonzero().squeeze(1)
        for i, (k, v) in enumerate(self.generated):
            nk, nv = k.new_empty((index.numel(),) + k.shape[1:]), v.new_empty((index.numel(),) + v.shape[1:])
            nk[:, :, :t].copy_(k[:, :, :t].index_select(0, index))
            nv[:, :, :t].copy_(v[:, :, :t].index_select(0, index))
            self.generated[i] = (nk, nv)
        self._layout(self.row_prompt.index_select(0, index))
        if self.row_tags is not None:
            self.row_tags = self.row_tags.index_select(0, index)

    def _to_slots(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, kv_heads, group, n) -> (prompts * kv_heads, per_prompt * group, n)."""
        rows, kv_heads, group, n = x.shape
        if not self.identity:
            x = x.new_zeros(self.prompts * self.per_prompt, kv_heads, group, n).index_copy_(0, self.slots, x)
        return x.view(self.prompts, self.per_prompt, kv_heads, group, n).transpose(1, 2).reshape(
            self.prompts * kv_heads, self.per_prompt * group, n)

    def _from_slots(self, y: torch.Tensor, kv_heads: int, group: int) -> torch.Tensor:
        """(prompts * kv_heads, per_prompt * group, n) -> (rows, kv_heads, group, n)."""
        n = y.size(-1)
        y = y.view(self.prompts, kv_heads, self.per_prompt, group, n).transpose(1, 2).reshape(
            self.prompts * self.per_prompt, kv_heads, group, n)
        return y if self.identity else y.index_select(0, self.slots)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention output (rows, kv_heads, group, head_dim) of scaled queries ``q`` (rows, kv_heads, group,
        head_dim) at the next position, whose keys and values ``k``, ``v`` (rows, kv_heads, head_dim) are
        stored here first; call :meth:`advance` once every layer has attended."""
        t = self.length
        gk, gv = self.generated[layer]
        if self.compiled:
            return cpu_gemm.attend(q, k, v, *self.prefix[layer], self.row_prompt, self.prefix_lengths, gk, gv, t)
        gk[:, :, t] = k
        gv[:, :, t] = v
        keys, values = gk[:, :, :t + 1], gv[:, :, :t + 1]
        pk, pv = self.prefix[layer]
        rows, kv_heads, group, head_dim = q.shape
        batch, width = self.prompts * kv_heads, self.width
        queries = self._to_slots(q)
        prompt_keys = pk.view(batch, width, head_dim).transpose(1, 2)
        # (into fresh tensors: with ``out=`` a strided slice, torch runs one product per batch entry)
        prompt_scores = (torch.bmm(queries, prompt_keys) if self.bias is None else
                         torch.baddbmm(self.bias, queries, prompt_keys))
        own_scores = self._to_slots(torch.matmul(q, keys.transpose(-1, -2)))
        # one softmax over the prompt part and the row's own tokens
        scores = torch.cat((prompt_scores, own_scores), dim=-1)
        probs = torch.softmax(scores, dim=-1)
        out = self._from_slots(torch.bmm(probs[..., :width], pv.view(batch, width, head_dim)), kv_heads, group)
        own_probs = self._from_slots(probs[..., width:], kv_heads, group)
        return torch.baddbmm(out.reshape(rows * kv_heads, group, head_dim),
                             own_probs.reshape(rows * kv_heads, group, t + 1),
                             values.reshape(rows * kv_heads, t + 1, head_dim)).view(rows, kv_heads, group, head_dim)

    def advance(self) -> None:
        self.length += 1


class DecodeStep:
    """Logits of the next position for one new token per row, reading and extending a
    :class:`SharedPrefixCache`.

    Built per generation call: it holds references to the parameters (or, with oneDNN, a re-laid-out copy
    of the projections' weights, the size of the model's linear layers) and a rotary table for
    ``max_positions`` positions. ``rows``: the batch size, a hint for the weights' layout.
    """

    def __init__(self, model: nn.Module, max_positions: int, rows: int = 1, row_adapters: list[str] | None = None,
                 trunk: tuple[DecodeStep, int] | None = None):
        model, _ = peft_base(model)
        inner, config = model.model, model.config
        first = inner.layers[0].self_attn
        self.head_dim = first.head_dim
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.scaling = first.scaling
        self.embed = inner.embed_tokens.weight
        pack = product_kernel() if self.embed.device.type == "cpu" else None
        # accord's CPU kernels also run the norms before the projections, the rotary embedding and (through
        # SharedPrefixCache) the decoding attention
        self.compiled = pack == "accord"
        # the RMSNorms' weights are multiplied into the projections that read them (``columns``), except the
        # final norm's: a head tied to the embeddings of a shared trunk serves every model that shares it, one
        # product for all their rows (:func:`decode_together`), while their final norms may differ (they train)
        self.final_eps, self.final_weight = inner.norm.variance_epsilon, inner.norm.weight.detach()
        tied = model.lm_head.weight is inner.embed_tokens.weight and model.lm_head.bias is None
        self.head = (trunk[0].head if trunk is not None and trunk[1] > 0 and tied and trunk[0].tied_head
                     else Projection([model.lm_head], rows, pack))
        self.tied_head = tied
        # per-row LoRA adapters (PEFT's adapter_names; "__base__" is none): each row's number, or -1
        adapters, self.row_tags = None, None
        if row_adapters is not None:
            adapters = {n: i for i, n in enumerate(sorted(set(row_adapters) - {"__base__"}))}
            self.row_tags = torch.tensor([adapters.get(n, -1) for n in row_adapters], device=self.embed.device)
        self.adapters = adapters
        # ``trunk``: (another step, n): its first n layers, which this model holds equal (:func:`shared_trunk`),
        # serve here too instead of a re-laid-out copy of their weights of its own
        self.layers = [] if trunk is None else trunk[0].layers[:trunk[1]]
        for layer in inner.layers[len(self.layers):]:
            attn, mlp = layer.self_attn, layer.mlp
            qk_norms, scales = None, [self.scaling, 1.0, 1.0]
            if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head's q and k before the rotary, which
                # undoes a scaling of q_proj: the query scaling goes into q_norm's weight instead
                qk_norms = ((attn.q_norm.weight.detach() * self.scaling, attn.q_norm.variance_epsilon),
                            (attn.k_norm.weight, attn.k_norm.variance_epsilon))
                scales = None
            post_norm = layer.post_attention_layernorm.weight
            self.layers.append((
                layer.input_layernorm.variance_epsilon,
                Projection([attn.q_proj, attn.k_proj, attn.v_proj], rows, pack, scales,
                           columns=layer.input_layernorm.weight, adapters=adapters),
                qk_norms,
                Projection([attn.o_proj], rows, pack, adapters=adapters),
                layer.post_attention_layernorm.variance_epsilon,
                Projection([mlp.gate_proj], rows, pack, columns=post_norm, adapters=adapters),
                Projection([mlp.up_proj], rows, pack, columns=post_norm, adapters=adapters),
                Projection([mlp.down_proj], rows, pack, adapters=adapters),
            ))
        positions = torch.arange(max_positions, device=self.embed.device)[None]
        cos, sin = inner.rotary_emb(self.embed[:1], positions)  # the model's own table, its dtype
        # rotate_half(x) * sin == roll(x, half) * (sin with its first half negated), bit for bit
        half = self.head_dim // 2
        self.cos, self.sin = cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)

    @classmethod
    def build(cls, model: nn.Module, max_positions: int, rows: int = 1,
              row_adapters: list[str] | None = None) -> DecodeStep | None:
        reason = unsupported_reason(model)
        if reason is not None:
            logger.debug("decoding %s through its forward: %s", type(model).__name__, reason)
            return None
        return cls(model, max_positions, rows, row_adapters)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """What the rotary embedding needs of each token: its position (accord's CPU kernels read the tables), or
        the tables' rows at it."""
        if self.compiled:
            return (positions,)
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]

    def _rotate(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The rotary embedding of ``x`` (tokens, heads, head_dim): a new tensor, or ``x`` rotated in place (accord's
        CPU kernel, the same bits)."""
        if self.compiled:
            cpu_gemm.rotate(x.view(x.size(0), -1), x.size(1), self.head_dim, self.cos, self.sin, rope[0])
            return x
        cos, sin = rope
        return x * cos + x.roll(self.head_dim // 2, -1) * sin

    def _norm(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of the rows of ``x`` without a weight (the projections after it carry it)."""
        return cpu_gemm.rms_norm(x, eps) if self.compiled else F.rms_norm(x, (x.size(1),), None, eps)

    def _attention_inputs(self, x: torch.Tensor, layer: tuple, rope: tuple[torch.Tensor, ...],
                          masks: dict | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Scaled, rotated queries (tokens, heads, head_dim), rotated keys and values (tokens, kv_heads,
        head_dim) of the hidden states ``x`` (tokens, dim) in ``layer``."""
        eps1, qkv_proj, qk_norms = layer[:3]
        tokens = x.size(0)
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        q_width, kv_width = heads * head_dim, kv_heads * head_dim
        qkv = qkv_proj(self._norm(x, eps1), masks=masks)
        v = qkv[:, q_width + kv_width:].view(tokens, kv_heads, head_dim)
        if qk_norms is None:  # q and k rotated together (q's weights carry the attention scaling)
            qk = self._rotate(qkv[:, :q_width + kv_width].view(tokens, heads + kv_heads, head_dim), rope)
            return qk[:, :heads], qk[:, heads:], v
        q = F.rms_norm(qkv[:, :q_width].view(tokens, heads, head_dim), (head_dim,), *qk_norms[0])
        k = F.rms_norm(qkv[:, q_width:q_width + kv_width].view(tokens, kv_heads, head_dim), (head_dim,),
                       *qk_norms[1])
        return self._rotate(q, rope), self._rotate(k, rope), v

    def _rest_of_layer(self, x: torch.Tensor, out: torch.Tensor, layer: tuple, masks: dict | None) -> torch.Tensor:
        """The hidden states after ``layer`` from its input ``x`` and its attention's output ``out`` (tokens,
        heads * head_dim): output projection, residual, MLP, residual."""
        o_proj, eps2, gate, up, down = layer[3:]
        x = o_proj(out, "add", x, masks)
        h = self._norm(x, eps2)
        return down(up(h, "mul", gate(h, "swish", masks=masks), masks), "add", x, masks)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, cache: SharedPrefixCache) -> torch.Tensor:
        """``tokens`` (rows,) at ``positions`` (rows,), the rows of ``cache`` in its order; returns (rows, vocab)
        logits and advances the cache by one position."""
        x, rope = self._inputs(tokens, positions)
        masks = None if cache.row_tags is None else {"rows": cache.row_tags}  # the rows' adapters, per step
        x = self._layers(x, rope, [cache], masks, 0, len(self.layers))
        cache.advance()
        return self._logits(x)

    def _inputs(self, tokens: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The embeddings of ``tokens`` and the rotary embedding's inputs at ``positions`` (:meth:`_rope`)."""
        return F.embedding(tokens, self.embed), self._rope(positions)

    def _final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.size(1),), self.final_weight, self.final_eps)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self._final_norm(x))

    def _layers(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...], caches: list[SharedPrefixCache],
                masks: dict | None, start: int, stop: int) -> torch.Tensor:
        """The hidden states after layers ``[start, stop)`` of the rows ``x``: the rows of ``caches``, one after
        another, each cache's rows attending to its own keys and values."""
        rows = x.size(0)
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        for i in range(start, stop):
            layer = self.layers[i]
            q, k, v = self._attention_inputs(x, layer, rope, masks)
            # one query per row: its heads that share a key/value head are that head's group of queries
            q = q.reshape(rows, kv_heads, heads // kv_heads, head_dim)
            if len(caches) == 1:
                out = caches[0].attend(i, q, k, v)
            else:
                parts, first = [], 0
                for cache in caches:
                    last = first + cache.row_prompt.numel()
                    parts.append(cache.attend(i, q[first:last], k[first:last], v[first:last]))
                    first = last
                out = torch.cat(parts)
            x = self._rest_of_layer(x, out.reshape(rows, heads * head_dim), layer, masks)
        return x

    def prefill(self, prompts: list[list[int]], adapters: list[str] | None = None
                ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """(next-token logits (prompts, vocab), per layer the keys and values (prompts, kv_heads, width,
        head_dim) right-padded to the longest prompt, lengths) of distinct ``prompts``, with each prompt's
        LoRA adapter (``adapters``, names the step was built with; ``"__base__"``: none).

        A prefix that prompts of one adapter share is computed once (:func:`prefix_tree`); each depth of the
        tree is one pass (of at most ``PREFILL_TOKENS`` tokens), its nodes' tokens side by side through the
        products (a row's product does not depend on the rows beside it) and each node attending to its own
        prefix and, causally, to itself.
        """
        n, device = len(prompts), self.embed.device
        lengths = torch.tensor([len(p) for p in prompts])
        width = int(lengths.max())
        groups: dict[str | None, list[int]] = {}
        for u in range(n):
            groups.setdefault(None if adapters is None else adapters[u], []).append(u)
        level = [node for members in groups.values() for node in prefix_tree(prompts, 0, members)]
        cache = [(self.embed.new_zeros(n, self.kv_heads, width, self.head_dim),
                  self.embed.new_zeros(n, self.kv_heads, width, self.head_dim)) for _ in self.layers]
        logits = None
        while level:
            chunks, size = [[]], 0  # at most PREFILL_TOKENS tokens a pass (or one node), bounding its memory
            for node in level:
                if chunks[-1] and size + node.end - node.start > PREFILL_TOKENS:
                    chunks.append([])
                    size = 0
                chunks[-1].append(node)
                size += node.end - node.start
            for chunk in chunks:
                last, x = self._prefill_level(prompts, chunk, cache, adapters)
                leaves = [(row, node.members[0]) for row, node in zip(last, chunk) if not node.children]
                if leaves:
                    rows, members = zip(*leaves)
                    out = self._logits(x[list(rows)])
                    if logits is None:
                        logits = out.new_empty(n, out.size(1))
                    logits[list(members)] = out
            level = [child for node in level for child in node.children]
        return logits, cache, lengths

    def _prefill_level(self, prompts: list[list[int]], level: list[PrefixNode], cache: list,
                       adapters: list[str] | None) -> tuple[list[int], torch.Tensor]:
        """Run the nodes of one depth, writing their keys and values into ``cache`` for every member; returns
        the row of each node's last token and the final hidden states (tokens, dim).

        Nodes of one start and size (the leaves below one shared prefix, say) attend in one call, stacked along
        the batch: torch's fused CPU attention computes each batch entry and head on its own, as it would in a call
        of its own."""
        device = self.embed.device
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        group = heads // kv_heads
        ids, positions, firsts = [], [], []
        for node in level:
            firsts.append(len(ids))
            ids += prompts[node.members[0]][node.start:node.end]
            positions += range(node.start, node.end)
        # per (start, size): the nodes' token rows (nodes, size), their members' cache rows and, per member, its
        # node's place among them; the positions each token may see (None: the causal mask of a node without a
        # prefix). torch's fused CPU attention takes 4-D inputs, where it never holds all scores
        shapes: dict[tuple[int, int], list[int]] = {}
        for n, node in enumerate(level):
            shapes.setdefault((node.start, node.end - node.start), []).append(n)
        plans = []
        for (start, size), nodes in shapes.items():
            rows = torch.tensor([[firsts[n] + t for t in range(size)] for n in nodes], device=device)
            members = [(u, j) for j, n in enumerate(nodes) for u in level[n].members]
            visible = None if start == 0 else torch.ones(size, start + size, dtype=torch.bool, device=device).tril(start)
            plans.append((start, size, rows, torch.tensor([level[n].members[0] for n in nodes], device=device),
                          torch.tensor([u for u, _ in members], device=device),
                          torch.tensor([j for _, j in members], device=device), visible))
        positions = torch.tensor(positions, device=device)
        x = F.embedding(torch.tensor(ids, device=device), self.embed)
        rope = self._rope(positions)
        masks = None
        if adapters is not None:  # each token's adapter number (-1: none)
            tags = [self.adapters.get(adapters[node.members[0]], -1) for node in level
                    for _ in range(node.end - node.start)]
            masks = {"rows": torch.tensor(tags, device=device)}
        gqa = {"enable_gqa": True} if _SDPA_GQA else {}
        for i, layer in enumerate(self.layers):
            q, k, v = self._attention_inputs(x, layer, rope, masks)
            keys, values = cache[i]
            out = q.new_empty(q.size(0), heads * head_dim)
            for start, size, rows, first, member_rows, member_node, visible in plans:
                end = start + size
                node_k, node_v = k[rows].transpose(1, 2), v[rows].transpose(1, 2)   # (nodes, kv_heads, size, dim)
                keys[member_rows, :, start:end] = node_k[member_node]
                values[member_rows, :, start:end] = node_v[member_node]
                node_keys, node_values = keys[first, :, :end], values[first, :, :end]
                if not gqa and group > 1:
                    node_keys, node_values = (t.repeat_interleave(group, 1) for t in (node_keys, node_values))
                attended = F.scaled_dot_product_attention(q[rows].transpose(1, 2), node_keys, node_values,
                                                          attn_mask=visible, is_causal=visible is None, scale=1.0,
                                                          **gqa)
                out[rows.flatten()] = attended.transpose(1, 2).reshape(-1, heads * head_dim)
            x = self._rest_of_layer(x, out, layer, masks)
        return [first + node.end - node.start - 1 for first, node in zip(firsts, level)], x
