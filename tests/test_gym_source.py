"""The built-in ``gym`` source: row shape, exact propensities, ONNX greedy policies, seeding."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from horizon_engine.builtin.gym_source import (
    GymSource,
    GymSourceConfig,
    collect_rows,
    layout_for_env,
)
from horizon_engine.errors import HorizonError
from horizon_engine.schema import ActionType, RowChecker, RowFormat, RowLayout, RowShaper

DISCRETE = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE)
CONTINUOUS = RowLayout(RowFormat.PRE_TIMELINE, ActionType.CONTINUOUS)


def _rows(config: GymSourceConfig, seed: int = 0, **kwargs) -> list[tuple[str, dict]]:
    return list(collect_rows(config, seed, **kwargs))


def _scores_model(path: Path, scores: list[float], with_mask: bool) -> str:
    """An ONNX model scoring CartPole actions as ``scores`` whatever the observation.

    The output is ``(obs [* mask]) @ zeros + scores``: it reads its inputs, as a real model
    does, but its argmax is fixed, so the test knows the greedy action.
    """
    n_obs, n_actions = 4, len(scores)
    inputs = [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [1, n_obs])]
    nodes = []
    features = "obs"
    if with_mask:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, n_obs]))
        nodes.append(helper.make_node("Mul", ["obs", "mask"], ["present"]))
        features = "present"
    nodes += [
        helper.make_node("MatMul", [features, "weights"], ["product"]),
        helper.make_node("Add", ["product", "bias"], ["scores"]),
    ]
    weights = np.zeros((n_obs, n_actions), dtype=np.float32)
    bias = np.array([scores], dtype=np.float32)
    graph = helper.make_graph(
        nodes,
        "constant_scores",
        inputs,
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, n_actions])],
        initializer=[
            numpy_helper.from_array(weights, "weights"),
            numpy_helper.from_array(bias, "bias"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return str(path)


def test_importing_the_source_does_not_import_gymnasium_or_onnxruntime():
    # `horizon plugins` imports every plugin module; the heavy libraries must load on use only.
    code = (
        "import sys, horizon_engine.builtin.gym_source; "
        "print(sorted({'gymnasium', 'onnxruntime'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_random_cartpole_rows_are_valid_pre_timeline_rows():
    config = GymSourceConfig(episodes=3, ds="2019-01-01")
    pairs = _rows(config)
    shaped = RowShaper(DISCRETE).shape(pairs)
    assert shaped.bad_rows == []
    assert shaped.ignored_fields == {}
    _, bad = RowChecker(DISCRETE).check(shaped.table, shaped.locations)
    assert bad == []

    steps = defaultdict(list)
    keys = [
        "ds",
        "mdp_id",
        "sequence_number",
        "state_features",
        "action",
        "reward",
        "action_probability",
        "possible_actions",
        "metrics",
    ]
    for location, row in pairs:
        assert list(row) == keys  # the seed walkthrough's JSON order
        assert location == f"episode {row['mdp_id']} step {row['sequence_number']}"
        assert row["ds"] == "2019-01-01"
        assert sorted(row["state_features"]) == ["0", "1", "2", "3"]
        assert row["possible_actions"] == ["0", "1"]
        assert row["action"] in ("0", "1")
        assert row["action_probability"] == 0.5
        assert row["reward"] == 1.0
        assert row["metrics"] == {"reward": row["reward"]}
        steps[row["mdp_id"]].append(row["sequence_number"])
    assert sorted(steps) == ["0", "1", "2"]
    for sequence in steps.values():
        assert sequence == list(range(len(sequence)))


def test_state_features_are_the_observation_before_the_action():
    import gymnasium

    pairs = _rows(GymSourceConfig(episodes=1, ds="2019-01-01"), seed=3)
    env = gymnasium.make("CartPole-v1")
    observation, _ = env.reset(seed=3)
    for _, row in pairs:
        assert row["state_features"] == {str(i): float(v) for i, v in enumerate(observation)}
        observation, *_ = env.step(int(row["action"]))
    env.close()


def test_epsilon_greedy_logs_exact_propensities():
    config = GymSourceConfig(episodes=200, max_steps=10, policy="epsilon_greedy", epsilon=0.2)
    pairs = _rows(config, greedy=lambda state: 1)
    actions = np.array([row["action"] == "1" for _, row in pairs])
    for _, row in pairs:
        expected = 0.9 if row["action"] == "1" else 0.1
        assert row["action_probability"] == expected
    # Action 1 is taken with probability 1 - 0.2 + 0.2 / 2 = 0.9. Over n ~ 2000 steps the
    # binomial standard error of the share is sqrt(0.9 * 0.1 / n) ~ 0.0067; 0.03 is ~4.5 of
    # them, so a correct policy fails this about once in 10^5 seeds (and this seed is fixed).
    assert len(actions) >= 1500
    assert abs(actions.mean() - 0.9) < 0.03


@pytest.mark.parametrize("with_mask", [False, True], ids=["obs-only", "obs-and-mask"])
def test_epsilon_greedy_with_an_onnx_model(tmp_path, with_mask):
    model = _scores_model(tmp_path / "policy.onnx", [1.0, 0.0], with_mask)
    config = GymSourceConfig(
        episodes=20, max_steps=20, policy="epsilon_greedy", epsilon=0.3, model=model
    )
    pairs = _rows(config)
    greedy_p, other_p = 1 - 0.3 + 0.3 / 2, 0.3 / 2
    for _, row in pairs:
        assert row["action_probability"] == (greedy_p if row["action"] == "0" else other_p)
    share = np.mean([row["action"] == "0" for _, row in pairs])
    assert share > 0.7  # the greedy action is 0: expected share 0.85, not 0.15


def test_missing_model_file_is_named(tmp_path):
    path = str(tmp_path / "nowhere.onnx")
    config = GymSourceConfig(episodes=1, policy="epsilon_greedy", epsilon=0.1, model=path)
    with pytest.raises(HorizonError, match=re.escape(path)):
        _rows(config)


def test_epsilon_below_one_without_a_model_is_an_error():
    config = GymSourceConfig(episodes=1, policy="epsilon_greedy", epsilon=0.5)
    with pytest.raises(HorizonError, match=r"needs a model = 'path\.onnx'"):
        _rows(config)


def test_epsilon_one_without_a_model_is_uniform():
    config = GymSourceConfig(episodes=1, policy="epsilon_greedy", epsilon=1.0)
    assert {row["action_probability"] for _, row in _rows(config)} == {0.5}


def test_same_seed_same_rows_other_seed_other_rows():
    config = GymSourceConfig(episodes=3, ds="2019-01-01")
    assert _rows(config, seed=7) == _rows(config, seed=7)
    assert _rows(config, seed=7) != _rows(config, seed=8)


def test_pendulum_random_actions_are_continuous_feature_maps():
    config = GymSourceConfig(env="Pendulum-v1", episodes=1, max_steps=50, ds="2019-01-01")
    pairs = _rows(config)
    assert len(pairs) == 50
    for _, row in pairs:
        assert sorted(row["state_features"]) == ["0", "1", "2"]
        assert list(row["action"]) == ["3"]
        assert -2.0 <= row["action"]["3"] <= 2.0
        assert "possible_actions" not in row
        assert row["action_probability"] == 1.0
    shaped = RowShaper(CONTINUOUS).shape(pairs)
    assert shaped.bad_rows == []
    assert RowChecker(CONTINUOUS).check(shaped.table, shaped.locations)[1] == []


def _actor_model(path: Path, weights: list[float]) -> str:
    """An ONNX continuous actor for Pendulum: ``action = (obs * presence) @ weights``, one
    action value, with the ``features``/``presence`` inputs and the ``action`` output of an
    exported actor."""
    nodes = [
        helper.make_node("Mul", ["features", "presence"], ["present"]),
        helper.make_node("MatMul", ["present", "weights"], ["action"]),
    ]
    graph = helper.make_graph(
        nodes,
        "linear_actor",
        [
            helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 3]),
            helper.make_tensor_value_info("presence", TensorProto.FLOAT, [1, 3]),
        ],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, [1, 1])],
        initializer=[numpy_helper.from_array(np.array([weights], np.float32).T, "weights")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return str(path)


def test_continuous_epsilon_greedy_needs_an_actor_model():
    config = GymSourceConfig(env="Pendulum-v1", episodes=1, policy="epsilon_greedy", epsilon=0.5)
    with pytest.raises(HorizonError, match=r"needs a model = 'path\.onnx': an exported actor"):
        _rows(config)


def test_continuous_epsilon_greedy_logs_the_actors_action(tmp_path):
    """The actor's action where it is within the bounds, clipped where it is not."""
    model = _actor_model(tmp_path / "actor.onnx", [0.0, 0.0, 1.0])  # the angular velocity
    config = GymSourceConfig(
        env="Pendulum-v1", episodes=2, policy="epsilon_greedy", epsilon=0.0, model=model
    )
    pairs = _rows(config)
    velocities = np.array([row["state_features"]["2"] for _, row in pairs])
    actions = np.array([row["action"]["3"] for _, row in pairs])
    assert np.abs(velocities).max() > 2.0, "some velocity outside the bounds, to clip"
    np.testing.assert_allclose(actions, np.clip(velocities, -2.0, 2.0), atol=1e-6)
    assert all(row["action_probability"] == 1.0 for _, row in pairs)


