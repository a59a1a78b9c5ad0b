"""Crafted model files: an exported model's metadata (``horizon_engine.model_card``) and a run
folder's ``check_rows.pt`` and ``problem.json`` give a clear error naming the file and the field,
never a traceback."""

from __future__ import annotations

import json
import pickle

import onnx
import pytest
import torch
from onnx import TensorProto, helper
from test_training import pipeline

from horizon_engine import (
    ActionBounds,
    HorizonError,
    ModelCard,
    ModelCardError,
    model_card_from_metadata,
    read_model_card,
)
from horizon_engine.builtin.gym_source import _onnx_greedy
from horizon_engine.pipeline import Engine
from horizon_plugins_serving.predictor import Predictor

GOOD = {
    "feature_ids": '["0", "1"]',
    "actions": "[]",
    "action_feature_ids": '["2", "3"]',
    "action_type": "continuous",
    "action_bounds": '{"low": [-2.0, null], "high": [2.0, null]}',
}


def model_file(path, metadata):
    """A model passing its two features through, with ``metadata`` as its properties."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["features"], ["action"])],
        "crafted",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for key, value in metadata.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, path)
    return path


CRAFTED = [
    ({"feature_ids": "[0, 1"}, "feature_ids", "is not valid JSON"),
    ({"feature_ids": '{"a": 1}'}, "feature_ids", "is not a JSON list of strings"),
    ({"feature_ids": "[0, 1]"}, "feature_ids", "is not a JSON list of strings"),
    ({"feature_ids": '"01"'}, "feature_ids", "is not a JSON list of strings"),
    ({"feature_ids": '["0", "0"]'}, "feature_ids", "lists '0' more than once"),
    ({"feature_ids": "[" * 100_000}, "feature_ids", "is not valid JSON"),
    ({"action_feature_ids": "null"}, "action_feature_ids", "names no action feature"),
    ({"action_type": "sideways"}, "action_type", "is not one of discrete, parametric"),
    ({"action_bounds": "{"}, "action_bounds", "is not valid JSON"),
    ({"action_bounds": "[1, 2]"}, "action_bounds", 'is not a JSON object {"low"'),
    ({"action_bounds": '{"low": [0, 0]}'}, "action_bounds", 'is not a JSON object {"low"'),
    ({"action_bounds": '{"low": [0], "high": [1]}'}, "action_bounds", "'low' is not a list of 2"),
    ({"action_bounds": '{"low": 0, "high": [1, 1]}'}, "action_bounds", "'low' is not a list"),
    (
        {"action_bounds": '{"low": ["a", 0], "high": [1, 1]}'},
        "action_bounds",
        "'low' holds a value that is not a finite number",
    ),
    (
        {"action_bounds": '{"low": [0, 0], "high": [NaN, 1]}'},
        "action_bounds",
        "'high' holds a value that is not a finite number",
    ),
    (
        {"action_bounds": '{"low": [0, true], "high": [1, 1]}'},
        "action_bounds",
        "'low' holds a value that is not a finite number",
    ),
    (
        {"action_bounds": '{"low": [0, 3], "high": [1, 1]}'},
        "action_bounds",
        "gives action feature 1 a low bound 3 above its high bound 1",
    ),
]


@pytest.mark.parametrize(("change", "key", "why"), CRAFTED)
def test_crafted_metadata_is_refused_naming_the_file_and_field(tmp_path, change, key, why):
    path = model_file(tmp_path / "model.onnx", {**GOOD, **change})
    for load in (Predictor, read_model_card):
        with pytest.raises(ModelCardError) as refused:
            load(path)
        assert str(refused.value).startswith(f"{path}: model metadata '{key}' {why}")


def test_a_discrete_model_without_actions_and_one_without_feature_ids_are_refused(tmp_path):
    with pytest.raises(ModelCardError, match="model metadata 'actions' names no action"):
        model_card_from_metadata({"feature_ids": '["0"]'}, "m.onnx")
    path = model_file(tmp_path / "model.onnx", {"actions": '["a"]'})
    with pytest.raises(ModelCardError, match=f"{path}: no feature_ids in the model's metadata"):
        Predictor(path)


def test_the_gym_source_reads_the_card_too(tmp_path):
    path = model_file(tmp_path / "model.onnx", {**GOOD, "action_feature_ids": "[2, 3]"})
    with pytest.raises(ModelCardError, match="'action_feature_ids' is not a JSON list"):
        _onnx_greedy(str(path), 2)


def test_a_file_that_is_no_model_is_refused(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01garbage")
    with pytest.raises(ModelCardError, match=f"{path}: not an ONNX model"):
        read_model_card(path)
    with pytest.raises(ModelCardError, match="no such model file"):
        read_model_card(tmp_path / "absent.onnx")


def test_a_card_reads_back_as_written(tmp_path):
    card = ModelCard(
        feature_ids=("0", "1"),
        action_feature_ids=("2", "3"),
        action_type="continuous",
        action_bounds=ActionBounds((-2.0, None), (2.0, None)),
        normalization={"state_features": {}},
        policy={"policy": "greedy"},
        run_id="abc",
        horizon_version="0.1.0",
    )
    read = read_model_card(model_file(tmp_path / "model.onnx", card.metadata()))
    assert read == card
    assert read.normalization == card.normalization and read.policy == card.policy


@pytest.fixture
def trained(trainer_host, tmp_path):
    """A finished run without an export, and the engine to export it with."""
    config = pipeline(tmp_path / "run")
    engine = Engine(plugins=trainer_host, show_progress=False)
    engine.run(config)
    config["export"] = {"kind": "onnx"}
    return engine, config, tmp_path / "run"


def test_crafted_check_rows_and_problem_files_stop_the_export_naming_file_and_field(trained):
    engine, config, run = trained
    rows_file, problem_file = run / "check_rows.pt", run / "problem.json"
    good = torch.load(rows_file, weights_only=True)
    problem = json.loads(problem_file.read_text())

    class Payload:
        def __reduce__(self):
            return (print, ("ran code from check_rows.pt",))

    crafted_rows = [
        (["not", "a", "dict"], "holds a list, not check rows by field"),
        ({**good, "state": good["state"].tolist()}, "field 'state' is not a float tensor"),
        ({"state_presence": good["state_presence"]}, "field 'state' is not a float tensor"),
        ({**good, "state": good["state"][:, :2]}, "field 'state' has shape"),
        ({**good, "state_presence": good["state_presence"][:5]}, "'state_presence' has shape"),
        ({**good, "state": good["state"].long()}, "field 'state' is not a float tensor"),
        ({**good, "state": good["state"][:0]}, "field 'state' has shape [0, 4]"),
    ]
    for rows, why in crafted_rows:
        torch.save(rows, rows_file)
        with pytest.raises(HorizonError) as refused:
            engine.run(config, stages=["export"])
        assert f"{rows_file}: " in str(refused.value) and why in str(refused.value)
    rows_file.write_bytes(pickle.dumps(Payload(), protocol=2))
    with pytest.raises(HorizonError, match="not check rows torch can load safely"):
        engine.run(config, stages=["export"])
    torch.save(good, rows_file)

    crafted_problems = [
        ({"feature_ids": 4}, "field 'feature_ids' is not a list of strings"),
        ({"actions": [0, 1]}, "field 'actions' is not a list of strings"),
        # An exported model serve refuses: an action index names one action.
        ({"actions": ["0", "0"]}, "field 'actions' lists '0' more than once"),
        ({"feature_ids": ["0", "1", "2", "0"]}, "field 'feature_ids' lists '0' more than once"),
        ({"n_step": 1.5}, "field 'n_step' is not a whole number"),
        ({"n_step": 0}, "field 'n_step' is below 1"),
        ({"max_feature_value": "big"}, "field 'max_feature_value' is not a number > 0"),
        ({"online": "yes"}, "field 'online' is not true or false"),
        ({"action_type": "sideways"}, "not a problem description ('sideways'"),
    ]
    for change, why in crafted_problems:
        problem_file.write_text(json.dumps({**problem, **change}))
        with pytest.raises(HorizonError) as refused:
            engine.run(config, stages=["export"])
        assert f"{problem_file}: not a problem description" in str(refused.value)
        assert why in str(refused.value)
    problem_file.write_text("[" * 100_000)
    with pytest.raises(HorizonError, match="not a problem description"):
        engine.run(config, stages=["export"])
    problem_file.write_text(json.dumps(problem))
    assert engine.run(config, stages=["export"])["stages"]["export"]["outputs"] == ["model.onnx"]
