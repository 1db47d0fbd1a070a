"""Generation backends: the object a policy (or a LoRA group) owns and calls to complete prompts.

``rollout.generation_backend`` names one registered backend; :func:`make_backend` builds it from the rollout
config when a policy is built, and the policy calls it with its model, tokenizer, prompts and random stream:

- ``hf`` (default): accord's batched decoding loop over the Hugging Face model (:mod:`accord.generation.hf`);
  rows of different LoRA adapters share a batch (``adapter_names`` per row).
- ``vllm`` (optional extra): one vLLM engine per backend object, built on first use from the model's weights
  and synced when they change (:mod:`accord.generation.vllm_backend`); the LoRA policies of a group share
  the group's backend and so one engine.

A user adds a backend with :func:`register_backend` in a module listed under ``imports:``; the name is
checked against this registry when a run is built. A backend returns one :class:`Generation` per prompt,
in order, with the sampling log-probs of the distribution the learner recomputes (temperature, top-k, top-p
of the rollout config), drawn from the ``generator`` it is given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from accord.config import ConfigError

if TYPE_CHECKING:
    import torch

    from accord.config import RolloutConfig
    from accord.generation.hf import Generation


class GenerationBackend:
    """Completes token-id prompts with a model. Subclasses implement :meth:`generate` and, where one call
    can serve rows of different LoRA adapters, :meth:`generate_mixed`."""

    name = "base"
    mixed_generation = False  # lora.mixed_generation sends a LoRA group's prompts through generate_mixed

    def __init__(self, rollout: RolloutConfig):
        self.rollout = rollout

    def generate(self, model, tokenizer, prompts: list[list[int]], *, greedy: bool, temperature: float,
                 generator: torch.Generator | None, name: str, adapter: str | None = None,
                 row_generators: list[torch.Generator] | None = None) -> list[Generation]:
        """Completions of ``prompts`` by ``model`` (with LoRA ``adapter`` active, where given), sampled from
        ``generator``, or prompt i from ``row_generators[i]`` (data-parallel ranks: a prompt's tokens do not
        depend on which rank decodes it)."""
        raise NotImplementedError

    def generate_mixed(self, model, tokenizer, prompts: dict[str, list[list[int]]], *, greedy: bool,
                       temperature: float, generator: torch.Generator | None) -> dict[str, list[Generation]]:
        """Completions of every adapter's prompts (``{adapter: prompts}``) in calls that mix adapters."""
        raise NotImplementedError(f"generation backend {self.name!r} cannot mix LoRA adapters in one call")

    def close(self) -> None:
        """Release what the backend holds (an engine, its files); the policy is not used afterwards."""


def _split(names: list[str], outs: list, prompts: dict[str, list]) -> dict[str, list]:
    result, pos = {}, 0
    for n, ps in prompts.items():
        result[n] = outs[pos:pos + len(ps)]
        pos += len(ps)
    return result


class HFBackend(GenerationBackend):
    """accord's batched decoding loop (``rollout.generation_batch_size`` rows per call) over the HF model.
    A LoRA adapter is switched by its group before the call (``adapter`` is only a label here)."""

    name = "hf"
    mixed_generation = True

    def generate(self, model, tokenizer, prompts, *, greedy, temperature, generator, name, adapter=None,
                 row_generators=None):
        from accord.generation.hf import generate

        r = self.rollout
        return generate(model, tokenizer, prompts, max_new_tokens=r.max_new_tokens, temperature=temperature,
                        top_k=r.top_k, top_p=r.top_p, greedy=greedy, batch_size=r.generation_batch_size,
                        name=name, generator=generator, row_generators=row_generators)

    def generate_mixed(self, model, tokenizer, prompts, *, greedy, temperature, generator):
        from accord.generation.hf import generate

        r = self.rollout
        names = [n for n, ps in prompts.items() for _ in ps]
        flat = [p for ps in prompts.values() for p in ps]
        outs = generate(model, tokenizer, flat, max_new_tokens=r.max_new_tokens, temperature=temperature,
                        top_k=r.top_k, top_p=r.top_p, greedy=greedy, batch_size=r.generation_batch_size,
                        name="+".join(sorted(prompts)), generator=generator, row_args={"adapter_names": names})
        return _split(names, outs, prompts)


