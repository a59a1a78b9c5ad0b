"""The ``parametric_dqn`` trainer: candidate tensors, the network, targets on hand-made cases,
export with candidate inputs, and learning CartPole from one-hot action features.

Targets are checked with the networks replaced by tables: Q(s, a) is entry (s, a) of a table,
s the state's single feature and a the index of the candidate's one-hot action features.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from test_dqn_reference import onnx_greedy_return

from horizon_engine.builtin.gym_source import GymSourceConfig, collect_rows
from horizon_engine.dataset import candidate_features, load_timeline
from horizon_engine.errors import HorizonError
from horizon_engine.normalization import NormalizationParameters, read_normalization
from horizon_engine.pipeline import Engine
from horizon_engine.preprocessor import build_preprocessor
from horizon_engine.schema import ActionType
from horizon_engine.training import TrainingProblem
from horizon_plugins_dqn import ParametricDqnConfig, ParametricDqnTrainer
from horizon_plugins_dqn.networks import ParametricQNetwork

ACTION_IDS = ["10", "11", "12"]
"""One-hot action features of three actions."""

REFERENCE = Path(
    os.environ.get("HORIZON_REFERENCE_DATA")
    or Path(__file__).resolve().parents[2] / "shared" / "reference-data"
)
PARAMETRIC_CARTPOLE = REFERENCE / "reagent" / "parametric_action" / "cartpole_training.json.bz2"


def passthrough(ids: list[str]) -> torch.nn.Module:
    parameters = {id_: NormalizationParameters(feature_type="do_not_preprocess") for id_ in ids}
    return build_preprocessor(ids, parameters)


def problem(seed: int = 0) -> TrainingProblem:
    """One state feature and three one-hot action features, all passed through unchanged."""
    return TrainingProblem(
        action_type=ActionType.PARAMETRIC,
        actions=[],
        state_preprocessor=passthrough(["0"]),
        state_width=1,
        action_preprocessor=passthrough(ACTION_IDS),
        action_width=len(ACTION_IDS),
        device=torch.device("cpu"),
        seed=seed,
    )


def trainer(**options: object) -> ParametricDqnTrainer:
    built = ParametricDqnTrainer(ParametricDqnConfig(**options))
    built.setup(problem())
    return built


class TableQ(torch.nn.Module):
    """Q(s, a) = table[s][a]: s is the state's feature, a the candidate's one-hot index."""

    def __init__(self, table: list[list[float]]) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(table, dtype=torch.float))

    def forward(self, state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        rows = state[:, 0].long().unsqueeze(1).expand(-1, actions.shape[1])
        return self.table[rows, actions.argmax(dim=2)]


def one_hot(indices: list[int | None]) -> list[list[float]]:
    """Action features of a list of action indices (None: no action, all features absent)."""
    return [[float(i == index) for i in range(3)] for index in indices]


def candidates(sets: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded one-hot candidates ``[rows, K, 3]`` and their mask ``[rows, K]``."""
    width = max(max(len(chosen) for chosen in sets), 1)
    values = torch.zeros(len(sets), width, 3)
    mask = torch.zeros(len(sets), width)
    for row, chosen in enumerate(sets):
        for slot, index in enumerate(chosen):
            values[row, slot, index] = 1.0
            mask[row, slot] = 1.0
    return values, mask


def batch(
    reward: list[float],
    next_candidates: list[list[int]],
    action: list[int] | None = None,
    next_action: list[int | None] | None = None,
    not_terminal: list[float] | None = None,
) -> dict[str, torch.Tensor]:
    """Rows in state 0 moving to state 1, with the given next candidates."""
    rows = len(reward)
    action_values = torch.tensor(one_hot(action or [0] * rows))
    next_values = torch.tensor(one_hot(next_action or [0] * rows))
    next_features, next_mask = candidates(next_candidates)
    features, mask = candidates([[0, 1, 2]] * rows)
    return {
        "state": torch.zeros(rows, 1),
        "state_presence": torch.ones(rows, 1),
        "next_state": torch.ones(rows, 1),
        "next_state_presence": torch.ones(rows, 1),
        "reward": torch.tensor(reward),
        "not_terminal": torch.tensor(not_terminal or [1.0] * rows),
        "time_diff": torch.ones(rows),
        "action": action_values,
        "action_presence": action_values.clone(),
        "next_action": next_values,
        "next_action_presence": next_values.clone(),
        "possible_actions": mask,
        "possible_action_features": features,
        "possible_action_presence": features.clone(),
        "possible_next_actions": next_mask,
        "possible_next_action_features": next_features,
        "possible_next_action_presence": next_features.clone(),
    }


