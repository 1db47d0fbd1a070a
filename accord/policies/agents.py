"""Generation for agents: the ``generate`` function that rollouts receive, over a run's policies.

:class:`AgentGenerator` maps each (agent, chat) request to the policy acting for that agent and makes
one generate call per policy for all of them (one call for all adapters of a LoRA base with
``lora.mixed_generation``); it counts the tokens it generated, for ``perf/gen_tokens``.

Each agent samples with its own settings (``agents[].sampling`` over ``rollout``: temperature, top-k,
top-p, length cap): agents that share a policy still share its one call, each row with its agent's
settings, and every completion records them (``Completion.sampling``) for the learner.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from accord.generation import Generation
from accord.generation.fast_decode import shared_trunk
from accord.generation.hf import generate_together
from accord.metric_names import ROLLOUT_HISTORY_CUT
from accord.policies.lora import LoraGroup
from accord.policies.protocol import Policy, PromptTooLongError
from accord.rollout.sample import Completion, Sampling

logger = logging.getLogger(__name__)


class AgentGenerator:
    """``generate(requests, n, greedy, temperature=None, stream=None)`` over a run's policies; ``sampling``:
    each agent's settings (:func:`accord.rollout.sample.agent_sampling`; None: the rollout config's)."""

    def __init__(self, policies: dict[str, Policy], agent_policy: dict[str, str],
                 sampling: dict[str, Sampling] | None = None):
        self.policies, self.agent_policy = policies, agent_policy
        self.sampling = sampling
        self.tokens = 0   # generated tokens since the last reset (the trainer resets it every step)
        self.history_cut = 0   # earlier exchanges left out of prompts to fit rollout.max_prompt_tokens, likewise
        self._warned = False

    def __call__(self, requests: list[tuple[str, list[dict]]], n: int, greedy: bool, *,
                 temperature: float | None = None, stream: str | None = None) -> list[list[Completion]]:
        """``n`` completions of each (agent, chat) request, each agent sampling with its own settings;
        ``temperature`` (evaluation) replaces every agent's temperature."""
        rows = self._settings(requests, temperature)
        encoded = [self._encode(a, msgs, {} if row is None else {"max_new_tokens": row.max_new_tokens})
                   for (a, msgs), row in zip(requests, rows)]
        out: list[list[Completion | None]] = [[None] * n for _ in requests]
        by_policy = {}
        for pname in self.policies:
            slots = [(r, s) for r, (a, _) in enumerate(requests) if self.agent_policy[a] == pname for s in range(n)]
            if slots:
                by_policy[pname] = slots
        sampling = None if self.sampling is None else {p: [rows[r] for r, _ in sl] for p, sl in by_policy.items()}
        all_gens = generate_by_policy(self.policies, {p: [encoded[r] for r, _ in sl] for p, sl in by_policy.items()},
                                      greedy=greedy, temperature=1.0 if temperature is None else temperature,
                                      stream=stream, sampling=sampling)
        for pname, slots in by_policy.items():
            pol, gens = self.policies[pname], all_gens[pname]
            for (r, s), g in zip(slots, gens):
                out[r][s] = Completion(encoded[r], g.ids, g.logprobs, g.finish_reason, pol.decode(g.ids),
                                       None if greedy else rows[r])
                self.tokens += len(g.ids)
        return out

    def _encode(self, agent: str, msgs: list[dict], kwargs: dict) -> list[int]:
        """The prompt's token ids; a prompt too long for its policy (``rollout.max_prompt_tokens``, the context)
        leaves out its earliest (user, assistant) exchanges, one at a time, until it fits: a multi-turn history
        grows with what the agents write, and a verbose policy must not stop the run. Counted in
        ``history_cut`` and said once; a prompt with no exchange left to leave out is the policy's error."""
        policy = self.policies[self.agent_policy[agent]]
        cut = 0
        while True:
            try:
                ids = policy.encode_chat(msgs, **kwargs)
                break
            except PromptTooLongError:
                shorter = without_earliest_exchange(msgs)
                if shorter is None:
                    raise
                msgs, cut = shorter, cut + 1
        if cut:
            self.history_cut += cut
            if not self._warned:
                self._warned = True
                logger.warning("a prompt of agent %r was too long for rollout.max_prompt_tokens (or the context) "
                               "with its whole history: its %d earliest exchange(s) were left out (%s counts them "
                               "per step); raise rollout.max_prompt_tokens or set rollout.history_turns", agent,
                               cut, ROLLOUT_HISTORY_CUT)
        return ids

    def _settings(self, requests, temperature: float | None) -> list[Sampling | None]:
        """Each request's sampling settings (its agent's, at ``temperature`` where given)."""
        if self.sampling is None:
            if temperature is None:
                raise ValueError("AgentGenerator without per-agent sampling needs a temperature")
            return [None] * len(requests)
        rows = [self.sampling[a] for a, _ in requests]
        return rows if temperature is None else [replace(s, temperature=temperature) for s in rows]


