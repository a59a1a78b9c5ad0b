"""Exploration in numpy: each action's probability under a policy, from the scores, and the
draw of an action from them with a seeded ``numpy.random.Generator``.

The one implementation that serving, the gym source and the gym runner use. Logged
propensities feed every importance weight, so the torch side (``policies.action_probabilities``,
what training, counterfactual evaluation and the exported model's ``probabilities`` compute) is
held to this module by tests/test_policy_parity.py.

The rules, the same in both:

- greedy: probability 1 on the best possible action, the first of tied scores;
- epsilon_greedy: that times ``1 - epsilon``, plus ``epsilon`` spread uniformly over the
  possible actions (the best included);
- softmax: ``exp(score / temperature)`` over the possible actions, normalized; computed as
  ``exp((score - best) / temperature)``, which never overflows, so that any finite temperature
  above 0 gives probabilities: a tiny one the greedy choice with tied actions sharing it (the
  torch side computes in the scores' float type, float32, and takes a temperature below its
  smallest number, 1.4e-45, as that number: the same but for scores closer than 1e-43);
- an impossible action has probability 0, and a row that lists no possible action did not
  record them: every action is possible there (as the timeline and CPE read logged rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from horizon_engine.errors import HorizonError

PolicyKind = Literal["greedy", "epsilon_greedy", "softmax"]
POLICIES: tuple[str, ...] = get_args(PolicyKind)


def recorded_possible(possible: np.ndarray | None, shape: tuple[int, int]) -> np.ndarray:
    """``[rows, actions]`` bool: ``possible`` with every action possible on the rows that list
    none (all of them when ``possible`` is None)."""
    if possible is None:
        return np.ones(shape, dtype=bool)
    possible = np.asarray(possible, dtype=bool)
    return possible | ~possible.any(axis=1, keepdims=True)


@dataclass(frozen=True)
class Exploration:
    """A policy over scored actions: ``policy`` (one of ``POLICIES``), ``epsilon`` (for
    epsilon_greedy, in [0, 1]) and ``temperature`` (for softmax, finite and positive)."""

    policy: str = "greedy"
    epsilon: float = 0.0
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise HorizonError(f"exploration policy {self.policy!r}: expected one of {POLICIES}")
        if not 0.0 <= self.epsilon <= 1.0:
            raise HorizonError(f"epsilon {self.epsilon}: expected a number in [0, 1]")
        if not 0.0 < self.temperature < np.inf:
            raise HorizonError(f"temperature {self.temperature}: expected a finite number above 0")

    @property
    def label(self) -> str:
        """The policy with the setting that counts for it, as a decision log records it:
        ``greedy``, ``epsilon_greedy(epsilon=0.1)``, ``softmax(temperature=0.5)``."""
        if self.policy == "epsilon_greedy":
            return f"epsilon_greedy(epsilon={self.epsilon})"
        if self.policy == "softmax":
            return f"softmax(temperature={self.temperature})"
        return self.policy

    @property
    def deterministic(self) -> bool:
        """True when every row's action is its best one: no draw is made."""
        return self.policy == "greedy" or (self.policy == "epsilon_greedy" and not self.epsilon)

    def probabilities(self, scores: np.ndarray, possible: np.ndarray | None = None) -> np.ndarray:
        """``[rows, actions]`` float64: each action's probability, 0 for impossible ones."""
        scores = np.asarray(scores)
        possible = recorded_possible(possible, scores.shape)
        masked = np.where(possible, scores, -np.inf)
        rows = np.arange(len(scores))
        if self.policy == "softmax":
            masked = masked.astype(np.float64)
            with np.errstate(over="ignore"):  # a tiny temperature: -inf, weight 0, as meant
                shifted = (masked - masked.max(axis=1, keepdims=True)) / self.temperature
            weights = np.where(possible, np.exp(shifted), 0.0)
            return weights / weights.sum(axis=1, keepdims=True)
        probabilities = np.zeros(scores.shape)
        if not self.deterministic:
            count = possible.sum(axis=1, keepdims=True)
            probabilities = np.where(possible, self.epsilon / count, 0.0)
        probabilities[rows, masked.argmax(axis=1)] += 1.0 - (
            self.epsilon if self.policy == "epsilon_greedy" else 0.0
        )
        return probabilities

    def choose(
        self, scores: np.ndarray, possible: np.ndarray | None, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A batch's actions: each row's chosen index, its propensity and every action's
        probabilities, drawn with ``draw`` (one uniform per row; none when deterministic)."""
        probabilities = self.probabilities(scores, possible)
        if self.deterministic:
            chosen = probabilities.argmax(axis=1)
            return chosen, np.ones(len(chosen)), probabilities
        chosen = draw(probabilities, rng)
        return chosen, probabilities[np.arange(len(chosen)), chosen], probabilities

    def explore_or_exploit(
        self, best: int | None, count: int, rng: np.random.Generator
    ) -> tuple[int, float]:
        """One epsilon-greedy decision among ``count`` actions, all possible, as an online run
        makes it: a coin with chance ``epsilon`` (none when epsilon is 1, where ``best`` may be
        None: a uniform policy has none), then for an explored step a uniform index
        (``rng.integers``), else ``best``; with its propensity under ``probabilities``. The
        same distribution as ``choose``, drawn the way the gym source's seeded rows and the gym
        runner's learning figures were recorded."""
        if self.policy != "epsilon_greedy":
            raise HorizonError(f"an online run explores epsilon-greedily, not by {self.policy}")
        uniform = self.epsilon >= 1.0
        if not uniform and (best is None or not 0 <= best < count):
            raise HorizonError(f"greedy action {best} is not in 0..{count - 1}")
        explore = uniform or rng.random() < self.epsilon
        index = int(rng.integers(count)) if explore else int(best)
        scores = np.zeros((1, count))
        scores[0, best or 0] = 1.0
        return index, float(self.probabilities(scores)[0, index])


def draw(probabilities: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One action index per row drawn from its probabilities: one uniform per row against the
    cumulative sums (no draw at all when every row is one-hot)."""
    best = probabilities.argmax(axis=1)
    if np.all(probabilities[np.arange(len(best)), best] == 1.0):
        return best
    draws = rng.random(len(probabilities))[:, None]
    cumulative = np.cumsum(probabilities, axis=1)
    chosen = (cumulative < draws * cumulative[:, -1:]).sum(axis=1)
    # a draw past the last possible action's cumulative sum (rounding) takes that action
    last_possible = probabilities.shape[1] - 1 - (probabilities[:, ::-1] > 0).argmax(axis=1)
    return np.minimum(chosen, last_possible)
