"""The pipeline runner: stages in order, the manifest, --stages, and no half-written outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import horizon_engine
from horizon_engine.errors import ConfigError, HorizonError
from horizon_engine.files import atomic_output
from horizon_engine.pipeline import Engine

EPISODES = 5


def gym_config(output_dir: Path, **source: object) -> dict:
    return {
        "pipeline": {"output_dir": str(output_dir), "seed": 3, "name": "smoke"},
        "source": {
            "kind": "gym",
            "env": "CartPole-v1",
            "episodes": EPISODES,
            "ds": "2019-01-01",
            **source,
        },
    }


@pytest.fixture
def engine() -> Engine:
    return Engine(show_progress=False)


def test_manifest_records_config_plugins_counts_timings_and_seed(engine, tmp_path):
    manifest = engine.run(gym_config(tmp_path / "run"))
    on_disk = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert on_disk == json.loads(json.dumps(manifest))
    assert manifest["status"] == "succeeded"
    assert manifest["horizon_version"] == horizon_engine.__version__
    assert manifest["seed"] == 3
    assert manifest["name"] == "smoke"
    assert manifest["config"]["source"]["kind"] == "gym"
    assert manifest["config"]["source"]["episodes"] == EPISODES
    assert manifest["config"]["pipeline"]["on_bad_rows"] == "fail"
    assert manifest["plugins"]["sources"] == horizon_engine.__version__
    source = manifest["stages"]["source"]
    rows = pq.read_table(tmp_path / "run" / "source" / "rows.parquet")
    assert source["rows_in"] == source["rows_out"] == rows.num_rows
    assert rows.column("mdp_id").unique().to_pylist() == [str(i) for i in range(EPISODES)]
    assert source["dropped"] == {}
    assert source["seconds"] >= 0
    assert source["details"] == {"row_format": "pre_timeline", "action_type": "discrete"}


def test_same_seed_same_rows_and_toml_equals_dict(engine, tmp_path):
    toml = tmp_path / "pipeline.toml"
    toml.write_text(
        f'[pipeline]\noutput_dir = "{tmp_path / "a"}"\nseed = 3\n\n'
        f'[source]\nkind = "gym"\nepisodes = {EPISODES}\nds = "2019-01-01"\n'
    )
    engine.run(toml)
    engine.run(gym_config(tmp_path / "b"))
    first = pq.read_table(tmp_path / "a" / "source" / "rows.parquet")
    second = pq.read_table(tmp_path / "b" / "source" / "rows.parquet")
    assert first.equals(second)


def test_overrides_change_the_resolved_config(engine, tmp_path):
    manifest = engine.run(
        gym_config(tmp_path / "run"), overrides=["source.episodes=2", "pipeline.seed=11"]
    )
    assert manifest["config"]["source"]["episodes"] == 2
    assert manifest["seed"] == 11
    assert manifest["stages"]["source"]["rows_out"] > 0


def test_stages_subset_keeps_earlier_stage_records(engine, tmp_path):
    engine.run(gym_config(tmp_path / "run"))
    again = engine.run(gym_config(tmp_path / "run"), stages=["source"])
    assert again["executed"] == ["source"]
    # The first run's page, kept, reads the rows this run replaced (it reads every stage's).
    assert sorted(again["stages"]) == ["report", "source"]
    assert "source" in again["stages"]["report"]["stale"]
    with pytest.raises(ConfigError, match="unknown stage 'trian'"):
        engine.run(gym_config(tmp_path / "run"), stages=["trian"])


def test_pipeline_stages_key_selects_stages_like_the_option(engine, tmp_path):
    config = gym_config(tmp_path / "run")
    config["pipeline"]["stages"] = ["source"]
    assert engine.validate(config).pipeline.stages == ["source"]
    config["pipeline"]["stages"] = ["timeline"]
    with pytest.raises(ConfigError, match="stage 'timeline' has no \\[timeline\\] section"):
        engine.run(config)


def test_a_failing_stage_leaves_no_output_and_a_failed_manifest(engine, tmp_path):
    with pytest.raises(HorizonError, match="CartPole-v999"):
        engine.run(gym_config(tmp_path / "run", env="CartPole-v999"))
    run_dir = tmp_path / "run"
    assert sorted(path.name for path in run_dir.iterdir()) == ["manifest.json"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert "CartPole-v999" in manifest["error"]


def test_atomic_output_replaces_a_folder_only_when_complete(tmp_path):
    target = tmp_path / "out"
    with atomic_output(target) as folder:
        folder.mkdir()
        (folder / "a.txt").write_text("first")
    with pytest.raises(RuntimeError), atomic_output(target) as folder:
        folder.mkdir()
        (folder / "a.txt").write_text("half")
        raise RuntimeError("crash while writing")
    assert (target / "a.txt").read_text() == "first"
    assert [path.name for path in tmp_path.iterdir()] == ["out"]
    with atomic_output(target) as folder:
        folder.mkdir()
        (folder / "b.txt").write_text("second")
    assert sorted(path.name for path in target.iterdir()) == ["b.txt"]
    assert [path.name for path in tmp_path.iterdir()] == ["out"]


def test_run_pipeline_is_the_same_as_engine_run(tmp_path):
    manifest = horizon_engine.run_pipeline(gym_config(tmp_path / "run", episodes=1))
    assert manifest["status"] == "succeeded"


def test_bad_rows_are_reported_in_line_order_whatever_check_found_them(engine, tmp_path):
    row = {
        "mdp_id": "0",
        "state_features": {"0": 1.0},
        "action": "0",
        "reward": 1.0,
        "action_probability": 0.5,
    }
    lines = [
        json.dumps({**row, "sequence_number": 0}),
        json.dumps({**row, "sequence_number": 1, "action_probability": 2.0}),
        *(json.dumps({**row, "sequence_number": step}) for step in range(2, 9)),
        "not json",
        json.dumps({**row, "sequence_number": "eleven"}),
    ]
    (tmp_path / "rows.jsonl").write_text("\n".join(lines) + "\n")
    config = {
        "pipeline": {"output_dir": str(tmp_path / "run")},
        "source": {"kind": "jsonl", "path": str(tmp_path / "rows.jsonl")},
    }
    with pytest.raises(HorizonError) as caught:
        engine.run(config)
    located = [line.split(": ")[0].strip() for line in str(caught.value).splitlines()[1:4]]
    rows_file = tmp_path / "rows.jsonl"
    assert located == [f"{rows_file}:2", f"{rows_file}:10", f"{rows_file}:11"]
