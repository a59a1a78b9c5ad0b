"""``mis``, marginalized importance sampling, on small tabular MDPs whose exact value is
computed here by dynamic programming.

An MDP: ``STATES`` one-hot states, two actions, a seeded random transition matrix and a
per-(state, action) chance of ending the episode, rewards in [0, 1] plus Gaussian noise,
episodes cut at a horizon. The logger and the evaluated policy are fixed stochastic policies
per state (a greedy action per state, and epsilon spread uniformly); the truth is ``sum_s
d_0(s) V_0(s)`` by backward induction over the horizon at the estimator's discount, an
ended episode earning 0 afterwards."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from test_cpe_estimators import episodes_of, estimator

from horizon_engine import ActionType, EvaluationModels, NotApplicable
from horizon_plugins_cpe.estimators import ESTIMATORS, cpe_inputs
from horizon_plugins_cpe.formulas import KINDS, CpeInputs, CpeOptions, bootstrap_counts, estimate
from horizon_plugins_cpe.marginalized import (
    REGRESSION_RIDGE,
    marginal_values,
    marginalized,
    network_features,
    ratio_features,
    step_layout,
)

STATES = 5
ACTIONS = 2
LOGGER_GREEDY = np.array([0, 1, 0, 1, 0])
TARGET_GREEDY = np.array([1, 1, 0, 0, 1])


def make_mdp(seed: int, most_end: float):
    """Transitions ``[S, A, S]``, end chance ``[S, A]`` (up to ``most_end``), mean rewards
    ``[S, A]``, start distribution ``[S]``."""
    rng = np.random.default_rng(seed)
    transitions = rng.dirichlet(np.full(STATES, 0.5), size=(STATES, ACTIONS))
    ends = rng.uniform(0.0, most_end, size=(STATES, ACTIONS))
    rewards = rng.uniform(0.0, 1.0, size=(STATES, ACTIONS))
    return transitions, ends, rewards, np.full(STATES, 1.0 / STATES)


@pytest.fixture(scope="module")
def mdp():
    """Episodes of about 13 steps on average."""
    return make_mdp(3, 0.15)


def policy(greedy: np.ndarray, epsilon: float) -> np.ndarray:
    """``[S, A]``: ``greedy [S]``'s action with probability ``1 - epsilon``, else uniform."""
    probabilities = np.full((STATES, ACTIONS), epsilon / ACTIONS)
    probabilities[np.arange(STATES), greedy] += 1.0 - epsilon
    return probabilities


def true_value(mdp, target: np.ndarray, horizon: int, gamma: float) -> float:
    transitions, ends, rewards, start = mdp
    value = np.zeros(STATES)
    for _ in range(horizon):
        q = rewards + gamma * (1.0 - ends) * (transitions @ value)
        value = (target * q).sum(axis=1)
    return float(start @ value)


def simulate(mdp, logger, target, episodes: int, horizon: int, seed: int) -> CpeInputs:
    """``episodes`` logged by ``logger`` (at most ``horizon`` steps each), as the formulas'
    inputs for ``target``."""
    transitions, ends, rewards, start = mdp
    rng = np.random.default_rng(seed)
    state = rng.choice(STATES, size=episodes, p=start)
    alive = np.ones(episodes, dtype=bool)
    steps = []  # per step: (episode, state, action, reward) of the running episodes
    for _ in range(horizon):
        running = np.flatnonzero(alive)
        s = state[running]
        a = (rng.random(len(running)) < logger[s, 1]).astype(np.int64)
        steps.append((running, s, a, rewards[s, a] + rng.normal(0.0, 0.1, len(running))))
        alive[running[rng.random(len(running)) < ends[s, a]]] = False
        cumulative = transitions[s, a].cumsum(axis=1)
        following = (rng.random(len(running))[:, None] > cumulative).sum(axis=1)
        state[running] = np.minimum(following, STATES - 1)
        if not alive.any():
            break
    episode = np.concatenate([piece[0] for piece in steps])
    order = np.argsort(episode, kind="stable")  # episode by episode, steps in order
    s, a, r = (np.concatenate([piece[i] for piece in steps])[order] for i in (1, 2, 3))
    starts = np.r_[0, np.cumsum(np.bincount(episode, minlength=episodes))]
    return CpeInputs(
        episode_starts=starts.astype(np.int64),
        rewards=r[:, None],
        metric_names=("reward",),
        action=a,
        logged_propensity=logger[s, a],
        target_probabilities=target[s],
        possible=np.ones((len(a), ACTIONS), dtype=bool),
        features=np.eye(STATES)[s],
    )