# --- candidate tensors ------------------------------------------------------------------------


def test_candidate_lists_become_padded_tensors_with_a_mask():
    maps = pa.map_(pa.string(), pa.float64())
    column = pa.array(
        [[{"a": 1.0}, {"b": 2.0, "a": 3.0}], [], None, [{"c": 5.0}]], type=pa.list_(maps)
    )
    values, presence, mask = candidate_features(column, ["a", "b"])
    assert values.shape == presence.shape == (4, 2, 2)
    assert mask.tolist() == [[1, 1], [0, 0], [0, 0], [1, 0]]
    assert values[0].tolist() == [[1.0, 0.0], [3.0, 2.0]]
    assert presence[0].tolist() == [[1.0, 0.0], [1.0, 1.0]]
    # "c" is not a model feature: the candidate is there, without features.
    assert values[3].tolist() == [[0.0, 0.0], [0.0, 0.0]] and mask[3, 0] == 1


def test_a_column_of_empty_lists_still_has_one_masked_slot():
    column = pa.array([[], []], type=pa.list_(pa.map_(pa.string(), pa.float64())))
    values, _, mask = candidate_features(column, ["a"])
    assert values.shape == (2, 1, 1) and mask.tolist() == [[0.0], [0.0]]


# --- network ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dueling", [False, True])
def test_a_candidates_score_does_not_depend_on_the_others_offered(dueling: bool):
    network = ParametricQNetwork(4, 3, [16, 8], ["relu", "relu"], dueling)
    state = torch.randn(5, 4)
    offered, _ = candidates([[0, 1, 2]] * 5)
    alone, _ = candidates([[1]] * 5)
    scores = network(state, offered)
    assert scores.shape == (5, 3)
    assert torch.allclose(network(state, alone)[:, 0], scores[:, 1])


def test_dueling_value_and_advantage_heads_add_up():
    network = ParametricQNetwork(4, 3, [8], ["relu"], dueling=True)
    state, actions = torch.randn(2, 4), torch.randn(2, 3, 3)
    hidden = network.body(state)  # no shared layers with one hidden layer: the state itself
    paired = torch.cat([hidden.unsqueeze(1).expand(-1, 3, -1), actions], dim=2)
    expected = network.value(hidden) + network.advantage(paired).squeeze(2)
    assert torch.allclose(network(state, actions), expected)


# --- targets ----------------------------------------------------------------------------------


def test_double_q_target_over_the_rows_own_candidates():
    """Online prefers candidate 2, target values it at 7: the target is r + 0.9 * 7. Where 2
    is not offered, the online choice among {0, 1} is 1, valued 5 by the target."""
    dqn = trainer(gamma=0.9, double_q=True)
    dqn.q_network = TableQ([[0, 0, 0], [1, 3, 9]])
    dqn.target_network = TableQ([[0, 0, 0], [6, 5, 7]])
    target = dqn.td_target(batch([1.0, 1.0], [[0, 1, 2], [0, 1]]))
    assert target.tolist() == pytest.approx([1 + 0.9 * 7, 1 + 0.9 * 5])


def test_plain_max_terminal_rows_and_unrecorded_candidates():
    """Without double Q the target network's own max; a terminal row bootstraps nothing; a
    non-terminal row with no recorded candidates values its logged next action (index 0: 6)."""
    dqn = trainer(gamma=0.5, double_q=False)
    dqn.q_network = TableQ([[0, 0, 0], [1, 3, 9]])
    dqn.target_network = TableQ([[0, 0, 0], [6, 5, 7]])
    rows = batch([1.0, 2.0, 3.0], [[0, 1], [0, 1, 2], []], not_terminal=[1.0, 0.0, 1.0])
    assert dqn.td_target(rows).tolist() == pytest.approx([1 + 0.5 * 6, 2.0, 3 + 0.5 * 6])


def test_sarsa_values_the_logged_next_action():
    dqn = trainer(gamma=0.5, maxq_learning=False)
    dqn.target_network = TableQ([[0, 0, 0], [6, 5, 7]])
    rows = batch([1.0, 1.0], [[0, 1, 2]] * 2, next_action=[2, 1])
    assert dqn.td_target(rows).tolist() == pytest.approx([1 + 0.5 * 7, 1 + 0.5 * 5])


