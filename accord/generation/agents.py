"""Generation for agents: the ``generate`` function that rollouts receive.

:class:`AgentGenerator` maps each (agent, chat) request to the policy acting for that agent and makes
one generate call per policy for all of them (one call for all adapters of a LoRA base with
``lora.mixed_generation``); it counts the tokens it generated, for ``perf/gen_tokens``.
"""

from __future__ import annotations

from accord.policies_lora import generate_by_policy
from accord.rollout.sample import Completion


class AgentGenerator:
    """``generate(requests, n, greedy, temperature=..., stream=None)`` over a run's policies."""

    def __init__(self, policies: dict, agent_policy: dict[str, str]):
        self.policies, self.agent_policy = policies, agent_policy
        self.tokens = 0   # generated tokens since the last reset (the trainer resets it every step)

    def __call__(self, requests: list[tuple[str, list[dict]]], n: int, greedy: bool, *, temperature: float,
                 stream: str | None = None) -> list[list[Completion]]:
        """``n`` completions of each (agent, chat) request."""
        encoded = [self.policies[self.agent_policy[a]].encode_chat(msgs) for a, msgs in requests]
        out: list[list[Completion | None]] = [[None] * n for _ in requests]
        by_policy = {}
        for pname in self.policies:
            slots = [(r, s) for r, (a, _) in enumerate(requests) if self.agent_policy[a] == pname for s in range(n)]
            if slots:
                by_policy[pname] = slots
        all_gens = generate_by_policy(self.policies, {p: [encoded[r] for r, _ in sl] for p, sl in by_policy.items()},
                                      greedy=greedy, temperature=temperature, stream=stream)
        for pname, slots in by_policy.items():
            pol, gens = self.policies[pname], all_gens[pname]
            for (r, s), g in zip(slots, gens):
                out[r][s] = Completion(encoded[r], g.ids, g.logprobs, g.finish_reason, pol.decode(g.ids))
                self.tokens += len(g.ids)
        return out
