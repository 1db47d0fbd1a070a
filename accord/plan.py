"""``accord plan CONFIG``: what a run needs, from the config and the models' configs alone (no weights).

Per policy it prints the parameter count and the memory of the fp32 master weights, the KL reference,
gradients, AdamW state, the update's activations (one micro-batch) and generation (KV cache and
logits of one generate call), the samples and generations of one step (the MAGRPO tree size of a
multi-turn step), the devices the run needs and whether it fits the devices present (or the
``--gpu-memory-gb`` of a target machine).

Model configs come from ``config.json`` of a local directory, the tiny-model and SmolLM2 specs, the
local Hugging Face cache, or (offline, for the papers' models) :data:`KNOWN_CONFIGS`. Parameters are
counted on a ``meta``-device instance of the architecture (exact, no memory).

The model of memory (bytes; P parameters, P_t trainable, fp32 = 4 bytes):

- weights 4P; KL reference 4P (full fine-tuning with ``kl_coef > 0``; LoRA's reference is the base with
  the adapters off); gradients 4P_t; AdamW 8P_t (two moments); under ``policies.<name>.trainable_layers`` P_t
  counts the last blocks' parameters (their adapters' under LoRA), and only those blocks keep activations;
- update activations of one micro-batch of b sequences, prompt length p, completion length c: the
  tensors autograd keeps per token and layer, ``4h + 4q + 2kv + 4i`` floats for a Llama-style layer
  (h hidden, q = heads x head_dim, kv = kv_heads x head_dim, i MLP width), over ``ceil(b / K) * p + b * c``
  tokens (each distinct prompt of a micro-batch runs once), plus 3 b c V floats for the logits, the
  sampling transform and the log-softmax (V vocabulary), 2 b c V more with the entropy bonus (the probabilities
  and their product with the log-probs, kept for its gradient); under bf16 autocast the layer tensors are
  half as large and the autocast cache adds 2P bytes; with gradient checkpointing a layer keeps only
  its input (h floats per token) and one layer is recomputed at a time; LoRA adds, per token and
  adapted projection of input width d, the dropout's fp32 output and mask (5d bytes, when
  ``lora.dropout > 0``) and the adapter's bf16 copy of its input (2d bytes, under bf16 autocast);
- generation: a KV cache of rows x (p + c) x layers x 2kv floats plus 4 rows x V floats of logits; on a
  CPU, a full model's decoding step also holds its weights re-laid out for oneDNN (4P more, for the call);
- a device holds the static parts (weights, reference, AdamW) of all its policies plus the largest
  transient part (gradients + activations, or generation) of one of them (policies update one after
  another; gradients are freed after each update); a CPU process adds :data:`CPU_BASELINE_GIB`;
- a GPU also holds what the tensors do not show (:func:`gpu_need`): the CUDA context of each process
  using it (:data:`CUDA_CONTEXT_GIB`), the caching allocator's fragmentation (:data:`FRAGMENTATION` of
  the learner's bytes, :data:`LORA_FRAGMENTATION` under ``specialization: lora``) and, with the vLLM
  backend, the engine's share (``rollout.vllm_gpu_memory_utilization`` of the GPU, freed during the update
  by sleep mode) and its
  CUDA graph pool (:data:`VLLM_CUDA_GRAPH_GIB`, counted as resident throughout). The context and the
  fragmentation were measured on an H200 (torch 2.11, 2026-11-28; next to them); the graph pool is still
  an assumption (no vLLM has run on a GPU here). ``docs/gpu.md`` has the measurements.

Prompt lengths are ``rollout.max_prompt_tokens`` (the upper bound the config allows), or less where a model's
context holds less beside the length caps, unless ``--prompt-tokens`` gives the typical length.
``docs/performance.md`` (*Measured numbers*) compares the estimate with a measured peak.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path

from accord.config import Config, ConfigError

logger = logging.getLogger(__name__)

GIB = 2 ** 30
PLAN_DOES_NOT_FIT = "the run does not fit the devices present"  # format_plan's last line when it does not
# RSS of a Python process that imported torch, transformers and peft (349 MiB measured with
# /usr/bin/time -v on torch 2.13 / transformers 5.23), plus tokenizer, task data and allocator slack
CPU_BASELINE_GIB = 0.45
# What a GPU holds besides the tensors accord counts (docs/gpu.md, *Planning memory*):
# - the CUDA context, cuBLAS workspaces and NCCL buffers of one process on one GPU: measured 0.75 GiB outside
#   torch's allocator after a real-size update (H200, torch 2.11, 2026-11-28); vLLM's memory profiler
#   (vllm/utils/mem_utils.py, 0.33.0) budgets 1 GiB, which is kept as the margin;
CUDA_CONTEXT_GIB = 1.0
# - vLLM's CUDA graph pool (batch sizes captured for decoding; vLLM logs "Graph capturing finished ...,
#   took X GiB" at start; `vllm_kwargs: {enforce_eager: true}` captures none). vLLM >= 0.21 counts it
#   inside gpu_memory_utilization and its sleep mode offloads it (0.33.0's sleep_mode_backend.py); older
#   versions keep it outside and resident, which is what is assumed here (conservative);
VLLM_CUDA_GRAPH_GIB = 1.0
# - fragmentation of torch's caching allocator: reserved minus allocated bytes at the peak, as a share of
#   the allocated ones (the update logs mem/<policy>/cuda_reserved_peak_mb beside mem/<policy>/cuda_peak_mb).
#   Measured on an H200 (2026-11-28): full fine-tuning 1.9 % (1.06 B Qwen3 widths, one policy) and 7.9-8.3 %
#   (two such policies on one GPU); under LoRA (one 1.06 B base, two adapters, hf generation) 79 % (a likely
#   cause, not measured: blocks cached for the generation's growing KV caches that the adapters' small update
#   cannot reuse).
FRAGMENTATION = 0.10
LORA_FRAGMENTATION = 0.80

# config.json of the papers' models (Hugging Face Hub, fields that decide the parameter count), for
# planning offline; a local directory or the local HF cache takes precedence
_QWEN = {"hidden_act": "silu", "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0}
KNOWN_CONFIGS: dict[str, dict] = {
    "Qwen/Qwen3-1.7B": {**_QWEN, "model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 6144,
                        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                        "max_position_embeddings": 40960, "tie_word_embeddings": True},
    "Qwen/Qwen3-8B": {**_QWEN, "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
                      "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                      "max_position_embeddings": 40960, "tie_word_embeddings": False},
    "Qwen/Qwen2.5-Coder-3B": {**_QWEN, "model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 11008,
                              "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
                              "max_position_embeddings": 32768, "tie_word_embeddings": True},
}
KNOWN_CONFIGS["Qwen/Qwen2.5-Coder-3B-Instruct"] = KNOWN_CONFIGS["Qwen/Qwen2.5-Coder-3B"]
_SMOLLM2 = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
            "max_position_embeddings": 8192, "tie_word_embeddings": True, "hidden_act": "silu"}


def load_plan_config(path: str | None, overrides: list[str]) -> Config:
    """The config to plan. A config for the vLLM backend is planned on a machine without vLLM too (the
    trainer would refuse it): it is built with the hf backend and ``plan_vllm`` set, so that the plan
    still gives the engine its share of the GPU."""
    import importlib.util

    from accord.config import apply_overrides, config_from_dict, read_yaml

    data: dict = {}
    if path is not None:
        data = read_yaml(Path(path))  # the checks of accord train: duplicate keys, alias bombs, encoding
    apply_overrides(data, overrides)
    rollout = data.get("rollout") or {}
    vllm = isinstance(rollout, dict) and rollout.get("generation_backend") == "vllm"
    if vllm and importlib.util.find_spec("vllm") is None:
        rollout["generation_backend"] = "hf"
        logger.info("vllm is not installed here; planning rollout.generation_backend=vllm all the same")
    cfg = config_from_dict(data)
    cfg.plan_vllm = vllm  # type: ignore[attr-defined]
    return cfg


def model_config(spec: str, model_kwargs: dict | None = None):
    """The transformers config of a model spec, without weights."""
    import transformers

    from accord.models.loading import SMOLLM2_SPEC, TINY_SPECS

    if spec in TINY_SPECS:
        from accord.models.tiny import _tiny_config

        kw = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 2048, "max_position_embeddings": 1024,
              **(model_kwargs or {})}

        class _Vocab:  # the tokenizer's size and special ids, without training it
            bos_token_id, eos_token_id, pad_token_id = 1, 2, kw["vocab_size"] - 1

            def __len__(self):
                return kw["vocab_size"]

        return _tiny_config(TINY_SPECS[spec], _Vocab(), kw["hidden_size"], kw["num_layers"], kw["num_heads"],
                            kw["max_position_embeddings"])
    if spec == SMOLLM2_SPEC:
        from accord.models.common import accord_cache_dir
        from accord.models.smollm2 import SMOLLM2_DIRNAME

        path = accord_cache_dir() / SMOLLM2_DIRNAME / "config.json"
        data = json.loads(path.read_text()) if path.is_file() else _SMOLLM2
        return transformers.AutoConfig.for_model(**data)
    path = Path(spec).expanduser()
    if (path / "config.json").is_file():
        try:
            data = json.loads((path / "config.json").read_bytes())
            if not isinstance(data, dict) or "model_type" not in data:
                raise ValueError("no JSON object with a 'model_type' key")
            return transformers.AutoConfig.for_model(**data)
        except ValueError as err:  # not UTF-8 or not JSON (both ValueErrors), no model_type, an unknown one
            problem = str(err).splitlines()[0]
            raise ConfigError(f"accord plan: {path / 'config.json'} cannot be read as a model config ({problem}); "
                              f"pass a directory written by save_pretrained()") from err
    if path.is_dir():
        raise ConfigError(f"accord plan: model directory {str(path)!r} has no config.json; pass a directory written by "
                          f"save_pretrained()")
    try:
        return transformers.AutoConfig.from_pretrained(spec, local_files_only=True)
    except OSError:
        if spec in KNOWN_CONFIGS:
            return transformers.AutoConfig.for_model(**KNOWN_CONFIGS[spec])
    raise ConfigError(f"accord plan: no config.json for model {spec!r} (not a local directory, not in the local Hugging "
                      f"Face cache, not one of {sorted(KNOWN_CONFIGS)}); pass a local directory")


def _meta_model(config):
    import torch
    import transformers

    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


def _block_index(name: str) -> int:
    """The decoder block a module or parameter name lies in (``model.layers.7.mlp`` -> 7); -1 outside blocks."""
    parts = name.split(".")
    for a, b in zip(parts, parts[1:]):
        if a == "layers" and b.isdigit():
            return int(b)
    return -1


def trained_parameters(model, trainable_layers: int | None) -> int:
    """Parameters a full-model policy trains: all, or what :func:`accord.policies.learner.train_last_layers`
    leaves trainable (it is applied to ``model``, a meta instance of the plan's own)."""
    from accord.policies.learner import train_last_layers

    if trainable_layers is not None:
        train_last_layers(model, trainable_layers)
    return sum(t.numel() for t in model.parameters() if t.requires_grad)


def _adapted_linears(model, cfg: Config, trainable_layers: int | None):
    """The linear layers LoRA adapts: the target modules, in the blocks ``trainable_layers`` chooses (all: None)."""
    import torch

    from accord.policies.lora import adapted_blocks, default_target_modules

    targets = list(cfg.lora.target_modules) if cfg.lora.target_modules else default_target_modules(model)
    blocks = adapted_blocks(model, trainable_layers)
    return [m for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and any(name == t or name.endswith("." + t) for t in targets)
            and (blocks is None or _block_index(name) in blocks)]


def lora_parameters(model, cfg: Config, trainable_layers: int | None = None) -> int:
    """Parameters of one adapter: r x (in + out) per adapted linear layer (under ``trainable_layers``, of the
    last blocks only)."""
    return sum(cfg.lora.r * (m.in_features + m.out_features) for m in _adapted_linears(model, cfg, trainable_layers))


def lora_input_width(model, cfg: Config, trainable_layers: int | None = None) -> int:
    """Sum of the input widths of the adapted linear layers (all layers, or the last ``trainable_layers``
    blocks'): what LoRA's per-projection copies of the activations scale with."""
    return sum(m.in_features for m in _adapted_linears(model, cfg, trainable_layers))


@dataclasses.dataclass
class PolicyPlan:
    name: str
    model: str
    arch: str
    params: int
    trainable: int
    device: str
    samples: int
    gen_rows: int
    weights: float = 0.0       # bytes
    reference: float = 0.0
    grads: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    generation: float = 0.0
    shared_base: str | None = None  # LoRA: the policy whose base weights this one shares
    replicas: int = 1               # data-parallel ranks, each holding a full copy (one GPU per rank on CUDA)

    @property
    def static(self) -> float:
        return self.weights + self.reference + self.optimizer

    @property
    def transient(self) -> float:
        return max(self.grads + self.activations, self.generation)

    @property
    def peak(self) -> float:
        return self.static + self.transient


def _step_shape(cfg: Config, agents_of: dict[str, list[str]], multi_turn: bool, turns: int, simultaneous: bool):
    """(samples per step per policy, rows of the largest generate call per policy, generations per step)."""
    from accord.config.rules import tree_generations

    b, k, algo = cfg.rollout.batch_size, cfg.algorithm.num_generations, cfg.algorithm
    n_agents = sum(len(a) for a in agents_of.values())
    samples, rows = {}, {}
    if not multi_turn:
        total = b * k * n_agents
        for p, ags in agents_of.items():
            samples[p] = rows[p] = b * k * len(ags)
    elif algo.name in ("atgrpo", "iac", "maac", "madpo"):   # AT-GRPO's candidates; K sampled episodes
        total = b * k * n_agents * turns
        for p, ags in agents_of.items():
            samples[p] = b * k * len(ags) * turns
            rows[p] = b * k * (len(ags) if simultaneous else 1)
    else:
        total = tree_generations(b, n_agents, k, turns, algo.joint_mode)
        branching = k if algo.joint_mode == "aligned" else k ** n_agents
        for p, ags in agents_of.items():
            samples[p] = total * len(ags) // n_agents
            rows[p] = b * branching ** (turns - 1) * k * (len(ags) if simultaneous else 1)
    rows = {p: min(r, cfg.rollout.generation_batch_size) for p, r in rows.items()}
    return samples, rows, total


def _policy_memory(plan: PolicyPlan, config, cfg: Config, prompt: int, lora: bool, lora_width: int = 0) -> None:
    tr, r = cfg.training, cfg.rollout
    h = config.hidden_size
    layers = config.num_hidden_layers
    top = cfg.policies[plan.name].trainable_layers
    kept = layers if top is None else min(layers, top)   # blocks below the trained ones keep no activations
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    q, kv = heads * head_dim, getattr(config, "num_key_value_heads", heads) * head_dim
    inter = getattr(config, "intermediate_size", 4 * h)
    vocab = config.vocab_size
    c = max([a.sampling.max_new_tokens or r.max_new_tokens for a in cfg.agents] or [r.max_new_tokens])  # longest cap
    k = cfg.algorithm.num_generations
    bf16 = _bf16_guess(tr.bf16, plan.device)
    plan.weights = 0.0 if plan.shared_base else 4.0 * plan.params
    dpo_reference = cfg.algorithm.name == "madpo" and not cfg.preference.reference_free
    plan.reference = 4.0 * plan.params if (cfg.algorithm.kl_coef > 0 or dpo_reference) and not lora else 0.0
    plan.grads = 4.0 * plan.trainable
    plan.optimizer = 8.0 * plan.trainable
    b = tr.micro_batch_size if tr.micro_batch_tokens is None else max(1, tr.micro_batch_tokens // (prompt + c))
    b = min(b, plan.samples)
    shared = not tr.gradient_checkpointing
    tokens = (math.ceil(b / k) * prompt if shared else b * prompt) + b * c
    per_token_layer = 4 * h + 4 * q + 2 * kv + 4 * inter
    layer_bytes = 2.0 if bf16 else 4.0
    if tr.gradient_checkpointing:
        acts = tokens * kept * h * 4.0 + tokens * per_token_layer * layer_bytes
    else:
        acts = tokens * kept * per_token_layer * layer_bytes
    if lora:
        per_width = (5.0 if cfg.lora.dropout > 0 else 0.0) + (2.0 if bf16 else 0.0)
        acts += tokens * lora_width * per_width / (layers if tr.gradient_checkpointing else 1)
    acts += (5 if cfg.algorithm.entropy_coef > 0 else 3) * b * c * vocab * 4.0
    if _head_critic(cfg):  # value heads: the trunk once more over the distinct prompts (V) or whole sequences (Q)
        q = cfg.critic.value_at == "completion"
        acts += (b * (prompt + c) if q else math.ceil(b / k) * prompt) * layers * per_token_layer * layer_bytes
    if bf16:
        acts += 2.0 * plan.params  # autocast's bf16 copies of the weights
    plan.activations = acts
    rows = plan.gen_rows
    plan.generation = rows * (prompt + c) * layers * 2 * kv * 4.0 + 4.0 * rows * vocab * 4.0
    if plan.device == "cpu" and not lora:  # DecodeStep's prepacked copy (accord.generation.fast_decode)
        plan.generation += 4.0 * plan.params


def _head_critic(cfg: Config) -> bool:
    """Whether the run puts value heads on the policies (iac, or marlhf's iac stage, with critic.mode head)."""
    from accord.trainer_steps import stage_of

    return stage_of(cfg) == "iac" and cfg.critic.mode in (None, "head")


def extra_plans(cfg: Config, prompt: int, turns: int, cuda: bool | None = None) -> list[PolicyPlan]:
    """The trainer's own models, as plans on the trainer's device: separate critics (iac: one per agent), the
    centralised critic (maac) and marlhf's reward model (its Bradley-Terry stage: weights, gradients, AdamW and
    one micro-batch of winner and loser texts; frozen afterwards)."""
    from accord.trainer_steps import stage_of

    c, n, b = cfg.rollout.max_new_tokens, len(cfg.agents), cfg.training.micro_batch_size
    device = _planned_device(cfg.run.device, "local", 0.0, cuda)
    first = cfg.policies[cfg.agents[0].policy]
    out: list[tuple[str, str, dict, int, int]] = []   # name, model, kwargs, sequences per micro-batch, tokens each
    stage = stage_of(cfg)
    q = cfg.critic.value_at == "completion"
    if stage == "iac" and cfg.critic.mode == "separate":
        for a in cfg.agents:
            pcfg = cfg.policies[a.policy]
            out.append((f"critic {a.name}", cfg.critic.model or pcfg.model,
                        cfg.critic.model_kwargs if cfg.critic.model else pcfg.model_kwargs, b, prompt + (c if q else 0)))
    elif stage == "maac":
        out.append(("critic joint", cfg.critic.model or first.model,
                    cfg.critic.model_kwargs if cfg.critic.model else first.model_kwargs, b, n * turns * (prompt + c)))
    if cfg.algorithm.name == "marlhf":
        rm = cfg.reward_model
        out.append(("reward model", rm.path or rm.model or first.model,
                    {} if rm.path else (rm.model_kwargs if rm.model else first.model_kwargs), b, n * (prompt + c)))
    plans = []
    for name, spec, kwargs, rows, length in out:
        config = model_config(spec, kwargs)
        params = sum(t.numel() for t in _meta_model(config).parameters())
        plan = PolicyPlan(name, spec, type(_meta_model(config)).__name__, params, params, device, 0, 0)
        limit = getattr(config, "max_position_embeddings", None)
        length = min(length, limit) if limit else length
        h, layers = config.hidden_size, config.num_hidden_layers
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or h // heads
        per_token_layer = 4 * h + 4 * heads * head_dim + 2 * getattr(config, "num_key_value_heads", heads) * head_dim \
            + 4 * getattr(config, "intermediate_size", 4 * h)
        plan.weights, plan.grads, plan.optimizer = 4.0 * params, 4.0 * params, 8.0 * params
        plan.activations = rows * length * layers * per_token_layer * (2.0 if _bf16_guess(cfg.training.bf16, device)
                                                                       else 4.0)
        plans.append(plan)
    return plans


def _bf16_guess(setting, device: str) -> bool:
    if setting in (True, False):
        return bool(setting)
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            from accord.devices import cuda_bf16

            return cuda_bf16(torch.device(device))
        return True  # the papers' GPUs (A100, H100) have bf16
    from accord.devices import cpu_bf16_matrix_units

    return cpu_bf16_matrix_units() is True


def _planned_device(setting: str, backend: str, gpus: float, cuda: bool | None = None) -> str:
    """The device a policy lands on. ``cuda``: whether the planned machine has GPUs (None: this machine's)."""
    if backend == "ray":
        return "cuda" if (setting.startswith("cuda") or (setting == "auto" and gpus > 0)) else "cpu"
    if setting == "auto":
        if cuda is None:
            import torch

            cuda = torch.cuda.is_available()
        return "cuda:0" if cuda else "cpu"
    return "cuda:0" if setting == "cuda" else setting


def present_devices(gpu_memory_gb: float | None = None, gpus: int | None = None) -> dict[str, float]:
    """Device -> memory in bytes: the CPU's RAM (MemTotal) and each visible GPU, or ``gpus`` assumed GPUs
    of ``gpu_memory_gb`` each (planning for another machine)."""
    out: dict[str, float] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                out["cpu"] = int(line.split()[1]) * 1024.0
    except OSError:
        out["cpu"] = float("nan")
    if gpu_memory_gb is not None:
        for i in range(gpus if gpus is not None else 8):
            out[f"cuda:{i}"] = gpu_memory_gb * GIB
    else:
        import torch

        for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
            out[f"cuda:{i}"] = float(torch.cuda.get_device_properties(i).total_memory)
    return out


def make_plan(cfg: Config, *, prompt_tokens: int | None = None, cuda: bool | None = None) -> dict:
    """The plan of a config as plain data (what :func:`format_plan` prints). ``cuda``: whether the machine planned
    for has GPUs, where ``device: auto`` puts the policies (None: this machine; ``accord plan --gpus``: True)."""
    from accord.build import build_env, check_run, prompt_room, split_data
    from accord.distributed.ray_backend import policy_resources
    from accord.envs.protocol import is_env
    from accord.envs.single_turn import SingleTurnEnv
    from accord.tracking.report_to import check_report_to

    env = build_env(cfg)   # imports the modules of ``imports:`` (their sinks registered)
    check_run(cfg, env)   # the rules a run is built with (as accord train), and the settings it would not read
    check_report_to(cfg.logging.report_to)
    split_data(cfg, env)   # and the task's instances, as accord train checks them before any model loads
    task = env.task if isinstance(env, SingleTurnEnv) else env   # the task in the form it was written in
    multi = is_env(task)
    turns = (cfg.rollout.max_turns or task.max_turns) if multi else 1
    agents_of: dict[str, list[str]] = {}
    for a in cfg.agents:
        agents_of.setdefault(a.policy, []).append(a.name)
    names = sorted(agents_of)
    samples, rows, total = _step_shape(cfg, agents_of, multi, turns, bool(getattr(task, "simultaneous", False)))
    configs = {n: model_config(cfg.policies[n].model, cfg.policies[n].model_kwargs) for n in names}
    room = prompt_room(cfg, {n: getattr(c, "max_position_embeddings", None) for n, c in configs.items()})
    tightest = min(room, key=room.__getitem__, default=None)
    if prompt_tokens is not None and tightest is not None and prompt_tokens > room[tightest]:
        raise ConfigError(f"--prompt-tokens {prompt_tokens} does not fit beside the length caps in the context of the "
                          f"model of policy {tightest!r}: give at most {room[tightest]}")
    prompt = prompt_tokens or min(cfg.rollout.max_prompt_tokens, *room.values())
    lora = cfg.specialization == "lora"
    resources = policy_resources(cfg, names)
    plans = []
    for i, n in enumerate(names):
        p = cfg.policies[n]
        config = configs[n]
        meta = _meta_model(config)
        params = sum(t.numel() for t in meta.parameters())
        trainable = lora_parameters(meta, cfg, p.trainable_layers) if lora else trained_parameters(
            meta, p.trainable_layers)
        setting = p.device or cfg.run.device
        device = _planned_device(setting, cfg.run.backend, resources[n][1], cuda)
        reps = p.replicas or 1  # a rank updates on 1/replicas of the samples (its generate calls: see fit)
        plan = PolicyPlan(n, p.model, type(meta).__name__, params, trainable, device, math.ceil(samples[n] / reps),
                          rows[n], shared_base=names[0] if lora and i else None, replicas=reps)
        _policy_memory(plan, config, cfg, prompt, lora, lora_input_width(meta, cfg, p.trainable_layers) if lora else 0)
        if cfg.training.fsdp:
            _shard_memory(plan)
        plans.append(plan)
    return {"plans": plans, "generations": total, "turns": turns, "multi_turn": multi, "prompt": prompt,
            "resources": resources, "extras": extra_plans(cfg, prompt, turns, cuda)}


def _shard_memory(plan: PolicyPlan) -> None:
    """training.fsdp: a rank keeps 1/N of the weights, reference, gradients and AdamW state; generation
    gathers the whole model (accord.distributed.fsdp), so its transient adds the other ranks' shards."""
    n = plan.replicas
    full = plan.weights
    plan.weights, plan.reference, plan.grads, plan.optimizer = (
        v / n for v in (plan.weights, plan.reference, plan.grads, plan.optimizer))
    plan.generation += full - plan.weights


@dataclasses.dataclass
class GpuNeed:
    """What one GPU needs, in bytes: the smallest GPU on which both phases fit (``total``), and each phase's
    parts (label -> bytes; the engine's share as a fraction of the GPU, ``engine_share``)."""

    total: float
    update: dict[str, float]
    generation: dict[str, float]
    engine_share: float = 0.0   # rollout.vllm_gpu_memory_utilization x engines, where engines are resident
    asleep: bool = False        # the engine sleeps during its policy's update
    engines: int = 1            # engines on this GPU (Ray actors sharing it); the others stay awake in an update


def plan_sleep(cfg: Config) -> bool:
    """Whether a GPU engine of this config sleeps during updates (``rollout.vllm_sleep``: auto, 1, 2)."""
    return cfg.rollout.vllm_sleep != "off"


def engine_processes() -> int:
    """CUDA contexts a colocated vLLM engine adds to its GPU: 1 when it runs in its own process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=1``), 0 in the learner's (accord's default)."""
    import os

    return int(os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0").strip() not in ("0", "false", "False"))


def gpu_need(cfg: Config, pls: list[PolicyPlan], vllm: bool, processes: int = 1, engines: int = 1) -> GpuNeed:
    """The memory of one GPU holding the learners ``pls`` (their static parts, the largest transient part),
    ``processes`` CUDA contexts, fragmentation and, with ``vllm``, ``engines`` colocated engines (Ray actors
    sharing the GPU have one each): each one's share u of the GPU is resident while generating, and during
    an update too unless it sleeps; an engine sleeps only for its own policy's update, so the others' stay
    resident then. With sleep mode the GPU needs max(update / (1 - (n - 1)u), generation / (1 - nu)) for n
    engines; without, update / (1 - nu) (the shares are fractions of the GPU, so the smallest GPU that
    holds the rest beside them is the rest over what they leave)."""
    static = sum(p.static for p in pls)
    context = CUDA_CONTEXT_GIB * GIB * (processes + (engines * engine_processes() if vllm else 0))
    graphs = VLLM_CUDA_GRAPH_GIB * GIB if vllm and not cfg.rollout.vllm_kwargs.get("enforce_eager") else 0.0
    if vllm:   # generation runs in the engine; the learner's own generate calls are not made
        learner_update = static + max(p.grads + p.activations for p in pls)
        learner_gen = static
    else:
        learner_update = learner_gen = static + max(p.transient for p in pls)
    frag = LORA_FRAGMENTATION if cfg.specialization == "lora" else FRAGMENTATION
    update = {"learner": learner_update, "fragmentation": frag * learner_update, "CUDA context": context}
    generation = {"learner": learner_gen, "fragmentation": frag * learner_gen, "CUDA context": context}
    if not vllm:
        return GpuNeed(sum(update.values()), update, generation)
    update["vLLM CUDA graphs"] = generation["vLLM CUDA graphs"] = graphs * engines
    u = cfg.rollout.vllm_gpu_memory_utilization * engines
    asleep = plan_sleep(cfg)
    rest = 1.0 - u
    if rest <= 0:   # the engines take the whole GPU: nothing is left for the learners
        return GpuNeed(math.inf, update, generation, u, asleep, engines)
    if asleep:   # during one policy's update the other engines on this GPU are awake
        awake = 1.0 - u * (engines - 1) / engines
        total = max(sum(update.values()) / awake, sum(generation.values()) / rest)
    else:
        total = sum(update.values()) / rest
    return GpuNeed(total, update, generation, u, asleep, engines)


def fit(cfg: Config, plans: list[PolicyPlan], devices: dict[str, float], resources: dict,
        details: dict[str, GpuNeed] | None = None,
        extras: list[PolicyPlan] = ()) -> list[tuple[str, float, float | None]]:
    """(device, bytes needed, bytes present or None) per device the run uses; ``details`` (if given) receives
    each GPU's :class:`GpuNeed`; ``extras``: the trainer's own critics and reward model (see
    :func:`extra_plans`)."""
    need: dict[str, list[PolicyPlan]] = {}
    if cfg.run.backend == "ray":  # one actor per policy; a GPU actor gets a GPU of its own (or a share)
        gpu = 0
        for pl in plans:
            for _ in range(pl.replicas):  # every data-parallel rank is an actor of its own
                if pl.device == "cuda":
                    need.setdefault(f"cuda:{gpu}", []).append(pl)
                    gpu += 1 if resources[pl.name][1] >= 1 else 0
                else:
                    need.setdefault("cpu", []).append(pl)
    else:
        for pl in plans:
            if pl.replicas > 1 and pl.device.startswith("cuda"):  # torchrun: rank r on cuda:r
                for r in range(pl.replicas):
                    need.setdefault(f"cuda:{r}", []).append(pl)
            else:
                need.setdefault(pl.device, []).extend([pl] * pl.replicas)  # CPU ranks: one process each
    for pl in extras:   # separate critics and the reward model live in the trainer's process
        need.setdefault(pl.device, []).append(pl)
    out = []
    vllm = getattr(cfg, "plan_vllm", cfg.rollout.generation_backend == "vllm")
    for dev, pls in need.items():
        if dev.startswith("cuda"):   # the CUDA context, fragmentation and a colocated engine: see gpu_need
            # Ray: each actor on this GPU (a share of it) is a process with its own engine; otherwise one process
            # per GPU with at most one engine (accord.devices.check_vllm_devices)
            actors = len(pls) if cfg.run.backend == "ray" else 1
            gpu = gpu_need(cfg, pls, vllm, processes=actors, engines=actors)
            total = gpu.total
            if details is not None:
                details[dev] = gpu
        else:
            static = sum(p.static for p in pls)
            transient = max((p.grads + p.activations) if vllm else p.transient for p in pls)
            total = static + transient + (CPU_BASELINE_GIB * GIB if dev == "cpu" else 0.0)
        out.append((dev, total, devices.get(dev)))
    return out


def describe_gpu(need: GpuNeed, have: float | None) -> str:
    """One line of a GPU's parts per phase (GiB), for :func:`format_plan`."""
    def phase(parts: dict[str, float], share: float, label: str) -> str:
        items = [f"{k} {v / GIB:.2f}" for k, v in parts.items() if v]
        if share:
            items.append(f"{label} {share:g} of the GPU" + (f" = {share * have / GIB:.2f}" if have is not None else ""))
        return " + ".join(items)

    if not need.engine_share:
        return f"update: {phase(need.update, 0.0, '')}"
    n = need.engines
    engines = "engine" if n == 1 else f"{n} engines"
    if need.asleep:
        sleep = ("engine asleep (rollout.vllm_sleep)" if n == 1
                 else "its engine asleep (rollout.vllm_sleep), the others awake")
        awake = need.engine_share * (n - 1) / n
    else:
        sleep, awake = f"{engines} awake (rollout.vllm_sleep=off)", need.engine_share
    return (f"update, {sleep}: {phase(need.update, awake, 'engines' if n > 1 else 'engine')}; "
            f"generation: {phase(need.generation, need.engine_share, engines)}")


def format_plan(cfg: Config, plan: dict, devices: dict[str, float]) -> str:
    gib = lambda x: f"{x / GIB:8.2f} GiB"  # noqa: E731
    tr, r = cfg.training, cfg.rollout
    lines = [f"accord plan: {cfg.run.name} ({cfg.algorithm.name}, specialization {cfg.specialization}, backend "
             f"{cfg.run.backend}); prompt {plan['prompt']} + {r.max_new_tokens} new tokens, micro-batch "
             f"{tr.micro_batch_size if tr.micro_batch_tokens is None else f'{tr.micro_batch_tokens} tokens'}, "
             f"bf16 {tr.bf16}, gradient checkpointing {tr.gradient_checkpointing}"]
    kind = "MAGRPO tree" if plan["multi_turn"] and cfg.algorithm.name == "magrpo" else "generations"
    lines.append(f"step: {plan['generations']} {kind} per step ({plan['turns']} turn(s), K "
                 f"{cfg.algorithm.num_generations}, batch {r.batch_size})")
    for p in plan["plans"]:
        lora = f", LoRA r={cfg.lora.r}: {p.trainable / 1e6:.2f} M trainable" if cfg.specialization == "lora" else (
            f", {p.trainable / 1e6:.2f} M trained" if p.trainable < p.params else "")
        lines.append(f"policy {p.name}: {p.model} ({p.arch}), {p.params / 1e9:.3f} B parameters{lora}; device "
                     f"{p.device}; {p.samples} samples per step, generate calls of {p.gen_rows} rows"
                     + (f" (per rank of {p.replicas} data-parallel ranks, "
                        f"{'FSDP: 1/' + str(p.replicas) + ' of the state each' if cfg.training.fsdp else 'each a full copy'})"
                        if p.replicas > 1 else ""))
        base = f" (shared with {p.shared_base})" if p.shared_base else ""
        for label, v in (("weights fp32" + base, p.weights), ("reference (KL, DPO)", p.reference), ("gradients", p.grads),
                         ("AdamW state", p.optimizer), ("update activations", p.activations),
                         ("generation (KV cache)", p.generation), ("peak", p.peak)):
            lines.append(f"  {label:34s}{gib(v)}")
    fits = True
    for p in plan.get("extras", []):
        lines.append(f"{p.name}: {p.model} ({p.arch}), {p.params / 1e9:.3f} B parameters; device {p.device} (the "
                     "trainer's process)")
        for label, v in (("weights fp32", p.weights), ("gradients", p.grads), ("AdamW state", p.optimizer),
                         ("update activations", p.activations), ("peak", p.peak)):
            lines.append(f"  {label:34s}{gib(v)}")
    lines.append("devices:")
    gpus: dict[str, GpuNeed] = {}
    for dev, total, have in fit(cfg, plan["plans"], devices, plan["resources"], gpus, plan.get("extras", [])):
        if have is None:
            fits = False
            lines.append(f"  {dev}: needs {total / GIB:.2f} GiB; not present here (pass --gpu-memory-gb to plan for "
                         "another machine)")
        else:
            ok = total <= have
            fits &= ok
            lines.append(f"  {dev}: needs {total / GIB:.2f} GiB of {have / GIB:.2f} GiB -> {'fits' if ok else 'DOES NOT FIT'}")
        if dev in gpus:
            lines.append(f"    {describe_gpu(gpus[dev], have)}")
    present = ", ".join(f"{d} ({v / GIB:.1f} GiB)" for d, v in devices.items())
    lines.append(f"present: {present}")
    lines.append(f"verdict: {'the run fits' if fits else PLAN_DOES_NOT_FIT}")
    return "\n".join(lines) + "\n"
