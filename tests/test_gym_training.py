"""``horizon gym train``: the replay buffer, the epsilon schedule, gym.toml validation, the
-f rows through the batch pipeline, the -r history, ``horizon export`` of a gym run, and
online CartPole learning."""

from __future__ import annotations

import csv
import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from test_dqn_reference import onnx_greedy_return

from horizon_engine.batch_schema import check_batch
from horizon_engine.builtin.gym.config import GymSection, epsilon_at, load_gym_spec
from horizon_engine.builtin.gym.replay_buffer import ReplayBuffer, one_hot_actions
from horizon_engine.builtin.gym.results import REWARD_HISTORY_COLUMNS
from horizon_engine.builtin.gym.runner import train_gym
from horizon_engine.builtin.gym_source import GymSourceConfig, collect_rows
from horizon_engine.cli import main
from horizon_engine.dataset import load_timeline
from horizon_engine.errors import ConfigError, HorizonError, PluginError
from horizon_engine.normalization import NormalizationParameters
from horizon_engine.pipeline import Engine
from horizon_engine.plugins import PluginHost
from horizon_engine.preprocessor import build_preprocessor
from horizon_engine.schema import ActionType
from horizon_engine.training import TrainingProblem
from horizon_plugins_dqn import (
    DqnConfig,
    DqnTrainer,
    ParametricDqnConfig,
    ParametricDqnTrainer,
)

# --- a trainer that records what it is given, to see the runner's batches -------------------

RECORDER_PLUGIN = '''
import torch

from horizon_engine import hookimpl
from horizon_engine.training import TrainerBase, TrainerConfig

BATCHES = []
EPOCHS = []
THREADS = []


class Fixed(torch.nn.Module):
    """Scores action 0 highest whatever the state: the greedy action is always 0."""

    def __init__(self, actions):
        super().__init__()
        self.register_buffer("scores", torch.tensor([[1.0] + [0.0] * (actions - 1)]))

    def forward(self, values, presence):
        return self.scores.expand(values.shape[0], -1)


class Recorder(TrainerBase):
    """Keeps every batch; its policy always prefers action 0."""

    name = "recorder"
    Config = TrainerConfig

    def setup(self, problem):
        self.problem = problem
        self.steps = 0

    def train_step(self, batch):
        BATCHES.append({name: tensor.clone() for name, tensor in batch.items()})
        THREADS.append(torch.get_num_threads())
        self.steps += 1
        return {"rows": float(len(batch["reward"]))}

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]

    def policy(self):
        return Fixed(len(self.problem.actions))


@hookimpl
def horizon_register_trainers(register):
    register(Recorder)


@hookimpl
def horizon_on_epoch_end(epoch, metrics):
    EPOCHS.append((epoch, dict(metrics)))
'''


@pytest.fixture
def recorder_host(plugin_site) -> PluginHost:
    """Built-in plugins and dqn, plus the ``recorder`` trainer installed as a third party's."""
    plugin_site.install(
        "horizon-plugin-recorder",
        "1.0",
        {"recorder": "horizon_plugin_recorder"},
        {"horizon_plugin_recorder.py": RECORDER_PLUGIN},
    )
    return PluginHost(env={"HORIZON_LOAD_PLUGINS": "recorder,dqn"})


def recorder_config(output: Path, **gym: object) -> dict:
    """A short CartPole run with the recorder: 20 random steps, then training on every step."""
    return {
        "gym": {
            "env": "CartPole-v1",
            "seed": 0,
            "episodes": 12,
            "train_after_ts": 20,
            "test_every_ts": 50,
            "avg_over_num_episodes": 2,
            "epsilon_start": 0.5,
            "epsilon_end": 0.1,
            "epsilon_decay_steps": 40,
            "output_dir": str(output),
            "ds": "2019-01-01",
            **gym,
        },
        "trainer": {"kind": "recorder", "minibatch_size": 8},
    }


# --- the replay buffer -------------------------------------------------------------------------


def filled(capacity: int, episodes: list[tuple[int, str]], n_step: int = 1) -> ReplayBuffer:
    """A buffer holding episodes of the given lengths and endings ("terminated", "truncated" or
    "running"); transition t (counted over all episodes) has state [t], reward t and action
    t % 2, and its next action is t + 1's action within an episode."""
    buffer = ReplayBuffer(capacity, state_width=1, action_count=2, n_step=n_step)
    t = 0
    for length, ending in episodes:
        for step in range(length):
            last = step == length - 1
            terminated = last and ending == "terminated"
            ended = last and ending != "running"
            state, next_state = np.array([t]), np.array([t + 1])
            buffer.add(state, t % 2, 0.5, float(t), next_state, terminated, ended)
            buffer.set_next_action((t + 1) % 2)
            t += 1
    return buffer


def rows(buffer: ReplayBuffer, name: str) -> list:
    return buffer.batch(torch.arange(len(buffer)))[name].tolist()


def test_ring_overwrites_the_oldest_transitions():
    buffer = filled(4, [(6, "running")])
    assert len(buffer) == 4
    # Transitions 0..5 in 4 slots: 4 and 5 took the slots of 0 and 1.
    assert rows(buffer, "reward") == [4.0, 5.0, 2.0, 3.0]
    assert buffer.newest == 1
    sampled = buffer.sample(200)["reward"]
    assert set(sampled.tolist()) == {2.0, 3.0, 4.0, 5.0}


