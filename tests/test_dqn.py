"""The ``dqn`` trainer: target arithmetic on hand-made cases, policies, checkpoints, learning.

Targets are checked through ``DqnTrainer.td_target`` with the networks replaced by tables
(Q of state id s is row s of a table), so every expected number is computed by hand.
"""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from test_dqn_reference import onnx_greedy_return
from test_training import scalars

from horizon_engine import ForeachAdam, ForeachSgd
from horizon_engine.dataset import TimelineTensors
from horizon_engine.errors import HorizonError
from horizon_engine.normalization import NormalizationParameters
from horizon_engine.policies import IMPOSSIBLE, action_probabilities
from horizon_engine.preprocessor import build_preprocessor
from horizon_engine.schema import ActionType
from horizon_engine.training import TrainingProblem
from horizon_plugins_dqn import DqnConfig, DqnTrainer
from horizon_plugins_dqn.networks import QNetwork
from horizon_plugins_dqn.targets import (
    cql_gaps,
    discounted_returns,
    episode_ends,
    logged_coverage,
    max_next_value,
)

ACTIONS = ["left", "stay", "right"]


def problem(features: int = 1, actions: list[str] = ACTIONS, seed: int = 0) -> TrainingProblem:
    """Features passed through unchanged (``do_not_preprocess``), so a state is its values."""
    ids = [str(index) for index in range(features)]
    parameters = {id_: NormalizationParameters(feature_type="do_not_preprocess") for id_ in ids}
    preprocessor = build_preprocessor(ids, parameters)
    return TrainingProblem(
        action_type=ActionType.DISCRETE,
        actions=actions,
        state_preprocessor=preprocessor,
        state_width=features,
        action_preprocessor=None,
        action_width=0,
        device=torch.device("cpu"),
        seed=seed,
    )


def trainer(**options: object) -> DqnTrainer:
    built = DqnTrainer(DqnConfig(**options))
    built.setup(problem())
    return built


class TableQ(torch.nn.Module):
    """Q(s, .) = row s of a table: the state's single feature is its row number."""

    def __init__(self, table: list[list[float]]) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(table, dtype=torch.float))

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.table[state[:, 0].long()]


def with_tables(dqn: DqnTrainer, online: list[list[float]], target: list[list[float]]) -> None:
    dqn.q_network = TableQ(online)
    dqn.target_network = TableQ(target)


def batch(**columns: list) -> dict[str, torch.Tensor]:
    """A minibatch of ``len(reward)`` rows: state ids, actions and masks given as lists."""
    rows = len(columns["reward"])
    defaults: dict[str, list] = {
        "state": [[0.0]] * rows,
        "next_state": [[1.0]] * rows,
        "action": [0] * rows,
        "next_action": [0] * rows,
        "not_terminal": [1.0] * rows,
        "time_diff": [1.0] * rows,
        "action_probability": [1.0 / len(ACTIONS)] * rows,
        "possible_actions": [[1.0] * len(ACTIONS)] * rows,
        "possible_next_actions": [[1.0] * len(ACTIONS)] * rows,
    }
    out = {}
    for name, values in (defaults | columns).items():
        dtype = torch.long if name in ("action", "next_action", "next_n_length") else torch.float
        out[name] = torch.tensor(values, dtype=dtype)
    for name in ("state", "next_state", "next_n_state"):
        if name in out:
            out[f"{name}_presence"] = torch.ones_like(out[name])
    return out


# --- targets --------------------------------------------------------------------------------


def test_impossible_actions_are_left_out_of_max_and_argmax():
    scores = torch.tensor([[5.0, 1.0, 2.0], [-3.0, -1.0, -2.0]])
    allowed = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    assert max_next_value(scores, None, allowed).tolist() == [2.0, -2.0]
    # A row without any possible action is worth 0, not IMPOSSIBLE.
    assert max_next_value(scores[:1], None, torch.zeros(1, 3)).tolist() == [0.0]


def test_double_q_values_the_online_argmax_with_the_target_network():
    target = torch.tensor([[10.0, 1.0, 0.0]])
    online = torch.tensor([[0.0, 5.0, 9.0]])
    allowed = torch.tensor([[1.0, 1.0, 0.0]])
    # The online network prefers "right" but it is impossible; of the rest it picks "stay".
    assert max_next_value(target, online, allowed).tolist() == [1.0]
    assert max_next_value(target, None, allowed).tolist() == [10.0]


