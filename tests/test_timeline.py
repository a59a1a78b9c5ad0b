"""The timeline stage: exact output rows for hand-made episodes, through the real pipeline.

Each case runs on every engine in ``ENGINES`` and asserts the same rows, so the local and the
Spark engine are held to one specification (horizon_engine/timeline.py's docstring).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from horizon_engine.errors import BadRowsError
from horizon_engine.pipeline import Engine
from horizon_engine.timeline import TimelineInfo, eval_split_value

ENGINES = [pytest.param("local", id="local"), pytest.param("spark", marks=pytest.mark.spark)]


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    if request.param == "spark":
        request.getfixturevalue("spark")
    return request.param


def decision(mdp_id: str, step: int, action: str = "0", **changes: Any) -> dict[str, Any]:
    """A pre-timeline row of episode ``mdp_id`` at sequence number ``step``."""
    row = {
        "mdp_id": mdp_id,
        "sequence_number": step,
        "state_features": {"0": float(step), "1": 10.0},
        "action": action,
        "reward": 1.0,
        "action_probability": 0.5,
        "possible_actions": ["0", "1"],
        "metrics": {"reward": 1.0},
    }
    row.update(changes)
    return {key: value for key, value in row.items() if value is not None}


def run_timeline(
    tmp_path: Path,
    engine: str,
    rows: list[dict[str, Any]],
    on_bad_rows: str = "fail",
    **timeline: Any,
) -> dict[str, Any]:
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = {
        "pipeline": {"output_dir": str(tmp_path / "run"), "seed": 1, "on_bad_rows": on_bad_rows},
        "source": {"kind": "jsonl", "path": str(source)},
        "timeline": {"engine": engine, "eval_fraction": 0.0, **timeline},
    }
    # The source stage first, without [timeline] actions, then the timeline stage: the
    # source stage would report an unknown action at its own line when it knows the actions,
    # and these tests are about the timeline engine's own check (what --stages timeline with
    # a changed action list meets). Both continue the folder's run, which tests re-run.
    without_actions = {
        name: value for name, value in config["timeline"].items() if name != "actions"
    }
    Engine(show_progress=False).run({**config, "timeline": without_actions}, stages=["source"])
    return Engine(show_progress=False).run(config, stages=["timeline"])


def read_split(tmp_path: Path, split: str = "train") -> list[dict[str, Any]]:
    table = pq.read_table(tmp_path / "run" / "timeline" / split)
    return table.to_pylist(maps_as_pydicts="strict")


def pick(rows: list[dict[str, Any]], *columns: str) -> list[tuple]:
    return [tuple(row[column] for column in columns) for row in rows]


EDGE_CASES = [
    decision("a", 5, "1", possible_actions=[]),
    decision("a", 1, "0"),
    decision("b", 7, "1"),
    decision("a", 2, "1", possible_actions=["1"]),
]
"""Out of order, a gap (2 -> 5), a one-row episode, a row whose possible_actions are empty
(not recorded: any action was possible)."""


def test_next_row_columns_ordinals_and_terminal_rows(tmp_path, engine):
    manifest = run_timeline(tmp_path, engine, EDGE_CASES, actions=["0", "1"])
    rows = read_split(tmp_path)
    assert pick(
        rows, "mdp_id", "sequence_number", "sequence_number_ordinal", "time_since_first"
    ) == [
        ("a", 1, 1, 0),
        ("a", 2, 2, 1),
        ("a", 5, 3, 4),
        ("b", 7, 1, 0),
    ]
    assert pick(rows, "action", "possible_actions") == [
        (0, [1, 1]),
        (1, [0, 1]),
        (1, [1, 1]),
        (1, [1, 1]),
    ]
    assert pick(rows, "time_diff", "not_terminal", "next_action", "possible_next_actions") == [
        (1, True, 1, [0, 1]),
        (3, True, 1, [1, 1]),
        (0, False, None, [0, 0]),
        (0, False, None, [0, 0]),
    ]
    assert [row["next_state_features"] for row in rows] == [
        {"0": 2.0, "1": 10.0},
        {"0": 5.0, "1": 10.0},
        {},
        {},
    ]
    assert [row["state_features"]["0"] for row in rows] == [1.0, 2.0, 5.0, 7.0]
    assert all(row["action_probability"] == 0.5 and row["reward"] == 1.0 for row in rows)
    stage = manifest["stages"]["timeline"]
    assert (stage["rows_in"], stage["rows_out"], stage["dropped"]) == (4, 4, {})
    info = TimelineInfo.read(tmp_path / "run" / "timeline")
    assert (info.action_type, info.actions, info.train_rows, info.eval_rows) == (
        "discrete",
        ["0", "1"],
        4,
        0,
    )
    assert read_split(tmp_path, "eval") == []


def test_duplicated_rows_are_set_aside_before_the_timeline(tmp_path, engine):
    """A repeated (mdp_id, sequence_number) is a bad row of the source stage; the rest go on."""
    rows = [decision("a", 0), decision("a", 1, "1"), decision("a", 1, "0"), decision("a", 2)]
    manifest = run_timeline(tmp_path, engine, rows, on_bad_rows="quarantine", actions=["0", "1"])
    assert manifest["stages"]["source"]["dropped"] == {"duplicate": 1}
    assert pick(read_split(tmp_path), "sequence_number", "action", "next_action") == [
        (0, 0, 1),
        (1, 1, 0),
        (2, 0, None),
    ]


def test_terminal_rows_dropped_when_asked(tmp_path, engine):
    manifest = run_timeline(
        tmp_path, engine, EDGE_CASES, actions=["0", "1"], add_terminal_state_row=False
    )
    assert pick(read_split(tmp_path), "mdp_id", "sequence_number", "not_terminal") == [
        ("a", 1, True),
        ("a", 2, True),
    ]
    assert manifest["stages"]["timeline"]["dropped"] == {"terminal_row": 2}


TRUNCATED_AND_TERMINATED = [
    decision("cut", 0, reward=0.0),
    decision("cut", 1, reward=1.0, truncated=True),  # ignored: not the episode's last row
    decision("cut", 2, reward=2.0),
    decision("cut", 3, reward=3.0, truncated=True),
    decision("end", 0, reward=5.0),
    decision("end", 1, reward=6.0, truncated=False),
]
"""Episode ``cut`` stopped by a time limit after step 3; episode ``end`` really ended."""


def test_a_truncated_episode_leaves_no_terminal_row(tmp_path, engine):
    manifest = run_timeline(tmp_path, engine, TRUNCATED_AND_TERMINATED, actions=["0", "1"])
    rows = read_split(tmp_path)
    assert pick(rows, "mdp_id", "sequence_number", "not_terminal", "time_diff") == [
        ("cut", 0, True, 1),
        ("cut", 1, True, 1),
        ("cut", 2, True, 1),  # its next state is step 3's, which was observed
        ("end", 0, True, 1),
        ("end", 1, False, 0),  # a real termination stays terminal
    ]
    assert rows[2]["next_state_features"] == {"0": 3.0, "1": 10.0}
    assert rows[2]["next_action"] == 0 and rows[2]["possible_next_actions"] == [1, 1]
    stage = manifest["stages"]["timeline"]
    assert (stage["rows_in"], stage["rows_out"], stage["dropped"]) == (6, 5, {"truncated": 1})


def test_n_step_windows_stop_before_a_truncation(tmp_path, engine):
    run_timeline(tmp_path, engine, TRUNCATED_AND_TERMINATED, actions=["0", "1"], n_step=3)
    rows = read_split(tmp_path)
    assert [row["next_n_rewards"] for row in rows] == [
        [0.0, 1.0, 2.0],
        [1.0, 2.0],
        [2.0],
        [5.0, 6.0],
        [6.0],
    ]
    assert [row["next_n_not_terminal"] for row in rows] == [
        [True, True, True],
        [True, True],
        [True],
        [True, False],
        [False],
    ]
    ends = [row["next_n_state_features"][-1].get("0") for row in rows]
    assert ends == [3.0, 3.0, 3.0, None, None]


def test_truncation_drop_comes_before_the_terminal_row_filter(tmp_path, engine):
    manifest = run_timeline(
        tmp_path, engine, TRUNCATED_AND_TERMINATED, actions=["0", "1"], add_terminal_state_row=False
    )
    assert [row["sequence_number"] for row in read_split(tmp_path)] == [0, 1, 2, 0]
    dropped = manifest["stages"]["timeline"]["dropped"]
    assert dropped == {"truncated": 1, "terminal_row": 1}


def test_reward_from_metric_weights(tmp_path, engine):
    rows = [
        decision("a", 0, metrics={"clicks": 2.0, "cost": 1.0}),
        decision("a", 1, metrics={"cost": 4.0}, reward=None),
        decision("a", 2, metrics={"clicks": 1.0, "other": 9.0}),
    ]
    run_timeline(tmp_path, engine, rows, actions=["0", "1"], reward={"clicks": 1.0, "cost": -0.5})
    out = read_split(tmp_path)
    # 2*1 + 1*(-0.5); a missing metric counts 0; metrics not weighted are ignored.
    assert [row["reward"] for row in out] == [1.5, -2.0, 1.0]
    assert out[0]["metrics"] == {"clicks": 2.0, "cost": 1.0}


def test_rows_the_transform_cannot_use_fail_the_run(tmp_path, engine):
    rows = [
        decision("a", 0),
        decision("a", 1, "2", possible_actions=["0", "2"]),
        decision("a", 2, reward=None),
    ]
    with pytest.raises(BadRowsError) as caught:
        run_timeline(tmp_path, engine, rows, actions=["0", "1"])
    message = str(caught.value)
    assert message.startswith("2 bad rows (missing_reward: 1, unknown_action: 1):")
    assert "action '2' is not in [timeline] actions ['0', '1']" in message
    assert not (tmp_path / "run" / "timeline").exists()


def test_rows_the_transform_cannot_use_quarantined(tmp_path, engine):
    rows = [
        decision("a", 0),
        decision("a", 1, "2", possible_actions=None),
        decision("a", 2, possible_actions=["0", "9"]),
        decision("a", 3),
    ]
    manifest = run_timeline(tmp_path, engine, rows, on_bad_rows="quarantine", actions=["0", "1"])
    assert pick(read_split(tmp_path), "sequence_number", "time_diff") == [(0, 3), (3, 0)]
    stage = manifest["stages"]["timeline"]
    assert stage["dropped"] == {"unknown_action": 2}
    assert "timeline/quarantine" in stage["outputs"]
    quarantined = [
        json.loads(line)
        for path in sorted((tmp_path / "run" / "timeline" / "quarantine").glob("part-*"))
        for line in path.read_text().splitlines()
    ]
    assert sorted(row["row"]["sequence_number"] for row in quarantined) == [1, 2]
    assert {row["kind"] for row in quarantined} == {"unknown_action"}


def test_outlier_episodes_and_time_window(tmp_path, engine):
    lengths = {"a": 2, "b": 2, "c": 2, "d": 10}
    rows = [decision(mdp, step) for mdp, length in lengths.items() for step in range(length)]
    # numpy.percentile([2, 2, 2, 10], 75) = 2 + 0.25 * (10 - 2) = 4.0: episode d goes.
    manifest = run_timeline(
        tmp_path, engine, rows, actions=["0", "1"], outlier_episode_length_percentile=75
    )
    assert {row["mdp_id"] for row in read_split(tmp_path)} == {"a", "b", "c"}
    assert manifest["stages"]["timeline"]["dropped"] == {"outlier_episode": 10}

    manifest = run_timeline(tmp_path, engine, rows, actions=["0", "1"], time_window_limit=4)
    kept = pick(read_split(tmp_path), "mdp_id", "sequence_number", "not_terminal")
    assert [row for row in kept if row[0] == "d"] == [("d", step, True) for step in range(5)]
    assert manifest["stages"]["timeline"]["dropped"] == {"time_window": 5}


def test_n_step_arrays(tmp_path, engine):
    rows = [decision("a", step, reward=float(step)) for step in (0, 1, 3, 4)]
    run_timeline(tmp_path, engine, rows, actions=["0", "1"], n_step=3)
    out = read_split(tmp_path)
    assert [row["next_n_rewards"] for row in out] == [
        [0.0, 1.0, 3.0],
        [1.0, 3.0, 4.0],
        [3.0, 4.0],
        [4.0],
    ]
    assert [row["next_n_time_diffs"] for row in out] == [[1, 2, 1], [2, 1, 0], [1, 0], [0]]
    assert [row["next_n_not_terminal"] for row in out] == [
        [True, True, True],
        [True, True, False],
        [True, False],
        [False],
    ]
    assert [[s.get("0") for s in row["next_n_state_features"]] for row in out] == [
        [1.0, 3.0, 4.0],
        [3.0, 4.0, None],
        [4.0, None],
        [None],
    ]
    assert out[2]["next_n_possible_next_actions"] == [[1, 1], [0, 0]]


def test_feature_maps_that_differ_from_row_to_row(tmp_path, engine):
    """Two keys in every row, but in another order, or another key: each row's own map, in its
    next states and windows too (the local engine keeps maps with the same keys in the same
    order in every row apart)."""
    states = [
        {"0": 0.0, "1": 1.0},
        {"1": 3.0, "0": 2.0},
        {"0": 4.0, "2": 5.0},
        {"0": 6.0, "1": 7.0},
    ]
    rows = [decision("a", step, state_features=state) for step, state in enumerate(states)]
    run_timeline(tmp_path, engine, rows, actions=["0", "1"], n_step=2)
    out = read_split(tmp_path)
    assert [row["state_features"] for row in out] == states
    assert [row["next_state_features"] for row in out] == [*states[1:], {}]
    assert [row["next_n_state_features"] for row in out] == [
        states[1:3],
        states[2:4],
        [states[3], {}],
        [{}],
    ]


def test_files_and_row_groups_do_not_change_the_rows(tmp_path, monkeypatch):
    """The local engine builds each row group from the sorted rows it covers and those its
    next states and n-step windows reach: rows cut into files of 5 rows and row groups of 2
    are the rows of one file, in the same order."""
    import horizon_engine.timeline

    rows = [
        decision(f"ep{episode}", step, reward=float(step), metrics={"reward": step / 2})
        for episode in range(12)
        for step in range(episode % 5 + 1)
    ]
    splits = {}
    for name in ("whole", "cut"):
        if name == "cut":
            monkeypatch.setattr(horizon_engine.timeline, "PART_ROWS", 5)
            monkeypatch.setattr(horizon_engine.timeline, "ROW_GROUP_ROWS", 2)
        (tmp_path / name).mkdir()
        run_timeline(tmp_path / name, "local", rows[::-1], actions=["0", "1"], eval_fraction=0.3)
        splits[name] = [read_split(tmp_path / name, split) for split in ("train", "eval")]
    assert len(list((tmp_path / "cut" / "run" / "timeline" / "train").glob("*.parquet"))) > 1
    assert splits["cut"] == splits["whole"]
    assert all(splits["whole"])


def test_parametric_actions(tmp_path, engine):
    left, right = {"4": 1.0}, {"5": 1.0}
    rows = [
        decision("p", 0, left, possible_actions=[left, right]),
        decision("p", 1, right, possible_actions=[right]),
    ]
    run_timeline(tmp_path, engine, rows)
    out = read_split(tmp_path)
    assert pick(out, "action", "next_action", "possible_next_actions", "not_terminal") == [
        (left, right, [right], True),
        (right, None, [], False),
    ]
    assert out[0]["possible_actions"] == [left, right]


def test_continuous_actions(tmp_path, engine):
    rows = [decision("c", step, {"3": step / 10}) for step in range(3)]
    for row in rows:
        del row["possible_actions"]
    run_timeline(tmp_path, engine, rows)
    out = read_split(tmp_path)
    assert pick(out, "action", "next_action", "not_terminal") == [
        ({"3": 0.0}, {"3": 0.1}, True),
        ({"3": 0.1}, {"3": 0.2}, True),
        ({"3": 0.2}, None, False),
    ]
    assert "possible_actions" not in out[0]


def test_split_is_by_episode_disjoint_and_follows_the_hash(tmp_path, engine):
    rows = [decision(f"ep{e}", step) for e in range(40) for step in range(3)]
    manifest = run_timeline(tmp_path, engine, rows, actions=["0", "1"], eval_fraction=0.25)
    train = {row["mdp_id"] for row in read_split(tmp_path, "train")}
    evaluation = {row["mdp_id"] for row in read_split(tmp_path, "eval")}
    expected = {f"ep{e}" for e in range(40) if eval_split_value(1, f"ep{e}") < 0.25}
    assert evaluation == expected
    assert train == {f"ep{e}" for e in range(40)} - expected
    details = manifest["stages"]["timeline"]["details"]
    assert (details["train_episodes"], details["eval_episodes"]) == (len(train), len(evaluation))
    assert details["eval_rows"] == 3 * len(evaluation)


def test_discrete_timeline_without_action_names_numbers_every_name_the_rows_log(tmp_path):
    """Logged and possible actions alike; whole numbers by value ("2" before "10")."""
    rows = [
        decision("a", 0, action="10", possible_actions=["2", "10", "wait"]),
        decision("a", 1, action="2", possible_actions=["2", "10"]),
    ]
    manifest = run_timeline(tmp_path, "local", rows)
    assert manifest["stages"]["timeline"]["details"]["actions"] == ["2", "10", "wait"]
    assert pick(read_split(tmp_path), "action") == [(1,), (0,)]


def test_eval_split_value_is_the_documented_md5():
    # md5("1:ep0") starts with these 8 hex digits; the Spark engine computes the same.
    import hashlib

    digest = hashlib.md5(b"1:ep0").hexdigest()
    assert eval_split_value(1, "ep0") == int(digest[:8], 16) / 2**32
    assert 0 <= eval_split_value(1, "ep0") < 1
    assert eval_split_value(1, "ep0") != eval_split_value(2, "ep0")


def test_eval_episodes_splits_by_eval_split_value():
    """The local engine hashes many ids at once; each falls on the side its value says."""
    from horizon_engine.timeline import eval_episodes

    ids = ["ep0", "", "é", "user 7", "日本", *(str(number) for number in range(2000))]
    for seed, fraction in ((0, 0.1), (1, 0.5), (-3, 0.99), (12345, 0.0)):
        expected = [eval_split_value(seed, mdp_id) < fraction for mdp_id in ids]
        assert eval_episodes(seed, ids, fraction).tolist() == expected