def per_decision_is(inputs: CpeInputs, gamma: float) -> float:
    """Per-decision importance sampling, ``mean_e sum_t gamma^t rho_t r_t`` (unbiased)."""
    starts = inputs.episode_starts
    ratio = inputs.target_probabilities[np.arange(inputs.num_rows), inputs.action]
    ratio = ratio / inputs.logged_propensity
    total = 0.0
    for e in range(inputs.num_episodes):
        rows = slice(starts[e], starts[e + 1])
        rho = np.cumprod(ratio[rows])
        total += float((gamma ** np.arange(len(rho)) * rho * inputs.rewards[rows, 0]).sum())
    return total / inputs.num_episodes


def test_mis_is_a_registered_kind():
    assert "mis" in KINDS
    assert "mis" in [cls.name for cls in ESTIMATORS]


@pytest.mark.parametrize("gamma", [0.9, 1.0])
def test_off_policy_value_matches_dynamic_programming(mdp, gamma):
    """Over 20 data sets of 300 episodes, the mean estimate is within 3 standard errors of the
    exact value (and within 4% of it: measured -1.6% at 0.9 and -3.8% at 1.0, the
    self-normalization's small-sample bias, -1.4% at 20,000 episodes). Episode lengths
    depend on the actions, so ended episodes matter."""
    logger, target = policy(LOGGER_GREEDY, 0.5), policy(TARGET_GREEDY, 0.2)
    truth = true_value(mdp, target, 20, gamma)
    options = CpeOptions(gamma=gamma, num_bootstrap=0)
    found = [
        marginalized(simulate(mdp, logger, target, 300, 20, seed), options)["reward"].value
        for seed in range(20)
    ]
    error = np.std(found, ddof=1) / np.sqrt(len(found))
    assert abs(np.mean(found) - truth) < 3 * error
    assert abs(np.mean(found) - truth) < 0.04 * truth


def test_on_policy_it_is_the_logged_mean_return(mdp):
    """Target = logger: every ratio is 1, every fitted state ratio exactly 1 (the intercept
    is not penalized, the slope sees a constant), so the value and each resample are the
    logged mean discounted return."""
    logger = policy(LOGGER_GREEDY, 0.3)
    inputs = simulate(mdp, logger, logger, 200, 20, 5)
    found = marginalized(inputs, CpeOptions(gamma=0.95, num_bootstrap=50))["reward"]
    assert found.value == pytest.approx(found.logged_value, rel=1e-12)
    assert found.relative == pytest.approx(1.0, rel=1e-12)
    assert found.relative_low == pytest.approx(1.0, rel=1e-12)
    assert found.relative_high == pytest.approx(1.0, rel=1e-12)
    assert found.effective_sample_size == pytest.approx(inputs.num_episodes)


def test_far_lower_error_than_per_decision_is_on_a_long_horizon():
    """Episodes of about 40 steps (of at most 60) logged by a nearly greedy logger (its
    greedy action with probability 0.9) for a target that disagrees in 3 of 5 states and
    survives longer (truth 23.5 against the logger's 10.4): over 20 data sets of 200
    episodes, per-decision IS collapses (the products of ratios vanish on almost every
    episode: mean 2.9, root mean squared error 20.6; its sample spread, 1.6, is small only
    because the rare huge products are not drawn), where MIS has a mean of 20.7 (-12%, the
    small-sample bias of the step-by-step ratios; -5% at 2,000 episodes), spread 3.2 and
    root mean squared error 4.2 (measured)."""
    long_mdp = make_mdp(11, 0.04)
    logger, target = policy(LOGGER_GREEDY, 0.2), policy(TARGET_GREEDY, 0.3)
    truth = true_value(long_mdp, target, 60, 1.0)
    marginal, per_decision = [], []
    options = CpeOptions(gamma=1.0, num_bootstrap=0)
    for seed in range(20):
        inputs = simulate(long_mdp, logger, target, 200, 60, seed)
        marginal.append(marginalized(inputs, options)["reward"].value)
        per_decision.append(per_decision_is(inputs, 1.0))
    marginal_error = np.sqrt(np.mean((np.array(marginal) - truth) ** 2))
    per_decision_error = np.sqrt(np.mean((np.array(per_decision) - truth) ** 2))
    assert marginal_error < per_decision_error / 3
    assert np.median(per_decision) < 0.25 * truth < 0.8 * truth < np.median(marginal)