def test_td_target_masks_impossible_next_actions_and_uses_the_online_argmax():
    dqn = trainer(gamma=0.5, double_q=True)
    with_tables(dqn, online=[[0, 0, 0], [0, 3, 4]], target=[[0, 0, 0], [8, 2, 6]])
    rows = batch(reward=[1.0, 1.0], possible_next_actions=[[1, 1, 1], [1, 1, 0]])
    # Row 0: online argmax "right", target 6. Row 1: "right" impossible, online picks "stay": 2.
    assert dqn.td_target(rows).tolist() == [1 + 0.5 * 6, 1 + 0.5 * 2]
    plain = trainer(gamma=0.5, double_q=False)
    with_tables(plain, online=[[0, 0, 0], [0, 3, 4]], target=[[0, 0, 0], [8, 2, 6]])
    assert plain.td_target(rows).tolist() == [1 + 0.5 * 8, 1 + 0.5 * 8]


def test_terminal_rows_bootstrap_nothing():
    dqn = trainer(gamma=0.9)
    with_tables(dqn, online=[[0, 0, 0], [7, 7, 7]], target=[[0, 0, 0], [7, 7, 7]])
    rows = batch(
        reward=[2.0, 2.0],
        not_terminal=[1.0, 0.0],
        time_diff=[1.0, 0.0],
        next_action=[1, -1],
        possible_next_actions=[[1, 1, 1], [0, 0, 0]],
    )
    assert dqn.td_target(rows).tolist() == pytest.approx([2 + 0.9 * 7, 2.0])


def test_time_diff_discounts_by_gamma_to_its_power():
    dqn = trainer(gamma=0.5, use_time_diff=True)
    with_tables(dqn, online=[[0, 0, 0], [4, 4, 4]], target=[[0, 0, 0], [4, 4, 4]])
    assert dqn.td_target(batch(reward=[1.0], time_diff=[3.0])).tolist() == [1 + 0.5**3 * 4]


def test_sarsa_values_the_logged_next_action():
    dqn = trainer(gamma=0.5, maxq_learning=False)
    with_tables(dqn, online=[[0, 0, 0], [9, 9, 9]], target=[[0, 0, 0], [8, 2, 6]])
    rows = batch(reward=[0.0, 0.0, 1.0], next_action=[1, 0, -1], not_terminal=[1.0, 1.0, 0.0])
    assert dqn.td_target(rows).tolist() == [0.5 * 2, 0.5 * 8, 1.0]


def test_reward_boost_is_added_for_the_logged_action():
    dqn = trainer(gamma=0.5, reward_boost={"right": 10.0})
    with_tables(dqn, online=[[0, 0, 0], [0, 0, 0]], target=[[0, 0, 0], [0, 0, 0]])
    assert dqn.td_target(batch(reward=[1.0, 1.0], action=[2, 0])).tolist() == [11.0, 1.0]


