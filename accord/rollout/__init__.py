"""Rollouts: one interface (:mod:`accord.rollout.base`), four registered implementations. Importing this
package registers the built-in ones."""

from accord.rollout import episodes, magrpo, multiturn  # noqa: F401  (registers magrpo_joint, magrpo_tree, atgrpo,
#                                                                    episodes)
from accord.rollout.base import ROLLOUTS, Rollout, RolloutResult, make_rollout, register_rollout, rollout_name

__all__ = ["ROLLOUTS", "Rollout", "RolloutResult", "make_rollout", "register_rollout", "rollout_name"]
