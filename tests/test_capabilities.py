"""A trainer's optional capabilities are protocols it implements, checked with ``isinstance``,
and what it offers the estimators is a typed value (``horizon_engine.capabilities``)."""

from __future__ import annotations

import pytest
import torch

from horizon_engine import (
    AnalyzesData,
    Discounts,
    EvaluationModels,
    ExploresOnline,
    OffersEvaluationModels,
    TrainerBase,
    TrainingProblem,
)
from horizon_plugins_ac.trainer import DeterministicActorCritic, SacTrainer
from horizon_plugins_dqn.parametric import ParametricDqnTrainer
from horizon_plugins_dqn.trainer import DqnTrainer
from horizon_plugins_worldmodel.trainer import WorldModelTrainer

CAPABILITIES = (AnalyzesData, ExploresOnline, OffersEvaluationModels, Discounts)


def capabilities(trainer_class: type) -> set[str]:
    return {protocol.__name__ for protocol in CAPABILITIES if issubclass(trainer_class, protocol)}


@pytest.mark.parametrize(
    ("trainer_class", "expected"),
    [
        (TrainerBase, set()),
        (DqnTrainer, {"OffersEvaluationModels", "Discounts"}),
        (ParametricDqnTrainer, {"Discounts"}),
        (SacTrainer, {"ExploresOnline", "Discounts"}),
        (DeterministicActorCritic, {"ExploresOnline", "Discounts"}),
        (WorldModelTrainer, {"AnalyzesData"}),
    ],
)
def test_each_trainer_has_the_capabilities_it_implements_and_no_others(trainer_class, expected):
    """No default on ``TrainerBase`` gives every trainer every capability by inheritance."""
    assert capabilities(trainer_class) == expected


def test_dqn_offers_its_hidden_layer_as_a_typed_field():
    from horizon_engine.normalization import NormalizationParameters
    from horizon_engine.preprocessor import build_preprocessor
    from horizon_engine.schema import ActionType

    parameters = {"0": NormalizationParameters(feature_type="continuous", mean=0.0, stddev=1.0)}
    trainer = DqnTrainer(DqnTrainer.Config(layers=[8]))
    trainer.setup(
        TrainingProblem(
            action_type=ActionType.DISCRETE,
            actions=["L", "R"],
            state_preprocessor=build_preprocessor(["0"], parameters),
            state_width=1,
            action_preprocessor=None,
            action_width=0,
            device=torch.device("cpu"),
            seed=0,
        )
    )
    models = trainer.evaluation_models()
    assert isinstance(models, EvaluationModels)
    features = models.q_features(torch.zeros(3, 1), torch.ones(3, 1))
    assert features.shape == (3, 8)