def test_n_step_target_equals_a_hand_computation():
    gamma = 0.9
    dqn = trainer(gamma=gamma, n_step=3, double_q=False)
    table = [[0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [5, 1, 1], [3, 3, 3]]
    with_tables(dqn, online=table, target=table)
    rows = batch(
        reward=[1.0, 4.0],
        # Row 0: a full window of 3 steps ending in state 4 (best action worth 5, but that
        # one is impossible there: 1). Row 1: 2 steps, then the episode ends.
        next_n_rewards=[[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]],
        next_n_time_diffs=[[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]],
        next_n_not_terminal=[[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]],
        next_n_length=[3, 2],
        next_n_state=[[4.0], [5.0]],
        next_n_possible_next_actions=[[0, 1, 1], [0, 0, 0]],
    )
    expected = [1 + gamma * 2 + gamma**2 * 3 + gamma**3 * 1, 4 + gamma * 5]
    assert dqn.td_target(rows).tolist() == pytest.approx(expected)


def test_n_step_with_time_diff_discounts_by_elapsed_time():
    dqn = trainer(gamma=0.5, n_step=2, use_time_diff=True)
    table = [[0, 0, 0], [0, 0, 0], [4, 4, 4]]
    with_tables(dqn, online=table, target=table)
    rows = batch(
        reward=[1.0],
        next_n_rewards=[[1.0, 2.0]],
        next_n_time_diffs=[[2.0, 3.0]],
        next_n_not_terminal=[[1.0, 1.0]],
        next_n_length=[2],
        next_n_state=[[2.0]],
        next_n_possible_next_actions=[[1, 1, 1]],
    )
    assert dqn.td_target(rows).tolist() == [1 + 0.5**2 * 2 + 0.5**5 * 4]


def test_default_n_step_follows_the_timelines_windows():
    """n_step = 0 (the default): the timeline's 3-step windows where the batch has them, one
    step where it has none (Horizon's timeline rows), and one step for SARSA."""
    gamma = 0.9
    table = [[0, 0, 0], [2, 2, 2], [0, 0, 0], [0, 0, 0], [5, 5, 5]]
    windows = {
        "next_n_rewards": [[1.0, 2.0, 3.0]],
        "next_n_time_diffs": [[1.0, 1.0, 1.0]],
        "next_n_not_terminal": [[1.0, 1.0, 1.0]],
        "next_n_length": [3],
        "next_n_state": [[4.0]],
        "next_n_possible_next_actions": [[1, 1, 1]],
    }
    dqn = trainer(gamma=gamma)
    assert dqn.config.n_step == 0
    with_tables(dqn, online=table, target=table)
    three_steps = 1 + gamma * 2 + gamma**2 * 3 + gamma**3 * 5
    assert dqn.td_target(batch(reward=[1.0], **windows)).tolist() == pytest.approx([three_steps])
    assert dqn.td_target(batch(reward=[1.0])).tolist() == pytest.approx([1 + gamma * 2])
    sarsa = trainer(gamma=gamma, maxq_learning=False)
    with_tables(sarsa, online=table, target=table)
    rows = batch(reward=[1.0], **windows)
    assert sarsa.td_target(rows).tolist() == pytest.approx([1 + gamma * 2])


def test_layers_alone_get_a_relu_for_each_layer():
    from horizon_plugins_dqn import ParametricDqnConfig

    assert DqnConfig(layers=[16]).activations == ["relu"]
    assert ParametricDqnConfig(layers=[32, 16, 8]).activations == ["relu"] * 3
    assert DqnConfig().activations == ["relu", "relu"]
    assert DqnConfig(layers=[16], activations=["tanh"]).activations == ["tanh"]
    dqn = trainer(layers=[16])
    assert [type(layer).__name__ for layer in dqn.q_network.modules()].count("ReLU") == 1


def test_n_step_needs_a_timeline_with_the_same_n_step():
    dqn = trainer(n_step=3)
    with pytest.raises(HorizonError, match=r"\[timeline\] n_step = 3.*no n-step arrays"):
        dqn.train_step(batch(reward=[1.0]))
    too_long = batch(
        reward=[1.0],
        next_n_rewards=[[1.0] * 5],
        next_n_time_diffs=[[1.0] * 5],
        next_n_not_terminal=[[1.0] * 5],
        next_n_length=[5],
        next_n_state=[[1.0]],
        next_n_possible_next_actions=[[1, 1, 1]],
    )
    with pytest.raises(HorizonError, match="windows of up to 5 steps"):
        dqn.train_step(too_long)
    told = DqnTrainer(DqnConfig(n_step=3))
    timeline = problem()
    timeline.n_step = 2
    with pytest.raises(HorizonError, match="this timeline has n_step = 2"):
        told.setup(timeline)


def test_config_rejects_sarsa_with_n_step_and_mismatched_activations():
    with pytest.raises(ValidationError, match="SARSA"):
        DqnConfig(maxq_learning=False, n_step=2)
    with pytest.raises(ValidationError, match="one activation per hidden layer"):
        DqnConfig(layers=[8, 8, 8], activations=["relu"])


def test_cql_gaps_on_a_tiny_case():
    scores = torch.tensor([[1.0, 2.0, 50.0], [0.0, 0.0, 0.0], [5.0, 1.0, 1.0]])
    possible = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    action = torch.tensor([0, 2, 0])
    logged = scores.gather(1, action.unsqueeze(1)).squeeze(1)
    first = math.log(math.exp(1) + math.exp(2)) - 1  # the impossible 50 does not count
    second = math.log(3.0) - 0.0
    # A row without recorded possible actions has nothing to push down.
    assert cql_gaps(scores, logged, possible).tolist() == pytest.approx([first, second, 0.0])


def test_logged_coverage_is_the_share_of_uniform_every_action_is_logged_at():
    """Uniform logging covers every action (1), epsilon-greedy logging with epsilon 0.1 over
    two actions a tenth (0.95 for the greedy action, 0.05 for the other), and the same over
    three actions too (0.9333 / 0.0333); a mix is the mean of its rows; a row without a
    propensity (none logged: 0 or -1) or with one possible action covers nothing."""
    two, three = torch.ones(4, 2), torch.ones(4, 3)
    assert float(logged_coverage(torch.full((4,), 0.5), two)) == pytest.approx(1.0)
    greedy = torch.tensor([0.95, 0.95, 0.05, 0.95])
    assert float(logged_coverage(greedy, two)) == pytest.approx(0.1)
    epsilon_greedy = torch.tensor([14 / 15, 1 / 30, 14 / 15, 14 / 15])
    assert float(logged_coverage(epsilon_greedy, three)) == pytest.approx(0.1)
    mix = torch.tensor([0.5, 0.5, 0.95, 0.05])
    assert float(logged_coverage(mix, two)) == pytest.approx(0.55)
    unknown = torch.tensor([0.0, -1.0, 0.5, 0.5])
    assert float(logged_coverage(unknown, two)) == pytest.approx(0.5)
    single = torch.tensor([[1.0, 0.0]] * 4)
    assert float(logged_coverage(torch.full((4,), 0.5), single)) == 0.0


def test_the_conservative_weight_falls_to_zero_as_the_logs_cover_every_action():
    """The same rows, logged uniformly (coverage 1) or by a deterministic logger (no
    propensities: coverage 0): CQL's penalty applies at ``cql_alpha`` only to the latter."""
    rows = batch(reward=[1.0, 0.0], state=[[0.0], [1.0]], action=[0, 2])
    uniform = trainer().train_step(rows)
    assert uniform["logged_coverage"] == pytest.approx(1.0) and uniform["cql_weight"] == 0.0
    deterministic = trainer().train_step({**rows, "action_probability": torch.ones(2)})
    assert deterministic["logged_coverage"] == 0.0
    assert deterministic["cql_weight"] == DqnConfig().cql_alpha
    constant = trainer(cql_weighting="constant").train_step(rows)
    assert constant["cql_weight"] == DqnConfig().cql_alpha


class KeepsUnweightedPenalty(DqnTrainer):
    """A dqn trainer that adds CQL's penalty to the loss at weight 0 too."""

    def conservatism(self, *args: object, keep_unweighted: bool = True) -> torch.Tensor | None:
        return super().conservatism(*args, keep_unweighted=True)


def test_a_penalty_of_weight_zero_left_out_of_the_loss_changes_no_bit_of_the_training():
    """Logs covering every action (weight 0): the update without the penalty's gradient
    leaves the same bytes of state and the same metrics as one adding ``0 * penalty``."""
    torch.manual_seed(0)
    states = torch.randn(64, 1)
    rows = batch(
        reward=torch.rand(64).tolist(),
        state=states.tolist(),
        next_state=(states + 0.1).tolist(),
        action=torch.randint(0, 3, (64,)).tolist(),
    )
    kept = KeepsUnweightedPenalty(DqnConfig())
    kept.setup(problem())
    skipped = trainer()
    for _ in range(5):
        assert skipped.train_step(rows) == kept.train_step(rows)
    assert skipped.train_step(rows)["cql_weight"] == 0.0
    kept.train_step(rows)
    for mine, theirs in zip(
        torch.utils._pytree.tree_leaves(skipped.state_dict()),
        torch.utils._pytree.tree_leaves(kept.state_dict()),
        strict=True,
    ):
        if isinstance(mine, torch.Tensor):
            assert torch.equal(mine, theirs) and mine.signbit().equal(theirs.signbit())
        else:
            assert mine == theirs


def test_the_policy_is_a_frozen_snapshot_sharing_the_fixed_preprocessor():
    dqn = trainer()
    policy = dqn.policy()
    inputs = (torch.tensor([[0.5]]), torch.ones(1, 1))
    before = policy(*inputs)
    dqn.train_step(batch(reward=[1.0, 0.0], state=[[0.0], [1.0]], action=[0, 2]))
    assert torch.equal(policy(*inputs), before)
    assert not torch.equal(dqn.policy()(*inputs), before)
    assert policy.preprocessor is dqn.preprocessor
    assert not policy.training and not policy.q_network.training
    assert not any(parameter.requires_grad for parameter in policy.parameters())


def test_train_step_reports_the_losses_of_the_options_in_use():
    rows = batch(reward=[1.0, 0.0], state=[[0.0], [1.0]], action=[0, 2])
    assert set(trainer(cql_alpha=0.0).train_step(rows)) == {"td_loss"}
    conservative = {"td_loss", "cql_loss", "logged_coverage", "cql_weight"}
    assert set(trainer().train_step(rows)) == conservative  # CQL is on by default
    assert set(trainer(cql_alpha=1.0, bcq_threshold=0.3).train_step(rows)) == {
        *conservative,
        "bcq_loss",
    }


def test_bcq_leaves_rarely_logged_actions_out_of_the_target_and_the_policy():
    dqn = trainer(bcq_threshold=0.5, double_q=False, gamma=0.5, learning_rate=0.05)
    # The logging policy only ever took "left" in state 1.
    logged = batch(reward=[0.0] * 64, state=[[1.0]] * 64, action=[0] * 64)
    for _ in range(100):
        dqn.train_step(logged)
    with_tables(dqn, online=[[0, 0, 0], [1, 9, 9]], target=[[0, 0, 0], [1, 9, 9]])
    assert dqn.td_target(batch(reward=[0.0])).tolist() == [0.5 * 1]
    scores = dqn.policy()(torch.tensor([[1.0]]), torch.ones(1, 1))
    assert scores[0, 0] == 1 and (scores[0, 1:] == IMPOSSIBLE).all()


# --- networks, evaluation, checkpoints --------------------------------------------------------


def test_dueling_head_gives_one_score_per_action_with_zero_mean_advantage():
    network = QNetwork(4, 3, [8, 8], ["relu", "tanh"], dueling=True)
    state = torch.randn(5, 4)
    scores = network(state)
    assert scores.shape == (5, 3)
    value = network.value(network.body(state))
    assert torch.allclose(scores.mean(dim=1, keepdim=True), value, atol=1e-6)


def test_returns_restart_at_each_episode_end():
    reward = torch.tensor([1.0, 1.0, 1.0, 2.0, 2.0])
    ends = torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0])
    returns = discounted_returns(reward, torch.full((5,), 0.5), ends)
    assert returns.tolist() == [1.75, 1.5, 1.0, 3.0, 2.0]


