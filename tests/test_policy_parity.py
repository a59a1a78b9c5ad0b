"""One policy: the propensity serving logs, the exported model's ``probabilities`` and the
probability CPE assigns (``policies.action_probabilities``, torch) agree on the same rows.

Logged propensities feed every importance weight, so a drift between the numpy policy that
acts (``horizon_engine.Exploration``) and the torch one that evaluates would bias CPE with no
error anywhere. The rows hold exact ties (integer scores, exact in float32 in both libraries),
a row that lists no possible action (every action is possible there, in all three), and
masks that hide the best action. A discrete model's graph takes no possible-actions input: its
``probabilities`` are compared on the rows where every action is possible. A parametric model's
rows offer from one to three candidates (the rest padding, which no policy may choose), with
ties; a stochastic continuous actor's propensity is the density of its own action, which
serving logs, the exported model's ``log_density`` gives and CPE's ``policy_output`` computes.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnxruntime
import pytest
import torch
from test_ac_export import STATE_IDS, Actor
from test_ac_export import export as export_actor

from horizon_engine import Exploration
from horizon_engine.builtin.onnx_export import OnnxExporter
from horizon_engine.export import ExportConfig, PolicyBundle
from horizon_engine.policies import ExplorationConfig, action_probabilities, policy_output
from horizon_engine.schema import ActionType
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
    # The extremes: below float32's smallest number (greedy, ties shared), its smallest, its
    # smallest normal one, and one that makes every possible action as likely.
    *({"policy": "softmax", "temperature": t} for t in (1e-300, 1e-45, 1e-38, 1e30)),
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


@pytest.mark.parametrize("policy", POLICIES, ids=[Exploration(**p).label for p in POLICIES])
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


CANDIDATES = [
    [{"a0": 1.0}, {"a1": 1.0}, {"a0": 1.0, "a1": 1.0}],
    [{"a0": 1.0}, {"a1": 1.0}],
    [{"a1": 1.0}],
    [{"a0": 1.0}, {"a1": 1.0}, {"a0": 1.0, "a1": 1.0}],
    [{"a0": 2.0}, {"a1": -1.0}, {}],
    [{"a0": 1.0}, {"a1": 1.0}],
]
"""Each row's candidates, scored ``a0 * x0 + a1 * x1`` on ``FEATURES``: [2, 0, 2] (a tie with
the third), [1, 1] (a tie, one padding slot), one candidate, [0, 3, 3], [2, -1, 0] (a
candidate with no feature present), [-1, 2]."""


class HandWeightedParametric(torch.nn.Module):
    """A parametric dqn policy module: each candidate's score is its features' dot product
    with the state's (integers, exact in float32 everywhere)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            self.scale.weight.fill_(1.0)

    def forward(self, values, presence, candidates, candidate_presence) -> torch.Tensor:
        state = (values * presence).unsqueeze(1)
        scores = (candidates * candidate_presence * state).sum(dim=2, keepdim=True)
        return self.scale(scores).squeeze(2)


