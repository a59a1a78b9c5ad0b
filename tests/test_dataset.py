"""The timeline as dense tensors: values, presence, terminal rows, n-step windows, minibatches."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from horizon_engine.dataset import dense_features, load_timeline
from horizon_engine.pipeline import Engine
from horizon_engine.schema import FEATURES, ActionType


def test_dense_features_fill_values_and_presence_in_the_given_order():
    import pyarrow as pa

    column = pa.array([[("3", 1.5), ("0", -1.0)], [], None, [("9", 7.0), ("3", 2.0)]], FEATURES)
    values, presence = dense_features(column, ["0", "3"])
    assert values.tolist() == [[-1.0, 1.5], [0.0, 0.0], [0.0, 0.0], [0.0, 2.0]]
    assert presence.tolist() == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 1.0]]


def rows_with_a_missing_feature(path: Path) -> Path:
    rows = []
    for episode in range(4):
        for step in range(5):
            state = {"0": float(step), "1": float(episode)}
            if step == 2:
                del state["1"]
            rows.append(
                {
                    "mdp_id": f"e{episode}",
                    "sequence_number": step,
                    "state_features": state,
                    "action": str(step % 2),
                    "reward": float(step),
                    "action_probability": 0.5,
                    "possible_actions": ["0", "1"] if step != 3 else ["1"],
                }
            )
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def discrete_run(tmp_path: Path) -> Path:
    config = {
        "pipeline": {"output_dir": str(tmp_path / "run")},
        "source": {"kind": "jsonl", "path": str(rows_with_a_missing_feature(tmp_path / "r.jsonl"))},
        "timeline": {"actions": ["0", "1"], "n_step": 3, "eval_fraction": 0.0},
    }
    Engine(show_progress=False).run(config)
    return tmp_path / "run" / "timeline" / "train"


def test_discrete_split_as_tensors(discrete_run):
    data = load_timeline(discrete_run, ActionType.DISCRETE, ["0", "1"], actions=["0", "1"])
    table = pq.read_table(discrete_run).to_pylist(maps_as_pydicts="strict")
    assert len(data) == len(table) == 20
    first = table[0]
    assert (first["mdp_id"], first["sequence_number"]) == ("e0", 0)
    assert data.state[:5, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    # Step 2 of every episode lacks feature "1": value 0, presence 0.
    assert data.state_presence[:5, 1].tolist() == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert data.action[:5].tolist() == [0, 1, 0, 1, 0]
    assert data.next_action[:5].tolist() == [1, 0, 1, 0, -1]
    assert data.not_terminal[:5].tolist() == [1.0, 1.0, 1.0, 1.0, 0.0]
    assert data.possible_actions[3].tolist() == [0.0, 1.0]
    assert data.possible_next_actions[2].tolist() == [0.0, 1.0]
    assert data.possible_next_actions[4].tolist() == [0.0, 0.0]
    assert data.next_state_presence[4].tolist() == [0.0, 0.0]
    assert data.next_state[1].tolist() == [2.0, 0.0]
    assert data.reward.dtype == torch.float32 and data.action.dtype == torch.int64


def test_n_step_windows_and_where_they_end(discrete_run):
    data = load_timeline(discrete_run, ActionType.DISCRETE, ["0", "1"], actions=["0", "1"])
    assert data.next_n_length[:5].tolist() == [3, 3, 3, 2, 1]
    assert data.next_n_rewards[:5].tolist() == [
        [0.0, 1.0, 2.0],
        [1.0, 2.0, 3.0],
        [2.0, 3.0, 4.0],
        [3.0, 4.0, 0.0],
        [4.0, 0.0, 0.0],
    ]
    assert data.next_n_not_terminal[2].tolist() == [1.0, 1.0, 0.0]
    # Row 0's window ends at step 2, whose next state is step 3's.
    assert data.next_n_state[0].tolist() == [3.0, 0.0]
    assert data.next_n_state_presence[2].tolist() == [0.0, 0.0]
    # ... and whose possible next actions are step 3's: only "1".
    assert data.next_n_possible_next_actions[0].tolist() == [0.0, 1.0]


def test_minibatches_cover_every_row_once_per_epoch_reproducibly(discrete_run):
    data = load_timeline(discrete_run, ActionType.DISCRETE, ["0", "1"], actions=["0", "1"])

    def epoch(seed: int) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        return [batch["state"] for batch in data.minibatches(8, generator)]

    batches = epoch(0)
    assert [len(batch) for batch in batches] == [8, 8, 4]
    seen = torch.cat(batches)
    assert sorted(map(tuple, seen.tolist())) == sorted(map(tuple, data.state.tolist()))
    assert all(torch.equal(a, b) for a, b in zip(batches, epoch(0), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(batches, epoch(1), strict=True))
    generator = torch.Generator().manual_seed(0)
    assert [len(b["reward"]) for b in data.minibatches(8, generator, drop_last=True)] == [8, 8]


def test_continuous_actions_are_dense_action_features(tmp_path):
    config = {
        "pipeline": {"output_dir": str(tmp_path)},
        "source": {"kind": "gym", "env": "Pendulum-v1", "episodes": 2, "ds": "2019-01-01"},
        "timeline": {"eval_fraction": 0.0},
    }
    Engine(show_progress=False).run(config)
    data = load_timeline(
        tmp_path / "timeline" / "train", ActionType.CONTINUOUS, ["0", "1", "2"], ["3"]
    )
    # Both episodes end at Pendulum's 200-step limit: a truncation, whose last row the
    # timeline drops (its next state was never observed), so every row kept has a next action.
    assert data.state.shape == (398, 3)
    assert data.action.shape == (398, 1)
    assert data.action_presence.all()
    assert float(data.action.abs().max()) <= 2.0
    assert data.next_action_presence[:, 0].sum() == 398
    moved = data.to("cpu")
    assert moved.feature_ids == ["0", "1", "2"] and moved.action_feature_ids == ["3"]
