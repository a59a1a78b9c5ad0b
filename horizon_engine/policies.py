"""Action probabilities from scores: greedy, epsilon-greedy and softmax.

Serving, counterfactual evaluation and the exported model all need the probability of every
action under the trained policy, not only the chosen action. These are tensor functions with
export-friendly operations (no data-dependent shapes), shared by trainers and exporters.
Impossible actions (mask 0) get probability 0; the score of an impossible action never wins. A
row whose mask is all zeros did not record its possible actions, and every action counts as
possible there (as the row checks and the timeline treat an empty list).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

PolicyKind = Literal["greedy", "epsilon_greedy", "softmax"]

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
    over the possible actions.
    """
    import torch

    possible = recorded_possible(possible)
    masked = masked_scores(scores, possible)
    allowed = (possible > 0).to(scores.dtype)
    if kind == "softmax":
        weights = torch.softmax(masked / temperature, dim=1) * allowed
        return weights / weights.sum(dim=1, keepdim=True).clamp(min=1e-12)
    best = torch.nn.functional.one_hot(masked.argmax(dim=1), scores.shape[1]).to(scores.dtype)
    if kind == "greedy":
        return best
    uniform = allowed / allowed.sum(dim=1, keepdim=True).clamp(min=1.0)
    return (1.0 - epsilon) * best + epsilon * uniform
