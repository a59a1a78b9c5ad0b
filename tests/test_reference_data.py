"""Compatibility with real files that Facebook's Horizon itself wrote (its Timeline output).

The files live outside the repository (see ``shared/reference-data/README.md``): at
``$HORIZON_REFERENCE_DATA``, or else ``<repo>/../shared/reference-data``. Each is read as it is
through the ``jsonl`` source stage, and the Parquet it writes is compared with the raw JSON:
row counts, column types, every row's values, and the terminal rows Horizon marked.
"""

from __future__ import annotations

import bz2
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from horizon_engine.pipeline import Engine

FEATURES = pa.map_(pa.string(), pa.float64())


def _reference_root() -> Path:
    configured = os.environ.get("HORIZON_REFERENCE_DATA")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2] / "shared" / "reference-data"


ROOT = _reference_root()


def _reference_file(relative: str) -> Path:
    path = ROOT / "reagent" / relative
    if not path.is_file():
        pytest.skip(
            f"reference data not found: looked for {path} "
            "(set HORIZON_REFERENCE_DATA to the folder holding reagent/)"
        )
    return path


def _raw_rows(path: Path) -> list[dict[str, Any]]:
    opener = bz2.open if path.suffix == ".bz2" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


class Read:
    """A reference file read through the source stage: the manifest, the table, the raw rows."""

    def __init__(self, relative: str, output_dir: Path) -> None:
        self.path = _reference_file(relative)
        config = {
            "pipeline": {"output_dir": str(output_dir)},
            "source": {"kind": "jsonl", "path": str(self.path)},
        }
        self.manifest = Engine(show_progress=False).run(config)
        self.report = self.manifest["stages"]["source"]
        self.table = pq.read_table(output_dir / "source" / "rows.parquet")
        self.rows = self.table.to_pylist(maps_as_pydicts="strict")
        self.raw = _raw_rows(self.path)

    def column(self, name: str) -> list[Any]:
        return [row[name] for row in self.rows]


