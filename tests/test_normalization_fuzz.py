"""Property-based tests of normalization: any sample gives parameters whose transform is finite.

Samples as a source can deliver them (finite values within float32, which the row checks
enforce), shaped to meet the rules' edges: constants, two values, huge ranges, heavy tails,
tiny samples, enum-like integers; and non-finite ones, which must be a clear error naming the
feature. The parameters identified (or forced by an override of each built-in type) must build
a preprocessor whose output is finite on the sample and beyond it: values far outside the
sample's range are what a better policy meets in states the logs never reached. A type
forced where it cannot hold its parameters in float32 must be refused, naming the feature.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from horizon_engine.errors import HorizonError
from horizon_engine.normalization import (
    NormalizationConfig,
    NormalizationParameters,
    apply_override,
    identify,
)
from horizon_engine.plugins import get_plugin_host
from horizon_engine.preprocessor import build_preprocessor

pytestmark = pytest.mark.fuzz
TYPES = get_plugin_host().feature_types()

FLOAT32_MAX = float(np.finfo(np.float32).max)
FEATURE = "feature ∂"

finite = st.floats(-FLOAT32_MAX, FLOAT32_MAX, width=32)
samples = st.one_of(
    st.lists(finite, max_size=60),
    st.lists(st.floats(-10, 10, width=32), min_size=20, max_size=60),
    st.builds(lambda value, size: [value] * size, finite, st.integers(0, 60)),
    st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=60),
    st.lists(st.sampled_from([-FLOAT32_MAX, FLOAT32_MAX, 0.0, 1e-30]), max_size=60),
    st.lists(st.integers(0, 12).map(float), min_size=1, max_size=60),
    st.builds(
        lambda seed, size, scale: (
            (np.random.default_rng(seed).standard_cauchy(size) * scale)
            .clip(-FLOAT32_MAX, FLOAT32_MAX)
            .astype(np.float32)
            .tolist()
        ),
        st.integers(0, 2**32 - 1),
        st.integers(20, 200),
        st.sampled_from([1.0, 1e6, 1e30]),
    ),
    st.builds(
        lambda seed, size: (
            np.random.default_rng(seed)
            .lognormal(0, 8, size)
            .astype(np.float32)
            .clip(0, FLOAT32_MAX)
            .tolist()
        ),
        st.integers(0, 2**32 - 1),
        st.integers(20, 200),
    ),
)
configs = st.builds(
    NormalizationConfig,
    min_samples=st.integers(1, 25),
    max_enum_values=st.integers(1, 12),
    quantiles=st.booleans(),
    quantile_buckets=st.integers(2, 20),
)


def probes(values: np.ndarray) -> np.ndarray:
    """The sample, then values beyond it: far outside its range, zero and the float32 ends."""
    low, high = (float(values.min()), float(values.max())) if len(values) else (0.0, 0.0)
    span = max(high - low, 1.0)
    beyond = [low - 10 * span, high + 10 * span, low - 1e-3, high + 1e-3, 0.0, -1.0, 1.0]
    beyond += [-FLOAT32_MAX, FLOAT32_MAX, low, high]
    return np.concatenate([values, np.clip(beyond, -FLOAT32_MAX, FLOAT32_MAX)])


def assert_finite_transform(parameters, values: np.ndarray) -> None:
    preprocessor = build_preprocessor([FEATURE], {FEATURE: parameters})
    inputs = torch.tensor(probes(values), dtype=torch.float32).reshape(-1, 1)
    with torch.no_grad():
        output = preprocessor(inputs, torch.ones_like(inputs, dtype=torch.bool))
    bad = ~torch.isfinite(output).all(dim=1)
    assert not bad.any(), (
        f"{parameters.as_dict()} maps {inputs[bad].flatten()[:5].tolist()} to "
        f"{output[bad][:5].tolist()}"
    )


@given(values=samples, config=configs, action=st.booleans())
def test_identified_parameters_transform_any_sample_to_finite_values(values, config, action):
    sample = np.asarray(values, dtype=np.float64)
    parameters, _ = identify(sample, config, FEATURE, action=action)
    assert_finite_transform(parameters, sample)


OVERRIDDEN = [
    "continuous",
    "boxcox",
    "quantile",
    "enum",
    "probability",
    "binary",
    "continuous_action",
]


@given(values=samples, config=configs, forced=st.sampled_from(OVERRIDDEN))
def test_every_built_in_type_forced_on_any_sample_is_finite(values, config, forced):
    sample = np.asarray(values, dtype=np.float64)
    if len(sample) == 0:
        return
    identified, _ = identify(sample, NormalizationConfig(min_samples=1), FEATURE)
    parameters = apply_override(identified, forced, sample, config, TYPES, FEATURE)
    try:
        assert_finite_transform(parameters, sample)
    except HorizonError as error:
        # Forced where it does not fit (Box-Cox of a huge, heavy-tailed sample): refused.
        assert f"feature '{FEATURE}'" in str(error) and forced == "boxcox"


@given(
    values=st.lists(finite, max_size=20),
    bad=st.lists(st.sampled_from([math.nan, math.inf, -math.inf]), min_size=1, max_size=5),
)
def test_a_sample_with_nan_or_infinity_is_an_error_naming_the_feature(values, bad):
    sample = np.asarray([*values, *bad], dtype=np.float64)
    with pytest.raises(HorizonError, match=f"feature '{FEATURE}'"):
        identify(sample, NormalizationConfig(), FEATURE)


def test_boxcox_forced_on_a_constant_feature_is_finite():
    """Found by the test above: scipy's Box-Cox refuses a constant sample with a traceback."""
    sample = np.full(30, 4.0)
    identified, _ = identify(sample, NormalizationConfig(), FEATURE)
    parameters = apply_override(identified, "boxcox", sample, NormalizationConfig(), TYPES, FEATURE)
    assert parameters.boxcox_lambda == 1.0
    assert_finite_transform(parameters, sample)


