"""``specialization: lora``: one frozen base model, one PEFT LoRA adapter per policy (AT-GRPO's L2).

Mapping. ``policies`` still names the trainable units: every policy of a lora run is one adapter
(named after the policy) over one common base model, and agents map to policies as in the other
levels (3 agents may share 2 adapters). All policies must name the same ``model`` and
``model_kwargs`` (checked by the config). The base is loaded once; its weights are frozen and never
saved in checkpoints (a checkpoint records the base's spec and refuses another one).

Classes. :class:`LoraGroup` owns the PEFT model, the tokenizer and the random stream of mixed
generation calls. :class:`LoraPolicy` presents one adapter with the interface the trainer uses for a
:class:`~accord.policies.protocol.Policy` as a subclass of :class:`~accord.policies.model.ModelPolicy`, sharing
its set-up of the optimizer, schedule and random streams and its update loop, with three differences:

- the adapter is made active before its forward/backward; only its own parameters are in its
  optimizer (one AdamW and LR schedule per adapter, exactly as separate policies would have);
- the KL reference is the base with adapters disabled (``with model.disable_adapter():``), so
  no second copy of the model is kept;
- ``save``/``load`` write the adapter's tensors, its optimizer, scheduler and random streams only;
  ``export`` writes the PEFT format (``save_pretrained`` of the one adapter plus the tokenizer),
  loadable with ``PeftModel.from_pretrained(base_model, directory)``.

Generation. :func:`accord.policies.agents.generate_by_policy` (what the trainer calls) issues ONE generate call for all
adapters of a group when ``lora.mixed_generation`` is on: PEFT's per-row ``adapter_names`` forward
argument (passed as :func:`accord.generation.generate`'s ``row_args``) routes each row of the batch
through its own adapter (PEFT allows this only in eval mode, which accord's generation sets). The
call draws from the group's random stream. With ``mixed_generation: false`` each adapter generates
its own prompts in its own call, from its own stream. The two paths give identical tokens row for
row whenever the random numbers line up (greedy decoding, or the same stream over the same batch
shape); ``tests/policies/test_lora.py`` checks both.

``bench/lora_generation.py MODEL [THREADS]`` times the two modes and the bare base; ``bench/README.md``
has its results. Where accord's direct decoding step applies (:mod:`accord.generation.fast_decode`: plain
LoRA on the projections of a Llama, Qwen2, Mistral or Qwen3 base), it adds the adapters' terms itself: one
product with all adapters' A stacked and one with their B side by side per projection, each row keeping its
own adapter's part through a 0/1 mask, so a mixed call costs little more than one adapter's. Elsewhere PEFT's
mixed path gathers and scatters each adapter's rows in every adapted layer at every step, which costs more as
batches grow. One call saves a whole decoding loop, which matters more for small batches; hence
``mixed_generation: true`` by default. Only requests that name several adapters at once are mixed:
single-turn MAGRPO steps, simultaneous environments and their evaluation. Turn-based rollouts (AT-GRPO) ask
for one agent at a time, since later agents see earlier agents' actions. Adapters on every projection add to
the decoding time of the bare base; ``lora.target_modules: [q_proj, v_proj]`` costs less.
"""

from __future__ import annotations

import inspect
import json
import logging
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from accord.config import Config, ConfigError, LoraConfig, PolicyConfig
from accord.config.rules import check_lora_policies
from accord.devices import make_generator, resolve_bf16, restore_generator
from accord.generation import Generation
from accord.generation.backends import make_backend
from accord.models import load_model_and_tokenizer
from accord.policies.learner import (decoder_blocks, enable_gradient_checkpointing, load_optimizer_state,
                                    load_scheduler_state, read_saved_state)
from accord.policies.model import ModelPolicy
from accord.seeding import lora_adapter_seed, lora_group_stream_seed, policy_seed, seeded_torch

logger = logging.getLogger(__name__)

_PEFT_MISSING = ("specialization=lora needs the `peft` package: pip install 'accord[lora]' (or pip install peft)")