def test_termination_zeroes_the_future_and_truncation_does_not():
    buffer = filled(10, [(2, "terminated"), (2, "truncated"), (1, "running")])
    assert rows(buffer, "not_terminal") == [1.0, 0.0, 1.0, 1.0, 1.0]
    # Terminated: no next action (set_next_action is ignored there) and no possible one.
    assert rows(buffer, "next_action") == [1, -1, 1, 0, 1]
    assert rows(buffer, "possible_next_actions") == [[1, 1], [0, 0], [1, 1], [1, 1], [1, 1]]
    assert rows(buffer, "possible_actions") == [[1, 1]] * 5


def test_batch_names_shapes_and_dtypes_are_the_timeline_tensors():
    batch = filled(10, [(5, "terminated")], n_step=3).sample(4)
    float_rows = ["reward", "not_terminal", "time_diff", "action_probability"]
    expected = {
        "state": ((4, 1), torch.float32),
        "state_presence": ((4, 1), torch.float32),
        "next_state": ((4, 1), torch.float32),
        "next_state_presence": ((4, 1), torch.float32),
        **{name: ((4,), torch.float32) for name in float_rows},
        "episode_id": ((4,), torch.int64),
        "step": ((4,), torch.int64),
        "action": ((4,), torch.int64),
        "next_action": ((4,), torch.int64),
        "possible_actions": ((4, 2), torch.float32),
        "possible_next_actions": ((4, 2), torch.float32),
        "next_n_rewards": ((4, 3), torch.float32),
        "next_n_time_diffs": ((4, 3), torch.float32),
        "next_n_not_terminal": ((4, 3), torch.float32),
        "next_n_length": ((4,), torch.int64),
        "next_n_state": ((4, 1), torch.float32),
        "next_n_state_presence": ((4, 1), torch.float32),
        "next_n_possible_next_actions": ((4, 2), torch.float32),
    }
    assert {name: (tuple(t.shape), t.dtype) for name, t in batch.items()} == expected
    assert batch["time_diff"].tolist() == [1.0] * 4
    assert batch["state_presence"].tolist() == [[1.0]] * 4


def test_episodes_are_numbered_in_play_order_and_steps_within_them():
    buffer = filled(10, [(2, "terminated"), (3, "truncated"), (2, "running")])
    assert rows(buffer, "episode_id") == [0, 0, 1, 1, 1, 2, 2]
    assert rows(buffer, "step") == [0, 1, 0, 1, 2, 0, 1]


@pytest.mark.parametrize("n_step", [1, 3])
def test_replay_and_timeline_batches_both_follow_the_batch_schema(tmp_path, n_step):
    """A trainer cannot tell online from offline training: a replay-buffer batch and a
    timeline minibatch hold the same tensors (discrete, and parametric as the gym offers it:
    one-hot actions), by ``check_batch``."""
    buffer = filled(64, [(30, "terminated"), (20, "truncated"), (10, "running")], n_step)
    check_batch(buffer.sample(16), ActionType.DISCRETE)
    parametric = filled(64, [(30, "terminated"), (20, "truncated")], n_step)
    parametric.one_hot = True
    check_batch(parametric.sample(16), ActionType.PARAMETRIC)

    for action_type, source, timeline in [
        (ActionType.DISCRETE, {}, {"actions": ["0", "1"]}),
        (ActionType.PARAMETRIC, {"parametric_actions": True}, {}),
    ]:
        run = tmp_path / action_type.value
        config = {
            "pipeline": {"output_dir": str(run), "seed": 0},
            "source": {"kind": "gym", "episodes": 5, "ds": "2019-01-01", **source},
            "timeline": {"reward": {"reward": 1.0}, "n_step": n_step, **timeline},
            "normalization": {},
        }
        Engine(show_progress=False).run(config)
        normalization = json.loads((run / "normalization.json").read_text())
        data = load_timeline(
            run / "timeline" / "train",
            action_type,
            list(normalization["state_features"]),
            list(normalization.get("action_features", {})),
            ["0", "1"] if action_type is ActionType.DISCRETE else [],
        )
        batch = next(data.minibatches(16, torch.Generator().manual_seed(0)))
        check_batch(batch, action_type)
        assert ("next_n_rewards" in batch) == (n_step > 1)


def test_n_step_windows_stop_at_episode_ends_and_at_the_newest_transition():
    # Transitions 0-3: an episode terminated at 3; 4-5: a running episode (5 is the newest).
    buffer = filled(10, [(4, "terminated"), (2, "running")], n_step=3)
    assert rows(buffer, "next_n_length") == [3, 3, 2, 1, 2, 1]
    assert rows(buffer, "next_n_rewards") == [
        [0, 1, 2],
        [1, 2, 3],
        [2, 3, 0],  # padded with reward 0 past the episode's end
        [3, 0, 0],
        [4, 5, 0],  # the episode goes on, but 6 has not happened yet
        [5, 0, 0],
    ]
    assert rows(buffer, "next_n_not_terminal") == [
        [1, 1, 1],
        [1, 1, 0],
        [1, 0, 0],
        [0, 0, 0],
        [1, 1, 0],
        [1, 0, 0],
    ]
    assert rows(buffer, "next_n_time_diffs") == [
        [1, 1, 1],
        [1, 1, 1],
        [1, 1, 0],
        [1, 0, 0],
        [1, 1, 0],
        [1, 0, 0],
    ]
    # Where each window ends: the next state of its last transition.
    assert rows(buffer, "next_n_state") == [[3], [4], [4], [4], [6], [6]]
    assert rows(buffer, "next_n_possible_next_actions")[1:4] == [[0, 0]] * 3


