"""Normalization: identification rules, overrides, the stage and its file, Horizon's format,
and where our choices on Horizon's own data agree with Horizon's files and where they differ."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from horizon_engine.errors import HorizonError
from horizon_engine.normalization import (
    FeatureParameters,
    NormalizationConfig,
    NormalizationParameters,
    TypeOverride,
    apply_override,
    identify,
    identify_all,
    read_horizon_file,
    read_normalization,
    write_horizon_file,
)
from horizon_engine.pipeline import Engine
from horizon_engine.plugins import get_plugin_host
from horizon_engine.preprocessor import FeatureType

SAMPLES = 10_000
TYPES = get_plugin_host().feature_types()
"""The registered feature types by name, as the normalization stage fits with them."""


def horizon_style_features() -> dict[str, np.ndarray]:
    """The synthetic features of Horizon's own normalization tests, seed fixed."""
    rng = np.random.default_rng(0)
    return {
        "bernoulli": rng.binomial(1, 0.5, SAMPLES).astype(float),
        "normal": rng.normal(size=SAMPLES),
        "exponential": rng.exponential(size=SAMPLES),
        "randint": rng.integers(0, 10, SAMPLES).astype(float),
        "mixed": np.concatenate(
            [rng.normal(size=SAMPLES // 2), rng.exponential(size=SAMPLES // 2)]
        ),
        "beta": np.clip(rng.beta(2, 2, SAMPLES), 0.01, 0.99),
    }


EXPECTED = {
    "bernoulli": "binary",
    "normal": "continuous",
    "exponential": "boxcox",
    "randint": "enum",
    "mixed": "quantile",
    "beta": "probability",
}


@pytest.mark.parametrize("feature", list(EXPECTED))
def test_identifies_horizons_synthetic_features(feature):
    values = horizon_style_features()[feature]
    parameters, note = identify(values, NormalizationConfig(quantiles=True), feature)
    assert parameters.feature_type == EXPECTED[feature]
    assert note is None
    assert (parameters.min_value, parameters.max_value) == (values.min(), values.max())


def test_fitted_parameters():
    features = horizon_style_features()
    config = NormalizationConfig(quantiles=True)
    normal, _ = identify(features["normal"], config, "normal")
    assert normal.mean == pytest.approx(features["normal"].mean())
    assert normal.stddev == pytest.approx(features["normal"].std())
    enum, _ = identify(features["randint"], config, "randint")
    assert enum.possible_values == [float(v) for v in range(10)]
    quantile, _ = identify(features["mixed"], config, "mixed")
    # 21 boundaries: numpy's quantiles at 0, 0.05, ..., 1 (all distinct for this sample).
    assert quantile.quantiles == pytest.approx(
        np.quantile(features["mixed"], np.arange(21) / 20).tolist()
    )
    boxcox, _ = identify(features["exponential"], config, "exponential")
    # Exp(1) is positive: no shift; its Box-Cox lambda is near 0.27 (between log and sqrt).
    assert boxcox.boxcox_shift == 0.0
    assert 0.2 < boxcox.boxcox_lambda < 0.35


def test_more_enum_values_than_allowed_is_not_an_enum():
    values = np.random.default_rng(1).integers(0, 30, SAMPLES).astype(float)
    assert identify(values, NormalizationConfig(), "f")[0].feature_type != "enum"
    wider = NormalizationConfig(max_enum_values=30)
    assert identify(values, wider, "f")[0].feature_type == "enum"


def test_quantiles_are_off_unless_switched_on():
    values = horizon_style_features()["mixed"]
    assert identify(values, NormalizationConfig(), "mixed")[0].feature_type == "continuous"
    config = NormalizationConfig(quantiles=True)
    assert identify(values, config, "mixed")[0].feature_type == "quantile"


def test_constant_feature_is_one_where_present_and_reported():
    parameters, note = identify(np.full(50, 5.0), NormalizationConfig(), "17")
    assert (parameters.feature_type, parameters.mean, parameters.stddev) == ("continuous", 4.0, 1.0)
    assert note == "feature '17': constant 5.0; 1 where present, 0 where missing"


def test_too_few_samples_left_unnormalized_and_reported():
    parameters, note = identify(np.arange(19.0), NormalizationConfig(), "3")
    assert parameters.feature_type == "do_not_preprocess"
    assert note == "feature '3': 19 values, fewer than min_samples = 20; left unnormalized"


def test_nan_in_a_sample_names_the_feature():
    values = np.append(np.arange(30.0), np.nan)
    with pytest.raises(HorizonError, match="feature '8': the sample holds nan"):
        identify(values, NormalizationConfig(), "8")


def test_continuous_action_maps_observed_range():
    parameters, _ = identify(np.linspace(-2, 2, 100), NormalizationConfig(), "3", action=True)
    assert parameters.feature_type == "continuous_action"
    assert (parameters.min_value, parameters.max_value) == (-2.0, 2.0)


def test_overrides_force_a_type_or_parameters():
    features = horizon_style_features()
    samples = {"17": features["randint"], "3": features["normal"], "4": features["exponential"]}
    overrides = {
        "17": "continuous",
        "3": TypeOverride(type="continuous", mean=0.0, stddev=2.0),
    }
    result = identify_all(samples, NormalizationConfig(), overrides, TYPES)
    assert list(result.parameters) == ["3", "4", "17"]
    assert result.parameters["17"].feature_type == "continuous"
    assert result.parameters["17"].mean == pytest.approx(features["randint"].mean())
    assert (result.parameters["3"].mean, result.parameters["3"].stddev) == (0.0, 2.0)
    assert result.parameters["4"].feature_type == "boxcox"
    assert result.notes == [
        "feature '17': type 'continuous' set by an override",
        "feature '3': type 'continuous' set by an override",
    ]
    with pytest.raises(HorizonError, match="feature '99' is not in the data"):
        identify_all(samples, NormalizationConfig(), {"99": "enum"}, TYPES)
    with pytest.raises(HorizonError, match="feature '3': unknown type 'lgo'"):
        identify_all(samples, NormalizationConfig(), {"3": "lgo"}, TYPES)


def test_override_of_another_type_is_refitted_to_the_sample():
    values = horizon_style_features()["exponential"]
    config = NormalizationConfig()
    identified, _ = identify(values, config, "4")
    continuous = TypeOverride(type="continuous", mean=0.5)
    forced = apply_override(identified, continuous, values, config, TYPES, "4")
    assert (forced.feature_type, forced.mean) == ("continuous", 0.5)
    assert forced.stddev == pytest.approx(values.std())
    as_enum = apply_override(identified, "enum", np.array([3.0, 1.0, 3.0]), config, TYPES, "4")
    assert as_enum.possible_values == [1.0, 3.0]
    boxcox = TypeOverride(type="boxcox", stddev=9.0)
    same = apply_override(identified, boxcox, values, config, TYPES, "4")
    assert (same.boxcox_lambda, same.stddev) == (identified.boxcox_lambda, 9.0)


class MedianParameters(FeatureParameters):
    """A plugin type's own parameters, under a name none of Horizon's has."""

    median: float


class Median(FeatureType):
    """A plugin's type that fits a statistic no built-in type fits: the sample's median."""

    name = "median"
    Parameters = MedianParameters

    def fit(self, values, config):
        return MedianParameters(feature_type=self.name, median=float(np.median(values)))

    def module(self, parameters, max_feature_value):
        raise NotImplementedError


def test_an_override_to_a_plugins_type_is_fitted_by_that_types_own_fit():
    """Before feature types fitted themselves, a plugin's type got the sample's range only."""
    values = np.array([1.0, 2.0, 10.0, 50.0] * 10)
    types = {**TYPES, "median": Median(Median.Config())}
    result = identify_all({"7": values}, NormalizationConfig(), {"7": "median"}, types)
    assert result.parameters["7"].as_dict() == {"feature_type": "median", "median": 6.0}


def test_an_overrides_parameters_are_validated_by_the_types_own_model():
    """Before a type owned its parameters, an override could only give Horizon's fields, and
    a plugin type's own field was refused by the config."""
    values = np.array([1.0, 2.0, 10.0, 50.0] * 10)
    types = {**TYPES, "median": Median(Median.Config())}
    given = {"7": TypeOverride(type="median", median=3.5)}
    result = identify_all({"7": values}, NormalizationConfig(), given, types)
    assert result.parameters["7"] == MedianParameters(feature_type="median", median=3.5)
    for fields, problem in [
        ({"mean": 1.0}, "mean: Extra inputs are not permitted"),
        ({"median": "middle"}, "median: Input should be a valid number"),
    ]:
        with pytest.raises(HorizonError) as error:
            apply_override(
                result.parameters["7"],
                TypeOverride(type="median", **fields),
                values,
                NormalizationConfig(),
                types,
                "7",
            )
        assert str(error.value).startswith(
            "feature '7': parameters of normalization type 'median' (MedianParameters): "
        )
        assert problem in str(error.value)


def test_identify_fits_with_the_registered_types_and_names_a_missing_one():
    values = horizon_style_features()["normal"]
    unregistered = {name: kind for name, kind in TYPES.items() if name != "continuous"}
    with pytest.raises(HorizonError, match="feature 'x': normalization type 'continuous' is not"):
        identify(values, NormalizationConfig(), "x", feature_types=unregistered)


def test_a_type_whose_fit_returns_another_type_is_an_error_naming_the_feature():
    class Liar(Median):
        name = "liar"

        def fit(self, values, config):
            return MedianParameters(feature_type="median", median=0.0)

    class Borrower(Median):
        """Returns another model than the one it declares (Horizon's, not its own)."""

        name = "borrower"

        def fit(self, values, config):
            return NormalizationParameters(feature_type="borrower", mean=0.0)

    types = {**TYPES, "liar": Liar(Liar.Config()), "borrower": Borrower(Borrower.Config())}
    with pytest.raises(HorizonError, match="feature '7': normalization type 'liar' fitted "):
        identify_all({"7": np.arange(30.0)}, NormalizationConfig(), {"7": "liar"}, types)
    with pytest.raises(HorizonError) as error:
        identify_all({"7": np.arange(30.0)}, NormalizationConfig(), {"7": "borrower"}, types)
    assert str(error.value) == (
        "feature '7': normalization type 'borrower' fitted "
        "NormalizationParameters(feature_type='borrower'); its fit must return its own "
        "MedianParameters with its own name"
    )


def test_stage_writes_normalization_json_from_the_train_split(tmp_path):
    config = {
        "pipeline": {"output_dir": str(tmp_path), "seed": 2},
        "source": {"kind": "gym", "episodes": 20, "ds": "2019-01-01"},
        "timeline": {"actions": ["0", "1"]},
        "normalization": {"overrides": {"2": {"type": "continuous", "mean": 0.0, "stddev": 0.2}}},
    }
    manifest = Engine(show_progress=False).run(config)
    stage = manifest["stages"]["normalization"]
    written = read_normalization(tmp_path / "normalization.json")
    assert list(written) == ["state_features"]
    assert list(written["state_features"]) == ["0", "1", "2", "3"]
    assert written["state_features"]["2"].stddev == 0.2
    assert stage["warnings"] == ["feature '2': type 'continuous' set by an override"]
    assert sum(stage["details"]["state_features"].values()) == 4
    raw = json.loads((tmp_path / "normalization.json").read_text())
    assert raw["state_features"]["2"] == {
        "feature_type": "continuous",
        "mean": 0.0,
        "stddev": 0.2,
        "min_value": written["state_features"]["2"].min_value,
        "max_value": written["state_features"]["2"].max_value,
    }


def test_stage_reports_an_unknown_override_with_its_section(tmp_path):
    config = {
        "pipeline": {"output_dir": str(tmp_path)},
        "source": {"kind": "gym", "episodes": 3, "ds": "2019-01-01"},
        "timeline": {"actions": ["0", "1"]},
        "normalization": {"overrides": {"7": "enum"}},
    }
    with pytest.raises(HorizonError, match=r"\[normalization\] overrides: feature '7' is not"):
        Engine(show_progress=False).run(config)


def test_an_override_the_type_cannot_use_is_refused_where_it_is_given():
    """Before, the stage wrote it and training refused the file it read."""
    samples = {"3": horizon_style_features()["normal"]}
    flat = {"3": TypeOverride(type="continuous", stddev=0.0)}

    with pytest.raises(HorizonError) as error:
        identify_all(samples, NormalizationConfig(), flat, TYPES)

    assert str(error.value) == (
        "[normalization] overrides: feature '3': normalization type 'continuous' needs "
        "stddev > 0, found 0.0"
    )


def test_a_normalization_file_a_type_cannot_use_names_the_file_and_the_feature(tmp_path):
    path = tmp_path / "normalization.json"
    flat = {"feature_type": "continuous", "mean": 1.0, "stddev": 0.0}
    path.write_text(json.dumps({"state_features": {"3": flat}}))

    with pytest.raises(HorizonError) as error:
        read_normalization(path)

    assert str(error.value) == (
        f"{path}: state_features: feature '3': normalization type 'continuous' needs "
        "stddev > 0, found 0.0"
    )
    path.write_text(json.dumps({"state_features": {"3": {"mean": 1.0}}}))
    with pytest.raises(HorizonError, match="feature '3': feature_type: a type name is required"):
        read_normalization(path)


def test_validate_refuses_an_override_parameter_its_type_does_not_store(tmp_path):
    """The override's fields are the type's own, so the config cannot list Horizon's: the
    type's model is what tells a misspelt one before any data is read."""
    misspelt = {"type": "continuous", "mean": 0.0, "stdev": 2.0}
    config = {
        "pipeline": {"output_dir": str(tmp_path / "run")},
        "source": {"kind": "gym", "episodes": 3, "ds": "2019-01-01"},
        "timeline": {"actions": ["0", "1"]},
        "normalization": {"overrides": {"2": misspelt}},
    }
    with pytest.raises(HorizonError) as error:
        Engine(show_progress=False).validate(config)

    assert (
        "[normalization] overrides: feature '2': type 'continuous' has no parameter stdev; its "
        "parameters (NormalizationParameters): boxcox_lambda, boxcox_shift, max_value, mean, "
        "min_value, possible_values, quantiles, stddev"
    ) in str(error.value)


# Horizon's format and Horizon's own files ------------------------------------------------


def reference(relative: str) -> Path:
    root = os.environ.get("HORIZON_REFERENCE_DATA") or Path(__file__).resolve().parents[2] / (
        "shared/reference-data"
    )
    path = Path(root) / "reagent" / relative
    if not path.exists():
        pytest.skip(f"reference data not found: looked for {path}")
    return path


def test_horizon_files_read_and_write_unchanged(tmp_path):
    path = reference("discrete_action/cartpole_norm.json")
    parameters = read_horizon_file(path)
    assert [p.feature_type for p in parameters.values()] == [
        "quantile",
        "quantile",
        "continuous",
        "continuous",
    ]
    assert len(parameters["0"].quantiles) == 21
    write_horizon_file(tmp_path / "norm.json", parameters)
    original = {k: json.loads(v) for k, v in json.loads(path.read_text()).items()}
    written = {
        k: json.loads(v) for k, v in json.loads((tmp_path / "norm.json").read_text()).items()
    }
    assert written == original


IDENTIFIED_ON_HORIZONS_DATA = {
    # (timeline file, feature set, feature): (ours, Horizon's file, why they differ or None)
    ("discrete_action/cartpole_training.json.bz2", "state_features", "0"): (
        "continuous",
        "quantile",
        "Horizon's file was fitted on another CartPole sample (its min/max, -0.93/2.40, are not "
        "this file's -2.40/1.81); on these 3,470 rows K^2 stays under 1000",
    ),
    ("discrete_action/cartpole_training.json.bz2", "state_features", "1"): (
        "continuous",
        "quantile",
        "as feature 0",
    ),
    ("discrete_action/cartpole_training.json.bz2", "state_features", "2"): (
        "continuous",
        "continuous",
        None,
    ),
    ("discrete_action/cartpole_training.json.bz2", "state_features", "3"): (
        "continuous",
        "continuous",
        None,
    ),
    ("continuous_action/pendulum_training.json.bz2", "state_features", "0"): (
        "quantile",
        "boxcox",
        "K^2 grows with the sample: Horizon's sample configs drew 1,000 rows, we identify on "
        "all 8,600, where Box-Cox no longer brings K^2 under 1000",
    ),
    ("continuous_action/pendulum_training.json.bz2", "state_features", "1"): (
        "continuous",
        "continuous",
        None,
    ),
    ("continuous_action/pendulum_training.json.bz2", "state_features", "2"): (
        "quantile",
        "continuous",
        "as feature 0: on 8,600 rows K^2 of the angular velocity exceeds 1000",
    ),
    ("continuous_action/pendulum_training.json.bz2", "action_features", "3"): (
        "continuous_action",
        "continuous",
        "continuous actions are continuous_action by design: the actor's tanh output maps to "
        "the logged [min, max]",
    ),
}


@pytest.mark.parametrize("case", list(IDENTIFIED_ON_HORIZONS_DATA), ids=lambda c: f"{c[0]}-{c[2]}")
def test_identification_on_horizons_data_agrees_or_differs_as_recorded(identified, case):
    relative, feature_set, feature = case
    ours, horizon, why = IDENTIFIED_ON_HORIZONS_DATA[case]
    run = identified(relative)
    assert run[feature_set][feature].feature_type == ours
    norm_file = {
        "discrete_action/cartpole_training.json.bz2": {
            "state_features": "discrete_action/cartpole_norm.json"
        },
        "continuous_action/pendulum_training.json.bz2": {
            "state_features": "continuous_action/state_features_norm.json",
            "action_features": "continuous_action/action_norm.json",
        },
    }[relative][feature_set]
    assert read_horizon_file(reference(norm_file))[feature].feature_type == horizon
    assert (ours == horizon) == (why is None)


@pytest.fixture(scope="module")
def identified(tmp_path_factory: pytest.TempPathFactory):
    """Identify Horizon's timeline rows (all in train), once per file."""
    runs: dict[str, dict] = {}

    def run(relative: str) -> dict:
        if relative not in runs:
            output = tmp_path_factory.mktemp("identified")
            config = {
                "pipeline": {"output_dir": str(output)},
                "source": {"kind": "jsonl", "path": str(reference(relative))},
                "timeline": {"eval_fraction": 0.0},
                "normalization": {"quantiles": True},  # Horizon's rules, as its files were made
            }
            Engine(show_progress=False).run(config)
            runs[relative] = read_normalization(output / "normalization.json")
        return runs[relative]

    return run


@pytest.mark.spark
def test_spark_engine_identifies_the_same_from_the_same_sample(tmp_path, spark):
    """With num_samples above the row count both engines sample every row: same file."""
    written = {}
    for engine in ("local", "spark"):
        config = {
            "pipeline": {"output_dir": str(tmp_path / engine), "seed": 4},
            "source": {"kind": "gym", "env": "Pendulum-v1", "episodes": 3, "ds": "2019-01-01"},
            "timeline": {"engine": engine},
            "normalization": {"engine": engine, "num_samples": 1_000_000},
        }
        Engine(show_progress=False).run(config)
        written[engine] = read_normalization(tmp_path / engine / "normalization.json")
    assert written["spark"] == written["local"]
    assert written["local"]["action_features"]["3"].feature_type == "continuous_action"


@pytest.mark.parametrize("engine", ["local", pytest.param("spark", marks=pytest.mark.spark)])
def test_sample_is_num_samples_rows_and_seeded(tmp_path, request, engine):
    if engine == "spark":
        request.getfixturevalue("spark")
    base = {
        "source": {"kind": "gym", "episodes": 20, "ds": "2019-01-01"},
        "timeline": {"actions": ["0", "1"], "eval_fraction": 0.0},
    }
    engine_instance = Engine(show_progress=False)
    manifest = engine_instance.run({**base, "pipeline": {"output_dir": str(tmp_path), "seed": 4}})
    assert manifest["stages"]["timeline"]["rows_out"] > 200
    component = engine_instance.plugins.component("normalization_engines", engine)
    sampler = component.cls(component.cls.Config(num_samples=50))
    run = SimpleNamespace(seed=4)
    train = tmp_path / "timeline" / "train"
    first = sampler.sample(run, train, "state_features", 50)
    again = sampler.sample(run, train, "state_features", 50)
    assert sorted(first) == ["0", "1", "2", "3"]
    # Every CartPole row holds all four features: 50 rows give 50 values each.
    assert {feature: len(values) for feature, values in first.items()} == dict.fromkeys(first, 50)
    assert all(np.array_equal(first[f], again[f]) for f in first)
