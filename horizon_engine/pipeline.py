"""Runs the configured stages in order and writes the run manifest.

Each stage reads the files the previous one wrote under the run's output folder, so a run can
resume at any stage (``--stages``) and a user can bring their own intermediate files. After
each stage ``manifest.json`` is rewritten: the config as resolved, plugin versions, per-stage
row counts with a reason for every row dropped, timings, the seed and the Horizon version.

``resume=True`` (``horizon run --resume``) continues a folder's killed, interrupted or failed
run with the config it recorded (a change that could change results is refused, naming the
keys): the stages it completed are carried over, the first one it did not complete runs
again, from its last complete epoch for the train stage (``horizon_engine.driver``), from
scratch for the others (they are short and write their outputs whole), and the later ones
run. The result is the uninterrupted run's, to the bit on a CPU. Ctrl-C (or SIGTERM from
the command line) leaves the manifest ``"status": "interrupted"``, ready to resume.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from horizon_engine import distributed
from horizon_engine.config import Choice, PipelineSpec, build_spec
from horizon_engine.errors import (
    BAD_ROWS_SHOWN,
    BadRowsError,
    ConfigError,
    HorizonError,
    NothingToResume,
    StageInputError,
)
from horizon_engine.estimation import MIN_VERDICT_EPISODES
from horizon_engine.files import staged_outputs
from horizon_engine.import_clock import import_clock
from horizon_engine.plugins import PluginHost, get_plugin_host
from horizon_engine.preflight import check_before_run
from horizon_engine.run_context import StageReport, StageRun
from horizon_engine.run_folder import (
    EarlierRun,
    RunFolder,
    existing_claims,
    matches,
    read_earlier_run,
    record_failure,
    remove_inside,
    take_over,
)
from horizon_engine.stages import Stage, readers_of

if TYPE_CHECKING:
    import numpy as np

    from horizon_engine.driver import Normalization
    from horizon_engine.normalization import NormalizationConfig
    from horizon_engine.preprocessor import FeatureType
    from horizon_engine.schema import BadRow, RowLayout
    from horizon_engine.timeline import TimelineConfig, TimelineResult


ROW_GROUP_ROWS = 256_000
"""Rows gathered before the source stage writes a Parquet row group: sources yield small
batches, and a file of many small row groups reads back as many chunks, slow to gather."""


class BadRowSink:
    """Where a stage's bad rows go: counted by kind, and either quarantined or reported.

    With ``quarantine`` each bad row is written at once to a JSONL file (location, kind, reason,
    row), so a large number of them never piles up in memory. Otherwise the first
    ``BAD_ROWS_SHOWN`` are kept for the error message that stops the run.
    """

    def __init__(self, quarantine_path: Path | None) -> None:
        self.quarantine_path = quarantine_path
        self.counts: Counter[str] = Counter()
        self.shown: list[BadRow] = []
        self.repeats: Counter[str] = Counter()
        self._handle: TextIO | None = None

    def add(self, bad_rows: list[BadRow]) -> None:
        """Take one batch's bad rows, from every check, in the order of their locations."""
        bad_rows = sorted(bad_rows, key=lambda row: _natural_order(row.location))
        self.counts.update(row.kind for row in bad_rows)
        if self.quarantine_path is None:
            for row in bad_rows:
                if row.reason in self.repeats or any(row.reason == s.reason for s in self.shown):
                    self.repeats[row.reason] += 1
                elif len(self.shown) < BAD_ROWS_SHOWN:
                    self.shown.append(row)
            return
        if bad_rows and self._handle is None:
            self._handle = self.quarantine_path.open("w", encoding="utf-8")
        for row in bad_rows:
            record = {"location": row.location, "kind": row.kind, "reason": row.reason}
            self._handle.write(json.dumps({**record, "row": row.row}, default=str) + "\n")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()

    @property
    def failing(self) -> bool:
        """True once a bad row was seen and the run is to stop for it."""
        return self.quarantine_path is None and bool(self.counts)

    def error(self) -> BadRowsError:
        return bad_rows_error(self.counts, self.shown, self.repeats)


