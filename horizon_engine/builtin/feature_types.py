"""The built-in normalization types, registered like a plugin's: one ``FeatureType`` each.

Each fits its own parameters from a feature's sample (``fit``: the statistics are Horizon's)
and builds the module that applies them. They store Horizon's fields
(``NormalizationParameters``, their ``Parameters``), so Horizon's files and ours read alike.

Each type turns all its features at once: parameters are stacked into ``[k]`` (or ``[k, n]``,
padded) buffers and the transform is a few elementwise tensor operations, so the forward pass
costs the same number of operations for 1 feature as for 1,000. The formulas are Horizon's
(see ``horizon_engine.normalization``); where one could divide by zero or take the log of zero,
the guard is documented at the type. The transform functions use tensor methods only, so this
module imports no torch (``horizon plugins`` loads it).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np

from horizon_engine import (
    FeatureType,
    HorizonError,
    NormalizationConfig,
    NormalizationParameters,
    feature_module,
    hookimpl,
)

if TYPE_CHECKING:
    import torch

PROBABILITY_EPSILON = 1e-5
"""Probabilities are clamped to [eps, 1 - eps] before the logit (ReAgent's later value)."""
BOXCOX_MARGIN = 1e-4
"""Horizon shifts a feature to min + margin before Box-Cox, which needs positive values."""
BOXCOX_FLOOR = 1e-6
"""Box-Cox's base ``x + shift`` is floored here: a value below the sample's minimum stays finite
(the normalization's ``identify`` floors the sample it tests the same way)."""
BOXCOX_LOG_LAMBDA = 1e-6
"""Below this |lambda|, Box-Cox is the log (its limit), avoiding a division by ~0."""
ACTION_EPSILON = 1e-6
"""Continuous actions map to [-(1 - eps), 1 - eps], strictly inside (-1, 1)."""


def _stack(parameters: list[NormalizationParameters], field: str) -> np.ndarray:
    return np.array([getattr(feature, field) for feature in parameters], dtype=np.float64)


def _sample_range(type_name: str, values: np.ndarray) -> NormalizationParameters:
    """The parameters of a type that needs none: the sample's minimum and maximum, which
    Horizon recorded for every feature."""
    return NormalizationParameters(
        feature_type=type_name, min_value=float(values.min()), max_value=float(values.max())
    )


class _HorizonType(FeatureType):
    """A built-in type: its parameters are Horizon's fields."""

    Parameters = NormalizationParameters


def _check_stddev(parameters: NormalizationParameters, feature: str, type_name: str) -> None:
    if parameters.stddev is not None and parameters.stddev <= 0:
        raise HorizonError(
            f"feature {feature!r}: normalization type {type_name!r} needs stddev > 0, "
            f"found {parameters.stddev}"
        )


class Binary(_HorizonType):
    """1.0 where the value is non-zero, else 0.0."""

    name = "binary"

    def fit(self, values: np.ndarray, config: NormalizationConfig) -> NormalizationParameters:
        return _sample_range(self.name, values)

    def module(
        self, parameters: list[NormalizationParameters], max_feature_value: float
    ) -> torch.nn.Module:
        return feature_module(_binary)


def _binary(x: torch.Tensor) -> torch.Tensor:
    # A cast, not `x != 0` (the same truth, NaN included): comparisons are several times slower.
    return x.bool().to(x.dtype)


class Probability(_HorizonType):
    """The logit of the value, clamped to [1e-5, 1 - 1e-5] first."""

    name = "probability"

    def fit(self, values: np.ndarray, config: NormalizationConfig) -> NormalizationParameters:
        return _sample_range(self.name, values)

    def module(
        self, parameters: list[NormalizationParameters], max_feature_value: float
    ) -> torch.nn.Module:
        return feature_module(_probability, low=PROBABILITY_EPSILON, high=1.0 - PROBABILITY_EPSILON)


def _probability(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    p = x.clamp(low, high)
    return (p / (1.0 - p)).log()


class Continuous(_HorizonType):
    """(x - mean) / stddev, clamped to [-max_feature_value, max_feature_value]."""

    name = "continuous"
    required = ("mean", "stddev")

    def fit(self, values: np.ndarray, config: NormalizationConfig) -> NormalizationParameters:
        return NormalizationParameters(
            feature_type=self.name,
            mean=float(np.mean(values)),
            stddev=max(float(np.std(values)), config.stddev_floor),
            min_value=float(values.min()),
            max_value=float(values.max()),
        )

    def check(self, parameters: NormalizationParameters, feature: str) -> None:
        super().check(parameters, feature)
        _check_stddev(parameters, feature, self.name)

    def module(
        self, parameters: list[NormalizationParameters], max_feature_value: float
    ) -> torch.nn.Module:
        return feature_module(
            _continuous,
            mean=_stack(parameters, "mean"),
            stddev=_stack(parameters, "stddev"),
            limit=float(max_feature_value),
        )


def _continuous(
    x: torch.Tensor, mean: torch.Tensor, stddev: torch.Tensor, limit: float
) -> torch.Tensor:
    # In place after the first operation, here and below: one allocation, not three.
    return (x - mean).div_(stddev).clamp_(-limit, limit)


class BoxCox(_HorizonType):
    """Box-Cox, then continuous: (y - mean) / stddev, clamped, of y = Box-Cox(x + shift).

    y = (max(x + shift, 1e-6)^lambda - 1) / lambda; where |lambda| < 1e-6, y is the log (Box-Cox's
    limit at 0), which avoids dividing by ~0. The floor keeps a value below the sample's minimum
    finite.
    """

    name = "boxcox"
    required = ("boxcox_lambda", "boxcox_shift", "mean", "stddev")

    def fit(self, values: np.ndarray, config: NormalizationConfig) -> NormalizationParameters:
        """Shifted to positive values first; a sample of one value (an override's: identify
        never asks) has no best lambda and gets lambda 1, Box-Cox's identity up to a shift,
        rather than scipy's error."""
        from scipy import special, stats

        low, high = float(values.min()), float(values.max())
        shift = BOXCOX_MARGIN - low if low <= 0 else 0.0
        positive = np.maximum(values + shift, BOXCOX_FLOOR)
        lambda_ = 1.0 if positive.min() == positive.max() else float(stats.boxcox(positive)[1])
        transformed = special.boxcox(positive, lambda_)
        return NormalizationParameters(
            feature_type=self.name,
            boxcox_lambda=lambda_,
            boxcox_shift=shift,
            mean=float(np.mean(transformed)),
            stddev=max(float(np.std(transformed)), config.stddev_floor),
            min_value=low,
            max_value=high,
        )

    def check(self, parameters: NormalizationParameters, feature: str) -> None:
        super().check(parameters, feature)
        _check_stddev(parameters, feature, self.name)
        # A Box-Cox of a sample far from normal can reach past float32 (identify then picks
        # another type; an override or a brought file may not), and the network computes in
        # float32: every value would be NaN.
        largest = float(np.finfo(np.float32).max)
        for field in self.required:
            value = getattr(parameters, field)
            if not abs(value) <= largest:
                raise HorizonError(
                    f"feature {feature!r}: normalization type 'boxcox' has {field} = {value}, "
                    "beyond float32, which the network computes in; use 'continuous' or "
                    "'quantile' for this feature"
                )

    def module(
        self, parameters: list[NormalizationParameters], max_feature_value: float
    ) -> torch.nn.Module:
        lambda_ = _stack(parameters, "boxcox_lambda")
        is_log = np.abs(lambda_) < BOXCOX_LOG_LAMBDA
        values = {
            "shift": _stack(parameters, "boxcox_shift"),
            "mean": _stack(parameters, "mean"),
            "stddev": _stack(parameters, "stddev"),
            "floor": BOXCOX_FLOOR,
            "limit": float(max_feature_value),
        }
        if not is_log.any():
            # The usual case: the log, and the choice of branch per feature, are left out.
            return feature_module(_boxcox_power, lambda_=lambda_, **values)
        # Where the log is used the power branch is computed and discarded; lambda = 1 keeps it
        # finite.
        return feature_module(
            _boxcox, lambda_=np.where(is_log, 1.0, lambda_), is_log=is_log, **values
        )


def _boxcox(
    x: torch.Tensor,
    shift: torch.Tensor,
    lambda_: torch.Tensor,
    is_log: torch.Tensor,
    mean: torch.Tensor,
    stddev: torch.Tensor,
    floor: float,
    limit: float,
) -> torch.Tensor:
    base = (x + shift).clamp_(min=floor)
    power = base.pow(lambda_).sub_(1.0).div_(lambda_)
    transformed = base.log_().where(is_log, power)
    return transformed.sub_(mean).div_(stddev).clamp_(-limit, limit)


def _boxcox_power(
    x: torch.Tensor,
    shift: torch.Tensor,
    lambda_: torch.Tensor,
    mean: torch.Tensor,
    stddev: torch.Tensor,
    floor: float,
    limit: float,
) -> torch.Tensor:
    """``_boxcox`` where no feature takes the log: the same operations, less that branch."""
    base = (x + shift).clamp_(min=floor)
    transformed = base.pow(lambda_).sub_(1.0).div_(lambda_)
    return transformed.sub_(mean).div_(stddev).clamp_(-limit, limit)


class Quantile(_HorizonType):
    """The value's piecewise-linear rank among the quantile boundaries, in [0, 1].

    With boundaries q_0 < ... < q_m, the rank is numpy.interp(x, q, linspace(0, 1, m + 1)):
    computed as the sum over the m segments of clamp((x - q_j) / (q_{j+1} - q_j), 0, 1), divided
    by m, which needs no search and no gather (both slower here, and a search does not export to
    ONNX). Features with fewer boundaries are padded with segments of zero slope, which add 0.
    A single boundary ranks everything 0, as numpy.interp does.
    """

    name = "quantile"
    required = ("quantiles",)

    def fit(self, values: np.ndarray, config: NormalizationConfig) -> NormalizationParameters:
        buckets = config.quantile_buckets
        boundaries = np.quantile(values, np.arange(buckets + 1) / buckets)
        return NormalizationParameters(
            feature_type=self.name,
            quantiles=np.unique(boundaries).tolist(),
            min_value=float(values.min()),
            max_value=float(values.max()),
        )

    def check(self, parameters: NormalizationParameters, feature: str) -> None:
        super().check(parameters, feature)
        quantiles = parameters.quantiles or []
        if not quantiles or any(b < a for a, b in pairwise(quantiles)):
            raise HorizonError(
                f"feature {feature!r}: normalization type 'quantile' needs at least one "
                f"boundary, in increasing order; found {quantiles}"
            )

    def module(
        self, parameters: list[NormalizationParameters], max_feature_value: float
    ) -> torch.nn.Module:
        counts = [len(feature.quantiles or []) - 1 for feature in parameters]
        lower = np.zeros((len(parameters), max(max(counts), 1)), dtype=np.float32)
        slope = np.zeros_like(lower)
        for row, (feature, count) in enumerate(zip(parameters, counts, strict=True)):
            # The boundaries as the float32 model sees them. Two that round to one float32 make
            # a zero-width segment; its slope is capped, so it becomes a step rather than 0/0.
            # Widths are taken in float64: a segment across most of float32's range is wider
            # than float32 holds, and a slope of 0 would meet an infinite x - lower (NaN).
            boundaries = np.asarray(feature.quantiles, dtype=np.float32)
            lower[row, :count] = boundaries[:-1]
            widths = np.diff(boundaries.astype(np.float64))
            slope[row, :count] = 1.0 / np.maximum(widths, 1e-30)
        return feature_module(
            _quantile,
            lower=lower,
            slope=slope,
            segments=np.maximum(counts, 1).astype(np.float32),
        )


def _quantile(
    x: torch.Tensor, lower: torch.Tensor, slope: torch.Tensor, segments: torch.Tensor
) -> torch.Tensor:
    # In place after the first operation: the [batch, k, m] intermediate is the costly part.
    covered = (x.unsqueeze(2) - lower).mul_(slope).clamp_(0.0, 1.0)
    return covered.sum(dim=2) / segments


class Enum(_HorizonType):
    """One-hot over the possible values, one column each; a value never seen is all zeros."""

    name = "enum"
    required = ("possible_values",)

    def fit(self, values: np.ndarray, config: NormalizationConfig) -> NormalizationParameters:
        return NormalizationParameters(
            feature_type=self.name,
            possible_values=np.unique(values).tolist(),
            min_value=float(values.min()),
            max_value=float(values.max()),
        )

    def check(self, parameters: NormalizationParameters, feature: str) -> None:
        super().check(parameters, feature)
        values = parameters.possible_values or []
        if not values or len(set(values)) != len(values):
            raise HorizonError(
                f"feature {feature!r}: normalization type 'enum' needs distinct possible "
                f"values; found {values}"
            )

    def width(self, parameters: NormalizationParameters) -> int:
        return len(parameters.possible_values or [])

    def column_names(self, feature: str, parameters: NormalizationParameters) -> list[str]:
        return [f"{feature}={value!r}" for value in parameters.possible_values or []]

    def module(
        self, parameters: list[NormalizationParameters], max_feature_value: float
    ) -> torch.nn.Module:
        # Output column j compares input column source[j] with values[j].
        source = np.repeat(np.arange(len(parameters)), [self.width(p) for p in parameters])
        values = [value for feature in parameters for value in feature.possible_values or []]
        return feature_module(_enum, source=source.astype(np.int64), values=values)


def _enum(x: torch.Tensor, source: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    # 1 - min(ceil(|x - value|), 1): |x - value| is 0 exactly where they are equal and its
    # ceiling at least 1 elsewhere (a NaN stays NaN, and a missing value's columns are zeroed
    # afterwards). Floating-point operations only: `==` makes a boolean tensor, and making
    # one, then floats of it, is over twice as slow.
    distance = (x.index_select(1, source) - values).abs_().ceil_().clamp_(max=1.0)
    return distance.neg_().add_(1.0)


class ContinuousAction(_HorizonType):
    """[min_value, max_value] mapped linearly to [-(1 - 1e-6), 1 - 1e-6], clamped there.

    Clamped so that an action outside the logged range still lies strictly inside (-1, 1),
    where an actor's tanh can reach it. A constant action (min == max) maps to 0. The module
    has an inverse (``Preprocessor.inverse``): an actor's action in [-1, 1] back to [min, max],
    the user's units (a constant action's inverse spans [value - 1, value + 1]).

    The range is held as its middle and half its width, both within float32 whenever min and
    max are: the width itself may not be ([-3e38, 3e38] is 6e38, infinite in float32, which
    made every action NaN).
    """

    name = "continuous_action"
    required = ("min_value", "max_value")

    def fit(self, values: np.ndarray, config: NormalizationConfig) -> NormalizationParameters:
        return _sample_range(self.name, values)

    def check(self, parameters: NormalizationParameters, feature: str) -> None:
        super().check(parameters, feature)
        if parameters.max_value < parameters.min_value:
            raise HorizonError(
                f"feature {feature!r}: normalization type 'continuous_action' needs "
                f"min_value <= max_value; found {parameters.min_value} > {parameters.max_value}"
            )

    def module(
        self, parameters: list[NormalizationParameters], max_feature_value: float
    ) -> torch.nn.Module:
        low = _stack(parameters, "min_value")
        high = _stack(parameters, "max_value")
        half_width = high / 2.0 - low / 2.0
        # A constant action is mapped as if its range were [value - 1, value + 1].
        return feature_module(
            _continuous_action,
            inverse=_continuous_action_inverse,
            middle=low + half_width,
            half_width=np.where(half_width == 0, 1.0, half_width),
            scale=1.0 - ACTION_EPSILON,
        )


def _continuous_action(
    x: torch.Tensor, middle: torch.Tensor, half_width: torch.Tensor, scale: float
) -> torch.Tensor:
    return ((x - middle) / half_width * scale).clamp(-scale, scale)


def _continuous_action_inverse(
    y: torch.Tensor, middle: torch.Tensor, half_width: torch.Tensor, scale: float
) -> torch.Tensor:
    """The action in the user's units whose normalized value is ``y``: ``y`` clamped to
    [-scale, scale] first, so that any value an actor emits in [-1, 1] lands in [min, max]."""
    return middle + y.clamp(-scale, scale) / scale * half_width


class DoNotPreprocess(_HorizonType):
    """The value, unchanged."""

    name = "do_not_preprocess"

    def fit(self, values: np.ndarray, config: NormalizationConfig) -> NormalizationParameters:
        return _sample_range(self.name, values)

    def module(
        self, parameters: list[NormalizationParameters], max_feature_value: float
    ) -> torch.nn.Module:
        return feature_module(_identity)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


@hookimpl
def horizon_register_feature_types(register: Callable[[type], None]) -> None:
    """Registered in Horizon's order, which is the order of their columns in the network's
    input (``horizon_engine.preprocessor``)."""
    for feature_type in (
        Binary,
        Probability,
        Continuous,
        BoxCox,
        Quantile,
        Enum,
        ContinuousAction,
        DoNotPreprocess,
    ):
        register(feature_type)
