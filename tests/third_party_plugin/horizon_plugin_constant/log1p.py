"""The ``log1p`` feature type: for skewed counts and durations, such as hours since a visit.

``log(1 + max(x, 0)) / log(1 + largest)``: the log compresses the long tail, and dividing by
the log of the sample's largest value maps the sample's range onto [0, 1]. The type stores
that one parameter, under its own name (``Log1pParameters.largest``), and fits it itself
(``fit``), from the sample the normalization stage drew, as the built-in types fit theirs, so
``overrides = { "hours_away" = "log1p" }`` needs no parameter. A largest value below 1 counts
as 1, so that the scale stays finite.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import Field

from horizon_engine import FeatureParameters, FeatureType, NormalizationConfig, feature_module

if TYPE_CHECKING:
    import numpy as np
    import torch


class Log1pParameters(FeatureParameters):
    """What a ``log1p`` feature stores: ``normalization.json`` records it as
    ``{"feature_type": "log1p", "largest": ...}`` and reads it back through this model."""

    largest: float = Field(allow_inf_nan=False)
    """The sample's largest value, which the transform maps to 1."""


def log1p(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The transform of all ``log1p`` features at once: ``x`` is ``[batch, k]``, ``scale``
    ``[k]``; tensor methods only, so the module exports (ONNX, torch.export) as it is."""
    return (x.clamp(min=0.0) + 1.0).log() * scale


class Log1p(FeatureType):
    """log(1 + max(x, 0)), scaled so that the sample's largest value maps to 1."""

    name = "log1p"
    Parameters = Log1pParameters

    def fit(self, values: np.ndarray, config: NormalizationConfig) -> Log1pParameters:
        """The sample's largest value, which the scale maps to 1."""
        return Log1pParameters(feature_type=self.name, largest=float(values.max()))

    def module(
        self, parameters: list[Log1pParameters], max_feature_value: float
    ) -> torch.nn.Module:
        """One module for every feature of the type, their scales stacked into one buffer."""
        scales = [1.0 / math.log1p(max(feature.largest, 1.0)) for feature in parameters]
        return feature_module(log1p, scale=scales)