def without_earliest_exchange(msgs: list[dict]) -> list[dict] | None:
    """``msgs`` without the (user, assistant) exchange that follows the system message (or opens the chat), or
    None when there is none before the last message."""
    start = 1 if msgs and msgs[0].get("role") == "system" else 0
    if len(msgs) - start >= 3 and msgs[start].get("role") == "user" and msgs[start + 1].get("role") == "assistant":
        return msgs[:start] + msgs[start + 2:]
    return None


def generate_by_policy(policies: dict[str, Policy], prompts: dict[str, list[list[int]]], *, greedy: bool,
                       temperature: float, stream: str | None = None, sampling: dict[str, list] | None = None
                       ) -> dict[str, list[Generation]]:
    """Completions of each policy's prompts: one call per plain policy, and one mixed-adapter call
    for all adapters of a :class:`LoraGroup` with ``lora.mixed_generation`` on, where the group's backend
    mixes adapters in the rollout (``mixed_generation``: hf; vLLM serves each adapter through the policy's
    own ``generate`` and batches the requests itself). ``sampling``: per policy, each prompt's settings
    (:class:`accord.rollout.sample.Sampling`; None: the rollout config's at ``temperature``). Plain policies
    whose models share their first layers (``trainable_layers`` over one model) run them as one batch
    (:func:`accord.generation.hf.generate_together`): the same tokens and log-probs as their own calls."""
    out: dict[str, list[Generation]] = {}
    groups: dict[int, dict[str, list[list[int]]]] = {}
    together = {}   # plain policies' calls of the hf loop, run together where their models share layers
    sampling = sampling or {}

    def call(pname: str, method: str):   # the policy's generate, or its decode_job
        extra = {"sampling": sampling[pname]} if pname in sampling else {}
        return getattr(policies[pname], method)(prompts[pname], greedy=greedy, temperature=temperature,
                                                 stream=stream, **extra)

    for pname, ps in prompts.items():
        pol = policies[pname]
        group = getattr(pol, "group", None)
        if isinstance(group, LoraGroup) and group.lora.mixed_generation and group.backend.mixed_generation:
            groups.setdefault(id(group), {})[pname] = ps
        elif hasattr(pol, "decode_job") and (job := call(pname, "decode_job")) is not None:
            together[pname] = job
        else:
            out[pname] = call(pname, "generate")
    trunk = shared_trunk([job.model for job in together.values()])
    if trunk:   # policies that hold their first layers frozen and equal decode those layers as one batch
        logger.debug("policies %s decode their first %d layers together", sorted(together), trunk)
        out.update(zip(together, generate_together(list(together.values()), trunk)))
    else:
        out.update((pname, call(pname, "generate")) for pname in together)
    for jobs in groups.values():
        group = policies[next(iter(jobs))].group
        rows = {p: sampling[p] for p in jobs} if all(p in sampling for p in jobs) else None
        out.update(group.generate_mixed(jobs, greedy=greedy, temperature=temperature, stream=stream, sampling=rows))
    return {p: out[p] for p in prompts}
