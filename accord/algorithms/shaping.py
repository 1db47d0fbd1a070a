"""Reward shaping applied to samples before advantages: DAPO's soft overlong penalty.

DAPO (Yu et al., arXiv 2503.14476, section 3.4) penalises a completion by its length ``L`` within a
window of ``w`` tokens before its length cap ``L_max``::

    R_length(L) = 0                           if L <= L_max - w
                = -p * (L - (L_max - w)) / w  if L_max - w < L <= L_max

(the paper's ``p`` is 1 and its third case, ``L > L_max``, cannot occur here: generation stops at the cap).
The penalty is added to the sample's return (``algorithm.overlong``): the completion's own length, not
propagated to earlier turns.
"""

from __future__ import annotations


def overlong_penalty(length: int, cap: int, window: int, penalty: float = 1.0) -> float:
    """The (non-positive) soft overlong penalty of a completion of ``length`` tokens under length cap ``cap``
    (``window`` 0: none)."""
    if window <= 0:
        return 0.0
    if window >= cap:
        raise ValueError(f"overlong window {window} must be shorter than the length cap {cap}")
    start = cap - window
    if length <= start:
        return 0.0
    return -penalty * (min(length, cap) - start) / window
