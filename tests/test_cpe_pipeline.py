"""CPE in a real run: ``[[evaluation]]`` entries of the ``cpe`` plugin after every epoch and in
the evaluation stage, ``cpe.json``, the TensorBoard scalars, the table ``horizon run`` prints,
and ``horizon evaluate`` on a finished run, on its own eval split and on another run's."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from horizon_engine.cli import main
from horizon_engine.pipeline import Engine

ESTIMATE_FIELDS = {
    "value",
    "low",
    "high",
    "logged_value",
    "relative",
    "relative_low",
    "relative_high",
    "effective_sample_size",
    "note",
    "difference_low",
    "difference_high",
    "unit",
    "diagnostics",
    "warnings",
}
EVERY_KIND = ["dm", "ips", "snips", "dr", "sequential_dr", "weighted_dr", "magic", "fqe", "mis"]


def pipeline_toml(tmp_path: Path, name: str, seed: int, evaluation: str, extra: str = "") -> Path:
    """A small CartPole run: 60 random episodes, a third held out, two epochs of a small DQN."""
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f"""
[pipeline]
output_dir = "{tmp_path / name}"
seed = {seed}

[source]
kind = "gym"
env = "CartPole-v1"
episodes = 60
ds = "2019-01-01"
{extra}

[timeline]
actions = ["0", "1"]
eval_fraction = 0.3

[normalization]

[trainer]
kind = "dqn"
epochs = 2
layers = [16]
threads = 1
{evaluation}
"""
    )
    return path


EVALUATION = """
[[evaluation]]
kind = "logged_value"

[[evaluation]]
kind = "dr"

[[evaluation]]
kind = "weighted_dr"
num_bootstrap = 50

[[evaluation]]
kind = "ips"
policy = "epsilon_greedy"
epsilon = 0.1
weight_clip = 20.0