def _peft():
    try:
        import peft
    except ImportError as err:  # pragma: no cover - peft is in the test extra
        raise ConfigError(_PEFT_MISSING) from err
    return peft


def adaptable_modules(model) -> dict[str, list[str]]:
    """Last name component -> full names of the modules LoRA can adapt (linear layers, embeddings)."""
    from transformers.pytorch_utils import Conv1D

    out: dict[str, list[str]] = {}
    for full, module in model.named_modules():
        if full and isinstance(module, (torch.nn.Linear, torch.nn.Embedding, Conv1D)):
            out.setdefault(full.rsplit(".", 1)[-1], []).append(full)
    return out


def default_target_modules(model) -> list[str]:
    """Every linear projection of the model except the output head (attention and MLP projections)."""
    head = model.get_output_embeddings()
    names = set()
    for full, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module is not head:
            names.add(full.rsplit(".", 1)[-1])
    if not names:
        raise ConfigError(f"{type(model).__name__} has no linear layers besides its output head; set "
                          "lora.target_modules to the modules to adapt")
    return sorted(names)


def adapted_blocks(model, trainable_layers: int | None) -> list[int] | None:
    """The decoder blocks that get adapters under ``policies.<name>.trainable_layers``: the last N (None: all,
    also when the model has N blocks or fewer). The backward then stops at the lowest adapted block."""
    if trainable_layers is None:
        return None
    blocks = decoder_blocks(model, trainable_layers)
    if trainable_layers >= len(blocks):
        return None
    return list(range(len(blocks) - trainable_layers, len(blocks)))


def check_target_modules(model, targets: list[str], spec: str) -> None:
    """Every target must name a module (by its last name component or a dotted suffix)."""
    available = adaptable_modules(model)
    fulls = [f for names in available.values() for f in names]
    missing = [t for t in targets if t not in available and not any(f == t or f.endswith("." + t) for f in fulls)]
    if missing:
        raise ConfigError(
            f"lora.target_modules {missing} match no module of model {spec!r}; the modules LoRA can adapt are "
            f"{sorted(available)}. Set lora.target_modules to some of them (e.g. [q_proj, v_proj]) or null for "
            "every linear projection")


