"""The local timeline out of core: cut into buckets of episodes, it builds what it builds in
memory, file for file (rows, order, counts, examples, quarantine), and its peak memory follows
``[timeline] max_memory_gb``, not the source's size."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings

from horizon_engine.builtin.timeline import (
    BUILD_MEMORY_FIXED_BYTES,
    BUILD_MEMORY_PER_SOURCE_BYTE,
    LocalTimeline,
    LocalTimelineConfig,
    bucket_count,
)
from horizon_engine.errors import BAD_ROWS_SHOWN
from horizon_engine.schema import ActionType, RowFormat, RowLayout, RowShaper
from horizon_engine.timeline import TimelineResult
from tests.test_timeline import run_timeline
from tests.test_timeline_fuzz import logged_rows, source_rows, timeline_configs

SEED = 5
BUCKETS = 4


def logged(action_type: ActionType, episodes: int = 40, seed: int = 0) -> list[dict[str, Any]]:
    """Rows of ``episodes`` episodes of 1 to 12 steps, shuffled, some with bad values."""
    rng = np.random.default_rng(seed)
    rows = []
    for episode in range(episodes):
        length = int(rng.integers(1, 13))
        for step in rng.choice(100, size=length, replace=False).tolist():
            row: dict[str, Any] = {
                "mdp_id": f"episode-{episode * 7919 % 1000:03d}",
                "sequence_number": step,
                "state_features": {"0": float(step), "1": float(rng.normal())},
                "action_probability": 0.5,
                "reward": None if rng.random() < 0.05 else float(rng.normal()),
                "metrics": {"clicks": float(rng.integers(3))},
                "truncated": bool(rng.random() < 0.2),
            }
            if action_type is ActionType.DISCRETE:
                row["action"] = "c" if rng.random() < 0.05 else str(rng.choice(["a", "b"]))
                row["possible_actions"] = ["a", "b"] if rng.random() < 0.9 else ["a"]
            else:
                row["action"] = {"10": float(rng.normal())}
                if action_type is ActionType.PARAMETRIC:
                    row["possible_actions"] = [{"10": 0.0}, {"10": 1.0}]
            rows.append({key: value for key, value in row.items() if value is not None})
    order = rng.permutation(len(rows))
    return [rows[index] for index in order]


def write_rows(rows: list[dict[str, Any]], action_type: ActionType, path: Path) -> None:
    layout = RowLayout(RowFormat.PRE_TIMELINE, action_type)
    located = [(f"rows.jsonl:{number}", row) for number, row in enumerate(rows, 1)]
    pq.write_table(RowShaper(layout).shape(located).table, path, row_group_size=50)


def memory_for(buckets: int, rows: Path) -> float:
    """The ``max_memory_gb`` that cuts ``rows`` into ``buckets`` buckets."""
    metadata = pq.read_metadata(rows)
    source_bytes = sum(
        metadata.row_group(group).total_byte_size for group in range(metadata.num_row_groups)
    )
    share = source_bytes * BUILD_MEMORY_PER_SOURCE_BYTE / (buckets - 0.5)
    memory = (BUILD_MEMORY_FIXED_BYTES + share) / 2**30
    assert bucket_count(metadata, memory) == buckets
    return memory


def build(
    rows: Path, output: Path, action_type: ActionType, quarantine: bool, **config: Any
) -> TimelineResult:
    output.mkdir()
    engine = LocalTimeline(LocalTimelineConfig(**config))
    return engine.build(SimpleNamespace(seed=SEED), rows, output, action_type, quarantine)


def files(output: Path) -> dict[str, Any]:
    """Every file of a built timeline: the splits' tables (in file order), the quarantine."""
    built: dict[str, Any] = {
        split: pq.read_table(sorted((output / split).glob("*.parquet")))
        for split in ("train", "eval")
    }
    quarantine = output / "quarantine" / "part-00000.jsonl"
    built["quarantine"] = quarantine.read_text() if quarantine.exists() else None
    built["left"] = sorted(path.name for path in output.iterdir())
    return built


