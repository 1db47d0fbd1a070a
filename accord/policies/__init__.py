"""Policies: the trainable units agents act with, behind one interface.

========================  ===========================================================================================
module                    holds
========================  ===========================================================================================
``protocol``              :class:`Policy`, the interface every implementation offers, and its two errors
``learner``               what every learner shares: AdamW, the LR schedule, micro-batches, checkpointing switches
``model``                 :class:`ModelPolicy` (a whole model, full fine-tuning) and :func:`build_policy`
``lora``                  :class:`LoraPolicy`, one LoRA adapter of a :class:`LoraGroup` over a frozen base
``agents``                :class:`AgentGenerator`: the ``generate`` a rollout gets, one call per policy (or per LoRA
                          group) for all agents' requests
========================  ===========================================================================================

Data-parallel ranks and Ray proxies implement the same interface in :mod:`accord.distributed`; the hardware
checks a policy makes (device, bf16 units) are in :mod:`accord.devices`.
"""

from accord.policies.protocol import Policy, PromptTooLongError, TrainingError

__all__ = ["Policy", "PromptTooLongError", "TrainingError"]
