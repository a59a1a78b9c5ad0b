"""The arithmetic of DQN targets, as functions of tensors, each testable on a hand-made case.

Everything is batched: one set of tensor operations per minibatch (or per eval split), never a
Python loop over rows.
"""

from __future__ import annotations

import torch

from horizon_engine import masked_scores


def max_next_value(
    target_scores: torch.Tensor,
    online_scores: torch.Tensor | None,
    allowed: torch.Tensor,
) -> torch.Tensor:
    """The value of the next state under Q-learning, over the ``allowed`` actions only.

    With ``online_scores`` (double Q, van Hasselt et al. 2016) the online network chooses the
    action and the target network values it, which removes the max's upward bias; without,
    the target network's own max. A row with no allowed action (a terminal row's empty mask)
    is worth 0 rather than ``IMPOSSIBLE``.
    """
    chooser = target_scores if online_scores is None else online_scores
    best = masked_scores(chooser, allowed).argmax(dim=1, keepdim=True)
    value = target_scores.gather(1, best).squeeze(1)
    return torch.where(allowed.sum(dim=1) > 0, value, 0.0)


def sarsa_next_value(target_scores: torch.Tensor, next_action: torch.Tensor) -> torch.Tensor:
    """The target network's value of the logged next action (0 where there is none: ``-1``)."""
    value = target_scores.gather(1, next_action.clamp(min=0).unsqueeze(1)).squeeze(1)
    return torch.where(next_action >= 0, value, 0.0)


def one_step_discount(
    not_terminal: torch.Tensor, time_diff: torch.Tensor | None, gamma: float, use_time_diff: bool
) -> torch.Tensor:
    """What the next state's value is multiplied by: ``gamma`` (or ``gamma ** time_diff``),
    0 for a terminal row. ``time_diff`` may be None without ``use_time_diff``: reading a
    minibatch's tensor gathers its rows, an operation per update for nothing."""
    if not use_time_diff:
        return not_terminal * gamma
    return torch.pow(gamma, time_diff) * not_terminal


def n_step_return(
    rewards: torch.Tensor,
    time_diffs: torch.Tensor | None,
    not_terminal: torch.Tensor,
    lengths: torch.Tensor,
    gamma: float,
    use_time_diff: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The discounted reward of each row's n-step window and the bootstrap discount at its end.

    ``rewards``, ``time_diffs`` and ``not_terminal`` are ``[B, n]`` (the timeline's windows,
    padded past ``lengths``): entry j belongs to row t + j of the episode. Returns
    ``sum_j gamma**D_j r_j`` with ``D_j = j`` (or the time_diffs before step j), and
    ``gamma**D_L`` times whether the window's last row is non-terminal: the factor of the
    value of the state where the window ends. ``time_diffs`` may be None without
    ``use_time_diff`` (a minibatch gathers a tensor's rows when it is read).
    """
    steps = torch.arange(rewards.shape[1], device=rewards.device)
    inside = (steps.unsqueeze(0) < lengths.unsqueeze(1)).to(rewards.dtype)
    if use_time_diff:
        elapsed = torch.cumsum(time_diffs * inside, dim=1)
        exponents = elapsed - time_diffs * inside
        end_exponent = elapsed[:, -1]
    else:
        exponents = steps.to(rewards.dtype).expand_as(rewards)
        end_exponent = lengths.to(rewards.dtype)
    returns = (inside * torch.pow(gamma, exponents) * rewards).sum(dim=1)
    last = (lengths - 1).unsqueeze(1)
    bootstrap = torch.pow(gamma, end_exponent) * not_terminal.gather(1, last).squeeze(1)
    return returns, bootstrap


def cql_gaps(scores: torch.Tensor, logged: torch.Tensor, possible: torch.Tensor) -> torch.Tensor:
    """Each row's conservative Q-learning gap (Kumar et al. 2020): ``logsumexp`` over the possible
    actions of Q(s, .) minus Q(s, logged action), 0 for a row whose possible actions were not
    recorded (it has nothing to push down). Its mean is CQL's penalty: it pushes down the
    actions the data never shows while keeping the logged ones."""
    gaps = torch.logsumexp(masked_scores(scores, possible), dim=1) - logged
    return torch.where(possible.sum(dim=1) > 0, gaps, 0.0)


def logged_coverage(propensity: torch.Tensor, possible: torch.Tensor) -> torch.Tensor:
    """How evenly the logs cover the actions, from the logged propensities: the mean over rows
    of ``n * floor``, ``n`` the row's possible actions and ``floor`` the least probability the
    row's logger gave any of them.

    A row's propensity p of its logged action bounds the others': they share 1 - p, so the
    least is at most ``min(p, (1 - p) / (n - 1))``, which is exact for uniform and
    epsilon-greedy loggers. 1 is uniformly random logging, 0.1 an epsilon-greedy logger with
    epsilon 0.1; a mix of loggers (a random round, then epsilon-greedy ones) lies between, as
    its mixture's floor does when the loggers saw the same states. A row without a valid
    propensity, or with one possible action, covers nothing (0)."""
    count = possible.sum(dim=1)
    others = (1 - propensity) / (count - 1).clamp(min=1)
    floor = torch.minimum(propensity, others)
    known = (propensity > 0) & (propensity <= 1) & (count > 1)
    return torch.where(known, (count * floor).clamp(0, 1), 0.0).mean()


def episode_ends(
    not_terminal: torch.Tensor,
    state: torch.Tensor,
    state_presence: torch.Tensor,
    next_state: torch.Tensor,
    next_state_presence: torch.Tensor,
) -> torch.Tensor:
    """Where an episode ends in rows sorted by (mdp_id, sequence_number): 1.0 at a terminal row,
    at a row whose next state is not the following row's state, and at the last row.

    The tensors carry no mdp_id. A terminal row is an episode's last (the default
    ``add_terminal_state_row = true``); without terminal rows (``false``, or a
    ``time_window_limit`` cutting an episode short) the last kept row's next state is a state
    the split does not hold, so the mismatch marks the boundary. Two episodes stay joined only
    if one's last next state equals, value for value, the next one's first state.
    """
    ends = 1.0 - not_terminal
    follows = (next_state[:-1] == state[1:]).all(dim=1) & (
        next_state_presence[:-1] == state_presence[1:]
    ).all(dim=1)
    ends[:-1] = torch.where(follows, ends[:-1], 1.0)
    ends[-1:] = 1.0
    return ends


def discounted_returns(
    reward: torch.Tensor, discount: torch.Tensor, ends: torch.Tensor
) -> torch.Tensor:
    """Each row's discounted return to the end of its episode: ``G_t = r_t + d_t G_{t+1}``,
    restarting after every row where ``ends`` is 1.

    A parallel scan (log2(rows) passes over the split) rather than a loop over rows: after
    the pass with stride k, ``G_t = a_t + b_t G_{t+k}`` holds with ``b_t`` 0 once the chain
    left the episode. Only products of discounts are formed, so long episodes cannot overflow.
    """
    total = reward.clone()
    factor = discount * (1.0 - ends)
    stride = 1
    while stride < len(reward):
        total = total + factor * _shifted(total, stride)
        factor = factor * _shifted(factor, stride)
        stride *= 2
    return total


def _shifted(values: torch.Tensor, stride: int) -> torch.Tensor:
    """``values[t + stride]``, 0 past the end."""
    return torch.cat([values[stride:], values.new_zeros(stride)])