def _counts_text(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{kind}: {count}" for kind, count in sorted(counts.items()))


def bad_rows_error(
    counts: Mapping[str, int], shown: list[BadRow], repeats: Mapping[str, int] | None = None
) -> BadRowsError:
    """The error that stops a run for bad rows: counts by kind, then the first rows, one line
    per reason (a mistake repeated on every row is one line with its count, not a screenful).

    ``repeats`` counts rows beyond ``shown`` that share a shown row's reason.
    """
    total = sum(counts.values())
    groups: dict[str, list[BadRow]] = {}
    for row in shown:
        groups.setdefault(row.reason, []).append(row)
    lines = [f"{total} bad rows ({_counts_text(counts)}):"]
    listed = 0
    for reason, rows in groups.items():
        more = len(rows) - 1 + (repeats or {}).get(reason, 0)
        also = ", ".join(row.location for row in rows[1:4])
        lines.append(
            f"  {rows[0]}"
            + (f" (and {more} more rows like it" + (f": {also}" if also else "") + ")") * (more > 0)
        )
        listed += 1 + more
    if total > listed:
        lines.append(f"  ... and {total - listed} more")
    lines.append('Fix them, or set [pipeline] on_bad_rows = "quarantine" to set them aside.')
    return BadRowsError("\n".join(lines), shown)


def _natural_order(location: str) -> list[tuple[int, int | str]]:
    """Sort key putting ``rows.jsonl:9`` before ``rows.jsonl:10``."""
    return [
        (0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", location)
    ]


def run_source_stage(run: StageRun, choice: Choice) -> StageReport:
    """Read the source, validate every row, and write the good ones to ``source/rows.parquet``.

    Bad rows stop the run (``on_bad_rows = "fail"``, after reading everything so that all of
    them are reported at once) or go to ``source/quarantine.jsonl`` with their reasons.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from horizon_engine.schema import RowChecker, derive_not_terminal

    source = choice.create()
    timeline = run.spec.sections.get("timeline")
    actions = getattr(timeline.config, "actions", None) if timeline else None
    quarantine = run.spec.pipeline.on_bad_rows == "quarantine"
    report = StageReport("source", outputs=[RunFolder.SOURCE_ROWS])
    ignored: Counter[str] = Counter()
    notes: Counter[str] = Counter()
    pending: list[pa.Table] = []
    layout = checker = writer = None
    with (
        staged_outputs(RunFolder(run.output_dir).file(RunFolder.SOURCE_ROWS).parent) as folder,
        run.progress("reading rows") as advance,
    ):
        quarantined = folder / Path(RunFolder.SOURCE_QUARANTINE).name
        sink = BadRowSink(quarantined if quarantine else None)
        try:
            for batch in source.read(run):
                if layout is None:
                    layout, checker = batch.layout, RowChecker(batch.layout, actions)
                    writer = pq.ParquetWriter(
                        folder / Path(RunFolder.SOURCE_ROWS).name, layout.schema
                    )
                elif batch.layout != layout:
                    raise HorizonError(
                        f"[source] {batch.locations[0] if batch.locations else ''}: found "
                        f"{batch.layout}, but earlier rows were {layout}"
                    )
                good, rejected = checker.check(batch.table, batch.locations)
                report.rows_in += batch.table.num_rows + len(batch.bad_rows)
                sink.add([*batch.bad_rows, *rejected])
                ignored.update(batch.ignored_fields)
                notes.update(batch.notes)
                if not sink.failing:
                    pending.append(derive_not_terminal(good, layout))
                    report.rows_out += good.num_rows
                    if sum(table.num_rows for table in pending) >= ROW_GROUP_ROWS:
                        writer.write_table(pa.concat_tables(pending))
                        pending = []
                advance(batch.table.num_rows)
            if pending and not sink.failing:
                writer.write_table(pa.concat_tables(pending))
        finally:
            sink.close()
            if writer is not None:
                writer.close()
        if layout is None:
            raise HorizonError(f"[source] {choice.component.name}: the source yielded no rows")
        if sink.failing:
            raise sink.error()
        if not report.rows_out:
            # The quarantine is kept for the user to read; an empty rows file is not written.
            (folder / Path(RunFolder.SOURCE_ROWS).name).unlink()
    if not report.rows_out:
        raise HorizonError(
            f"[source] every one of the {report.rows_in} rows read was bad "
            f"({_counts_text(sink.counts)}), so no rows are left; see "
            f"{RunFolder(run.output_dir).file(RunFolder.SOURCE_QUARANTINE)} for each row and "
            "its reason"
        )
    if sink.counts:
        report.outputs.append(RunFolder.SOURCE_QUARANTINE)
    report.dropped = dict(sink.counts)
    report.warnings = [
        f"ignored field '{name}' (not part of {layout}) in {count} rows"
        for name, count in sorted(ignored.items())
    ] + [f"{note} in {count} rows" for note, count in sorted(notes.items())]
    report.details = {
        "row_format": layout.row_format.value,
        "action_type": layout.action_type.value,
    }
    return report


def run_timeline_stage(run: StageRun, choice: Choice) -> StageReport:
    """Build ``timeline/train`` and ``timeline/eval`` from ``source/rows.parquet``.

    Rows that already are timeline rows (Horizon's own output) skip the transform: they are
    only split into train and eval, and reweighted when ``reward`` weights are configured.
    """
    import pyarrow.parquet as pq

    from horizon_engine.schema import RowFormat, RowLayout
    from horizon_engine.timeline import TimelineInfo, split_timeline_rows

    rows = RunFolder(run.output_dir).file(RunFolder.SOURCE_ROWS)
    layout = RowLayout.from_schema(pq.read_schema(rows), str(rows))
    quarantine = run.spec.pipeline.on_bad_rows == "quarantine"
    actions, actions_from = _discrete_actions(run, rows, layout, choice.config)
    config = choice.config.model_copy(update={"actions": actions})
    if layout.row_format is RowFormat.TIMELINE:
        engine = "none: the source rows are timeline rows already"
    else:
        engine = choice.component.name
    warnings = _reward_weight_warnings(run, rows, config.reward) if config.reward else []
    with staged_outputs(RunFolder(run.output_dir).timeline) as folder:
        if layout.row_format is RowFormat.TIMELINE:
            result = split_timeline_rows(rows, folder, config, run.seed)
        else:
            transform = choice.component.cls(config)
            result = transform.build(run, rows, folder, layout.action_type, quarantine)
        if result.rejected and not quarantine:
            raise bad_rows_error(result.rejected, result.examples)
        if not result.train_rows:
            lost = {**result.dropped, **result.rejected}
            raise HorizonError(
                f"[timeline] no training rows are left: of the {result.rows_in} rows in "
                f"{rows}, {result.eval_rows} went to the eval split"
                + (f" and {sum(lost.values())} were dropped ({_counts_text(lost)})" if lost else "")
            )
        info = TimelineInfo(
            layout.action_type.value,
            actions,
            result.n_step if result.n_step is not None else config.window,
            engine,
            result.train_rows,
            result.eval_rows,
        )
        info.write(folder)
    report = StageReport(
        "timeline",
        rows_in=result.rows_in,
        rows_out=result.train_rows + result.eval_rows,
        dropped={**result.dropped, **result.rejected},
        outputs=[*RunFolder.TIMELINE_SPLITS, RunFolder.TIMELINE_INFO],
        warnings=[*warnings, *_eval_split_warnings(run, result, config.eval_fraction)],
        details={
            "engine": engine,
            "actions": actions,
            **({"actions_from": actions_from} if actions_from else {}),
            "eval_fraction": config.eval_fraction,
            "n_step": info.n_step,
            "train_rows": result.train_rows,
            "eval_rows": result.eval_rows,
            "train_episodes": result.train_episodes,
            "eval_episodes": result.eval_episodes,
        },
    )
    if result.rejected:
        report.outputs.append("timeline/quarantine")
    return report


MIN_EVAL_EPISODES = 2
"""The fewest held-out episodes the timeline stage accepts without a warning: the estimators
and the trainer's evaluation average over episodes, and from one episode no spread (no
interval) can be had; with none, the exported model is checked on training rows."""

SUGGESTED_EVAL_EPISODES = 5
"""The episodes the warning's suggested ``eval_fraction`` holds out on average: enough that
fewer than ``MIN_EVAL_EPISODES`` is rare (4% of seeds or fewer: a Poisson tail, e^-5 * 6)."""


SUGGESTED_VERDICT_EPISODES = 30
"""The episodes the verdict's warning's suggested ``eval_fraction`` holds out on average:
enough that fewer than ``MIN_VERDICT_EPISODES`` is rare (2% of seeds: a Poisson tail)."""


def _eval_split_warnings(run: StageRun, result: TimelineResult, fraction: float) -> list[str]:
    """A warning when the eval split holds fewer than ``MIN_EVAL_EPISODES`` episodes, or,
    where estimators will run on it, fewer than the verdict needs (``MIN_VERDICT_EPISODES``):
    the count, what it costs and what to change, said here, before training, rather than
    only in the verdict at the end. None for ``eval_fraction = 0``, which asks for no eval
    split (the train stage still says what its absence costs)."""
    held_out = result.eval_episodes
    estimating = bool(run.spec.evaluation)
    enough = MIN_VERDICT_EPISODES if estimating else MIN_EVAL_EPISODES
    if held_out >= enough or not fraction:  # 0: the user holds none out
        return []
    episodes = result.train_episodes + held_out
    split = (
        f"the eval split holds {held_out} of {episodes} episodes ({result.eval_rows} rows; "
        f"[timeline] eval_fraction = {fraction}, the episodes chosen by a hash of mdp_id and "
        "the seed)"
    )
    wanted = SUGGESTED_VERDICT_EPISODES if estimating else SUGGESTED_EVAL_EPISODES
    if held_out >= MIN_EVAL_EPISODES:
        cost = (
            f"the verdict needs at least {MIN_VERDICT_EPISODES}: on fewer it says unclear, "
            "with every value the rewards allow as its interval"
        )
    elif held_out:
        cost = "the evaluation after each epoch and the estimates rest on one episode"
    else:
        cost = (
            "the exported model is checked on training rows, the trainer is not evaluated "
            "after each epoch"
            + (", and [[evaluation]] has nothing to estimate" if estimating else "")
        )
    suggested = math.ceil(100 * wanted / episodes) / 100
    change = (
        f"raise [timeline] eval_fraction (eval_fraction = {suggested} holds out about "
        f"{wanted} of {episodes} episodes) or log more episodes"
        if suggested <= 0.5
        else "log more episodes"
    )
    return [f"{split}: {cost}; {change}"]


def _discrete_actions(
    run: StageRun, rows: Path, layout: RowLayout, config: TimelineConfig
) -> tuple[list[str] | None, str | None]:
    """The discrete action names the timeline numbers, and where they come from: ``[timeline]
    actions`` when set; else the entries of timeline rows' ``possible_actions`` masks ("0",
    "1", ...), or every name logged decisions log (``logged_facts.logged_action_names``).
    (None, None) for parametric and continuous actions, which have no names to number."""
    from horizon_engine.logged_facts import logged_action_names, timeline_action_names
    from horizon_engine.schema import ActionType, RowFormat

    if layout.action_type is not ActionType.DISCRETE:
        return config.actions, None
    if layout.row_format is RowFormat.TIMELINE:
        where = run.spec.where("timeline", "actions")
        actions = timeline_action_names(rows, config.actions, where)
        if config.actions is None:
            return actions, "the entries of the rows' possible_actions masks"
        return actions, "[timeline] actions"
    if config.actions is not None:
        return config.actions, "[timeline] actions"
    return logged_action_names(rows), "every name the rows log (whole numbers first, by value)"


def _reward_weight_warnings(run: StageRun, rows: Path, weights: dict[str, float]) -> list[str]:
    """A weight for a metric no row carries is an error (every reward would lack its term);
    for one that some rows lack, a warning with the count (it counts as 0 there)."""
    from horizon_engine.logged_facts import metric_coverage

    coverage = metric_coverage(rows, list(weights))
    absent = coverage.missing_everywhere()
    if absent:
        logged = ", ".join(repr(name) for name in coverage.logged) or "none"
        raise ConfigError(
            [
                f"{run.spec.where('timeline', 'reward')}: [timeline] reward weighs metric "
                f"{name!r}, which none of the {coverage.rows} rows carries in 'metrics' "
                f"(the rows carry: {logged})"
                for name in absent
            ]
        )
    return [
        f"reward weight {name!r}: {missing} of {coverage.rows} rows carry no {name!r} metric; "
        "it counts as 0 there"
        for name, missing in coverage.missing_somewhere().items()
    ]


def identify_feature_sets(
    sets: Mapping[str, tuple[Mapping[str, np.ndarray], Mapping[str, Any], bool]],
    config: NormalizationConfig,
    feature_types: Mapping[str, FeatureType],
    spec: PipelineSpec | None = None,
) -> tuple[Normalization, list[str]]:
    """Identify and fit each feature set (``state_features``, ``action_features``: its
    samples by feature, its overrides, whether its features are continuous actions), for the
    normalization stage from the timeline and for ``horizon gym train`` from its warm-up
    alike: the same rules, overrides and notes. Returns the normalization and the notes. An
    override of a feature the samples lack is an error, named with its file and line when the
    pipeline's ``spec`` is given."""
    from horizon_engine.normalization import identify_all

    normalization: Normalization = {}
    notes: list[str] = []
    for name, (samples, overrides, action) in sets.items():
        option = f"{'action_' if name == 'action_features' else ''}overrides"
        where = f"[normalization] {option}"
        if spec is not None:
            where = f"{spec.where('normalization', option)}: {where}"
        result = identify_all(samples, config, overrides, feature_types, action, where)
        normalization[name] = result.parameters
        notes += result.notes
    return normalization, notes


def run_normalization_stage(run: StageRun, choice: Choice) -> StageReport:
    """Identify and fit each feature's normalization from a sample of ``timeline/train``.

    State features always; action features too for parametric and continuous actions (whose
    actions are feature maps). Writes ``normalization.json``; notes (constant features, too few
    samples, overrides) become the stage's warnings.
    """
    config = choice.config
    folder = RunFolder(run.output_dir)
    info = folder.timeline_info()
    if not info.train_rows:
        raise HorizonError(
            f"[normalization] {folder.split('train')} holds no rows to fit the normalization on"
        )
    transform = choice.create()
    columns = {"state_features": ("state_features", config.overrides, False)}
    if info.action_type != "discrete":
        continuous = info.action_type == "continuous"
        columns["action_features"] = ("action", config.action_overrides, continuous)
    sets = {
        name: (
            transform.sample(run, folder.split("train"), column, config.num_samples),
            overrides,
            action,
        )
        for name, (column, overrides, action) in columns.items()
    }
    normalization, notes = identify_feature_sets(
        sets, config, run.plugins.feature_types(), run.spec
    )
    written = folder.write_normalization(normalization)
    report = StageReport("normalization", outputs=[written])
    report.warnings += notes
    for name, parameters in normalization.items():
        report.details[name] = dict(Counter(params.feature_type for params in parameters.values()))
    report.rows_in = report.rows_out = info.train_rows
    return report


def run_train_stage(run: StageRun, choice: Choice, resume: bool = False) -> StageReport:
    """Train on ``timeline/train``, evaluate on ``timeline/eval`` after every epoch; with
    ``resume``, from the last complete epoch's checkpoint in the folder (epoch 1 without one).

    The training driver (``horizon_engine.driver``) sets the trainer up for the timeline's
    problem and drives it: the timeline is loaded into dense tensors once and moved to the
    device once, or, when it does not fit ``[trainer] max_memory_gb`` (``[trainer] data``,
    ``streamed.choose_data``), read a row group at a time (``StreamedTimeline``); every epoch
    is one pass of shuffled minibatches (a seeded generator), then the trainer's evaluation,
    the per-epoch estimators, a checkpoint (``checkpoints/epoch-NNNN.pt`` and ``latest.pt``,
    written atomically) and ``horizon_on_epoch_end`` with the epoch's metrics. The per-epoch
    estimates are also written to ``cpe_epochs.json`` as each epoch ends
    (``horizon_engine.evaluation``), and every epoch's metrics to ``training_epochs.json`` once
    training ends (the report's curves). The first eval rows (train rows without an eval
    split) are kept to check the exported model on.
    """
    from dataclasses import replace

    from horizon_engine.driver import TrainingDriver, load_split, timeline_problem
    from horizon_engine.streamed import StreamedTimeline, choose_data, sampled_warning

    description, normalization = timeline_problem(run)
    driver = TrainingDriver(run, choice, description, normalization, plugins=run.plugins)
    folder = RunFolder(run.output_dir)
    train, evaluation = (
        StreamedTimeline.open(folder.split(split), description, 1, driver.device)
        for split in ("train", "eval")
    )
    data = choose_data(driver.config, train, evaluation)
    train = replace(train, buffer_rows=data.buffer_rows)
    evaluation = replace(evaluation, buffer_rows=data.buffer_rows)
    if data.train == "memory":
        train = load_split(run, description, "train", driver.device)
    if data.eval == "memory":
        evaluation = load_split(run, description, "eval", driver.device)
    checked = evaluation if len(evaluation) else train
    if isinstance(checked, StreamedTimeline):
        checked = checked.first_rows(driver.CHECK_ROWS)
    driver.save_check_rows(checked.tensors())
    warnings = [] if len(evaluation) else [_NO_EVAL_ROWS.format(folder.timeline)]
    estimators = None
    every_epoch = any(entry.config.every_epoch for entry in run.spec.evaluation)
    if every_epoch and len(evaluation) and distributed.is_writer():
        from horizon_engine.evaluation import EpisodeEvaluation, logged_horizon, read_metrics

        episodes = evaluation
        if isinstance(evaluation, StreamedTimeline):
            episodes = next(evaluation.episodes(data.eval_rows))
            warnings.append(sampled_warning(folder.split("eval"), len(episodes), len(evaluation)))
        metrics = read_metrics(folder.split("eval"))
        estimators = EpisodeEvaluation(
            run.spec.evaluation,
            description.action_type,
            episodes.to(driver.device),
            {name: values[: len(episodes)] for name, values in metrics.items()},
            run.seed,
            folder.file(RunFolder.CPE_EPOCHS),
            logged_horizon([folder.split("train"), folder.split("eval")]),
        )
    resumed_at = 0
    if resume and driver.resume(estimators, driver.planned_epochs(train)) is not None:
        resumed_at = driver.epoch
    history = driver.train_epochs(train, evaluation, estimators)
    recorded = []
    if distributed.is_writer():
        recorded.append(folder.write_training_epochs(history))
    if estimators is not None:
        estimators.write_epochs()
        recorded.append(RunFolder.CPE_EPOCHS)
    return StageReport(
        "train",
        rows_in=len(train),
        rows_out=len(train),
        outputs=[*driver.outputs, *driver.checkpoints, *recorded],
        warnings=warnings,
        details={
            "device": str(driver.device),
            "data": data.reason,
            "epochs": driver.planned_epochs(train),
            "updates": driver.updates,
            "length": driver.training_length(train),
            "applied": driver.applied_options(train),
            "eval_rows": len(evaluation),
            "first_epoch": history[0],
            "last_epoch": history[-1],
            **({"resumed_after_epoch": resumed_at} if resumed_at else {}),
        },
    )


_NO_EVAL_ROWS = (
    "{}/eval holds no rows: the trainer was not evaluated after each epoch, no estimator ran "
    "per epoch, and the exported model will be checked on training rows; raise [timeline] "
    "eval_fraction or log more episodes"
)
"""The train stage's warning for an empty eval split (the timeline stage's says why)."""


def run_export_stage(run: StageRun, choice: Choice) -> StageReport:
    """Export the trained policy (the checkpoint ``[export] checkpoint`` names: the latest,
    or the one the verdict chose) with the configured exporter."""
    from horizon_engine.export_stage import export_policy, shipped_checkpoint, trained_policy

    shipped = shipped_checkpoint(run.output_dir, choice)
    model = trained_policy(run.output_dir, run.spec.sections["trainer"], run.plugins, shipped)
    exported = export_policy(run, choice, model)
    details = {**exported["details"], "checkpoint": shipped.relative_to(run.output_dir).as_posix()}
    return StageReport("export", outputs=exported["outputs"], details=details)


def select_stages(
    spec: PipelineSpec, stages: list[Stage], names: list[str] | None = None
) -> list[Stage]:
    """Of the registered ``stages`` (in run order), those a run of ``spec`` executes: every
    configured one (written or run at its defaults), or those of them ``names`` (``--stages``)
    chooses."""
    configured = [stage for stage in stages if stage.configured(spec)]
    if not names:
        return configured
    by_name = {stage.name: stage for stage in stages}
    problems = []
    for name in names:
        if name not in by_name:
            problems.append(f"--stages: unknown stage '{name}'; stages: {', '.join(by_name)}")
        elif by_name[name] not in configured:
            problems.append(
                f"--stages: stage '{name}' has no [{by_name[name].section}] section in "
                f"{spec.origin}"
            )
    if problems:
        raise ConfigError(problems)
    return [stage for stage in configured if stage.name in names]


@dataclass(frozen=True)
class PlannedStage:
    """A stage a run will execute, as ``horizon validate`` lists it."""

    name: str
    component: str
    """The component that runs it (``dqn``; ``engine local`` for an engine; ``-`` for a section
    that selects none)."""
    settings: str
    """Where its settings come from (``PipelineSpec.settings_origin``)."""


def planned_stages(spec: PipelineSpec, stages: list[Stage]) -> list[PlannedStage]:
    """Each of the registered ``stages`` a run of ``spec`` (``[pipeline] stages``, or every
    configured stage) executes, with its component and where its settings come from."""

    def component(choice: Choice) -> str:
        if choice.component is None:
            return "-"
        if choice.rule.selector == "engine":
            return f"engine {choice.component.name}"
        return choice.component.name

    planned = []
    for stage in select_stages(spec, stages, spec.pipeline.stages):
        choice = stage.choice(spec)
        if isinstance(choice, list):  # [[evaluation]]: each entry by its label
            from horizon_engine.evaluation import estimator_labels

            shown = ", ".join(estimator_labels(choice))
        else:
            shown = component(choice)
        planned.append(PlannedStage(stage.name, shown, spec.settings_origin(stage.section)))
    return planned


RESULT_NEUTRAL_OPTIONS = frozenset({"pipeline.output_dir", "pipeline.name", "pipeline.stages"})
"""Resolved config keys ``--resume`` lets differ from the interrupted run's: they change no
result (the folder is the run's own by construction; the stages are chosen by the resume)."""


NO_SOURCE = (
    "{origin}: no [source] section{why}; add a [source] section naming the logged rows "
    "(`horizon plugins` lists the kinds): the stages between it and [trainer] run at their "
    "defaults"
)
"""The error of a pipeline with no rows to read, ``why`` saying what would have read them."""


@dataclass(frozen=True)
class ResumePlan:
    """What ``--resume`` does: the stages to run, the one among them that continues from its
    interrupted run's outputs (None: each runs from scratch), and the runs it continues."""

    stages: list[Stage]
    continued_stage: str | None
    continued_runs: list[str]


def plan_resume(
    spec: PipelineSpec, earlier: EarlierRun | None, selected: list[Stage]
) -> ResumePlan:
    """The ``ResumePlan`` for the folder's ``earlier`` run: refused when there is none, when
    the config differs from the one it recorded in a key that may change results, and with
    ``NothingToResume`` when it completed every selected stage."""
    output_dir = spec.pipeline.output_dir
    if earlier is None:
        raise HorizonError(
            f"--resume: {output_dir} holds no run to resume (no readable "
            f"{RunFolder.MANIFEST}); run without --resume to start one"
        )
    if earlier.manifest.get("command"):
        raise HorizonError(
            f"--resume: {output_dir} holds a run of `{earlier.manifest['command']}`, not of "
            "horizon run; resume it with that command"
        )
    changed = earlier.config_changes(spec.resolved(), RESULT_NEUTRAL_OPTIONS)
    if changed:
        raise HorizonError(
            f"--resume: the config differs from the one {earlier.describe()} recorded in "
            f"{Path(output_dir) / RunFolder.MANIFEST}, in {', '.join(changed)}; resuming would "
            "not give that run's result. Undo the change (the same file and --set options), or "
            "start a new run (--overwrite, or another output_dir)"
        )
    incomplete = earlier.incomplete_stages()
    complete = {
        name
        for name, record in earlier.stages.items()
        if isinstance(record, dict) and name not in incomplete and not record.get("stale")
    }
    pending = [index for index, stage in enumerate(selected) if stage.name not in complete]
    if not pending:
        raise NothingToResume(
            f"nothing to resume: {earlier.describe()} completed every stage "
            f"({', '.join(stage.name for stage in selected)}); see "
            f"{Path(output_dir) / RunFolder.MANIFEST}"
        )
    stages = selected[pending[0] :]
    first = stages[0]
    if not (first.resumes_from and first.name in incomplete):
        return ResumePlan(stages, None, [])
    earlier_runs = earlier.manifest.get("continued_runs")
    continued = [earlier.run_id, *(earlier_runs if isinstance(earlier_runs, list) else [])]
    return ResumePlan(stages, first.name, [str(run_id) for run_id in continued])


class Engine:
    """The Python API: ``Engine().run("pipeline.toml")`` or ``Engine().run(config_dict)``."""

    def __init__(
        self, plugins: PluginHost | None = None, show_progress: bool | None = None
    ) -> None:
        self.plugins = plugins or get_plugin_host()
        self.show_progress = sys.stdout.isatty() if show_progress is None else show_progress

    def validate(
        self,
        config: str | Path | Mapping[str, Any],
        overrides: Iterable[str] = (),
        stages: Iterable[str] | None = None,
    ) -> PipelineSpec:
        """Load and validate a pipeline without running it: its config, and what can be
        checked before a stage runs (``horizon_engine.preflight``) for ``stages`` (every
        configured one by default)."""
        spec = build_spec(config, self.plugins, overrides)
        registered = self.plugins.stages()
        problems = [
            problem
            for stage in registered
            if stage.check is not None and stage.configured(spec)
            for problem in stage.check(spec, stage.section)
        ]
        if not spec.sections and not problems:
            problems.append(NO_SOURCE.format(origin=spec.origin, why=": nothing would run"))
        normalization = spec.sections.get("normalization")
        if normalization is not None:
            from horizon_engine.normalization import override_problem

            known = self.plugins.feature_types()
            for option in ("overrides", "action_overrides"):
                for feature, override in getattr(normalization.config, option).items():
                    kind = override if isinstance(override, str) else override.type
                    if kind in known:
                        problem = override_problem(override, known[kind])
                    else:
                        problem = f"unknown type {kind!r}; types: {', '.join(sorted(known))}"
                    if problem is None:
                        continue
                    where = spec.where(f"normalization.{option}", feature)
                    if where == spec.origin:  # an inline table: the line of the option
                        where = spec.where("normalization", option)
                    problems.append(
                        f"{where}: [normalization] {option}: feature {feature!r}: {problem}"
                    )
        if problems:
            raise ConfigError(problems)
        selected = select_stages(spec, registered, list(stages) if stages else spec.pipeline.stages)
        output_dir = Path(spec.pipeline.output_dir)
        unconfigured = {
            needed: producer
            for stage in selected
            for needed in stage.reads
            for producer in registered
            if matches(needed, producer.claims) and not producer.configured(spec)
        }
        missing = {  # without [trainer], the preflight says what needs it
            producer.section: needed
            for needed, producer in unconfigured.items()
            if producer.section != "trainer" and not (output_dir / needed).exists()
        }
        if missing and "source" not in spec.sections:
            needed = next(iter(missing.values()))
            why = f", and {output_dir / needed} does not exist: the stages to run read it"
            raise ConfigError([NO_SOURCE.format(origin=spec.origin, why=why)])
        if missing:
            raise ConfigError(
                [
                    f"{spec.origin}: no [{section}] section, and {output_dir / needed} does not "
                    f"exist: the stages to run read it; add the [{section}] section"
                    for section, needed in missing.items()
                ]
            )
        check_before_run(spec, selected)
        return spec

    def run(
        self,
        config: str | Path | Mapping[str, Any],
        overrides: Iterable[str] = (),
        stages: Iterable[str] | None = None,
        overwrite: bool = False,
        resume: bool = False,
    ) -> dict[str, Any]:
        """Run the pipeline's stages (all configured ones, or ``stages``); return the manifest.

        Without ``stages`` this is a new run: in a folder holding an earlier run's outputs it
        refuses unless ``overwrite``. With ``stages`` it continues the folder's run: the stages
        named replace their own earlier outputs and the others are carried over (see
        ``horizon_engine.run_folder``). With ``resume`` it finishes the folder's interrupted
        run (``plan_resume``; the module docstring says how).

        Launched as several processes (``horizon_engine.distributed``: ``horizon run --nproc``
        or torchrun), rank 0 runs the stages as one process would and writes everything; the
        other ranks wait for it, join it for the train stage, and return its manifest.
        """
        with distributed.process_group(), ExitStack() as held:
            if not distributed.is_writer():
                return self._follow_writer(config, overrides)
            followers = distributed.Followers()
            try:
                manifest = self._run_stages(
                    config, overrides, stages, overwrite, resume, followers, held
                )
            except BaseException:
                followers.end(succeeded=False)
                raise
            followers.end(succeeded=True)
            return manifest

    def _follow_writer(
        self, config: str | Path | Mapping[str, Any], overrides: Iterable[str]
    ) -> dict[str, Any]:
        """A rank other than 0: the train stage each time rank 0 starts it, nothing else;
        then rank 0's manifest."""
        spec = build_spec(config, self.plugins, overrides)
        output_dir = Path(spec.pipeline.output_dir)
        train = next(s for s in self.plugins.stages() if s.name == distributed.TRAINING_STAGE)
        while "end" not in (message := distributed.receive()):
            _check_shared(output_dir, message["run_id"])
            run = StageRun.start(spec, self.plugins, message["run_id"], False, output_dir)
            if message["resume"]:
                train.run(run, train.choice(spec), resume=True)
            else:
                train.run(run, train.choice(spec))
        if not message["succeeded"]:
            raise distributed.WriterFailed(
                f"rank {distributed.rank()} stopped: rank 0's run failed (its message says why)"
            )
        earlier = read_earlier_run(output_dir)
        return earlier.manifest if earlier is not None else {}

    def _run_stages(
        self,
        config: str | Path | Mapping[str, Any],
        overrides: Iterable[str],
        stages: Iterable[str] | None,
        overwrite: bool,
        resume: bool,
        followers: distributed.Followers,
        held: ExitStack,
    ) -> dict[str, Any]:
        """``run`` on rank 0 (or alone): ``followers`` are told when the train stage starts;
        the run folder is held (``RunFolder.held``) from before anything is removed in it
        until ``held`` closes, so nothing is removed or written through a link swapped in."""
        stages = list(stages) if stages else None
        if resume and (stages is not None or overwrite):
            raise HorizonError(
                "--resume finishes the folder's run as it was configured: it takes neither "
                "--stages nor --overwrite"
            )
        spec = self.validate(config, overrides, stages)
        registered = self.plugins.stages()
        selected = select_stages(spec, registered, stages or spec.pipeline.stages)
        output_dir = Path(spec.pipeline.output_dir)
        earlier = read_earlier_run(output_dir)
        plan = plan_resume(spec, earlier, selected) if resume else ResumePlan(selected, None, [])
        selected = plan.stages
        claims = {stage.name: stage.claims for stage in registered}
        names = [stage.name for stage in selected]
        resuming = stages is not None or resume
        held.enter_context(RunFolder(output_dir).held())
        notes = take_over(output_dir, earlier, claims, names, resuming, overwrite)
        run = StageRun.start(
            spec, self.plugins, uuid.uuid4().hex[:12], self.show_progress, output_dir
        )
        manifest = self._start_manifest(run, earlier if resuming else None, notes)
        if plan.continued_stage is not None:
            manifest["continued_runs"] = plan.continued_runs
        try:
            for stage in selected:
                continued = stage.name == plan.continued_stage
                self._check_inputs(run, stage, manifest)
                self._clear_stage(run, stage, earlier if resuming else None, manifest, continued)
                self.plugins.on_stage_start(run, stage.name)
                started = time.perf_counter()
                if stage.name == distributed.TRAINING_STAGE:
                    followers.start_training(run.run_id, continued)
                with import_clock() as imports:
                    if continued:
                        report = stage.run(run, stage.choice(spec), resume=True)
                        report.outputs += _files_of_runs(output_dir, plan.continued_runs)
                    else:
                        report = stage.run(run, stage.choice(spec))
                followers.training_done()
                report.seconds = round(time.perf_counter() - started, 3)
                report.import_seconds = round(imports.seconds, 3)
                self._record(run, manifest, stage, report)
                self.plugins.on_stage_end(run, stage.name, report)
                self._record(run, manifest, stage, report)
        except BaseException as exc:
            failed = manifest["running_stage"]
            interrupted = isinstance(exc, KeyboardInterrupt)
            if failed:
                # What the stage wrote before it failed is no stage's whole output.
                manifest["running_stage"] = None
                manifest["incomplete_stages"][failed] = (
                    f"run {run.run_id} {'was interrupted' if interrupted else 'failed'} during it"
                )
            finish = partial(self._finish_interrupted if interrupted else self._finish, run)
            blamed = self.plugins.blame(exc)
            record_failure(manifest, blamed or exc, failed, finish)
            if blamed is not None:
                raise blamed from exc
            raise
        manifest["status"] = "succeeded"
        self._finish(run, manifest)
        return manifest

    def _check_inputs(self, run: StageRun, stage: Stage, manifest: dict[str, Any]) -> None:
        """Every file the stage reads exists (those it reads only when written, where they
        do) and is whole: not left by an interrupted stage."""
        present = [path for path in stage.reads_when_written if (run.output_dir / path).exists()]
        for needed in (*stage.reads, *present):
            producer = next(s.name for s in self.plugins.stages() if matches(needed, s.claims))
            why = manifest["incomplete_stages"].get(producer)
            if why:
                raise StageInputError(
                    f"stage '{stage.name}' reads {run.output_dir / needed}, which is incomplete: "
                    f"{why}. Run stage '{producer}' again first (--stages {producer},"
                    f"{stage.name})"
                )
            if not (run.output_dir / needed).exists():
                raise StageInputError(
                    f"stage '{stage.name}' reads {run.output_dir / needed}, which stage "
                    f"'{producer}' writes; run that stage first (or include it in --stages)"
                )
            record = manifest["stages"].get(producer, {})
            if record.get("stale"):
                manifest["warnings"].append(
                    f"stage '{stage.name}' reads {needed}, which is stale: {record['stale']}"
                )

    def _clear_stage(
        self,
        run: StageRun,
        stage: Stage,
        earlier: EarlierRun | None,
        manifest: dict[str, Any],
        continued: bool = False,
    ) -> None:
        """Before a stage runs: remove what it wrote in an earlier run (checkpoints and event
        files included, so none outlives its run), but for a ``continued`` stage the outputs
        it resumes from, and record it as running."""
        outputs = set(manifest["stages"].get(stage.name, {}).get("outputs", []))
        if earlier is not None and stage.name in earlier.incomplete_stages():
            outputs |= set(existing_claims(run.output_dir, stage.claims))
        for path in sorted(outputs):
            # A carried-over record is input: only paths the stage claims are its to remove.
            if matches(path, stage.claims) and not (
                continued and matches(path, stage.resumes_from)
            ):
                remove_inside(run.output_dir, path, f"{RunFolder.MANIFEST}: stage '{stage.name}'")
        manifest["stages"].pop(stage.name, None)
        manifest["running_stage"] = stage.name
        RunFolder(run.output_dir).write_manifest(manifest)

    def _record(
        self, run: StageRun, manifest: dict[str, Any], stage: Stage, report: StageReport
    ) -> None:
        """Record a finished stage; carried-over outputs of later stages become stale."""
        manifest["stages"][stage.name] = {**asdict(report), "run_id": run.run_id}
        if "verdict" in report.details:
            manifest["verdict"] = report.details["verdict"]
        manifest["incomplete_stages"].pop(stage.name, None)
        if stage.name not in manifest["executed"]:
            manifest["executed"].append(stage.name)
        for name in readers_of(stage, self.plugins.stages()):
            record = manifest["stages"].get(name)
            if record and record["run_id"] != run.run_id and not record.get("stale"):
                record["stale"] = (
                    f"written by run {record['run_id']} from the outputs of stage "
                    f"'{stage.name}' that run {run.run_id} has since replaced"
                )
                if "verdict" in record.get("details", {}) and isinstance(
                    manifest.get("verdict"), dict
                ):
                    manifest["verdict"]["stale"] = record["stale"]
        manifest["running_stage"] = None
        RunFolder(run.output_dir).write_manifest(manifest)

    def _start_manifest(
        self, run: StageRun, earlier: EarlierRun | None, notes: list[str]
    ) -> dict[str, Any]:
        """The new run's manifest; continuing an earlier run (``earlier``), its stage records
        are carried over, each naming the run that wrote it."""
        carried = {}
        incomplete: dict[str, str] = {}
        if earlier is not None:
            incomplete = earlier.incomplete_stages()
            for name, record in earlier.stages.items():
                if isinstance(record, dict) and name not in incomplete:
                    carried[name] = {**record, "run_id": record.get("run_id", earlier.run_id)}
        return RunFolder(run.output_dir).start_manifest(
            run.run_id,
            run.seed,
            run.spec.origin,
            run.spec.resolved(),
            self.plugins,
            name=run.spec.pipeline.name,
            sections_at_defaults=list(run.spec.at_defaults),
            executed=[],
            running_stage=None,
            stages=carried,
            incomplete_stages=incomplete,
            warnings=list(notes),
            **_carried_verdict(carried),
        )

    def _finish(self, run: StageRun, manifest: dict[str, Any]) -> None:
        """Write the final manifest, then tell the plugins; a failing observer is not hidden,
        but on a failed run it must not mask the stage's own error (see ``run``)."""
        RunFolder(run.output_dir).finish_manifest(manifest, partial(self.plugins.on_run_end, run))

    def _finish_interrupted(self, run: StageRun, manifest: dict[str, Any]) -> None:
        """``_finish`` for a run stopped by Ctrl-C (or SIGTERM): ``"status": "interrupted"``,
        which ``--resume`` continues."""
        RunFolder(run.output_dir).finish_interrupted(
            manifest, partial(self.plugins.on_run_end, run)
        )


def _carried_verdict(carried: dict[str, Any]) -> dict[str, Any]:
    """``{"verdict": ...}`` of a carried-over evaluation stage's record, so that a run that
    continues an evaluated one still opens with its verdict (marked stale with the record);
    nothing when no evaluation was carried."""
    record = carried.get("evaluation")
    details = record.get("details") if isinstance(record, dict) else None
    verdict = details.get("verdict") if isinstance(details, dict) else None
    if not isinstance(verdict, dict):
        return {}
    if record.get("stale"):
        verdict = {**verdict, "stale": record["stale"]}
    return {"verdict": verdict}


def _check_shared(output_dir: Path, run_id: str) -> None:
    """A rank other than 0 sees the run folder rank 0 writes (its manifest names run
    ``run_id``), or stops with what to do: the ranks share one folder."""
    earlier = read_earlier_run(output_dir)
    if earlier is None or earlier.run_id != run_id:
        raise HorizonError(
            f"rank {distributed.rank()}: {output_dir} does not hold rank 0's run {run_id}: every "
            "process must see the output folder at the same path (one machine, or a shared "
            "filesystem such as NFS across machines)"
        )


def _files_of_runs(folder: Path, run_ids: list[str]) -> list[str]:
    """The files directly under ``folder``'s subfolders named for one of ``run_ids`` (the
    lifecycle reporters' convention, such as TensorBoard's event files): a continued stage's
    outputs written by the runs it continues."""
    return sorted(
        str(path.relative_to(folder))
        for run_id in run_ids
        for path in folder.glob(f"*/*.{run_id}")
        if path.is_file()
    )


def run_pipeline(
    config: str | Path | Mapping[str, Any],
    overrides: Iterable[str] = (),
    stages: Iterable[str] | None = None,
    overwrite: bool = False,
    resume: bool = False,
) -> dict[str, Any]:
    """Shorthand for ``Engine().run(...)``."""
    return Engine().run(config, overrides, stages, overwrite, resume)