def test_n_step_windows_wrap_around_the_ring_but_not_past_the_write_head():
    # Transitions 0-5 of one episode in 4 slots: slot 0 holds 4, 1 holds 5 (newest), 2 holds 2.
    buffer = filled(4, [(6, "running")], n_step=3)
    assert rows(buffer, "next_n_rewards") == [[4, 5, 0], [5, 0, 0], [2, 3, 4], [3, 4, 5]]
    assert rows(buffer, "next_n_length") == [2, 1, 3, 3]


@pytest.mark.parametrize("n_step", [1, 3])
def test_dqn_trains_on_replay_batches(n_step):
    buffer = filled(64, [(30, "terminated"), (20, "truncated"), (10, "running")], n_step)
    parameters = {"0": NormalizationParameters(feature_type="continuous", mean=30.0, stddev=20.0)}
    preprocessor = build_preprocessor(["0"], parameters)
    problem = TrainingProblem(
        ActionType.DISCRETE, ["0", "1"], preprocessor, 1, None, 0, torch.device("cpu"), 0
    )
    dqn = DqnTrainer(DqnConfig(n_step=n_step, layers=[8], activations=["relu"]))
    dqn.setup(problem)
    losses = [dqn.train_step(buffer.sample(16))["td_loss"] for _ in range(5)]
    assert all(np.isfinite(losses))


def test_one_hot_actions_make_a_parametric_batch_the_parametric_trainer_takes():
    buffer = filled(64, [(30, "terminated"), (20, "truncated")], n_step=3)
    batch = one_hot_actions(buffer.batch(torch.tensor([0, 29, 30])), action_count=2)
    # Transition 0 took action 0 and 1 next; 29 ended its episode (no next action); 30: action 0.
    assert batch["action"].tolist() == [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]
    assert batch["next_action"].tolist() == [[0.0, 1.0], [0.0, 0.0], [0.0, 1.0]]
    assert torch.equal(batch["action_presence"], batch["action"])
    for prefix in ("possible_action", "possible_next_action", "next_n_possible_next_action"):
        assert batch[f"{prefix}_features"].tolist() == [[[1.0, 0.0], [0.0, 1.0]]] * 3
    assert batch["possible_next_actions"].tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]

    parameters = {"0": NormalizationParameters(feature_type="continuous", mean=30.0, stddev=20.0)}
    one_hot = {str(i): NormalizationParameters(feature_type="do_not_preprocess") for i in (1, 2)}
    trainer = ParametricDqnTrainer(ParametricDqnConfig(n_step=3, layers=[8], activations=["relu"]))
    trainer.setup(
        TrainingProblem(
            ActionType.PARAMETRIC,
            [],
            build_preprocessor(["0"], parameters),
            1,
            build_preprocessor(["1", "2"], one_hot),
            2,
            torch.device("cpu"),
            0,
        )
    )
    losses = [
        trainer.train_step(one_hot_actions(buffer.sample(16), 2))["td_loss"] for _ in range(5)
    ]
    assert all(np.isfinite(losses))


def test_parametric_dqn_plays_online_with_one_hot_actions(tmp_path):
    """parametric_actions: the normalization holds the one-hot action features, the -f rows
    log parametric actions (which the batch pipeline reads as such), the model takes
    candidates, and horizon export re-exports it."""
    gym_toml = tmp_path / "gym.toml"
    gym_toml.write_text(
        GOOD.replace("episodes = 10", "episodes = 3\ntrain_after_ts = 30\ntest_every_ts = 20")
        .replace('kind = "dqn"', 'kind = "parametric_dqn"')
        .replace("[gym]", "[gym]\nparametric_actions = true")
        + 'minibatch_size = 16\n\n[export]\nkind = "onnx"\n'
    )
    run, rows_file = tmp_path / "run", tmp_path / "rows.jsonl"
    result = CliRunner().invoke(
        main, ["gym", "train", str(gym_toml), "-o", str(run), "-f", str(rows_file)]
    )
    assert result.exit_code == 0, result.output
    normalization = json.loads((run / "normalization.json").read_text())
    assert list(normalization["action_features"]) == ["4", "5"]
    first = json.loads(rows_file.read_text().splitlines()[0])
    assert first["action"] in ({"4": 1.0}, {"5": 1.0})
    assert first["possible_actions"] == [{"4": 1.0}, {"5": 1.0}]
    config = {
        "pipeline": {"output_dir": str(tmp_path / "batch"), "seed": 0},
        "source": {"kind": "jsonl", "path": str(rows_file)},
        "timeline": {"reward": {"reward": 1.0}},
    }
    manifest = Engine(show_progress=False).run(config)
    assert manifest["stages"]["source"]["details"]["action_type"] == "parametric"
    assert onnx_greedy_return(run / "model.onnx", episodes=1) > 0  # takes candidates
    again = CliRunner().invoke(main, ["export", str(run)])
    assert again.exit_code == 0, again.output


# --- the epsilon schedule ----------------------------------------------------------------------


