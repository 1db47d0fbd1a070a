"""Per-step metric accumulation: :class:`MetricAccumulator` (weighted means per key within one step)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from accord.tracking.registry import _to_number

__all__ = ["MetricAccumulator"]


class MetricAccumulator:
    """Accumulates weighted values per key within one step.

    ``mean()`` returns the weighted mean of every key ever added (keys are
    never dropped; a key whose total weight is 0 maps to NaN). NaN values are
    kept — they propagate into the mean so the trainer can detect divergence.
    """

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._weights: dict[str, float] = {}

    def add(self, key: str, value: Any, weight: float = 1.0) -> None:
        if not isinstance(key, str):
            raise TypeError(f"metric names must be str, got {key!r} ({type(key).__name__})")
        value = float(_to_number(key, value))
        weight = float(_to_number(f"{key} (weight)", weight))
        if math.isnan(weight) or weight < 0 or math.isinf(weight):
            raise ValueError(f"weight for metric {key!r} must be a finite number >= 0, got {weight}")
        self._sums.setdefault(key, 0.0)
        self._weights.setdefault(key, 0.0)
        if weight == 0.0:
            return  # registers the key without contributing (avoids 0 * inf = nan)
        self._sums[key] += value * weight
        self._weights[key] += weight

    def add_many(self, metrics: Mapping[str, Any], weight: float = 1.0) -> None:
        for key, value in metrics.items():
            self.add(key, value, weight)

    def mean(self) -> dict[str, float]:
        return {
            key: (self._sums[key] / w if w > 0 else math.nan)
            for key, w in self._weights.items()
        }

    def reset(self) -> None:
        self._sums.clear()
        self._weights.clear()

    def __len__(self) -> int:
        return len(self._sums)

    def __contains__(self, key: object) -> bool:
        return key in self._sums