def test_episode_ends_without_terminal_rows_are_found_where_next_state_breaks():
    state = torch.tensor([[0.0], [1.0], [5.0], [6.0]])
    next_state = torch.tensor([[1.0], [2.0], [6.0], [7.0]])
    ones = torch.ones(4, 1)
    ends = episode_ends(torch.ones(4), state, ones, next_state, ones)
    assert ends.tolist() == [0.0, 1.0, 0.0, 1.0]


def tensors(rows: int, features: int, generator: torch.Generator, **columns) -> TimelineTensors:
    """A random discrete split of two actions (every action possible) with ``columns`` set."""
    values: dict[str, torch.Tensor] = {
        "state": torch.randn(rows, features, generator=generator),
        "next_state": torch.randn(rows, features, generator=generator),
        "reward": torch.ones(rows),
        "not_terminal": torch.ones(rows),
        "time_diff": torch.ones(rows),
        "action_probability": torch.full((rows,), 0.5),
        "action": torch.randint(0, 2, (rows,), generator=generator),
        "next_action": torch.randint(0, 2, (rows,), generator=generator),
        "possible_actions": torch.ones(rows, 2),
        "possible_next_actions": torch.ones(rows, 2),
        "episode_id": torch.zeros(rows, dtype=torch.int64),
        "step": torch.arange(rows),
    } | columns
    presence = {
        "state_presence": torch.ones(rows, features),
        "next_state_presence": torch.ones(rows, features),
    }
    return TimelineTensors(**values, **presence, feature_ids=[str(i) for i in range(features)])