def test_epsilon_is_one_in_the_warm_up_then_falls_linearly():
    config = GymSection(
        train_after_ts=100, epsilon_start=0.9, epsilon_end=0.1, epsilon_decay_steps=400
    )
    assert [epsilon_at(step, config) for step in (0, 99)] == [1.0, 1.0]
    assert epsilon_at(100, config) == pytest.approx(0.9)
    assert epsilon_at(300, config) == pytest.approx(0.5)  # half way: (0.9 + 0.1) / 2
    assert epsilon_at(500, config) == pytest.approx(0.1)
    assert epsilon_at(10_000, config) == pytest.approx(0.1)
    at_once = GymSection(train_after_ts=100, epsilon_end=0.05, epsilon_decay_steps=0)
    assert epsilon_at(100, at_once) == 0.05


# --- gym.toml ----------------------------------------------------------------------------------

GOOD = """\
[gym]
env = "CartPole-v1"
episodes = 10

[trainer]
kind = "dqn"
layers = [16]
activations = ["relu"]
"""


@pytest.fixture(scope="module")
def dqn_host() -> PluginHost:
    return PluginHost(env={"HORIZON_LOAD_PLUGINS": "dqn"})


def gym_problems(tmp_path: Path, host: PluginHost, text: str) -> tuple[str, list[str]]:
    path = tmp_path / "gym.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_gym_spec(path, host)
    return str(path), caught.value.problems


def test_a_good_gym_file_resolves_with_the_trainers_defaults(tmp_path, dqn_host):
    path = tmp_path / "gym.toml"
    path.write_text(GOOD)
    spec = load_gym_spec(path, dqn_host, ["gym.seed=4"])
    resolved = spec.resolved()
    assert resolved["gym"]["seed"] == 4
    assert resolved["gym"]["replay_buffer_size"] == 100_000
    assert resolved["trainer"]["kind"] == "dqn"
    assert resolved["trainer"]["double_q"] is True  # the dqn trainer's default
    assert set(resolved) == {"gym", "trainer"}


def test_unknown_keys_are_named_with_their_file_line_and_section(tmp_path, dqn_host):
    text = GOOD.replace("episodes = 10", "episodse = 10").replace("layers", "layres")
    path, problems = gym_problems(tmp_path, dqn_host, text)
    assert problems[0].startswith(f"{path}:3: [gym] unknown key 'episodse'; did you mean ")
    assert problems[1].startswith(
        f"{path}:7: [trainer] unknown key 'layres' of trainers component 'dqn'; did you mean "
        "'layers'?"
    )


def test_sections_of_a_pipeline_file_and_a_missing_trainer_are_errors(tmp_path, dqn_host):
    path, problems = gym_problems(
        tmp_path, dqn_host, '[gym]\nepisodes = 1\n\n[source]\nkind = "gym"\n'
    )
    assert problems == [
        f"{path}:4: unknown section [source]. Valid sections: [gym], [normalization], "
        "[trainer], [export].",
        f"{path}: a gym file needs a [trainer] section choosing the trainer, "
        'e.g. [trainer] kind = "dqn"',
    ]


def test_a_minibatch_larger_than_the_buffer_is_an_error(tmp_path, dqn_host):
    text = GOOD.replace("episodes = 10", "replay_buffer_size = 100") + "minibatch_size = 128\n"
    path, problems = gym_problems(tmp_path, dqn_host, text)
    assert problems == [
        f"{path}:9: [trainer] minibatch_size = 128 is larger than [gym] replay_buffer_size = "
        "100; training samples minibatches from the buffer"
    ]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ("NoSuchEnv-v0", r"\[gym\] env = 'NoSuchEnv-v0': Environment `NoSuchEnv` doesn't exist"),
    ],
)
def test_an_env_that_cannot_be_played_is_named_and_the_run_fails(
    tmp_path, recorder_host, env, message
):
    spec = load_gym_spec(recorder_config(tmp_path / "run", env=env), recorder_host)
    with pytest.raises(HorizonError, match=message):
        train_gym(spec, recorder_host)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert sorted(path.name for path in (tmp_path / "run").iterdir()) == ["manifest.json"]


# --- a run, its rows and its outputs -----------------------------------------------------------


def test_rows_and_batches_are_what_was_played(tmp_path, recorder_host):
    """The -f rows are the gym source's rows with exact epsilon-greedy propensities; every
    batch transition is a played step, its next action the one played after it."""
    config = recorder_config(tmp_path / "run")
    rows_file = tmp_path / "rows.jsonl"
    result = train_gym(load_gym_spec(config, recorder_host), recorder_host, rows=rows_file)
    recorder = recorder_host.pm.get_plugin("recorder")
    played = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert len(played) == result.steps
    assert result.updates == len(recorder.BATCHES) == result.steps - 20 + 1
    gym_row = next(collect_rows(GymSourceConfig(episodes=1, ds="2019-01-01"), 0))[1]
    assert [list(row) for row in played] == [list(gym_row)] * len(played)
    section = GymSection(**config["gym"])
    for step, row in enumerate(played):
        epsilon = epsilon_at(step, section)
        greedy, other = 1 - epsilon + epsilon / 2, epsilon / 2
        expected = 0.5 if step < 20 else (greedy if row["action"] == "0" else other)
        assert row["action_probability"] == pytest.approx(expected), step
    # The greedy action is "push left": the pole falls within ~10 steps, long before the
    # 500-step limit, so every episode ends in a termination and no played step is missing.
    assert result.episodes == 12
    assert [row["mdp_id"] for row in played][-1] == "11"

    following = {}
    for row, after in zip(played, [*played[1:], None], strict=True):
        state = tuple(np.float32(value) for value in row["state_features"].values())
        same_episode = after is not None and after["mdp_id"] == row["mdp_id"]
        following[state] = (int(row["action"]), int(after["action"]) if same_episode else -1)
    for batch in recorder.BATCHES:
        for i, state in enumerate(map(tuple, batch["state"].numpy())):
            action, next_action = following[state]
            assert batch["action"][i] == action
            assert batch["next_action"][i] == next_action
            assert batch["not_terminal"][i] == (next_action >= 0)


