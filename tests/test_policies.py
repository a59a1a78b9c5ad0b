"""Action probabilities under greedy, epsilon-greedy and softmax policies, with masks."""

from __future__ import annotations

import pytest
import torch

from horizon_engine.policies import action_probabilities

SCORES = torch.tensor([[1.0, 3.0, 2.0], [5.0, 0.0, 1.0], [0.0, 1.0, 2.0]])
POSSIBLE = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0]])


def test_greedy_takes_the_best_possible_action():
    probabilities = action_probabilities(SCORES, POSSIBLE, "greedy")
    # Row 1's best score (5.0) is impossible; row 2 recorded no possible action: all count.
    assert probabilities.tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]


def test_epsilon_greedy_spreads_epsilon_over_the_possible_actions():
    probabilities = action_probabilities(SCORES, POSSIBLE, "epsilon_greedy", epsilon=0.3)
    assert probabilities[0].tolist() == pytest.approx([0.1, 0.8, 0.1])
    assert probabilities[1].tolist() == pytest.approx([0.0, 0.15, 0.85])
    assert probabilities.sum(dim=1).tolist() == pytest.approx([1.0, 1.0, 1.0])


def test_softmax_over_possible_actions_with_temperature():
    probabilities = action_probabilities(SCORES, POSSIBLE, "softmax", temperature=0.5)
    expected = torch.softmax(torch.tensor([0.0, 1.0]) / 0.5, dim=0).tolist()
    assert probabilities[1].tolist() == pytest.approx([0.0, *expected])
    assert probabilities[2].tolist() == pytest.approx(
        torch.softmax(SCORES[2] / 0.5, dim=0).tolist()
    )


def test_top_two_gap_over_the_possible_actions():
    from horizon_engine.policies import top_two_gap

    scores = torch.tensor([[1.0, 3.0, 2.0], [5.0, 0.0, 1.0], [0.0, 1.0, 2.0], [4.0, 9.0, 4.0]])
    possible = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    # Row 1 ignores its impossible 5.0; row 2 recorded none, so all count; row 3 has one choice.
    assert top_two_gap(scores, possible).tolist() == [1.0, 1.0, 1.0, float("inf")]
