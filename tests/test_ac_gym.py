"""``horizon gym train`` on Box action spaces: continuous replay batches, the uniform warm-up
inside the bounds, normalization over the Box's bounds, acting with the trainer's
``exploration_policy()``, evaluating its deterministic ``policy()``, checkpoints and the ONNX
export, with a tiny continuous trainer installed as a third party's plugin."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

from horizon_engine.batch_schema import check_batch
from horizon_engine.builtin.gym.config import load_gym_spec
from horizon_engine.builtin.gym.replay_buffer import ReplayBuffer
from horizon_engine.builtin.gym.runner import train_gym
from horizon_engine.errors import HorizonError
from horizon_engine.plugins import PluginHost
from horizon_engine.schema import ActionType

LINEAR_AC_PLUGIN = '''
import copy

import torch

from horizon_engine import hookimpl
from horizon_engine.training import TrainerBase, TrainerConfig

BATCHES = []
RESETS = []
EXPLORED = []


def affine(preprocessor, width):
    """The action preprocessor's map, a * raw + b per feature, read off two raw points inside
    any range holding 0 (Pendulum's [-2, 2], MountainCarContinuous' [-1, 1])."""
    ones = torch.ones(1, width)
    at_zero = preprocessor(torch.zeros(1, width), ones)
    at_step = preprocessor(torch.full((1, width), 0.01), ones)
    return (at_step - at_zero) / 0.01, at_zero


class Actor(torch.nn.Module):
    """Raw state -> tanh(linear) in (-1, 1) -> the user's units (the preprocessor's inverse)."""

    def __init__(self, preprocessor, layer, scale, shift):
        super().__init__()
        self.preprocessor, self.layer = preprocessor, layer
        self.register_buffer("scale", scale)
        self.register_buffer("shift", shift)

    def normalized(self, values, presence):
        return torch.tanh(self.layer(self.preprocessor(values, presence)))

    def forward(self, values, presence):
        return (self.normalized(values, presence) - self.shift) / self.scale


class Exploring(Actor):
    """The actor plus Gaussian noise in (-1, 1), clamped inside: a step counter, reset()."""

    def __init__(self, *args, generator):
        super().__init__(*args)
        self.generator = generator

    def reset(self):
        RESETS.append(len(EXPLORED))

    def forward(self, values, presence):
        normalized = self.normalized(values, presence)
        noise = torch.randn(normalized.shape, generator=self.generator) * 0.3
        action = ((normalized + noise).clamp(-0.999, 0.999) - self.shift) / self.scale
        EXPLORED.append(action.clone())
        return action


class NoExploration(TrainerBase):
    """A linear actor and a linear critic, updated DDPG-style; keeps every batch. Without
    ``exploration_policy`` (the ``ExploresOnline`` capability) it cannot act on a Box space."""

    name = "no_exploration"
    Config = TrainerConfig

    def setup(self, problem):
        self.problem = problem
        width, actions = problem.state_width, problem.action_width
        self.actor = torch.nn.Linear(width, actions)
        self.critic = torch.nn.Linear(width + actions, 1)
        self.optimizer = torch.optim.Adam(
            [*self.actor.parameters(), *self.critic.parameters()], lr=1e-3
        )
        self.scale, self.shift = affine(problem.action_preprocessor, actions)
        self.generator = torch.Generator().manual_seed(problem.seed)

    def train_step(self, batch):
        BATCHES.append({name: tensor.clone() for name, tensor in batch.items()})
        problem = self.problem
        state = problem.state_preprocessor(batch["state"], batch["state_presence"])
        action = problem.action_preprocessor(batch["action"], batch["action_presence"])
        following = problem.state_preprocessor(batch["next_state"], batch["next_state_presence"])
        with torch.no_grad():
            best = torch.tanh(self.actor(following))
            future = self.critic(torch.cat([following, best], dim=1)).squeeze(1)
            target = batch["reward"] + 0.9 * batch["not_terminal"] * future
        q = self.critic(torch.cat([state, action], dim=1)).squeeze(1)
        critic_loss = (q - target).pow(2).mean()
        chosen = torch.cat([state, torch.tanh(self.actor(state))], dim=1)
        actor_loss = -self.critic(chosen).mean()
        self.optimizer.zero_grad()
        (critic_loss + actor_loss).backward()
        self.optimizer.step()
        return {"critic_loss": float(critic_loss.detach())}

    def state_dict(self):
        return {"actor": self.actor.state_dict(), "critic": self.critic.state_dict()}

    def load_state_dict(self, state):
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])

    def _parts(self):
        parts = (self.problem.state_preprocessor, self.actor, self.scale, self.shift)
        return copy.deepcopy(parts)

    def policy(self):
        return Actor(*self._parts()).eval()


class LinearAc(NoExploration):
    """The same, exploring with its own noise."""

    name = "linear_ac"

    def exploration_policy(self):
        return Exploring(*self._parts(), generator=self.generator).eval()


@hookimpl
def horizon_register_trainers(register):
    register(LinearAc)
    register(NoExploration)
'''


@pytest.fixture
def ac_host(plugin_site) -> PluginHost:
    """Built-in plugins plus the ``linear_ac`` and ``no_exploration`` trainers."""
    plugin_site.install(
        "horizon-plugin-linear-ac",
        "1.0",
        {"linear_ac": "horizon_plugin_linear_ac"},
        {"horizon_plugin_linear_ac.py": LINEAR_AC_PLUGIN},
    )
    return PluginHost(env={"HORIZON_LOAD_PLUGINS": "linear_ac"})


def ac_config(output: Path, trainer: str = "linear_ac", **gym: object) -> dict:
    """A short Pendulum run: 100 random steps, then training on every step, evaluations every
    150 steps over 2 episodes of 60 steps, the final policy exported."""
    return {
        "gym": {
            "env": "Pendulum-v1",
            "seed": 0,
            "episodes": 4,
            "max_steps": 60,
            "train_after_ts": 100,
            "test_every_ts": 150,
            "avg_over_num_episodes": 2,
            "output_dir": str(output),
            "ds": "2019-01-01",
            **gym,
        },
        "trainer": {"kind": trainer, "minibatch_size": 16, "threads": 1},
        "export": {"kind": "onnx"},
    }


# --- the replay buffer ----------------------------------------------------------------------


def continuous_buffer(n_step: int = 1) -> ReplayBuffer:
    """Two episodes of three steps, the first terminated, the second truncated; transition t
    has state [t] and action [t, -t]."""
    buffer = ReplayBuffer(10, state_width=1, action_count=0, n_step=n_step, action_width=2)
    t = 0
    for ending in ("terminated", "truncated"):
        for step in range(3):
            last = step == 2
            action = np.array([t, -t], dtype=np.float64)
            buffer.add([t], action, 1.0, float(t), [t + 1], last and ending == "terminated", last)
            buffer.set_next_action(action + 1)
            t += 1
    return buffer


@pytest.mark.parametrize("n_step", [1, 3])
def test_continuous_batches_follow_the_batch_schema(n_step):
    buffer = continuous_buffer(n_step)
    batch = buffer.batch(torch.arange(len(buffer)))
    check_batch(batch, ActionType.CONTINUOUS)
    assert batch["action"].tolist() == [[t, -t] for t in range(6)]
    assert batch["action_presence"].tolist() == [[1.0, 1.0]] * 6
    # After a termination there is no next action: absent, as on the timeline's terminal rows;
    # after a truncation the next action was drawn (as for SARSA) and is there.
    presence = batch["next_action_presence"][:, 0].tolist()
    assert presence == [1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    assert batch["next_action"][2].tolist() == [0.0, 0.0]
    assert batch["next_action"][5].tolist() == [6.0, -4.0]
    assert buffer.sample(4)["action"].shape == (4, 2)


# --- runs ---------------------------------------------------------------------------------------


def test_pendulum_warm_up_normalization_exploration_evaluation_and_export(tmp_path, ac_host):
    rows_file = tmp_path / "rows.jsonl"
    spec = load_gym_spec(ac_config(tmp_path / "run"), ac_host)
    result = train_gym(spec, ac_host, rows=rows_file)
    plugin = ac_host.pm.get_plugin("linear_ac")
    run = tmp_path / "run"

    # Four cut episodes of 60 steps; training from the 100th step, one update per step.
    assert result.steps == 240 and result.episodes == 4
    assert result.updates == len(plugin.BATCHES) == 240 - 100 + 1
    for batch in plugin.BATCHES[:3]:
        check_batch(batch, ActionType.CONTINUOUS)

    # The -f rows log Box actions as the gym source does: the action feature follows the
    # state's three, no possible actions, propensity 1.0.
    played = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert len(played) == 240
    assert all(set(row["action"]) == {"3"} and "possible_actions" not in row for row in played)
    assert {row["action_probability"] for row in played} == {1.0}
    actions = np.array([row["action"]["3"] for row in played])
    assert ((actions >= -2.0) & (actions <= 2.0)).all()
    # The warm-up (steps 0-98, and 99 whose action was drawn before the set-up) is uniform
    # over [-2, 2]; then the exploration module chose every action the runner played, in
    # order (it also drew one after each cut episode, the next action for SARSA, not played).
    warm_up = actions[:100]
    assert warm_up.min() < -1.8 and warm_up.max() > 1.8 and abs(warm_up.mean()) < 0.4
    explored = [float(action[0, 0]) for action in plugin.EXPLORED]
    unplayed = [20, 81, 142]
    assert len(explored) == 140 + len(unplayed)
    kept = [value for i, value in enumerate(explored) if i not in unplayed]
    np.testing.assert_allclose(actions[100:], kept, rtol=1e-6)
    # reset() at every episode start once the module exists: episodes 3 and 4 (the set-up is
    # at step 100, inside episode 2).
    assert len(plugin.RESETS) == 2

    # normalization.json: the Box's own bounds for the action, not the warm-up's range.
    normalization = json.loads((run / "normalization.json").read_text())
    assert list(normalization["state_features"]) == ["0", "1", "2"]
    assert normalization["action_features"] == {
        "3": {"feature_type": "continuous_action", "min_value": -2.0, "max_value": 2.0}
    }
    problem = json.loads((run / "problem.json").read_text())
    assert problem["action_type"] == "continuous"
    assert problem["actions"] == [] and problem["action_feature_ids"] == ["3"]

    # Evaluations at 150 and 240 steps, each a checkpoint; the manifest and the export.
    assert [evaluation.timestep for evaluation in result.evaluations] == [150, 240]
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == [
        "epoch-0001.pt",
        "epoch-0002.pt",
        "latest.pt",
    ]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "succeeded"
    assert manifest["export"]["details"]["outputs"] == ["action"]
    assert manifest["export"]["details"]["verified_rows"] == 1024
    session = onnxruntime.InferenceSession(str(run / "model.onnx"))
    metadata = session.get_modelmeta().custom_metadata_map
    assert json.loads(metadata["action_bounds"]) == {"low": [-2.0], "high": [2.0]}
    states = np.random.default_rng(0).normal(0.0, 10.0, (50, 3)).astype(np.float32)
    (exported,) = session.run(None, {"features": states, "presence": np.ones_like(states)})
    assert exported.shape == (50, 1) and (np.abs(exported) <= 2.0).all()

    # The evaluation played the deterministic policy: the same returns again.
    returns = [evaluation.returns for evaluation in result.evaluations]
    assert all(len(r) == 2 and all(-1300 < value <= 0 for value in r) for r in returns)


def test_mountain_car_continuous_action_ids_and_bounds(tmp_path, ac_host):
    config = ac_config(tmp_path / "run", env="MountainCarContinuous-v0", episodes=3, max_steps=50)
    result = train_gym(load_gym_spec(config, ac_host), ac_host)
    assert result.steps == 150
    run = tmp_path / "run"
    normalization = json.loads((run / "normalization.json").read_text())
    assert list(normalization["state_features"]) == ["0", "1"]
    assert normalization["action_features"] == {
        "2": {"feature_type": "continuous_action", "min_value": -1.0, "max_value": 1.0}
    }
    batch = ac_host.pm.get_plugin("linear_ac").BATCHES[-1]
    check_batch(batch, ActionType.CONTINUOUS)
    assert batch["action"].shape == (16, 1)
    assert (batch["action"].abs() <= 1.0).all()
    assert json.loads((run / "manifest.json").read_text())["status"] == "succeeded"


def test_a_trainer_without_an_exploration_policy_is_named(tmp_path, ac_host):
    spec = load_gym_spec(ac_config(tmp_path / "run", trainer="no_exploration"), ac_host)
    with pytest.raises(
        HorizonError,
        match=r"\[trainer\] kind = 'no_exploration' gives no exploration policy .*"
        r"'Pendulum-v1', a Box action space",
    ):
        train_gym(spec, ac_host)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["failed_stage"] == "training"


def test_parametric_actions_need_a_discrete_space(tmp_path, ac_host):
    spec = load_gym_spec(ac_config(tmp_path / "run", parametric_actions=True), ac_host)
    with pytest.raises(HorizonError, match="parametric_actions = true needs a Discrete"):
        train_gym(spec, ac_host)


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ("multi_discrete", r"has a MultiDiscrete action space; horizon gym train plays Discrete"),
        ("unbounded", r"has an unbounded Box action space .* needs finite bounds"),
    ],
)
def test_action_spaces_it_cannot_play_are_named(tmp_path, ac_host, space, message):
    import gymnasium

    spaces = {
        "multi_discrete": gymnasium.spaces.MultiDiscrete([2, 3]),
        "unbounded": gymnasium.spaces.Box(-np.inf, np.inf, (1,)),
    }

    class Env(gymnasium.Env):
        action_space = spaces[space]
        observation_space = gymnasium.spaces.Box(-1.0, 1.0, (1,))

    env_id = f"HorizonTest{space.title().replace('_', '')}-v0"
    gymnasium.register(env_id, entry_point=lambda: Env())
    try:
        spec = load_gym_spec(ac_config(tmp_path / "run", env=env_id), ac_host)
        with pytest.raises(HorizonError, match=rf"\[gym\] env = '{env_id}' {message}"):
            train_gym(spec, ac_host)
    finally:
        del gymnasium.registry[env_id]
