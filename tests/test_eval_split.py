"""The eval split is on record, and one too small to evaluate on is a warning at the timeline
stage, with the count and what to change, before any training time is spent.

With 43 episodes and eval_fraction 0.1, a seed can hold out none: the check before export
then used training rows and the estimators had nothing to evaluate, and nothing said so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from horizon_engine.errors import ConfigError
from horizon_engine.estimation import MIN_VERDICT_EPISODES
from horizon_engine.pipeline import MIN_EVAL_EPISODES, Engine
from horizon_engine.timeline import eval_split_value

SEED = 1


def episode_names(held_out: int, kept: int, fraction: float = 0.1) -> list[str]:
    """Episode ids of which exactly ``held_out`` fall in the eval split at ``SEED``."""
    names = [f"user{index}" for index in range(1000)]
    evaluated = [name for name in names if eval_split_value(SEED, name) < fraction]
    trained = [name for name in names if eval_split_value(SEED, name) >= fraction]
    return evaluated[:held_out] + trained[:kept]


def write_decisions(path: Path, episodes: list[str], steps: int = 4) -> Path:
    lines = [
        json.dumps(
            {
                "mdp_id": episode,
                "sequence_number": step,
                "state_features": {"0": float(step), "1": float(index % 3)},
                "action": str(step % 2),
                "action_probability": 0.5,
                "reward": float(step % 2),
                "possible_actions": ["0", "1"],
            }
        )
        for index, episode in enumerate(episodes)
        for step in range(steps)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def pipeline(tmp_path: Path, episodes: list[str], **sections: dict) -> dict:
    rows = write_decisions(tmp_path / "decisions.jsonl", episodes)
    return {
        "pipeline": {"output_dir": str(tmp_path / "run"), "seed": SEED},
        "source": {"kind": "jsonl", "path": str(rows)},
        **sections,
    }


def run_timeline(tmp_path: Path, episodes: list[str], **timeline: object) -> dict:
    config = pipeline(tmp_path, episodes, timeline=timeline)
    return Engine(show_progress=False).run(config)["stages"]["timeline"]


def test_the_timeline_records_each_splits_episodes_and_rows(tmp_path):
    stage = run_timeline(tmp_path, episode_names(held_out=3, kept=20))
    details = stage["details"]
    assert (details["train_episodes"], details["eval_episodes"]) == (20, 3)
    assert (details["train_rows"], details["eval_rows"]) == (80, 12)
    assert details["eval_fraction"] == 0.1
    assert stage["warnings"] == []


def test_an_eval_split_without_episodes_warns_with_the_count_and_the_fix(tmp_path):
    stage = run_timeline(tmp_path, episode_names(held_out=0, kept=43))
    assert stage["details"]["eval_episodes"] == 0
    assert stage["warnings"] == [
        "the eval split holds 0 of 43 episodes (0 rows; [timeline] eval_fraction = 0.1, the "
        "episodes chosen by a hash of mdp_id and the seed): the exported model is checked on "
        "training rows, the trainer is not evaluated after each epoch; raise [timeline] "
        "eval_fraction (eval_fraction = 0.12 holds out about 5 of 43 episodes) or log more "
        "episodes"
    ]


def test_an_eval_split_of_one_episode_warns(tmp_path):
    assert MIN_EVAL_EPISODES == 2
    stage = run_timeline(tmp_path, episode_names(held_out=1, kept=5))
    assert stage["warnings"] == [
        "the eval split holds 1 of 6 episodes (4 rows; [timeline] eval_fraction = 0.1, the "
        "episodes chosen by a hash of mdp_id and the seed): the evaluation after each epoch "
        "and the estimates rest on one episode; log more episodes"
    ]


def test_an_eval_split_too_small_for_the_verdict_warns_before_training(tmp_path):
    """Three held-out episodes are enough to evaluate on but not for a verdict: the estimators
    that will run (here the defaults a dqn pipeline implies) make the timeline say so, with
    an eval_fraction that holds out about 30 (the suggestion rounds up to the percent)."""
    assert MIN_VERDICT_EPISODES == 20
    config = pipeline(
        tmp_path, episode_names(held_out=3, kept=100), trainer={"kind": "dqn", "epochs": 1}
    )
    manifest = Engine(show_progress=False).run(config, stages=["source", "timeline"])
    assert "evaluation" in manifest["sections_at_defaults"]
    assert manifest["stages"]["timeline"]["warnings"] == [
        "the eval split holds 3 of 103 episodes (12 rows; [timeline] eval_fraction = 0.1, the "
        "episodes chosen by a hash of mdp_id and the seed): the verdict needs at least 20: on "
        "fewer it says unclear, with every value the rewards allow as its interval; raise "
        "[timeline] eval_fraction (eval_fraction = 0.3 holds out about 30 of 103 episodes) or "
        "log more episodes"
    ]


def test_an_eval_fraction_of_zero_is_the_users_choice_and_not_warned_at_the_timeline(tmp_path):
    stage = run_timeline(tmp_path, episode_names(held_out=2, kept=5), eval_fraction=0.0)
    assert stage["details"]["eval_episodes"] == 0
    assert stage["warnings"] == []


def test_training_without_eval_rows_says_what_the_export_is_checked_on(tmp_path):
    """The estimators would have nothing to estimate; the train stage records what the empty
    split cost, and the timeline stage's warning names [[evaluation]]."""
    config = pipeline(
        tmp_path,
        episode_names(held_out=0, kept=10),
        trainer={"kind": "dqn", "epochs": 1},
        evaluation=[{"kind": "logged_value"}],
    )
    engine = Engine(show_progress=False)
    manifest = engine.run(config, stages=["source", "timeline", "normalization", "train"])
    (timeline_warning,) = manifest["stages"]["timeline"]["warnings"]
    assert "and [[evaluation]] has nothing to estimate" in timeline_warning
    assert manifest["stages"]["train"]["warnings"] == [
        f"{tmp_path / 'run' / 'timeline'}/eval holds no rows: the trainer was not evaluated "
        "after each epoch, no estimator ran per epoch, and the exported model will be checked "
        "on training rows; raise [timeline] eval_fraction or log more episodes"
    ]


def test_estimators_with_no_episodes_held_out_are_refused_before_the_run(tmp_path):
    config = pipeline(
        tmp_path,
        episode_names(held_out=0, kept=4),
        timeline={"eval_fraction": 0.0},
        trainer={"kind": "dqn", "epochs": 1},
        evaluation=[{"kind": "logged_value"}],
    )
    with pytest.raises(ConfigError, match=r"\[timeline\] eval_fraction = 0 holds out no"):
        Engine(show_progress=False).validate(config)
    assert not (tmp_path / "run").exists()