def assert_same_as_in_memory(
    rows: Path, folder: Path, action_type: ActionType, quarantine: bool, **config: Any
) -> TimelineResult:
    in_memory = build(rows, folder / "memory", action_type, quarantine, **config)
    memory = memory_for(BUCKETS, rows)
    bucketed = build(
        rows, folder / "buckets", action_type, quarantine, max_memory_gb=memory, **config
    )
    assert dataclasses.asdict(bucketed) == dataclasses.asdict(in_memory)
    assert list(bucketed.dropped) == list(in_memory.dropped)
    expected, got = files(folder / "memory"), files(folder / "buckets")
    for split in ("train", "eval"):
        assert got[split].equals(expected[split]), split
    assert got["quarantine"] == expected["quarantine"]
    assert got["left"] == expected["left"]
    return in_memory


@pytest.mark.parametrize("action_type", list(ActionType), ids=lambda kind: kind.value)
def test_buckets_build_what_memory_builds(tmp_path, action_type):
    rows = tmp_path / "rows.parquet"
    write_rows(logged(action_type), action_type, rows)
    actions = ["a", "b"] if action_type is ActionType.DISCRETE else None
    result = assert_same_as_in_memory(
        rows, tmp_path, action_type, True, actions=actions, eval_fraction=0.3
    )
    assert result.train_episodes > BUCKETS and result.eval_episodes
    assert result.dropped["truncated"]
    if action_type is ActionType.DISCRETE:
        assert set(result.rejected) == {"missing_reward", "unknown_action"}


def test_buckets_apply_every_filter_as_memory_does(tmp_path):
    rows = tmp_path / "rows.parquet"
    write_rows(logged(ActionType.DISCRETE, episodes=100, seed=1), ActionType.DISCRETE, rows)
    result = assert_same_as_in_memory(
        rows,
        tmp_path,
        ActionType.DISCRETE,
        False,
        actions=["a", "b"],
        reward={"clicks": 1.0},
        n_step=4,
        add_terminal_state_row=False,
        outlier_episode_length_percentile=60.0,
        time_window_limit=70,
    )
    assert set(result.dropped) == {"outlier_episode", "time_window", "truncated", "terminal_row"}
    assert result.rejected["unknown_action"] > BAD_ROWS_SHOWN
    assert len(result.examples) == BAD_ROWS_SHOWN


def test_buckets_of_rejected_rows_only_build_what_memory_builds(tmp_path):
    rows = tmp_path / "rows.parquet"
    unknown_actions = [{**row, "action": "c"} for row in logged(ActionType.DISCRETE)]
    write_rows(unknown_actions, ActionType.DISCRETE, rows)
    result = assert_same_as_in_memory(rows, tmp_path, ActionType.DISCRETE, True, actions=["a"])
    assert result.train_rows == result.eval_rows == 0
    assert sum(result.rejected.values()) == result.rows_in


def test_the_stage_builds_in_buckets_what_it_builds_in_memory(tmp_path, monkeypatch):
    bucketed_builds = []
    build_buckets = LocalTimeline._build_buckets

    def recorded(engine: LocalTimeline, *args: Any) -> TimelineResult:
        bucketed_builds.append(args[2])
        return build_buckets(engine, *args)

    monkeypatch.setattr(LocalTimeline, "_build_buckets", recorded)
    rows = logged(ActionType.DISCRETE, seed=2)
    options = {"actions": ["a", "b"], "eval_fraction": 0.3}
    for name in ("memory", "buckets"):
        (tmp_path / name).mkdir()
    memory = run_timeline(tmp_path / "memory", "local", rows, "quarantine", **options)
    source = tmp_path / "memory" / "run" / "source" / "rows.parquet"
    limit = memory_for(BUCKETS, source)
    bucketed = run_timeline(
        tmp_path / "buckets", "local", rows, "quarantine", max_memory_gb=limit, **options
    )
    assert bucketed_builds == [BUCKETS]
    for key in ("rows_in", "rows_out", "dropped", "details"):
        assert bucketed["stages"]["timeline"][key] == memory["stages"]["timeline"][key], key
    folders = [tmp_path / name / "run" / "timeline" for name in ("memory", "buckets")]
    expected, got = files(folders[0]), files(folders[1])
    for split in ("train", "eval"):
        assert got[split].equals(expected[split]), split
    assert got["quarantine"].replace("buckets", "memory") == expected["quarantine"]
    assert got["left"] == expected["left"]
    assert (folders[1] / "timeline.json").read_text() == (folders[0] / "timeline.json").read_text()


