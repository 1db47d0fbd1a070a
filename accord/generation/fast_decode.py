"""One decoding step of a Llama-family model computed directly from its weights.

A decoding step feeds one token per row through the whole model. For small models that step is
dominated by per-call overhead, not arithmetic: Hugging Face's forward goes through about a hundred
module calls, a rotary-embedding computation, mask construction and output dataclasses per token.
:class:`DecodeStep` runs the same arithmetic as the Hugging Face modules (RMSNorm, q/k/v
projections, rotary embedding, grouped-query attention, gated SiLU MLP, output head) as plain torch
calls on the model's own parameters, with the rotary table computed once per generation call by
the model's own rotary module. Its logits match the model's forward to rounding (tested).

It applies only where the arithmetic is known exactly: ``LlamaForCausalLM``, ``Qwen2ForCausalLM``
and ``MistralForCausalLM`` (checked by exact class, so PEFT wrappers, quantised or patched layers and
subclasses are excluded), fp32 parameters, SiLU MLPs, RMSNorm, a rotary type whose table does not
depend on the sequence length, SDPA or eager attention, no hooks on any module, torch >= 2.4 (for
``rms_norm``). Everything else, and the prefill, goes through the model's forward.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

_SUPPORTED = {"LlamaForCausalLM": "LlamaRMSNorm", "Qwen2ForCausalLM": "Qwen2RMSNorm",
              "MistralForCausalLM": "MistralRMSNorm"}
# rotary types whose cos/sin at a position do not depend on the sequence length seen so far
_STATIC_ROPE = {"default", "linear", "llama3"}


def _transformers_class(module: nn.Module, name: str) -> bool:
    cls = type(module)
    return cls.__name__ == name and cls.__module__.startswith("transformers.")


def _has_hooks(model: nn.Module) -> bool:
    for module in model.modules():
        if (module._forward_hooks or module._forward_pre_hooks or getattr(module, "_hf_hook", None) is not None
                or "forward" in module.__dict__):
            return True
    return bool(nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks)


def unsupported_reason(model: nn.Module) -> str | None:
    """Why :class:`DecodeStep` cannot run ``model`` (``None`` when it can)."""
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
    linears = [model.lm_head]
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if not all(_transformers_class(n, norm) for n in (layer.input_layernorm, layer.post_attention_layernorm)):
            return "a layer norm is not the model's RMSNorm"
        if not (type(mlp.act_fn) is nn.SiLU or _transformers_class(mlp.act_fn, "SiLUActivation")):
            return f"MLP activation {type(mlp.act_fn).__name__}"
        if getattr(attn, "sliding_window", None):
            return "sliding-window attention"
        linears += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    if not _transformers_class(inner.norm, norm) or type(inner.embed_tokens) is not nn.Embedding:
        return "the final norm or the embedding is not the model's own"
    if any(type(linear) is not nn.Linear for linear in linears):
        return "a projection is not a plain nn.Linear (adapters, quantisation)"
    if _has_hooks(model):
        return "a module has hooks or a patched forward"
    return None


class DecodeStep:
    """Logits of the next position for one new token per row, reading and extending a KV cache.

    ``cache`` layers must be accord's growing cache layers (``update(k, v)`` returns the layer's
    full keys and values). Built per generation call: it holds references to the parameters, not
    copies, and a rotary table for ``max_positions`` positions.
    """

    def __init__(self, model: nn.Module, max_positions: int):
        inner, config = model.model, model.config
        first = inner.layers[0].self_attn
        self.head_dim = first.head_dim
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.scaling = first.scaling
        self.embed = inner.embed_tokens.weight
        self.final_norm = (inner.norm.weight, inner.norm.variance_epsilon)
        self.head = (model.lm_head.weight, model.lm_head.bias)
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append((
                (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
                (attn.q_proj.weight, attn.q_proj.bias), (attn.k_proj.weight, attn.k_proj.bias),
                (attn.v_proj.weight, attn.v_proj.bias), (attn.o_proj.weight, attn.o_proj.bias),
                (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
                (mlp.gate_proj.weight, mlp.gate_proj.bias), (mlp.up_proj.weight, mlp.up_proj.bias),
                (mlp.down_proj.weight, mlp.down_proj.bias),
            ))
        positions = torch.arange(max_positions, device=self.embed.device)[None]
        cos, sin = inner.rotary_emb(self.embed[:1], positions)  # the model's own table, its dtype
        # rotate_half(x) * sin == roll(x, half) * (sin with its first half negated), bit for bit
        half = self.head_dim // 2
        self.cos, self.sin = cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)

    @classmethod
    def build(cls, model: nn.Module, max_positions: int) -> DecodeStep | None:
        reason = unsupported_reason(model)
        if reason is not None:
            logger.debug("decoding %s through its forward: %s", type(model).__name__, reason)
            return None
        return cls(model, max_positions)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache) -> torch.Tensor:
        """``tokens`` (rows,), ``positions`` (rows, 1), ``mask`` (rows, 1, 1, cached + 1) bool or None
        (attend to everything); returns (rows, vocab) logits."""
        rows, dim = tokens.size(0), self.embed.size(1)
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        half = head_dim // 2
        x = F.embedding(tokens[:, None], self.embed)
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        for i, (norm1, q_proj, k_proj, v_proj, o_proj, norm2, gate, up, down) in enumerate(self.layers):
            h = F.rms_norm(x, (dim,), norm1[0], norm1[1])
            q = F.linear(h, *q_proj).view(rows, 1, heads, head_dim).transpose(1, 2)
            k = F.linear(h, *k_proj).view(rows, 1, kv_heads, head_dim).transpose(1, 2)
            v = F.linear(h, *v_proj).view(rows, 1, kv_heads, head_dim).transpose(1, 2)
            q = q * cos + q.roll(half, -1) * sin
            k = k * cos + k.roll(half, -1) * sin
            keys, values = cache.layers[i].update(k, v)
            # one query per row: its heads that share a key/value head are that head's queries
            out = F.scaled_dot_product_attention(q.reshape(rows, kv_heads, heads // kv_heads, head_dim), keys, values,
                                                 attn_mask=mask, scale=self.scaling)
            x = x + F.linear(out.reshape(rows, 1, heads * head_dim), *o_proj)
            h = F.rms_norm(x, (dim,), norm2[0], norm2[1])
            x = x + F.linear(F.silu(F.linear(h, *gate)) * F.linear(h, *up), *down)
        return F.linear(F.rms_norm(x[:, 0], (dim,), *self.final_norm), *self.head)
