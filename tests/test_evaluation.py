"""The estimator contract end to end: [[evaluation]] entries run after every epoch and in the
evaluation stage, on the eval split rebuilt as episodes; the policy-output type they read; and
the batch schema's checks."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from horizon_engine import (
    ActionType,
    ExplorationConfig,
    HorizonError,
    PolicyOutput,
    action_probabilities,
    check_batch,
    policy_output,
)
from horizon_engine.errors import ConfigError
from horizon_engine.pipeline import Engine

EPISODES = 12


def write_rows(path: Path) -> Path:
    """Episodes of different lengths and rewards, with two metrics (``clicks`` on every row,
    ``spend`` on even steps only), so that per-episode sums differ from episode to episode."""
    lines = []
    for episode in range(EPISODES):
        for step in range(2 + episode % 4):
            metrics = {"clicks": float(episode + step)}
            if step % 2 == 0:
                metrics["spend"] = 0.5 * step
            row = {
                "mdp_id": f"user{episode}",
                "sequence_number": 10 * step,
                "state_features": {"0": float(step), "1": float(episode % 3)},
                "action": str((episode + step) % 2),
                "action_probability": 0.5,
                "possible_actions": ["0", "1"],
                "metrics": metrics,
            }
            lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def pipeline(tmp_path: Path, *evaluation: dict, trainer: bool = True) -> dict:
    config = {
        "pipeline": {"output_dir": str(tmp_path / "run"), "seed": 1},
        "source": {"kind": "jsonl", "path": str(write_rows(tmp_path / "rows.jsonl"))},
        "timeline": {
            "actions": ["0", "1"],
            "reward": {"clicks": 1.0, "spend": -1.0},
            "eval_fraction": 0.5,
        },
        "normalization": {},
        "evaluation": list(evaluation),
    }
    if trainer:
        config["trainer"] = {"kind": "dqn", "epochs": 2, "layers": [8]}
    return config


def expected_logged_value(eval_split: Path) -> dict[str, float]:
    """The logged policy's mean per-episode sums, computed from the eval split's Parquet rows
    with pyarrow alone, as the estimator's answer is to be checked against."""
    table = pq.read_table(eval_split).to_pylist()
    episodes: dict[str, dict[str, float]] = {}
    for row in table:
        sums = episodes.setdefault(row["mdp_id"], {"reward": 0.0, "clicks": 0.0, "spend": 0.0})
        sums["reward"] += row["reward"]
        for name, value in row["metrics"] or []:
            sums[name] += value
    count = len(episodes)
    return {
        "episodes": float(count),
        "rows": float(len(table)),
        "reward_per_episode": sum(e["reward"] for e in episodes.values()) / count,
        "clicks_per_episode": sum(e["clicks"] for e in episodes.values()) / count,
        "spend_per_episode": sum(e["spend"] for e in episodes.values()) / count,
    }


def test_logged_value_runs_after_every_epoch_and_in_the_evaluation_stage(tmp_path):
    config = pipeline(tmp_path, {"kind": "logged_value"})
    manifest = Engine(show_progress=False).run(config)

    run = tmp_path / "run"
    written = json.loads((run / "cpe.json").read_text())
    expected = expected_logged_value(run / "timeline" / "eval")
    assert expected["episodes"] >= 3, "the seed must leave several episodes in the eval split"
    estimates = written["final"]["logged_value"]
    assert estimates.pop("reward_per_step") == pytest.approx(
        expected["reward_per_episode"] * expected["episodes"] / expected["rows"]
    )
    assert estimates == pytest.approx(expected)
    assert written["episodes"] == expected["episodes"]
    assert manifest["stages"]["evaluation"]["outputs"] == ["cpe.json"]
    assert "cpe_epochs.json" in manifest["stages"]["train"]["outputs"]
    assert [epoch["epoch"] for epoch in written["epochs"]] == [1, 2]
    for epoch in ("first_epoch", "last_epoch"):
        metrics = manifest["stages"]["train"]["details"][epoch]
        assert metrics["CPE/logged_value/reward_per_episode"] == pytest.approx(
            expected["reward_per_episode"]
        )


def test_entries_sharing_a_kind_are_labelled_by_position_and_every_epoch_can_be_off(tmp_path):
    config = pipeline(
        tmp_path, {"kind": "logged_value"}, {"kind": "logged_value", "every_epoch": False}
    )
    manifest = Engine(show_progress=False).run(config)

    estimates = json.loads((tmp_path / "run" / "cpe.json").read_text())["final"]
    assert sorted(estimates) == ["logged_value[0]", "logged_value[1]"]
    epoch = manifest["stages"]["train"]["details"]["last_epoch"]
    assert "CPE/logged_value[0]/episodes" in epoch
    assert not any(name.startswith("CPE/logged_value[1]") for name in epoch)


def test_evaluation_without_a_trainer_is_a_config_error(tmp_path):
    config = pipeline(tmp_path, {"kind": "logged_value"}, trainer=False)
    with pytest.raises(ConfigError, match=r"\[\[evaluation\]\] needs the \[trainer\] section"):
        Engine(show_progress=False).run(config)


def test_evaluation_of_an_empty_eval_split_says_what_to_change(tmp_path):
    config = pipeline(tmp_path, {"kind": "logged_value"})
    config["timeline"]["eval_fraction"] = 0.0
    engine = Engine(show_progress=False)
    with pytest.raises(ConfigError, match=r"eval_fraction = 0 holds out no episodes, and \["):
        engine.run(config)
    # A split already built without episodes is found by the stage itself.
    engine.run(config, stages=["source", "timeline", "normalization", "train"])
    with pytest.raises(HorizonError, match=r"eval_fraction > 0"):
        engine.run(config, stages=["evaluation"])


