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
"""

from __future__ import annotations

import json
from abc import abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from horizon_engine.components import ComponentConfig, Exporter
from horizon_engine.errors import ConfigError, HorizonError
from horizon_engine.policies import ExplorationConfig
from horizon_engine.schema import ActionType

if TYPE_CHECKING:
    from collections.abc import Iterable

    import torch

    from horizon_engine.config import Choice
    from horizon_engine.plugins import PluginHost
    from horizon_engine.run_context import RunContext


class ExportConfig(ExplorationConfig):
    """Options every ``[export]`` section accepts: the policy the exported model applies."""


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


def trained_policy(run_dir: Path, trainer_choice: Choice, plugins: PluginHost) -> torch.nn.Module:
    """The policy of a run folder's latest checkpoint, its trainer set up on the CPU from the
    folder's own ``problem.json`` and ``normalization.json``: no data is read."""
    import torch

    from horizon_engine.driver import ProblemDescription, restore_trainer

    description = ProblemDescription.read(run_dir)
    cpu = torch.device("cpu")
    trainer, _ = restore_trainer(run_dir, trainer_choice, description, plugins, cpu, "export")
    return trainer.policy()


def policy_bundle(run: RunContext, model: torch.nn.Module) -> PolicyBundle:
    """``model`` (a run's trained policy), on the CPU, described by the run folder's
    ``problem.json`` and ``normalization.json``, with the rows its training kept to check an
    export on (``check_rows.pt``)."""
    from horizon_engine.driver import ProblemDescription, read_check_rows
    from horizon_engine.normalization import NORMALIZATION_FILE

    description = ProblemDescription.read(run.output_dir)
    rows = read_check_rows(run.output_dir, description)
    normalization = json.loads((run.output_dir / NORMALIZATION_FILE).read_text(encoding="utf-8"))
    candidates = None
    if "possible_action_features" in rows:
        candidates = (
            rows["possible_action_features"],
            rows["possible_action_presence"],
            rows["possible_actions"],
        )
    return PolicyBundle(
        model=model.to("cpu").eval(),
        feature_ids=description.feature_ids,
        actions=description.actions,
        normalization=normalization,
        sample_values=rows["state"],
        sample_presence=rows["state_presence"],
        run_id=run.run_id,
        action_feature_ids=description.action_feature_ids,
        sample_candidates=candidates,
        action_type=description.action_type,
    )


def export_policy(run: RunContext, choice: Choice, model: torch.nn.Module) -> dict[str, Any]:
    """Export ``model`` with the ``[export]`` component ``choice``, checked on the run's check
    rows; returns the files written (``outputs``, run-relative) and the exporter's
    ``details``."""
    exporter = choice.create()
    outputs = exporter.export(run, policy_bundle(run, model))
    return {"outputs": outputs, "details": exporter.details}


EXPORT_SECTIONS: tuple[str, ...] = ("trainer", "export")
"""What ``export_run_folder`` reads of a run's config."""


def export_run_folder(
    run_dir: Path, overrides: Iterable[str] = (), plugins: PluginHost | None = None
) -> dict[str, Any]:
    """``horizon export`` for a run folder that ``horizon run`` did not write (a plugin
    command's, such as ``horizon gym train``): its latest checkpoint, set up from the folder's
    own files, exported as its manifest's ``[export]`` says (ONNX by default) and checked on
    the rows its training kept. Only ``[trainer]`` and ``[export]`` are read, and ``--set``
    overrides only those. Returns the exporter's outputs and details, also recorded under
    ``export`` in the manifest; a run whose export had failed is then marked succeeded."""
    import uuid

    from horizon_engine.config import (
        SECTIONS,
        ConfigBuilder,
        PipelineSection,
        PipelineSpec,
        apply_overrides,
        parse_override,
    )
    from horizon_engine.driver import ProblemDescription
    from horizon_engine.files import write_json
    from horizon_engine.plugins import get_plugin_host
    from horizon_engine.run_context import RunContext

    host = plugins or get_plugin_host()
    path = Path(run_dir) / "manifest.json"
    manifest = read_manifest(path)
    overridden = [parse_override(override)[0] for override in overrides]
    outside = [".".join(key) for key in overridden if key[0] not in EXPORT_SECTIONS]
    if outside:
        raise ConfigError(
            [
                f"--set {key}: horizon export reads only [trainer] and [export] of {run_dir}"
                for key in outside
            ]
        )
    config = apply_overrides(manifest["config"], overrides)
    config.setdefault("export", {"kind": "onnx"})
    builder = ConfigBuilder(host, str(path), None, [".".join(key) for key in overridden])
    if "trainer" not in config:
        builder.problems.append(f"{path}: no [trainer] in the run's config: nothing was trained")
    chosen = {
        name: builder.choose(name, SECTIONS[name], config[name])
        for name in EXPORT_SECTIONS
        if name in config
    }
    if builder.problems:
        raise ConfigError(builder.problems)
    description = ProblemDescription.read(run_dir)
    pipeline = PipelineSection(output_dir=str(run_dir), seed=description.seed)
    run = RunContext(
        PipelineSpec(str(path), pipeline, sections=chosen),
        Path(run_dir),
        host,
        str(manifest.get("run_id") or uuid.uuid4().hex[:12]),
    )
    model = trained_policy(Path(run_dir), chosen["trainer"], host)
    exported = export_policy(run, chosen["export"], model)
    manifest["export"] = exported
    if manifest.get("failed_stage") == "export":
        manifest["status"] = "succeeded"
        del manifest["failed_stage"], manifest["error"]
    write_json(path, manifest)
    return exported


def read_manifest(path: Path) -> dict[str, Any]:
    """A run folder's ``manifest.json``, or an error saying it holds no run's manifest."""
    try:
        manifest = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise HorizonError(f"{path}: not a run's manifest ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict):
        raise HorizonError(f"{path}: not a run's manifest (no config in it)")
    pipeline = manifest["config"].get("pipeline", {})
    if not isinstance(pipeline, dict):
        raise HorizonError(
            f"{path}: config.pipeline is {json.dumps(pipeline)[:80]}, not a table of options"
        )
    return manifest
