"""Online learning on Pendulum-v1 with the actor-critic trainers (``horizon gym train`` on a
Box action space), and the exported actor played by onnxruntime inside the action bounds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from horizon_engine.builtin.gym.config import load_gym_spec
from horizon_engine.builtin.gym.runner import train_gym

EXAMPLE = Path(__file__).parent.parent / "examples" / "pendulum_sac_online.toml"

SEEDS = [int(seed) for seed in os.environ.get("HORIZON_AC_GYM_SEEDS", "0").split(",")]
"""The seeds of the online Pendulum tests: seed 0 by default (see the docstrings);
``HORIZON_AC_GYM_SEEDS=0,1,2,3,4 pytest -m slow -s -k pendulum`` checks seeds 0-4."""


def onnx_pendulum_return(model: Path, episodes: int = 10) -> tuple[float, float, float]:
    """Mean return of the exported actor over ``episodes`` Pendulum-v1 episodes of fixed seeds
    (not the run's), run by onnxruntime on raw observations; and the least and largest action
    it emitted."""
    import gymnasium
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    env = gymnasium.make("Pendulum-v1")
    returns, emitted = [], []
    for episode in range(episodes):
        observation, _ = env.reset(seed=5000 + episode)
        total, done = 0.0, False
        while not done:
            features = np.asarray(observation, dtype=np.float32).reshape(1, -1)
            action = session.run(None, {"features": features, "presence": np.ones_like(features)})
            emitted.append(action[0][0])
            observation, reward, terminated, truncated, _ = env.step(action[0][0])
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    emitted = np.concatenate(emitted)
    return float(np.mean(returns)), float(emitted.min()), float(emitted.max())


def pendulum(tmp_path: Path, seed: int, bar: float, *extra: str):
    """The example run with ``seed`` (and ``extra`` overrides), stopped at ``bar``; its result
    and the exported actor's figures."""
    from horizon_engine.plugins import get_plugin_host

    plugins = get_plugin_host()
    overrides = [
        f"gym.seed={seed}",
        f"gym.score_bar={bar}",
        f"gym.output_dir={json.dumps(str(tmp_path / 'run'))}",
        *extra,
    ]
    result = train_gym(load_gym_spec(EXAMPLE, plugins, overrides), plugins)
    score, low, high = onnx_pendulum_return(tmp_path / "run" / "model.onnx")
    figures = ", ".join(f"{e.timestep}: {e.mean_return:.1f}" for e in result.evaluations)
    print(f"online Pendulum {extra} seed {seed}: {figures}; onnx {score:.1f} in [{low}, {high}]")
    return result, score, low, high


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_online_sac_on_pendulum_reaches_minus_250_within_20000_steps(tmp_path, seed):
    """examples/pendulum_sac_online.toml: SAC ([256, 256], batch 256, automatic entropy
    tuning, bc_weight unset: 0 online), 1,000 uniform random steps in [-2, 2], then an update
    every step; a 10-episode evaluation of the deterministic actor every 2,000 steps stops the
    run at the issue's bar, a mean return of -250, within its 20,000 steps (100 episodes).

    Measured here, seed 0 without the bar (the full 20,000 steps, 276 s on one thread): the
    evaluations every 2,000 steps were -1478.3, -179.3, -145.0, -145.8, -140.3, -156.6, -182.3,
    -120.7, -175.6 and -122.7; with the bar the run stops at step 4,000 (-179.3, 130 s with
    the export and its replay), and the exported actor, played by onnxruntime on 10 other
    episodes, scores -200.3 with actions in [-1.91, 1.93]. SAC's actor is stochastic: the model
    outputs ``action`` (the squashed mean, in the user's units) and ``log_density``. Seeds 0-4
    reach the bar at steps 4,000, 6,000, 4,000, 4,000 and 8,000 with -179.3, -145.7, -148.7,
    -126.9 and -195.1 (seed 1 was at -267.0 at step 4,000, seed 4 at -365.4 and -320.9 before).
    """
    result, score, low, high = pendulum(tmp_path, seed, -250.0)
    assert result.reached
    assert result.steps <= 20_000
    assert result.best.mean_return >= -250
    # The exported actor plays as well on other episodes, inside the action bounds.
    assert score >= -300
    assert low >= -2.0 and high <= 2.0


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "bar"), [("td3", -300.0), ("ddpg", -500.0)])
def test_online_td3_and_ddpg_on_pendulum_reach_their_bars_within_20000_steps(tmp_path, kind, bar):
    """The example's recipe with ``kind = "td3"`` or ``"ddpg"`` (Gaussian exploration noise
    0.1 of the normalized range; TD3's target smoothing and delayed actor updates at their
    defaults), stopped at the issue's bar: -300 for TD3, -500 for DDPG.

    Measured here, seed 0 without the bar (the full 20,000 steps, 430 s and 415 s on one
    thread beside other work): TD3 -1446.3, -154.0, -145.8, -176.4, -141.3, -152.1, -184.3,
    -134.5, -177.0 and -121.5; DDPG -1445.3, -154.8, -186.1, -318.4, -143.0, -149.6, -182.4,
    -120.2, -175.2 and -123.5. With the bar both stop at step 4,000 (-154.0 and -154.8), and
    their exported actors (``action`` only: deterministic), played by onnxruntime on 10 other
    episodes, score -164.8 and -167.2 with actions reaching both bounds, -2.0 and 2.0.
    Seeds 1-4 with the bar (30-47 s each): TD3 reached it at steps 4,000, 4,000, 4,000 and
    6,000 (-243.8, -140.6, -290.1, -182.2; exported -172.5, -190.7, -189.9, -145.6), DDPG at
    4,000, 4,000, 6,000 and 6,000 (-256.5, -143.8, -169.6, -179.5; exported -172.9, -220.8,
    -145.2, -144.0).
    """
    result, score, low, high = pendulum(tmp_path, 0, bar, f'trainer.kind="{kind}"')
    assert result.reached
    assert result.steps <= 20_000
    assert result.best.mean_return >= bar
    assert score >= bar - 50
    assert low >= -2.0 and high <= 2.0
