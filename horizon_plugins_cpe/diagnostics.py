"""Each estimate checks the assumptions it rests on, on the data it was made from.

An estimate is only as good as what it assumes: importance weights need the logger to have
taken the actions the policy takes (support) and enough episodes whose weight is not zero
(effective sample size); a model needs to fit rows it was not fitted on, and a Q model a
policy that stays where the logger went (state coverage); a bootstrap interval
needs enough episodes to resample; a one-step estimator assumes every episode is one
decision. ``diagnose`` measures each of these for one estimate and turns every failed check
into a sentence (``Estimate.warnings``): the verdict (``horizon_engine.verdict``) leaves an
estimate with any out and says why.

The thresholds are the least a figure must reach to be worth a decision, not tuned values:
the core's ``MIN_VERDICT_EPISODES`` for a percentile interval (its ``few_episodes_warning``),
ten effective episodes for a weighted mean, a held-out fit better than the targets' own
mean.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from horizon_engine import few_episodes_warning
from horizon_plugins_cpe.formulas import (
    FIXED_MODEL,
    ONE_STEP_KINDS,
    CpeInputs,
    CpeOptions,
    MetricEstimate,
    ModelValues,
    cumulative_weights,
    logged_propensities,
    step_weights,
)
from horizon_plugins_cpe.models import return_bounds

MIN_EFFECTIVE_EPISODES = 10.0
"""An importance-weighted estimate whose weights' effective sample size is below this rests
on a handful of episodes (or rows), whatever its interval says."""

MIN_MODEL_FIT = 0.0
"""A model whose held-out R^2 is below this predicts its targets worse than their mean."""

MAX_UNSUPPORTED_MASS = 0.01
"""More of the policy's probability than this on actions no eval row logged, and importance
weights cannot see what those actions earn."""

WEIGHTED_KINDS = ("ips", "snips", "dr", "sequential_dr", "weighted_dr", "magic", "mis")
"""The kinds whose value or interval rests on the importance weights' effective sample size.
MAGIC blends towards its model where the weights are poor, which keeps its value sensible,
but its interval holds that model fixed: with no effective weight it is the model alone with
an interval of the model's values, which leaves out the model's error."""

Q_KINDS = ("sequential_dr", "weighted_dr", "magic", "fqe")
"""The kinds whose model is the evaluated policy's Q (checked by its Bellman fit)."""

UNSETTLED_MARKERS = ("does not contract", "did not settle")
"""Words of a model's note that say its fit stopped short of its fixed point."""


@dataclass
class Checked:
    """One estimate's unit, diagnostics and failed checks."""

    unit: str
    diagnostics: dict[str, float | None] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def unit_of(kind: str, starts: np.ndarray, gamma: float) -> str:
    """What ``kind``'s value measures on episodes laid out by ``starts``: the reward per
    decision for the one-step kinds and on one-row episodes (where a return is one reward),
    else the return per episode, undiscounted or at ``gamma``."""
    if kind in ONE_STEP_KINDS or int(np.diff(starts).max()) == 1:
        return "reward per decision"
    if gamma == 1.0:
        return "return per episode"
    return f"return per episode, discounted at {gamma:g}"


def feasible_range(
    unit: str, rewards: np.ndarray, horizon: int, options: CpeOptions
) -> tuple[float, float]:
    """The least and the most any policy's value can be in ``unit``, given the logged
    rewards' range: one reward per decision; over an episode of at most ``horizon`` steps
    (the longest logged episode's) undiscounted (at least one reward: an episode may end at
    once), or over any length discounted (``return_bounds``). What the verdict shows as the
    interval when no estimate passed its checks: the data cannot narrow it."""
    smallest, largest = float(rewards.min()), float(rewards.max())
    if unit == "reward per decision":
        return smallest, largest
    if unit == "return per episode":
        return (
            smallest * horizon if smallest < 0 else smallest,
            largest * horizon if largest > 0 else largest,
        )
    low, high = return_bounds(rewards[:, None], options.gamma)
    return float(low[0]), float(high[0])


def held_out_fit(targets: np.ndarray, predictions: np.ndarray) -> float | None:
    """R^2 of ``predictions`` (cross-fitted: no row's model saw it) for ``targets``; None when
    the targets do not vary (any prediction of a constant is then as good as another)."""
    spread = float(((targets - targets.mean()) ** 2).sum())
    if spread <= 1e-12 * max(1.0, float((targets**2).sum())):
        return None
    return 1.0 - float(((targets - predictions) ** 2).sum()) / spread


def bellman_targets(inputs: Any, models: ModelValues, metric: int, gamma: float) -> np.ndarray:
    """``r_t + gamma V_hat(s_{t+1})`` per row (``r_t`` on an episode's last row): what
    ``Q_hat(s_t, a_t)`` should equal if it is the policy's Q."""
    starts = np.asarray(inputs.episode_starts)
    following = np.zeros(len(inputs.rewards))
    following[:-1] = models.expected[1:, metric]
    following[starts[1:] - 1] = 0.0
    return np.asarray(inputs.rewards[:, metric], dtype=np.float64) + gamma * following