def dense_candidates() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``CANDIDATES`` as a parametric model's inputs: values and presence ``[rows, 3, 2]``
    and the mask ``[rows, 3]`` (0 for padding)."""
    values, presence = torch.zeros(len(CANDIDATES), 3, 2), torch.zeros(len(CANDIDATES), 3, 2)
    mask = torch.zeros(len(CANDIDATES), 3)
    for row, offered in enumerate(CANDIDATES):
        for slot, candidate in enumerate(offered):
            mask[row, slot] = 1.0
            for column, feature in enumerate(["a0", "a1"]):
                if feature in candidate:
                    values[row, slot, column] = candidate[feature]
                    presence[row, slot, column] = 1.0
    return values, presence, mask


@pytest.mark.parametrize("policy", POLICIES, ids=[Exploration(**p).label for p in POLICIES])
def test_parametric_serving_the_exported_model_and_cpe_give_the_same_probabilities(
    tmp_path, policy
):
    model = HandWeightedParametric().eval()
    values = torch.from_numpy(FEATURES)
    candidates = dense_candidates()
    bundle = PolicyBundle(
        model=model,
        feature_ids=["f0", "f1"],
        actions=[],
        normalization={},
        sample_values=values,
        sample_presence=torch.ones_like(values),
        run_id="parity",
        action_feature_ids=["a0", "a1"],
        sample_candidates=candidates,
        action_type=ActionType.PARAMETRIC,
    )
    OnnxExporter(ExportConfig(**policy)).export(SimpleNamespace(output_dir=tmp_path), bundle)
    rows = [
        {"state_features": {"f0": float(x0), "f1": float(x1)}, "possible_actions": offered}
        for (x0, x1), offered in zip(FEATURES, CANDIDATES, strict=True)
    ]
    predictor = Predictor(tmp_path / "model.onnx", Exploration(**policy), seed=0)
    assert all(predictor.row_problem(row) is None for row in rows)
    served, chosen_maps, _ = predictor.decide(rows)

    with torch.no_grad():
        cpe = (
            policy_output(
                model,
                ActionType.PARAMETRIC,
                values,
                torch.ones_like(values),
                ExplorationConfig(**policy),
                candidates[2],
                candidates[:2],
            )
            .probabilities.double()
            .numpy()
        )
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    feeds = dict(
        zip(["candidates", "candidate_presence", "candidate_mask"], candidates, strict=True)
    )
    feeds = {name: tensor.numpy() for name, tensor in feeds.items()}
    (exported,) = session.run(
        ["probabilities"], {"features": FEATURES, "presence": FEATURES * 0 + 1} | feeds
    )

    np.testing.assert_allclose(served.probabilities, cpe, rtol=0, atol=1e-6)
    np.testing.assert_allclose(exported, cpe, rtol=0, atol=1e-6)
    chosen = np.array(served.actions)
    assert [CANDIDATES[row][i] for row, i in enumerate(chosen)] == chosen_maps
    logged = served.propensities
    np.testing.assert_allclose(logged, cpe[np.arange(len(chosen)), chosen], rtol=0, atol=1e-6)
    padding = candidates[2].numpy() == 0
    assert not cpe[padding].any() and not served.probabilities[padding].any()
    assert cpe[2].tolist() == [1.0, 0.0, 0.0]  # one candidate, whatever the policy
    if policy["policy"] != "softmax":  # ties go to the first candidate in all three
        best = [0, 0, 0, 1, 0, 1]
        assert cpe.argmax(axis=1).tolist() == best
        assert exported.argmax(axis=1).tolist() == best


def test_a_stochastic_actors_logged_propensity_is_the_density_the_model_and_cpe_give(tmp_path):
    """A continuous actor draws nothing at serving: its action is its own, logged with the
    density ``exp(log_density)`` the exported model gives, which CPE computes in torch."""
    model = Actor(stochastic=True).eval()
    export_actor(tmp_path, model)
    values = np.random.default_rng(2).normal(0.5, 1.0, (16, len(STATE_IDS))).astype(np.float32)
    values[3] = 0.0
    presence = np.ones_like(values)
    presence[5, 1] = 0.0  # a missing feature
    rows = [
        {"state_features": {f: float(v) for f, v, p in zip(STATE_IDS, row, seen, strict=True) if p}}
        for row, seen in zip(values, presence, strict=True)
    ]
    served, _, _ = Predictor(tmp_path / "model.onnx").decide(rows)

    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    (exported,) = session.run(["log_density"], {"features": values, "presence": presence})
    with torch.no_grad():
        output = policy_output(
            model, ActionType.CONTINUOUS, torch.from_numpy(values), torch.from_numpy(presence)
        )
    cpe = output.log_density.double().exp().numpy()

    np.testing.assert_allclose(served.propensities, cpe, rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.exp(exported.astype(np.float64)), cpe, rtol=0, atol=1e-6)


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