def test_continuous_action_over_the_whole_float32_range_is_finite():
    """Found by the long profile: the width of [-3.4e38, 3.4e38] is infinite in float32, and
    every action became NaN."""
    sample = np.array([-FLOAT32_MAX, FLOAT32_MAX])
    parameters, _ = identify(sample, NormalizationConfig(min_samples=1), FEATURE, action=True)
    assert_finite_transform(parameters, sample)
    preprocessor = build_preprocessor([FEATURE], {FEATURE: parameters})
    middle = torch.tensor([[0.0]])
    assert preprocessor(middle, torch.ones_like(middle, dtype=torch.bool)).item() == 0.0


def test_quantiles_across_the_whole_float32_range_are_finite():
    """Found by the long profile: a segment from -3.4e38 to 3.4e38 is wider than float32 holds;
    its slope was 0, and 0 times the infinite distance from its lower end is NaN."""
    parameters = NormalizationParameters(
        feature_type="quantile", quantiles=[-FLOAT32_MAX, FLOAT32_MAX]
    )
    assert_finite_transform(parameters, np.array([-FLOAT32_MAX, 0.0, FLOAT32_MAX]))


def test_boxcox_beyond_float32_is_refused_naming_the_feature():
    """Found by the long profile: Box-Cox forced on a huge heavy-tailed sample has a mean past
    float32, and the network made every value NaN."""
    sample = np.random.default_rng(2).standard_cauchy(126) * 1e30
    identified, _ = identify(sample, NormalizationConfig(min_samples=1), FEATURE)
    parameters = apply_override(identified, "boxcox", sample, NormalizationConfig(), TYPES, FEATURE)
    with pytest.raises(HorizonError, match=f"feature '{FEATURE}'.*beyond float32"):
        build_preprocessor([FEATURE], {FEATURE: parameters})