@pytest.fixture(scope="module")
def read(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[str, Read] = {}

    def read_file(relative: str) -> Read:
        if relative not in cache:
            cache[relative] = Read(relative, tmp_path_factory.mktemp("reference"))
        return cache[relative]

    return read_file


def _assert_common(read: Read, rows: int, action_type: str) -> None:
    """Every row read, none dropped, in file order, with Horizon's fields unchanged."""
    assert read.manifest["status"] == "succeeded"
    assert len(read.raw) == rows
    assert read.table.num_rows == rows
    assert read.report["rows_in"] == read.report["rows_out"] == rows
    assert read.report["dropped"] == {}
    assert read.report["details"] == {"row_format": "timeline", "action_type": action_type}
    metadata = read.table.schema.metadata
    assert metadata[b"horizon.row_format"] == b"timeline"
    assert metadata[b"horizon.action_type"] == action_type.encode()
    schema = read.table.schema
    for name in ("state_features", "next_state_features", "metrics"):
        assert schema.field(name).type == FEATURES, name
    assert schema.field("mdp_id").type == pa.string()
    assert schema.field("sequence_number").type == pa.int64()
    assert schema.field("time_diff").type == pa.int64()
    assert schema.field("action_probability").type == pa.float64()
    assert schema.field("reward").type == pa.float64()
    assert schema.field("not_terminal").type == pa.bool_()
    for name in ("mdp_id", "sequence_number", "reward", "time_diff"):
        assert read.column(name) == [raw[name] for raw in read.raw], name
    for name in ("state_features", "next_state_features", "action", "next_action"):
        assert read.column(name) == [raw[name] for raw in read.raw], name
    # Horizon's files name it `propensity`, or (the older one) `action_probability`.
    expected = [raw.get("propensity", raw.get("action_probability")) for raw in read.raw]
    assert read.column("action_probability") == expected


def test_discrete_cartpole(read):
    cartpole = read("discrete_action/cartpole_training.json.bz2")
    _assert_common(cartpole, 3470, "discrete")
    schema = cartpole.table.schema
    assert schema.field("action").type == pa.int64()
    assert schema.field("next_action").type == pa.int64()
    assert schema.field("possible_actions").type == pa.list_(pa.int8())
    assert schema.field("possible_next_actions").type == pa.list_(pa.int8())

    first, raw = cartpole.rows[0], cartpole.raw[0]
    assert (first["mdp_id"], first["sequence_number"]) == ("214", 120)
    assert first["action_probability"] == raw["propensity"] == 0.05
    assert first["state_features"] == raw["state_features"]
    assert first["state_features"]["0"] == 0.9171927828834818
    assert (first["action"], first["next_action"]) == (1, 0)
    assert first["possible_actions"] == first["possible_next_actions"] == [1, 1]
    assert first["metrics"] == {"reward": 1.0}
    # The epsilon-greedy logger's two propensities, as the README describes.
    assert set(cartpole.column("action_probability")) == {0.95, 0.05}

    # Horizon marks a terminal row by possible_next_actions == [0, 0]: the last row of each of
    # the 29 episodes. not_terminal is derived false there and nowhere else.
    terminal = [raw["possible_next_actions"] == [0, 0] for raw in cartpole.raw]
    assert cartpole.column("not_terminal") == [not is_end for is_end in terminal]
    assert sum(terminal) == 29
    episodes = {raw["mdp_id"] for raw in cartpole.raw}
    assert len(episodes) == 29
    last = Counter()
    for raw in cartpole.raw:
        last[raw["mdp_id"]] = max(last[raw["mdp_id"]], raw["sequence_number"])
    ends = {
        (raw["mdp_id"], raw["sequence_number"])
        for raw in cartpole.raw
        if raw["possible_next_actions"] == [0, 0]
    }
    assert ends == set(last.items())


def test_continuous_pendulum(read):
    pendulum = read("continuous_action/pendulum_training.json.bz2")
    _assert_common(pendulum, 8600, "continuous")
    schema = pendulum.table.schema
    assert schema.field("action").type == FEATURES
    assert schema.field("next_action").type == FEATURES
    assert "possible_actions" not in schema.names
    assert "possible_next_actions" not in schema.names
    assert all(action.keys() == {"3"} for action in pendulum.column("action"))
    first = pendulum.rows[0]
    assert first["action"] == {"3": 0.8829324245452881}
    assert first["action_probability"] == 1.0
    # 43 episodes of Pendulum's 200 steps; every row carries its 3-feature next state, so no
    # row is terminal (the episodes end by time limit).
    assert len({raw["mdp_id"] for raw in pendulum.raw}) == 43
    assert all(len(state) == 3 for state in pendulum.column("next_state_features"))
    assert all(pendulum.column("not_terminal"))


def test_parametric_cartpole(read):
    parametric = read("parametric_action/cartpole_training.json.bz2")
    _assert_common(parametric, 3925, "parametric")
    schema = parametric.table.schema
    assert schema.field("action").type == FEATURES
    assert schema.field("possible_actions").type == pa.list_(FEATURES)
    assert schema.field("possible_next_actions").type == pa.list_(FEATURES)
    assert parametric.column("possible_actions") == [
        raw["possible_actions"] for raw in parametric.raw
    ]
    first = parametric.rows[0]
    assert first["action"] == {"4": 1.0}
    assert first["possible_actions"] == [{"4": 1.0}, {"5": 1.0}]
    assert first["action_probability"] == 0.95
    # Horizon left possible_next_actions empty on the last two rows of each of the 26 episodes
    # (the last row's own possible_actions is empty too); an empty list marks a terminal row.
    terminal = [raw["possible_next_actions"] == [] for raw in parametric.raw]
    assert parametric.column("not_terminal") == [not is_end for is_end in terminal]
    assert sum(terminal) == 52 == 2 * len({raw["mdp_id"] for raw in parametric.raw})


def test_older_parametric_file_reports_its_extra_fields(read):
    older = read("parametric_action/cartpole_training_data.json")
    _assert_common(older, 162, "parametric")
    first = older.rows[0]
    assert first["action"] == {"4": 1.0, "5": 0.0}
    assert first["possible_actions"] == [{"4": 1.0, "5": 0.0}, {"4": 0.0, "5": 1.0}]
    assert first["metrics"] is None  # this variant has no metrics map
    assert all(older.column("not_terminal"))  # no row has an empty possible_next_actions
    # Its reward_timeline and episode_value fields are not part of the format: reported, not
    # silently dropped.
    assert older.report["warnings"] == [
        "ignored field 'episode_value' (not part of timeline rows with parametric actions) "
        "in 162 rows",
        "ignored field 'reward_timeline' (not part of timeline rows with parametric actions) "
        "in 162 rows",
    ]
    on_disk = json.loads(
        (Path(older.manifest["config"]["pipeline"]["output_dir"]) / "manifest.json").read_text()
    )
    assert on_disk["stages"]["source"]["warnings"] == older.report["warnings"]


@pytest.mark.parametrize(
    "relative",
    [
        "discrete_action/cartpole_training.json.bz2",
        "continuous_action/pendulum_training.json.bz2",
        "parametric_action/cartpole_training.json.bz2",
    ],
)
def test_timeline_rows_pass_through_the_timeline_stage_losing_nothing(tmp_path, relative):
    """Horizon's timeline rows skip the transform: split into train and eval, nothing changed."""
    path = _reference_file(relative)
    config = {
        "pipeline": {"output_dir": str(tmp_path), "seed": 3},
        "source": {"kind": "jsonl", "path": str(path)},
        "timeline": {"eval_fraction": 0.2},
    }
    manifest = Engine(show_progress=False).run(config)
    stage = manifest["stages"]["timeline"]
    source = pq.read_table(tmp_path / "source" / "rows.parquet")
    train = pq.read_table(tmp_path / "timeline" / "train")
    evaluation = pq.read_table(tmp_path / "timeline" / "eval")
    assert stage["details"]["engine"] == "none: the source rows are timeline rows already"
    assert stage["rows_in"] == stage["rows_out"] == source.num_rows
    assert train.num_rows > 0 and evaluation.num_rows > 0
    assert not {*train["mdp_id"].to_pylist()} & {*evaluation["mdp_id"].to_pylist()}
    keys = [("mdp_id", "ascending"), ("sequence_number", "ascending")]
    both = pa.concat_tables([train, evaluation]).sort_by(keys)
    assert both.equals(source.sort_by(keys))
