"""The MDP checks: held-out losses of world models with and without parts of their input.

Episodes are split into folds; for each fold, models fitted on the other folds predict its
rows, so every row's loss is a held-out one. Per fold: the full model, the model without the
action, the model without the state, and (once the features the action moves are known) the
model without those features. Feature importance masks one input group at a time in the full
model. Every effect is a mean difference of held-out losses with an interval over episodes
(``statistics``), judged against the smallest effect that counts (``min_information`` nats
per transition, ``min_share`` of the reward's variance or of the episode's end's entropy):

1. do actions predict transitions? (without the action against with it);
2. do state features predict the next state at all? (without the state);
3. do the features the action moves predict the reward or the episode's end? (without them);
4. which features explain nothing (no effect on transitions or the reward): suggested for removal.

The features the action moves are those whose next value the model without the action predicts
worse, and then every feature whose next value those predict (masking one in the full model
worsens the other's prediction), and so on: in CartPole the action pushes the velocities, and
the velocities move the position and the angle, whose limits end the episode.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from horizon_engine import HorizonError
from horizon_plugins_worldmodel.config import WorldModelConfig
from horizon_plugins_worldmodel.data import ACTION, Transitions
from horizon_plugins_worldmodel.fitting import EpochCallback, ModelFitter, RowLosses
from horizon_plugins_worldmodel.statistics import EpisodeBootstrap, Interval, verdict

NATS = "nats per transition"
REWARD_SHARE = "share of the reward's variance"
ENDING_SHARE = "share of the information in the episode's end"


@dataclass
class HeldOut:
    """Every row's held-out losses, per model variant, gathered over the folds."""

    losses: dict[str, RowLosses] = field(default_factory=dict)

    def put(self, name: str, rows: torch.Tensor, found: RowLosses, total: int) -> None:
        """Keep ``found``, the losses of variant ``name`` on ``rows`` (of ``total``)."""
        if name not in self.losses:
            width = found.next_state.shape[1]
            device = found.reward.device
            self.losses[name] = RowLosses(
                torch.zeros(total, width, device=device),
                torch.zeros(total, device=device),
                torch.zeros(total, device=device),
            )
        target = self.losses[name]
        target.next_state[rows] = found.next_state
        target.reward[rows] = found.reward
        target.termination[rows] = found.termination


def episode_folds(episodes: int, folds: int, seed: int) -> torch.Tensor:
    """``[E]``: each episode's fold, by a seeded shuffle (folds differ by one episode at most)."""
    order = torch.randperm(episodes, generator=torch.Generator().manual_seed(seed))
    fold = torch.empty(episodes, dtype=torch.long)
    fold[order] = torch.arange(episodes) % folds
    return fold