def test_gym_n_step_is_the_buffers_window_and_the_trainer_is_told_it(tmp_path, recorder_host):
    """[gym] n_step declares the data's window: the replay batches carry it, the trainer reads
    it off the problem, and a trainer insisting on another window says which option to set."""
    config = recorder_config(tmp_path / "run", n_step=3, episodes=3)
    train_gym(load_gym_spec(config, recorder_host), recorder_host)
    recorder = recorder_host.pm.get_plugin("recorder")
    assert {batch["next_n_rewards"].shape[1] for batch in recorder.BATCHES} == {3}
    assert json.loads((tmp_path / "run" / "problem.json").read_text())["n_step"] == 3

    config = recorder_config(tmp_path / "dqn", episodes=3)
    config["trainer"] = {"kind": "dqn", "minibatch_size": 8, "n_step": 3, "layers": [8]}
    with pytest.raises(HorizonError, match=r"\[gym\] n_step = 3\).*this timeline has n_step = 1"):
        train_gym(load_gym_spec(config, recorder_host), recorder_host)


def test_truncation_by_max_steps_is_not_terminal(tmp_path, recorder_host):
    # Five steps are too few for CartPole to fail (the pole needs ~8): every episode is cut.
    config = recorder_config(tmp_path / "run", max_steps=5, episodes=10)
    rows_file = tmp_path / "rows.jsonl"
    result = train_gym(load_gym_spec(config, recorder_host), recorder_host, rows=rows_file)
    lengths = defaultdict(int)
    played = [json.loads(line) for line in rows_file.read_text().splitlines()]
    for row in played:
        lengths[row["mdp_id"]] += 1
    assert list(lengths.values()) == [5] * 10 and result.steps == 50
    # The -f rows say so too: each episode's last row, and only it, is marked truncated.
    assert [row.get("truncated", False) for row in played] == [step % 5 == 4 for step in range(50)]
    batches = recorder_host.pm.get_plugin("recorder").BATCHES
    assert all(batch["not_terminal"].all() for batch in batches)
    assert all((batch["next_action"] >= 0).all() for batch in batches)


def test_rows_go_through_the_jsonl_source_and_the_timeline(tmp_path, recorder_host):
    rows_file = tmp_path / "rows.jsonl"
    spec = load_gym_spec(recorder_config(tmp_path / "gym"), recorder_host)
    result = train_gym(spec, recorder_host, rows=rows_file)
    config = {
        "pipeline": {"output_dir": str(tmp_path / "batch"), "seed": 0},
        "source": {"kind": "jsonl", "path": str(rows_file)},
        "timeline": {"actions": ["0", "1"], "reward": {"reward": 1.0}},
    }
    manifest = Engine(plugins=recorder_host, show_progress=False).run(config)
    source, timeline = manifest["stages"]["source"], manifest["stages"]["timeline"]
    assert source["rows_in"] == source["rows_out"] == result.steps
    assert source["dropped"] == {} and timeline["dropped"] == {}
    details = timeline["details"]
    assert details["train_episodes"] + details["eval_episodes"] == result.episodes


