"""The CPE estimators as components: what they make of the core's ``EvaluationEpisodes``.

Small hand-made episodes (discrete and parametric actions, with logged metrics) go through the
``[[evaluation]]`` components of ``horizon_plugins_cpe``; the figures are checked against numpy
written out here, the options they resolve (the trainer's discount, the run's seed) and the
models they share. Continuous actions are not applicable, with the reason recorded. The
formulas themselves are tested on their own (helper-9's tests); this file checks the wiring.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from horizon_engine import (
    ActionType,
    Discounts,
    Estimate,
    EvaluationEpisodes,
    EvaluationModels,
    HorizonError,
    NotApplicable,
    OffersEvaluationModels,
    PolicyOutput,
    TimelineTensors,
)
from horizon_engine.config import Choice
from horizon_engine.evaluation import EpisodeEvaluation, epoch_metric_values
from horizon_engine.plugins import get_plugin_host
from horizon_plugins_cpe import estimators as cpe
from horizon_plugins_cpe.estimators import ESTIMATORS, CpeConfig, cpe_inputs

KINDS = ("dm", "ips", "snips", "dr", "sequential_dr", "weighted_dr", "magic")

LENGTHS = (3, 2, 4)
"""Three episodes of these lengths: 9 rows."""


def rows(action_type: ActionType = ActionType.DISCRETE) -> dict[str, torch.Tensor]:
    """Nine rows of three episodes: two state features, two actions (or two candidates with
    one action feature each), logged propensities that differ from row to row."""
    count = sum(LENGTHS)
    episode = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS))
    step = torch.cat([torch.arange(length) for length in LENGTHS])
    state = torch.stack([torch.arange(count, dtype=torch.float32), step.float()], dim=1)
    action = torch.tensor([0, 1, 1, 0, 0, 1, 0, 1, 1])
    vector = torch.zeros(count)
    found = {
        "state": state,
        "state_presence": torch.ones_like(state),
        "next_state": state,
        "next_state_presence": torch.ones_like(state),
        "reward": torch.tensor([1.0, 0.0, 2.0, 1.0, 3.0, 0.0, 1.0, 1.0, 2.0]),
        "not_terminal": vector,
        "time_diff": torch.ones(count),
        "action_probability": torch.tensor([0.5, 0.25, 0.75, 0.5, 0.4, 0.6, 0.5, 0.3, 0.7]),
        "episode_id": episode,
        "step": step,
    }
    if action_type is ActionType.DISCRETE:
        mask = torch.ones(count, 2)
        mask[4] = 0.0  # a row that recorded no possible actions: every action is possible
        found |= {
            "action": action,
            "next_action": torch.full((count,), -1),
            "possible_actions": mask,
            "possible_next_actions": torch.ones(count, 2),
        }
    else:
        # Candidates with features 10 and 20, the second row's in the other order, so the
        # logged action's slot is not its index; the fourth row has a third candidate.
        candidates = torch.tensor([[10.0], [20.0], [0.0]]).repeat(count, 1, 1)
        candidates[1] = torch.tensor([[20.0], [10.0], [0.0]])
        real = torch.tensor([1.0, 1.0, 0.0]).repeat(count, 1)
        candidates[3, 2, 0] = 30.0
        real[3, 2] = 1.0
        logged = torch.tensor([[10.0], [20.0]])[action]
        found |= {
            "action": logged,
            "action_presence": torch.ones_like(logged),
            "next_action": torch.zeros_like(logged),
            "next_action_presence": torch.zeros_like(logged),
            "possible_actions": real,
            "possible_action_features": candidates,
            "possible_action_presence": torch.ones_like(candidates),
            "possible_next_actions": real,
            "possible_next_action_features": candidates,
            "possible_next_action_presence": torch.ones_like(candidates),
        }
    return found


def target(count: int, width: int) -> torch.Tensor:
    """An evaluated policy's probabilities: different on every row, summing to 1."""
    first = torch.linspace(0.1, 0.9, count)
    probabilities = torch.zeros(count, width)
    probabilities[:, 0], probabilities[:, 1] = first, 1.0 - first
    return probabilities