def test_n_step_target_bootstraps_from_the_window_end_or_falls_back_to_one_step():
    """Two-step windows: r0 + g r1 + g^2 max Q(end). The second row's window ends where no
    candidates were recorded, so it takes its one-step target r0 + g max Q(next)."""
    dqn = trainer(gamma=0.5, n_step=2, double_q=False)
    dqn.target_network = TableQ([[0, 0, 0], [6, 5, 7], [10, 20, 30]])
    rows = batch([1.0, 1.0], [[0, 1, 2]] * 2)
    end_features, end_mask = candidates([[0, 1], []])
    rows |= {
        "next_n_rewards": torch.tensor([[1.0, 2.0], [1.0, 4.0]]),
        "next_n_time_diffs": torch.ones(2, 2),
        "next_n_not_terminal": torch.ones(2, 2),
        "next_n_length": torch.tensor([2, 2]),
        "next_n_state": torch.full((2, 1), 2.0),
        "next_n_state_presence": torch.ones(2, 1),
        "next_n_possible_next_actions": end_mask,
        "next_n_possible_next_action_features": end_features,
        "next_n_possible_next_action_presence": end_features.clone(),
    }
    assert dqn.td_target(rows).tolist() == pytest.approx([1 + 0.5 * 2 + 0.25 * 20, 1 + 0.5 * 7])


def test_train_step_reports_td_and_cql_losses_and_changes_the_network():
    dqn = trainer(cql_alpha=1.0, layers=[8], activations=["relu"])
    before = [parameter.clone() for parameter in dqn.q_network.parameters()]
    metrics = dqn.train_step(batch([1.0, 0.0], [[0, 1], [2]], action=[1, 2]))
    assert set(metrics) == {"td_loss", "cql_loss", "logged_coverage", "cql_weight"}
    assert metrics["cql_loss"] > 0
    assert any(
        not torch.equal(old, new)
        for old, new in zip(before, dqn.q_network.parameters(), strict=True)
    )


def test_parametric_dqn_refuses_discrete_actions_and_names_the_trainer_to_use():
    discrete = problem()
    discrete.action_type = ActionType.DISCRETE
    with pytest.raises(HorizonError, match="use kind = 'dqn'"):
        ParametricDqnTrainer(ParametricDqnConfig()).setup(discrete)


def test_state_dict_round_trip_gives_identical_scores():
    first, second = trainer(dueling=True), ParametricDqnTrainer(ParametricDqnConfig(dueling=True))
    second.setup(problem(seed=1))
    second.load_state_dict(first.state_dict())
    state, (actions, _) = torch.randn(4, 1), candidates([[0, 2]] * 4)
    assert torch.equal(first.q_network(state, actions), second.q_network(state, actions))


def test_constant_reward_learns_q_of_twenty():
    """Reward 1 every step, never terminal, gamma 0.95: Q = 1 / (1 - 0.95) for every action."""
    generator = torch.Generator().manual_seed(0)
    dqn = trainer(
        gamma=0.95,
        layers=[32, 32],
        learning_rate=0.01,
        target_update_rate=0.2,
        cql_alpha=0.0,  # Horizon's test is of plain Q-learning; CQL pulls Q below 20
    )
    for _ in range(500):
        state = torch.randn(128, 1, generator=generator)
        rows = batch([1.0] * 128, [[0, 1, 2]] * 128, action=[0, 1, 2, 0] * 32)
        rows["state"], rows["next_state"] = state, state.roll(1, dims=0)
        dqn.train_step(rows)
    rows = batch([1.0] * 64, [[0, 1, 2]] * 64)
    rows["state"] = torch.randn(64, 1, generator=generator)
    with torch.no_grad():
        scores = dqn.q_network(rows["state"], rows["possible_action_features"])
    assert 19 < float(scores.mean()) < 21
    assert float(scores.min()) > 18 and float(scores.max()) < 22


# --- pipeline and export ----------------------------------------------------------------------


def gym_parametric_config(run: Path, episodes: int, seed: int, **trainer: object) -> dict:
    n_step = int(trainer.get("n_step", 1))
    return {
        "pipeline": {"output_dir": str(run), "seed": seed},
        "source": {
            "kind": "gym",
            "env": "CartPole-v1",
            "policy": "random",
            "episodes": episodes,
            "parametric_actions": True,
        },
        "timeline": {"reward": {"reward": 1.0}, "n_step": n_step},
        "normalization": {"quantiles": False},
        "trainer": {"kind": "parametric_dqn", "minibatch_size": 256, **trainer},
        "export": {"kind": "onnx"},
    }