class LoraGroup:
    """One frozen base model with one LoRA adapter per policy name, and the mixed-generation stream."""

    def __init__(self, names: list[str], base: PolicyConfig, lora: LoraConfig, training, rollout, seed: int,
                 device: torch.device | None = None):
        peft = _peft()
        self.names, self.lora, self.rollout, self.spec = list(names), lora, rollout, base
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.bf16 = resolve_bf16(training.bf16, self.device)
        model, self.tokenizer = load_model_and_tokenizer(base.model, model_kwargs=base.model_kwargs, seed=seed)
        self.targets = list(lora.target_modules) if lora.target_modules else default_target_modules(model)
        check_target_modules(model, self.targets, base.model)
        if training.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.keep_arg = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.context_len = getattr(model.config, "max_position_embeddings", None)
        config = peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                 target_modules=self.targets, bias="none", task_type="CAUSAL_LM",
                                 layers_to_transform=adapted_blocks(model, base.trainable_layers))
        with warnings.catch_warnings():
            # PEFT warns when an adapter name is a substring of "lora_" (its own loader could then
            # confuse keys); accord saves and loads adapter tensors itself, by module.
            warnings.filterwarnings("ignore", message=".*should not be contained in the prefix.*")
            # PEFT still asks transformers 5 for the deprecated `is_gradient_checkpointing`
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            for i, name in enumerate(self.names):
                with seeded_torch(lora_adapter_seed(seed, name), devices=[]):  # adapter init: B = 0, A random
                    if i == 0:
                        self.model = peft.get_peft_model(model, config, adapter_name=name)
                    else:
                        self.model.add_adapter(name, config)
        self.base = model
        self.model.to(self.device)  # base and adapters built on the CPU (same init on every device), then moved
        assert not any(p.requires_grad for n, p in self.base.named_parameters() if "lora_" not in n)
        self._active: str | None = None
        self.activate(self.names[0])
        self.model.train()
        self.generator = make_generator(self.device, lora_group_stream_seed(seed))
        self.backend = make_backend(rollout)   # one for all adapters: with vLLM, one engine for the group
        self._streams: dict[str, torch.Generator] = {}

    def activate(self, name: str) -> None:
        """Make ``name`` the adapter of plain forwards (the update, per-adapter generation)."""
        if self._active != name:
            self.model.set_adapter(name)
            self._active = name

    def adapter_parameters(self, name: str) -> dict[str, torch.nn.Parameter]:
        """The parameters of adapter ``name``, by module path (stable across runs)."""
        from peft.tuners.lora import LoraLayer

        out = {}
        for path, module in self.model.named_modules():
            if isinstance(module, LoraLayer):
                for kind in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"):
                    holder = getattr(module, kind, None)
                    if holder is not None and name in holder:
                        sub = holder[name]
                        if isinstance(sub, torch.nn.Parameter):
                            out[f"{path}.{kind}"] = sub
                        else:
                            for pn, p in sub.named_parameters():
                                out[f"{path}.{kind}.{pn}"] = p
        if not out:
            raise RuntimeError(f"adapter {name!r} has no parameters; targets {self.targets}")
        return out

    def seed_stream(self, stream: str, seed: int) -> None:
        self._streams[stream] = make_generator(self.device, seed)

    def generate_mixed(self, prompts: dict[str, list[list[int]]], *, greedy: bool, temperature: float,
                       stream: str | None = None, sampling: dict[str, list] | None = None
                       ) -> dict[str, list[Generation]]:
        """All adapters' prompts in batches of mixed adapters (one generate call per
        ``rollout.generation_batch_size`` rows), from the group's random stream (``sampling``: each adapter's
        prompts' own settings)."""
        if stream is not None and stream not in self._streams:
            raise KeyError(f"lora group {self.names} has no random stream {stream!r}; call seed_stream first")
        gen = self.generator if stream is None else self._streams[stream]
        return self.backend.generate_mixed(self.model, self.tokenizer, prompts, greedy=greedy,
                                           temperature=temperature, generator=gen, sampling=sampling)