def episodes_of(
    action_type: ActionType = ActionType.DISCRETE,
    metrics: dict[str, torch.Tensor] | None = None,
    discount: float | None = None,
    seed: int | None = None,
) -> EvaluationEpisodes:
    data = TimelineTensors(**rows(action_type))
    count = len(data)
    if action_type is ActionType.CONTINUOUS:
        policy = PolicyOutput(action_type, action=torch.zeros(count, 1))
    else:
        probabilities = target(count, 2 if action_type is ActionType.DISCRETE else 3)
        policy = PolicyOutput(
            action_type, probabilities.argmax(dim=1), probabilities.clone(), probabilities
        )
    starts = torch.tensor([0, *np.cumsum(LENGTHS)])
    return EvaluationEpisodes(
        action_type, data, starts, policy, metrics or {}, discount=discount, seed=seed
    )


def estimator(kind: str, **options: Any) -> cpe.CpeEstimator:
    cls = next(cls for cls in ESTIMATORS if cls.name == kind)
    return cls(CpeConfig(**options))


def weights_and_rewards(episodes: EvaluationEpisodes, slots: list[int]) -> tuple:
    data = episodes.data
    probability = episodes.policy.probabilities.double()[torch.arange(len(data)), slots]
    return (probability / data.action_probability.double()).numpy(), data.reward.double().numpy()


def test_the_inputs_are_the_episodes_rows_in_order_with_every_metric():
    clicks = torch.arange(9, dtype=torch.float32)
    episodes = episodes_of(metrics={"clicks": clicks, "reward": episodes_of().data.reward})
    inputs, _ = cpe_inputs(episodes)

    # A logged metric named "reward" equal to the reward is the reward: not estimated twice.
    assert inputs.metric_names == ("reward", "clicks")
    assert inputs.rewards.dtype == np.float64
    assert inputs.rewards[:, 1].tolist() == clicks.tolist()
    assert inputs.episode_starts.tolist() == [0, 3, 5, 9]
    assert inputs.action.tolist() == episodes.data.action.tolist()
    assert inputs.logged_propensity.tolist() == pytest.approx(
        episodes.data.action_probability.tolist()
    )
    assert inputs.target_probabilities.shape == (9, 2)
    assert inputs.possible.all(), "row 4 recorded no possible actions: all are possible"
    assert inputs.features.shape == (9, 4)  # values and presence
    assert "sequence_number 1" in inputs.row_label(1)


def test_a_metric_named_reward_that_is_not_the_reward_keeps_its_own_name():
    other = torch.ones(9)
    inputs, _ = cpe_inputs(episodes_of(metrics={"reward": other}))
    assert inputs.metric_names == ("reward", "metrics.reward")


def test_ips_of_discrete_actions_is_the_mean_weighted_reward_relative_to_the_logged_mean():
    episodes = episodes_of()
    weights, reward = weights_and_rewards(episodes, episodes.data.action.tolist())

    found = estimator("ips", num_bootstrap=50).estimate(episodes)

    estimate = found["reward"]
    assert isinstance(estimate, Estimate)
    assert estimate.value == pytest.approx((weights * reward).mean(), abs=1e-9)
    assert estimate.logged_value == pytest.approx(reward.mean(), abs=1e-9)
    assert estimate.relative == pytest.approx(estimate.value / estimate.logged_value)
    assert estimate.low <= estimate.value <= estimate.high
    assert estimate.effective_sample_size == pytest.approx(weights.sum() ** 2 / (weights**2).sum())


def test_parametric_actions_are_weighted_by_the_logged_candidates_slot():
    episodes = episodes_of(ActionType.PARAMETRIC)
    # The logged feature 10 is slot 0 and 20 slot 1, but for row 1, whose candidates are
    # listed the other way round.
    slots = [0, 0, 1, 0, 0, 1, 0, 1, 1]
    assert cpe_inputs(episodes)[0].action.tolist() == slots
    weights, reward = weights_and_rewards(episodes, slots)

    found = estimator("snips", num_bootstrap=0).estimate(episodes)

    assert found["reward"].value == pytest.approx((weights * reward).sum() / weights.sum())
    assert found["reward"].low is None and found["reward"].high is None