def test_timeline_candidates_load_with_terminal_rows_masked(tmp_path: Path):
    run = tmp_path / "run"
    config = gym_parametric_config(run, 5, 0, epochs=1)
    config["pipeline"]["stages"] = ["source", "timeline", "normalization"]
    Engine(show_progress=False).run(config)
    action_ids = list(read_normalization(run / "normalization.json")["action_features"])
    assert action_ids == ["4", "5"]
    data = load_timeline(run / "timeline" / "train", ActionType.PARAMETRIC, ["0"], action_ids)
    assert data.possible_action_features.shape == (len(data), 2, 2)
    assert data.possible_actions.sum(dim=1).eq(2).all()
    terminal = data.not_terminal == 0
    assert terminal.any() and data.possible_next_actions[terminal].eq(0).all()
    assert data.possible_next_actions[~terminal].sum(dim=1).eq(2).all()
    # One-hot candidates: slot i is action i, as the gym source lists them.
    assert data.possible_action_features[0].tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_every_option_trains_and_the_onnx_model_scores_any_number_of_candidates(tmp_path: Path):
    import onnxruntime

    run = tmp_path / "run"
    options = {"dueling": True, "cql_alpha": 0.5, "n_step": 2, "epochs": 2}
    manifest = Engine(show_progress=False).run(gym_parametric_config(run, 20, 0, **options))
    last_epoch = manifest["stages"]["train"]["details"]["last_epoch"]
    assert {"Training/td_loss", "Training/cql_loss", "Evaluation/mc_loss"} <= set(last_epoch)
    shares = [last_epoch[f"Evaluation/logged_action_feature/{id_}"] for id_ in ("4", "5")]
    assert sum(shares) == pytest.approx(1.0)  # one-hot: the logged action distribution
    assert manifest["stages"]["export"]["details"]["max_abs_difference"] < 1e-5

    session = onnxruntime.InferenceSession(str(run / "model.onnx"))
    metadata = session.get_modelmeta().custom_metadata_map
    assert json.loads(metadata["action_feature_ids"]) == ["4", "5"]
    features = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    offered = np.array([[[1, 0], [0, 1], [1, 0]]] * 3, dtype=np.float32)
    mask = np.array([[1, 1, 1], [1, 1, 0], [0, 1, 0]], dtype=np.float32)
    inputs = {
        "features": features,
        "presence": np.ones_like(features),
        "candidates": offered,
        "candidate_presence": offered,
        "candidate_mask": mask,
    }
    scores, probabilities, action = session.run(None, inputs)
    assert scores.shape == probabilities.shape == (3, 3)
    assert np.allclose(scores[:, 0], scores[:, 2])  # the same candidate twice
    assert probabilities[2].tolist() == [0.0, 1.0, 0.0] and action[2] == 1
    assert probabilities[1, 2] == 0.0

    # The exported model drives the gym source's greedy policy, offered one-hot candidates.
    source = GymSourceConfig(
        episodes=1,
        policy="epsilon_greedy",
        epsilon=0.0,
        model=str(run / "model.onnx"),
        parametric_actions=True,
    )
    rows = [row for _, row in collect_rows(source, seed=0)]
    assert {json.dumps(row["action"]) for row in rows} <= {'{"4": 1.0}', '{"5": 1.0}'}
    assert all(row["possible_actions"] == [{"4": 1.0}, {"5": 1.0}] for row in rows)
    assert all(row["action_probability"] == 1.0 for row in rows)


def test_parametric_actions_need_a_discrete_action_space():
    config = GymSourceConfig(env="Pendulum-v1", parametric_actions=True)
    with pytest.raises(HorizonError, match="needs a Discrete action space"):
        next(collect_rows(config, seed=0))


def test_dqn_on_parametric_rows_is_a_clear_error(tmp_path: Path):
    config = gym_parametric_config(tmp_path / "run", 3, 0, epochs=1)
    config["trainer"]["kind"] = "dqn"
    with pytest.raises(HorizonError, match="trains on discrete actions"):
        Engine(show_progress=False).run(config)


# --- learning ---------------------------------------------------------------------------------


PARAMETRIC_SEEDS = [
    int(seed) for seed in os.environ.get("HORIZON_PARAMETRIC_SEEDS", "4").split(",")
]
"""A representative seed by default (see the test's docstring); ``HORIZON_PARAMETRIC_SEEDS=0,1,
2,3,4,5,6,7,8,9 pytest -m slow -s -k one_hot`` checks them all."""


