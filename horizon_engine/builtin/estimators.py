"""The built-in ``logged_value`` estimator: what the logged policy earned per episode.

Not counterfactual: it is the baseline every counterfactual estimate is compared with (the
Horizon paper reports estimates relative to it), and the smallest estimator that exercises the
contract end to end: episodes rebuilt from the eval split, rewards and metrics per episode.
"""

from __future__ import annotations

from collections.abc import Callable

from horizon_engine import EstimatorBase, EvaluationEpisodes, hookimpl


class LoggedValue(EstimatorBase):
    """The logging policy's mean reward (and each metric's mean) per episode of the eval split."""

    name = "logged_value"
    default_entries = ({"every_epoch": False},)

    def estimate(self, episodes: EvaluationEpisodes) -> dict[str, float]:
        """``reward_per_episode`` (the mean over episodes of each episode's summed reward),
        ``<metric>_per_episode`` for each logged metric, ``reward_per_step`` and the counts."""
        count = episodes.episode_count
        estimates = {
            "episodes": float(count),
            "rows": float(len(episodes.data)),
            "reward_per_episode": float(episodes.episode_totals(episodes.data.reward).mean()),
            "reward_per_step": float(episodes.data.reward.double().mean()),
        }
        for metric, values in episodes.metrics.items():
            estimates[f"{metric}_per_episode"] = float(episodes.episode_totals(values).mean())
        return estimates


@hookimpl
def horizon_register_estimators(register: Callable[[type], None]) -> None:
    register(LoggedValue)
