"""CPE on the data Horizon itself logged (../shared/reference-data): every estimator runs on
its discrete and parametric CartPole logs, as a user pointing ``horizon run`` at them would.

The parametric log ends some episodes with a row that offers no candidates at all
(``possible_actions: []``, 26 of its 3,925 rows): nothing was chosen there, so those rows are
counted and taken as the logged action with weight 1, not a reason to stop the run.
"""

from __future__ import annotations

import bz2
import json
import os
from pathlib import Path

import pytest

from horizon_engine.pipeline import Engine

REFERENCE = Path(
    os.environ.get("HORIZON_REFERENCE_DATA")
    or Path(__file__).resolve().parents[2] / "shared" / "reference-data"
)
DISCRETE = REFERENCE / "reagent" / "discrete_action" / "cartpole_training.json.bz2"
PARAMETRIC = REFERENCE / "reagent" / "parametric_action" / "cartpole_training.json.bz2"
EVERY_KIND = ["dm", "ips", "snips", "dr", "sequential_dr", "weighted_dr", "magic", "fqe"]


def run_with_every_estimator(log: Path, output: Path, trainer: dict, timeline: dict) -> dict:
    """Train three epochs on ``log`` with every CPE estimator; ``cpe.json``."""
    if not log.is_file():
        pytest.skip(f"reference data not found: looked for {log}")
    config = {
        "pipeline": {"output_dir": str(output), "seed": 0},
        "source": {"kind": "jsonl", "path": str(log)},
        "timeline": {"eval_fraction": 0.2, **timeline},
        "normalization": {},
        "trainer": {"epochs": 3, "threads": 1, **trainer},
        "evaluation": [{"kind": kind, "num_bootstrap": 50} for kind in EVERY_KIND],
    }
    Engine(show_progress=False).run(config)
    return json.loads((output / "cpe.json").read_text())


def assert_every_estimate_made(cpe: dict) -> None:
    """Each estimator made a finite reward estimate, relative to a positive logged value,
    every epoch and at the end."""
    assert len(cpe["epochs"]) == 3
    for figures in [cpe["final"], *(epoch["estimates"] for epoch in cpe["epochs"])]:
        for kind in EVERY_KIND:
            reward = figures[kind]["reward"]
            assert reward["value"] is not None, kind
            assert reward["logged_value"] > 0, kind
            assert reward["relative"] is not None, kind


def test_every_estimator_runs_on_horizons_discrete_cartpole_log(tmp_path: Path):
    cpe = run_with_every_estimator(
        DISCRETE, tmp_path / "run", {"kind": "dqn"}, {"actions": ["0", "1"]}
    )
    assert_every_estimate_made(cpe)
    assert cpe["episodes"] >= 2 and cpe["eval_rows"] > cpe["episodes"]


def test_rows_offering_no_candidates_are_counted_not_fatal(tmp_path: Path):
    cpe = run_with_every_estimator(PARAMETRIC, tmp_path / "run", {"kind": "parametric_dqn"}, {})
    assert_every_estimate_made(cpe)
    with bz2.open(PARAMETRIC, "rt") as lines:
        rows = [json.loads(line) for line in lines]
    assert sum(not row["possible_actions"] for row in rows) == 26
    notes = {cpe["final"][kind]["reward"]["note"] or "" for kind in EVERY_KIND}
    assert all("offered no candidates" in note for note in notes), notes