def test_interval_covers_the_truth_near_its_nominal_rate(mdp):
    """100 seeded data sets of 200 episodes: the 90% percentile interval, its regressions
    refit in every resample, holds the exact value in at least 80 of them (measured: 87 of
    100, and 178 of 200; at 95%, 93% of 200; at gamma 1, 87.5% of 200). A binomial count of
    100 at 0.9 falls below 80 with probability 0.2%."""
    logger, target = policy(LOGGER_GREEDY, 0.5), policy(TARGET_GREEDY, 0.2)
    truth = true_value(mdp, target, 20, 0.9)
    options = CpeOptions(gamma=0.9, num_bootstrap=200, confidence=0.9)
    covered = 0
    for seed in range(100):
        found = marginalized(simulate(mdp, logger, target, 200, 20, 100 + seed), options)
        covered += found["reward"].low <= truth <= found["reward"].high
    assert covered >= 80


def test_the_bootstrap_refits_the_regressions_on_each_resample(mdp):
    """Each resample's value equals the estimate on that resample's rows spelled out (each
    drawn episode repeated as often as drawn): the count-weighted regressions are the
    regressions of the resampled data."""
    logger, target = policy(LOGGER_GREEDY, 0.5), policy(TARGET_GREEDY, 0.2)
    inputs = simulate(mdp, logger, target, 40, 20, 9)
    ratios = inputs.target_probabilities[np.arange(inputs.num_rows), inputs.action]
    ratios = ratios / inputs.logged_propensity
    basis = ratio_features(inputs)
    starts = inputs.episode_starts
    counts = bootstrap_counts(inputs.num_episodes, CpeOptions(num_bootstrap=5, seed=2))
    layout = step_layout(starts)
    batched, _ = marginal_values(
        counts, layout, ratios, inputs.rewards, basis, 0.9, REGRESSION_RIDGE
    )
    for b, drawn in enumerate(counts):
        episodes = np.repeat(np.arange(inputs.num_episodes), drawn.astype(int))
        rows = np.concatenate([np.arange(starts[e], starts[e + 1]) for e in episodes])
        lengths = np.diff(starts)[episodes]
        plain, _ = marginal_values(
            np.ones((1, len(episodes))),
            step_layout(np.r_[0, np.cumsum(lengths)]),
            ratios[rows],
            inputs.rewards[rows],
            basis[rows],
            0.9,
            REGRESSION_RIDGE,
        )
        assert batched[b] == pytest.approx(plain[0], rel=1e-9)


def test_ended_episodes_keep_their_mass():
    """One state, reward 1 a step; action 1 ends the episode, action 0 goes on, for at most
    10 steps. The logger ends with probability 0.3 a step, the target 0.1: its value is
    ``sum_t 0.9^t`` over 10 steps, 6.51 (the logger's 3.2). An ended episode carries its
    weight (the mass that left with it), so the estimate is near the truth (measured 6.38
    to 6.61 over 4 seeds, each interval holding it); normalizing over the running episodes
    alone would give every step the mass 1 and the value 10."""
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.geometric(0.3, 2000), 10)
    starts = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    rows = int(starts[-1])
    action = np.zeros(rows, dtype=np.int64)
    ended = (lengths < 10) | (rng.random(len(lengths)) < 0.3)  # the 10th step: either action
    action[starts[1:][ended] - 1] = 1
    inputs = CpeInputs(
        episode_starts=starts,
        rewards=np.ones((rows, 1)),
        metric_names=("reward",),
        action=action,
        logged_propensity=np.where(action == 1, 0.3, 0.7),
        target_probabilities=np.tile([0.9, 0.1], (rows, 1)),
        possible=np.ones((rows, 2), dtype=bool),
        features=np.zeros((rows, 1)),
    )
    truth = sum(0.9**t for t in range(10))
    found = marginalized(inputs, CpeOptions(gamma=1.0, num_bootstrap=200))["reward"]
    assert found.value == pytest.approx(truth, rel=0.03)
    assert found.low <= truth <= found.high


