"""The policy-output type, and action probabilities from scores: greedy, epsilon-greedy, softmax.

Serving, counterfactual evaluation and the exported model all need the probability of every
action under the trained policy, not only the chosen action. ``PolicyOutput`` is what a policy
says about a batch of states for each action kind, and ``policy_output`` computes it from a
trainer's policy module; exporters and estimators consume only that type. The functions below
are tensor functions with export-friendly operations (no data-dependent shapes), so that an
exported model computes its outputs with ``policy_output`` itself.
Impossible actions (mask 0) get probability 0; the score of an impossible action never wins. A
row whose mask is all zeros did not record its possible actions, and every action counts as
possible there (as the row checks and the timeline treat an empty list).

The rules are ``horizon_engine.exploration``'s, the numpy owner that serving and the gym act
with; tests/test_policy_parity.py holds these tensor functions, and the exported model's
``probabilities``, to it on the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import Field

from horizon_engine.components import ComponentConfig
from horizon_engine.errors import HorizonError
from horizon_engine.exploration import PolicyKind
from horizon_engine.schema import ActionType

if TYPE_CHECKING:
    import torch


class ExplorationConfig(ComponentConfig):
    """How a policy's action probabilities follow from its scores: the options of every
    section that applies a policy (``[export]``, each ``[[evaluation]]``)."""

    policy: PolicyKind = "greedy"
    """greedy (the best action), epsilon_greedy or softmax over the scores."""
    epsilon: float = Field(default=0.0, ge=0.0, le=1.0)
    """For epsilon_greedy: the probability spread uniformly over the possible actions."""
    temperature: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)
    """For softmax: scores are divided by it (lower is greedier). Any finite number above 0:
    one below the smallest the scores' float type holds (1.4e-45 in float32) acts as that
    one, which is greedy with tied actions sharing the probability."""


@dataclass
class PolicyOutput:
    """What a policy says about a batch of ``B`` states, for each of the three action kinds.

    - discrete: ``scores`` and ``probabilities`` ``[B, A]`` over the actions (0 for an
      impossible one), ``action`` ``[B]`` int64, the most probable action's index;
    - parametric: the same over each row's ``K`` candidates (``[B, K]``, padding slots 0);
    - continuous: ``action`` ``[B, D]``, the action vector in the user's units, and for a
      stochastic policy ``log_density`` ``[B]``, the log-density of that action.
    """

    action_type: ActionType
    action: torch.Tensor
    scores: torch.Tensor | None = None
    probabilities: torch.Tensor | None = None
    log_density: torch.Tensor | None = None

    def probability_of(self, action: torch.Tensor) -> torch.Tensor:
        """``[B]``: the probability the policy gives each row's ``action`` (an index, as the
        batch schema's discrete ``action``); for importance weights against the logged one."""
        if self.probabilities is None:
            raise HorizonError(
                f"a {self.action_type.value} policy's output has no action probabilities; "
                "a continuous policy gives the log-density of its own action"
            )
        return self.probabilities.gather(1, action.long().unsqueeze(1)).squeeze(1)


