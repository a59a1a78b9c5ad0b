"""Choosing the checkpoint to ship by the verdict (issue 34, item 6): ``[export] checkpoint =
"best"`` evaluates epochs' checkpoints, ships the one whose verdict has the highest lower
bound, and says what it chose among and why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
from click.testing import CliRunner

from horizon_engine.cli import main
from horizon_engine.errors import ConfigError, HorizonError
from horizon_engine.evaluation_stage import evaluate_run
from horizon_engine.export_stage import trained_policy
from horizon_engine.pipeline import Engine
from horizon_engine.plugins import get_plugin_host
from horizon_engine.run_folder import RunFolder
from horizon_engine.verdict import (
    MAX_SHIP_CANDIDATES,
    ship_candidates,
    ship_choice,
    shipped_epoch,
    verdict_lines,
)


def verdict(low, high, trusted=True, unit="return per episode", decision="unclear"):
    return {
        "estimator": "fqe",
        "estimate": (low + high) / 2,
        "interval": [low + 20, high + 20],
        "difference_interval": [low, high],
        "unit": unit,
        "trusted": trusted,
        "decision": decision,
    }


def test_every_epoch_is_a_candidate_up_to_the_most_then_spread_from_first_to_last():
    assert ship_candidates([1, 2, 3]) == [1, 2, 3]
    epochs = list(range(1, 21))
    chosen = ship_candidates(epochs)
    assert len(chosen) == MAX_SHIP_CANDIDATES == 10
    assert chosen[0] == 1 and chosen[-1] == 20 and chosen == sorted(set(chosen))


def test_the_highest_lower_bound_ships_not_the_highest_estimate():
    choice = ship_choice(
        [
            (1, verdict(-5.0, 60.0)),  # the highest estimate, on an interval that says little
            (2, verdict(4.0, 10.0, decision="better")),
            (3, verdict(1.0, 30.0, decision="better")),
        ]
    )
    assert choice["epoch"] == 2 and choice["last_epoch"] == 3
    assert choice["evaluated"] == [1, 2, 3]
    assert [c["epoch"] for c in choice["candidates"]] == [1, 2, 3]
    assert choice["reason"] == (
        "of the 3 epochs evaluated (1, 2, 3), epoch 2's verdict has the highest lower bound of "
        "the difference from the logged policy, 4 return per episode; the last epoch's is 1"
    )


def test_untrusted_verdicts_and_later_units_do_not_compete_and_ties_go_to_the_later_epoch():
    choice = ship_choice(
        [
            (1, verdict(50.0, 60.0, trusted=False)),
            (2, verdict(90.0, 99.0, unit="return per episode, discounted at 0.99")),
            (3, verdict(2.0, 9.0)),
            (4, verdict(2.0, 8.0)),
        ]
    )
    assert choice["epoch"] == 4
    nothing = ship_choice([(1, verdict(5.0, 9.0, trusted=False)), (2, {"trusted": "yes"})])
    assert nothing["epoch"] == 2
    assert nothing["reason"].startswith("no evaluated epoch's verdict rests on an estimate")


def test_a_recorded_choice_is_checked_against_the_folders_checkpoints():
    record = {"checkpoint": {"epoch": 2}}
    assert shipped_epoch(record, [1, 2, 3], "cpe.json") == 2
    for hostile in (
        {"checkpoint": {"epoch": 9}},
        {"checkpoint": {"epoch": "2"}},
        {"checkpoint": {"epoch": True}},
        {"checkpoint": [2]},
    ):
        with pytest.raises(HorizonError, match=r"verdict\.checkpoint\.epoch"):
            shipped_epoch(hostile, [1, 2, 3], "cpe.json")
    with pytest.raises(HorizonError, match="chose no checkpoint to ship"):
        shipped_epoch({}, [1, 2, 3], "cpe.json")


def pipeline(tmp_path: Path, **export: object) -> dict:
    return {
        "pipeline": {"output_dir": str(tmp_path / "run"), "seed": 0},
        "source": {"kind": "gym", "episodes": 100, "ds": "2019-01-01"},
        "timeline": {"eval_fraction": 0.25},
        "trainer": {"kind": "dqn", "epochs": 3},
        "export": {"kind": "onnx", **export},
    }


def onnx_scores(model: Path, states: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    feeds = {names[0]: states, names[1]: np.ones_like(states)}
    return session.run(None, feeds)[0]


def test_the_run_ships_the_epoch_its_verdict_chose_and_says_so(tmp_path):
    """The exported model is the chosen epoch's policy (its scores, not the last epoch's),
    the export stage names its checkpoint, and `horizon run` ends by saying what shipped."""
    config = pipeline(tmp_path, checkpoint="best")
    manifest = Engine(show_progress=False).run(config)
    choice = manifest["verdict"]["checkpoint"]
    assert choice["rule"] == "best" and choice["evaluated"] == [1, 2, 3]
    assert [c["epoch"] for c in choice["candidates"]] == [1, 2, 3]
    epoch = choice["epoch"]
    shipped = RunFolder.checkpoint_name(epoch)
    assert manifest["stages"]["export"]["details"]["checkpoint"] == shipped
    cpe = json.loads((tmp_path / "run" / RunFolder.CPE).read_text())
    assert cpe["verdict"] == manifest["verdict"]
    chosen = next(c for c in choice["candidates"] if c["epoch"] == epoch)
    assert cpe["verdict"]["estimate"] == chosen["estimate"]
    run_dir = tmp_path / "run"
    trainer = Engine(show_progress=False).validate(config).sections["trainer"]
    states = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    expected = {}
    for found in (1, 2, 3):
        policy = trained_policy(
            run_dir, trainer, get_plugin_host(), run_dir / RunFolder.checkpoint_name(found)
        )
        with torch.no_grad():
            expected[found] = policy(torch.from_numpy(states), torch.ones(16, 4)).numpy()
    scores = onnx_scores(run_dir / RunFolder.MODEL, states)
    assert np.allclose(scores, expected[epoch], atol=1e-5)
    others = [found for found in expected if not np.allclose(expected[found], expected[epoch])]
    assert others, "the epochs' policies should differ, or the check above proves nothing"
    assert any(line.startswith("  shipped: epoch ") for line in verdict_lines(manifest["verdict"]))
    # `horizon evaluate` evaluates the checkpoint the run shipped, not the latest
    evaluated = evaluate_run(run_dir, default_evaluation=[{"kind": "logged_value"}])
    assert evaluated["checkpoint"] == shipped


def test_best_without_any_estimator_is_refused_before_the_run(tmp_path):
    config = pipeline(tmp_path, checkpoint="best")
    config["timeline"]["eval_fraction"] = 0.0
    with pytest.raises(ConfigError, match='checkpoint = "best" ships the epoch the verdict'):
        Engine(show_progress=False).validate(config)


def test_a_new_evaluation_makes_the_export_stale_and_export_needs_the_choice(tmp_path):
    """The export reads cpe.json when the evaluation wrote it: running the evaluation again
    makes the export stale. `horizon export` of a folder whose cpe.json holds no choice says
    which stage makes it, instead of shipping the last epoch silently."""
    config = pipeline(tmp_path, checkpoint="best")
    config["trainer"]["epochs"] = 1
    engine = Engine(show_progress=False)
    engine.run(config)
    manifest = engine.run(config, stages=["evaluation"])
    assert manifest["stages"]["export"].get("stale")
    cpe_path = tmp_path / "run" / RunFolder.CPE
    cpe = json.loads(cpe_path.read_text())
    del cpe["verdict"]["checkpoint"]
    cpe_path.write_text(json.dumps(cpe))
    result = CliRunner().invoke(main, ["export", str(tmp_path / "run")])
    assert result.exit_code == 1
    assert "its verdict chose no checkpoint to ship" in result.output
    assert "Traceback" not in result.output