def test_one_row_episodes_make_it_snips():
    """A bandit log (every episode one row): step 0's weights are the ratios divided by their
    mean, so the estimate, its interval and its relative interval are ``snips``'s."""
    rng = np.random.default_rng(1)
    rows = 300
    logging = rng.dirichlet(np.full(3, 2.0), rows)
    action = (rng.random((rows, 1)) > logging.cumsum(axis=1)).sum(axis=1)
    inputs = CpeInputs(
        episode_starts=np.arange(rows + 1, dtype=np.int64),
        rewards=rng.normal(1.0, 1.0, (rows, 2)),
        metric_names=("reward", "clicks"),
        action=action.astype(np.int64),
        logged_propensity=logging[np.arange(rows), action],
        target_probabilities=rng.dirichlet(np.ones(3), rows),
        possible=np.ones((rows, 3), dtype=bool),
        features=rng.normal(size=(rows, 2)),
    )
    options = CpeOptions(num_bootstrap=100, seed=3)
    mis, snips = estimate("mis", inputs, None, options), estimate("snips", inputs, None, options)
    for name in ("reward", "clicks"):
        for field in ("value", "low", "high", "relative_low", "relative_high"):
            assert getattr(mis[name], field) == pytest.approx(getattr(snips[name], field))
        assert mis[name].effective_sample_size == pytest.approx(snips[name].effective_sample_size)


def test_a_policy_the_logger_never_follows_gets_zero_weights_and_says_so():
    """The target always takes the action the logger never took: every weight is 0."""
    rows = 6
    inputs = CpeInputs(
        episode_starts=np.array([0, 3, 6]),
        rewards=np.ones((rows, 1)),
        metric_names=("reward",),
        action=np.zeros(rows, dtype=np.int64),
        logged_propensity=np.full(rows, 0.5),
        target_probabilities=np.tile([0.0, 1.0], (rows, 1)),
        possible=np.ones((rows, 2), dtype=bool),
        features=np.arange(rows, dtype=np.float64)[:, None],
    )
    found = marginalized(inputs, CpeOptions(num_bootstrap=10))["reward"]
    assert found.value == 0.0
    assert found.effective_sample_size is None
    assert "every marginal weight is 0" in found.note


def test_the_estimator_fits_the_ratios_on_the_trainers_hidden_layer_when_offered():
    clicks = torch.tensor([0.0, 1.0, 0.0, 2.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    episodes = episodes_of(metrics={"clicks": clicks}, discount=0.9)
    torch.manual_seed(0)
    hidden = torch.nn.Sequential(torch.nn.Linear(episodes.data.state.shape[1], 3), torch.nn.Tanh())
    episodes.models = EvaluationModels(q_features=lambda values, presence: hidden(values))
    inputs, _ = cpe_inputs(episodes)
    with torch.no_grad():
        features = network_features(hidden(episodes.data.state).double().numpy())
    options = CpeOptions(gamma=0.9, num_bootstrap=0)

    component = estimator("mis", num_bootstrap=0)
    found = component.estimate(episodes)
    on_state = estimator("mis", num_bootstrap=0, q_model="fqe")
    state_found = on_state.estimate(episodes)

    assert component.details["features"].startswith("the trained network's hidden layer")
    assert on_state.details["features"] == "state features"
    wanted = marginalized(replace(inputs, features=features), options)
    plain = marginalized(inputs, options)
    for name in ("reward", "clicks"):
        assert found[name].value == pytest.approx(wanted[name].value, abs=1e-12)
        assert state_found[name].value == pytest.approx(plain[name].value, abs=1e-12)


def test_continuous_actions_are_not_applicable():
    with pytest.raises(NotApplicable, match="continuous actions"):
        estimator("mis").estimate(episodes_of(ActionType.CONTINUOUS))


@pytest.mark.parametrize("action_type", [ActionType.DISCRETE, ActionType.PARAMETRIC])
def test_the_estimator_estimates_every_metric_with_an_interval(action_type):
    clicks = torch.tensor([0.0, 1.0, 0.0, 2.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    component = estimator("mis", num_bootstrap=20)
    found = component.estimate(
        episodes_of(action_type, metrics={"clicks": clicks}, discount=0.9, seed=4)
    )
    assert list(found) == ["reward", "clicks"]
    for result in found.values():
        assert np.isfinite(result.value)
        assert result.low <= result.high
        assert result.effective_sample_size is not None
    assert component.details["gamma"] == 0.9
    assert component.details["features"] == "state features"


def test_a_low_effective_sample_size_is_flagged():
    """Three episodes: the marginal weights' effective sample size is below the ten the
    diagnostics ask of an importance-weighted estimate, and the estimate says so."""
    found = estimator("mis", num_bootstrap=20).estimate(episodes_of(discount=0.9))["reward"]
    assert found.effective_sample_size < 10
    assert found.diagnostics["nonzero_weight_share"] == 1.0  # every row's ratio is positive
    assert any("effective sample size" in warning for warning in found.warnings)