def test_continuous_epsilon_greedy_adds_noise_and_uniform_actions(tmp_path):
    """An actor that always says 0, on 1,000 steps: with ``action_noise = 0.1`` the actions'
    standard deviation is 0.1 of the half-range 2 (0.2; 10% allows for 1,000 draws); with
    ``epsilon = 0.2`` a fifth of them are uniform in [-2, 2] and the rest exactly 0."""
    model = _actor_model(tmp_path / "actor.onnx", [0.0, 0.0, 0.0])

    def actions(**options) -> np.ndarray:
        config = GymSourceConfig(
            env="Pendulum-v1", episodes=5, policy="epsilon_greedy", model=model, **options
        )
        return np.array([row["action"]["3"] for _, row in _rows(config)])

    noisy = actions(epsilon=0.0, action_noise=0.1)
    assert np.std(noisy) == pytest.approx(0.2, rel=0.1)
    assert abs(np.mean(noisy)) < 0.03
    mixed = actions(epsilon=0.2)
    assert (mixed == 0.0).mean() == pytest.approx(0.8, abs=0.04)
    assert (np.abs(mixed) <= 2.0).all() and np.abs(mixed).max() > 1.5


def test_a_discrete_model_is_no_continuous_actor(tmp_path):
    model = _scores_model(tmp_path / "scores.onnx", [0.0, 1.0], with_mask=True)
    config = GymSourceConfig(
        env="Pendulum-v1", episodes=1, policy="epsilon_greedy", epsilon=0.0, model=model
    )
    with pytest.raises(HorizonError, match="is no continuous actor"):
        _rows(config)