def test_evaluations_checkpoints_hooks_and_reward_history(tmp_path, recorder_host):
    history = tmp_path / "history.csv"
    config = recorder_config(tmp_path / "run", episodes=15)
    spec = load_gym_spec(config, recorder_host)
    result = train_gym(spec, recorder_host, reward_history=history)
    # Evaluations at steps 50, 100, ... and one after the last episode.
    timesteps = [evaluation.timestep for evaluation in result.evaluations]
    assert timesteps == [*range(50, result.steps, 50), result.steps]
    with history.open(newline="") as handle:
        table = list(csv.reader(handle))
    assert tuple(table[0]) == REWARD_HISTORY_COLUMNS == ("timestep", "episode", "mean_return")
    assert [[int(row[0]), int(row[1]), float(row[2])] for row in table[1:]] == [
        [e.timestep, e.episode, e.mean_return] for e in result.evaluations
    ]
    assert result.evaluations[-1].episode == result.episodes == 15
    checkpoints = sorted(path.name for path in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == [f"epoch-{n:04d}.pt" for n in range(1, len(timesteps) + 1)] + [
        "latest.pt"
    ]
    latest = torch.load(tmp_path / "run" / "checkpoints" / "latest.pt", weights_only=False)
    assert latest["timestep"] == result.steps
    assert latest["trainer"] == {"steps": result.updates}
    epochs = recorder_host.pm.get_plugin("recorder").EPOCHS
    assert [epoch for epoch, _ in epochs] == list(range(1, len(timesteps) + 1))
    assert epochs[0][1]["Training/rows"] == 8.0  # the minibatch size
    assert epochs[-1][1]["Evaluation/mean_return"] == result.evaluations[-1].mean_return
    assert (tmp_path / "run" / "tensorboard").is_dir()
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "succeeded"
    assert manifest["result"]["steps"] == result.steps
    assert manifest["config"]["trainer"]["kind"] == "recorder"
    normalization = json.loads((tmp_path / "run" / "normalization.json").read_text())
    assert list(normalization["state_features"]) == ["0", "1", "2", "3"]


def test_trainer_threads_hold_for_the_run_and_gym_torch_threads_is_their_deprecated_alias(
    tmp_path, recorder_host
):
    """``[trainer] threads`` is torch's thread count from the trainer's set-up to the run's end
    (training and acting), the count from before after it. ``[gym] torch_threads``, the gym's
    option from before, stands in for it while it is not set, with a warning."""
    recorder = recorder_host.pm.get_plugin("recorder")
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        config = recorder_config(tmp_path / "run", episodes=3)
        config["trainer"]["threads"] = 2
        result = train_gym(load_gym_spec(config, recorder_host), recorder_host)
        assert set(recorder.THREADS) == {2} and torch.get_num_threads() == 3
        assert result.warnings == []

        alias = recorder_config(tmp_path / "alias", episodes=3, torch_threads=1)
        spec = load_gym_spec(alias, recorder_host)
        assert spec.trainer.config.threads == 1
        result = train_gym(spec, recorder_host)
        assert recorder.THREADS[-1] == 1 and torch.get_num_threads() == 3
        assert result.warnings[0].startswith("[gym] torch_threads is deprecated: [trainer]")

        alias["trainer"]["threads"] = 2
        assert load_gym_spec(alias, recorder_host).trainer.config.threads == 2
        del alias["gym"]["torch_threads"], alias["trainer"]["threads"]
        assert load_gym_spec(alias, recorder_host).trainer.config.threads == "auto"
    finally:
        torch.set_num_threads(before)


def test_warm_start_continues_the_earlier_runs_trainer_and_normalization(tmp_path, recorder_host):
    spec = load_gym_spec(recorder_config(tmp_path / "a"), recorder_host)
    first = train_gym(spec, recorder_host)
    config = recorder_config(tmp_path / "b", seed=1)
    config["trainer"]["warm_start_from"] = str(tmp_path / "a")
    second = train_gym(load_gym_spec(config, recorder_host), recorder_host)
    latest = torch.load(tmp_path / "b" / "checkpoints" / "latest.pt", weights_only=False)
    # The recorder's state counts its updates: the second run went on from the first's count.
    assert latest["trainer"] == {"steps": first.updates + second.updates}
    # Its weights were trained on the first run's normalization, so the second run keeps it
    # rather than fitting its own to its (other seed's) warm-up.
    normalization = "normalization.json"
    assert (tmp_path / "b" / normalization).read_text() == (
        tmp_path / "a" / normalization
    ).read_text()


def test_cli_trains_exports_and_horizon_export_re_exports(tmp_path):
    gym_toml = tmp_path / "gym.toml"
    gym_toml.write_text(
        GOOD.replace("episodes = 10", "episodes = 3\ntrain_after_ts = 30\ntest_every_ts = 20")
        + 'minibatch_size = 16\n\n[export]\nkind = "onnx"\n'
    )
    run = tmp_path / "run"
    args = ["gym", "train", str(gym_toml), "-o", str(run), "--score-bar", "1000"]
    result = CliRunner().invoke(main, [*args, "-r", str(tmp_path / "history.csv")])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("CartPole-v1: 3 episodes, ")
    assert "score bar 1000: not reached" in result.output
    assert f"wrote {run / 'model.onnx'}" in result.output
    assert (tmp_path / "history.csv").is_file()
    (run / "model.onnx").unlink()
    again = CliRunner().invoke(main, ["export", str(run)])
    assert again.exit_code == 0, again.output
    assert f"wrote {run / 'model.onnx'}" in again.output
    assert "checked on 1024 rows" in again.output
    assert (run / "model.onnx").is_file()
    # The run folder exports from its own files: [trainer] and [export] are all it reads.
    refused = CliRunner().invoke(main, ["export", str(run), "--set", "gym.seed=1"])
    assert refused.exit_code == 1
    assert "--set gym.seed: horizon export reads only [trainer] and [export]" in refused.output


def failing_export(message: str, error: type[Exception] = HorizonError):
    """An ONNX exporter's ``export`` that fails as a real one can."""

    def export(self, run, bundle):
        raise error(message)

    return export


EXPORT_FAILS = "[export] the ONNX model's 'scores' differs from PyTorch's (a test's exporter)"


def test_a_failed_export_keeps_the_trainings_record(tmp_path, recorder_host, monkeypatch):
    """The -r history, the -f rows, the checkpoints and the manifest's result survive an
    export that fails; the manifest says which stage failed and why."""
    from horizon_engine.builtin.gym.results import ExportAfterTrainingError
    from horizon_engine.builtin.onnx_export import OnnxExporter
    from horizon_engine.export_stage import export_run_folder

    monkeypatch.setattr(OnnxExporter, "export", failing_export(EXPORT_FAILS))
    config = recorder_config(tmp_path / "run", episodes=5) | {"export": {"kind": "onnx"}}
    history, rows = tmp_path / "history.csv", tmp_path / "rows.jsonl"
    spec = load_gym_spec(config, recorder_host)
    with pytest.raises(ExportAfterTrainingError) as caught:
        train_gym(spec, recorder_host, rows=rows, reward_history=history)
    result = caught.value.result
    assert result.episodes == 5 and result.evaluations
    with history.open(newline="") as handle:
        assert len(list(csv.reader(handle))) == 1 + len(result.evaluations)
    assert len(rows.read_text().splitlines()) == result.steps
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert manifest["failed_stage"] == "export"
    assert manifest["error"] == EXPORT_FAILS
    assert manifest["result"] == result.summary()
    # What training wrote, the driver's description of the problem and check rows included,
    # so that the run folder exports again without the environment.
    assert manifest["outputs"] == [
        "normalization.json",
        "problem.json",
        "checkpoints/latest.pt",
        "check_rows.pt",
        "training_epochs.json",
    ]
    assert manifest["reward_history_file"] == str(history)
    lines = str(caught.value).splitlines()
    assert lines[0] == "training finished, then the export failed:"
    assert lines[1].startswith("CartPole-v1: 5 episodes, ")
    assert lines[-2:] == [f"wrote {history}", EXPORT_FAILS]

    # Exported again once the exporter works (here: writes its file), the run is whole.
    def export(self, run, bundle):
        (run.output_dir / "model.onnx").write_bytes(b"a model")
        return ["model.onnx"]

    monkeypatch.setattr(OnnxExporter, "export", export)
    export_run_folder(tmp_path / "run", plugins=recorder_host)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "succeeded"
    assert "failed_stage" not in manifest and "error" not in manifest
    assert manifest["export"]["outputs"] == ["model.onnx"]


def test_an_exporters_exception_is_blamed_on_its_component_after_the_trainings_record(
    tmp_path, recorder_host, monkeypatch
):
    """As under ``horizon run``: the error names the exporter's plugin and component (it was
    the raw ZeroDivisionError and its traceback), the training report before it."""
    from horizon_engine.builtin.gym.results import ExportAfterTrainingError
    from horizon_engine.builtin.onnx_export import OnnxExporter

    monkeypatch.setattr(OnnxExporter, "export", failing_export("a bug", ZeroDivisionError))
    config = recorder_config(tmp_path / "run", episodes=3) | {"export": {"kind": "onnx"}}
    with pytest.raises(ExportAfterTrainingError) as caught:
        train_gym(load_gym_spec(config, recorder_host), recorder_host)
    blamed = str(caught.value).splitlines()[-1]
    assert blamed.startswith("plugin '") and (
        "its exporters component 'onnx' raised ZeroDivisionError: a bug (in " in blamed
    )
    assert isinstance(caught.value.__cause__, ZeroDivisionError)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert (manifest["status"], manifest["failed_stage"]) == ("failed", "export")
    assert manifest["result"]["episodes"] == 3
    assert manifest["error"] == blamed


def test_a_trainers_exception_names_its_plugin_and_component_in_the_error_and_manifest(
    tmp_path, recorder_host, monkeypatch
):
    recorder = recorder_host.component("trainers", "recorder").cls

    def train_step(self, batch):
        raise KeyError("q_values")

    monkeypatch.setattr(recorder, "train_step", train_step)
    spec = load_gym_spec(recorder_config(tmp_path / "run"), recorder_host)
    with pytest.raises(PluginError) as caught:
        train_gym(spec, recorder_host)
    message = str(caught.value)
    assert message.startswith(
        "plugin 'recorder' (horizon-plugin-recorder 1.0): its trainers component 'recorder' "
        "raised KeyError: 'q_values' (in "
    )
    assert "\n" not in message and isinstance(caught.value.__cause__, KeyError)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert (manifest["status"], manifest["failed_stage"]) == ("failed", "training")
    assert manifest["error"] == message


def test_cli_prints_the_training_summary_before_the_export_error(tmp_path, monkeypatch):
    from horizon_engine.builtin.onnx_export import OnnxExporter

    monkeypatch.setattr(OnnxExporter, "export", failing_export(EXPORT_FAILS))
    gym_toml = tmp_path / "gym.toml"
    gym_toml.write_text(
        GOOD.replace(
            "episodes = 10",
            "episodes = 3\ntrain_after_ts = 30\ntest_every_ts = 20\navg_over_num_episodes = 2",
        )
        + 'minibatch_size = 16\n\n[export]\nkind = "onnx"\n'
    )
    history = tmp_path / "history.csv"
    args = ["gym", "train", str(gym_toml), "-o", str(tmp_path / "run"), "-r", str(history)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0] == "error: training finished, then the export failed:"
    assert lines[1].startswith("CartPole-v1: 3 episodes, ")
    assert lines[2].startswith("mean return over 2 greedy episodes: best ")
    assert lines[-2:] == [f"wrote {history}", EXPORT_FAILS]
    assert "Traceback" not in result.output
    assert history.is_file()


def test_cli_reports_a_config_mistake_without_traceback(tmp_path):
    gym_toml = tmp_path / "gym.toml"
    gym_toml.write_text(GOOD.replace("episodes", "epsiodes"))
    result = CliRunner().invoke(main, ["gym", "train", str(gym_toml)])
    assert result.exit_code == 1
    assert f"{gym_toml}:3: [gym] unknown key 'epsiodes'; did you mean 'episodes'?" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("option", "target", "said"),
    [
        ("-f", "gym.toml", "-f gym.toml is the gym file"),
        ("-r", "run/manifest.json", "-r run/manifest.json lies inside the run folder"),
        ("-f", "history.csv", "-r history.csv is the -f file"),
    ],
)
def test_gym_outputs_that_are_its_inputs_or_the_runs_files_are_refused(
    tmp_path, monkeypatch, option, target, said
):
    """``-f gym.toml`` would have replaced the config with training rows, and ``-r`` inside
    the run's folder written over the run's own files (issue 33's class of defect)."""
    monkeypatch.chdir(tmp_path)
    Path("gym.toml").write_text(GOOD)
    arguments = ["gym", "train", "gym.toml", "-o", "run", "-r", "history.csv", option, target]
    result = CliRunner().invoke(main, arguments)
    assert result.exit_code == 1, result.output
    assert f"error: {said}" in result.output
    assert Path("gym.toml").read_text() == GOOD and not Path("run").exists()