def test_evaluate_compares_q_with_the_logged_returns_and_counts_actions():
    dqn = DqnTrainer(DqnConfig(gamma=0.5))
    dqn.setup(problem(actions=["a", "b"]))
    with_tables(dqn, online=[[0, 1], [2, 0], [5, 5]], target=[[0, 0], [0, 0], [0, 0]])
    data = tensors(
        3,
        1,
        torch.Generator().manual_seed(0),
        state=torch.tensor([[0.0], [1.0], [2.0]]),
        next_state=torch.tensor([[1.0], [2.0], [0.0]]),
        not_terminal=torch.tensor([1.0, 1.0, 0.0]),
        action=torch.tensor([0, 0, 1]),
        possible_actions=torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]]),
    )
    metrics = dqn.evaluate(data)
    # Returns 1.75, 1.5, 1; Q of the logged actions 0, 2, 5.
    assert metrics["mc_loss"] == pytest.approx((1.75**2 + 0.5**2 + 4**2) / 3)
    assert metrics["mean_q/a"] == pytest.approx((0 + 2 + 5) / 3)
    assert metrics["mean_q/b"] == pytest.approx((1 + 0) / 2)
    # Greedy: b, a, and a (b is impossible in the last row).
    assert metrics["model_action_share/a"] == pytest.approx(2 / 3)
    assert metrics["logged_action_share/b"] == pytest.approx(1 / 3)


def test_state_dict_round_trip_gives_identical_outputs():
    data = tensors(256, 3, torch.Generator().manual_seed(1))
    options = {"dueling": True, "bcq_threshold": 0.2, "cql_alpha": 0.5, "lr_decay": 0.5}
    first = DqnTrainer(DqnConfig(**options, lr_decay_steps=2))
    first.setup(problem(features=3, actions=["a", "b"], seed=1))
    for rows in data.minibatches(32, torch.Generator().manual_seed(0)):
        first.train_step(rows)
    second = DqnTrainer(DqnConfig(**options, lr_decay_steps=2))
    second.setup(problem(features=3, actions=["a", "b"], seed=2))
    checkpoint = io.BytesIO()
    torch.save(first.state_dict(), checkpoint)
    checkpoint.seek(0)
    second.load_state_dict(torch.load(checkpoint))
    inputs = (data.state, data.state_presence)
    assert torch.equal(first.policy()(*inputs), second.policy()(*inputs))
    assert second.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.5**4)
    # Training on from both gives the same next step: optimizer state and target came along.
    rows = next(data.minibatches(32, torch.Generator().manual_seed(5)))
    assert first.train_step(rows) == second.train_step(rows)
    assert torch.equal(first.policy()(*inputs), second.policy()(*inputs))


