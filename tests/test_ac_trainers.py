"""The actor-critic trainers (``sac``, ``td3``, ``ddpg``): the squashed log-density, policies
in the user's units, target updates, checkpoints, exploration, and the inverse of the
``continuous_action`` normalization they rely on."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from horizon_engine import ForeachAdam, InvertiblePreprocessing
from horizon_engine.errors import HorizonError
from horizon_engine.normalization import NormalizationParameters
from horizon_engine.preprocessor import build_preprocessor
from horizon_engine.schema import ActionType
from horizon_engine.training import TrainingProblem
from horizon_plugins_ac import (
    DdpgConfig,
    DdpgTrainer,
    SacConfig,
    SacTrainer,
    Td3Config,
    Td3Trainer,
)
from horizon_plugins_ac.networks import GaussianActor, squashed_log_density

torch.set_num_threads(1)

TRAINERS = {
    "sac": (SacTrainer, SacConfig),
    "td3": (Td3Trainer, Td3Config),
    "ddpg": (DdpgTrainer, DdpgConfig),
}
STATE_FEATURES = 3
LOW, HIGH = -2.0, 2.0
"""The logged actions' range, as Pendulum's."""


def problem(
    action_dims: int = 1, seed: int = 0, low: float = LOW, high: float = HIGH
) -> TrainingProblem:
    state_ids = [str(index) for index in range(STATE_FEATURES)]
    state = build_preprocessor(
        state_ids,
        {
            i: NormalizationParameters(feature_type="continuous", mean=0.0, stddev=2.0)
            for i in state_ids
        },
    )
    action_ids = [str(STATE_FEATURES + index) for index in range(action_dims)]
    action = build_preprocessor(
        action_ids,
        {
            i: NormalizationParameters(
                feature_type="continuous_action", min_value=low, max_value=high
            )
            for i in action_ids
        },
    )
    return TrainingProblem(
        action_type=ActionType.CONTINUOUS,
        actions=[],
        state_preprocessor=state,
        state_width=STATE_FEATURES,
        action_preprocessor=action,
        action_width=action_dims,
        device=torch.device("cpu"),
        seed=seed,
    )


def trainer(kind: str, action_dims: int = 1, seed: int = 0, **options: object):
    cls, config = TRAINERS[kind]
    built = cls(config(layers=[32, 32], **options))
    built.setup(problem(action_dims, seed))
    return built


def batch(rows: int = 64, action_dims: int = 1, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    state = torch.randn(rows, STATE_FEATURES, generator=generator)
    action = torch.rand(rows, action_dims, generator=generator) * (HIGH - LOW) + LOW
    ones = torch.ones_like
    return {
        "state": state,
        "state_presence": ones(state),
        "next_state": state + 0.1,
        "next_state_presence": ones(state),
        "action": action,
        "action_presence": ones(action),
        "next_action": action,
        "next_action_presence": ones(action),
        "reward": -(state**2).sum(dim=1),
        "not_terminal": (torch.arange(rows) % 10 != 9).float(),
        "time_diff": torch.ones(rows),
        "action_probability": torch.ones(rows),
        "episode_id": torch.arange(rows) // 10,
        "step": torch.arange(rows) % 10,
    }


# --- the continuous_action inverse ---------------------------------------------------------


def test_continuous_action_preprocessor_inverts_to_the_users_units_in_input_order():
    parameters = {
        "9": NormalizationParameters(
            feature_type="continuous_action", min_value=-2.0, max_value=2.0
        ),
        "10": NormalizationParameters(
            feature_type="continuous_action", min_value=0.0, max_value=10.0
        ),
    }
    preprocessor = build_preprocessor(["10", "9"], parameters)
    raw = torch.tensor([[3.0, 1.5], [10.0, -2.0], [0.0, 0.0]])
    normalized = preprocessor(raw, torch.ones_like(raw))
    assert isinstance(preprocessor, InvertiblePreprocessing)
    torch.testing.assert_close(preprocessor.inverse(normalized), raw)
    # The ends of (-1, 1), and beyond, land on the logged range's ends: the input is in
    # output order ("9", then "10"), the result in the preprocessor's ("10", then "9").
    ends = preprocessor.inverse(torch.tensor([[1.0, -1.0], [5.0, -5.0]]))
    assert ends.tolist() == [[0.0, 2.0], [0.0, 2.0]]


def test_a_state_preprocessor_has_no_inverse():
    """Whether a preprocessor inverts is its type: an actor-critic refuses one without."""
    parameters = {"0": NormalizationParameters(feature_type="continuous", mean=0.0, stddev=1.0)}
    preprocessor = build_preprocessor(["0"], parameters)
    assert not isinstance(preprocessor, InvertiblePreprocessing)
    assert not hasattr(preprocessor, "inverse")


# --- the squashed Gaussian -----------------------------------------------------------------


def test_squashed_log_density_matches_torch_distributions():
    mean, log_std = torch.tensor([[0.3, -1.2]]), torch.tensor([[-0.5, 0.4]])
    pre_tanh = torch.tensor([[0.1, -4.0], [2.5, 0.0], [-7.0, 9.0]])
    expected = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()),
        [torch.distributions.TanhTransform()],
    ).log_prob(torch.tanh(pre_tanh).double().clamp(-1 + 1e-15, 1 - 1e-15).float())
    found = squashed_log_density(pre_tanh, mean, log_std)
    # torch's own loses precision where tanh saturates (it inverts tanh(9)); compare elsewhere.
    torch.testing.assert_close(found[:2], expected.sum(dim=1)[:2], rtol=1e-4, atol=1e-4)
    assert torch.isfinite(found).all()


def test_squashed_density_integrates_to_one_over_the_action_range():
    """A numerical check: exp(log-density) of a = tanh(u), integrated over a in (-1, 1) on a
    fine grid (in u, times da/du), is 1; and the histogram of draws follows it."""
    mean, log_std = torch.tensor([[0.7]]), torch.tensor([[0.2]])
    u = torch.linspace(-12.0, 12.0, 200_001, dtype=torch.float64).unsqueeze(1)
    density = squashed_log_density(u, mean.double(), log_std.double()).exp()
    da_du = 1.0 - torch.tanh(u.squeeze(1)) ** 2
    total = torch.trapezoid(density * da_du, u.squeeze(1))
    assert abs(float(total) - 1.0) < 1e-6
    # The probability of a < 0.5 by the density equals the share of draws below it.
    generator = torch.Generator().manual_seed(0)
    draws = torch.tanh(mean + log_std.exp() * torch.randn(200_000, 1, generator=generator))
    below = u.squeeze(1) < math.atanh(0.5)
    mass = torch.trapezoid((density * da_du)[below], u.squeeze(1)[below])
    assert abs(float(mass) - float((draws < 0.5).double().mean())) < 0.005


def test_gaussian_actor_sample_log_density_is_its_draws():
    torch.manual_seed(0)
    actor = GaussianActor(3, 2, [16])
    state = torch.randn(5, 3)
    action, log_density = actor.sample(state)
    mean, log_std = actor(state)
    expected = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()), [torch.distributions.TanhTransform()]
    ).log_prob(action)
    torch.testing.assert_close(log_density, expected.sum(dim=1), rtol=1e-3, atol=1e-3)
    assert action.abs().max() < 1


# --- policies ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(TRAINERS))
def test_policy_acts_in_the_users_units(kind):
    built = trainer(kind, action_dims=2)
    for _ in range(3):
        built.train_step(batch(action_dims=2))
    policy = built.policy()
    state = torch.randn(200, STATE_FEATURES) * 5
    out = policy(state, torch.ones_like(state))
    action = out[0] if kind == "sac" else out
    assert action.shape == (200, 2)
    assert action.min() >= LOW and action.max() <= HIGH
    # The same action as the actor's normalized one, mapped from (-1, 1) to [-2, 2].
    normalized = built.greedy_action(built.preprocessor(state, torch.ones_like(state)))
    torch.testing.assert_close(action, normalized * 2.0, rtol=1e-5, atol=1e-5)
    assert not any(parameter.requires_grad for parameter in policy.parameters())


def test_sac_policy_gives_the_mean_action_and_its_density_in_the_users_units():
    built = trainer("sac")
    state = torch.randn(7, STATE_FEATURES)
    action, log_density = built.policy()(state, torch.ones_like(state))
    mean, log_std = built.actor(built.preprocessor(state, torch.ones_like(state)))
    torch.testing.assert_close(action, torch.tanh(mean) * 2.0)
    # The density over [-2, 2] is the one over (-1, 1) divided by the slope 2.
    expected = squashed_log_density(mean, mean, log_std) - math.log(2.0)
    torch.testing.assert_close(log_density, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", list(TRAINERS))
def test_exploration_policy_explores_within_the_bounds(kind):
    built = trainer(kind, exploration_noise=0.5) if kind != "sac" else trainer(kind)
    explore = built.exploration_policy()
    state = torch.zeros(500, STATE_FEATURES)
    torch.manual_seed(1)
    action = explore(state, torch.ones_like(state))
    assert action.shape == (500, 1)
    assert action.min() >= LOW and action.max() <= HIGH
    assert action.std() > 0.1  # noisy, where the policy gives one action for these states
    greedy = built.policy()(state, torch.ones_like(state))
    greedy = greedy[0] if kind == "sac" else greedy
    assert greedy.std() < 1e-6


def test_ornstein_uhlenbeck_noise_is_correlated_and_restarts_at_every_reset():
    built = trainer("ddpg", noise="ou", exploration_noise=0.2)
    explore = built.exploration_policy()
    state = torch.zeros(1, STATE_FEATURES)
    base = built.policy()(state, torch.ones_like(state))
    torch.manual_seed(0)
    path = torch.cat([explore(state, torch.ones_like(state)) - base for _ in range(2000)])[:, 0]
    lag_one = torch.corrcoef(torch.stack([path[:-1], path[1:]]))[0, 1]
    assert lag_one > 0.7  # 1 - theta = 0.85 for the process itself
    # A fresh module (the gym runner refreshes its acting module) carries the process on.
    carried = built.exploration_policy().process.value
    assert carried is not None and torch.equal(carried, explore.process.value)
    explore.reset()
    assert built.exploration_policy().process.value is None
    first = explore(state, torch.ones_like(state)) - base
    assert first.abs().max() < 1.0  # one draw of sigma 0.2 (x 2 in user units) from 0


# --- updates -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(TRAINERS))
def test_targets_follow_the_trained_networks_by_tau(kind):
    built = trainer(kind, target_update_rate=0.1)
    before = [p.clone() for p in built.target_critics.parameters()]
    actor_before = (
        [p.clone() for p in built.actor_target.parameters()] if built.actor_target else []
    )
    metrics = built.train_step(batch())
    assert math.isfinite(metrics["critic_loss"])
    for old, new, trained in zip(
        before, built.target_critics.parameters(), built.critics.parameters(), strict=True
    ):
        torch.testing.assert_close(new, old + 0.1 * (trained - old))
    if kind == "td3":  # the actor (and its target) waits for the second step
        assert "actor_loss" not in metrics
        kept = zip(actor_before, built.actor_target.parameters(), strict=True)
        assert all(torch.equal(a, b) for a, b in kept)
        metrics = built.train_step(batch(seed=1))
    assert "actor_loss" in metrics
    if built.actor_target is not None:
        moved = zip(actor_before, built.actor_target.parameters(), strict=True)
        assert not all(torch.equal(a, b) for a, b in moved)


def test_ddpg_has_one_critic_td3_and_sac_two():
    assert len(trainer("ddpg").critics) == 1
    assert len(trainer("td3").critics) == 2
    assert len(trainer("sac").critics) == 2


def test_sac_tunes_its_temperature_towards_the_target_entropy():
    built = trainer("sac", target_entropy=-5.0)  # far below the initial entropy: alpha falls
    alphas = [built.train_step(batch(seed=step))["alpha"] for step in range(20)]
    assert alphas[-1] < alphas[0] < 1.0
    fixed = trainer("sac", learn_alpha=False, alpha=0.3)
    assert fixed.train_step(batch())["alpha"] == pytest.approx(0.3)


@pytest.mark.parametrize("kind", list(TRAINERS))
def test_bc_and_cql_options_add_their_losses(kind):
    built = trainer(kind, bc_weight=0.4, cql_alpha=1.0, cql_samples=4)
    metrics = {}
    for step in range(2):
        metrics.update(built.train_step(batch(seed=step)))
    assert metrics["bc_loss"] >= 0 and math.isfinite(metrics["cql_loss"])
    plain = trainer(kind, bc_weight=0.0)
    metrics = {}
    for step in range(2):
        metrics.update(plain.train_step(batch(seed=step)))
    assert "bc_loss" not in metrics and "cql_loss" not in metrics


@pytest.mark.parametrize(("kind", "from_logs"), [("td3", 0.2), ("ddpg", 0.2), ("sac", 0.0)])
def test_auto_bc_weight_is_the_kinds_from_logs_and_zero_online(kind, from_logs):
    """Named alone, td3 and ddpg keep the actor near logged actions; online, where the agent
    tries its own actions, no kind does; a weight given is kept either way. The weight that
    applied is what the manifest records (``applied_options``)."""
    cls, config = TRAINERS[kind]
    assert config().bc_weight == "auto"
    for online, expected in ((False, from_logs), (True, 0.0)):
        built = cls(config(layers=[8]))
        built.setup(dataclasses.replace(problem(), online=online))
        assert built.bc_weight == expected
        assert built.applied_options()["bc_weight"] == expected
        given = cls(config(layers=[8], bc_weight=0.5))
        given.setup(dataclasses.replace(problem(), online=online))
        assert given.bc_weight == 0.5


def test_behaviour_cloning_alone_learns_the_logged_actions():
    """With the critic's term made negligible (bc_weight large), the actor fits the logged
    action, a function of the state."""
    built = trainer("td3", bc_weight=1000.0, policy_delay=1, actor_learning_rate=3e-3)
    data = batch(rows=256)
    data["action"] = torch.tanh(data["state"][:, :1]) * 1.5
    for _ in range(300):
        built.train_step(data)
    action = built.policy()(data["state"], data["state_presence"])
    assert float((action - data["action"]).abs().mean()) < 0.1


@pytest.mark.parametrize("kind", list(TRAINERS))
def test_state_dict_round_trip_continues_identically(kind):
    first = trainer(kind)
    for step in range(3):
        first.train_step(batch(seed=step))
    state = first.state_dict()
    second = trainer(kind, seed=5)
    second.load_state_dict(state)
    assert second.steps == 3
    probe = torch.randn(9, STATE_FEATURES)
    ones = torch.ones_like(probe)
    one, two = first.policy()(probe, ones), second.policy()(probe, ones)
    torch.testing.assert_close(one, two)
    torch.manual_seed(7)
    after_first = first.train_step(batch(seed=9))
    torch.manual_seed(7)
    after_second = second.train_step(batch(seed=9))
    assert after_first == after_second


def test_checkpoint_of_another_architecture_is_an_error_naming_it():
    state = trainer("td3").state_dict()
    other = TRAINERS["td3"][0](Td3Config(layers=[8]))
    other.setup(problem())
    with pytest.raises(HorizonError, match="does not fit"):
        other.load_state_dict(state)


def test_foreach_adam_equals_torch_adam():
    torch.manual_seed(0)
    first = torch.nn.Linear(4, 3)
    second = torch.nn.Linear(4, 3)
    second.load_state_dict(first.state_dict())
    ours = ForeachAdam(first.parameters(), lr=0.01)
    theirs = torch.optim.Adam(second.parameters(), lr=0.01, foreach=True)
    for step in range(5):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
        for model, optimizer in ((first, ours), (second, theirs)):
            optimizer.zero_grad()
            (model(x) ** 2).sum().backward()
            optimizer.step()
    for mine, torchs in zip(first.parameters(), second.parameters(), strict=True):
        assert torch.equal(mine, torchs)
    restored = ForeachAdam(second.parameters(), lr=0.01)
    restored.load_state_dict(theirs.state_dict())
    assert restored.state[0]["step"] == 5.0


# --- the problem ---------------------------------------------------------------------------


def test_discrete_actions_are_refused():
    discrete = problem()
    discrete.action_type = ActionType.DISCRETE
    with pytest.raises(HorizonError, match="continuous actions"):
        SacTrainer(SacConfig()).setup(discrete)


def test_n_step_must_be_the_datas_window():
    assert Td3Trainer.data_problems(Td3Config(n_step=3), 1, "[timeline]") != {}
    assert Td3Trainer.data_problems(Td3Config(n_step=3), 3, "[timeline]") == {}
    assert Td3Trainer.data_problems(Td3Config(), 3, "[timeline]") == {}
    with pytest.raises(HorizonError, match="n_step = 3"):
        SacTrainer(SacConfig(n_step=3)).setup(replace_n_step(problem(), 1))


def test_n_step_windows_bootstrap_from_the_window_end():
    built = trainer("ddpg", n_step=0, gamma=0.5)
    data = batch(rows=4)
    data["next_n_rewards"] = torch.tensor(
        [[1.0, 1.0, 1.0], [2.0, 4.0, 0.0], [1.0, 0, 0], [1.0, 1, 1]]
    )
    data["next_n_length"] = torch.tensor([3, 2, 1, 3])
    data["next_n_not_terminal"] = torch.tensor([[1.0, 1, 1], [1, 0, 0], [1, 0, 0], [1, 1, 0]])
    data["next_n_time_diffs"] = torch.ones(4, 3)
    returns, discount, state = built.bootstrap(data)
    assert state == "next_n_state"
    assert returns.tolist() == [1.75, 4.0, 1.0, 1.75]
    assert discount.tolist() == [0.125, 0.0, 0.5, 0.0]


def replace_n_step(given: TrainingProblem, n_step: int) -> TrainingProblem:
    given.n_step = n_step
    return given