def policy_output(
    model: torch.nn.Module,
    action_type: ActionType,
    state: torch.Tensor,
    state_presence: torch.Tensor,
    exploration: ExplorationConfig | None = None,
    possible_actions: torch.Tensor | None = None,
    candidates: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> PolicyOutput:
    """The ``PolicyOutput`` of a trainer's policy module (``TrainerBase.policy()``) on states.

    The module takes the raw state ``(values, presence)``, and for parametric actions each
    row's candidates ``(values, presence)`` ``[B, K, G]`` too; it returns the scores, or for
    continuous actions the action vector (or ``(action, log_density)`` when stochastic).
    ``possible_actions`` masks actions (discrete) or marks real candidates (parametric); all
    possible by default. Probabilities follow ``exploration`` (greedy by default).
    """
    import torch

    exploration = exploration or ExplorationConfig()
    if action_type is ActionType.CONTINUOUS:
        result = model(state, state_presence)
        if isinstance(result, tuple):
            return PolicyOutput(action_type, action=result[0], log_density=result[1])
        return PolicyOutput(action_type, action=result)
    if action_type is ActionType.PARAMETRIC:
        if candidates is None:
            raise HorizonError("a parametric policy needs each row's candidate actions")
        scores = model(state, state_presence, *candidates)
    else:
        scores = model(state, state_presence)
    possible = torch.ones_like(scores) if possible_actions is None else possible_actions
    probabilities = action_probabilities(
        scores, possible, exploration.policy, exploration.epsilon, exploration.temperature
    )
    return PolicyOutput(action_type, probabilities.argmax(dim=1), scores, probabilities)


IMPOSSIBLE = -1e9
"""Score given to impossible actions before a max or softmax (Horizon's constant)."""


def masked_scores(scores: torch.Tensor, possible: torch.Tensor) -> torch.Tensor:
    """Scores with impossible actions pushed to ``IMPOSSIBLE``."""
    import torch

    return torch.where(possible > 0, scores, torch.full_like(scores, IMPOSSIBLE))


def recorded_possible(possible: torch.Tensor) -> torch.Tensor:
    """The mask with every action possible on rows that list none (they did not record them)."""
    import torch

    recorded = possible.sum(dim=1, keepdim=True) > 0
    return torch.where(recorded, possible, torch.ones_like(possible))


def top_two_gap(scores: torch.Tensor, possible: torch.Tensor) -> torch.Tensor:
    """``[batch]``: how far each row's best possible score is ahead of its second best
    (``inf`` where only one action is possible).

    How close the greedy choice is to going the other way: an exported model, computing the
    same scores in another library's float arithmetic, may rank two actions closer than that
    arithmetic's error the other way round.
    """
    import torch

    possible = recorded_possible(possible) > 0
    masked = torch.where(possible, scores, torch.full_like(scores, -torch.inf))
    if scores.shape[1] < 2:
        return torch.full(scores.shape[:1], torch.inf, dtype=scores.dtype)
    best, second = masked.topk(2, dim=1).values.unbind(dim=1)
    return torch.where(torch.isfinite(second), best - second, torch.inf)


def softmax_weights(
    scores: torch.Tensor, possible: torch.Tensor, temperature: float
) -> torch.Tensor:
    """``exp((score - best) / temperature)`` of the ``possible`` actions (bool), 0 for the
    others: the unnormalized softmax, numerically safe for any finite temperature above 0.

    Shifted by the row's best possible score, every exponent is at most 0 (the best's is 0),
    so nothing overflows, and the sum is at least 1. A temperature below the smallest number
    of the scores' float type (it would round to 0 and divide 0 by 0) is taken as that
    number: every action behind the best by more than a few such steps gets weight 0, tied
    ones 1 each, the greedy choice with ties shared (``exploration.Exploration`` computes
    the same in float64)."""
    import torch

    finfo = torch.finfo(scores.dtype)
    temperature = max(temperature, finfo.tiny * finfo.eps)
    best = torch.where(possible, scores, torch.full_like(scores, -torch.inf))
    shifted = scores - best.max(dim=1, keepdim=True).values
    exponent = torch.where(possible, shifted / temperature, torch.full_like(scores, -torch.inf))
    return torch.exp(exponent)


def action_probabilities(
    scores: torch.Tensor,
    possible: torch.Tensor,
    kind: PolicyKind,
    epsilon: float = 0.0,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``[batch, actions]`` probabilities of each action under the policy.

    greedy: 1 on the best possible action (the first of ties); epsilon_greedy: that plus
    epsilon spread uniformly over the possible actions; softmax: softmax of scores / temperature
    over the possible actions (``softmax_weights``).
    """
    import torch

    possible = recorded_possible(possible)
    masked = masked_scores(scores, possible)
    allowed = (possible > 0).to(scores.dtype)
    if kind == "softmax":
        weights = softmax_weights(scores, possible > 0, temperature)
        return weights / weights.sum(dim=1, keepdim=True).clamp(min=1e-12)
    best = torch.nn.functional.one_hot(masked.argmax(dim=1), scores.shape[1]).to(scores.dtype)
    if kind == "greedy":
        return best
    uniform = allowed / allowed.sum(dim=1, keepdim=True).clamp(min=1.0)
    return (1.0 - epsilon) * best + epsilon * uniform
