"""Serving: the ``Predictor`` on a real exported CartPole model (scores as onnxruntime's,
greedy as the model's own ``action``, exploration's propensities as their formulas), the PID
send-rate controller, the decision log and ``horizon score``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from click.testing import CliRunner

from horizon_engine.cli import main
from horizon_engine.errors import HorizonError
from horizon_plugins_serving.decision_log import DecisionLog, decision_rows, read_decisions
from horizon_plugins_serving.predictor import (
    Exploration,
    Predictor,
    SendRateController,
    send_probabilities,
)

PIPELINE = """
[pipeline]
output_dir = "{output}"
seed = 0

[source]
kind = "gym"
env = "CartPole-v1"
episodes = 60
ds = "2019-01-01"

[timeline]
actions = ["0", "1"]
eval_fraction = 0.3

[normalization]

[trainer]
kind = "dqn"
epochs = 2
layers = [16]
threads = 1

[export]
kind = "onnx"
"""


def horizon(*arguments: object) -> str:
    result = CliRunner().invoke(main, [str(argument) for argument in arguments])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def cartpole_model(folder: Path) -> Path:
    """A small DQN on 60 random CartPole episodes (``PIPELINE``), exported to ONNX."""
    config = folder / "pipeline.toml"
    config.write_text(PIPELINE.format(output=folder / "run"))
    horizon("run", config)
    return folder / "run" / "model.onnx"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cartpole_model(tmp_path_factory.mktemp("serving"))


def states(count: int, seed: int = 0) -> list[dict[str, float]]:
    """CartPole-like raw feature maps; every fifth row lacks feature "2"."""
    rng = np.random.default_rng(seed)
    values = rng.normal(0.0, [0.1, 0.5, 0.1, 0.8], size=(count, 4))
    rows = [{str(i): float(v) for i, v in enumerate(row)} for row in values]
    for row in rows[::5]:
        del row["2"]
    return rows


def bare_outputs(model: Path, rows: list[dict[str, float]]) -> dict[str, np.ndarray]:
    """The model's own outputs, by a plain onnxruntime session on hand-built inputs."""
    features = np.zeros((len(rows), 4), np.float32)
    presence = np.zeros((len(rows), 4), np.float32)
    for i, row in enumerate(rows):
        for key, value in row.items():
            features[i, int(key)], presence[i, int(key)] = value, 1.0
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    outputs = session.run(None, {"features": features, "presence": presence})
    return dict(zip(names, outputs, strict=True))


def test_greedy_action_and_scores_are_the_models_own(model):
    rows = states(200)
    want = bare_outputs(model, rows)
    predictor = Predictor(model)
    assert predictor.feature_ids == ["0", "1", "2", "3"] and predictor.actions == ["0", "1"]
    assert predictor.fetch == ["scores"]
    result = predictor.predict(rows)
    np.testing.assert_array_equal(result.scores, want["scores"])
    assert result.actions == [predictor.actions[i] for i in want["action"]]
    np.testing.assert_array_equal(result.propensities, 1.0)


def test_epsilon_greedy_and_softmax_propensities_match_their_formulas(model):
    rows = states(300, seed=1)
    predictor = Predictor(model, seed=0)
    scores = predictor.predict(rows).scores.astype(np.float64)
    best = scores.argmax(axis=1)

    epsilon = predictor.predict(rows, exploration=Exploration("epsilon_greedy", epsilon=0.2))
    want = np.full(scores.shape, 0.1)
    want[np.arange(len(rows)), best] = 0.9
    np.testing.assert_allclose(epsilon.probabilities, want)

    softmax = predictor.predict(rows, exploration=Exploration("softmax", temperature=0.5))
    weights = np.exp(scores / 0.5)
    np.testing.assert_allclose(softmax.probabilities, weights / weights.sum(1, keepdims=True))

    for result in (epsilon, softmax):
        np.testing.assert_allclose(result.probabilities.sum(axis=1), 1.0)
        chosen = [predictor.action_index[action] for action in result.actions]
        np.testing.assert_array_equal(
            result.propensities, result.probabilities[np.arange(len(rows)), chosen]
        )
    # both actions are drawn, each about as often as its probability says
    explored = np.array([predictor.action_index[a] for a in epsilon.actions]) != best
    assert abs(explored.mean() - 0.1) < 0.05


