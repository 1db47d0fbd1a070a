"""``training.fsdp: true``: a data-parallel policy whose ranks each hold 1/N of the model.

Built on :class:`accord.distributed.ranks.DataParallelPolicy` (same calls, same split of the work,
same per-prompt random streams) with torch's FSDP2 (``torch.distributed.fsdp.fully_shard``) applied to
every decoder layer and then to the whole model, on the policy's process group (gloo on the CPU, NCCL on
CUDA). What differs from plain replicas:

- Memory. Parameters (fp32 master weights), gradients and AdamW moments are sharded: each rank keeps
  1/N of them. The model is loaded whole on the CPU, then sharded (and moved to the rank's device).
- ``update``: the forward all-gathers one layer at a time and frees it after (``reshard_after_forward``);
  the backward reduce-scatters the gradients. FSDP's reduction is a *sum* (divide factor 1, sum-only
  collectives, which gloo needs): the loss of each rank is already normalised by the whole mini-batch, as
  without FSDP, so no all-reduce follows (``_sync_gradients`` does nothing). Every rank must run the same
  number of forwards and backwards, so a rank with fewer micro-batches than another runs *filler*
  micro-batches (one sample, loss times 0: zero gradient, collectives in step), and the prompt-sharing
  forward (two passes, their number depending on the data) is not used. Gradient clipping is torch's
  ``clip_grad_norm_`` on the sharded gradients (DTensors: the norm is reduced over ranks).
- ``generate`` and ``kl_rewards``: each rank decodes or scores its own share, whose number of forward calls
  depends on the data; so the whole model (and the KL reference) is gathered on every rank first
  (``unshard``, kept for the call, sharded again after), and the calls run without collectives. Peak memory
  during generation is therefore the whole fp32 model per rank, as without FSDP; the update's weights,
  gradients and optimizer state are what FSDP divides. Accord's direct decoding step
  (:class:`accord.generation.fast_decode.DecodeStep`) does not apply to FSDP modules (their forward has
  hooks): generation runs through the model's forward.
- KL reference (``algorithm.kl_coef > 0``): a copy of the initial weights, sharded like the policy.
- Checkpoints: ``save`` gathers the full model and optimizer state (torch.distributed.checkpoint's
  ``get_model_state_dict`` / ``get_optimizer_state_dict`` with ``full_state_dict``, ``cpu_offload``) and
  rank 0 writes the same files as an unsharded policy (the optimizer state keyed by parameter index, in
  ``model.parameters()`` order), so a run trained with FSDP resumes with or without it and exports
  normally; ``load`` reads the full files on every rank and shards them. ``save`` and ``export`` are
  collectives: every rank is called.

Devices: CPU (gloo) and CUDA (NCCL); checked before any model loads (:func:`check_fsdp_support`), with
the FSDP2 methods used here (torch >= 2.8: ``set_force_sum_reduction_for_comms``,
``set_gradient_divide_factor`` and ``set_reshard_after_forward`` are not in torch 2.7).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch
from safetensors.torch import save_model

from accord.config import Config, ConfigError
from accord.devices import policy_setting, restore_generator
from accord.distributed.ranks import DataParallelPolicy, part
from accord.policies.learner import check_optimizer_state, load_scheduler_state, micro_batches, read_saved_state
from accord.rollout.sample import Sample

logger = logging.getLogger(__name__)

# the FSDP2 calls this module makes; the last three are new in torch 2.8 (2.7's FSDPModule lacks them)
FSDP_METHODS = ("unshard", "reshard", "set_reshard_after_forward", "set_force_sum_reduction_for_comms",
                "set_gradient_divide_factor")
TORCH_NEEDED = "2.8"


def missing_fsdp_api() -> list[str]:
    """What of FSDP2 this module calls is missing from this torch (checked by name, not by version: a
    build of another version number, or a backport, is judged by what it has)."""
    try:
        from torch.distributed.fsdp import FSDPModule, fully_shard  # noqa: F401
    except ImportError:
        return ["torch.distributed.fsdp.fully_shard"]
    return [f"FSDPModule.{m}" for m in FSDP_METHODS if not callable(getattr(FSDPModule, m, None))]


def check_fsdp_support(cfg: Config, names: list[str], *, cuda_count: int | None = None) -> None:
    """Refuse training.fsdp where this torch cannot shard on the policies' devices (before any model loads)."""
    import torch.distributed as dist

    if not dist.is_available():
        raise ConfigError(f"training.fsdp=true needs torch.distributed, which this torch build ({torch.__version__}) "
                          "lacks; install a torch build with distributed support or set training.fsdp=false")
    missing = missing_fsdp_api()
    if missing:
        raise ConfigError(f"training.fsdp=true needs FSDP2's {', '.join(missing)}, which torch {torch.__version__} "
                          f"lacks (torch >= {TORCH_NEEDED} has them); upgrade torch or set training.fsdp=false")
    if cuda_count is None:
        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for n in names:
        setting, key = policy_setting(cfg, n)
        on_gpu = setting.startswith("cuda") or (setting == "auto" and cuda_count > 0)
        if on_gpu and not dist.is_nccl_available():
            raise ConfigError(f"training.fsdp=true on {key}={setting} needs NCCL, which this torch build lacks "
                              f"(available: gloo on cpu); set {key}=cpu or training.fsdp=false")
        if not on_gpu and not dist.is_gloo_available():
            raise ConfigError(f"training.fsdp=true on the CPU ({key}={setting}) needs gloo, which this torch build "
                              "lacks; use CUDA devices (NCCL) or training.fsdp=false")