def test_steps_on_the_drivers_precomputed_states_learn_what_steps_on_raw_states_learn():
    """The driver hands batches carrying the state preprocessor's output, computed once for the
    split (``*_preprocessed``); the trainer takes them instead of preprocessing again, and
    learns the same as from the raw features alone (n-step windows, CQL and BCQ included)."""
    generator = torch.Generator().manual_seed(3)
    rows, features = 256, 3
    windows = {
        "next_n_rewards": torch.rand(rows, 2, generator=generator),
        "next_n_time_diffs": torch.ones(rows, 2),
        "next_n_not_terminal": (torch.rand(rows, 2, generator=generator) > 0.1).float(),
        "next_n_length": torch.randint(1, 3, (rows,), generator=generator),
        "next_n_state": torch.randn(rows, features, generator=generator) * 4 + 1,
        "next_n_state_presence": (torch.rand(rows, features, generator=generator) > 0.2).float(),
        "next_n_possible_next_actions": torch.ones(rows, 2),
    }
    data = tensors(rows, features, generator, **windows)
    data.state_presence = (torch.rand(rows, features, generator=generator) > 0.2).float()
    ids = [str(index) for index in range(features)]
    parameters = {
        id_: NormalizationParameters(feature_type="continuous", mean=1.0, stddev=4.0) for id_ in ids
    }
    normalized = replace(
        problem(features, ["a", "b"]), state_preprocessor=build_preprocessor(ids, parameters)
    )
    trained = []
    for split in (data, data.with_preprocessed(normalized.state_preprocessor)):
        dqn = DqnTrainer(DqnConfig(n_step=2, cql_alpha=0.5, bcq_threshold=0.3))
        dqn.setup(normalized)
        for batch in split.minibatches(32, torch.Generator().manual_seed(0)):
            dqn.train_step(batch)
        trained.append(dqn)
    prepared = next(split.minibatches(8, torch.Generator().manual_seed(1)))
    assert trained[1].state_input(prepared, "next_n_state") is prepared["next_n_state_preprocessed"]
    inputs = (data.state, data.state_presence)
    torch.testing.assert_close(trained[0].policy()(*inputs), trained[1].policy()(*inputs))


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_the_optimizers_compute_torch_optims_foreach_numbers_to_the_bit(kind):
    """``ForeachAdam`` and ``ForeachSgd`` (which spare a run the ``torch._dynamo`` import of
    ``torch.optim``) give ``torch.optim``'s foreach results exactly, with L2 weight decay and a
    learning rate changed mid-way; their state dicts load into each other both ways."""
    ours_kind = {"adam": ForeachAdam, "sgd": ForeachSgd}[kind]
    torch_kind = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}[kind]

    def network() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))

    def steps(pairs, count: int) -> None:
        inputs = torch.randn(64, 4, generator=torch.Generator().manual_seed(count))
        for step in range(count):
            for module, optimizer in pairs:
                optimizer.zero_grad()
                (module(inputs * (1 + step % 3)) ** 2).mean().backward()
                optimizer.step()

    ours_network, torch_network = network(), network()
    ours = ours_kind(ours_network.parameters(), lr=0.01, weight_decay=0.01)
    theirs = torch_kind(torch_network.parameters(), lr=0.01, weight_decay=0.01, foreach=True)
    steps([(ours_network, ours), (torch_network, theirs)], 30)
    for optimizer in (ours, theirs):
        optimizer.param_groups[0]["lr"] = 0.003
    steps([(ours_network, ours), (torch_network, theirs)], 30)
    assert all(map(torch.equal, ours_network.parameters(), torch_network.parameters()))

    # A checkpoint of either continues in the other: same state, same next steps.
    from_torch, from_ours = network(), network()
    from_torch.load_state_dict(torch_network.state_dict())
    from_ours.load_state_dict(ours_network.state_dict())
    loaded_ours = ours_kind(from_torch.parameters())
    loaded_ours.load_state_dict(theirs.state_dict())
    loaded_torch = torch_kind(from_ours.parameters(), lr=1.0, foreach=True)
    loaded_torch.load_state_dict(ours.state_dict())
    steps([(torch_network, theirs), (from_torch, loaded_ours), (from_ours, loaded_torch)], 10)
    for trained in (from_torch, from_ours):
        assert all(map(torch.equal, trained.parameters(), torch_network.parameters()))