def test_impossible_actions_are_never_chosen_and_get_no_probability(model):
    rows = states(400, seed=2)
    predictor = Predictor(model, Exploration("softmax", temperature=10.0), seed=3)
    possible = [["0"] if i % 3 == 0 else ["1"] if i % 3 == 1 else None for i in range(400)]
    result = predictor.predict(rows, possible)
    for row, allowed in enumerate(possible):
        if allowed is not None:
            assert result.actions[row] == allowed[0]
            assert result.propensities[row] == 1.0
    both = result.probabilities[2::3]
    assert np.all(both > 0) and {result.actions[i] for i in range(2, 400, 3)} == {"0", "1"}
    greedy = Predictor(model).predict(rows, possible)
    assert [greedy.actions[i] for i in range(0, 400, 3)] == ["0"] * 134


def test_seeded_predictors_draw_the_same_actions(model):
    rows = states(100)
    draws = [
        Predictor(model, Exploration("softmax", temperature=5.0), seed=7).predict(rows).actions
        for _ in range(2)
    ]
    assert draws[0] == draws[1]


def test_pid_controller_holds_the_send_rate_on_a_drifting_stream():
    """200-decision batches whose Q_send - Q_drop drifts from 0 to 3 plus a slow wave of 0.5:
    after 100 settling batches every 2,000-decision window sends within 2 points of 30%."""
    rng = np.random.default_rng(0)
    controller = SendRateController(target=0.3)
    rates = []
    for batch in range(600):
        mean = 3.0 * batch / 600 + 0.5 * np.sin(batch / 40)
        difference = rng.normal(mean, 1.0, 200)
        sent = rng.random(200) < send_probabilities(difference, controller.threshold)
        controller.update(sent)
        rates.append(sent.mean())
    windows = np.array(rates[100:]).reshape(-1, 10).mean(axis=1)
    assert np.abs(windows - 0.3).max() < 0.02, windows
    # without the controller the same stream ends far from the target
    assert send_probabilities(rng.normal(3.0, 1.0, 2000), 0.0).mean() > 0.8


def test_send_or_drop_logs_the_propensity_of_what_it_did(model):
    predictor = Predictor(model, seed=0)
    controller = SendRateController(target=0.5)
    result = predictor.send_or_drop(states(500), controller, send="1", drop="0", update=False)
    p_send = send_probabilities(result.scores[:, 1] - result.scores[:, 0], 0.0)
    sent = np.array(result.actions) == "1"
    np.testing.assert_allclose(result.propensities, np.where(sent, p_send, 1 - p_send))


def test_decision_log_round_trips_and_a_torn_last_line_is_cut_on_reopening(tmp_path, model):
    predictor = Predictor(model, Exploration("epsilon_greedy", epsilon=0.5), seed=0)
    rows = states(5)
    result = predictor.predict(rows)
    records = decision_rows(
        rows, result.actions, result.propensities, predictor.model_id, None, predictor.actions
    )
    path = tmp_path / "decisions.jsonl"
    with DecisionLog(path) as log:
        log.append(records[:3])
    with open(path, "ab") as handle:  # a crash in the middle of a record
        handle.write(json.dumps(records[3]).encode()[:40])
    assert read_decisions(path).torn_lines == [4]
    with DecisionLog(path) as log:  # the next writer cuts the unanswered request's torn line
        assert log.cut_torn_bytes == 40
        log.append(records[4:])
    contents = read_decisions(path)
    assert contents.rows == records[:3] + records[4:]
    assert contents.torn_lines == []
    first = contents.rows[0]
    assert first["mdp_id"] == first["decision_id"] and len(first["decision_id"]) == 32
    assert first["model_id"] == predictor.model_id and len(first["model_id"]) == 16
    assert first["possible_actions"] == ["0", "1"] and first["sequence_number"] == 0
    assert first["state_features"] == rows[0] and first["action"] in ("0", "1")
    assert first["action_probability"] in (0.25, 0.75)