def test_gym_collect_refuses_an_output_that_is_its_model(tmp_path):
    model = tmp_path / "model.onnx"
    model.write_bytes(b"not read: refused before")
    arguments = ["gym", "collect", "--epsilon", "0.1", "--model", str(model), "-o", str(model)]
    result = CliRunner().invoke(main, arguments)
    assert result.exit_code == 1, result.output
    assert f"error: -o {model} is the model {model}" in result.output
    assert model.read_bytes() == b"not read: refused before"


# --- learning ----------------------------------------------------------------------------------

EXAMPLE = Path(__file__).parent.parent / "examples" / "cartpole_online.toml"

CARTPOLE_SEEDS = [int(seed) for seed in os.environ.get("HORIZON_GYM_SEEDS", "11").split(",")]
"""The seeds of the online CartPole test: a representative one by default (see its docstring);
``HORIZON_GYM_SEEDS=$(seq -s, 0 19) pytest -m slow -s -k online`` checks seeds 0-19."""


@pytest.mark.slow
@pytest.mark.parametrize("seed", CARTPOLE_SEEDS)
def test_online_cartpole_reaches_195_within_300_episodes(tmp_path, seed):
    """examples/cartpole_online.toml: double DQN, 1,000 random steps, then an update every
    step; a 20-episode greedy evaluation every 500 steps stops the run at a mean of 195.

    Seeds 0-19 reach the bar after 84, 90, 80, 132, 105, 92, 79, 84, 85, 87, 120, 88, 87, 90,
    77, 85, 87, 88, 79 and 91 training episodes (2,000 to 3,500 steps, 2-5 s here). The
    exported model, played by onnxruntime on 20 other episodes (before issue 22), scored 213 to
    500 over those seeds (median 355): the evaluation that stopped a run was not a lucky draw.
    The default, seed 11 (88 episodes; 316.2 at step 2,000; 353.5 in onnxruntime), is at the
    median of both; over the 50 episodes of seeds 1000-1049 its model scores 325.1.
    """
    from horizon_engine.plugins import get_plugin_host

    plugins = get_plugin_host()
    overrides = [f"gym.seed={seed}", f"gym.output_dir={json.dumps(str(tmp_path / 'run'))}"]
    result = train_gym(load_gym_spec(EXAMPLE, plugins, overrides), plugins)
    score = onnx_greedy_return(tmp_path / "run" / "model.onnx")
    print(
        f"online CartPole seed {seed}: {result.episodes} episodes, {result.steps} steps, "
        f"best mean {result.best.mean_return:.1f}, onnx {score:.1f}, {result.seconds:.1f} s"
    )
    assert result.reached
    assert result.episodes <= 300
    assert result.best.mean_return >= 195
    assert score >= 150


