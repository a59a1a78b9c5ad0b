"""Two simulated products for the closed loop, with rewards that arrive late.

Both are batched Gymnasium-style environments: ``reset(count)`` starts ``count`` episodes and
returns their observations (raw state feature maps, as a served model takes them), ``step``
takes one action per running episode and returns the next observations, which episodes ended,
and each decision's ``Feedback``: the metric rows the product will report, each after its own
delay. The loop turns them into reward rows ``{"decision_id", "timestamp", "metrics"}`` at the
decision's timestamp plus the delay.

Delays: a click is reported after an exponential delay with a mean of 16 hours, so a share
``exp(-48 / 16)`` (5.0%) of clicks arrive after the join's 48-hour window and count for
nothing; a cost is charged in two rows within the first day. A decision that led to no click
and no cost reports nothing at all, and the join gives it the default metrics (no click, no
cost), which are also its true ones. The reward is ``click - cost`` (the pipeline templates'
``[timeline] reward``), and the products' true values are defined as what the join credits:
a click counts with the probability that it arrives inside the window (``CLICK_CREDIT``).

- ``NotificationBandit``: a contextual bandit (which channel to notify a user on, or none).
- ``EngagementMdp``: a short episodic MDP (nudging a user builds engagement but also
  fatigue, and a fatigued user leaves), small enough (20 states) to solve exactly.

Each product's ``true_value(policy)`` takes a policy as a function from a batch of
observations to action probabilities, so the served model's exact value is computed with
the very exploration it served with.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

WINDOW_HOURS = 48.0
"""The join's window: a reward row counts when it arrives at most this long after the
decision."""

CLICK_DELAY_HOURS = 16.0
"""Mean of the exponential delay of a click's report."""

CLICK_CREDIT = 1.0 - math.exp(-WINDOW_HOURS / CLICK_DELAY_HOURS)
"""The probability that a click is reported inside the window (0.950)."""

Observation = dict[str, float]
Policy = Callable[[list[Observation]], np.ndarray]
"""A policy: a batch of observations -> each action's probability, ``[rows, actions]``."""


@dataclass
class Feedback:
    """What the product reports about one decision: ``(delay in hours, metrics)`` rows."""

    reports: list[tuple[float, dict[str, float]]] = field(default_factory=list)


def report(rng: np.random.Generator, click: bool, cost: float) -> Feedback:
    """A decision's late metric rows: a click after an exponential delay, a cost in two
    charges (a third at once, the rest within the day); nothing at all for neither."""
    feedback = Feedback()
    if click:
        feedback.reports.append((float(rng.exponential(CLICK_DELAY_HOURS)), {"click": 1.0}))
    if cost > 0.0:
        feedback.reports.append((float(rng.uniform(0.0, 1.0)), {"cost": cost / 3.0}))
        feedback.reports.append((float(rng.uniform(1.0, 24.0)), {"cost": 2.0 * cost / 3.0}))
    return feedback


def _sigmoid(value: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-value))