class LoraPolicy(ModelPolicy):
    """One adapter of a :class:`LoraGroup`, with its own optimizer, schedule and random streams."""

    def __init__(self, name: str, group: LoraGroup, cfg: PolicyConfig, training, algo, rollout,
                 total_optimizer_steps: int, seed: int):
        self._settings(name, cfg, training, algo, rollout)
        self.group, self.bf16, self.device = group, group.bf16, group.device
        self.model, self.tokenizer = group.model, group.tokenizer
        self.backend, self._adapter = group.backend, name
        self.ref_model = None  # the reference is the base with adapters disabled
        self.named_params = group.adapter_parameters(name)
        self._start_learner(list(self.named_params.values()), total_optimizer_steps, seed)
        self._keep_arg = group.keep_arg
        self.context_len = group.context_len

    # --- generation ------------------------------------------------------------------------------
    def seed_stream(self, stream: str, seed: int) -> None:
        """Start a named stream for this adapter; the group's stream of that name (used by mixed
        calls) is seeded with the seed given to the group's first adapter."""
        super().seed_stream(stream, seed)
        if self.name == self.group.names[0]:
            self.group.seed_stream(stream, seed)

    def generate(self, prompts: list[list[int]], *, greedy: bool, temperature: float,
                 stream: str | None = None, sampling=None) -> list[Generation]:
        """This adapter alone, from its own random stream (the per-adapter path)."""
        self.group.activate(self.name)
        return super().generate(prompts, greedy=greedy, temperature=temperature, stream=stream, sampling=sampling)

    # --- update ----------------------------------------------------------------------------------
    @torch.no_grad()
    def _reference_logprobs(self, batch) -> torch.Tensor:
        was = self.model.training
        self.model.eval()  # like the frozen reference of full policies (no dropout)
        try:
            with self.model.disable_adapter():
                return self._forward_completion(self.model, batch, want_entropy=False, untruncated=True)[0]
        finally:
            self.model.train(was)

    def update(self, samples, step: int) -> dict[str, float]:
        self.group.activate(self.name)
        return super().update(samples, step)

    def kl_rewards(self, samples) -> list[tuple[float, int]]:
        self.group.activate(self.name)
        return super().kl_rewards(samples)

    def logprobs(self, samples) -> list[list[float]]:
        self.group.activate(self.name)
        return super().logprobs(samples)

    # --- state -----------------------------------------------------------------------------------
    def _base_record(self) -> dict:
        record = {"model": self.group.spec.model, "model_kwargs": self.group.spec.model_kwargs,
                  "lora": {"r": self.group.lora.r, "alpha": self.group.lora.alpha, "target_modules": self.group.targets}}
        if self.group.spec.trainable_layers is not None:
            record["trainable_layers"] = self.group.spec.trainable_layers
        return record

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        directory.mkdir(exist_ok=True)
        save_file({k: v.detach().contiguous() for k, v in self.named_params.items()},
                  str(directory / "adapter.safetensors"))
        torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                    "generator": self.generator.get_state(), "group_generator": self.group.generator.get_state(),
                    "generator_device": self.device.type},
                   directory / "optimizer.pt")
        (directory / "base.json").write_text(json.dumps(self._base_record(), sort_keys=True))

    def load(self, directory: Path) -> None:
        directory = Path(directory)
        record = directory / "base.json"
        if record.is_file():
            saved = json.loads(record.read_text())
            if saved != json.loads(json.dumps(self._base_record(), sort_keys=True)):
                raise ConfigError(f"{directory} holds adapter {self.name!r} of base {saved}, but this run builds "
                                  f"{self._base_record()}; use the config the checkpoint was trained with")
        tensors = load_file(str(directory / "adapter.safetensors"), device="cpu")
        if set(tensors) != set(self.named_params):
            raise ConfigError(f"{directory}: the saved adapter's tensors do not match adapter {self.name!r} "
                              "(different lora.target_modules?)")
        with torch.no_grad():
            for k, p in self.named_params.items():
                p.copy_(tensors[k])
        state = read_saved_state(directory / "optimizer.pt",
                                   ("optimizer", "scheduler", "generator", "group_generator"))
        load_optimizer_state(self.optimizer, state["optimizer"], f"adapter {self.name!r}")
        load_scheduler_state(self.scheduler, state["scheduler"], f"adapter {self.name!r}")
        saved = state.get("generator_device")
        restore_generator(self.generator, state["generator"], saved, f"adapter {self.name!r}")
        restore_generator(self.group.generator, state["group_generator"], saved, f"lora group of {self.name!r}")

    def export(self, directory: Path) -> None:
        """The adapter in PEFT format (``adapter_config.json`` + ``adapter_model.safetensors``) and the
        tokenizer: ``PeftModel.from_pretrained(base, directory)`` with the base of the config."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory.parent) as tmp:
            self.model.save_pretrained(tmp, selected_adapters=[self.name])
            src = Path(tmp) / self.name if (Path(tmp) / self.name).is_dir() else Path(tmp)
            for f in src.iterdir():
                if f.is_file():
                    shutil.move(str(f), directory / f.name)
        self.tokenizer.save_pretrained(directory)


def build_lora_policies(cfg: Config, names: list[str], total_optimizer_steps: int, seed: int,
                        device: torch.device | None = None) -> dict[str, LoraPolicy]:
    """One :class:`LoraGroup` over the common base (on ``device``, default the CPU) and one
    :class:`LoraPolicy` per name (sorted)."""
    names = sorted(names)
    check_lora_policies(cfg)
    group = LoraGroup(names, cfg.policies[names[0]], cfg.lora, cfg.training, cfg.rollout, seed, device)
    return {name: LoraPolicy(name, group, cfg.policies[name], cfg.training, cfg.algorithm, cfg.rollout,
                             total_optimizer_steps, policy_seed(seed, i))
            for i, name in enumerate(names)}
