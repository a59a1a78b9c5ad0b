"""What an exporter gets: the trained policy, what its inputs mean, and rows to check it on.

Export reads only what it checks: a trained run folder describes itself (the training driver
wrote ``problem.json``, the normalization and the rows to check on, ``check_rows.pt``), so the
latest checkpoint is restored into a trainer set up exactly as in training without reading the
timeline. Its policy module (raw features and presence -> a score per action, normalization
inside) goes to the configured exporter with the feature ids, action names, normalization, and
those rows, on which the exporter verifies what it wrote: up to 1,024 eval rows of a pipeline
run, greedy-play states of ``horizon gym train``. A parametric policy also takes each row's
candidate actions (features, presence and a mask of real candidates) and scores every
candidate. Any trained run folder exports the same way, whichever command wrote it.

This module is the exporters' contract; ``horizon_engine.export_stage`` reads a run folder and
drives the exporter (the export stage, ``horizon export``).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from horizon_engine.components import ComponentConfig, Exporter
from horizon_engine.policies import ExplorationConfig
from horizon_engine.schema import ActionType

if TYPE_CHECKING:
    import torch

    from horizon_engine.run_context import RunContext


class ExportConfig(ExplorationConfig):
    """Options every ``[export]`` section accepts: the policy the exported model applies, and
    which epoch's checkpoint it is."""

    checkpoint: Literal["last", "best"] = "last"
    """Which epoch's policy to export: "last", the training's last epoch; "best", the one the
    evaluation stage chose by the verdict: it evaluates up to 10 epochs' checkpoints with the
    [[evaluation]] entries and ships the epoch whose verdict has the highest lower bound of
    the difference from the logged policy (``horizon_engine.verdict.ship_choice``). The
    verdict is then the shipped epoch's, and says what it was chosen among and why."""


@dataclass
class PolicyBundle:
    """The trained policy and everything needed to describe and check it."""

    model: torch.nn.Module
    """(values, presence) of the state features -> ``[batch, actions]`` scores; a parametric
    model also takes (values, presence) of the candidates and gives ``[batch, candidates]``; a
    continuous one gives the action ``[batch, action features]`` in the user's units, or
    ``(action, log_density)`` for a stochastic policy."""
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
    action_type: ActionType = ActionType.DISCRETE
    """The kind of actions: what the model's outputs are."""

    @property
    def parametric(self) -> bool:
        return self.sample_candidates is not None

    @property
    def continuous(self) -> bool:
        return self.action_type is ActionType.CONTINUOUS


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
