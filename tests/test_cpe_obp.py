"""Our one-step estimators beside Open Bandit Pipeline's on the same bandit data.

``obp`` (Saito et al., https://github.com/st-tech/zr-obp) is a test-only dependency: the test
is skipped where it is not installed. On Python 3.11 the newest release that installs is 0.4.1
(0.5.x declare ``Requires-Python < 3.10`` or ``< 3.11``); its IPW, SNIPW and DR are the
formulas ours implement, so on one set of rows, propensities, target probabilities and
reward-model values the two must agree to rounding (1e-10). The bootstrap intervals are
compared more loosely: obp resamples rows, ours episodes (here one row each, so the same
scheme with other random draws).
"""

from __future__ import annotations

import numpy as np
import pytest

from horizon_plugins_cpe.formulas import CpeInputs, CpeOptions, ModelValues, estimate

ope = pytest.importorskip(
    "obp.ope", reason="Open Bandit Pipeline (obp) is a test-only dependency, not installed"
)


def bandit(seed: int, samples: int = 5000, actions: int = 4):
    """Contexts, a softmax logging policy, a different target policy, noisy rewards and a
    reward model ``q_hat [n, A]`` that is deliberately imperfect (DR must use it as given)."""
    rng = np.random.default_rng(seed)
    contexts = rng.normal(size=(samples, 3))
    scores = contexts @ rng.normal(size=(3, actions))
    logging = np.exp(scores) / np.exp(scores).sum(axis=1, keepdims=True)
    target = np.exp(-scores) / np.exp(-scores).sum(axis=1, keepdims=True)
    action = (rng.random((samples, 1)) > logging.cumsum(axis=1)).sum(axis=1)
    action = np.minimum(action, actions - 1)
    means = contexts @ rng.normal(size=(3, actions)) + 2.0
    reward = means[np.arange(samples), action] + rng.normal(size=samples)
    q_hat = means + rng.normal(0.0, 0.3, means.shape)
    inputs = CpeInputs(
        episode_starts=np.arange(samples + 1),
        rewards=reward[:, None],
        metric_names=("reward",),
        action=action.astype(np.int64),
        logged_propensity=logging[np.arange(samples), action],
        target_probabilities=target,
        possible=np.ones((samples, actions), dtype=bool),
        features=contexts,
    )
    models = ModelValues(
        logged=q_hat[np.arange(samples), action][:, None],
        expected=(target * q_hat).sum(axis=1)[:, None],
    )
    return inputs, models, q_hat


def obp_arguments(inputs: CpeInputs) -> dict[str, np.ndarray]:
    return {
        "reward": inputs.rewards[:, 0],
        "action": inputs.action,
        "pscore": inputs.logged_propensity,
        "action_dist": inputs.target_probabilities[:, :, None],
        "position": np.zeros(inputs.num_rows, dtype=np.int64),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ips_snips_and_dr_agree_with_obp(seed):
    inputs, models, q_hat = bandit(seed)
    options = CpeOptions(num_bootstrap=0)
    arguments = obp_arguments(inputs)
    theirs = {
        "ips": ope.InverseProbabilityWeighting().estimate_policy_value(**arguments),
        "snips": ope.SelfNormalizedInverseProbabilityWeighting().estimate_policy_value(**arguments),
        "dr": ope.DoublyRobust().estimate_policy_value(
            **arguments, estimated_rewards_by_reg_model=q_hat[:, :, None]
        ),
    }
    for kind, value in theirs.items():
        ours = estimate(kind, inputs, models, options)["reward"].value
        assert ours == pytest.approx(value, rel=1e-10, abs=1e-10), kind


def test_interval_widths_agree_with_obp():
    """IPS and DR are means of per-row values, and both libraries take percentile intervals
    of resampled means; with 2,000 resamples each the Monte Carlo error of a 95% width is
    about 2.2% per library, so the widths agree within 10% (over 3 combined standard
    errors). SNIPS is left out: obp resamples its per-row terms with the full data's
    normalizer, where ours resamples numerator and normalizer together."""
    inputs, models, q_hat = bandit(seed=3)
    arguments = obp_arguments(inputs)
    pairs = {
        "ips": ope.InverseProbabilityWeighting().estimate_interval(
            **arguments, n_bootstrap_samples=2000, random_state=0
        ),
        "dr": ope.DoublyRobust().estimate_interval(
            **arguments,
            estimated_rewards_by_reg_model=q_hat[:, :, None],
            n_bootstrap_samples=2000,
            random_state=0,
        ),
    }
    for kind, theirs in pairs.items():
        ours = estimate(kind, inputs, models, CpeOptions(num_bootstrap=2000, seed=0))["reward"]
        their_width = theirs["95.0% CI (upper)"] - theirs["95.0% CI (lower)"]
        assert ours.high - ours.low == pytest.approx(their_width, rel=0.10), kind
