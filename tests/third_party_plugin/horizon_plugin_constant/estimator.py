"""The ``one_step_ips`` estimator: inverse propensity scoring, decision by decision.

Each logged decision is reweighted by how much more (or less) likely the evaluated policy was
to make it than the logging policy: ``w = pi(logged action | state) / action_probability``.
The mean of ``w * reward`` estimates what the evaluated policy would earn per decision, without
bias when the logged propensities are right and the policy only takes actions the logger could
take. Weighting each decision on its own assumes the decisions do not change the states that
follow (a contextual bandit, as reminder decisions are); a sequential estimator would weight by
the product of an episode's ratios instead.
"""

from __future__ import annotations

from horizon_engine import ActionType, EstimatorBase, EvaluationEpisodes


class OneStepIps(EstimatorBase):
    """Inverse propensity scoring of the evaluated policy, one decision at a time."""

    name = "one_step_ips"

    def estimate(self, episodes: EvaluationEpisodes) -> dict[str, float]:
        """``reward_per_episode`` and ``<metric>_per_episode`` (each episode's weighted sum,
        averaged over episodes: comparable with ``logged_value``'s), ``reward_per_step``, the
        self-normalized ``snips_reward_per_step`` and ``mean_weight`` (1 in expectation: far
        from it, the propensities or the policy's support are in doubt). Discrete actions only:
        the weights need the policy's probability of each logged action."""
        if episodes.action_type is not ActionType.DISCRETE or not len(episodes.data):
            return {}
        data = episodes.data
        weight = episodes.policy.probability_of(data.action).double() / data.action_probability
        reward = weight * data.reward.double()
        estimates = {
            "reward_per_episode": float(episodes.episode_totals(reward).mean()),
            "reward_per_step": float(reward.mean()),
            "snips_reward_per_step": float(reward.sum() / weight.sum().clamp(min=1e-12)),
            "mean_weight": float(weight.mean()),
        }
        for metric, values in episodes.metrics.items():
            weighted = episodes.episode_totals(weight * values.double())
            estimates[f"{metric}_per_episode"] = float(weighted.mean())
        return estimates
