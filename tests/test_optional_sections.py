"""A pipeline names what the user knows: its rows and its trainer. The stages between them run
at their defaults, the model is exported as ONNX, ``horizon validate`` says where each stage's
settings come from, and a pipeline with no rows to read is refused before anything runs."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from horizon_engine.cli import main
from horizon_engine.config import build_spec
from horizon_engine.errors import ConfigError, HorizonError
from horizon_engine.pipeline import Engine, NothingToResume
from horizon_engine.plugins import get_plugin_host

REFERENCE = Path(
    os.environ.get("HORIZON_REFERENCE_DATA")
    or Path(__file__).resolve().parents[2] / "shared" / "reference-data"
)
CARTPOLE_TIMELINE_ROWS = REFERENCE / "reagent" / "discrete_action" / "cartpole_training.json.bz2"


SOURCE_TO_REPORT = [
    "source",
    "timeline",
    "normalization",
    "train",
    "evaluation",
    "export",
    "report",
]
"""The stages a pipeline of ``[source]`` and ``[trainer]`` alone runs: the evaluation stage
at its defaults too, for the verdict on the policy."""


@pytest.fixture
def engine() -> Engine:
    return Engine(show_progress=False)


def logged_decisions(path: Path, episodes: int = 12, steps: int = 6) -> Path:
    """Logged decisions of a uniformly random logger choosing "left" or "right" (names the
    pipeline never lists), with a reward for "right" when feature 0 is positive."""
    rng = random.Random(0)
    lines = []
    for episode in range(episodes):
        for step in range(steps):
            state = {"0": rng.uniform(-1, 1), "1": rng.uniform(0, 5)}
            action = rng.choice(["left", "right"])
            lines.append(
                json.dumps(
                    {
                        "ds": "2024-01-01",
                        "mdp_id": f"user{episode}",
                        "sequence_number": step,
                        "state_features": state,
                        "action": action,
                        "action_probability": 0.5,
                        "reward": float(action == "right" and state["0"] > 0),
                        "possible_actions": ["left", "right"],
                        "metrics": {},
                    }
                )
            )
    path.write_text("\n".join(lines) + "\n")
    return path


def source_and_trainer(tmp_path: Path, trainer: str = 'kind = "dqn"\nepochs = 2') -> Path:
    rows = logged_decisions(tmp_path / "decisions.jsonl")
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(
        f'[pipeline]\noutput_dir = "{tmp_path / "run"}"\nseed = 0\n\n'
        f'[source]\nkind = "jsonl"\npath = "{rows}"\n\n'
        f"[trainer]\n{trainer}\n"
    )
    return pipeline


def test_source_and_trainer_alone_run_end_to_end_and_export_a_model(engine, tmp_path):
    """The run stopped at train ("reads normalization.json, which stage 'normalization'
    writes") and, before that, at the timeline for want of [timeline] actions."""
    manifest = engine.run(source_and_trainer(tmp_path))
    assert manifest["status"] == "succeeded"
    assert manifest["executed"] == SOURCE_TO_REPORT
    assert manifest["sections_at_defaults"] == [
        "timeline",
        "normalization",
        "export",
        "report",
        "evaluation",
    ]
    # Every value that applied is on record, the defaulted sections' as the written ones'.
    assert manifest["config"]["timeline"]["eval_fraction"] == 0.1
    evaluation = [(entry["kind"], entry.get("gamma")) for entry in manifest["config"]["evaluation"]]
    assert ("weighted_dr", 1.0) in evaluation and ("fqe", 1.0) in evaluation
    # The run ends with a verdict on the policy, whatever it decides on these few episodes.
    assert manifest["verdict"]["decision"] in ("better", "worse", "unclear")
    assert manifest["verdict"]["reasons"]
    assert manifest["config"]["normalization"]["engine"] == "local"
    assert manifest["config"]["export"]["kind"] == "onnx"
    timeline = manifest["stages"]["timeline"]["details"]
    assert timeline["actions"] == ["left", "right"]
    assert timeline["actions_from"] == "every name the rows log (whole numbers first, by value)"
    model = tmp_path / "run" / "model.onnx"
    assert manifest["stages"]["export"]["outputs"] == ["model.onnx"] and model.is_file()


def test_resume_compares_the_defaulted_sections_as_written_ones(engine, tmp_path):
    pipeline = source_and_trainer(tmp_path)
    engine.run(pipeline)
    with pytest.raises(NothingToResume):
        engine.run(pipeline, resume=True)
    with pytest.raises(HorizonError, match=r"in normalization\.num_samples; resuming"):
        engine.run(pipeline, ["normalization.num_samples=50"], resume=True)


def test_pipeline_stages_may_name_a_stage_whose_section_runs_at_its_defaults(engine, tmp_path):
    pipeline = source_and_trainer(tmp_path)
    manifest = engine.run(pipeline, stages=["source", "timeline"])
    assert manifest["executed"] == ["source", "timeline"]


def test_a_trainer_whose_model_is_no_policy_exports_nothing_unasked(tmp_path):
    """The world model learns the environment, not a policy: exporting it is an error."""
    pipeline = source_and_trainer(tmp_path, 'kind = "world_model"')
    spec = build_spec(pipeline, get_plugin_host())
    assert spec.at_defaults == ["timeline", "normalization", "report"]
    assert "export" not in spec.sections


def test_a_policy_without_evaluation_entries_is_judged_by_the_default_estimators(tmp_path):
    """Each estimator's default_entries, by label; none where no episode is held out (the
    evaluation stage would have nothing to judge on) or no policy is trained."""
    pipeline = source_and_trainer(tmp_path)
    result = CliRunner().invoke(main, ["validate", str(pipeline)])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.stdout.splitlines() if "evaluation" in line)
    assert line.split() == [
        "evaluation",
        "logged_value,",
        "weighted_dr,",
        "fqe,",
        "fqe_discounted,",
        "mis",
        "defaults",
        "(no",
        "[[evaluation]]",
        "section)",
    ]
    pipeline.write_text(pipeline.read_text() + "\n[timeline]\neval_fraction = 0\n")
    result = CliRunner().invoke(main, ["validate", str(pipeline)])
    assert result.exit_code == 0, result.output
    assert "evaluation" not in result.stdout


