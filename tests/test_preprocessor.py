"""The preprocessor: Horizon's formulas applied in one vectorized operation per type, in Horizon's
column order, with missing features zeroed, on Horizon's own files, through ONNX, and with a type
that a plugin registers.

Expected numbers are computed independently here, in float64 numpy, from the formulas Horizon
wrote (see ``horizon_engine.normalization``), never by calling the preprocessor's own code.
"""

from __future__ import annotations

import copy
import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from horizon_engine.errors import HorizonError, PluginError
from horizon_engine.normalization import (
    NormalizationConfig,
    NormalizationParameters,
    identify,
    read_horizon_file,
)
from horizon_engine.plugins import PluginHost
from horizon_engine.preprocessor import Preprocessor, build_preprocessor, sort_feature_ids

SAMPLES = 10_000
MAX_FEATURE_VALUE = 6.0


@pytest.fixture(scope="module")
def host() -> PluginHost:
    """The built-in plugins only: no entry point of the environment can change a type."""
    return PluginHost(env={"HORIZON_LOAD_PLUGINS": ""})


def horizon_features() -> dict[str, np.ndarray]:
    """Horizon's synthetic test features (10,000 samples each, seed fixed), under numeric ids
    listed out of order, so that the output order has something to sort."""
    rng = np.random.default_rng(0)
    return {
        "12": rng.binomial(1, 0.5, SAMPLES).astype(float),
        "3": rng.normal(size=SAMPLES),
        "40": rng.exponential(size=SAMPLES),
        "7": rng.integers(0, 10, SAMPLES).astype(float),
        "5": np.concatenate([rng.normal(size=SAMPLES // 2), rng.exponential(size=SAMPLES // 2)]),
        "100": np.clip(rng.beta(2, 2, SAMPLES), 0.01, 0.99),
    }


EXPECTED_TYPES = {
    "12": "binary",
    "3": "continuous",
    "40": "boxcox",
    "7": "enum",
    "5": "quantile",
    "100": "probability",
}


@pytest.fixture(scope="module")
def fitted(host):
    """The features, their identified parameters, and the preprocessor's output on them."""
    data = horizon_features()
    config = NormalizationConfig(quantiles=True)
    parameters = {feature: identify(values, config, feature)[0] for feature, values in data.items()}
    preprocessor = build_preprocessor(list(data), parameters, MAX_FEATURE_VALUE, host)
    x = np.stack(list(data.values()), axis=1).astype(np.float32)
    out = run(preprocessor, x)
    return data, parameters, preprocessor, out


def run(preprocessor, x: np.ndarray, presence: np.ndarray | None = None) -> np.ndarray:
    presence = np.ones_like(x) if presence is None else presence
    with torch.no_grad():
        out = preprocessor(torch.from_numpy(x), torch.from_numpy(presence.astype(np.float32)))
    return out.numpy().astype(np.float64)


def column(preprocessor, out: np.ndarray, name: str) -> np.ndarray:
    return out[:, preprocessor.output_names.index(name)]


def logit(x: np.ndarray) -> np.ndarray:
    p = np.clip(x, 1e-5, 1 - 1e-5)
    return np.log(p / (1 - p))


def boxcox(x: np.ndarray, shift: float, lambda_: float) -> np.ndarray:
    base = np.maximum(x + shift, 1e-6)
    return np.log(base) if abs(lambda_) < 1e-6 else (base**lambda_ - 1) / lambda_


# Horizon's synthetic features.


def test_synthetic_features_get_horizons_types(fitted):
    _, parameters, _, _ = fitted

    assert {feature: p.feature_type for feature, p in parameters.items()} == EXPECTED_TYPES


def test_output_columns_are_sorted_by_type_then_numeric_feature_id(fitted):
    _, _, preprocessor, out = fitted

    assert preprocessor.feature_ids == ["12", "3", "40", "7", "5", "100"]
    assert preprocessor.output_names == [
        "12",  # binary
        "100",  # probability
        "3",  # continuous
        "40",  # boxcox
        "5",  # quantile
        *(f"7={value:.1f}" for value in range(10)),  # enum, one column per value
    ]
    assert out.shape == (SAMPLES, 15)


@pytest.mark.parametrize("feature", ["3", "40"])
def test_continuous_and_boxcox_outputs_are_standardized(fitted, feature):
    _, _, preprocessor, out = fitted

    values = column(preprocessor, out, feature)

    # Fitted on this very sample, so mean 0 and std 1 hold up to float32 rounding; no value
    # reaches the clamp (N(0, 1) and Box-Cox'd Exp(1) stay within about 4 standard deviations),
    # which would otherwise pull the std below 1.
    assert np.abs(values).max() < MAX_FEATURE_VALUE
    assert values.mean() == pytest.approx(0.0, abs=0.01)
    assert values.std() == pytest.approx(1.0, abs=0.01)


def test_boxcox_output_is_horizons_formula(fitted):
    data, parameters, preprocessor, out = fitted
    p = parameters["40"]

    x = data["40"].astype(np.float32)
    expected = (boxcox(x, p.boxcox_shift, p.boxcox_lambda) - p.mean) / p.stddev

    np.testing.assert_allclose(column(preprocessor, out, "40"), expected, atol=1e-5)


def test_quantile_output_is_numpys_interpolation(fitted):
    data, parameters, preprocessor, out = fitted
    boundaries = np.asarray(parameters["5"].quantiles)
    assert len(boundaries) == 21

    x = data["5"].astype(np.float32)
    expected = np.interp(x, boundaries, np.linspace(0, 1, len(boundaries)))

    np.testing.assert_allclose(column(preprocessor, out, "5"), expected, atol=1e-6)
    assert column(preprocessor, out, "5").min() == 0.0
    assert column(preprocessor, out, "5").max() == 1.0


def test_enum_output_is_exactly_one_hot(fitted):
    data, parameters, preprocessor, out = fitted
    assert parameters["7"].possible_values == [float(value) for value in range(10)]

    one_hot = out[:, preprocessor.output_names.index("7=0.0") :]

    np.testing.assert_array_equal(one_hot, np.eye(10)[data["7"].astype(int)])


def test_binary_and_probability_outputs(fitted):
    data, _, preprocessor, out = fitted

    np.testing.assert_array_equal(column(preprocessor, out, "12"), data["12"])
    expected = logit(data["100"].astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(column(preprocessor, out, "100"), expected, rtol=1e-5, atol=1e-5)


def test_continuous_action_lies_strictly_inside_minus_one_one(host):
    rng = np.random.default_rng(1)
    sample = rng.uniform(-3.0, 5.0, SAMPLES)
    parameters, _ = identify(sample, NormalizationConfig(), "9", action=True)
    assert parameters.feature_type == "continuous_action"
    preprocessor = build_preprocessor(["9"], {"9": parameters}, plugins=host)

    low, high = parameters.min_value, parameters.max_value
    x = np.concatenate([sample, [low, high, low - 10.0, high + 10.0]])
    out = run(preprocessor, x.astype(np.float32)[:, None])[:, 0]

    assert (np.abs(out) < 1.0).all()
    scaled = ((x - low) / (high - low) * 2 - 1) * (1 - 1e-6)
    np.testing.assert_allclose(out[:-2], scaled[:-2], atol=1e-6)
    assert out[-2] == out[-4] and out[-1] == out[-3]  # beyond the logged range: clamped


def test_a_constant_continuous_action_maps_to_zero(host):
    parameters = NormalizationParameters(
        feature_type="continuous_action", min_value=2.0, max_value=2.0
    )
    preprocessor = build_preprocessor(["0"], {"0": parameters}, plugins=host)

    out = run(preprocessor, np.array([[2.0], [2.5]], dtype=np.float32))

    assert out[0, 0] == 0.0
    assert 0.0 < out[1, 0] < 1.0


def test_boxcox_with_lambda_zero_is_the_log(host):
    parameters = NormalizationParameters(
        feature_type="boxcox", boxcox_lambda=0.0, boxcox_shift=1.0, mean=0.5, stddev=2.0
    )
    preprocessor = build_preprocessor(["0"], {"0": parameters}, plugins=host)
    x = np.array([[-1.0], [0.0], [1.0], [100.0]], dtype=np.float32)

    out = run(preprocessor, x)[:, 0]

    expected = np.clip((np.log(np.maximum(x[:, 0] + 1.0, 1e-6)) - 0.5) / 2.0, -6, 6)
    np.testing.assert_allclose(out, expected, atol=1e-6)


def test_quantiles_of_different_lengths_share_one_operation(host):
    parameters = {
        "1": NormalizationParameters(feature_type="quantile", quantiles=[0.0, 1.0, 4.0]),
        "2": NormalizationParameters(feature_type="quantile", quantiles=[-2.0, -1.0, 0.0, 5.0]),
        "3": NormalizationParameters(feature_type="quantile", quantiles=[7.0]),
        # 1 and 1 + 1e-9 are one float32: a zero-width segment, which becomes a step.
        "4": NormalizationParameters(feature_type="quantile", quantiles=[0.0, 1.0, 1 + 1e-9, 2.0]),
    }
    preprocessor = build_preprocessor(["1", "2", "3", "4"], parameters, plugins=host)
    x = np.concatenate([np.linspace(-3.0, 8.0, 45), [1.0, 1.0 + 1e-6]]).astype(np.float32)

    out = run(preprocessor, np.repeat(x[:, None], 4, axis=1))

    assert len(preprocessor.types) == 1
    for index, feature in enumerate(["1", "2", "3", "4"]):
        boundaries = parameters[feature].quantiles
        expected = np.interp(x, boundaries, np.linspace(0, 1, len(boundaries)))
        np.testing.assert_allclose(out[:, index], expected, atol=1e-6)


# Column order.


def test_enum_columns_follow_the_possible_values_and_unseen_values_are_zero(host):
    parameters = {
        "17": NormalizationParameters(feature_type="enum", possible_values=[2.0, 0.0, 5.0]),
        "3": NormalizationParameters(feature_type="continuous", mean=0.0, stddev=1.0),
    }
    preprocessor = build_preprocessor(["17", "3"], parameters, plugins=host)

    out = run(preprocessor, np.array([[5.0, 1.0], [0.0, 1.0], [3.0, 1.0]], dtype=np.float32))

    assert preprocessor.output_names == ["3", "17=2.0", "17=0.0", "17=5.0"]
    np.testing.assert_array_equal(out[:, 1:], [[0, 0, 1], [0, 1, 0], [0, 0, 0]])


def test_feature_ids_sort_numerically_only_when_all_are_integers():
    assert sort_feature_ids(["10", "9", "100", "-1"]) == ["-1", "9", "10", "100"]
    assert sort_feature_ids(["10", "9", "b", "a"]) == ["10", "9", "a", "b"]


# Missing values.


def all_types() -> dict[str, NormalizationParameters]:
    """One feature or more of every built-in type, as a normalization.json would hold them."""
    make = NormalizationParameters
    return {
        "1": make(feature_type="binary"),
        "2": make(feature_type="probability"),
        "3": make(feature_type="continuous", mean=1.0, stddev=2.0),
        "4": make(
            feature_type="boxcox", boxcox_lambda=-0.5, boxcox_shift=0.5, mean=0.1, stddev=1.5
        ),
        "5": make(feature_type="quantile", quantiles=[-1.0, -0.2, 0.0, 0.3, 2.0]),
        "6": make(feature_type="enum", possible_values=[0.0, 1.0, 2.0]),
        "7": make(feature_type="continuous_action", min_value=-2.0, max_value=2.0),
        "8": make(feature_type="do_not_preprocess"),
        "9": make(feature_type="continuous", mean=-1.0, stddev=0.5),
        "10": make(feature_type="enum", possible_values=[3.0, 7.0]),
    }


def random_inputs(
    rows: int, seed: int, missing: float = 0.3, features: int = 10
) -> tuple[np.ndarray, np.ndarray]:
    """Raw values for ``all_types()`` (repeated), integers for the enums, some of them missing;
    a missing value holds NaN, infinity or Horizon's sentinel, none of which may leak."""
    rng = np.random.default_rng(seed)
    x = rng.normal(scale=2.0, size=(rows, features))
    x[:, 0::10] = rng.integers(0, 8, size=x[:, 0::10].shape)
    x[:, 5::10] = rng.integers(0, 8, size=x[:, 5::10].shape)
    x[:, 9::10] = rng.integers(0, 8, size=x[:, 9::10].shape)
    x[:, 1::10] = rng.uniform(-0.2, 1.2, size=x[:, 1::10].shape)
    presence = rng.random((rows, features)) > missing
    placeholders = rng.choice([np.nan, np.inf, -np.inf, -1337.1337], size=(rows, features))
    x = np.where(presence, x, placeholders)
    return x.astype(np.float32), presence.astype(np.float32)


def test_missing_features_give_zero_columns_and_nothing_else_changes(host):
    parameters = all_types()
    preprocessor = build_preprocessor(list(parameters), parameters, plugins=host)
    x, presence = random_inputs(500, seed=2)

    out = run(preprocessor, x, presence)

    assert np.isfinite(out).all()
    full = run(preprocessor, np.where(presence > 0, x, 0.0).astype(np.float32))
    for name_index, name in enumerate(preprocessor.output_names):
        feature = preprocessor.feature_ids.index(name.split("=")[0])
        missing = presence[:, feature] == 0
        assert missing.any() and (~missing).any()
        assert (out[missing, name_index] == 0).all(), name
        np.testing.assert_array_equal(out[~missing, name_index], full[~missing, name_index])


# Batched per type: the same numbers as each feature alone.

THIRD_PARTY_PLUGIN = Path(__file__).parent / "third_party_plugin"


def random_parameters(rng: np.random.Generator, host: PluginHost) -> dict[str, object]:
    """Five features of every type with random parameters, the third-party ``log1p`` included:
    Box-Cox with lambdas that take the log and ones that do not, quantiles of 1 to 12
    boundaries (padded to one width when batched), enums of 1 to 6 values, constant actions."""
    make = NormalizationParameters
    log1p = host.component("feature_types", "log1p").cls.Parameters
    kinds = {
        "binary": lambda: make(feature_type="binary"),
        "probability": lambda: make(feature_type="probability"),
        "continuous": lambda: make(
            feature_type="continuous", mean=rng.normal(), stddev=rng.uniform(0.1, 3.0)
        ),
        "boxcox": lambda: make(
            feature_type="boxcox",
            boxcox_lambda=rng.choice([0.0, 1e-7, rng.uniform(-2.0, 2.0)]),
            boxcox_shift=rng.uniform(0.0, 3.0),
            mean=rng.normal(),
            stddev=rng.uniform(0.1, 3.0),
        ),
        "quantile": lambda: make(
            feature_type="quantile",
            quantiles=np.sort(rng.normal(scale=2.0, size=rng.integers(1, 13))).tolist(),
        ),
        "enum": lambda: make(
            feature_type="enum",
            possible_values=rng.choice(8, size=rng.integers(1, 7), replace=False).tolist(),
        ),
        "continuous_action": lambda: make(
            feature_type="continuous_action",
            min_value=(low := rng.normal()),
            max_value=low + rng.choice([0.0, rng.uniform(0.1, 5.0)]),
        ),
        "do_not_preprocess": lambda: make(feature_type="do_not_preprocess"),
        "log1p": lambda: log1p(feature_type="log1p", largest=rng.uniform(0.5, 100.0)),
    }
    ids = rng.permutation(5 * len(kinds))
    return {str(ids[index]): kinds[kind]() for index, kind in enumerate(np.repeat(list(kinds), 5))}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_feature_gets_the_numbers_it_gets_alone(plugin_site, seed):
    """Every type's features batched into one module give, bit for bit, what each feature's
    preprocessor of its own gives: random parameters, a random clamp limit that some outputs
    reach, values missing as NaN, infinities or Horizon's sentinel (their columns +0.0)."""
    plugin_site.install_project(THIRD_PARTY_PLUGIN)
    host = PluginHost(env={"HORIZON_LOAD_PLUGINS": "constant"})
    rng = np.random.default_rng(seed)
    parameters = random_parameters(rng, host)
    limit = rng.uniform(1.0, 3.0)
    rows = 64
    x = rng.normal(scale=4.0, size=(rows, len(parameters)))
    x[:, ::3] = rng.integers(0, 8, size=x[:, ::3].shape)
    presence = rng.random(x.shape) > 0.3
    placeholders = rng.choice([np.nan, np.inf, -np.inf, -1337.1337], size=x.shape)
    x = np.where(presence, x, placeholders).astype(np.float32)
    presence = presence.astype(np.float32)
    feature_ids = list(parameters)
    batched = build_preprocessor(feature_ids, parameters, limit, host)

    with torch.no_grad():
        out = batched(torch.from_numpy(x), torch.from_numpy(presence)).numpy()
        for index, feature in enumerate(feature_ids):
            alone = build_preprocessor([feature], {feature: parameters[feature]}, limit, host)
            columns = [batched.output_names.index(name) for name in alone.output_names]
            expected = alone(
                torch.from_numpy(x[:, [index]]), torch.from_numpy(presence[:, [index]])
            ).numpy()
            if parameters[feature].feature_type == "quantile":
                # The sum over segments runs over the type's widest feature's count (narrower
                # ones are padded with zero-slope segments), which groups its additions
                # otherwise: a few units in the last place, never more.
                np.testing.assert_array_max_ulp(out[:, columns], expected, maxulp=4)
            else:
                # Bit for bit: a -0.0 in place of +0.0 is a difference too.
                np.testing.assert_array_equal(
                    out[:, columns].view(np.int32), expected.view(np.int32), err_msg=feature
                )
            assert (out[presence[:, index] == 0][:, columns].view(np.int32) == 0).all(), feature
    assert (np.abs(out) == np.float32(limit)).any()


def test_the_forward_pass_has_no_comparison_and_no_where(host):
    """Comparisons and `where` make or read boolean tensors, over ten times slower on the CPU
    than float arithmetic (profiled at 1,000 features, a quarter of the preprocessor's time
    went to the mask's `!=` and `where`): the built-in types and the mask use neither (Box-Cox
    keeps its `where` only when a lambda takes the log, which ``all_types`` has none of)."""
    parameters = all_types()
    preprocessor = build_preprocessor(list(parameters), parameters, plugins=host)
    x, presence = random_inputs(4, seed=9)

    called: set[str] = set()

    class Recorded(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, function, types, args=(), kwargs=None):
            called.add(getattr(function, "__name__", ""))
            return function(*args, **(kwargs or {}))

    with torch.no_grad(), Recorded():
        preprocessor(torch.from_numpy(x), torch.from_numpy(presence))
    comparisons = {"eq", "ne", "lt", "le", "gt", "ge"}
    assert "addcmul" in called
    assert not called & (comparisons | {f"__{name}__" for name in comparisons})
    assert not called & {"where", "masked_fill"}


# Horizon's own files.


def reference_file(relative: str) -> Path:
    root = os.environ.get("HORIZON_REFERENCE_DATA") or (
        Path(__file__).resolve().parents[2] / "shared" / "reference-data"
    )
    path = Path(root) / "reagent" / relative
    if not path.exists():
        pytest.skip(
            f"reference data not found: looked for {path} "
            "(set HORIZON_REFERENCE_DATA to the folder holding reagent/)"
        )
    return path


def horizons_formula(p: NormalizationParameters, x: np.ndarray) -> np.ndarray:
    """Horizon's transformation of one feature, in float64 numpy."""
    if p.feature_type == "quantile":
        return np.interp(x, p.quantiles, np.linspace(0, 1, len(p.quantiles)))
    y = boxcox(x, p.boxcox_shift, p.boxcox_lambda) if p.feature_type == "boxcox" else x
    return np.clip((y - p.mean) / p.stddev, -MAX_FEATURE_VALUE, MAX_FEATURE_VALUE)


@pytest.mark.parametrize(
    ("relative", "types", "order"),
    [
        (
            "discrete_action/cartpole_norm.json",
            ["quantile", "quantile", "continuous", "continuous"],
            ["2", "3", "0", "1"],
        ),
        (
            "continuous_action/state_features_norm.json",
            ["boxcox", "continuous", "continuous"],
            ["1", "2", "0"],
        ),
    ],
)
def test_horizons_normalization_files_give_horizons_outputs(host, relative, types, order):
    parameters = read_horizon_file(reference_file(relative))
    assert [p.feature_type for p in parameters.values()] == types
    assert all(len(p.quantiles) == 21 for p in parameters.values() if p.quantiles is not None)
    features = list(parameters)
    preprocessor = build_preprocessor(features, parameters, plugins=host)
    rng = np.random.default_rng(3)
    # From below each feature's logged minimum to above its maximum, so that the clamps and the
    # quantile ends are exercised too.
    low = np.array([parameters[feature].min_value for feature in features])
    high = np.array([parameters[feature].max_value for feature in features])
    span = high - low
    x = rng.uniform(low - span / 4, high + span / 4, size=(2000, len(features)))
    x = x.astype(np.float32)

    out = run(preprocessor, x)

    assert preprocessor.output_names == order
    for index, feature in enumerate(features):
        expected = horizons_formula(parameters[feature], x[:, index].astype(np.float64))
        np.testing.assert_allclose(
            column(preprocessor, out, feature), expected, atol=2e-6, err_msg=feature
        )


# ONNX.


def export_onnx(preprocessor, path: Path, rows: int = 8) -> None:
    x, presence = random_inputs(rows, seed=4, features=len(preprocessor.feature_ids))
    with warnings.catch_warnings():
        # torch 2.9+ deprecates the TorchScript-based exporter for the dynamo one, which needs
        # onnxscript (not a dependency); the TorchScript one is still there and exports this.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            preprocessor.eval(),
            (torch.from_numpy(x), torch.from_numpy(presence)),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["x", "presence"],
            output_names=["out"],
            dynamic_axes={"x": {0: "batch"}, "presence": {0: "batch"}, "out": {0: "batch"}},
        )


def test_onnx_export_gives_the_same_numbers(host, tmp_path):
    import onnxruntime

    parameters = all_types()
    preprocessor = build_preprocessor(list(parameters), parameters, plugins=host)
    export_onnx(preprocessor, tmp_path / "preprocessor.onnx")
    session = onnxruntime.InferenceSession(
        str(tmp_path / "preprocessor.onnx"), providers=["CPUExecutionProvider"]
    )

    for rows, seed in [(1, 5), (8, 6), (1000, 7)]:
        x, presence = random_inputs(rows, seed)
        [exported] = session.run(None, {"x": x, "presence": presence})
        assert exported.shape == (rows, len(preprocessor.output_names))
        np.testing.assert_allclose(exported, run(preprocessor, x, presence), atol=1e-5, rtol=0)


def test_the_graph_does_not_grow_with_the_number_of_features(host, tmp_path):
    """One set of operations per type: 50 features of each type make the same graph as one."""
    import onnx

    def graph_nodes(copies: int) -> int:
        parameters = {
            f"{copy}{feature}": p for copy in range(copies) for feature, p in all_types().items()
        }
        preprocessor = build_preprocessor(list(parameters), parameters, plugins=host)
        path = tmp_path / f"{copies}.onnx"
        export_onnx(preprocessor, path)
        return len(onnx.load(str(path)).graph.node)

    assert graph_nodes(50) == graph_nodes(1)


def test_preprocessor_pickles_and_copies(host):
    parameters = all_types()
    preprocessor = build_preprocessor(list(parameters), parameters, plugins=host)
    x, presence = random_inputs(50, seed=8)

    for clone in (pickle.loads(pickle.dumps(preprocessor)), copy.deepcopy(preprocessor)):
        assert isinstance(clone, Preprocessor)
        assert clone.output_names == preprocessor.output_names
        np.testing.assert_array_equal(run(clone, x, presence), run(preprocessor, x, presence))


# A type that a plugin registers.

LOG1P_PLUGIN = '''
"""A normalization type as a third party writes one: log(1 + x) for counts, clamped at 0."""

import numpy as np

from horizon_engine import hookimpl
from horizon_engine import FeatureParameters, FeatureType, feature_module


class Log1pParameters(FeatureParameters):
    log_spread: float = 1.0


def _log1p(x, scale):
    return (x.clamp(min=0.0) + 1.0).log() * scale


class Log1p(FeatureType):
    """log(1 + max(x, 0)), divided by a per-feature spread (1 unless fitted)."""

    name = "log1p"
    Parameters = Log1pParameters

    def fit(self, values, config):
        return Log1pParameters(feature_type=self.name, log_spread=float(np.log1p(values).std()))

    def module(self, parameters, max_feature_value):
        scale = np.array([1.0 / p.log_spread for p in parameters])
        return feature_module(_log1p, scale=scale)


@hookimpl
def horizon_register_feature_types(register):
    register(Log1p)
'''


def test_a_plugin_registered_type_works_in_the_preprocessor(plugin_site):
    module = "horizon_plugin_log1p"
    plugin_site.install(
        "horizon-plugin-log1p", "1.0", {"log1p": module}, {f"{module}.py": LOG1P_PLUGIN}
    )
    host = PluginHost(env={"HORIZON_LOAD_PLUGINS": "log1p"})
    log1p = host.component("feature_types", "log1p")
    assert log1p.plugin == "log1p"
    parameters = {
        "2": log1p.cls.Parameters(feature_type="log1p", log_spread=2.0),
        "1": log1p.cls.Parameters(feature_type="log1p"),
        "3": NormalizationParameters(feature_type="continuous", mean=0.0, stddev=1.0),
        "4": NormalizationParameters(feature_type="do_not_preprocess"),
    }
    preprocessor = build_preprocessor(["1", "2", "3", "4"], parameters, plugins=host)
    x = np.array([[0.0, 3.0, 1.0, 9.0], [-5.0, 1.0, 2.0, 8.0]], dtype=np.float32)
    presence = np.array([[1, 1, 1, 1], [1, 0, 1, 1]], dtype=np.float32)

    out = run(preprocessor, x, presence)

    # Plugin types come after every built-in type.
    assert preprocessor.output_names == ["3", "4", "1", "2"]
    np.testing.assert_allclose(out[:, 2], np.log1p(np.maximum(x[:, 0], 0)), atol=1e-6)
    np.testing.assert_allclose(out[:, 3], [np.log1p(3.0) / 2.0, 0.0], atol=1e-6)


def test_a_plugin_type_with_a_wrong_width_is_reported(plugin_site):
    source = LOG1P_PLUGIN.replace(
        "return feature_module(_log1p, scale=scale)",
        "return feature_module(_log1p, scale=np.concatenate([scale, scale]))",
    ).replace("(x.clamp", "(x.repeat(1, 2).clamp")
    module = "horizon_plugin_log1p"
    plugin_site.install("horizon-plugin-log1p", "1.0", {"log1p": module}, {f"{module}.py": source})
    host = PluginHost(env={"HORIZON_LOAD_PLUGINS": "log1p"})
    parameters = host.component("feature_types", "log1p").cls.Parameters(feature_type="log1p")

    with pytest.raises(PluginError) as error:
        build_preprocessor(["1"], {"1": parameters}, plugins=host)

    assert str(error.value) == (
        "normalization type 'log1p' (plugin 'log1p') turned [2, 1] into [2, 2]; "
        "its width() says [2, 1]"
    )


def test_a_plugin_type_that_declares_no_parameters_model_is_refused_naming_it(plugin_site):
    """A type stores its own parameters: one without a model of them is a plugin failure,
    reported when Horizon starts, not an AttributeError when a feature of its type is fitted."""
    source = LOG1P_PLUGIN.replace("    Parameters = Log1pParameters\n", "")
    module = "horizon_plugin_log1p"
    plugin_site.install("horizon-plugin-log1p", "1.0", {"log1p": module}, {f"{module}.py": source})
    host = PluginHost(env={"HORIZON_LOAD_PLUGINS": "log1p"})

    assert [failure.name for failure in host.failures] == ["log1p"]
    assert "its Parameters is None; expected a subclass of horizon_engine.FeatureParameters" in (
        str(host.failures[0])
    )


def test_parameters_of_another_types_model_are_an_error_naming_the_feature(plugin_site):
    module = "horizon_plugin_log1p"
    plugin_site.install(
        "horizon-plugin-log1p", "1.0", {"log1p": module}, {f"{module}.py": LOG1P_PLUGIN}
    )
    host = PluginHost(env={"HORIZON_LOAD_PLUGINS": "log1p"})
    horizons = {"1": NormalizationParameters(feature_type="log1p", stddev=2.0)}

    with pytest.raises(HorizonError) as error:
        build_preprocessor(["1"], horizons, plugins=host)

    assert str(error.value) == (
        "feature '1': normalization type 'log1p' stores Log1pParameters, not "
        "NormalizationParameters"
    )


# Mistakes a user can make, named.


def test_an_unknown_type_is_an_error_naming_the_feature(host):
    parameters = {"3": NormalizationParameters(feature_type="continous", mean=0.0, stddev=1.0)}

    with pytest.raises(PluginError) as error:
        build_preprocessor(["3"], parameters, plugins=host)

    message = str(error.value)
    assert message.startswith(
        "feature '3' has normalization type 'continous': no feature_types component "
        "'continous' is registered; did you mean 'continuous'?"
    )


def test_an_engines_name_is_no_normalization_type(host):
    """Engines and feature types are families of their own: ``local`` names a timeline and a
    normalization engine, never a type."""
    parameters = {"3": NormalizationParameters(feature_type="local")}

    with pytest.raises(PluginError, match="feature '3' has normalization type 'local': no "):
        build_preprocessor(["3"], parameters, plugins=host)


@pytest.mark.parametrize(
    ("parameters", "problem"),
    [
        (
            NormalizationParameters(feature_type="enum"),
            "feature '8': normalization type 'enum' needs possible_values",
        ),
        (
            NormalizationParameters(feature_type="enum", possible_values=[1.0, 1.0]),
            "feature '8': normalization type 'enum' needs distinct possible values",
        ),
        (
            NormalizationParameters(feature_type="continuous", mean=0.0),
            "feature '8': normalization type 'continuous' needs stddev",
        ),
        (
            NormalizationParameters(feature_type="continuous", mean=0.0, stddev=0.0),
            "feature '8': normalization type 'continuous' needs stddev > 0, found 0.0",
        ),
        (
            NormalizationParameters(
                feature_type="boxcox", boxcox_lambda=float("nan"), boxcox_shift=0, mean=0, stddev=1
            ),
            "feature '8': normalization type 'boxcox': boxcox_lambda = nan is not finite",
        ),
        (
            NormalizationParameters(feature_type="quantile", quantiles=[0.0, 2.0, 1.0]),
            "feature '8': normalization type 'quantile' needs at least one boundary, in "
            "increasing order",
        ),
        (
            NormalizationParameters(feature_type="continuous_action", min_value=1, max_value=0),
            "feature '8': normalization type 'continuous_action' needs min_value <= max_value",
        ),
    ],
)
def test_unusable_parameters_are_errors_naming_the_feature(host, parameters, problem):
    with pytest.raises(HorizonError) as error:
        build_preprocessor(["8"], {"8": parameters}, plugins=host)

    assert str(error.value).startswith(problem)


def test_features_without_parameters_or_twice_are_errors(host):
    parameters = {"1": NormalizationParameters(feature_type="binary")}

    with pytest.raises(HorizonError, match=r"no normalization parameters for feature\(s\) '2'"):
        build_preprocessor(["1", "2"], parameters, plugins=host)
    with pytest.raises(HorizonError, match="feature '1' appears twice"):
        build_preprocessor(["1", "1"], parameters, plugins=host)
    with pytest.raises(HorizonError, match="no features to preprocess"):
        build_preprocessor([], parameters, plugins=host)