class MdpAnalysis:
    """The checks and feature importance for ``data``, with ``config``'s models and judges."""

    def __init__(self, config: WorldModelConfig, data: Transitions, seed: int) -> None:
        if data.episode_count < config.folds:
            raise HorizonError(
                f"[analysis] folds = {config.folds}, but the timeline holds "
                f"{data.episode_count} episode(s): held-out losses need at least one per fold"
            )
        self.config = config
        self.data = data
        self.seed = seed
        self.fitter = ModelFitter(config, data)
        fold_of_episode = episode_folds(data.episode_count, config.folds, seed)
        self.fold = fold_of_episode.to(data.episode.device)[data.episode]
        self.bootstrap = EpisodeBootstrap(
            data.episode, config.num_bootstrap, config.confidence, seed
        )
        self.held = HeldOut()
        width = data.state.shape[1]
        self.columns = width + data.action.shape[1]
        self.state_columns = torch.arange(width)

    def hidden(self, columns: torch.Tensor) -> torch.Tensor:
        """``[W + A]`` bool, true at ``columns``."""
        mask = torch.zeros(self.columns, dtype=torch.bool)
        mask[columns] = True
        return mask.to(self.data.state.device)

    def _fit_variant(
        self,
        name: str,
        hidden: torch.Tensor,
        on_epoch: EpochCallback | None = None,
        masks: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """Fit ``name`` (hiding ``hidden``) on every fold's complement and keep its held-out
        losses; with ``masks``, also the losses with each mask applied (importance)."""
        for fold in range(self.config.folds):
            train = torch.nonzero(self.fold != fold).squeeze(1)
            held = torch.nonzero(self.fold == fold).squeeze(1)
            callback = on_epoch if fold == 0 else None
            model = self.fitter.fit(train, hidden, self.seed * 1000 + fold, callback)
            self.held.put(name, held, self.fitter.losses(model, held), len(self.data))
            for label, mask in (masks or {}).items():
                found = self.fitter.losses(model, held, mask)
                self.held.put(f"mask:{label}", held, found, len(self.data))

    def run(
        self,
        on_epoch: EpochCallback | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        """Fit every variant and make the checks; returns the result ``mdp_check.json`` holds.
        ``on_epoch`` hears the first fold's full model's training losses, ``progress`` one
        step per variant fitted. The variants of a fold start from the same weights (its
        seed), so that they differ by what they are shown alone."""
        nothing = self.hidden(torch.tensor([], dtype=torch.long))
        masks = {group.name: self.hidden(group.columns) for group in self.data.groups}
        steps = [
            ("full", nothing, masks),
            ("without_action", self.hidden(self.data.group(ACTION).columns), None),
            ("without_state", self.hidden(self.state_columns), None),
        ]
        for name, hidden, group_masks in steps:
            self._fit_variant(name, hidden, on_epoch if name == "full" else None, group_masks)
            on_epoch = None
            if progress is not None:
                progress(1)
        influence = self.influence()
        moved = self.moved_features(influence)
        if moved:
            columns = torch.cat([self.data.group(feature).columns for feature in moved])
            self._fit_variant("without_moved", self.hidden(columns))
        if progress is not None:
            progress(1)
        return self.result(influence, moved)

    def effect(self, name: str, part: str = "transition") -> Interval:
        """How much worse variant ``name`` predicts ``part`` than the full model."""
        return self.bootstrap.mean(self._part(name, part) - self._part("full", part))

    def _part(self, name: str, part: str) -> torch.Tensor:
        losses = self.held.losses[name]
        return losses.transition() if part == "transition" else getattr(losses, part)

    def next_state_effect(self, name: str, feature: str) -> torch.Tensor:
        """``[N]``: how much worse ``name`` predicts ``feature``'s next value, per row."""
        columns = self.data.group(feature).next_columns.to(self.data.state.device)
        worse = self.held.losses[name].next_state - self.held.losses["full"].next_state
        return worse.index_select(1, columns).sum(dim=1)

    def _moves(self, name: str, target: str) -> bool:
        """Whether variant ``name`` predicts ``target``'s next value worse, beyond noise."""
        worse = self.bootstrap.mean(self.next_state_effect(name, target))
        return worse.low > self.config.min_information

    def influence(self) -> dict[str, list[str]]:
        """For the action and each state feature, the state features whose next value it
        predicts: the action's from the model fitted without it, a feature's from masking it
        in the full model (a feature's effect on its own next value left out)."""
        targets = [group.name for group in self.data.groups if group.name != ACTION]
        found = {ACTION: [t for t in targets if self._moves("without_action", t)]}
        for source in targets:
            found[source] = [t for t in targets if t != source and self._moves(f"mask:{source}", t)]
        return found

    @staticmethod
    def moved_features(influence: dict[str, list[str]]) -> list[str]:
        """The features the action moves, directly or through features it moves."""
        moved: list[str] = []
        frontier = list(influence[ACTION])
        while frontier:
            feature = frontier.pop(0)
            if feature not in moved:
                moved.append(feature)
                frontier += influence.get(feature, [])
        return moved

    def reward_variance(self) -> float:
        return float(self.data.reward.double().var()) if len(self.data) > 1 else 0.0

    def reward_share(self, name: str) -> Interval | None:
        """How much worse ``name`` predicts the reward, as a share of its variance; None for a
        constant reward."""
        variance = self.reward_variance()
        if variance <= 1e-12:
            return None
        return self.effect(name, "reward").scaled(1.0 / variance)

    def ending_entropy(self) -> float:
        """Nats per transition of whether an episode ends: what a model that knows only how
        often episodes end loses, and all that any model can gain."""
        rate = float(self.data.terminal.double().mean())
        if rate <= 0.0 or rate >= 1.0:
            return 0.0
        return -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))

    def ending_share(self, name: str) -> Interval | None:
        """How much worse ``name`` predicts the episode's end, as a share of
        ``ending_entropy``; None when no episode ends (or every row ends one)."""
        entropy = self.ending_entropy()
        if entropy <= 0.0:
            return None
        return self.effect(name, "termination").scaled(1.0 / entropy)

    def importance(self) -> list[dict[str, Any]]:
        """Each input group's importance (its held-out loss increase when masked), with the
        next-state features it predicts, most important first."""
        rows = []
        for group in self.data.groups:
            name = f"mask:{group.name}"
            by_target = {
                target.name: float(self.next_state_effect(name, target.name).mean())
                for target in self.data.groups
                if target.name != ACTION
            }
            rows.append(
                {
                    "feature": group.name,
                    "transition": self.effect(name),
                    "reward": self.reward_share(name),
                    "next_state_by_feature": by_target,
                }
            )
        return sorted(rows, key=lambda row: -row["transition"].value)

    def result(self, influence: dict[str, list[str]], moved: list[str]) -> dict[str, Any]:
        config = self.config
        importance = self.importance()
        checks = [
            self._transition_check(
                "actions_predict_transitions",
                "Do actions predict transitions?",
                self.effect("without_action"),
                "knowing the action",
                "what comes next does not depend on the action, so no decision changes the "
                "future: treat the problem as a contextual bandit",
            ),
            self._transition_check(
                "state_predicts_next_state",
                "Do state features predict the next state?",
                self.effect("without_state"),
                "knowing the state features",
                "the next state does not follow from the state: there is no sequential "
                "structure; treat the problem as a contextual bandit",
            ),
            self._reward_check(moved),
            self._removal_check(importance),
        ]
        full = self.held.losses["full"]
        return {
            "data": {
                "rows": len(self.data),
                "episodes": self.data.episode_count,
                "terminal_rows": int(self.data.terminal.sum()),
                "folds": config.folds,
                "num_bootstrap": config.num_bootstrap,
                "confidence": config.confidence,
                "reward_variance": self.reward_variance(),
                "ending_entropy": self.ending_entropy(),
            },
            "thresholds": {
                "min_information": config.min_information,
                "min_share": config.min_share,
            },
            "held_out_loss": {
                "transition_nll": self.bootstrap.mean(full.transition()),
                "termination_nll": self.bootstrap.mean(full.termination),
                "reward_mse": self.bootstrap.mean(full.reward),
            },
            "checks": checks,
            "influence": influence,
            "action_moved_features": moved,
            "feature_importance": importance,
        }

    def _transition_check(
        self, name: str, question: str, gain: Interval, what: str, consequence: str
    ) -> dict[str, Any]:
        threshold = self.config.min_information
        answer = verdict(gain, threshold)
        numbers = _numbers(gain, NATS)
        if answer == "yes":
            text = (
                f"Yes: {what} improves the held-out prediction of what comes next by {numbers}, "
                f"above the {threshold} that counts."
            )
        elif answer == "no":
            text = f"No: {what} adds {numbers}, under the {threshold} that counts: {consequence}."
        else:
            text = (
                f"Cannot tell: {what} adds {numbers}, an interval around the {threshold} that "
                "counts; more episodes would tell."
            )
        return {
            "name": name,
            "question": question,
            "verdict": answer,
            "passed": {"yes": True, "no": False}.get(answer),
            "finding": text,
            "numbers": {"transition": gain, "unit": NATS, "threshold": threshold},
        }

    def _reward_check(self, moved: list[str]) -> dict[str, Any]:
        threshold = self.config.min_share
        base = {
            "name": "moved_features_predict_reward",
            "question": "Do the state features the actions move predict the reward?",
        }
        if not moved:
            return {
                **base,
                "verdict": "not assessed",
                "passed": None,
                "finding": "Not assessed: the actions move no state feature beyond noise "
                "(see the first check).",
                "numbers": {},
            }
        reward = self.reward_share("without_moved")
        ending = self.ending_share("without_moved")
        answers = [verdict(share, threshold) for share in (reward, ending) if share is not None]
        answer = "yes" if "yes" in answers else "unclear" if "unclear" in answers else "no"
        names = ", ".join(moved)
        parts = [
            "the reward is constant"
            if reward is None
            else f"the reward's prediction loses {_numbers(reward, REWARD_SHARE)}",
            "no row ends an episode"
            if ending is None
            else f"the prediction of the episode's end loses {_numbers(ending, ENDING_SHARE)}",
        ]
        detail = f"without {names}, " + " and ".join(parts)
        if answer == "yes":
            text = (
                f"Yes: the features the actions move predict the outcome: {detail}, above the "
                f"{threshold} that counts."
            )
        elif answer == "no":
            text = (
                f"No: {detail}, under the {threshold} that would count: the reward reduces to "
                "each action's immediate return, a bandit, not RL."
            )
        else:
            text = f"Cannot tell: {detail}; more episodes would tell."
        numbers: dict[str, Any] = {"features": moved, "threshold": threshold}
        if reward is not None:
            numbers |= {"reward": reward, "reward_unit": REWARD_SHARE}
        if ending is not None:
            numbers |= {"ending": ending, "ending_unit": ENDING_SHARE}
        return {
            **base,
            "verdict": answer,
            "passed": {"yes": True, "no": False}.get(answer),
            "finding": text,
            "numbers": numbers,
        }

    def _removal_check(self, importance: list[dict[str, Any]]) -> dict[str, Any]:
        config = self.config
        useless = [
            row["feature"]
            for row in importance
            if row["feature"] != ACTION
            and row["transition"].high < config.min_information
            and (row["reward"] is None or row["reward"].high < config.min_share)
        ]
        if useless:
            text = (
                f"Suggested for removal: {', '.join(useless)}. Masked one at a time, each "
                f"changes the held-out losses by less than {config.min_information} nats per "
                f"transition and {config.min_share} of the reward's variance (of two "
                "copies of one signal, each alone looks unneeded: remove one at a time)."
            )
        else:
            text = "None: every feature explains some of the transitions or the reward."
        return {
            "name": "features_explaining_nothing",
            "question": "Which features explain nothing?",
            "verdict": "some" if useless else "none",
            "passed": not useless,
            "finding": text,
            "numbers": {"features": useless},
        }


def _numbers(interval: Interval, unit: str) -> str:
    return f"{interval.value:.3f} {unit} ({interval.low:.3f} to {interval.high:.3f})"
