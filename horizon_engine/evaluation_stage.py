"""The evaluation stage and ``horizon evaluate``: the orchestration around the estimators.

``horizon_engine.evaluation`` holds what estimators are run with (``EpisodeEvaluation``, the
per-epoch record, the estimates table); this module reads a run folder through ``RunFolder``,
restores the latest checkpoint, runs the ``[[evaluation]]`` entries on an eval split and, as
the stage, writes ``cpe.json``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from horizon_engine.errors import HorizonError
from horizon_engine.evaluation import (
    EpisodeEvaluation,
    logged_horizon,
    read_metrics,
    results_json,
)
from horizon_engine.export_stage import shipped_checkpoint, ships_best
from horizon_engine.run_context import StageReport
from horizon_engine.run_folder import EarlierRun, RunFolder

if TYPE_CHECKING:
    from horizon_engine.config import Choice
    from horizon_engine.driver import ProblemDescription
    from horizon_engine.plugins import PluginHost
    from horizon_engine.run_context import StageRun
    from horizon_engine.training import TrainerBase


def _evaluation_of_split(
    run: StageRun,
    choices: list[Choice],
    description: ProblemDescription,
    split: Path,
    purpose: str,
    checkpoint: Path | None = None,
) -> tuple[EpisodeEvaluation, TrainerBase, list[str]]:
    """The entries ``choices`` ready to run on the timeline split folder ``split`` (rows with
    ``description``'s features and actions), or on its first episodes when it does not fit
    ``[trainer] max_memory_gb`` (the warnings say so), and the trainer as the latest
    checkpoint (or the epoch ``checkpoint``) left it."""
    from horizon_engine.driver import restore_trainer
    from horizon_engine.streamed import episodes_within
    from horizon_engine.training import resolve_device

    trainer_choice = run.spec.sections["trainer"]
    device = resolve_device(trainer_choice.config.device)
    trainer, _ = restore_trainer(
        run.output_dir, trainer_choice, description, run.plugins, device, purpose, checkpoint
    )
    rows, warnings = episodes_within(split, description, trainer_choice.config, device)
    if not len(rows):
        raise HorizonError(
            f"[[evaluation]] {split} holds no rows: the estimators need an eval split "
            "([timeline] eval_fraction > 0)"
        )
    metrics = {name: values[: len(rows)] for name, values in read_metrics(split).items()}
    # a timeline's eval split: its train split's episodes were logged too
    splits = [split.parent / "train", split] if split.name == "eval" else [split]
    horizon = logged_horizon(splits)
    evaluation = EpisodeEvaluation(
        choices, description.action_type, rows, metrics, run.seed, horizon=horizon
    )
    return evaluation, trainer, warnings


def run_evaluation_stage(run: StageRun, choices: list[Choice]) -> StageReport:
    """Run every ``[[evaluation]]`` estimator once on the eval split, for the latest
    checkpoint's policy; write ``cpe.json`` with these final estimates and the per-epoch ones
    the train stage recorded (``cpe_epochs.json``, when it ran estimators every epoch)."""
    from horizon_engine.driver import timeline_problem

    description, _ = timeline_problem(run)
    folder = RunFolder(run.output_dir)
    split = folder.split("eval")
    if "evaluation" in run.spec.at_defaults and not _holds_rows(split):
        return _no_eval_split(folder, split)
    if not any(split.glob("*.parquet")):
        raise HorizonError(
            f"[[evaluation]] {split} holds no rows: the estimators need an eval split "
            "([timeline] eval_fraction > 0)"
        )
    evaluation, trainer, warnings = _evaluation_of_split(
        run, choices, description, split, "evaluation"
    )
    if ships_best(run.spec.sections.get("export")):
        final, verdict = _choose_checkpoint(folder, evaluation, trainer, choices)
    else:
        final = results_json(evaluation.run(trainer))
        verdict = verdict_of(final, choices, evaluation.labels, evaluation.episode_count)
    epochs = folder.cpe_epochs()
    record = {
        "eval_rows": len(evaluation.data),
        "episodes": evaluation.episode_count,
        "entries": evaluation.entries(),
        "final": final,
        "verdict": verdict,
        "epochs": epochs,
    }
    folder.write_json(RunFolder.CPE, record)
    return StageReport(
        "evaluation",
        rows_in=len(evaluation.data),
        rows_out=len(evaluation.data),
        outputs=[RunFolder.CPE],
        warnings=warnings,
        details={
            "episodes": evaluation.episode_count,
            "estimates": final,
            "not_applicable": dict(evaluation.not_applicable),
            "verdict": verdict,
        },
    )


def _choose_checkpoint(
    folder: RunFolder,
    evaluation: EpisodeEvaluation,
    trainer: TrainerBase,
    choices: list[Choice],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The estimates and verdict of the epoch to ship: each candidate epoch's checkpoint
    (``verdict.ship_candidates``) restored into ``trainer`` and evaluated, the epoch chosen by
    ``verdict.ship_choice``, and the choice recorded in its verdict (``"checkpoint"``)."""
    from horizon_engine.training import restore_epoch
    from horizon_engine.verdict import ship_candidates, ship_choice

    epochs = folder.epoch_checkpoints()
    if not epochs:
        raise HorizonError(
            f'[export] checkpoint = "best": {folder.checkpoints} holds no epoch checkpoint '
            "(epoch-NNNN.pt) to choose from; run the train stage first"
        )
    found: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    for epoch in ship_candidates(epochs):
        restore_epoch(trainer, folder.path, folder.checkpoint_path(epoch), "evaluation")
        final = results_json(evaluation.run(trainer))
        found[epoch] = (
            final,
            verdict_of(final, choices, evaluation.labels, evaluation.episode_count),
        )
    choice = ship_choice([(epoch, verdict) for epoch, (_, verdict) in found.items()])
    final, verdict = found[choice["epoch"]]
    return final, {**verdict, "checkpoint": choice}


def verdict_of(
    final: dict[str, Any], choices: list[Choice], labels: list[str], episodes: int
) -> dict[str, Any]:
    """The verdict (``horizon_engine.verdict``) on the estimates ``final`` that the entries
    ``choices``, labelled ``labels``, made on ``episodes`` eval episodes."""
    from horizon_engine.verdict import candidates_of, decide

    kinds = {label: choice.component.name for label, choice in zip(labels, choices, strict=True)}
    preferences = {
        label: int(getattr(choice.component.cls, "verdict_preference", 0))
        for label, choice in zip(labels, choices, strict=True)
    }
    return decide(candidates_of(final, kinds, preferences, episodes), episodes)


def _holds_rows(split: Path) -> bool:
    """Whether the split folder's Parquet files hold any row (their footers say); a file
    that is not Parquet is an error naming it (a run folder may come from elsewhere)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for path in sorted(split.glob("*.parquet")):
        try:
            if pq.ParquetFile(path).metadata.num_rows > 0:
                return True
        except (OSError, pa.ArrowException) as exc:
            raise HorizonError(f"{path}: not a readable timeline split file ({exc})") from None
    return False


def _no_eval_split(folder: RunFolder, split: Path) -> StageReport:
    """The evaluation stage at its defaults on a timeline that held no episode out: no
    estimate, and a verdict that says why (asked for, no eval split is an error instead)."""
    from horizon_engine.verdict import decide

    verdict = decide([], 0)
    where = split.relative_to(folder.path) if split.is_relative_to(folder.path) else split
    verdict["reasons"] = [f"the eval split ({where}) holds no rows, so nothing could be estimated"]
    verdict["settle"] = "hold episodes out for evaluation ([timeline] eval_fraction > 0)"
    folder.write_json(
        RunFolder.CPE,
        {"eval_rows": 0, "episodes": 0, "entries": {}, "final": {}, "verdict": verdict},
    )
    return StageReport(
        "evaluation",
        outputs=[RunFolder.CPE],
        warnings=[verdict["reasons"][0]],
        details={"episodes": 0, "estimates": {}, "not_applicable": {}, "verdict": verdict},
    )


def evaluate_run(
    run_dir: str | Path,
    data: str | Path | None = None,
    default_evaluation: Iterable[Mapping[str, Any]] = (),
    overrides: Iterable[str] = (),
    plugins: PluginHost | None = None,
) -> dict[str, Any]:
    """Evaluate a finished ``horizon run``'s shipped checkpoint (the latest, or the one its
    verdict chose: ``export_stage.shipped_checkpoint``) with its ``[[evaluation]]``
    entries (``default_evaluation``, entries as in pipeline.toml, when it has none) on its own
    eval split, or on ``data``: another run's eval split (a run folder, its ``timeline``
    folder or a split folder of timeline Parquet) with the same actions and state features.

    ``overrides`` are ``--set`` overrides of the run's config (``evaluation.0.weight_clip=10``).
    Returns what ``cpe.json`` holds but the epochs, with ``run_dir`` and ``data``; writes
    nothing.
    """
    import uuid

    from horizon_engine.config import build_spec
    from horizon_engine.plugins import get_plugin_host
    from horizon_engine.run_context import StageRun

    run_dir = Path(run_dir)
    folder = RunFolder(run_dir)
    plugins = plugins or get_plugin_host()
    config = trained_run_config(run_dir)
    if not config.get("evaluation"):
        config["evaluation"] = [dict(entry) for entry in default_evaluation]
    if not config["evaluation"]:
        raise HorizonError(f"{run_dir}: the run has no [[evaluation]] entries to run")
    spec = build_spec(config, plugins, overrides)
    description = folder.problem()
    split = folder.split("eval") if data is None else _split_folder(Path(data))
    if data is not None:
        _check_data(split, description)
    elif not any(split.glob("*.parquet")):
        raise HorizonError(
            f"{split} holds no eval split to evaluate on: give another timeline with --data"
        )
    run = StageRun.start(spec, plugins, uuid.uuid4().hex[:12], output_dir=run_dir)
    shipped = shipped_checkpoint(run_dir, spec.sections.get("export"))
    evaluation, trainer, warnings = _evaluation_of_split(
        run, spec.evaluation, description, split, "evaluation", shipped
    )
    final = results_json(evaluation.run(trainer))
    return {
        "run_dir": str(run_dir),
        "data": str(split),
        "checkpoint": shipped.relative_to(run_dir).as_posix(),
        "eval_rows": len(evaluation.data),
        "episodes": evaluation.episode_count,
        "entries": evaluation.entries(),
        "final": final,
        "verdict": verdict_of(final, spec.evaluation, evaluation.labels, evaluation.episode_count),
        **({"warnings": warnings} if warnings else {}),
    }


def trained_run_config(run_dir: Path) -> dict[str, Any]:
    """The config a finished ``horizon run`` resolved (its manifest's), pointed at ``run_dir``
    with every stage selected: what its trained policy is restored with. An error where the
    folder trained no policy or its training is incomplete."""
    import copy

    manifest = RunFolder(run_dir).manifest()
    config = manifest.get("config")
    if not isinstance(config, dict) or "pipeline" not in config or "trainer" not in config:
        raise HorizonError(
            f"{run_dir}: not the folder of a `horizon run` that trained a policy (its manifest "
            "has no [pipeline] and [trainer])"
        )
    incomplete = EarlierRun(manifest).incomplete_stages().get("train")
    if incomplete:
        raise HorizonError(
            f"{run_dir}: its training is incomplete ({incomplete}), so its latest checkpoint "
            "is no finished policy; run the train stage again (--stages train)"
        )
    config = copy.deepcopy(config)
    if not isinstance(config["pipeline"], dict):
        raise HorizonError(f"{run_dir}: its manifest's config has no [pipeline] table")
    config["pipeline"]["output_dir"] = str(run_dir)
    config["pipeline"]["stages"] = None
    return config


def _split_folder(path: Path) -> Path:
    """The split folder ``--data`` names: a run folder's ``timeline/eval``, a timeline
    folder's ``eval``, or a folder of timeline Parquet itself."""
    for candidate in (RunFolder(path).split("eval"), path / "eval", path):
        if candidate.is_dir() and any(candidate.glob("*.parquet")):
            return candidate
    raise HorizonError(
        f"--data {path}: no timeline rows there (expected a run folder, its timeline folder "
        "or a folder of timeline Parquet files)"
    )


def _check_data(split: Path, description: ProblemDescription) -> None:
    """Another timeline's split must have the run's action type, actions and state (and
    action) features, or the policy cannot be evaluated on it."""
    import pyarrow.parquet as pq

    from horizon_engine.schema import map_entries
    from horizon_engine.timeline import TIMELINE_INFO, TimelineInfo

    if (split.parent / TIMELINE_INFO).is_file():
        info = TimelineInfo.read(split.parent)
        if info.action_type != description.action_type.value:
            raise HorizonError(
                f"--data {split}: its actions are {info.action_type}, the run's policy "
                f"decides {description.action_type.value} actions"
            )
        if description.actions and (info.actions or []) != description.actions:
            raise HorizonError(
                f"--data {split}: its actions are {info.actions}, the run's policy was "
                f"trained on {description.actions} (the same names in the same order)"
            )
    columns = [("state_features", description.feature_ids, "state")]
    if description.action_feature_ids:
        columns.append(("action", description.action_feature_ids, "action"))
    table = pq.read_table(split, columns=[name for name, _, _ in columns])
    for name, feature_ids, kind in columns:
        column = table[name].combine_chunks()
        _, keys, _ = map_entries(column)
        found = set(keys.unique().to_pylist())
        missing = [feature for feature in feature_ids if feature not in found]
        if missing:
            raise HorizonError(
                f"--data {split}: no row has the {kind} feature(s) {missing} that the run's "
                f"policy reads (the data has {sorted(found)[:20]})"
            )