def test_layout_for_env():
    assert layout_for_env("CartPole-v1") == DISCRETE
    assert layout_for_env("Pendulum-v1") == CONTINUOUS


def test_unknown_env_is_a_horizon_error():
    with pytest.raises(HorizonError, match="NoSuchEnv-v0"):
        layout_for_env("NoSuchEnv-v0")


def test_config_rejects_out_of_range_values():
    with pytest.raises(ValueError, match="episodes"):
        GymSourceConfig(episodes=0)
    with pytest.raises(ValueError, match="epsilon"):
        GymSourceConfig(epsilon=1.5)


def test_read_uses_the_run_seed_and_yields_shaped_batches():
    source = GymSource(GymSourceConfig(episodes=2, ds="2019-01-01"))
    batches = list(source.read(SimpleNamespace(seed=5)))
    assert len(batches) == 1
    batch = batches[0]
    assert batch.layout == DISCRETE
    assert batch.bad_rows == []
    expected = _rows(GymSourceConfig(episodes=2, ds="2019-01-01"), seed=5)
    assert batch.locations == [location for location, _ in expected]
    assert batch.table.column("mdp_id").to_pylist() == [row["mdp_id"] for _, row in expected]
    assert GymSource.summary() == (
        "Runs a Gymnasium environment and logs its decisions as pre-timeline rows."
    )


def test_read_rejects_a_declared_layout_the_rows_cannot_have():
    source = GymSource(GymSourceConfig(episodes=1, row_format="timeline"))
    with pytest.raises(HorizonError, match="row_format = 'timeline'"):
        list(source.read(SimpleNamespace(seed=0)))


def _truncated_steps(pairs: list[tuple[str, dict]]) -> list[tuple[str, int]]:
    return [(row["mdp_id"], row["sequence_number"]) for _, row in pairs if "truncated" in row]


def test_the_environments_own_time_limit_is_logged_as_a_truncation():
    # A random policy never swings Acrobot up, so its episode ends at the 500-step limit,
    # which is no end state of the task: the last row says so for the timeline.
    pairs = _rows(GymSourceConfig(env="Acrobot-v1", episodes=1, ds="2019-01-01"))
    assert len(pairs) == 500
    assert _truncated_steps(pairs) == [("0", 499)]
    assert pairs[-1][1]["truncated"] is True
    shaped = RowShaper(DISCRETE).shape(pairs)
    assert shaped.bad_rows == [] and shaped.ignored_fields == {}
    assert shaped.table["truncated"].to_pylist() == [None] * 499 + [True]


def test_max_steps_is_a_truncation_and_a_real_termination_is_not():
    cut = _rows(GymSourceConfig(episodes=3, max_steps=5, ds="2019-01-01"))
    assert _truncated_steps(cut) == [("0", 4), ("1", 4), ("2", 4)]
    # Random CartPole falls over long before its 500-step limit: terminated, not truncated.
    ended = _rows(GymSourceConfig(episodes=3, ds="2019-01-01"))
    assert _truncated_steps(ended) == []