@pytest.mark.slow
def test_online_parametric_dqn_with_one_hot_actions(tmp_path):
    """The example's recipe with ``parametric_dqn``, each action offered as one-hot action
    features ("4", "5"). Seeds 0-9 reach the bar of 195 after 84, 85, 79, 89, 95, 101, 92, 83,
    63 and 84 training episodes; the exported model, played by onnxruntime on 20 other
    episodes (before issue 22), scored 357, 339, 366, 417, 427, 334, 184, 401, 185 and 305
    (median 348). Seed 0 (84 episodes, 357) is at the median of both; over the 50 episodes of
    seeds 1000-1049 its model scores 388.2. The issue's parametric bar is 150."""
    from horizon_engine.plugins import get_plugin_host

    plugins = get_plugin_host()
    overrides = [
        "gym.seed=0",
        "gym.parametric_actions=true",
        'trainer.kind="parametric_dqn"',
        f"gym.output_dir={json.dumps(str(tmp_path / 'run'))}",
    ]
    result = train_gym(load_gym_spec(EXAMPLE, plugins, overrides), plugins)
    score = onnx_greedy_return(tmp_path / "run" / "model.onnx")
    print(f"online parametric CartPole: {result.episodes} episodes, onnx {score:.1f}")
    assert result.reached and result.episodes <= 300
    assert score >= 150


def test_a_run_the_score_bar_stops_mid_episode_marks_its_last_row_truncated(
    tmp_path, recorder_host
):
    """Stopped by the bar at step 23, the episode then under way did not end: its last -f row
    is a truncation, so a timeline built from the rows makes no terminal row of it."""
    config = recorder_config(tmp_path / "run", score_bar=1.0, test_every_ts=23)
    rows_file = tmp_path / "rows.jsonl"
    result = train_gym(load_gym_spec(config, recorder_host), recorder_host, rows=rows_file)
    played = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert result.steps == len(played) == 23
    assert [index for index, row in enumerate(played) if row.get("truncated")] == [22]