def test_a_parametric_row_whose_logged_action_is_no_candidate_is_named():
    episodes = episodes_of(ActionType.PARAMETRIC)
    episodes.data.action[2] = 99.0
    with pytest.raises(
        HorizonError, match=r"1 of 9 eval rows log an action that is none .* sequence_number 2\)"
    ):
        cpe_inputs(episodes)


def test_a_parametric_row_offering_no_candidates_is_its_logged_action_with_weight_1():
    """Horizon's parametric logs end episodes with rows whose candidate list is empty: no
    choice was made there, so the row counts as the logged action under both policies."""
    episodes = episodes_of(ActionType.PARAMETRIC)
    episodes.data.possible_actions[4] = 0.0
    propensity_before = episodes.data.action_probability.clone()

    inputs, note = cpe_inputs(episodes)

    assert note == (
        "1 of 9 eval rows offered no candidates (nothing was chosen there, as on Horizon's "
        "last rows of an episode): each is taken as its logged action, weight 1"
    )
    assert inputs.action[4] == 0 and inputs.possible[4, 0]
    assert inputs.logged_propensity[4] == 1.0
    assert inputs.target_probabilities[4].tolist() == [1.0, 0.0, 0.0]
    assert torch.equal(episodes.data.action_probability, propensity_before)
    found = estimator("ips", num_bootstrap=0).estimate(episodes)
    assert note in found["reward"].note


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_estimates_every_metric(kind):
    clicks = torch.tensor([0.0, 1.0, 0.0, 2.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    component = estimator(kind, num_bootstrap=20)
    found = component.estimate(episodes_of(metrics={"clicks": clicks}, discount=0.9, seed=4))

    assert list(found) == ["reward", "clicks"]
    for estimate in found.values():
        assert isinstance(estimate, Estimate)
        assert np.isfinite(estimate.value)
        assert estimate.low is not None and estimate.high is not None
    assert component.details["gamma"] == 0.9
    assert component.details["gamma_from"] == "trainer"
    assert component.details["seed"] == 4
    assert component.details["metrics"] == ["reward", "clicks"]


def test_gamma_is_the_entrys_then_the_trainers_then_one():
    episodes = episodes_of(discount=0.8)
    given = estimator("sequential_dr", gamma=0.5, num_bootstrap=0)
    given.estimate(episodes)
    assert (given.details["gamma"], given.details["gamma_from"]) == (0.5, "config")
    default = estimator("sequential_dr", num_bootstrap=0)
    default.estimate(episodes_of())
    assert (default.details["gamma"], default.details["gamma_from"]) == (1.0, "default")
    assert default.details["seed"] == 0


def test_estimators_of_one_epoch_fit_each_model_once(monkeypatch):
    from horizon_plugins_cpe import models

    calls = []
    for name in ("reward_model_values", "q_model_values"):
        real = getattr(models, name)

        def counted(inputs, options, real=real, name=name):
            calls.append(name)
            return real(inputs, options)

        monkeypatch.setattr(models, name, counted)
    episodes = episodes_of()
    for kind in KINDS:
        estimator(kind, num_bootstrap=0).estimate(episodes)
    assert sorted(calls) == ["q_model_values", "reward_model_values"]
    # Another policy output (the next epoch's) is another evaluation.
    replaced = EvaluationEpisodes(
        episodes.action_type,
        episodes.data,
        episodes.episode_starts,
        PolicyOutput(ActionType.DISCRETE, episodes.policy.action, None, target(9, 2)),
        episodes.metrics,
    )
    estimator("dr", num_bootstrap=0).estimate(replaced)
    assert calls.count("reward_model_values") == 2


def test_continuous_actions_are_not_applicable_with_the_reason():
    with pytest.raises(NotApplicable, match="continuous actions"):
        estimator("dr").estimate(episodes_of(ActionType.CONTINUOUS))


class FixedPolicyTrainer:
    """What ``EpisodeEvaluation`` asks of a trainer, for a policy module fixed here."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def policy(self) -> torch.nn.Module:
        return self.module

    def discount(self) -> float | None:
        return 0.9


class Scores(torch.nn.Module):
    def forward(self, values: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
        return torch.stack([values[:, 0], -values[:, 0]], dim=1)


class Action(torch.nn.Module):
    def forward(self, values: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
        return values[:, :1]


def choices(*kinds: str) -> list[Choice]:
    host = get_plugin_host()
    return [
        Choice(
            "evaluation",
            host.component("estimators", kind),
            CpeConfig(num_bootstrap=10),
            host.sections()["evaluation"],
        )
        for kind in kinds
    ]


def test_the_core_records_a_not_applicable_entry_and_keeps_the_others(tmp_path):
    data = TimelineTensors(**rows())
    data.action = torch.zeros(9, 1)  # continuous: the action as features
    data.action_presence = torch.ones(9, 1)
    data.possible_actions = data.possible_next_actions = None
    evaluation = EpisodeEvaluation(
        choices("dr", "logged_value"),
        ActionType.CONTINUOUS,
        data,
        {},
        seed=0,
        epochs_file=tmp_path / "cpe_epochs.json",
    )

    metrics = evaluation.epoch_metrics(FixedPolicyTrainer(Action()))

    assert "dr" not in evaluation.epochs[0]["estimates"]
    assert "CPE/logged_value/reward_per_episode" in metrics
    entries = evaluation.entries()
    assert "continuous actions" in entries["dr"]["not_applicable"]
    assert "not_applicable" not in entries["logged_value"]
    assert (tmp_path / "cpe_epochs.json").is_file()


class PolicyOnlyTrainer:
    """A trainer with none of the optional capabilities: neither ``OffersEvaluationModels``
    nor ``Discounts``."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def policy(self) -> torch.nn.Module:
        return self.module


def test_a_trainer_without_capabilities_is_evaluated_without_models_or_discount():
    evaluation = EpisodeEvaluation(
        choices("ips"), ActionType.DISCRETE, TimelineTensors(**rows()), {}, seed=0
    )
    trainer = PolicyOnlyTrainer(Scores())
    assert not isinstance(trainer, OffersEvaluationModels | Discounts)

    results = evaluation.run(trainer)

    assert "reward" in results["ips"]


def test_epoch_metrics_are_relative_values_by_metric_and_estimator_and_the_raw_ones():
    evaluation = EpisodeEvaluation(
        choices("ips", "ips"), ActionType.DISCRETE, TimelineTensors(**rows()), {}, seed=0
    )
    results = evaluation.run(FixedPolicyTrainer(Scores()))
    metrics = epoch_metric_values(results)

    assert sorted(metrics) == [
        "CPE/reward/ips[0]",
        "CPE/reward/ips[0]/raw",
        "CPE/reward/ips[1]",
        "CPE/reward/ips[1]/raw",
    ]
    estimate = results["ips[0]"]["reward"]
    assert metrics["CPE/reward/ips[0]"] == estimate.relative
    assert metrics["CPE/reward/ips[0]/raw"] == estimate.value
    assert evaluation.entries()["ips[0]"]["details"]["gamma"] == 0.9


def test_an_estimate_near_a_zero_logged_value_has_no_relative_value_and_says_why():
    episodes = episodes_of()
    episodes.data.reward.zero_()
    estimate = estimator("ips", num_bootstrap=0).estimate(episodes)["reward"]
    assert estimate.relative is None
    assert estimate.note
    assert epoch_metric_values({"ips": {"reward": estimate}})["CPE/reward/ips"] == estimate.value


def test_the_sequential_q_is_the_policys_scores_when_the_trainer_has_a_discount():
    from horizon_plugins_cpe.formulas import CpeOptions, ModelValues, estimate

    clicks = torch.tensor([0.0, 1.0, 0.0, 2.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    episodes = episodes_of(metrics={"clicks": clicks}, discount=0.9)
    inputs, _ = cpe_inputs(episodes)
    scores = episodes.policy.scores.double().numpy()
    logged = scores[np.arange(9), inputs.action]
    expected = (scores * inputs.target_probabilities).sum(axis=1)

    component = estimator("weighted_dr", num_bootstrap=0)
    found = component.estimate(episodes)

    assert component.details["q_model"] == "scores"
    reward_only = dataclasses.replace(
        inputs, rewards=inputs.rewards[:, :1], metric_names=("reward",)
    )
    models = ModelValues(logged[:, None], expected[:, None])
    wanted = estimate("weighted_dr", reward_only, models, CpeOptions(gamma=0.9, num_bootstrap=0))
    assert found["reward"].value == pytest.approx(wanted["reward"].value, abs=1e-12)
    # Without the trainer's discount (or with another gamma), or when told, Q is fitted.
    for episodes, options in [
        (episodes_of(), {}),
        (episodes_of(discount=0.9), {"gamma": 0.5}),
        (episodes_of(discount=0.9), {"q_model": "fqe"}),
    ]:
        component = estimator("magic", num_bootstrap=0, **options)
        component.estimate(episodes)
        assert component.details["q_model"] == "fqe"


def test_the_sequential_q_is_fitted_on_the_trainers_hidden_layer_when_it_offers_one():
    from horizon_plugins_cpe.formulas import CpeOptions, estimate
    from horizon_plugins_cpe.models import q_model_values

    clicks = torch.tensor([0.0, 1.0, 0.0, 2.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    episodes = episodes_of(metrics={"clicks": clicks}, discount=0.9)
    torch.manual_seed(0)
    hidden = torch.nn.Sequential(torch.nn.Linear(episodes.data.state.shape[1], 3), torch.nn.Tanh())
    episodes.models = EvaluationModels(q_features=lambda values, presence: hidden(values))
    inputs, _ = cpe_inputs(episodes)
    options = CpeOptions(gamma=0.9, num_bootstrap=0)
    with torch.no_grad():
        features = hidden(episodes.data.state).double().numpy()

    component = estimator("weighted_dr", num_bootstrap=0)
    found = component.estimate(episodes)

    assert component.details["q_model"] == "network_fqe"
    wanted = estimate("weighted_dr", inputs, q_model_values(inputs, options, features), options)
    for name in ("reward", "clicks"):
        assert found[name].value == pytest.approx(wanted[name].value, abs=1e-12)
    # Told otherwise, the entry takes the scores or FQE on the state features.
    for q_model, used in [("scores", "scores"), ("fqe", "fqe")]:
        component = estimator("magic", num_bootstrap=0, q_model=q_model)
        component.estimate(episodes)
        assert component.details["q_model"] == used


def test_the_shared_inputs_go_with_the_epochs_policy_output():
    import gc

    episodes = episodes_of()
    estimator("ips", num_bootstrap=0).estimate(episodes)
    assert any(entry.matches(episodes) for entry in cpe._PREPARED)
    del episodes
    gc.collect()
    assert not any(entry.policy is not None for entry in cpe._PREPARED)


def test_an_epochs_inputs_take_the_splits_part_built_once_and_their_own_policy():
    episodes = episodes_of(ActionType.PARAMETRIC)
    first, note = cpe_inputs(episodes)
    probabilities = target(len(episodes.data), 3).flip(1)
    next_epoch = dataclasses.replace(
        episodes,
        policy=PolicyOutput(
            episodes.action_type, probabilities.argmax(dim=1), probabilities, probabilities
        ),
    )
    second, second_note = cpe_inputs(next_epoch)
    assert second.rewards is first.rewards and second.features is first.features
    assert second.logged_propensity is first.logged_propensity and second_note == note
    cpe._SPLITS.clear()
    fresh, _ = cpe_inputs(next_epoch)
    assert fresh.rewards is not first.rewards
    for name in ("rewards", "features", "logged_propensity", "possible", "target_probabilities"):
        assert np.array_equal(getattr(fresh, name), getattr(second, name))
    assert not np.array_equal(first.target_probabilities, second.target_probabilities)