class NotificationBandit:
    """Which channel to notify a user on: a contextual bandit with 4 actions.

    A user is one of ``POPULATION`` fixed contexts (drawn once from ``population_seed``), with
    features ``"0"`` days since the last visit / 30 (0 to 1), ``"1"`` activity (0 to 1),
    ``"2"`` 1 for a mobile user and ``"3"`` an irrelevant score (standard normal). The click
    probability of each channel is logistic in the context; push suits active mobile users,
    email users who visited recently, sms lapsed desktop users but costs the most, and
    ``none`` costs nothing and gets the few clicks a user makes unprompted. The true value
    of a policy is exact: the population's mean of ``sum_a pi(a|x) (credit * p(x, a) -
    cost_a)``. Uniformly random play is worth 0.158, push for everyone 0.348, the best
    policy 0.467, and 0.436 served epsilon-greedy with epsilon 0.1.
    """

    ACTIONS = ("none", "push", "email", "sms")
    FEATURES = ("0", "1", "2", "3")
    POPULATION = 1000
    COSTS = np.array([0.0, 0.05, 0.02, 0.25])

    def __init__(self, seed: int = 0, population_seed: int = 2026) -> None:
        population = np.random.default_rng(population_seed)
        self.contexts = np.column_stack(
            [
                population.uniform(0.0, 1.0, self.POPULATION),
                population.uniform(0.0, 1.0, self.POPULATION),
                (population.uniform(size=self.POPULATION) < 0.5).astype(float),
                population.normal(size=self.POPULATION),
            ]
        )
        self.click_probabilities = self._click_probabilities(self.contexts)
        self.mean_rewards = CLICK_CREDIT * self.click_probabilities - self.COSTS
        self.rng = np.random.default_rng(seed)
        self.users = np.zeros(0, dtype=int)

    @staticmethod
    def _click_probabilities(contexts: np.ndarray) -> np.ndarray:
        recency, activity, mobile = contexts[:, 0], contexts[:, 1], contexts[:, 2]
        logits = np.column_stack(
            [
                np.full(len(contexts), -3.0),
                -2.5 + 2.5 * mobile + 1.5 * activity,
                -0.5 - 3.0 * recency + 0.5 * activity,
                -1.0 + 2.5 * recency - 2.0 * mobile,
            ]
        )
        return _sigmoid(logits)

    def observations(self, users: np.ndarray) -> list[Observation]:
        return [
            {name: float(value) for name, value in zip(self.FEATURES, row, strict=True)}
            for row in self.contexts[users]
        ]

    def reset(self, count: int) -> list[Observation]:
        """``count`` users drawn uniformly from the population, one decision each."""
        self.users = self.rng.integers(0, self.POPULATION, count)
        return self.observations(self.users)

    def step(self, actions: Sequence[str]) -> list[Feedback]:
        """Each user's feedback on the channel chosen for them; every episode ends here."""
        index = np.array([self.ACTIONS.index(action) for action in actions])
        p_click = self.click_probabilities[self.users, index]
        clicks = self.rng.uniform(size=len(index)) < p_click
        return [
            report(self.rng, bool(click), float(self.COSTS[a]))
            for click, a in zip(clicks, index, strict=True)
        ]

    def true_value(self, policy: Policy) -> float:
        """Mean reward per decision that the join credits, under the policy's probabilities."""
        probabilities = policy(self.observations(np.arange(self.POPULATION)))
        return float((probabilities * self.mean_rewards).sum(axis=1).mean())


