"""The reward model refit inside each bootstrap resample, against a plain loop that rebuilds
every resample's rows and fits the cross-fitted ridge model on them afresh.

``dm``'s and ``dr``'s intervals come from ``RidgeRefit``'s per-episode Gram pieces; the
reference here repeats each drawn episode's rows as often as it is drawn, calls
``fit_reward_model`` on each fold's resampled rows and values the other fold's resampled rows
with it, one resample at a time. Both must agree to 1e-6 (float64 in a different order agrees
to about 1e-12)."""

from __future__ import annotations

import numpy as np
import pytest
from test_cpe_formulas import random_data, weight

from horizon_plugins_cpe import formulas
from horizon_plugins_cpe.formulas import CpeOptions, ModelValues, bootstrap_counts, estimate
from horizon_plugins_cpe.models import (
    all_action_values,
    episode_folds,
    fit_reward_model,
    reward_model_values,
    state_basis,
)

TOLERANCE = 1e-6


def plain_refit_samples(kind, inputs, options, fit_seed):
    """``[B, M]``: each resample's estimate with the model refit on that resample's rows."""
    basis = state_basis(inputs)
    starts = inputs.episode_starts
    num_actions = inputs.target_probabilities.shape[1]
    folds = episode_folds(inputs.num_episodes, fit_seed)
    episode = np.repeat(np.arange(inputs.num_episodes), np.diff(starts))
    samples = []
    for counts in bootstrap_counts(inputs.num_episodes, options):
        rows = {
            fold: [
                i
                for e in range(inputs.num_episodes)
                if folds[e] == fold
                for _ in range(int(counts[e]))
                for i in range(starts[e], starts[e + 1])
            ]
            for fold in (0, 1)
        }
        total = np.zeros(inputs.rewards.shape[1])
        for fold in (0, 1):
            if not rows[fold]:
                continue
            fit_rows = rows[1 - fold]
            if not fit_rows:  # no episode of the fold drawn: the data's fit for that fold
                fit_rows = [i for i in range(inputs.num_rows) if folds[episode[i]] == 1 - fold]
            model = fit_reward_model(
                basis[fit_rows], inputs.action[fit_rows], inputs.rewards[fit_rows], num_actions
            )
            for i in rows[fold]:
                values = all_action_values(basis[i : i + 1], model, num_actions)[0]  # [A, M]
                total += inputs.target_probabilities[i] @ values
                if kind == "dr":
                    w = weight(inputs, i, options)
                    total += w * (inputs.rewards[i] - values[inputs.action[i]])
        samples.append(total / (len(rows[0]) + len(rows[1])))
    return np.array(samples)


@pytest.mark.parametrize("kind", ["dm", "dr"])
@pytest.mark.parametrize(
    ("episodes", "options"),
    [
        (40, CpeOptions(num_bootstrap=40, seed=3)),
        (40, CpeOptions(num_bootstrap=25, seed=1, weight_clip=2.0, propensity_floor=0.1)),
        (2, CpeOptions(num_bootstrap=8, seed=2)),
    ],
)
def test_refit_interval_matches_a_plain_refit_per_resample(kind, episodes, options, monkeypatch):
    """The interval and the relative interval are the quantiles of the plain loop's
    estimates (the logged value's resamples are the same as before); the point estimate is
    the data's cross-fitted model's, as without a refit. With two episodes, half the
    resamples draw only one fold's episode: the other fold keeps the data's fit. ``dr``
    refits only when ``REFIT_KINDS`` names it (its refit is checked here all the same)."""
    monkeypatch.setattr(formulas, "REFIT_KINDS", ("dm", "dr"))
    inputs, _ = random_data(seed=21, episodes=episodes)
    fit_seed = 5  # the folds are the fit's, whatever seed the bootstrap uses
    models = reward_model_values(inputs, CpeOptions(seed=fit_seed))
    result = estimate(kind, inputs, models, options)
    samples = plain_refit_samples(kind, inputs, options, fit_seed)
    fixed = estimate(kind, inputs, ModelValues(models.logged, models.expected), options)
    logged = np.array(
        [
            [
                (counts @ np.add.reduceat(inputs.rewards[:, m], inputs.episode_starts[:-1]))
                / (counts @ np.diff(inputs.episode_starts))
                for m in range(inputs.rewards.shape[1])
            ]
            for counts in bootstrap_counts(inputs.num_episodes, options)
        ]
    )
    tail = (1 - options.confidence) / 2
    for m, name in enumerate(inputs.metric_names):
        low, high = np.quantile(samples[:, m], [tail, 1 - tail])
        assert result[name].low == pytest.approx(low, abs=TOLERANCE)
        assert result[name].high == pytest.approx(high, abs=TOLERANCE)
        relative = np.quantile(samples[:, m] / logged[:, m], [tail, 1 - tail])
        assert result[name].relative_low == pytest.approx(relative[0], abs=TOLERANCE)
        assert result[name].relative_high == pytest.approx(relative[1], abs=TOLERANCE)
        assert result[name].value == fixed[name].value
        assert result[name].relative == fixed[name].relative
        assert fixed[name].note and "holds the model's given values fixed" in fixed[name].note
        assert result[name].note is None or "fixed" not in result[name].note