def test_training_a_dqn_never_imports_torch_dynamo():
    """Constructing a ``torch.optim`` optimizer imports ``torch._dynamo`` (1-2 s); the dqn
    trainers' own optimizers do not, through setup, updates, a checkpoint and a warm start.
    In a fresh process: this one may have imported it already."""
    script = """
import sys
import torch
from horizon_engine.normalization import NormalizationParameters
from horizon_engine.preprocessor import build_preprocessor
from horizon_engine.schema import ActionType
from horizon_engine.training import TrainingProblem
from horizon_plugins_dqn import DqnConfig, DqnTrainer

ids = ["0", "1"]
parameters = {i: NormalizationParameters(feature_type="do_not_preprocess") for i in ids}
problem = TrainingProblem(ActionType.DISCRETE, ["a", "b"], build_preprocessor(ids, parameters),
                          2, None, 0, torch.device("cpu"), 0)
batch = {"state": torch.randn(8, 2), "state_presence": torch.ones(8, 2),
         "next_state": torch.randn(8, 2), "next_state_presence": torch.ones(8, 2),
         "reward": torch.ones(8), "not_terminal": torch.ones(8), "time_diff": torch.ones(8),
         "action": torch.zeros(8, dtype=torch.long),
         "next_action": torch.zeros(8, dtype=torch.long),
         "possible_actions": torch.ones(8, 2), "possible_next_actions": torch.ones(8, 2)}
for optimizer in ("adam", "sgd"):
    dqn = DqnTrainer(DqnConfig(optimizer=optimizer, bcq_threshold=0.3, n_step=1))
    dqn.setup(problem)
    dqn.train_step(batch)
    dqn.load_state_dict(dqn.state_dict())
    dqn.train_step(batch)
print("torch._dynamo" in sys.modules)
"""
    found = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert found.stdout.split() == ["False"]


def test_a_checkpoint_of_another_architecture_is_a_clear_error():
    small = DqnTrainer(DqnConfig(layers=[4], activations=["relu"]))
    small.setup(problem())
    with pytest.raises(HorizonError, match="does not fit this"):
        trainer().load_state_dict(small.state_dict())


def test_dqn_refuses_non_discrete_actions():
    continuous = problem()
    continuous.action_type = ActionType.CONTINUOUS
    with pytest.raises(HorizonError, match="discrete actions"):
        DqnTrainer(DqnConfig()).setup(continuous)


# --- policies and export ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["greedy", "epsilon_greedy", "softmax"])
def test_policies_of_a_bcq_model_sum_to_one_and_leave_filtered_actions_out(kind):
    """The core's policies (what export and CPE use) on the scores of a BCQ-trained DQN."""
    dqn = trainer(bcq_threshold=0.5, learning_rate=0.05)
    # The logging policy took "left" in state 0 and "right" in state 1, never "stay".
    logged = batch(reward=[0.0] * 64, state=[[0.0], [1.0]] * 32, action=[0, 2] * 32)
    for _ in range(100):
        dqn.train_step(logged)
    scores = dqn.policy()(torch.tensor([[0.0], [1.0]]), torch.ones(2, 1))
    possible = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    probabilities = action_probabilities(scores, possible, kind, epsilon=0.3, temperature=0.5)
    assert torch.allclose(probabilities.sum(dim=1), torch.ones(2))
    assert probabilities[1, 0] == 0  # impossible
    if kind != "epsilon_greedy":  # exploration may still pick a filtered (possible) action
        assert probabilities.tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]


def test_every_option_trains_and_exports_through_the_pipeline(tmp_path: Path):
    """Dueling, BCQ, CQL and n-step in a real run, then the onnx exporter, which checks the
    model in onnxruntime against PyTorch (the BCQ filter included) and fails on a difference."""
    from horizon_engine.pipeline import Engine

    trainer_options = {"dueling": True, "bcq_threshold": 0.3, "cql_alpha": 0.5, "n_step": 2}
    config = {
        "pipeline": {"output_dir": str(tmp_path / "run"), "seed": 0},
        "source": {"kind": "gym", "env": "CartPole-v1", "policy": "random", "episodes": 30},
        "timeline": {"actions": ["0", "1"], "reward": {"reward": 1.0}, "n_step": 2},
        "normalization": {},
        "trainer": {"kind": "dqn", "epochs": 2, "minibatch_size": 64, **trainer_options},
        "export": {"kind": "onnx", "policy": "softmax", "temperature": 0.5},
    }
    manifest = Engine(show_progress=False).run(config)
    last_epoch = manifest["stages"]["train"]["details"]["last_epoch"]
    assert {"Training/td_loss", "Training/cql_loss", "Training/bcq_loss"} <= set(last_epoch)
    assert {"Evaluation/mc_loss", "Evaluation/mean_q/0", "Evaluation/mean_q/1"} <= set(last_epoch)
    assert manifest["stages"]["export"]["details"]["max_abs_difference"] < 1e-5
    assert (tmp_path / "run" / "model.onnx").is_file()

    # TensorBoard holds the named scalars for both epochs.
    written = scalars(tmp_path / "run" / "tensorboard")
    named = ["Training/td_loss", "Evaluation/mc_loss", "Evaluation/mean_q/0"]
    named += [f"Evaluation/{who}_action_share/1" for who in ("model", "logged")]
    for name in named:
        assert [step for step, _ in written[name]] == [1, 2]
        assert written[name][-1][1] == pytest.approx(last_epoch[name])