class EngagementMdp:
    """Nudging a user day by day: an episodic MDP with 3 actions, solved exactly.

    The state is engagement ``e`` (0 to 4) and fatigue ``f`` (0 to 3), observed as features
    ``"0"`` and ``"1"``. Each day:

    - ``wait``: no click; fatigue falls by 1; engagement falls by 1 with probability 0.2.
    - ``nudge``: a click with probability ``0.15 + 0.15 e - 0.1 f`` (at least 0.02); after a
      click engagement rises by 1; fatigue rises by 1.
    - ``offer`` (costs 0.1): a click with probability ``0.35 + 0.1 e - 0.1 f`` (at least
      0.02); fatigue rises by 2.

    After each day the user leaves (the episode ends) with probability ``LEAVE`` (0.15), and
    with ``TIRED_LEAVE`` (0.5) instead when fatigue has reached 3. Episodes start at
    engagement 0 to 2 (uniformly) and no fatigue. Nudging every day wears a user out, waiting
    every day earns nothing: the best policy mostly nudges a rested user and lets a tired one
    rest. The true value of a policy (the expected discounted return the join credits, with
    discount ``GAMMA`` per day, as the trainer and CPE discount) is exact: one linear solve
    over the 20 states. Uniformly random play is worth 0.468, nudging every day 0.649, the
    best policy 0.803, and 0.758 served epsilon-greedy with epsilon 0.1.
    """

    ACTIONS = ("wait", "nudge", "offer")
    FEATURES = ("0", "1")
    GAMMA = 0.9
    MAX_ENGAGEMENT = 4
    MAX_FATIGUE = 3
    START_LEVELS = 3
    """A user starts at one of the engagement levels 0 to ``START_LEVELS - 1``."""
    OFFER_COST = 0.1
    LEAVE = 0.15
    TIRED_LEAVE = 0.5
    NUDGE_CLICK = (0.15, 0.15)
    """Intercept and slope in engagement of a nudge's click probability."""
    OFFER_CLICK = (0.35, 0.1)
    FATIGUE_PENALTY = 0.1
    WAIT_DECAY = 0.2

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.states = np.zeros((0, 2), dtype=int)
        self.grid = [
            (e, f) for e in range(self.MAX_ENGAGEMENT + 1) for f in range(self.MAX_FATIGUE + 1)
        ]

    @staticmethod
    def observation(engagement: int, fatigue: int) -> Observation:
        return {"0": float(engagement), "1": float(fatigue)}

    @classmethod
    def click_probability(cls, action: int, engagement: int, fatigue: int) -> float:
        if action == 0:
            return 0.0
        intercept, slope = cls.NUDGE_CLICK if action == 1 else cls.OFFER_CLICK
        return max(intercept + slope * engagement - cls.FATIGUE_PENALTY * fatigue, 0.02)

    @classmethod
    def outcomes(
        cls, action: int, engagement: int, fatigue: int
    ) -> list[tuple[float, bool, int, int]]:
        """``(probability, click, next engagement, next fatigue)`` of one day's outcomes."""
        if action == 0:
            rested = max(fatigue - 1, 0)
            return [
                (cls.WAIT_DECAY, False, max(engagement - 1, 0), rested),
                (1.0 - cls.WAIT_DECAY, False, engagement, rested),
            ]
        p_click = cls.click_probability(action, engagement, fatigue)
        tired = min(fatigue + (1 if action == 1 else 2), cls.MAX_FATIGUE)
        raised = min(engagement + 1, cls.MAX_ENGAGEMENT) if action == 1 else engagement
        return [(p_click, True, raised, tired), (1.0 - p_click, False, engagement, tired)]

    @classmethod
    def leave_probability(cls, fatigue: int) -> float:
        return cls.TIRED_LEAVE if fatigue == cls.MAX_FATIGUE else cls.LEAVE

    def reset(self, count: int) -> list[Observation]:
        """``count`` new users: engagement 0 to 2, no fatigue."""
        engagement = self.rng.integers(0, self.START_LEVELS, count)
        self.states = np.column_stack([engagement, np.zeros(count, int)])
        return [self.observation(*state) for state in self.states]

    def step(self, actions: Sequence[str]) -> tuple[list[Observation], list[bool], list[Feedback]]:
        """One day for every running episode (in ``reset``'s order, ended ones left out):
        the next observations of those that go on, which ended, and each day's feedback."""
        observations, ended, feedback, following = [], [], [], []
        for (engagement, fatigue), action in zip(self.states, actions, strict=True):
            index = self.ACTIONS.index(action)
            outcomes = self.outcomes(index, engagement, fatigue)
            pick = self.rng.choice(len(outcomes), p=[outcome[0] for outcome in outcomes])
            _, click, engagement, fatigue = outcomes[pick]
            feedback.append(report(self.rng, click, self.OFFER_COST if index == 2 else 0.0))
            leaves = self.rng.uniform() < self.leave_probability(fatigue)
            ended.append(bool(leaves))
            if not leaves:
                following.append((engagement, fatigue))
                observations.append(self.observation(engagement, fatigue))
        self.states = np.array(following, dtype=int).reshape(-1, 2)
        return observations, ended, feedback

    def true_value(self, policy: Policy) -> float:
        """Expected discounted return per episode that the join credits: ``V = r + gamma P
        V`` solved over every (engagement, fatigue) under the policy's probabilities."""
        index = {state: row for row, state in enumerate(self.grid)}
        probabilities = policy([self.observation(*state) for state in self.grid])
        rewards = np.zeros(len(self.grid))
        transitions = np.zeros((len(self.grid), len(self.grid)))
        for row, (engagement, fatigue) in enumerate(self.grid):
            for action, p_action in enumerate(probabilities[row]):
                cost = self.OFFER_COST if action == 2 else 0.0
                for p, click, e, f in self.outcomes(action, engagement, fatigue):
                    weight = p_action * p
                    rewards[row] += weight * (CLICK_CREDIT * click - cost)
                    stay = 1.0 - self.leave_probability(f)
                    transitions[row, index[(e, f)]] += weight * stay
        values = np.linalg.solve(np.eye(len(self.grid)) - self.GAMMA * transitions, rewards)
        starts = [index[(e, 0)] for e in range(self.START_LEVELS)]
        return float(values[starts].mean())
