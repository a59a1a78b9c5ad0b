"""One policy: the propensity serving logs, the exported model's ``probabilities`` and the
probability CPE assigns (``policies.action_probabilities``, torch) agree on the same rows.

Logged propensities feed every importance weight, so a drift between the numpy policy that
acts (``horizon_engine.Exploration``) and the torch one that evaluates would bias CPE with no
error anywhere. The rows hold exact ties (integer scores, exact in float32 in both libraries),
a row that lists no possible action (every action is possible there, in all three), and
masks that hide the best action. A discrete model's graph takes no possible-actions input: its
``probabilities`` are compared on the rows where every action is possible.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnxruntime
import pytest
import torch

from horizon_engine import Exploration
from horizon_engine.builtin.onnx_export import OnnxExporter
from horizon_engine.export import ExportConfig, PolicyBundle
from horizon_engine.policies import action_probabilities
from horizon_plugins_serving.predictor import Predictor, check_row

ACTIONS = ["0", "1", "2"]
FEATURES = np.array([[2, 0], [1, 1], [1, 1], [0, 3], [1, 1], [-1, 2]], dtype=np.float32)
"""Scores ``x0 + 0``, ``x1``, ``x0 + x1 - 1``: [2, 0, 1], a three-way tie at 1 (twice),
[0, 3, 2], the tie again, [-1, 2, 0]."""
POSSIBLE = [None, None, [], ["0", "2"], ["1", "2"], ["0"]]
"""Every action; every action; none listed (so every action); the best hidden; a tie among
the possible ones; a single possible action."""
EVERY_ACTION_ROWS = [0, 1, 2]
POLICIES = [
    {"policy": "greedy"},
    {"policy": "epsilon_greedy", "epsilon": 0.3},
    {"policy": "softmax", "temperature": 0.5},
]


class HandWeightedDqn(torch.nn.Module):
    """A dqn policy module (raw state in, one score per action out) with integer weights."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 3)
        with torch.no_grad():
            self.layer.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
            self.layer.bias.copy_(torch.tensor([0.0, 0.0, -1.0]))

    def forward(self, values: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
        return self.layer(values * presence)


def export(path, model: torch.nn.Module, **policy) -> None:
    """``model.onnx`` under ``path`` through the real exporter and its check against torch."""
    values = torch.from_numpy(FEATURES)
    bundle = PolicyBundle(
        model=model.eval(),
        feature_ids=["f0", "f1"],
        actions=ACTIONS,
        normalization={},
        sample_values=values,
        sample_presence=torch.ones_like(values),
        run_id="parity",
        action_feature_ids=[],
    )
    OnnxExporter(ExportConfig(**policy)).export(SimpleNamespace(output_dir=path), bundle)


def torch_mask(possible: list[list[str] | None]) -> torch.Tensor:
    """The possible actions as the timeline hands them to CPE: a 0/1 mask, all zeros for a row
    that listed none, all ones for a row that recorded no list."""
    mask = torch.zeros(len(possible), len(ACTIONS))
    for row, names in enumerate(possible):
        if names is None:
            mask[row] = 1.0
        for name in names or []:
            mask[row, ACTIONS.index(name)] = 1.0
    return mask


@pytest.mark.parametrize("policy", POLICIES, ids=[p["policy"] for p in POLICIES])
def test_serving_the_exported_model_and_cpe_give_the_same_probabilities(tmp_path, policy):
    model = HandWeightedDqn()
    export(tmp_path, model, **policy)
    states = [{"f0": float(x0), "f1": float(x1)} for x0, x1 in FEATURES]
    rows = [
        {"state_features": state} | ({} if names is None else {"possible_actions": names})
        for state, names in zip(states, POSSIBLE, strict=True)
    ]
    predictor = Predictor(tmp_path / "model.onnx", Exploration(**policy), seed=0)
    assert all(predictor.row_problem(row) is None for row in rows)
    served, chosen_actions, _ = predictor.decide(rows)
    chosen = [ACTIONS.index(action) for action in chosen_actions]

    values = torch.from_numpy(FEATURES)
    with torch.no_grad():
        scores = model(values, torch.ones_like(values))
    kind, epsilon = policy["policy"], policy.get("epsilon", 0.0)
    temperature = policy.get("temperature", 1.0)
    cpe = action_probabilities(scores, torch_mask(POSSIBLE), kind, epsilon, temperature)
    cpe = cpe.double().numpy()

    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    every = FEATURES[EVERY_ACTION_ROWS]
    (exported,) = session.run(["probabilities"], {"features": every, "presence": every * 0 + 1})

    np.testing.assert_allclose(served.probabilities, cpe, rtol=0, atol=1e-6)
    np.testing.assert_allclose(exported, cpe[EVERY_ACTION_ROWS], rtol=0, atol=1e-6)
    logged = served.propensities
    np.testing.assert_allclose(logged, cpe[np.arange(len(chosen)), chosen], rtol=0, atol=1e-6)
    assert cpe[5].tolist() == [1.0, 0.0, 0.0]  # one possible action, whatever the policy
    if kind != "softmax":  # ties go to the first (possible) action in all three
        best = [0, 0, 0, 2, 1, 0]
        assert cpe.argmax(axis=1).tolist() == best
        assert served.probabilities.argmax(axis=1).tolist() == best
        assert exported.argmax(axis=1).tolist() == best[:3]


def test_a_request_listing_no_possible_action_is_served_over_every_action():
    """The rule CPE reads logged rows by: an empty list did not record the possible actions.
    Serving refused such a request before, so the same row meant two things."""
    assert check_row({"state_features": {}, "possible_actions": []}, ACTIONS, "discrete") is None
    assert "expected a list" in check_row(
        {"state_features": {}, "possible_actions": "0"}, ACTIONS, "discrete"
    )
    scores = np.array([[1.0, 3.0, 2.0]])
    softmax = Exploration("softmax").probabilities(scores, np.zeros((1, 3), dtype=bool))
    np.testing.assert_allclose(softmax, Exploration("softmax").probabilities(scores))


def test_the_online_draw_is_epsilon_greedy_over_every_action():
    """``explore_or_exploit`` (the gym's per-step draw) samples ``probabilities``: its
    propensities are the formula's, and its frequencies follow them."""
    exploration = Exploration("epsilon_greedy", 0.3)
    rng = np.random.default_rng(0)
    draws = [exploration.explore_or_exploit(2, 4, rng) for _ in range(4000)]
    want = exploration.probabilities(np.array([[0.0, 0.0, 1.0, 0.0]]))[0]
    assert {index: p for index, p in draws} == dict(enumerate(want))
    frequencies = np.bincount([index for index, _ in draws], minlength=4) / len(draws)
    np.testing.assert_allclose(frequencies, want, atol=0.03)
