"""The timeline stage's view of the rows: action names from Horizon's masks, reward weights
that name unlogged metrics, unknown actions at their file and line, and no rows left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_reference_data import _reference_file

from horizon_engine.errors import ConfigError, HorizonError
from horizon_engine.pipeline import Engine


@pytest.fixture
def engine() -> Engine:
    return Engine(show_progress=False)


def write_rows(path: Path, episodes: int = 4, steps: int = 5, **changes: object) -> Path:
    """Pre-timeline rows with actions "0"/"1" and a ``reward`` metric; ``changes`` maps a
    field to a function of (episode, step) giving its value (None leaves the field out)."""
    lines = []
    for episode in range(episodes):
        for step in range(steps):
            row = {
                "mdp_id": str(episode),
                "sequence_number": step,
                "state_features": {"0": float(step), "1": float(episode)},
                "action": str(step % 2),
                "action_probability": 0.5,
                "reward": 1.0,
                "possible_actions": ["0", "1"],
                "metrics": {"reward": 1.0},
            }
            for name, value_of in changes.items():
                value = value_of(episode, step)
                if value is None:
                    row.pop(name)
                else:
                    row[name] = value
            lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def jsonl_pipeline(rows: Path, output_dir: Path, **timeline: object) -> dict:
    return {
        "pipeline": {"output_dir": str(output_dir)},
        "source": {"kind": "jsonl", "path": str(rows)},
        "timeline": {"eval_fraction": 0.0, **timeline},
    }


def test_horizons_discrete_timeline_rows_need_no_action_names(engine, tmp_path):
    """Horizon's rows number their actions and say how many in every mask: the names are
    "0" and "1", and the dqn trainer runs on them (it crashed reshaping masks to width 0)."""
    rows = _reference_file("discrete_action/cartpole_training.json.bz2")
    config = {
        "pipeline": {"output_dir": str(tmp_path / "run")},
        "source": {"kind": "jsonl", "path": str(rows)},
        "timeline": {},
        "normalization": {},
        "trainer": {"kind": "dqn", "epochs": 1, "n_step": 1},
    }
    manifest = engine.run(config)
    assert manifest["stages"]["timeline"]["details"]["actions"] == ["0", "1"]
    info = json.loads((tmp_path / "run" / "timeline" / "timeline.json").read_text())
    assert info["actions"] == ["0", "1"]
    assert info["n_step"] == 1  # timeline rows hold no n-step windows
    assert manifest["stages"]["train"]["rows_in"] > 0
    config["timeline"] = {"actions": ["left", "right", "stay"]}
    with pytest.raises(ConfigError, match="names 3 actions, but the rows' possible_actions"):
        engine.run(config, overwrite=True)


def test_logged_action_names_without_actions_are_the_names_the_rows_log(engine, tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl")
    manifest = engine.run(jsonl_pipeline(rows, tmp_path / "run"))
    details = manifest["stages"]["timeline"]["details"]
    assert details["actions"] == ["0", "1"]
    assert details["actions_from"] == "every name the rows log (whole numbers first, by value)"


def test_a_reward_weight_for_a_metric_no_row_carries_is_an_error(engine, tmp_path):
    pipeline_file = tmp_path / "pipeline.toml"
    rows = write_rows(tmp_path / "rows.jsonl")
    pipeline_file.write_text(
        f'[pipeline]\noutput_dir = "{tmp_path / "run"}"\n\n'
        f'[source]\nkind = "jsonl"\npath = "{rows}"\n\n'
        '[timeline]\nactions = ["0", "1"]\nreward = { clicks = 1.0 }\n'
    )
    with pytest.raises(ConfigError) as caught:
        engine.run(pipeline_file)
    assert str(caught.value) == (
        f"{pipeline_file}:10: [timeline] reward weighs metric 'clicks', which none of the 20 "
        "rows carries in 'metrics' (the rows carry: 'reward')"
    )
    assert not (tmp_path / "run" / "timeline").exists()


def test_a_reward_weight_for_a_metric_some_rows_lack_is_a_warning(engine, tmp_path):
    def metrics(episode: int, step: int) -> dict:
        return {"reward": 1.0, **({"clicks": 2.0} if step < 3 else {})}

    rows = write_rows(tmp_path / "rows.jsonl", metrics=metrics)
    config = jsonl_pipeline(rows, tmp_path / "run", actions=["0", "1"], reward={"clicks": 1.0})
    manifest = engine.run(config)
    # The window built by default, recorded for the trainer (and preflight) to follow.
    info = json.loads((tmp_path / "run" / "timeline" / "timeline.json").read_text())
    assert info["n_step"] == 3
    assert manifest["stages"]["timeline"]["warnings"] == [
        "reward weight 'clicks': 8 of 20 rows carry no 'clicks' metric; it counts as 0 there"
    ]


def test_an_unknown_action_is_one_line_at_the_users_file_and_line(engine, tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", action=lambda episode, step: "2" if step else "0")
    config = jsonl_pipeline(rows, tmp_path / "run", actions=["0", "1"])
    with pytest.raises(HorizonError) as caught:
        engine.run(config)
    lines = str(caught.value).splitlines()
    assert lines[:2] == [
        "16 bad rows (unknown_action: 16):",
        f"  {rows}:2: action '2' is not in [timeline] actions ['0', '1'] (and 15 more rows "
        "like it)",
    ]
    assert len(lines) == 3
    config["pipeline"]["on_bad_rows"] = "quarantine"
    manifest = engine.run(config)
    assert manifest["stages"]["source"]["dropped"] == {"unknown_action": 16}
    quarantined = (tmp_path / "run" / "source" / "quarantine.jsonl").read_text().splitlines()
    assert json.loads(quarantined[0])["location"] == f"{rows}:2"


def test_no_rows_left_is_an_error_at_the_stage_that_lost_them(engine, tmp_path):
    """Every row quarantined: the source stage says so and keeps the quarantine to read,
    rather than normalization writing an empty file and training failing on None."""
    rows = write_rows(tmp_path / "rows.jsonl", action_probability=lambda episode, step: 2.0)
    config = jsonl_pipeline(rows, tmp_path / "run", actions=["0", "1"])
    config["pipeline"]["on_bad_rows"] = "quarantine"
    config["normalization"] = {}
    with pytest.raises(HorizonError, match=r"^\[source\] every one of the 20 rows read was bad"):
        engine.run(config)
    source = tmp_path / "run" / "source"
    assert sorted(path.name for path in source.iterdir()) == ["quarantine.jsonl"]
    assert not (tmp_path / "run" / "normalization.json").exists()

    kept = write_rows(tmp_path / "kept.jsonl")
    config = jsonl_pipeline(kept, tmp_path / "kept", actions=["0", "1"], eval_fraction=0.99)
    config["normalization"] = {}
    expected = (
        r"^\[timeline\] no training rows are left: of the 20 rows in .*rows.parquet, 20 went "
        "to the eval split$"
    )
    with pytest.raises(HorizonError, match=expected):
        engine.run(config)
    assert not (tmp_path / "kept" / "timeline").exists()
