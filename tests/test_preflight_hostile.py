"""Values that passed ``validate`` and broke a run, found where they can be: in the config
(normalization overrides), against the data already on disk (``preflight``), and in a
``normalization.json`` read back, each refused naming the file, the feature or key, and the
field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from horizon_engine.errors import ConfigError, HorizonError
from horizon_engine.normalization import read_normalization
from horizon_engine.pipeline import Engine
from horizon_engine.plugins import PluginHost


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(plugins=PluginHost(env={}), show_progress=False)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ('"mean": 1e308, "stddev": 1.0', "mean = 1e+308, beyond float32 (at most 3.4e+38"),
        ('"mean": 0.0, "stddev": 1e300', "stddev = 1e+300, beyond float32 (at most 3.4e+38"),
        (
            '"mean": 0.0, "stddev": 1e-300',
            "stddev = 1e-300 is below float32's smallest normal number (1.18e-38): the "
            "network would divide by 0",
        ),
        ('"mean": 0.0, "stddev": 0.0', "normalization type 'continuous' needs stddev > 0"),
        ('"mean": 0.0, "stddev": NaN', "stddev = nan is not finite"),
        ('"mean": 0.0, "stddev": Infinity', "stddev = inf is not finite"),
        ('"mean": 0.0, "stddev": 1.0, "min_value": NaN', "min_value = nan, which is not finite"),
    ],
)
def test_a_normalization_file_the_network_cannot_compute_with_is_refused(tmp_path, fields, problem):
    """A mean of 1e308 is infinite in the network's float32 and a stddev of 1e-300 is 0
    there: both were read back without a word, and the policy computed NaN."""
    path = tmp_path / "normalization.json"
    path.write_text(
        f'{{"state_features": {{"3": {{"feature_type": "continuous", {fields}}}}}}}',
        encoding="utf-8",
    )
    with pytest.raises(HorizonError) as caught:
        read_normalization(path)
    assert str(caught.value).startswith(f"{path}: state_features: ")
    assert "feature '3'" in str(caught.value)
    assert problem in str(caught.value)


def test_a_list_parameter_names_the_value_it_cannot_hold(tmp_path):
    path = tmp_path / "normalization.json"
    parameters = {"feature_type": "enum", "possible_values": [1.0, 1e300]}
    path.write_text(json.dumps({"state_features": {"3": parameters}}), encoding="utf-8")
    with pytest.raises(HorizonError) as caught:
        read_normalization(path)
    assert str(caught.value) == (
        f"{path}: state_features: feature '3': possible_values holds 1e+300, beyond float32 "
        "(at most 3.4e+38 either way), which the network computes in"
    )


PIPELINE = """[pipeline]
output_dir = "{run}"

[source]
kind = "jsonl"
path = "{rows}"

