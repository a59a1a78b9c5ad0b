"""Each CPE estimate checks its own assumptions (horizon_plugins_cpe.diagnostics): support,
effective sample size, the model's held-out fit, enough episodes, a one-step estimator on
episodes; every failed check is a warning the verdict leaves the estimate out for."""

from __future__ import annotations

import numpy as np
import pytest

from horizon_engine import MIN_VERDICT_EPISODES, few_episodes_warning
from horizon_plugins_cpe.diagnostics import (
    MIN_EFFECTIVE_EPISODES,
    diagnose,
    feasible_range,
    held_out_fit,
    unit_of,
)
from horizon_plugins_cpe.formulas import CpeInputs, CpeOptions, ModelValues, estimate


def logged_episodes(
    episodes: int = 60, length: int = 5, target: np.ndarray | None = None, seed: int = 0
) -> CpeInputs:
    """``episodes`` of ``length`` steps logged uniformly at random over two actions, reward 1
    for action 1; the target probabilities ``target`` ``[2]`` on every row (uniform by
    default)."""
    rng = np.random.default_rng(seed)
    n = episodes * length
    action = rng.integers(0, 2, n)
    probabilities = np.tile(np.full(2, 0.5) if target is None else target, (n, 1))
    return CpeInputs(
        episode_starts=np.arange(0, n + 1, length, dtype=np.int64),
        rewards=(action == 1).astype(np.float64)[:, None],
        metric_names=("reward",),
        action=action.astype(np.int64),
        logged_propensity=np.full(n, 0.5),
        target_probabilities=probabilities,
        possible=np.ones((n, 2), dtype=bool),
        features=rng.normal(size=(n, 2)),
    )


OPTIONS = CpeOptions(gamma=1.0, num_bootstrap=50)


def checked(kind: str, inputs: CpeInputs, models: ModelValues | None = None, options=OPTIONS):
    result = estimate(kind, inputs, models, options)["reward"]
    return diagnose(kind, inputs, models, options, result, 0)


def test_units_follow_the_kind_the_discount_and_the_episodes():
    starts = np.array([0, 3, 5])
    assert unit_of("weighted_dr", starts, 1.0) == "return per episode"
    assert unit_of("fqe", starts, 0.99) == "return per episode, discounted at 0.99"
    assert unit_of("dr", starts, 1.0) == "reward per decision"
    # one-row episodes: a return is one reward
    assert unit_of("weighted_dr", np.arange(4), 1.0) == "reward per decision"


def test_a_policy_the_logger_covers_passes_the_weight_checks():
    found = checked("weighted_dr", logged_episodes())
    assert found.warnings == []
    assert found.diagnostics["nonzero_weight_share"] == 1.0
    assert found.diagnostics["effective_sample_size"] > MIN_EFFECTIVE_EPISODES
    assert found.diagnostics["unsupported_target_mass"] == 0.0
    assert found.diagnostics["horizon"] == 5.0
    assert (found.diagnostics["feasible_low"], found.diagnostics["feasible_high"]) == (0.0, 5.0)


def test_a_deterministic_policy_over_long_episodes_has_too_few_effective_episodes():
    """Always action 1 over 12 steps of a uniform logger: an episode keeps a weight only when
    the logger chose 1 twelve times (1 in 4,096)."""
    inputs = logged_episodes(episodes=200, length=12, target=np.array([0.0, 1.0]))
    models = ModelValues(*(np.zeros((2400, 1)),) * 2)
    found = checked("weighted_dr", inputs, models)
    assert found.diagnostics["nonzero_weight_share"] < 0.01
    assert any("importance weights have" in warning for warning in found.warnings)


def test_probability_on_an_action_no_row_logged_is_unsupported():
    inputs = logged_episodes()
    inputs = CpeInputs(
        **{
            **inputs.__dict__,
            "target_probabilities": np.tile([0.4, 0.3, 0.3], (inputs.num_rows, 1)),
            "possible": np.ones((inputs.num_rows, 3), dtype=bool),
        }
    )
    found = checked("snips", inputs)
    assert found.diagnostics["unsupported_target_mass"] == pytest.approx(0.3)
    assert any("no eval row logged" in warning for warning in found.warnings)