# --- the policy-output type ----------------------------------------------------------------------


class LinearScores(torch.nn.Module):
    def forward(self, values: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
        return torch.stack([values.sum(dim=1), -values.sum(dim=1), values[:, 1]], dim=1)


def test_discrete_output_has_scores_probabilities_and_the_most_probable_action():
    state = torch.tensor([[1.0, 2.0], [-3.0, 0.5], [0.0, 0.0]])
    possible = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    exploration = ExplorationConfig(policy="epsilon_greedy", epsilon=0.3)

    output = policy_output(
        LinearScores(), ActionType.DISCRETE, state, torch.ones_like(state), exploration, possible
    )

    scores = LinearScores()(state, state)
    assert torch.equal(output.scores, scores)
    expected = action_probabilities(scores, possible, "epsilon_greedy", 0.3)
    assert torch.equal(output.probabilities, expected)
    # Row 1 cannot take action 1 (the best score, 2.5): action 2 wins with 0.5 over -2.5. Row 2
    # recorded no possible actions, so all are possible; its tie goes to the first.
    assert output.action.tolist() == [0, 2, 0]
    assert output.probability_of(torch.tensor([0, 1, 2])).tolist() == pytest.approx([0.8, 0.0, 0.1])


def test_parametric_output_scores_each_rows_candidates():
    class CandidateScores(torch.nn.Module):
        def forward(self, values, presence, candidates, candidate_presence):
            return (candidates * candidate_presence).sum(dim=2) + values.sum(dim=1, keepdim=True)

    state = torch.tensor([[1.0], [0.0]])
    candidates = torch.tensor([[[1.0], [3.0], [9.0]], [[2.0], [-1.0], [0.0]]])
    real = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    output = policy_output(
        CandidateScores(),
        ActionType.PARAMETRIC,
        state,
        torch.ones_like(state),
        possible_actions=real,
        candidates=(candidates, torch.ones_like(candidates)),
    )
    # The padding slot of row 0 scores 10 but is no candidate.
    assert output.action.tolist() == [1, 0]
    assert output.probabilities.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def test_continuous_output_carries_the_action_and_the_log_density_of_a_stochastic_policy():
    class Gaussian(torch.nn.Module):
        def forward(self, values, presence):
            return values * 2.0, torch.full(values.shape[:1], -0.5)

    state = torch.tensor([[0.25, -1.0]])
    output = policy_output(Gaussian(), ActionType.CONTINUOUS, state, torch.ones_like(state))
    assert output.action.tolist() == [[0.5, -2.0]]
    assert output.log_density.tolist() == [-0.5]
    assert output.scores is None and output.probabilities is None
    with pytest.raises(HorizonError, match="log-density of its own action"):
        output.probability_of(torch.tensor([0]))


def test_a_parametric_policy_without_candidates_is_a_clear_error():
    with pytest.raises(HorizonError, match="needs each row's candidate actions"):
        policy_output(LinearScores(), ActionType.PARAMETRIC, torch.ones(1, 2), torch.ones(1, 2))


def test_policy_output_is_what_a_policy_says(tmp_path):
    output = PolicyOutput(ActionType.DISCRETE, action=torch.tensor([1]))
    assert output.scores is None and output.log_density is None


# --- the batch schema ----------------------------------------------------------------------------


def discrete_batch(rows: int = 4, features: int = 3, actions: int = 2) -> dict[str, torch.Tensor]:
    state = torch.zeros(rows, features)
    vector = torch.zeros(rows)
    index = torch.zeros(rows, dtype=torch.int64)
    mask = torch.ones(rows, actions)
    return {
        "state": state,
        "state_presence": state,
        "next_state": state,
        "next_state_presence": state,
        "reward": vector,
        "not_terminal": vector,
        "time_diff": vector,
        "action_probability": vector,
        "episode_id": index,
        "step": index,
        "action": index,
        "next_action": index,
        "possible_actions": mask,
        "possible_next_actions": mask,
    }


def test_a_batch_as_the_schema_declares_it_passes():
    check_batch(discrete_batch(), ActionType.DISCRETE)


def test_every_difference_from_the_schema_is_named():
    batch = discrete_batch()
    del batch["episode_id"]
    batch["step"] = batch["step"].float()
    batch["possible_actions"] = torch.ones(4, 3)
    batch["next_state"] = torch.zeros(4, 3, 1)
    batch["extra"] = torch.zeros(4)
    with pytest.raises(HorizonError) as raised:
        check_batch(batch, ActionType.DISCRETE)
    message = str(raised.value)
    assert message.startswith("a discrete batch: missing tensor 'episode_id'; ")
    assert "unknown tensor 'extra'" in message
    assert "'step' is float32, expected int64" in message
    assert "'next_state' has shape (4, 3, 1), expected ('B', 'F')" in message
    assert "'possible_next_actions' has A = 2, but 'possible_actions' has A = 3" in message


def test_a_batch_with_the_preprocessors_output_has_it_for_every_state():
    """The driver's batches carry the state preprocessor's output (``*_preprocessed``, ``W``
    columns, as many as the preprocessor makes of ``F`` features): all of them or none."""
    batch = discrete_batch(features=3)
    batch |= {"state_preprocessed": torch.zeros(4, 5), "next_state_preprocessed": torch.zeros(4, 5)}
    check_batch(batch, ActionType.DISCRETE)
    del batch["next_state_preprocessed"]
    with pytest.raises(HorizonError, match="missing tensor 'next_state_preprocessed'"):
        check_batch(batch, ActionType.DISCRETE)
    batch["next_state_preprocessed"] = torch.zeros(4, 6)
    with pytest.raises(HorizonError, match="'next_state_preprocessed' has W = 6, but"):
        check_batch(batch, ActionType.DISCRETE)