def fsdp_modules(model: torch.nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def shard(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """FSDP2 on every decoder layer, then on the root (embeddings, final norm, head); gradients summed."""
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ConfigError(f"training.fsdp=true: {type(model).__name__} has no model.layers (decoder layers) to shard; "
                          "set training.fsdp=false")
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in fsdp_modules(model):
        m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        m.set_gradient_divide_factor(1.0)          # sum: each rank's loss is normalised by the whole mini-batch
    return model


@contextlib.contextmanager
def gathered(*models):
    """Every FSDP module of ``models`` unsharded for the block (one all-gather each, on every rank), and its
    forwards free of collectives, so that ranks may run different numbers of them."""
    mods = [m for model in models if model is not None for m in fsdp_modules(model)]
    for m in mods:
        m.unshard()
        m.set_reshard_after_forward(False)
    try:
        yield
    finally:
        for m in mods:
            m.reshard()
            m.set_reshard_after_forward(True)


def _plain_class(model: torch.nn.Module) -> type:
    """The model's own class (fully_shard swaps in a subclass FSDP<name>)."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))


class FsdpPolicy(DataParallelPolicy):
    """One rank of a sharded data-parallel policy (see the module docstring)."""

    def _mesh(self):
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

        if self.group is None:
            return init_device_mesh(self.device.type, (self.world,))
        return DeviceMesh.from_group(self.group, self.device.type)

    # --- placement (called by ModelPolicy.__init__) -----------------------------------------------------
    def _place_model(self, model):
        self._ref_source = None
        if self.algo.kl_coef > 0:  # the reference: the initial weights, sharded separately
            import copy

            self._ref_source = copy.deepcopy(model)
        self._fsdp_mesh = self._mesh()
        if self.device.type == "cuda":
            model.to(self.device)
        return shard(model, self._fsdp_mesh)

    def _reference_model(self):
        ref, self._ref_source = self._ref_source, None
        ref.eval().requires_grad_(False)
        if self.device.type == "cuda":
            ref.to(self.device)
        return shard(ref, self._fsdp_mesh)

    # --- calls whose number of forwards depends on the rank's data -------------------------------
    def generate(self, prompts, *, greedy: bool, temperature: float, stream: str | None = None, sampling=None):
        with torch.no_grad(), gathered(self.model):
            return super().generate(prompts, greedy=greedy, temperature=temperature, stream=stream,
                                    sampling=sampling)

    def kl_rewards(self, samples: list[Sample]) -> list[tuple[float, int]]:
        with gathered(self.model, self.ref_model):
            return super().kl_rewards(samples)

    def logprobs(self, samples: list[Sample]) -> list[list[float]]:
        with gathered(self.model):
            return super().logprobs(samples)

    # --- update hooks ------------------------------------------------------------------------------
    def _can_share_prompts(self, model) -> bool:
        return False  # its number of forward passes depends on the data; FSDP needs the same on every rank

    def _micro_batches(self, mini_batch: list[Sample]) -> list[tuple[list[Sample], bool]]:
        tr = self.training
        counts = [len(micro_batches(mini_batch[part(len(mini_batch), r, self.world)], tr.micro_batch_size,
                                    tr.micro_batch_tokens)) for r in range(self.world)]
        mine = [(m, True) for m in micro_batches(self._local_samples(mini_batch), tr.micro_batch_size,
                                                 tr.micro_batch_tokens)]
        return mine + [([mini_batch[0]], False)] * (max(counts) - len(mine))

    def _sync_gradients(self) -> None:
        """FSDP's reduce-scatter in the backward has summed the gradients already."""

    # --- state -------------------------------------------------------------------------------------
    def _options(self, **kw):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, **kw)

    def _param_names(self) -> list[str]:
        """Names of the optimizer's parameters in order (``model.parameters()`` order, tied ones once)."""
        ids = {id(p): n for n, p in reversed(list(self.model.named_parameters()))}
        return [ids[id(p)] for p in self.params]

    def _full_model(self) -> torch.nn.Module | None:
        """The whole model as a plain module on the CPU, on rank 0 (None elsewhere); a collective."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(self.model, options=self._options(cpu_offload=True))
        if self.rank != 0:
            return None
        with torch.device("meta"):
            plain = _plain_class(self.model)(self.model.config)
        plain.load_state_dict(state, assign=True, strict=False)
        plain.tie_weights()
        missing = [n for n, p in plain.named_parameters() if p.is_meta]
        if missing:  # pragma: no cover - a model whose state dict does not name every parameter
            raise RuntimeError(f"policy {self.name!r}: the gathered state lacks {missing[:5]}")
        return plain

    def save(self, directory: Path) -> None:
        """Gather the full state (every rank), rank 0 writes the files of an unsharded policy."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        plain = self._full_model()
        optim = get_optimizer_state_dict(self.model, self.optimizer, options=self._options(cpu_offload=True))
        if self.rank != 0:
            return
        index = {n: i for i, n in enumerate(self._param_names())}
        optim = {"state": {index[n]: s for n, s in optim["state"].items()},
                 "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in optim["param_groups"]]}
        directory.mkdir(exist_ok=True)
        save_model(plain, str(directory / "model.safetensors"))
        torch.save({"optimizer": optim, "scheduler": self.scheduler.state_dict(),
                    "generator": self.generator.get_state(), "generator_device": self.device.type},
                   directory / "optimizer.pt")

    def load(self, directory: Path) -> None:
        """Every rank reads the full files (a policy saved with or without FSDP) and keeps its shard."""
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        weights = load_file(str(directory / "model.safetensors"), device="cpu")
        names = dict(self.model.named_parameters(remove_duplicate=False))
        for n in names:  # a tied parameter is stored under one of its names
            if n not in weights:
                twin = next((m for m in weights if names.get(m) is names[n]), None)
                if twin is None:
                    raise ConfigError(f"policy {self.name!r}: {directory / 'model.safetensors'} lacks {n}; it was "
                                      "saved from another model")
                weights[n] = weights[twin]
        set_model_state_dict(self.model, weights, options=self._options())
        state = read_saved_state(directory / "optimizer.pt", ("optimizer", "scheduler", "generator"))
        order = self._param_names()
        saved = state["optimizer"]
        check_optimizer_state(self.optimizer, saved, f"policy {self.name!r}")
        optim = {"state": {order[i]: s for i, s in saved["state"].items()},
                 "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in saved["param_groups"]]}
        set_optimizer_state_dict(self.model, self.optimizer, optim, options=self._options())
        load_scheduler_state(self.scheduler, state["scheduler"], f"policy {self.name!r}")
        restore_generator(self.generator, state["generator"], state.get("generator_device"), f"policy {self.name!r}")

    def export(self, directory: Path) -> None:
        plain = self._full_model()
        if plain is not None:
            plain.save_pretrained(directory)
            self.tokenizer.save_pretrained(directory)


__all__ = ["FsdpPolicy", "check_fsdp_support", "gathered", "shard"]
