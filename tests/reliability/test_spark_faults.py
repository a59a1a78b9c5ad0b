"""A Spark task that fails is retried by Spark, and the timeline comes out complete and unique.

The timeline is built on a local session whose master allows retries (``local[2,3]``: two
cores, three attempts per task; a plain ``local[2]`` never retries), with a filter in the plan
after the window that fails the first attempt of every task once it has passed rows on to the
writer, so each failed attempt leaves a partly written file behind it. The build is compared
with the local engine's from the same rows (which the Spark engine's matches without faults,
tests/test_timeline_parity.py): the same rows, none twice, the same counts.

Such a session cannot share the process with the suite's session (``spark`` in conftest, a
plain ``local[2]``: one SparkContext per process), so the Spark build runs in a child
process: this module, run as a script.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from horizon_engine.pipeline import Engine

pytestmark = [pytest.mark.reliability, pytest.mark.spark]

FAILING_ROW = 100
"""The row of a task at which its first attempt fails: after the first batches of rows have
gone through the Python worker to the writer."""


def write_rows(path: Path) -> int:
    """About 1,000 decisions: 40 episodes of 1 to 49 steps (with gaps), two actions; returns
    how many."""
    chosen = random.Random(3)
    written = 0
    with path.open("w", encoding="utf-8") as handle:
        for episode in range(40):
            steps = sorted(chosen.sample(range(200), chosen.randint(1, 49)))
            for step in steps:
                row = {
                    "mdp_id": f"episode{episode:03d}",
                    "sequence_number": step,
                    "state_features": {"0": chosen.random(), "1": chosen.random()},
                    "action": chosen.choice(["a", "b"]),
                    "reward": chosen.random(),
                    "action_probability": 0.5,
                    "possible_actions": ["a", "b"],
                    "metrics": {"reward": 1.0},
                }
                handle.write(json.dumps(row) + "\n")
                written += 1
    return written


def pipeline(rows: Path, output_dir: Path, engine: str) -> dict[str, Any]:
    return {
        "pipeline": {"output_dir": str(output_dir), "seed": 2},
        "source": {"kind": "jsonl", "path": str(rows)},
        "timeline": {"engine": engine, "actions": ["a", "b"], "eval_fraction": 0.3},
    }


def build_with_failing_tasks(rows: Path, folder: Path) -> None:
    """The child process: the timeline built on Spark, the first attempt of each task failing."""
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    from horizon_plugins_spark import SparkOptions, spark_session
    from horizon_plugins_spark import timeline as spark_timeline

    spark_session(
        SparkOptions(
            master="local[2,3]",
            conf={
                "spark.sql.shuffle.partitions": 4,
                "spark.ui.enabled": False,
                "spark.sql.warehouse.dir": str(folder / "warehouse"),
            },
        )
    )
    failures = folder / "failures"
    failures.mkdir()

    # Rows this task has seen: the filter is unpickled afresh for each task, and this with it.
    seen = [0]

    def passes(mdp_id: str) -> bool:
        task = TaskContext.get()
        seen[0] += 1
        if task.attemptNumber() == 0 and seen[0] == FAILING_ROW:
            marker = failures / f"stage{task.stageId()}-partition{task.partitionId()}"
            marker.touch()
            raise RuntimeError(f"injected failure at row {FAILING_ROW} of {marker.name}")
        return True

    failing_filter = F.udf(passes, "boolean").asNondeterministic()
    n_step = spark_timeline._TimelinePlan.n_step

    def n_step_then_failing(plan: Any, labelled: Any) -> Any:
        return n_step(plan, labelled).where(failing_filter(F.col("mdp_id")))

    spark_timeline._TimelinePlan.n_step = n_step_then_failing
    Engine(show_progress=False).run(pipeline(rows, folder / "failing", "spark"))


def timeline_rows(run: Path) -> dict[str, list[dict[str, Any]]]:
    import pyarrow.parquet as pq

    return {
        split: pq.read_table(run / "timeline" / split).to_pylist(maps_as_pydicts="strict")
        for split in ("train", "eval")
    }


def test_failed_spark_tasks_are_retried_and_the_timeline_is_complete_and_unique(tmp_path):
    rows = tmp_path / "rows.jsonl"
    logged = write_rows(rows)
    # The failing filter is Python: its workers must be this interpreter, with pyarrow.
    child = subprocess.run(
        [sys.executable, __file__, str(rows), str(tmp_path)],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-4000:]
    Engine(show_progress=False).run(pipeline(rows, tmp_path / "clean", "local"))

    failed_tasks = list((tmp_path / "failures").iterdir())
    assert len(failed_tasks) >= 2, "the fault was not injected"
    failing, clean = timeline_rows(tmp_path / "failing"), timeline_rows(tmp_path / "clean")
    assert failing == clean
    for split in failing.values():
        keys = [(row["mdp_id"], row["sequence_number"]) for row in split]
        assert len(keys) == len(set(keys)) and keys == sorted(keys)
    stages = {
        name: json.loads((tmp_path / name / "manifest.json").read_text())["stages"]["timeline"]
        for name in ("failing", "clean")
    }
    spark_details, local_details = (
        {key: value for key, value in stages[name]["details"].items() if key != "engine"}
        for name in ("failing", "clean")
    )
    assert spark_details == local_details
    assert stages["failing"]["dropped"] == stages["clean"]["dropped"]
    timeline = stages["failing"]
    assert timeline["rows_in"] == logged
    assert timeline["rows_in"] == timeline["rows_out"] + sum(timeline["dropped"].values())
    assert timeline["rows_out"] == len(failing["train"]) + len(failing["eval"])


def test_spark_writing_fewer_partitions_than_planned_is_an_error(tmp_path, spark, monkeypatch):
    """The files go to their split by the partition that wrote them: a plan Spark writes in
    one partition (here coalesced; a deterministic Python filter after the window did it too)
    once put every eval row in train while the counts said otherwise."""
    from horizon_engine.errors import HorizonError
    from horizon_plugins_spark import timeline as spark_timeline

    rows = tmp_path / "rows.jsonl"
    write_rows(rows)
    n_step = spark_timeline._TimelinePlan.n_step
    monkeypatch.setattr(
        spark_timeline._TimelinePlan,
        "n_step",
        lambda plan, labelled: n_step(plan, labelled).coalesce(1),
    )
    with pytest.raises(HorizonError, match="Spark did not write the partitions the plan made"):
        Engine(show_progress=False).run(pipeline(rows, tmp_path / "run", "spark"))


if __name__ == "__main__":
    build_with_failing_tasks(Path(sys.argv[1]), Path(sys.argv[2]))