def test_a_warm_started_run_starts_at_the_earlier_runs_loss(tmp_path: Path):
    """The paper's daily retraining: yesterday's run trained 8 epochs (TD-loss 0.29 in its first
    epoch, 0.022 in its last, here); today's, warm-started from it, is at 0.025 in its first
    epoch, while the same run from scratch repeats yesterday's first epoch exactly."""
    from horizon_engine.pipeline import Engine

    def train(folder: str, epochs: int, warm_start_from: Path | None = None) -> dict:
        trainer = {"kind": "dqn", "epochs": epochs, "minibatch_size": 128}
        if warm_start_from is not None:
            trainer["warm_start_from"] = str(warm_start_from)
        config = {
            "pipeline": {"output_dir": str(tmp_path / folder), "seed": 0},
            "source": {"kind": "gym", "env": "CartPole-v1", "policy": "random", "episodes": 100},
            "timeline": {"actions": ["0", "1"], "reward": {"reward": 1.0}},
            "normalization": {"quantiles": False},
            "trainer": trainer,
        }
        details = Engine(show_progress=False).run(config)["stages"]["train"]["details"]
        return {key: details[key]["Training/td_loss"] for key in ("first_epoch", "last_epoch")}

    yesterday = train("yesterday", 8)
    today = train("today", 1, tmp_path / "yesterday")
    scratch = train("scratch", 1)
    assert scratch["first_epoch"] == yesterday["first_epoch"]
    assert today["first_epoch"] < 2 * yesterday["last_epoch"]
    assert today["first_epoch"] < scratch["first_epoch"] / 5


# --- learning ----------------------------------------------------------------------------------


def test_constant_reward_learns_q_of_twenty():
    """Horizon's test: reward 1 every step, never terminal, gamma 0.95: Q = 1 / (1 - 0.95)."""
    generator = torch.Generator().manual_seed(0)
    data = tensors(2048, 4, generator)
    dqn = DqnTrainer(
        DqnConfig(
            gamma=0.95,
            layers=[32, 32],
            learning_rate=0.01,
            target_update_rate=0.2,
            cql_alpha=0.0,  # Horizon's test is of plain Q-learning
        )
    )
    dqn.setup(problem(features=4, actions=["a", "b"]))
    for _ in range(30):
        for rows in data.minibatches(128, generator):
            dqn.train_step(rows)
    metrics = dqn.evaluate(data)
    assert 19 < metrics["mean_q/a"] < 21
    assert 19 < metrics["mean_q/b"] < 21


CARTPOLE_SEEDS = [int(seed) for seed in os.environ.get("HORIZON_DQN_SEEDS", "3").split(",")]
"""The seeds of the offline CartPole test: a representative one by default (see its docstring);
``HORIZON_DQN_SEEDS=0,1,2,3,4,5,6,7,8,9 pytest -m slow -s -k cartpole`` checks them all."""


@pytest.mark.slow
@pytest.mark.parametrize("seed", CARTPOLE_SEEDS)
def test_offline_cartpole_from_random_transitions(tmp_path: Path, seed: int):
    """About 30,000 transitions of a uniformly random policy, through the whole pipeline; the
    exported model, played by onnxruntime, balances the pole for 150+ steps on average.

    Seed 3, the default, scores 385.0 over the 50 episodes of seeds 1000-1049; over 20
    episodes (before issue 22) seeds 0-9 scored 358, 400, 323, 376, 454, 254, 380, 417, 478
    and 377, seed 3 their median. Continuous normalization (no quantiles) matters: random
    play stays near the middle of the track, and a quantile transform maps every position
    past the data's range to one value. CQL and 3-step returns each add to the margin: the
    worst seed fell to 177 without CQL, to 149 without n-step (of ten seeds), and to 171 with
    quantiles (of five).
    """
    from horizon_engine.pipeline import Engine

    run = tmp_path / "run"
    trainer_options = {
        "n_step": 3,
        "cql_alpha": 1.0,
        "cql_weighting": "constant",
        "minibatch_size": 256,
        "epochs": 20,
    }
    config = {
        "pipeline": {"output_dir": str(run), "seed": seed},
        "source": {"kind": "gym", "env": "CartPole-v1", "policy": "random", "episodes": 1370},
        "timeline": {"actions": ["0", "1"], "reward": {"reward": 1.0}, "n_step": 3},
        "normalization": {"quantiles": False},
        "trainer": {"kind": "dqn", **trainer_options},
        "export": {"kind": "onnx"},
    }
    manifest = Engine(show_progress=False).run(config)
    assert 28_000 < manifest["stages"]["source"]["rows_out"] < 33_000

    score = onnx_greedy_return(run / "model.onnx")
    print(f"offline CartPole seed {seed}: mean return {score:.1f} over 50 episodes")
    assert score >= 150
