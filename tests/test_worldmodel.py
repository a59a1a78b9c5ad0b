"""The world model and the MDP checks on synthetic problems whose answers are known.

Each problem is built as ``Transitions`` directly (the checks' input, normalized features, a
one-hot action), 100 episodes of 20 steps, so that a test fits its dozen small models in a few
seconds; the pipeline around the checks is tested in ``test_mdp_check.py``.

- a true MDP: the action moves feature 0, feature 1 follows itself, features 2 and 3 are fresh
  noise every step, and the reward is feature 0: every check passes but the last, which names
  the two noise features, ranked last;
- a bandit: the next state is fresh noise whatever the state and action: checks 1 and 2 say no;
- the MDP's dynamics with a reward of the action alone: check 3 says no;
- a next state drawn from two Gaussians: the mixture density's held-out negative
  log-likelihood is within 5% of the distribution's entropy.
"""

from __future__ import annotations

import html
import json
import math

import pytest
import torch

from horizon_engine import HorizonError, RunFolder
from horizon_plugins_worldmodel.checks import MdpAnalysis
from horizon_plugins_worldmodel.config import WorldModelConfig
from horizon_plugins_worldmodel.data import Transitions, input_groups
from horizon_plugins_worldmodel.fitting import ModelFitter
from horizon_plugins_worldmodel.report import importance_chart, mdp_section, report_text
from horizon_plugins_worldmodel.statistics import plain

FAST = {"epochs": 20, "min_updates": 1, "layers": [32, 32], "num_bootstrap": 200}
"""Small models: the synthetic problems are simple, and the checks must take seconds."""


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def synthetic(kind: str, episodes: int = 100, length: int = 20, seed: int = 0) -> Transitions:
    """Episodes of a problem of four state features and two actions (see the module's
    docstring for ``kind``: "mdp", "bandit" or "action_reward"); the last step ends each."""
    generator = torch.Generator().manual_seed(seed)
    states, actions, next_states, rewards = [], [], [], []
    for _ in range(episodes):
        state = torch.randn(4, generator=generator)
        for _ in range(length):
            action = int(torch.randint(2, (1,), generator=generator))
            noise = torch.randn(5, generator=generator)
            if kind == "bandit":
                following = noise[:4]
                reward = float(state[0]) + action
            else:
                following = torch.stack(
                    [
                        0.8 * state[0] + (action - 0.5) + 0.3 * noise[0],
                        0.9 * state[1] + 0.3 * noise[1],
                        noise[2],
                        noise[3],
                    ]
                )
                reward = float(state[0]) if kind == "mdp" else action + 0.1 * float(noise[4])
            states.append(state)
            actions.append(action)
            next_states.append(following)
            rewards.append(reward)
            state = following
    step = torch.arange(length).repeat(episodes)
    terminal = (step == length - 1).float()
    next_mask = (1.0 - terminal).unsqueeze(1).expand(-1, 4).contiguous()
    return Transitions(
        state=torch.stack(states),
        action=torch.nn.functional.one_hot(torch.tensor(actions), 2).float(),
        next_state=torch.stack(next_states) * next_mask,
        next_mask=next_mask,
        reward=torch.tensor(rewards),
        terminal=terminal,
        episode=torch.arange(episodes).repeat_interleave(length),
        step=step,
        groups=input_groups(["0", "1", "2", "3"], 2),
    )


def verdicts(result: dict) -> dict[str, str]:
    return {check["name"]: check["verdict"] for check in result["checks"]}