def diagnose(
    kind: str,
    inputs: Any,
    models: ModelValues | None,
    options: CpeOptions,
    result: MetricEstimate,
    metric: int,
    coverage: float | None = None,
) -> Checked:
    """The checks of ``kind``'s estimate ``result`` of metric column ``metric``; ``inputs``
    are ``CpeInputs`` (or, for the direct kinds on continuous actions, ``ContinuousInputs``:
    episode starts and rewards are all the checks of a model read); ``coverage`` the
    evaluated policy's state coverage (``marginalized.state_coverage``) for the kinds that
    lean on a Q model, None where it was not measured: a continuous policy gives no
    probability of the logged action, so no state-distribution ratio can be fitted for it,
    and its ``fqe`` goes without the check."""
    starts = np.asarray(inputs.episode_starts)
    lengths = np.diff(starts)
    checked = Checked(unit_of(kind, starts, options.gamma))
    figures = checked.diagnostics
    episodes = len(lengths)
    figures["eval_episodes"] = float(episodes)
    horizon = max(int(lengths.max()), getattr(inputs, "horizon", None) or 0)
    if checked.unit == "return per episode":
        figures["horizon"] = float(horizon)
    figures["feasible_low"], figures["feasible_high"] = feasible_range(
        checked.unit, np.asarray(inputs.rewards[:, metric], dtype=np.float64), horizon, options
    )
    few = few_episodes_warning(episodes)
    if few:
        checked.warnings.append(few)
    if kind in ONE_STEP_KINDS and lengths.max() > 1:
        checked.warnings.append(
            f"a one-step estimator on episodes of {lengths.mean():.3g} decisions on average: "
            "it estimates the reward per decision on the logged states, not what the policy "
            "earns over an episode"
        )
    if result.low is None:
        checked.warnings.append("no interval (num_bootstrap = 0)")
    note = result.note or ""
    if FIXED_MODEL in note:
        checked.warnings.append(
            "its interval holds the model fixed, leaving out the model's own error"
        )
    if any(marker in note for marker in UNSETTLED_MARKERS):
        checked.warnings.append("its model did not reach a fixed point (see its note)")
    if kind in WEIGHTED_KINDS:
        _weight_checks(kind, inputs, options, result, checked)
    if models is not None:
        _model_checks(kind, inputs, models, options, metric, checked)
    if kind in Q_KINDS and coverage is not None:
        _coverage_check(coverage, checked)
    return checked


def _coverage_check(coverage: float, checked: Checked) -> None:
    """A Q model is fitted on the states the logger visited: where the evaluated policy goes
    elsewhere (its marginal state-action weights' effective sample size, ``coverage``, below
    ``MIN_EFFECTIVE_EPISODES``), the model's value of it is an extrapolation that no interval
    measures. On the truth suite's nearly greedy loggers the Q model said 450 for a policy
    that earns 9, with an interval of width 8, and its coverage was 0 to 2 episodes."""
    checked.diagnostics["state_coverage"] = coverage
    if coverage < MIN_EFFECTIVE_EPISODES:
        shown = f"{coverage:.3g} effective episodes"
        checked.warnings.append(
            f"the policy goes where the logger rarely went (state coverage {shown}; at least "
            f"{MIN_EFFECTIVE_EPISODES:g} are needed): its model's value there is an "
            "extrapolation"
        )


def _weight_checks(
    kind: str,
    inputs: CpeInputs,
    options: CpeOptions,
    result: MetricEstimate,
    checked: Checked,
) -> None:
    """Support, the share of episodes with a weight, and the effective sample size."""
    figures = checked.diagnostics
    target = np.asarray(inputs.target_probabilities, dtype=np.float64)
    logged = np.zeros(target.shape[1], dtype=bool)
    logged[np.unique(inputs.action)] = True
    unsupported = float(target[:, ~logged].sum(axis=1).mean()) if (~logged).any() else 0.0
    figures["unsupported_target_mass"] = unsupported
    mu, _ = logged_propensities(inputs, options)
    weights = step_weights(inputs, mu)
    figures["logged_action_probability"] = float(
        np.take_along_axis(target, inputs.action[:, None], axis=1).mean()
    )
    figures["deterministic_logger"] = float(bool((mu >= 1.0).all()))
    starts = np.asarray(inputs.episode_starts)
    if kind in ONE_STEP_KINDS or kind == "mis":  # mis weighs rows by no product
        nonzero = float((weights > 0).mean())
        what = "rows"
    else:
        final = cumulative_weights(weights, starts)[starts[1:] - 1]
        nonzero = float((final > 0).mean())
        what = "episodes"
    figures["nonzero_weight_share"] = nonzero
    ess = result.effective_sample_size
    figures["effective_sample_size"] = ess
    if unsupported > MAX_UNSUPPORTED_MASS:
        checked.warnings.append(
            f"the policy puts {unsupported:.1%} of its probability on actions no eval row "
            "logged: importance weights cannot see what they earn"
        )
    if kind in WEIGHTED_KINDS and (ess is None or ess < MIN_EFFECTIVE_EPISODES):
        shown = "no effective sample size"
        if ess is not None:
            shown = f"an effective sample size of {ess:.3g}"
        checked.warnings.append(
            f"its importance weights have {shown} ({nonzero:.1%} of {what} with a weight "
            f"that is not zero; at least {MIN_EFFECTIVE_EPISODES:g} are needed): the logger "
            "rarely did what the policy does"
        )


def _model_checks(
    kind: str,
    inputs: Any,
    models: ModelValues,
    options: CpeOptions,
    metric: int,
    checked: Checked,
) -> None:
    """The model's fit on held-out rows: the reward model's to the rewards, the Q model's to
    its Bellman targets (both cross-fitted, so every prediction is out of fold)."""
    rewards = np.asarray(inputs.rewards[:, metric], dtype=np.float64)
    if kind in Q_KINDS:
        targets = bellman_targets(inputs, models, metric, options.gamma)
        name = "q_model_fit"
        what = "Q model"
    else:
        targets = rewards
        name = "reward_model_fit"
        what = "reward model"
    fit = held_out_fit(targets, models.logged[:, metric])
    checked.diagnostics[name] = fit
    if fit is not None and fit < MIN_MODEL_FIT:
        checked.warnings.append(
            f"its {what} fits held-out rows worse than their mean (R^2 {fit:.3g})"
        )