class VLLMBackend(GenerationBackend):
    """One vLLM engine (:class:`accord.generation.vllm_backend.VLLMGenerator`), built on the first call from
    the model it is called with and kept for that model; weights (and the requested adapters) are pushed
    into it when they changed since the last call. Each LoRA policy calls it with its own adapter (vLLM
    batches the requests of different adapters itself); ``row_generators`` are not supported (replicas
    with vLLM are refused when the config is checked)."""

    name = "vllm"

    def __init__(self, rollout: RolloutConfig, seed: int = 0):
        super().__init__(rollout)
        self.seed = seed
        self.engine = None

    def _engine(self, model, tokenizer, name: str):
        if self.engine is None:
            from accord.generation.vllm_backend import VLLMGenerator

            r = self.rollout
            self.engine = VLLMGenerator(model, tokenizer, name=name, seed=self.seed,
                                        gpu_memory_utilization=r.vllm_gpu_memory_utilization,
                                        llm_kwargs=dict(r.vllm_kwargs or {}))
        return self.engine

    def generate(self, model, tokenizer, prompts, *, greedy, temperature, generator, name, adapter=None,
                 row_generators=None):
        if row_generators is not None:
            raise NotImplementedError("the vllm generation backend samples from one stream per call, not per row")
        r = self.rollout
        engine = self._engine(model, tokenizer, name)
        return engine.generate(model, prompts, max_new_tokens=r.max_new_tokens, temperature=temperature,
                               top_k=r.top_k, top_p=r.top_p, greedy=greedy, name=name, generator=generator,
                               adapters=adapter if engine.peft else None)

    def generate_mixed(self, model, tokenizer, prompts, *, greedy, temperature, generator):
        r = self.rollout
        label = "+".join(sorted(prompts))
        names = [n for n, ps in prompts.items() for _ in ps]
        flat = [p for ps in prompts.values() for p in ps]
        engine = self._engine(model, tokenizer, label)
        outs = engine.generate(model, flat, max_new_tokens=r.max_new_tokens, temperature=temperature,
                               top_k=r.top_k, top_p=r.top_p, greedy=greedy, name=label, generator=generator,
                               adapters=names)
        return _split(names, outs, prompts)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None


BackendFactory = Callable[["RolloutConfig"], GenerationBackend]
GENERATION_BACKENDS: dict[str, BackendFactory] = {"hf": HFBackend, "vllm": VLLMBackend}


def register_backend(name: str) -> Callable[[BackendFactory], BackendFactory]:
    """Decorator: ``rollout.generation_backend: NAME`` builds ``factory(rollout_config)`` (a
    :class:`GenerationBackend` subclass is a factory); another factory under a taken name is an error."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"generation backend name {name!r} must be an identifier")

    def deco(factory: BackendFactory) -> BackendFactory:
        if name in GENERATION_BACKENDS and GENERATION_BACKENDS[name] is not factory:
            raise ValueError(f"a generation backend named {name!r} is already registered; choose another name")
        GENERATION_BACKENDS[name] = factory
        return factory

    return deco


def make_backend(rollout: RolloutConfig) -> GenerationBackend:
    """The backend ``rollout.generation_backend`` names, built for one policy or LoRA group."""
    factory = GENERATION_BACKENDS.get(rollout.generation_backend)
    if factory is None:
        raise ConfigError(f"rollout.generation_backend={rollout.generation_backend!r} is not registered; "
                          f"registered: {sorted(GENERATION_BACKENDS)}. Register your own with "
                          "accord.generation.backends.register_backend in a module listed under imports:")
    return factory(rollout)