[timeline]
actions = ["0", "1"]
"""


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        (
            '{type = "continuous", mean = 1e308, stddev = 1.0}',
            "mean = 1e+308, beyond float32 (at most 3.4e+38 either way), which the network "
            "computes in",
        ),
        ('{type = "continuous", mean = 0.0, stddev = inf}', "stddev = inf, which is not finite"),
        ('{type = "continuous", stddev = 1e-300}', "stddev = 1e-300 is below float32's"),
        ('{type = "continuous", mean = "high"}', "mean: Input should be a valid number"),
    ],
)
def test_override_parameters_are_checked_by_validate(tmp_path, engine, override, problem):
    """An override's parameters are in the config: they were checked only once the stage
    had sampled the data, and a mean of 1e308 not even then."""
    text = PIPELINE.format(run=tmp_path / "run", rows=tmp_path / "rows.jsonl")
    path = tmp_path / "pipeline.toml"
    path.write_text(text + f'\n[normalization.overrides]\n"3" = {override}\n', encoding="utf-8")
    (tmp_path / "rows.jsonl").write_text("")
    with pytest.raises(ConfigError) as caught:
        engine.validate(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:12: [normalization] overrides: feature '3': {problem}")


def test_a_stddev_floor_the_network_cannot_divide_by_is_refused(tmp_path, engine):
    text = PIPELINE.format(run=tmp_path / "run", rows=tmp_path / "rows.jsonl")
    path = tmp_path / "pipeline.toml"
    path.write_text(text + "\n[normalization]\nstddev_floor = 1e-300\n", encoding="utf-8")
    (tmp_path / "rows.jsonl").write_text("")
    with pytest.raises(ConfigError, match=r":12: \[normalization\] key 'stddev_floor' of "):
        engine.validate(path)


def logged_rows(path: Path) -> Path:
    """Two episodes of three steps, with state features 0 and 1 and the metric 'clicks'."""
    lines = [
        json.dumps(
            {
                "mdp_id": str(episode),
                "sequence_number": step,
                "state_features": {"0": float(step), "1": float(episode + step)},
                "action": str(step % 2),
                "action_probability": 0.5,
                "reward": 1.0,
                "metrics": {"clicks": float(step)},
            }
        )
        for episode in range(2)
        for step in range(3)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """A run folder whose source and timeline stages ran, and the rows they read."""
    folder = tmp_path_factory.mktemp("built")
    rows = logged_rows(folder / "rows.jsonl")
    config = folder / "pipeline.toml"
    config.write_text(PIPELINE.format(run=folder / "run", rows=rows), encoding="utf-8")
    Engine(plugins=PluginHost(env={}), show_progress=False).run(config)
    return folder / "run", rows


def test_a_reward_metric_no_row_on_disk_carries_is_found_by_validate(tmp_path, engine, built):
    """Running the timeline again on rows already read, a weight for a metric none of them
    logs is refused by validate, not left to the stage."""
    run, rows = built
    text = PIPELINE.format(run=run, rows=rows).replace(
        "\n\n[source]", '\nstages = ["timeline"]\n\n[source]', 1
    )
    path = tmp_path / "pipeline.toml"
    path.write_text(text + "reward = { clicks = 1.0, views = 0.5 }\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        engine.validate(path)
    assert str(caught.value) == (
        f"{path}:11: [timeline] reward weighs metric 'views', which none of the 6 rows of "
        f"{run}/source/rows.parquet carries in 'metrics' (the rows carry: 'clicks')"
    )
    path.write_text(text + "reward = { clicks = 1.0 }\n", encoding="utf-8")
    assert engine.validate(path).sections["timeline"].config.reward == {"clicks": 1.0}


def test_an_override_of_a_feature_the_timeline_on_disk_lacks_is_found_by_validate(
    tmp_path, engine, built
):
    run, rows = built
    text = PIPELINE.format(run=run, rows=rows).replace(
        "\n\n[source]", '\nstages = ["normalization"]\n\n[source]', 1
    )
    path = tmp_path / "pipeline.toml"
    path.write_text(
        text + '\n[normalization.overrides]\n"1" = "continuous"\n"7" = "continuous"\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as caught:
        engine.validate(path)
    assert str(caught.value) == (
        f"{path}:14: [normalization] overrides: feature '7' is not in the data: no row of "
        f"{run}/timeline/train holds it; features: 0, 1"
    )


def test_an_override_of_a_feature_absent_on_a_full_run_is_named_with_its_line(tmp_path, engine):
    """On a full run the data is not on disk when validate runs: the normalization stage,
    which first reads it, names the override's line."""
    rows = logged_rows(tmp_path / "rows.jsonl")
    path = tmp_path / "pipeline.toml"
    text = PIPELINE.format(run=tmp_path / "run", rows=rows)
    path.write_text(
        text + '\n[normalization]\noverrides = { "1" = "continuous", "7" = "continuous" }\n',
        encoding="utf-8",
    )
    with pytest.raises(HorizonError) as caught:
        engine.run(path)
    assert str(caught.value) == (
        f"{path}:12: [normalization] overrides: feature '7' is not in the data; features: 0, 1"
    )