def test_horizon_validate_lists_each_stage_and_where_its_settings_come_from(tmp_path):
    pipeline = source_and_trainer(tmp_path)
    text = (
        pipeline.read_text() + '\n[timeline]\neval_fraction = 0.2\n\n[[evaluation]]\nkind = "fqe"\n'
    )
    pipeline.write_text(text)
    result = CliRunner().invoke(main, ["validate", str(pipeline)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"{pipeline}: valid; a run executes 7 stages:",
        f"  source         jsonl         [source] in {pipeline} line 5",
        f"  timeline       engine local  [timeline] in {pipeline} line 13",
        "  normalization  engine local  defaults (no [normalization] section)",
        f"  train          dqn           [trainer] in {pipeline} line 9",
        f"  evaluation     fqe           [[evaluation]] in {pipeline} line 16",
        "  export         onnx          defaults (no [export] section)",
        "  report         -             defaults (no [report] section)",
    ]
    overridden = CliRunner().invoke(
        main, ["validate", str(pipeline), "--set", "normalization.num_samples=50"]
    )
    assert (
        "  normalization  engine local  [normalization] from --set normalization.num_samples"
        in (overridden.stdout.splitlines())
    )


def test_a_pipeline_without_a_source_is_a_validate_error_naming_the_file(tmp_path):
    pipeline = tmp_path / "pipeline.toml"
    run = tmp_path / "run"
    pipeline.write_text(f'[pipeline]\noutput_dir = "{run}"\n\n[trainer]\nkind = "dqn"\n')
    result = CliRunner().invoke(main, ["validate", str(pipeline)])
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: {pipeline}: no [source] section, and {run}/timeline/timeline.json does not "
        "exist: the stages to run read it; add a [source] section naming the logged rows "
        "(`horizon plugins` lists the kinds): the stages between it and [trainer] run at their "
        "defaults\n"
    )
    assert not run.exists()
    pipeline.write_text(f'[pipeline]\noutput_dir = "{run}"\n')
    with pytest.raises(ConfigError, match=r"no \[source\] section: nothing would run; add a"):
        Engine(show_progress=False).validate(pipeline)


def test_dqn_on_horizons_timeline_rows_needs_neither_timeline_nor_normalization(engine, tmp_path):
    """Horizon's own CartPole timeline rows (3,470 rows, 29 episodes): the action names come
    from the rows' possible_actions masks."""
    if not CARTPOLE_TIMELINE_ROWS.is_file():
        pytest.skip(
            f"reference data not found: looked for {CARTPOLE_TIMELINE_ROWS} "
            "(set HORIZON_REFERENCE_DATA to the folder holding reagent/)"
        )
    config = {
        "pipeline": {"output_dir": str(tmp_path / "run")},
        "source": {"kind": "jsonl", "path": str(CARTPOLE_TIMELINE_ROWS)},
        "trainer": {"kind": "dqn", "epochs": 1},
    }
    manifest = engine.run(config)
    assert manifest["executed"] == SOURCE_TO_REPORT
    timeline = manifest["stages"]["timeline"]["details"]
    assert timeline["actions"] == ["0", "1"]
    assert timeline["actions_from"] == "the entries of the rows' possible_actions masks"
    assert (tmp_path / "run" / "model.onnx").is_file()
