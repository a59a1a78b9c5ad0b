"""What an exporter gets: the trained policy, what its inputs mean, and rows to check it on.

The export stage restores the latest checkpoint into a trainer set up exactly as in training
(``prepare_training``), takes its policy module (raw features and presence -> a score per
action, normalization inside) and hands it to the configured exporter with the feature ids,
action names, normalization, and eval rows on which the exporter verifies what it wrote. A
parametric policy also takes each row's candidate actions (features, presence and a mask of
real candidates) and scores every candidate.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from horizon_engine.components import ComponentConfig, Exporter
from horizon_engine.policies import ExplorationConfig

if TYPE_CHECKING:
    import torch

    from horizon_engine.config import Choice
    from horizon_engine.run_context import RunContext

VERIFY_ROWS = 1024
"""Eval rows an exported model is checked on (all of them when there are fewer)."""


class ExportConfig(ExplorationConfig):
    """Options every ``[export]`` section accepts: the policy the exported model applies."""


@dataclass
class PolicyBundle:
    """The trained policy and everything needed to describe and check it."""

    model: torch.nn.Module
    """(values, presence) of the state features -> ``[batch, actions]`` scores; a parametric
    model also takes (values, presence) of the candidates and gives ``[batch, candidates]``."""
    feature_ids: list[str]
    actions: list[str]
    normalization: dict[str, Any]
    sample_values: torch.Tensor
    sample_presence: torch.Tensor
    run_id: str
    metadata: dict[str, str] = field(default_factory=dict)
    action_feature_ids: list[str] = field(default_factory=list)
    """The candidate actions' feature ids, in input order (parametric models)."""
    sample_candidates: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    """Check rows' candidate actions: values, presence ``[rows, K, G]`` and mask ``[rows, K]``
    (parametric models only)."""

    @property
    def parametric(self) -> bool:
        return self.sample_candidates is not None


class ExporterBase(Exporter):
    """An exporter the export stage can drive. Subclass it and register it as an exporter."""

    Config: ClassVar[type[ComponentConfig]] = ExportConfig

    def __init__(self, config: ComponentConfig) -> None:
        super().__init__(config)
        self.details: dict[str, Any] = {}

    @abstractmethod
    def export(self, run: RunContext, bundle: PolicyBundle) -> list[str]:
        """Write the model under ``run.output_dir``; return the paths written, run-relative.
        ``details`` may carry figures for the manifest (sizes, the verified difference)."""


def policy_bundle(run: RunContext, trainer_choice: Choice) -> PolicyBundle:
    """The latest checkpoint's policy, on the CPU, with its description and check rows."""
    import json

    from horizon_engine.normalization import NORMALIZATION_FILE
    from horizon_engine.training import load_checkpoint, prepare_training

    prepared = prepare_training(run, trainer_choice)
    prepared.trainer.load_state_dict(load_checkpoint(run.output_dir, "export")["trainer"])
    model = prepared.trainer.policy().to("cpu").eval()
    check = prepared.splits["eval"] if len(prepared.splits["eval"]) else prepared.splits["train"]
    normalization = json.loads((run.output_dir / NORMALIZATION_FILE).read_text())
    candidates = None
    if check.possible_action_features is not None:
        candidates = (
            check.possible_action_features[:VERIFY_ROWS].cpu(),
            check.possible_action_presence[:VERIFY_ROWS].cpu(),
            check.possible_actions[:VERIFY_ROWS].cpu(),
        )
    return PolicyBundle(
        model=model,
        feature_ids=prepared.feature_ids,
        actions=prepared.problem.actions,
        normalization=normalization,
        sample_values=check.state[:VERIFY_ROWS].cpu(),
        sample_presence=check.state_presence[:VERIFY_ROWS].cpu(),
        run_id=run.run_id,
        action_feature_ids=check.action_feature_ids,
        sample_candidates=candidates,
    )
