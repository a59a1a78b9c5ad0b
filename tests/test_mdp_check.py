"""The world model in the pipeline: as a trainer, as the ``analysis`` stage, and through
``horizon check-mdp``, on CartPole data from ``horizon gym collect`` and on Horizon's own logs.

CartPole's answers are known from its equations: an action pushes the cart, which changes the
cart's velocity (feature 1) and the pole's angular velocity (3) at the next step, and through
them the position (0) and angle (2), whose limits end the episode; the reward is 1 on every
step. So the action must rank among the top two inputs for predicting the angular velocity
(after the angular velocity itself), and every check must pass: the actions move the state,
the state predicts the next state, the features the actions move predict the episode's end (the
reward being constant) and no feature is idle.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from horizon_engine import ConfigError, HorizonError
from horizon_engine.cli import main
from horizon_engine.pipeline import Engine

REFERENCE = Path(
    os.environ.get("HORIZON_REFERENCE_DATA")
    or Path(__file__).resolve().parents[2] / "shared" / "reference-data"
)
CARTPOLE = REFERENCE / "reagent" / "discrete_action" / "cartpole_training.json.bz2"

EVERY_CHECK_PASSES = {
    "actions_predict_transitions": "yes",
    "state_predicts_next_state": "yes",
    "moved_features_predict_reward": "yes",
    "features_explaining_nothing": "none",
}


def verdicts(run_dir: Path) -> dict[str, str]:
    result = json.loads((run_dir / "analysis" / "mdp_check.json").read_text())
    return {check["name"]: check["verdict"] for check in result["checks"]}


def test_the_world_model_trains_as_a_trainer_and_refuses_to_be_exported(tmp_path):
    config = {
        "pipeline": {"output_dir": str(tmp_path), "seed": 0},
        "source": {"kind": "gym", "env": "CartPole-v1", "episodes": 30, "ds": "2019-01-01"},
        "timeline": {"actions": ["0", "1"], "eval_fraction": 0.2},
        "normalization": {},
        "trainer": {"kind": "world_model", "epochs": 5, "threads": 1},
    }
    manifest = Engine(show_progress=False).run(config)

    train = manifest["stages"]["train"]["details"]
    first, last = train["first_epoch"], train["last_epoch"]
    for name in ("next_state_nll", "termination_nll", "reward_mse"):
        assert f"Training/{name}" in last and f"Evaluation/{name}" in last
    assert last["Training/next_state_nll"] < first["Training/next_state_nll"]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    with pytest.raises(HorizonError, match="not a policy: it cannot be exported"):
        Engine(show_progress=False).run({**config, "export": {"kind": "onnx"}}, stages=["export"])


def test_an_analysis_kind_that_cannot_analyse_is_refused_before_running(tmp_path):
    config = {
        "pipeline": {"output_dir": str(tmp_path)},
        "source": {"kind": "gym", "env": "CartPole-v1", "episodes": 5},
        "timeline": {"actions": ["0", "1"]},
        "normalization": {},
        "analysis": {"kind": "dqn"},
    }
    with pytest.raises(ConfigError, match="'dqn' is a trainer that does not analyse data"):
        Engine(show_progress=False).validate(config)


ANOTHER_ANALYSIS = '''
from horizon_engine import hookimpl
from horizon_plugins_worldmodel.trainer import WorldModelTrainer


class OtherAnalysis(WorldModelTrainer):
    """Analyses the data as the world model does, under another name."""

    name = "other_analysis"


@hookimpl
def horizon_register_trainers(register):
    register(OtherAnalysis)
'''


def test_check_mdp_refuses_another_analysis_kind_before_running_anything(
    plugin_site, tmp_path, monkeypatch
):
    """check-mdp prints the world model's report: with another ``[analysis]`` trainer (one
    that can analyse, from a third party) it has no report to print, and says so before any
    stage runs rather than failing on a missing file afterwards."""
    from horizon_engine import plugins
    from horizon_plugins_worldmodel.commands import check_mdp

    module = "horizon_plugin_other_analysis"
    plugin_site.install(
        "horizon-plugin-other-analysis",
        "1.0",
        {"other_analysis": module},
        {f"{module}.py": ANOTHER_ANALYSIS},
    )
    monkeypatch.setattr(plugins, "_default_host", plugins.PluginHost())
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(
        f'[pipeline]\noutput_dir = "{tmp_path / "run"}"\n\n'
        '[source]\nkind = "gym"\nenv = "CartPole-v1"\nepisodes = 5\n\n'
        '[analysis]\nkind = "other_analysis"\n',
        encoding="utf-8",
    )

    with pytest.raises(HorizonError, match="kind = 'other_analysis'; check-mdp checks the data"):
        check_mdp(pipeline, [])
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_check_mdp_on_cartpole_from_gym_collect(tmp_path):
    """200 random episodes (about 4,500 rows); 40 passes of each model were enough here,
    where the default's 1,000 updates would take twice as long."""
    runner = CliRunner()
    rows = tmp_path / "rows.jsonl"
    collected = runner.invoke(
        main, ["gym", "collect", "--episodes", "200", "--seed", "0", "-o", str(rows)]
    )
    assert collected.exit_code == 0, collected.output
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(
        f'[pipeline]\noutput_dir = "{tmp_path / "run"}"\n'
        f'[source]\nkind = "jsonl"\npath = "{rows}"\n'
        '[timeline]\nactions = ["0", "1"]\n'
        "[analysis]\nepochs = 40\nmin_updates = 1\nthreads = 1\n"
    )

    checked = runner.invoke(main, ["check-mdp", str(pipeline)])

    assert checked.exit_code == 0, checked.output
    assert "feature  transition (nats)" in checked.output
    run = tmp_path / "run"
    assert verdicts(run) == EVERY_CHECK_PASSES
    result = json.loads((run / "analysis" / "mdp_check.json").read_text())
    for_angular_velocity = sorted(
        result["feature_importance"], key=lambda row: -row["next_state_by_feature"]["3"]
    )
    assert "action" in [row["feature"] for row in for_angular_velocity[:2]]
    assert result["influence"]["action"] == ["1", "3"]
    assert (run / "analysis" / "feature_importance.png").read_bytes().startswith(b"\x89PNG")
    page = tmp_path / "report.html"
    reported = runner.invoke(main, ["report", str(run), "-o", str(page)])
    assert reported.exit_code == 0, reported.output
    section = page.read_text().split('<section id="mdp_check">', 1)[1].split("</section>")[0]
    assert "Do actions predict transitions?" in section and "data:image/png" in section

    again = runner.invoke(main, ["check-mdp", str(pipeline)])
    assert again.exit_code == 0, again.output
    assert json.loads((run / "manifest.json").read_text())["executed"] == ["analysis"]


@pytest.mark.slow
def test_horizons_logged_cartpole_gets_the_same_verdicts(tmp_path):
    """3,470 rows in 29 episodes, logged by Horizon's near-greedy policy (11 of them end at
    the 200-step limit, not because the pole fell). Measured: the action adds 0.83 nats per
    transition (0.66 to 0.99); without the features it moves, the model loses 0.24 (0.15 to
    0.39) of the information in when an episode ends."""
    if not CARTPOLE.is_file():
        pytest.skip(f"reference data not found: looked for {CARTPOLE}")
    config = {
        "pipeline": {"output_dir": str(tmp_path), "seed": 0},
        "source": {"kind": "jsonl", "path": str(CARTPOLE)},
        "timeline": {"actions": ["0", "1"]},
        "normalization": {},
        "analysis": {"threads": 1},
    }
    manifest = Engine(show_progress=False).run(config)

    assert verdicts(tmp_path) == EVERY_CHECK_PASSES
    analysis = manifest["stages"]["analysis"]
    assert analysis["details"] == EVERY_CHECK_PASSES
    events = [path for path in analysis["outputs"] if path.startswith("tensorboard/")]
    assert events, "the first fold's losses go to TensorBoard as WorldModel/<loss>"