def test_refit_of_all_the_data_reproduces_the_point_estimate():
    """Every count 1 is the data itself: the refit's sums are the cross-fitted values'."""
    inputs, _ = random_data(seed=22)
    models = reward_model_values(inputs, CpeOptions(seed=4))
    weights = np.random.default_rng(0).random(inputs.num_rows)
    ones = np.ones((1, inputs.num_episodes))
    expected = models.refit.sums(None)(ones)[0]
    assert expected == pytest.approx(models.expected.sum(axis=0), abs=1e-9)
    corrected = models.refit.sums(weights)(ones)[0]
    assert corrected == pytest.approx(expected - weights @ models.logged, abs=1e-9)


def test_dr_holds_its_cross_fitted_model_fixed_by_default():
    """``dr``'s interval is the fixed model's (its error enters only at second order), and
    says nothing about it; ``dm``'s with values given as arrays says it is held fixed."""
    inputs, _ = random_data(seed=26)
    options = CpeOptions(num_bootstrap=30)
    models = reward_model_values(inputs, options)
    arrays = ModelValues(models.logged, models.expected)
    refit = estimate("dr", inputs, models, options)["reward"]
    fixed = estimate("dr", inputs, arrays, options)["reward"]
    assert refit == fixed and fixed.note is None
    assert "held" not in (estimate("dm", inputs, models, options)["reward"].note or "")
    assert (
        "holds the model's given values fixed"
        in estimate("dm", inputs, arrays, options)["reward"].note
    )


@pytest.mark.parametrize("kind", ["dm", "dr"])
def test_refit_in_blocks_changes_no_number(kind, monkeypatch):
    """Resamples in blocks of one row give the very interval one block gives."""
    monkeypatch.setattr(formulas, "REFIT_KINDS", ("dm", "dr"))
    inputs, _ = random_data(seed=23)
    options = CpeOptions(num_bootstrap=30, seed=1)
    whole = estimate(kind, inputs, reward_model_values(inputs, options), options)
    monkeypatch.setattr(formulas, "BOOTSTRAP_ENTRIES", 1)
    blocked = estimate(kind, inputs, reward_model_values(inputs, options), options)
    for name in inputs.metric_names:
        for field in ("value", "low", "high", "relative_low", "relative_high"):
            assert getattr(blocked[name], field) == pytest.approx(
                getattr(whole[name], field), abs=1e-12
            ), field


@pytest.mark.parametrize(("limit", "why"), [("REFIT_ENTRIES", "pairs"), ("REFIT_WIDTH", "coeff")])
def test_too_large_to_refit_holds_the_model_fixed_and_says_so(limit, why, monkeypatch):
    from horizon_plugins_cpe import models as fitting

    inputs, _ = random_data(seed=24)
    options = CpeOptions(num_bootstrap=20)
    models = reward_model_values(inputs, options)
    monkeypatch.setattr(fitting, limit, 10)
    result = estimate("dm", inputs, models, options)["reward"]
    fixed = estimate("dm", inputs, ModelValues(models.logged, models.expected), options)["reward"]
    assert "held fixed in the bootstrap" in result.note and why in result.note
    assert (result.low, result.high) == (fixed.low, fixed.high)


def test_refit_of_one_episode_fits_the_episode_itself():
    """One episode is one fold: every resample is the episode, valued by its own fit."""
    from horizon_plugins_cpe.models import RidgeRefit

    inputs, _ = random_data(seed=25, episodes=1)
    num_actions = inputs.target_probabilities.shape[1]
    basis = state_basis(inputs)
    model = fit_reward_model(basis, inputs.action, inputs.rewards, num_actions)
    values = all_action_values(basis, model, num_actions)
    expected = RidgeRefit(inputs, seed=0).sums(None)(np.ones((3, 1)))
    wanted = np.einsum("na,nam->m", inputs.target_probabilities, values)
    assert expected == pytest.approx(np.tile(wanted, (3, 1)), abs=TOLERANCE)
