"""The ``log1p`` feature type: for skewed counts and durations, such as hours since a visit.

``log(1 + max(x, 0)) / log(1 + max_value)``: the log compresses the long tail, and dividing by
the log of the sample's largest value maps the sample's range onto [0, 1]. The type fits
``max_value`` itself (``fit``), from the sample the normalization stage drew, as the built-in
types fit theirs, so ``overrides = { "hours_away" = "log1p" }`` needs no parameter. A largest
value below 1 counts as 1, so that the scale stays finite.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from horizon_engine import FeatureType, NormalizationConfig, NormalizationParameters, feature_module

if TYPE_CHECKING:
    import numpy as np
    import torch


def log1p(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The transform of all ``log1p`` features at once: ``x`` is ``[batch, k]``, ``scale``
    ``[k]``; tensor methods only, so the module exports (ONNX, torch.export) as it is."""
    return (x.clamp(min=0.0) + 1.0).log() * scale


class Log1p(FeatureType):
    """log(1 + max(x, 0)), scaled so that the sample's largest value maps to 1."""

    name = "log1p"
    required = ("max_value",)

    def fit(self, values: np.ndarray, config: NormalizationConfig) -> NormalizationParameters:
        """The sample's largest value, which the scale maps to 1 (and its smallest, which
        Horizon records for every feature)."""
        return NormalizationParameters(
            feature_type=self.name, min_value=float(values.min()), max_value=float(values.max())
        )

    def module(
        self, parameters: list[NormalizationParameters], max_feature_value: float
    ) -> torch.nn.Module:
        """One module for every feature of the type, their scales stacked into one buffer."""
        scales = [1.0 / math.log1p(max(feature.max_value, 1.0)) for feature in parameters]
        return feature_module(log1p, scale=scales)
