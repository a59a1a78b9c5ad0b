"""Checks that need more than the config's own types, made before a run's first stage.

A config can be well-formed and still fail an hour in: a source path that matches no file, a
GPU that is not there, a warm start from a folder that holds no checkpoint, a trainer that
wants n-step windows the timeline does not build. Each is checked here, from the config and
what is on disk, so that ``horizon validate`` reports it and ``horizon run`` stops before any
stage writes an output, with the file and line as config errors have.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from horizon_engine.errors import ConfigError, HorizonError
from horizon_engine.run_folder import RunFolder, output_dir_problem

if TYPE_CHECKING:
    from horizon_engine.config import PipelineSpec
    from horizon_engine.stages import Stage


def preflight_problems(spec: PipelineSpec, selected: list[Stage]) -> list[str]:
    """Every problem found for running the ``selected`` stages of ``spec``."""
    stages = [stage.name for stage in selected]
    problems: list[str] = []
    output_dir = Path(spec.pipeline.output_dir)
    problem = output_dir_problem(output_dir, spec.where("pipeline", "output_dir"))
    if problem:
        problems.append(problem)
    if "source" in stages and "source" in spec.sections:
        for problem in spec.sections["source"].create().problems():
            problems.append(f"{spec.where('source', 'path')}: {problem}")
    for stage, section in (("evaluation", "[[evaluation]]"), ("export", "[export]")):
        if stage in stages and "trainer" not in spec.sections:
            problems.append(
                f"{spec.where(stage)}: {section} needs the [trainer] section the policy was "
                "trained with (the stage restores its latest checkpoint into that trainer)"
            )
    timeline = spec.sections.get("timeline")
    if {"timeline", "evaluation"} <= set(stages) and timeline and not timeline.config.eval_fraction:
        problems.append(
            f"{spec.where('timeline', 'eval_fraction')}: [timeline] eval_fraction = 0 holds out "
            "no episodes, and [[evaluation]] estimates the policy's value on the held-out ones; "
            "hold some out (the default is 0.1) or remove [[evaluation]]"
        )
    if "trainer" in spec.sections and ({"train", "export"} & set(stages)):
        problems += _trainer_problems(spec, output_dir, "train" in stages, "timeline" in stages)
    for stage in selected:
        if stage.rule.family == "trainers" and stage.section in spec.sections:
            problems += _network_size_problems(spec, stage.section)
    return problems + _data_problems(spec, output_dir, stages)


def _data_problems(spec: PipelineSpec, output_dir: Path, stages: list[str]) -> list[str]:
    """Options that name what the data must hold, checked against the data a stage reads when
    it is on disk already and no earlier stage of this run rewrites it (a run of later stages
    only, a resumed run): a ``[timeline] reward`` weight for a metric no row of
    ``source/rows.parquet`` carries, a ``[normalization]`` override for a feature the
    timeline's train split does not hold. Otherwise the stage that first reads the data
    refuses them, naming the key. Each reads one column of the data, and only when such an
    option is set; data that cannot be read is left to the stage, which says why."""
    import pyarrow as pa

    from horizon_engine.normalization import sort_feature_ids

    folder = RunFolder(output_dir)
    problems: list[str] = []
    timeline = spec.sections.get("timeline")
    rows = folder.file(RunFolder.SOURCE_ROWS)
    weights = getattr(timeline.config, "reward", None) if timeline else None
    if weights and "timeline" in stages and "source" not in stages and rows.is_file():
        from horizon_engine.logged_facts import metric_coverage

        try:
            coverage = metric_coverage(rows, list(weights))
        except (OSError, pa.ArrowException, KeyError):
            coverage = None
        for name in coverage.missing_everywhere() if coverage else []:
            logged = ", ".join(repr(metric) for metric in coverage.logged) or "none"
            problems.append(
                f"{spec.where('timeline', 'reward')}: [timeline] reward weighs metric {name!r}, "
                f"which none of the {coverage.rows} rows of {rows} carries in 'metrics' (the "
                f"rows carry: {logged})"
            )
    normalization = spec.sections.get("normalization")
    train = folder.split("train")
    if normalization and "normalization" in stages and "timeline" not in stages and train.is_dir():
        columns = {"overrides": "state_features", "action_overrides": "action"}
        for option, column in columns.items():
            overrides = getattr(normalization.config, option, None)
            if not overrides:
                continue
            try:
                features = _feature_ids(train, column)
            except (OSError, pa.ArrowException, KeyError):
                continue
            for feature in overrides:
                if features is not None and feature not in features:
                    where = spec.where(f"normalization.{option}", feature)
                    if where == spec.origin:  # an inline table: the line of the option
                        where = spec.where("normalization", option)
                    problems.append(
                        f"{where}: [normalization] {option}: "
                        f"feature {feature!r} is not in the data: no row of {train} holds it; "
                        f"features: {', '.join(sort_feature_ids(features)) or 'none'}"
                    )
    return problems


def _feature_ids(split: Path, column: str) -> set[str] | None:
    """The feature ids the map column ``column`` of a timeline split holds in any row; None
    when the column is not a map (the discrete actions' names)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from horizon_engine.schema import map_entries

    dataset = ds.dataset(split, format="parquet")
    if column not in dataset.schema.names or not pa.types.is_map(dataset.schema.field(column).type):
        return None
    found: set[str] = set()
    for batch in dataset.to_batches(columns=[column]):
        _, keys, _ = map_entries(batch.column(0))
        found.update(str(key) for key in pc.unique(keys).to_pylist())
    return found


BYTES_PER_WEIGHT = 16
"""What training holds per weight: the float32 weight, its gradient and two optimizer moments
(Adam's), 4 bytes each; target networks and activations come on top."""


def _network_size_problems(spec: PipelineSpec, section: str) -> list[str]:
    """A ``layers`` option (``layers``, ``actor_layers``, ...: the hidden layers' widths) whose
    networks could not be trained in this machine's memory: refused before torch tries to
    allocate them, which fails slowly or takes the machine down."""
    memory = _machine_memory()
    config = spec.sections[section].config
    problems = []
    for name in type(config).model_fields:
        widths = getattr(config, name)
        if not name.endswith("layers") or not isinstance(widths, list | tuple):
            continue
        if not all(isinstance(width, int) for width in widths):
            continue
        weights = sum(a * b for a, b in itertools.pairwise(widths)) + sum(widths)
        needed = weights * BYTES_PER_WEIGHT
        if memory is not None and needed > memory:
            problems.append(
                f"{spec.where(section, name)}: [{section}] {name} = {list(widths)} makes "
                f"networks of about {weights:.3g} weights, {needed / 2**30:,.0f} GiB to train "
                f"({BYTES_PER_WEIGHT} bytes each: weight, gradient, optimizer moments), more "
                f"than this machine's {memory / 2**30:,.0f} GiB of memory; use narrower layers"
            )
    return problems


def _machine_memory() -> int | None:
    """The machine's memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _trainer_problems(
    spec: PipelineSpec, output_dir: Path, training: bool, rebuilding: bool
) -> list[str]:
    config = spec.sections["trainer"].config
    problems = []
    device = getattr(config, "device", "auto")
    if device == "cuda" and not _cuda_available():
        problems.append(
            f'{spec.where("trainer", "device")}: [trainer] device = "cuda", but torch finds '
            'no CUDA device on this machine; use "auto" (a GPU when there is one) or "cpu"'
        )
    warm_start = getattr(config, "warm_start_from", None)
    if training and warm_start and Path(warm_start).resolve() == output_dir.resolve():
        problems.append(
            f"{spec.where('trainer', 'warm_start_from')}: [trainer] warm_start_from = "
            f"{warm_start!r} is this run's own output_dir, whose checkpoints the train stage "
            "replaces before it could read them; to continue this run's training, run "
            "`horizon run PIPELINE --resume` (without warm_start_from)"
        )
    elif training and warm_start and not RunFolder(warm_start).latest_checkpoint.is_file():
        found = (
            "does not exist"
            if not Path(warm_start).exists()
            else f"has no {RunFolder.LATEST_CHECKPOINT}"
        )
        problems.append(
            f"{spec.where('trainer', 'warm_start_from')}: [trainer] warm_start_from = "
            f"{warm_start!r} {found}; it names the output folder of an earlier run"
        )
    elif training and warm_start:
        problems += _warm_start_problems(spec, Path(warm_start))
    timeline_n_step, origin = _timeline_n_step(spec, output_dir, rebuilding)
    if training and timeline_n_step is not None:
        trainer = spec.sections["trainer"].component.cls
        for option, message in trainer.data_problems(config, timeline_n_step, origin).items():
            problems.append(f"{spec.where('trainer', option)}: {message}")
    return problems


def _warm_start_problems(spec: PipelineSpec, earlier: Path) -> list[str]:
    """The warm start's checkpoint read and its structure checked as the train stage will
    (``training.load_checkpoint``), so that a crafted or damaged one fails validate rather
    than the run; whether its state fits the trainer is known only once it is set up."""
    from horizon_engine.training import load_checkpoint

    try:
        load_checkpoint(earlier)
    except HorizonError as exc:
        return [f"{spec.where('trainer', 'warm_start_from')}: {exc}"]
    return []


def _timeline_n_step(
    spec: PipelineSpec, output_dir: Path, rebuilding: bool
) -> tuple[int | None, str]:
    """The timeline's n-step window: ``[timeline] n_step`` when set, else (the timeline not
    being built again) what the timeline on disk records; None when neither says. An unset
    ``n_step`` builds 3-step windows from logged decisions but none from Horizon's timeline
    rows, so until the timeline is built the trainer's own check has the last word."""
    if "timeline" in spec.sections:
        n_step = getattr(spec.sections["timeline"].config, "n_step", None)
        if n_step is not None:
            return n_step, f"[timeline] ({spec.where('timeline', 'n_step')})"
    if rebuilding:
        return None, ""
    info = output_dir / RunFolder.TIMELINE_INFO
    try:
        return int(json.loads(info.read_text(encoding="utf-8"))["n_step"]), str(info)
    except (OSError, ValueError, KeyError, TypeError):
        return None, ""


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def check_before_run(spec: PipelineSpec, selected: list[Stage]) -> None:
    """Raise a ``ConfigError`` listing every preflight problem, if any."""
    problems = preflight_problems(spec, selected)
    if problems:
        raise ConfigError(problems)