@pytest.mark.slow
@pytest.mark.parametrize("seed", PARAMETRIC_SEEDS)
def test_offline_cartpole_with_one_hot_action_features(tmp_path: Path, seed: int):
    """About 30,000 random transitions logged with one-hot action features ("4", "5"), the
    offline recipe of the ``dqn`` test (3-step returns, CQL 1.0, 20 epochs of batch 256); the
    exported model, offered both actions as candidates, balances the pole for 150+ steps.

    Seed 4, the default, scores 365.2 over the 50 episodes of seeds 1000-1049. Over 20
    episodes (before issue 22) seeds 0-9 scored 435, 340, 291, 176, 375, 417, 404, 437, 439
    and 352 (the discrete ``dqn`` on the same recipe: 254-478), seed 4 next to their median.
    """
    run = tmp_path / "run"
    options = {"n_step": 3, "cql_alpha": 1.0, "cql_weighting": "constant", "epochs": 20}
    Engine(show_progress=False).run(gym_parametric_config(run, 1370, seed, **options))
    score = onnx_greedy_return(run / "model.onnx")
    print(f"parametric offline CartPole seed {seed}: mean return {score:.1f}")
    assert score >= 150


@pytest.fixture
def one_torch_thread():
    """Training on one thread, whatever the machine's cores: what torch sums in parallel, and
    how it splits a sum between threads, then does not depend on the number of cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


PINNED_PARAMETRIC_DQN = {
    "device": "cpu",
    "epochs": 300,
    "minibatch_size": 1024,
    "gamma": 0.99,
    "double_q": True,
    "dueling": False,
    "n_step": 1,
    "use_time_diff": False,
    "loss": "huber",
    "target_update_rate": 0.01,
    "maxq_learning": True,
    "layers": [128, 64],
    "activations": ["relu", "relu"],
    "optimizer": "adam",
    "learning_rate": 0.001,
    "lr_decay": 1.0,
    "lr_decay_steps": 1000,
    "l2": 0.0,
    "cql_alpha": 1.0,
    "cql_weighting": "constant",
}
"""Every option of the reference test's trainer, so that a change of defaults does not change
what it measures."""


@pytest.mark.slow
def test_parametric_dqn_on_horizons_parametric_cartpole_data(tmp_path: Path, one_torch_thread):
    """Horizon's own parametric CartPole rows (3,925 post-timeline rows, one-hot actions "4"
    and "5"): CQL 1.0, 300 epochs of batch 1024, every option pinned. The exported model, run by
    onnxruntime, is held to the discrete test's 100 (the issue sets no bar for this data).

    Why it failed in a fresh clone but passed in CI: the last of the 829 eval rows the export
    is checked on (row 828, the last of episode 27) recorded no possible actions, so both of its
    candidate slots are padding, the same features, and score the same up to float rounding.
    Which of the two wins was decided by rounding: PyTorch's CPU kernels are chosen for the
    machine's instruction set, and with AVX2 kernels (``ATEN_CPU_CAPABILITY=avx2``) the trained
    network scores the two slots one float32 step apart (2.5375259 vs 2.5375261), so PyTorch
    chose slot 1 where onnxruntime, scoring them equal, chose 0, and the export failed
    ("'probabilities' differs from PyTorch's by 1 at (828, 0)") on every run on such a machine;
    with AVX-512 kernels, as on the machine these figures come from, the two scores were equal
    and it passed. Nothing
    else varies between runs on one machine: two processes, one thread or two, alone or after
    other tests train the same weights to the bit. The export check now counts such a row as a
    tie rather than a difference; training on one thread, on the CPU (``device = "auto"`` took
    a GPU where there was one) and with every option pinned keeps the rest of the machine out.
    The greedy return of seed 4 over the 50 episodes of seeds 1000-1049 is 381.3 here; over
    20 episodes it was 449.9 with AVX-512 kernels and 448.1 with AVX2 (seeds 0-4 scored 436,
    334, 357, 440 and 422 when the test was written): training is reproducible on a machine,
    not between instruction sets, and the bar of 100 leaves room for that.
    """
    if not PARAMETRIC_CARTPOLE.is_file():
        pytest.skip(f"reference data not found: looked for {PARAMETRIC_CARTPOLE}")
    config = {
        "pipeline": {"output_dir": str(tmp_path), "seed": 4},
        "source": {"kind": "jsonl", "path": str(PARAMETRIC_CARTPOLE)},
        "timeline": {"eval_fraction": 0.1},
        "normalization": {
            "num_samples": 100_000,
            "min_samples": 20,
            "max_enum_values": 10,
            "quantiles": False,
            "max_feature_value": 6.0,
            "stddev_floor": 1e-6,
        },
        "trainer": {"kind": "parametric_dqn", **PINNED_PARAMETRIC_DQN},
        "export": {"kind": "onnx", "policy": "greedy"},
    }
    manifest = Engine(show_progress=False).run(config)
    export = manifest["stages"]["export"]["details"]
    assert export["verified_rows"] == 829
    assert export["tied_rows"] >= 1  # row 828's two padding slots, at least
    assert onnx_greedy_return(tmp_path / "model.onnx") >= 100
