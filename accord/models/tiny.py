"""Tiny, fully offline models for tests and smoke runs.

``tiny_tokenizer`` trains a byte-level BPE on a small built-in English corpus (deterministic, well
under a second) and wraps it with a ChatML chat template like SmolLM2/Qwen. ``build_tiny_model``
pairs it with a randomly initialised Qwen2 or Llama decoder whose weights depend only on ``seed``.
"""

from __future__ import annotations

import functools
import logging

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from accord.seeding import seeded_torch

from ._corpus import corpus_lines
from .specs import TINY_MIN_VOCAB as _MIN_VOCAB
from .specs import tiny_shape_problem as tiny_shape_problem

IM_START, IM_END, PAD, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|pad|>", "<|endoftext|>"
# Qwen2/SmolLM2-style pre-tokenisation (single digits, contractions, words, punctuation runs). Matching it
# matters: AutoTokenizer always rebuilds tokenizers saved next to a qwen2 config with this exact pipeline.
_SPLIT_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

# Same shape as SmolLM2-Instruct / Qwen2 templates, minus any default system prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

TINY_ARCHS = ("qwen2", "llama", "qwen3")

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=8)
def _trained_tokenizer_json(vocab_size: int) -> str:
    """Train the BPE once per size; returned as JSON so each caller gets an independent object."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=[ENDOFTEXT, IM_START, IM_END],  # ids 0, 1, 2 as in SmolLM2
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(IM_START, IM_END), trainer=trainer)
    return tok.to_str()


def tiny_tokenizer(vocab_size: int = 2048, pad_is_eos: bool = False) -> transformers.PreTrainedTokenizerFast:
    """Return a fresh byte-level BPE tokenizer trained on accord's built-in English corpus.

    Deterministic: every call with the same arguments yields the same vocabulary. Training is cached
    per process; each call returns a new wrapper, so callers may mutate it freely (e.g. set
    ``padding_side``; the default stays ``"right"``).

    Special tokens, laid out like SmolLM2: ``<|endoftext|>`` (0, unk; never produced by byte-level
    BPE), ``<|im_start|>`` (1, also BOS but never added automatically), ``<|im_end|>`` (2, EOS) and
    ``<|pad|>`` (appended last, so the other ids match the ``pad_is_eos`` variant). With
    ``pad_is_eos`` there is no ``<|pad|>`` and ``pad_token == eos_token == "<|im_end|>"``.
    Pre-tokenisation matches Qwen2's, so ``AutoTokenizer`` round trips next to a qwen2 config are exact.
    ``len(tokenizer) == vocab_size`` unless the corpus runs out of merges for a very large size.
    """
    min_size = _MIN_VOCAB
    if vocab_size < min_size:
        raise ValueError(f"vocab_size={vocab_size} is too small: byte-level BPE needs at least {min_size} "
                         "(256 bytes + special tokens); pass a larger vocab_size.")
    raw = Tokenizer.from_str(_trained_tokenizer_json(vocab_size if pad_is_eos else vocab_size - 1))
    if not pad_is_eos:
        raw.add_special_tokens([PAD])
    if raw.get_vocab_size() < vocab_size:
        logger.warning("tiny_tokenizer: the built-in corpus supports only %d tokens (asked for %d)",
                       raw.get_vocab_size(), vocab_size)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=IM_START,
        eos_token=IM_END,
        unk_token=ENDOFTEXT,
        pad_token=IM_END if pad_is_eos else PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=1024,
    )


def _tiny_config(arch: str, tokenizer, hidden_size: int, num_layers: int, num_heads: int,
                 max_position_embeddings: int, tie_word_embeddings: bool = True) -> transformers.PreTrainedConfig:
    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny arch {arch!r}; valid choices are {', '.join(TINY_ARCHS)}")
    problem = tiny_shape_problem(hidden_size, num_heads)
    if problem:
        raise ValueError(problem)
    config_cls = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig,
                  "qwen3": transformers.Qwen3Config}[arch]
    extra = {"head_dim": hidden_size // num_heads} if arch == "qwen3" else {}  # Qwen3's default is 128
    return config_cls(
        **extra,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads // 2 if num_heads % 2 == 0 else num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        use_cache=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_tiny_model(
    arch: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    vocab_size: int = 2048,
    seed: int = 0,
    pad_is_eos: bool = False,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = True,
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerFast]:
    """Build a randomly initialised fp32 causal LM (``arch`` in ``"qwen2"``, ``"llama"``, ``"qwen3"``) and its
    tokenizer (``qwen3``: Qwen3's q/k norms, the architecture of the AT-GRPO papers' Qwen3 models).

    Weights depend only on ``seed``; the global torch RNG is left untouched. Embeddings are tied (the output head
    is the input embedding matrix) unless ``tie_word_embeddings`` is false,
    ``intermediate_size = 2 * hidden_size`` and ``num_key_value_heads = num_heads // 2`` (GQA) when
    ``num_heads`` is even. The model's vocabulary is ``len(tokenizer)`` and the config and
    generation config carry the tokenizer's bos/eos/pad ids. Returned in eval mode.
    """
    tokenizer = tiny_tokenizer(vocab_size=vocab_size, pad_is_eos=pad_is_eos)
    tokenizer.model_max_length = max_position_embeddings
    config = _tiny_config(arch, tokenizer, hidden_size, num_layers, num_heads, max_position_embeddings,
                          tie_word_embeddings)
    with seeded_torch(seed, devices=[]):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = (
        tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    return model.eval(), tokenizer