def test_a_one_step_estimator_on_episodes_is_flagged_and_on_one_row_episodes_is_not():
    found = checked("dr", logged_episodes())
    assert any("one-step estimator on episodes of 5" in warning for warning in found.warnings)
    bandit = checked("dr", logged_episodes(episodes=300, length=1))
    assert not any("one-step" in warning for warning in bandit.warnings)
    assert bandit.unit == "reward per decision"


def test_a_model_worse_than_the_mean_on_held_out_rows_fails():
    inputs = logged_episodes()
    rng = np.random.default_rng(1)
    noise = rng.normal(0.0, 3.0, (inputs.num_rows, 1))
    found = checked("fqe", inputs, ModelValues(noise, noise))
    assert found.diagnostics["q_model_fit"] < 0
    assert any("fits held-out rows worse than their mean" in w for w in found.warnings)


def test_held_out_fit_is_r_squared_and_none_for_constant_targets():
    targets = np.array([1.0, 2.0, 3.0, 4.0])
    assert held_out_fit(targets, targets) == 1.0
    assert held_out_fit(targets, np.full(4, 2.5)) == 0.0
    assert held_out_fit(np.ones(4), np.zeros(4)) is None


def test_too_few_episodes_and_no_interval_are_warnings():
    few = MIN_VERDICT_EPISODES - 1
    found = checked("ips", logged_episodes(episodes=few, length=1), options=CpeOptions())
    assert few_episodes_warning(few) in found.warnings
    none = checked("ips", logged_episodes(length=1), options=CpeOptions(num_bootstrap=0))
    assert "no interval (num_bootstrap = 0)" in none.warnings


def test_the_feasible_range_in_each_unit():
    rewards = np.array([-1.0, 0.0, 2.0])
    options = CpeOptions(gamma=0.5)
    assert feasible_range("reward per decision", rewards, 10, options) == (-1.0, 2.0)
    assert feasible_range("return per episode", rewards, 10, options) == (-10.0, 20.0)
    discounted = feasible_range("return per episode, discounted at 0.5", rewards, 10, options)
    assert discounted == (-2.0, 4.0)
    # positive rewards only: at least one of them, however soon an episode ends
    assert feasible_range("return per episode", np.ones(3), 10, options) == (1.0, 10.0)


def test_the_return_is_counted_over_the_logged_horizon_not_the_eval_splits():
    """The eval split's episodes end by step 5; the log's longest has 9 rows: the feasible
    range, the horizon and finite-horizon FQE's H are 9. Where every eval episode ends (its
    last row terminal) the steps past it add nothing: with the step as the state (one-hot),
    FQE is exact and says the same over 9 steps as over 5."""
    inputs = logged_episodes()
    steps = np.arange(inputs.num_rows) % 5
    inputs = CpeInputs(**{**inputs.__dict__, "features": np.eye(5)[steps]})
    longer = CpeInputs(**{**inputs.__dict__, "horizon": 9})
    assert (inputs.return_horizon, longer.return_horizon) == (5, 9)
    found = checked("fqe", longer)
    assert found.diagnostics["horizon"] == 9.0
    assert (found.diagnostics["feasible_low"], found.diagnostics["feasible_high"]) == (0.0, 9.0)
    result = estimate("fqe", longer, None, OPTIONS)["reward"]
    assert "H = 9 steps (the longest logged episode)" in result.note
    five = estimate("fqe", inputs, None, OPTIONS)["reward"]
    assert result.value == pytest.approx(five.value, rel=1e-4)  # the ridge's shrinkage apart
    # a uniform target earns 1 half the time over 5 steps
    assert result.value == pytest.approx(2.5, abs=0.3)


@pytest.mark.parametrize("kind", ["fqe", "weighted_dr", "magic", "mis"])
def test_an_eval_split_of_one_episode_is_estimated_and_flagged(kind):
    """One held-out episode (a small log's eval split): its models are fitted on itself, and
    the estimate fails the episodes check rather than the run."""
    found = checked(kind, logged_episodes(episodes=1, length=6))
    assert few_episodes_warning(1) in found.warnings