[[evaluation]]
kind = "magic"
every_epoch = false
"""


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """The TensorBoard event files' scalars by tag: TFRecord framing around Event protos."""
    from tensorboardX.proto.event_pb2 import Event

    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, position = path.read_bytes(), 0
        while position < len(data):
            (length,) = struct.unpack("<Q", data[position : position + 8])
            event = Event.FromString(data[position + 12 : position + 12 + length])
            position += 12 + length + 4
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def horizon(*arguments: str) -> str:
    result = CliRunner().invoke(main, [str(argument) for argument in arguments])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A finished run with five entries, and what `horizon run` printed."""
    tmp_path = tmp_path_factory.mktemp("cpe")
    output = horizon("run", pipeline_toml(tmp_path, "run", 0, EVALUATION))
    return tmp_path / "run", output


def test_cpe_json_holds_every_entry_per_metric_with_intervals_and_each_epoch(finished):
    run, _ = finished
    record = json.loads((run / "cpe.json").read_text())

    assert set(record) == {"eval_rows", "episodes", "entries", "final", "verdict", "epochs"}
    assert record["episodes"] >= 10
    assert list(record["entries"]) == ["logged_value", "dr", "weighted_dr", "ips", "magic"]
    for label in ("dr", "weighted_dr", "ips", "magic"):
        estimate = record["final"][label]["reward"]
        assert set(estimate) == ESTIMATE_FIELDS
        assert estimate["low"] <= estimate["value"] <= estimate["high"]
        assert estimate["relative"] == pytest.approx(estimate["value"] / estimate["logged_value"])
        details = record["entries"][label]["details"]
        assert details["gamma"] == 0.99 and details["gamma_from"] == "trainer"
        assert details["seed"] == 0
    assert record["entries"]["ips"]["options"]["weight_clip"] == 20.0
    assert record["entries"]["ips"]["options"]["policy"] == "epsilon_greedy"
    assert record["entries"]["weighted_dr"]["details"]["num_bootstrap"] == 50
    # dqn offers its hidden layer (q_features): Q by bounded FQE on it
    assert record["entries"]["weighted_dr"]["details"]["q_model"] == "network_fqe"
    assert record["final"]["logged_value"]["reward_per_episode"] > 0
    # Sequential estimates are per episode, one-step ones per decision.
    assert record["final"]["weighted_dr"]["reward"]["logged_value"] > 5
    assert record["final"]["dr"]["reward"]["logged_value"] == pytest.approx(1.0)

    assert [epoch["epoch"] for epoch in record["epochs"]] == [1, 2]
    assert sorted(record["epochs"][-1]["estimates"]) == ["dr", "ips", "logged_value", "weighted_dr"]
    assert record["epochs"] == json.loads((run / "cpe_epochs.json").read_text())["epochs"]

    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["stages"]["evaluation"]["outputs"] == ["cpe.json"]
    assert "cpe_epochs.json" in manifest["stages"]["train"]["outputs"]


def test_tensorboard_has_each_metric_by_estimator_relative_and_raw(finished):
    run, _ = finished
    tags = scalars(run / "tensorboard")
    epochs = json.loads((run / "cpe.json").read_text())["epochs"]

    for label in ("dr", "weighted_dr", "ips"):
        assert [step for step, _ in tags[f"CPE/reward/{label}"]] == [1, 2]
        last = epochs[-1]["estimates"][label]["reward"]
        assert tags[f"CPE/reward/{label}"][-1][1] == pytest.approx(last["relative"], rel=1e-6)
        assert tags[f"CPE/reward/{label}/raw"][-1][1] == pytest.approx(last["value"], rel=1e-6)
    assert "CPE/logged_value/reward_per_episode" in tags
    assert not any("magic" in tag for tag in tags), "magic runs in the evaluation stage only"


def test_horizon_run_prints_the_estimates_table(finished):
    run, output = finished
    final = json.loads((run / "cpe.json").read_text())["final"]

    assert "relative [interval]" in output and "ESS" in output
    dr = final["dr"]["reward"]
    line = next(line for line in output.splitlines() if line.startswith("reward  dr "))
    assert f"{dr['relative']:.3f} [{dr['relative_low']:.3f}, {dr['relative_high']:.3f}]" in line
    for label in ("weighted_dr", "ips", "magic"):
        assert any(line.startswith(f"reward  {label} ") for line in output.splitlines())
    assert "logged_value: episodes " in output
    assert output.index("relative [interval]") < output.index("run ")


def test_horizon_evaluate_runs_the_runs_entries_on_its_eval_split(finished):
    run, _ = finished
    before = (run / "cpe.json").read_text()

    output = horizon("evaluate", run)

    written = json.loads((run / "cpe_evaluate.json").read_text())
    final = json.loads(before)["final"]
    assert written["data"] == str(run / "timeline" / "eval")
    assert list(written["entries"]) == ["logged_value", "dr", "weighted_dr", "ips", "magic"]
    # The same checkpoint, rows and seeds: the same figures as the evaluation stage's.
    for label in ("dr", "weighted_dr", "magic"):
        assert figures(written["final"][label]["reward"]) == pytest.approx(
            figures(final[label]["reward"])
        )
        assert written["final"][label]["reward"]["warnings"] == final[label]["reward"]["warnings"]
    assert written["verdict"] == json.loads(before)["verdict"]
    assert "relative [interval]" in output and f"wrote {run / 'cpe_evaluate.json'}" in output
    assert (run / "cpe.json").read_text() == before


def test_horizon_evaluate_on_another_runs_timeline(finished, tmp_path):
    run, _ = finished
    other = pipeline_toml(tmp_path, "other", 7, "")
    Engine(show_progress=False).run(other, stages=["source", "timeline"])
    target = tmp_path / "estimates.json"

    horizon(
        "evaluate", run, "--data", tmp_path / "other", "-o", target, "--set", "evaluation.1.seed=3"
    )

    written = json.loads(target.read_text())
    info = json.loads((tmp_path / "other" / "timeline" / "timeline.json").read_text())
    assert written["data"] == str(tmp_path / "other" / "timeline" / "eval")
    assert written["eval_rows"] == info["eval_rows"]
    assert written["final"]["dr"]["reward"]["value"] > 0
    assert written["entries"]["dr"]["details"]["seed"] == 3


def test_horizon_evaluate_replaces_only_a_record_it_wrote(finished, tmp_path):
    """``horizon evaluate RUN -o RUN/manifest.json`` replaced the run's manifest with the
    estimates (issue 33's class of defect): a file at ``-o`` is replaced only when it is a
    record the command wrote."""
    run, _ = finished
    manifest = (run / "manifest.json").read_bytes()
    mine = tmp_path / "mine.json"
    mine.write_text('{"my": "notes"}')
    for target in (run / "manifest.json", mine):
        result = CliRunner().invoke(main, ["evaluate", str(run), "-o", str(target)])
        assert result.exit_code == 1, result.output
        assert f"error: -o {target}: there is a file there that horizon evaluate" in result.output
    assert (run / "manifest.json").read_bytes() == manifest
    assert mine.read_text() == '{"my": "notes"}'
    again = tmp_path / "estimates.json"
    horizon("evaluate", run, "-o", again)
    horizon("evaluate", run, "-o", again)  # its own record: replaced


def test_horizon_evaluate_names_features_the_other_data_lacks(finished, tmp_path):
    run, _ = finished
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps(
                {
                    "mdp_id": f"u{episode}",
                    "sequence_number": step,
                    "state_features": {"0": 1.0, "9": 2.0},
                    "action": "1",
                    "action_probability": 0.5,
                    "possible_actions": ["0", "1"],
                    "reward": 1.0,
                }
            )
            for episode in range(20)
            for step in range(3)
        )
        + "\n"
    )
    config = {
        "pipeline": {"output_dir": str(tmp_path / "other")},
        "source": {"kind": "jsonl", "path": str(rows)},
        "timeline": {"actions": ["0", "1"], "eval_fraction": 0.5},
    }
    Engine(show_progress=False).run(config)

    result = CliRunner().invoke(main, ["evaluate", str(run), "--data", str(tmp_path / "other")])

    assert result.exit_code == 1
    assert "no row has the state feature(s) ['1', '2', '3']" in result.output


def figures(estimate: dict) -> dict:
    """An estimate's numbers (pytest.approx compares no nested dictionaries)."""
    return {name: value for name, value in estimate.items() if isinstance(value, float)}


def test_horizon_evaluate_runs_every_cpe_estimator_for_a_run_without_entries(tmp_path):
    """A run folder whose config records no [[evaluation]] (one written before pipelines got
    default estimators): every CPE estimator."""
    horizon("run", pipeline_toml(tmp_path, "plain", 1, ""))
    manifest_path = tmp_path / "plain" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["config"]["evaluation"]
    manifest_path.write_text(json.dumps(manifest))

    output = horizon("evaluate", tmp_path / "plain", "--set", "evaluation.0.num_bootstrap=20")

    written = json.loads((tmp_path / "plain" / "cpe_evaluate.json").read_text())
    assert list(written["entries"]) == EVERY_KIND
    assert written["entries"]["dm"]["details"]["num_bootstrap"] == 20
    assert all(set(written["final"][kind]["reward"]) == ESTIMATE_FIELDS for kind in EVERY_KIND)
    assert sum(line.startswith("reward  ") for line in output.splitlines()) == len(EVERY_KIND)


def test_parametric_actions_are_evaluated_too(tmp_path):
    evaluation = '\n[[evaluation]]\nkind = "weighted_dr"\n\n[[evaluation]]\nkind = "snips"\n'
    config = pipeline_toml(tmp_path, "parametric", 2, evaluation, "parametric_actions = true")
    text = (
        config.read_text()
        .replace('actions = ["0", "1"]\n', "")
        .replace('"dqn"', '"parametric_dqn"')
    )
    config.write_text(text)

    manifest = Engine(show_progress=False).run(config)

    final = json.loads((tmp_path / "parametric" / "cpe.json").read_text())["final"]
    assert set(final) == {"weighted_dr", "snips"}
    assert final["snips"]["reward"]["value"] == pytest.approx(1.0)  # every CartPole reward is 1
    assert "CPE/reward/weighted_dr" in manifest["stages"]["train"]["details"]["last_epoch"]


def evaluate_error(*arguments: object) -> str:
    result = CliRunner().invoke(main, ["evaluate", *[str(argument) for argument in arguments]])
    assert result.exit_code == 1, result.output
    return result.output


def test_horizon_evaluate_refuses_other_actions_an_unfinished_training_and_a_gym_run(
    finished, tmp_path
):
    run, _ = finished
    other = pipeline_toml(tmp_path, "other", 7, "")
    other.write_text(other.read_text().replace('actions = ["0", "1"]', 'actions = ["1", "0"]'))
    Engine(show_progress=False).run(other, stages=["source", "timeline"])
    assert "its actions are ['1', '0'], the run's policy was trained on ['0', '1']" in (
        evaluate_error(run, "--data", tmp_path / "other")
    )

    copied = tmp_path / "copied"
    copied.mkdir()
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["incomplete_stages"] = {"train": "run x failed during it"}
    (copied / "manifest.json").write_text(json.dumps(manifest))
    assert "its training is incomplete (run x failed during it)" in evaluate_error(copied)

    gym = tmp_path / "gym"
    gym.mkdir()
    (gym / "manifest.json").write_text(json.dumps({"config": {"gym": {"env": "CartPole-v1"}}}))
    assert "not the folder of a `horizon run` that trained a policy" in evaluate_error(gym)


def test_the_evaluation_stage_run_again_keeps_the_epochs_of_the_training(finished, tmp_path):
    run, _ = finished
    copied = tmp_path / "run"
    shutil.copytree(run, copied)
    manifest = json.loads((copied / "manifest.json").read_text())
    config = manifest["config"]
    config["pipeline"]["output_dir"] = str(copied)
    config["evaluation"] = [{"kind": "snips"}]

    Engine(show_progress=False).run(config, stages=["evaluation"])

    record = json.loads((copied / "cpe.json").read_text())
    assert list(record["final"]) == ["snips"]
    assert len(record["epochs"]) == 2 and "dr" in record["epochs"][0]["estimates"]