def test_a_decision_log_reopened_keeps_a_whole_last_line_that_lost_only_its_newline(tmp_path):
    path = tmp_path / "decisions.jsonl"
    path.write_bytes(
        b'{"decision_id": "a"}\n{"pad": "' + b"x" * 70_000 + b'"}\n{"decision_id": "b"}'
    )
    with DecisionLog(path) as log:
        assert log.cut_torn_bytes == 0
        log.append([{"decision_id": "c"}])
    assert path.read_bytes().endswith(b'{"decision_id": "b"}\n{"decision_id":"c"}\n')


@pytest.mark.parametrize(
    "content",
    [
        bytes(range(256)) * 300,  # a binary file: no line end within reach, or no JSON
        b"ds,mdp_id\n2019-01-01,a\n",  # a CSV file: its last line is no JSON object
        b'{"decision_id": "a"}\nnot a row',  # a tail that is no JSON object's start
    ],
    ids=["binary", "csv", "foreign_tail"],
)
def test_a_file_that_is_no_decision_log_is_refused_untouched(tmp_path, content):
    """A log is appended to, and a torn last line cut off: a file named by mistake (a model,
    a CSV) is refused whole rather than cut or written into."""
    path = tmp_path / "not_a_log"
    path.write_bytes(content)
    with pytest.raises(HorizonError, match="does not end as a decision log does"):
        DecisionLog(path)
    assert path.read_bytes() == content


def test_a_decision_log_reopened_cuts_a_torn_line_longer_than_a_read_back_block(tmp_path):
    path = tmp_path / "decisions.jsonl"
    torn = b'{"decision_id": "b", "state_features": {"' + b"1" * 150_000
    path.write_bytes(b'{"decision_id": "a"}\n' + torn)
    with DecisionLog(path) as log:
        assert log.cut_torn_bytes == len(torn)
    assert path.read_bytes() == b'{"decision_id": "a"}\n'
    only_torn = tmp_path / "only_torn.jsonl"
    only_torn.write_bytes(torn)
    with DecisionLog(only_torn) as log:
        assert log.cut_torn_bytes == len(torn)
    assert only_torn.read_bytes() == b""


