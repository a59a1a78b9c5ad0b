"""The ``log1p`` feature type: for skewed counts and durations, such as hours since a visit.

``log(1 + max(x, 0)) / log(1 + max_value)``: the log compresses the long tail, and dividing by
the log of the sample's largest value maps the sample's range onto [0, 1]. ``max_value`` is
what the normalization stage fits for any plugin type (the sample's minimum and maximum), so
``overrides = { "hours_away" = "log1p" }`` needs no parameter of its own. A largest value
below 1 counts as 1, so that the scale stays finite.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from horizon_engine import FeatureTransform, NormalizationParameters, feature_module

if TYPE_CHECKING:
    import torch


def log1p(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The transform of all ``log1p`` features at once: ``x`` is ``[batch, k]``, ``scale``
    ``[k]``; tensor methods only, so the module exports (ONNX, torch.export) as it is."""
    return (x.clamp(min=0.0) + 1.0).log() * scale


class Log1p(FeatureTransform):
    """log(1 + max(x, 0)), scaled so that the sample's largest value maps to 1."""

    name = "log1p"
    required = ("max_value",)

    def module(
        self, parameters: list[NormalizationParameters], max_feature_value: float
    ) -> torch.nn.Module:
        """One module for every feature of the type, their scales stacked into one buffer."""
        scales = [1.0 / math.log1p(max(feature.max_value, 1.0)) for feature in parameters]
        return feature_module(log1p, scale=scales)