@pytest.fixture(scope="module")
def mdp_result() -> dict:
    """The checks on the true MDP, made once for the tests that read them."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return MdpAnalysis(WorldModelConfig(**FAST), synthetic("mdp"), seed=0).run()
    finally:
        torch.set_num_threads(before)


def test_a_true_mdp_passes_and_its_noise_features_rank_last(mdp_result):
    result = mdp_result

    assert verdicts(result) == {
        "actions_predict_transitions": "yes",
        "state_predicts_next_state": "yes",
        "moved_features_predict_reward": "yes",
        "features_explaining_nothing": "some",
    }
    assert result["action_moved_features"] == ["0"]
    assert {row["feature"] for row in result["feature_importance"][-2:]} == {"2", "3"}
    assert sorted(result["checks"][3]["numbers"]["features"]) == ["2", "3"]


def test_a_bandit_has_no_sequential_structure():
    result = MdpAnalysis(WorldModelConfig(**FAST), synthetic("bandit"), seed=0).run()

    found = verdicts(result)
    assert found["actions_predict_transitions"] == "no"
    assert found["state_predicts_next_state"] == "no"
    assert found["moved_features_predict_reward"] == "not assessed"
    assert "contextual bandit" in result["checks"][1]["finding"]


def test_a_reward_of_the_action_alone_is_flagged():
    result = MdpAnalysis(WorldModelConfig(**FAST), synthetic("action_reward"), seed=0).run()

    found = verdicts(result)
    assert found["actions_predict_transitions"] == "yes"
    assert found["moved_features_predict_reward"] == "no"
    assert "a bandit, not RL" in result["checks"][2]["finding"]
    action = next(row for row in result["feature_importance"] if row["feature"] == "action")
    # The reward is the action plus noise of 0.1: the action explains 1 / (1 + 4 * 0.01) of
    # its variance, 0.96; masked, the model loses about that share.
    assert 0.9 < action["reward"].value < 1.0


@pytest.mark.slow
def test_the_recurrent_model_reaches_the_same_verdicts():
    config = WorldModelConfig(**{**FAST, "model": "gru", "minibatch_size": 16})
    result = MdpAnalysis(config, synthetic("mdp", episodes=60), seed=0).run()

    assert verdicts(result)["actions_predict_transitions"] == "yes"
    assert verdicts(result)["moved_features_predict_reward"] == "yes"


def two_gaussians_entropy(weight: float, means: tuple[float, float], std: float) -> float:
    """The differential entropy (nats) of the mixture, by the trapezoid rule on a fine grid."""
    grid = torch.linspace(-12.0, 12.0, 200_001, dtype=torch.float64)
    density = sum(
        share * torch.exp(-0.5 * ((grid - mean) / std) ** 2) / (std * math.sqrt(2 * math.pi))
        for share, mean in zip((weight, 1 - weight), means, strict=True)
    )
    integrand = torch.where(density > 0, -density * torch.log(density), 0.0)
    return float(torch.trapezoid(integrand, grid))


def test_the_mixture_density_fits_two_gaussians_to_their_entropy():
    """The next state is drawn from 0.3 N(-2, 0.5^2) + 0.7 N(1.5, 0.5^2), whatever the state
    and action: fitted on 4,000 rows, the held-out negative log-likelihood of 2,000 others must
    be within 5% of the mixture's entropy (a single Gaussian's best, the entropy of one with
    the mixture's variance, is 27% above it)."""
    generator = torch.Generator().manual_seed(0)
    rows = 6000
    component = torch.rand(rows, generator=generator) < 0.3
    center = torch.where(component, -2.0, 1.5)
    following = (center + 0.5 * torch.randn(rows, generator=generator)).unsqueeze(1)
    data = Transitions(
        state=torch.randn(rows, 1, generator=generator),
        action=torch.nn.functional.one_hot(torch.randint(2, (rows,), generator=generator)).float(),
        next_state=following,
        next_mask=torch.ones(rows, 1),
        reward=torch.zeros(rows),
        terminal=torch.zeros(rows),
        episode=torch.arange(rows),
        step=torch.zeros(rows, dtype=torch.long),
        groups=input_groups(["0"], 2),
    )
    fitter = ModelFitter(WorldModelConfig(epochs=30, min_updates=1, layers=[32, 32]), data)
    model = fitter.fit(torch.arange(4000), torch.zeros(3, dtype=torch.bool), seed=0)
    nll = float(fitter.losses(model, torch.arange(4000, rows)).next_state.mean())

    entropy = two_gaussians_entropy(0.3, (-2.0, 1.5), 0.5)
    variance = 0.25 + 0.3 * 0.7 * 3.5**2
    assert 0.5 * math.log(2 * math.pi * math.e * variance) > 1.25 * entropy
    assert abs(nll - entropy) < 0.05 * entropy, (nll, entropy)


def test_the_report_shows_every_check_and_the_importance_chart(mdp_result, tmp_path):
    result = plain(mdp_result)

    text = report_text(result)
    chart = importance_chart(result)

    for check in result["checks"]:
        assert check["question"] in text
    assert "feature  transition (nats)" in text
    assert chart.png.startswith(b"\x89PNG")
    # A bar row per feature: the chart grows with them.
    assert chart.height >= 20 * len(result["feature_importance"])
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "mdp_check.json").write_text(json.dumps(result))
    section = mdp_section(RunFolder(tmp_path))
    assert section.absent is None
    for check in result["checks"]:
        assert html.escape(check["question"]) in section.body
    assert section.body.count("data:image/png;base64,") == 1


def test_the_report_section_says_how_to_get_an_analysis_where_a_run_has_none(tmp_path):
    section = mdp_section(RunFolder(tmp_path))
    assert "horizon check-mdp" in section.absent


def test_fewer_episodes_than_folds_is_an_error_naming_the_option():
    with pytest.raises(HorizonError, match=r"\[analysis\] folds = 3, but the timeline holds 2"):
        MdpAnalysis(WorldModelConfig(**FAST), synthetic("mdp", episodes=2), seed=0)
