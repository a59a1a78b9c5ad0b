"""The export stage and ``horizon export``: a trained run folder's policy, handed to an exporter.

``horizon_engine.export`` is the exporters' contract (``PolicyBundle``, ``ExporterBase``); this
module reads the run folder through ``RunFolder`` (its ``problem.json``, normalization, check
rows and latest checkpoint), restores the trained policy on the CPU and drives the configured
exporter.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from horizon_engine.errors import ConfigError, HorizonError
from horizon_engine.export import ExportConfig, PolicyBundle
from horizon_engine.run_folder import RunFolder

if TYPE_CHECKING:
    from collections.abc import Iterable

    import torch

    from horizon_engine.config import Choice, PipelineSpec
    from horizon_engine.plugins import PluginHost
    from horizon_engine.run_context import RunContext


def trained_policy(
    run_dir: Path, trainer_choice: Choice, plugins: PluginHost, checkpoint: Path | None = None
) -> torch.nn.Module:
    """The policy of a run folder's latest checkpoint (or the epoch ``checkpoint``: the one
    ``shipped_checkpoint`` names), its trainer set up on the CPU from the folder's own
    ``problem.json`` and ``normalization.json``: no data is read."""
    import torch

    from horizon_engine.driver import restore_trainer

    description = RunFolder(run_dir).problem()
    cpu = torch.device("cpu")
    trainer, _ = restore_trainer(
        run_dir, trainer_choice, description, plugins, cpu, "export", checkpoint
    )
    return trainer.policy()


def ships_best(export: Choice | None) -> bool:
    """Whether the ``[export]`` choice ships the checkpoint the verdict chooses (``checkpoint
    = "best"``) rather than the last."""
    config = export.config if export is not None else None
    return isinstance(config, ExportConfig) and config.checkpoint == "best"


def shipped_checkpoint(run_dir: Path, export: Choice | None) -> Path:
    """The checkpoint whose policy a run ships (``[export]``'s ``checkpoint``): the latest, or
    for "best" the epoch the evaluation stage chose by the verdict (``cpe.json``'s
    ``verdict.checkpoint``, checked: ``verdict.shipped_epoch``)."""
    from horizon_engine.verdict import shipped_epoch

    folder = RunFolder(run_dir)
    if not ships_best(export):
        return folder.latest_checkpoint
    path = folder.file(RunFolder.CPE)
    if not path.is_file():
        raise HorizonError(
            f'[export] checkpoint = "best": {path} does not exist: the evaluation stage '
            "chooses the checkpoint to ship; run it first (--stages evaluation,export)"
        )
    verdict = folder.cpe().get("verdict")
    epoch = shipped_epoch(verdict, folder.epoch_checkpoints(), str(path))
    return folder.checkpoint_path(epoch)


def export_problems(spec: PipelineSpec, section: str) -> list[str]:
    """The export stage's ``check``: ``checkpoint = "best"`` ships the epoch the verdict
    chooses, so some estimator must run, or the run would stop at the export."""
    if not ships_best(spec.sections.get(section)) or spec.evaluation:
        return []
    return [
        f'{spec.where(section, "checkpoint")}: [{section}] checkpoint = "best" ships the '
        "epoch the verdict chooses, but no estimator runs to decide it: add [[evaluation]] "
        "entries, or hold episodes out ([timeline] eval_fraction > 0) for the default ones"
    ]


def policy_bundle(run: RunContext, model: torch.nn.Module) -> PolicyBundle:
    """``model`` (a run's trained policy), on the CPU, described by the run folder's
    ``problem.json`` and ``normalization.json``, with the rows its training kept to check an
    export on (``check_rows.pt``)."""
    folder = RunFolder(run.output_dir)
    description = folder.problem()
    rows = folder.check_rows(description)
    normalization = folder.normalization_record()
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
        ConfigBuilder,
        apply_overrides,
        parse_override,
    )
    from horizon_engine.plugins import get_plugin_host
    from horizon_engine.run_context import RunContext

    host = plugins or get_plugin_host()
    folder = RunFolder(run_dir)
    path = folder.file(RunFolder.MANIFEST)
    manifest = folder.manifest()
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
        name: builder.choose(name, builder.rule(name), config[name])
        for name in EXPORT_SECTIONS
        if name in config
    }
    if builder.problems:
        raise ConfigError(builder.problems)
    description = folder.problem()
    run = RunContext(
        Path(run_dir), description.seed, str(manifest.get("run_id") or uuid.uuid4().hex[:12])
    )
    shipped = shipped_checkpoint(Path(run_dir), chosen["export"])
    model = trained_policy(Path(run_dir), chosen["trainer"], host, shipped)
    with folder.held():  # nothing written through a link swapped into the folder meanwhile
        exported = export_policy(run, chosen["export"], model)
        manifest["export"] = exported
        if manifest.get("failed_stage") == "export":
            manifest["status"] = "succeeded"
            del manifest["failed_stage"], manifest["error"]
        folder.write_manifest(manifest)
    return exported