@pytest.mark.parametrize(
    ("spelling", "named"),
    [
        ("rows.jsonl", "rows file"),
        ("./sub/../rows.jsonl", "rows file"),
        ("SYMLINK", "rows file"),
        ("HARDLINK", "rows file"),
        ("MODEL", "model"),
    ],
)
def test_horizon_score_refuses_an_output_that_is_one_of_its_inputs(
    tmp_path, model, monkeypatch, spelling, named
):
    """``horizon score -o rows.jsonl`` replaced the rows it scored with its decisions (the
    join's defect 1, issue 33): every spelling of an input is refused, nothing changed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"state_features": row}) + "\n" for row in states(3)))
    copied = tmp_path / "model.onnx"
    copied.write_bytes(model.read_bytes())
    output = {
        "SYMLINK": tmp_path / "link.jsonl",
        "HARDLINK": tmp_path / "hard.jsonl",
        "MODEL": copied,
    }.get(spelling, Path(spelling))
    if spelling == "SYMLINK":
        output.symlink_to(rows)
    if spelling == "HARDLINK":
        os.link(rows, output)
    before = {path: path.read_bytes() for path in (rows, copied)}
    result = CliRunner().invoke(main, ["score", str(copied), "rows.jsonl", "-o", str(output)])
    assert result.exit_code == 1, result.output
    assert f"error: -o {output} is the {named} " in result.output
    assert "the score would replace it. Nothing was written" in result.output
    assert {path: path.read_bytes() for path in before} == before


def test_horizon_serve_refuses_a_log_that_is_its_model(tmp_path, model):
    """``--log`` is appended to: naming the model would have written decisions into it."""
    copied = tmp_path / "model.onnx"
    copied.write_bytes(model.read_bytes())
    for log, meets in ((copied, "is"), (copied / "decisions.jsonl", "lies inside")):
        result = CliRunner().invoke(main, ["serve", str(copied), "--log", str(log)])
        assert result.exit_code == 1, result.output
        assert f"error: --log {log} {meets} the model {copied}: the server would" in result.output
    assert copied.read_bytes() == model.read_bytes()


@pytest.mark.parametrize("name", ["decisions.jsonl", "decisions.parquet"])
def test_horizon_score_writes_a_decision_log(tmp_path, model, name):
    rows = states(30)
    lines = [
        json.dumps({"state_features": row, "mdp_id": f"m{i}", "sequence_number": i})
        for i, row in enumerate(rows)
    ]
    lines[4] = json.dumps({"state_features": rows[4], "possible_actions": ["0"]})
    source = tmp_path / "rows.jsonl"
    source.write_text("\n".join(lines) + "\n")
    output = tmp_path / "out" / name
    printed = horizon("score", model, source, "-o", output, "--policy", "softmax", "--seed", "1")
    assert output.is_dir() == name.endswith(".parquet")
    assert "scored 30 rows" in printed and "skipped 0 bad rows" in printed
    contents = read_decisions(output)
    assert len(contents.rows) == 30 and not contents.torn_lines
    assert contents.rows[4]["action"] == "0" and contents.rows[4]["action_probability"] == 1.0
    assert contents.rows[4]["possible_actions"] == ["0"]
    assert contents.rows[7]["mdp_id"] == "m7" and contents.rows[7]["sequence_number"] == 7
    want = Predictor(model, Exploration("softmax"), seed=1).predict(rows).probabilities
    chosen = [int(row["action"]) for row in contents.rows]
    logged = [row["action_probability"] for row in contents.rows]
    keep = [i for i in range(30) if i != 4]
    np.testing.assert_allclose(
        [logged[i] for i in keep], [want[i, chosen[i]] for i in keep], rtol=1e-6
    )


def test_horizon_score_names_bad_rows_and_skips_them_only_when_told(tmp_path, model):
    source = tmp_path / "rows.jsonl"
    good = json.dumps({"state_features": states(1)[0]})
    source.write_text(
        "\n".join(
            [
                good,
                "{not json",
                json.dumps({"state_features": {"0": "high"}}),
                json.dumps({"state_features": {"0": 0.1}, "possible_actions": ["7"]}),
                good,
            ]
        )
        + "\n"
    )
    output = tmp_path / "decisions.jsonl"
    result = CliRunner().invoke(main, ["score", str(model), str(source), "-o", str(output)])
    assert result.exit_code == 1 and "line 2: not JSON" in result.output
    assert not output.exists()
    printed = horizon("score", model, source, "-o", output, "--skip-bad-rows")
    assert "scored 2 rows" in printed and "skipped 3 bad rows" in printed
    assert "line 3: state feature '0': expected a number, found 'high'" in printed
    assert "line 4: possible action(s) ['7']" in printed
    assert len(read_decisions(output).rows) == 2


def test_scoring_imports_neither_torch_nor_spark(model):
    code = (
        "import sys\n"
        "from horizon_plugins_serving.predictor import Predictor\n"
        f"Predictor({str(model)!r}).predict([{{'0': 0.1}}])\n"
        "print(sorted(m for m in ('torch', 'pyspark') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def parametric_model(run: Path) -> Path:
    """A parametric_dqn trained for an epoch on random CartPole whose actions are one-hot
    action features ("4", "5"), exported to ``run/model.onnx``."""
    from horizon_engine.pipeline import Engine

    config = {
        "pipeline": {"output_dir": str(run), "seed": 0},
        "source": {
            "kind": "gym",
            "env": "CartPole-v1",
            "policy": "random",
            "episodes": 20,
            "parametric_actions": True,
        },
        "timeline": {"reward": {"reward": 1.0}},
        "normalization": {"quantiles": False},
        "trainer": {"kind": "parametric_dqn", "epochs": 1, "threads": 1},
        "export": {"kind": "onnx"},
    }
    Engine(show_progress=False).run(config)
    return run / "model.onnx"


def test_parametric_model_scores_each_rows_candidates_and_never_chooses_padding(tmp_path):
    model = parametric_model(tmp_path / "run")
    predictor = Predictor(model, Exploration("softmax", temperature=10.0), seed=0)
    assert predictor.parametric and predictor.action_feature_ids == ["4", "5"]
    rows = states(60)
    one, two = {"4": 1.0, "5": 0.0}, {"4": 0.0, "5": 1.0}
    candidates = [[one, two, one] if i % 2 else [two] for i in range(60)]
    result = predictor.predict(rows, candidates=candidates)
    assert all(result.actions[i] == 0 for i in range(0, 60, 2))  # one candidate: no choice
    np.testing.assert_allclose(result.probabilities[::2, 1:], 0.0)
    assert {result.actions[i] for i in range(1, 60, 2)} == {0, 1, 2}

    features, presence = predictor.state_arrays(rows)
    values, candidate_presence, mask = predictor.candidate_arrays(candidates)
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    scores, _, action = session.run(
        None,
        {
            "features": features,
            "presence": presence,
            "candidates": values,
            "candidate_presence": candidate_presence,
            "candidate_mask": mask,
        },
    )
    np.testing.assert_array_equal(result.scores, scores)
    greedy = predictor.predict(rows, candidates=candidates, exploration=Exploration())
    assert greedy.actions == action.tolist()

    # horizon score logs the chosen candidate's map, and needs the candidates
    source = tmp_path / "rows.jsonl"
    lines = [
        {"state_features": row, "possible_actions": offered}
        for row, offered in zip(rows, candidates, strict=True)
    ]
    source.write_text("\n".join(map(json.dumps, [*lines, {"state_features": rows[0]}])) + "\n")
    output = tmp_path / "decisions.jsonl"
    printed = horizon("score", model, source, "-o", output, "--skip-bad-rows")
    assert "line 61: a parametric model needs possible_actions" in printed
    logged = read_decisions(output).rows
    assert [row["action"] for row in logged] == [
        offered[i] for offered, i in zip(candidates, greedy.actions, strict=True)
    ]
    assert logged[1]["possible_actions"] == [one, two, one]


def continuous_model(path: Path) -> Path:
    """A stand-in continuous actor with an exported model's inputs, outputs and metadata:
    ``action = features @ W`` and ``log_density = sum(action)``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(
        np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], np.float32), "W"
    )
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["features", "W"], ["action"]),
            helper.make_node("ReduceSum", ["action", "axes"], ["log_density"], keepdims=0),
        ],
        "actor",
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 3])
            for name in ("features", "presence")
        ],
        [
            helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("log_density", TensorProto.FLOAT, ["batch"]),
        ],
        [weights, axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    metadata = {
        "feature_ids": '["0", "1", "2"]',
        "actions": "[]",
        "action_feature_ids": '["3", "4"]',
        "action_type": "continuous",
        "action_bounds": '{"low": [-2.0, -2.0], "high": [2.0, 2.0]}',
    }
    for key, value in metadata.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, path)
    return path


def test_a_continuous_actor_gives_its_action_vector_and_density(tmp_path):
    predictor = Predictor(continuous_model(tmp_path / "model.onnx"))
    assert predictor.continuous and predictor.fetch == ["action", "log_density"]
    assert predictor.action_bounds == {"low": [-2.0, -2.0], "high": [2.0, 2.0]}
    result = predictor.predict([{"0": 0.5, "1": 0.25, "2": -0.5}, {"1": 1.0, "9": 7.0}])
    np.testing.assert_allclose(np.array(result.actions), [[0.0, 0.0], [0.0, 2.0]])
    np.testing.assert_allclose(result.propensities, [1.0, np.exp(2.0)], rtol=1e-6)

    source = tmp_path / "rows.jsonl"
    source.write_text(json.dumps({"state_features": {"1": 1.0}}) + "\n")
    horizon("score", tmp_path / "model.onnx", source, "-o", tmp_path / "decisions.jsonl")
    (logged,) = read_decisions(tmp_path / "decisions.jsonl").rows
    assert logged["action"] == {"3": 0.0, "4": 2.0} and "possible_actions" not in logged
    assert logged["action_probability"] == pytest.approx(np.exp(2.0))
