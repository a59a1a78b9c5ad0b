"""Learning continuous actions from Horizon's own logged Pendulum data (8,600 timeline rows, 43
episodes of 200 steps, logged by a policy averaging -424 per episode), played as a user
serving the policy would: the exported ``model.onnx`` (onnxruntime) on raw observations, in
Pendulum-v1.

Every figure below is the mean return over the 50 episodes of seeds 1000-1049, the pipeline's
seed given, as benchmarks/defaults_sweep.py plays them (its ``horizon_pendulum``); uniformly
random play scores about -1,200 there. The bar is the logging policy's -424: learning from the
logs beats the policy that wrote them. Each test trains with the kind's defaults (100 passes,
3,000 updates) on one thread in about a minute.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from horizon_engine.export_stage import trained_policy
from horizon_engine.pipeline import Engine
from horizon_engine.plugins import get_plugin_host

REFERENCE = Path(
    os.environ.get("HORIZON_REFERENCE_DATA")
    or Path(__file__).resolve().parents[2] / "shared" / "reference-data"
)
PENDULUM = REFERENCE / "reagent" / "continuous_action" / "pendulum_training.json.bz2"
EPISODES = 50
LOGGED_RETURN = -424.0
"""The logging policy's mean return per episode over the 43 episodes of the rows."""


def pendulum_return(policy: torch.nn.Module, episodes: int = EPISODES) -> float:
    """Mean return of ``policy`` (raw observation -> action, or ``(action, log_density)``)
    over Pendulum-v1 episodes of seeds 1000, 1001, ..."""
    import gymnasium

    env = gymnasium.make("Pendulum-v1")
    returns = []
    for episode in range(episodes):
        observation, _ = env.reset(seed=1000 + episode)
        total, done = 0.0, False
        while not done:
            state = torch.as_tensor(observation, dtype=torch.float32).reshape(1, -1)
            with torch.no_grad():
                out = policy(state, torch.ones_like(state))
            action = (out[0] if isinstance(out, tuple) else out)[0].numpy()
            observation, reward, terminated, truncated, _ = env.step(np.clip(action, -2.0, 2.0))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


class OnnxActor:
    """An exported ``model.onnx`` run by onnxruntime, called like ``policy()``."""

    def __init__(self, path: Path) -> None:
        import onnxruntime

        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def __call__(self, values: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
        inputs = {"features": values.numpy(), "presence": presence.numpy()}
        (action,) = self.session.run(["action"], inputs)
        return torch.from_numpy(action)


def offline_policies(
    tmp_path: Path, trainer: dict[str, object], seed: int = 0
) -> tuple[torch.nn.Module, OnnxActor]:
    """Train ``trainer`` through the pipeline on the logged rows and export it; return its
    ``policy()`` and the exported model."""
    config = {
        "pipeline": {"output_dir": str(tmp_path), "seed": seed},
        "source": {"kind": "jsonl", "path": str(PENDULUM)},
        "timeline": {"eval_fraction": 0.1},
        "normalization": {},
        "trainer": {"threads": 1, **trainer},
        "export": {"kind": "onnx"},
    }
    engine = Engine(show_progress=False)
    engine.run(config)
    choice = engine.validate(config).sections["trainer"]
    policy = trained_policy(tmp_path, choice, get_plugin_host())
    return policy, OnnxActor(tmp_path / "model.onnx")


def check_beats_the_logs(tmp_path: Path, trainer: dict[str, object]) -> float:
    if not PENDULUM.is_file():
        pytest.skip(f"reference data not found: looked for {PENDULUM}")
    torch.set_num_threads(1)
    policy, exported = offline_policies(tmp_path, trainer)
    state = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 8.0], [0.0, 1.0, -8.0]])
    out = policy(state, torch.ones_like(state))
    action = out[0] if isinstance(out, tuple) else out
    # Actions in the user's units: inside the logged range (about [-2.9, 3.1]), as exported.
    assert action.shape == (3, 1) and action.abs().max() < 3.2
    torch.testing.assert_close(exported(state, torch.ones_like(state)), action)
    found = pendulum_return(exported)
    assert found >= LOGGED_RETURN, found
    return found


@pytest.mark.slow
def test_td3_learns_pendulum_from_horizons_logs(tmp_path):
    """TD3+BC with the defaults (bc_weight 0.2, 100 passes: 3,000 updates): -251, -211 and
    -278 for seeds 0-2; 300 passes: -177, -175 and -183 (which sank the mediocre logger's
    rows below random play: test_ac_mediocre_logs.py)."""
    check_beats_the_logs(tmp_path, {"kind": "td3"})


@pytest.mark.slow
def test_sac_learns_pendulum_from_horizons_logs(tmp_path):
    """SAC with the defaults (no cloning, automatic entropy tuning, 100 passes): -282, -163
    and -337 for seeds 0-2; target_entropy -3: -265, -163, -336; 300 passes: -580, -431,
    -572."""
    check_beats_the_logs(tmp_path, {"kind": "sac"})


@pytest.mark.slow
def test_ddpg_learns_pendulum_from_horizons_logs(tmp_path):
    """DDPG with the defaults (bc_weight 0.2, 100 passes): -238, -212 and -279 for seeds 0-2;
    300 passes: -177, -174 and -176."""
    check_beats_the_logs(tmp_path, {"kind": "ddpg"})