@pytest.mark.fuzz
@settings(max_examples=10)
@given(rows=logged_rows(max_episodes=12), config=timeline_configs)
def test_buckets_build_what_memory_builds_from_any_source_rows(tmp_path_factory, rows, config):
    folder = tmp_path_factory.mktemp("timeline")
    if source_rows(rows, folder / "rows.parquet") < 2:
        return
    assert_same_as_in_memory(
        folder / "rows.parquet", folder, ActionType.DISCRETE, True, **config.model_dump()
    )


MEMORY_PROBE = """
import json, sys
from pathlib import Path
from types import SimpleNamespace
import pandas  # imported by pyarrow at its first boolean to_numpy: once, not the build's
from horizon_engine.builtin.timeline import LocalTimeline, LocalTimelineConfig
from horizon_engine.schema import ActionType

def peak_kb():
    # Linux's VmHWM starts afresh at exec, where ru_maxrss keeps the peak of the process the
    # child was forked from (pytest's: the in-memory build then seemed to take 63 MB).
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

rows, output, memory = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
engine = LocalTimeline(LocalTimelineConfig(actions=["0", "1"], max_memory_gb=memory))
before = peak_kb()
output.mkdir()
engine.build(SimpleNamespace(seed=0), rows, output, ActionType.DISCRETE, quarantine=False)
after = peak_kb()
print(json.dumps({"growth_mb": (after - before) / 1024}))
"""


def peak_growth_mb(rows: Path, output: Path, memory_gb: float) -> float:
    """Peak RSS growth of a build in a fresh process (VmHWM, after the imports)."""
    command = [sys.executable, "-c", MEMORY_PROBE, str(rows), str(output), str(memory_gb)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])["growth_mb"]


ALLOWANCE_MB = 0
"""What the bucketed build may take beyond the bound: none, as the bound's fixed part
(``BUILD_MEMORY_FIXED_BYTES``) already counts what a build holds besides its bucket."""


@pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="reads peak memory from Linux's /proc"
)
def test_peak_memory_follows_the_bound_not_the_source(tmp_path):
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from timeline import generate

    rows = tmp_path / "rows.parquet"
    generate(rows, 600_000, episode_length=50, order="shuffled", row_group_rows=32_768)
    memory = memory_for(8, rows)
    """About 286 MB: 256 fixed, and an eighth of the rows' share, which is about 220 MB."""
    bound_mb = memory * 1024
    bucketed = peak_growth_mb(rows, tmp_path / "buckets", memory)
    in_memory = peak_growth_mb(rows, tmp_path / "memory", 64.0)
    figures = f"bound {bound_mb:.0f} MB, in buckets {bucketed:.0f} MB, in memory {in_memory:.0f} MB"
    assert bucketed < bound_mb + ALLOWANCE_MB, figures
    assert in_memory > bound_mb + ALLOWANCE_MB, figures


def test_a_bound_below_what_any_bucketed_build_takes_is_refused():
    with pytest.raises(ValueError, match="max_memory_gb"):
        LocalTimelineConfig(max_memory_gb=BUILD_MEMORY_FIXED_BYTES / 2**30)
