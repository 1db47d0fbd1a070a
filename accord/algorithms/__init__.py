"""Advantage estimators and policy losses, each in a registry a user extends without editing accord:
:func:`register_advantage` (``algorithm.advantage``) and :func:`register_loss` (``algorithm.loss``)."""

from accord.algorithms.advantages import ADVANTAGE_ESTIMATORS, GroupStats, group_advantages, register_advantage
from accord.algorithms.losses import LOSS_SPECS, POLICY_LOSSES, LossSpec, SurrogateInputs, policy_loss, register_loss

__all__ = ["ADVANTAGE_ESTIMATORS", "LOSS_SPECS", "POLICY_LOSSES", "GroupStats", "LossSpec", "SurrogateInputs",
           "group_advantages", "policy_loss", "register_advantage", "register_loss"]
