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
of the rollout config, or of each prompt's ``sampling`` where the caller gives one per prompt: agents with
their own settings), drawn from the ``generator`` it is given. A backend that cannot return sampling
log-probs sets ``sampling_logprobs = False`` (its Generations carry empty lists); a run that needs them
(``algorithm.tis``, a loss registered with ``sampling_logprobs=True``) is then refused when it is built.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from accord.config import ConfigError
from accord.rollout.sample import Sampling, rollout_sampling

if TYPE_CHECKING:
    import torch

    from accord.config import RolloutConfig
    from accord.generation.hf import Generation


class GenerationBackend:
    """Completes token-id prompts with a model. Subclasses implement :meth:`generate` and, where one call
    can serve rows of different LoRA adapters, :meth:`generate_mixed`."""

    name = "base"
    mixed_generation = False  # lora.mixed_generation sends a LoRA group's prompts through generate_mixed
    sampling_logprobs = True  # its Generations carry the sampling log-probs of their tokens

    def __init__(self, rollout: RolloutConfig):
        self.rollout = rollout

    def generate(self, model, tokenizer, prompts: list[list[int]], *, greedy: bool, temperature: float,
                 generator: torch.Generator | None, name: str, adapter: str | None = None,
                 row_generators: list[torch.Generator] | None = None,
                 sampling: list[Sampling] | None = None) -> list[Generation]:
        """Completions of ``prompts`` by ``model`` (with LoRA ``adapter`` active, where given), sampled from
        ``generator``, or prompt i from ``row_generators[i]`` (data-parallel ranks: a prompt's tokens do not
        depend on which rank decodes it). ``sampling``: prompt i's settings (temperature, top-k, top-p,
        length cap) in place of the rollout config's and ``temperature``."""
        raise NotImplementedError

    def generate_mixed(self, model, tokenizer, prompts: dict[str, list[list[int]]], *, greedy: bool,
                       temperature: float, generator: torch.Generator | None,
                       sampling: dict[str, list[Sampling]] | None = None) -> dict[str, list[Generation]]:
        """Completions of every adapter's prompts (``{adapter: prompts}``) in calls that mix adapters
        (``sampling``: each adapter's prompts' settings, as :meth:`generate`'s)."""
        raise NotImplementedError(f"generation backend {self.name!r} cannot mix LoRA adapters in one call")

    def before_update(self) -> None:
        """The policy is about to update its weights: release what generation holds on the device until the
        next call (vLLM: sleep mode). The next generate call restores it."""

    def close(self) -> None:
        """Release what the backend holds (an engine, its files); the policy is not used afterwards."""


def settings(rollout: RolloutConfig, temperature: float, sampling: list[Sampling] | None) -> dict:
    """Keyword arguments of :func:`accord.generation.hf.generate` for a call: the rollout config's settings at
    ``temperature``; with ``sampling`` (one per prompt), its settings as numbers when every prompt has the same,
    else ``row_sampling`` (and the largest length cap as ``max_new_tokens``)."""
    first = sampling[0] if sampling else None
    if first is None or all(s == first for s in sampling):
        first = first or replace(rollout_sampling(rollout), temperature=temperature)
        return dict(max_new_tokens=first.max_new_tokens, temperature=first.temperature, top_k=first.top_k,
                    top_p=first.top_p, min_new_tokens=first.min_new_tokens)
    return dict(max_new_tokens=max(s.max_new_tokens for s in sampling), row_sampling=list(sampling))


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
                 row_generators=None, sampling=None):
        from accord.generation.hf import generate

        r = self.rollout
        return generate(model, tokenizer, prompts, greedy=greedy, batch_size=r.generation_batch_size,
                        name=name, generator=generator, row_generators=row_generators,
                        **settings(r, temperature, sampling))

    def generate_mixed(self, model, tokenizer, prompts, *, greedy, temperature, generator, sampling=None):
        from accord.generation.hf import generate

        r = self.rollout
        names = [n for n, ps in prompts.items() for _ in ps]
        flat = [p for ps in prompts.values() for p in ps]
        rows = None if sampling is None else [s for n in prompts for s in sampling[n]]
        outs = generate(model, tokenizer, flat, greedy=greedy, batch_size=r.generation_batch_size,
                        name="+".join(sorted(prompts)), generator=generator, row_args={"adapter_names": names},
                        **settings(r, temperature, rows))
        return _split(names, outs, prompts)


class VLLMBackend(GenerationBackend):
    """One vLLM engine (:class:`accord.generation.vllm_backend.VLLMGenerator`), built on the first call from
    the model it is called with and kept for that model; weights (and the requested adapters) are pushed
    into it when they changed since the last call; on a GPU it sleeps during each update
    (``rollout.vllm_sleep``). Each LoRA policy calls it with its own adapter (vLLM
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
                                        llm_kwargs=dict(r.vllm_kwargs or {}), sleep=r.vllm_sleep)
        return self.engine

    def before_update(self) -> None:
        """Sleep mode: the engine frees its weights and KV cache for the update (see VLLMGenerator.sleep)."""
        if self.engine is not None:
            self.engine.sleep()

    def generate(self, model, tokenizer, prompts, *, greedy, temperature, generator, name, adapter=None,
                 row_generators=None, sampling=None):
        if row_generators is not None:
            raise NotImplementedError("the vllm generation backend samples from one stream per call, not per row")
        engine = self._engine(model, tokenizer, name)
        return self._by_settings(engine, model, prompts, [adapter if engine.peft else None] * len(prompts), greedy,
                                 temperature, generator, name, sampling)

    def generate_mixed(self, model, tokenizer, prompts, *, greedy, temperature, generator, sampling=None):
        label = "+".join(sorted(prompts))
        names = [n for n, ps in prompts.items() for _ in ps]
        flat = [p for ps in prompts.values() for p in ps]
        rows = None if sampling is None else [s for n in prompts for s in sampling[n]]
        engine = self._engine(model, tokenizer, label)
        outs = self._by_settings(engine, model, flat, names, greedy, temperature, generator, label, rows)
        return _split(names, outs, prompts)

    def _by_settings(self, engine, model, prompts, adapters, greedy, temperature, generator, name, sampling):
        """One engine call per distinct sampling setting among the prompts (each call with its settings as
        numbers), the results put back in prompt order."""
        r = self.rollout
        rows = sampling if sampling is not None else [None] * len(prompts)
        out: list = [None] * len(prompts)
        for setting in dict.fromkeys(rows):
            idx = [i for i, s in enumerate(rows) if s == setting]
            kw = settings(r, temperature, None if setting is None else [setting])
            gens = engine.generate(model, [prompts[i] for i in idx], greedy=greedy, name=name, generator=generator,
                                   adapters=[adapters[i] for i in idx] if engine.peft else None, **kw)
            for i, g in zip(idx, gens):
                out[i] = g
        return out

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
