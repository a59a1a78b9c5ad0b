"""Intervals over episodes: how far a held-out mean could move with other episodes.

Rows of one episode are not independent draws (a model that misjudges one state misjudges the
steps after it), so the bootstrap resamples whole episodes: each resample draws the episodes
with replacement, and a mean is the resampled rows' total over their count. Every interval of
the analysis is made from the same resamples, so two intervals compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Interval:
    """A mean and its bootstrap interval."""

    value: float
    low: float
    high: float

    def to_json(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}

    def scaled(self, factor: float) -> Interval:
        """The same interval in other units (``factor`` > 0)."""
        return Interval(self.value * factor, self.low * factor, self.high * factor)


class EpisodeBootstrap:
    """Resamples of the episodes of ``episode`` (each row's episode, numbered 0..E-1)."""

    def __init__(self, episode: torch.Tensor, resamples: int, confidence: float, seed: int) -> None:
        self.episode = episode.cpu()
        self.episodes = int(self.episode.max()) + 1
        generator = torch.Generator().manual_seed(seed)
        draws = torch.randint(self.episodes, (resamples, self.episodes), generator=generator)
        self.weights = torch.zeros(resamples, self.episodes, dtype=torch.float64)
        self.weights.scatter_add_(1, draws, torch.ones_like(draws, dtype=torch.float64))
        self.confidence = confidence
        self.rows = self._totals(torch.ones(len(self.episode), dtype=torch.float64))

    def _totals(self, values: torch.Tensor) -> torch.Tensor:
        totals = torch.zeros(self.episodes, dtype=torch.float64)
        return totals.index_add_(0, self.episode, values.detach().cpu().double())

    def mean(self, values: torch.Tensor) -> Interval:
        """The mean of per-row ``values`` ``[N]`` with its interval."""
        totals = self._totals(values)
        resampled = (self.weights @ totals) / (self.weights @ self.rows).clamp(min=1.0)
        tail = (1.0 - self.confidence) / 2
        low, high = torch.quantile(resampled, torch.tensor([tail, 1.0 - tail], dtype=torch.float64))
        return Interval(float(totals.sum() / self.rows.sum()), float(low), float(high))


def verdict(interval: Interval, threshold: float) -> str:
    """``yes`` when the whole interval lies above ``threshold``, ``no`` when it lies below,
    ``unclear`` when it straddles it: the data cannot tell at this size."""
    if interval.low > threshold:
        return "yes"
    if interval.high < threshold:
        return "no"
    return "unclear"


def plain(value: Any) -> Any:
    """A JSON-ready copy of ``value``: intervals as objects, floats rounded to 6 digits."""
    if isinstance(value, Interval):
        return {key: round(number, 6) for key, number in value.to_json().items()}
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value
