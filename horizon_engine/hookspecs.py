"""Every hook Horizon Engine calls, in one place.

Three kinds of hook live here. The seven component families' ``horizon_register_*`` hooks, and
``horizon_register_stages`` for pipeline stages, hand the plugin a ``register`` callback, so
the core owns naming, duplicate detection and config validation (the pattern of ``llm`` and
``tox``). ``horizon_register_commands`` adds subcommands to the
``horizon`` command line (``horizon gym`` is one, registered by a built-in plugin). The
``horizon_on_*`` lifecycle hooks observe a run; they are called per stage, per epoch or per
run, never per row.

A plugin implements hooks with ``from horizon_engine import hookimpl``. ``docs/plugins.md``
documents each hook for plugin authors; a meta-test keeps the two in step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import click

    from horizon_engine.components import Component
    from horizon_engine.report_page import ReportSection
    from horizon_engine.run_context import RunContext, StageReport
    from horizon_engine.run_folder import RunFolder
    from horizon_engine.stages import Stage

Register = Callable[[type["Component"]], None]
"""The callback a ``horizon_register_*`` hook receives: call it once per component class."""

hookspec = pluggy.HookspecMarker("horizon")
hookimpl = pluggy.HookimplMarker("horizon")


@hookspec
def horizon_register_data_sources(register: Register) -> None:
    """Register readers of logged rows (pre-timeline or timeline), such as ``jsonl`` or ``gym``.

    Called once, when the plugins are loaded. ``register(cls)`` takes a subclass of
    ``horizon_engine.DataSource``; its ``name`` is what ``[source] kind`` selects.
    Returns nothing.
    """


@hookspec
def horizon_register_timeline_engines(register: Register) -> None:
    """Register timeline engines, such as ``local`` or the Spark plugin's ``spark``.

    Called once, when the plugins are loaded. ``register(cls)`` takes a subclass of
    ``horizon_engine.TimelineEngine``; its ``name`` is what ``[timeline] engine`` selects.
    Returns nothing.
    """


@hookspec
def horizon_register_normalization_engines(register: Register) -> None:
    """Register normalization engines (how the feature sample is drawn), such as ``local``.

    Called once, when the plugins are loaded. ``register(cls)`` takes a subclass of
    ``horizon_engine.NormalizationEngine``; its ``name`` is what ``[normalization] engine``
    selects. Returns nothing.
    """


@hookspec
def horizon_register_feature_types(register: Register) -> None:
    """Register normalization types, such as ``continuous`` or ``enum``.

    Called once, when the plugins are loaded. ``register(cls)`` takes a subclass of
    ``horizon_engine.FeatureType``; its ``name`` is what a feature's ``feature_type`` in
    ``normalization.json`` and ``[normalization] overrides`` name. Returns nothing.
    """


@hookspec
def horizon_register_transforms(register: Register) -> None:
    """Deprecated: register with the three hooks above instead.

    Called once, when the plugins are loaded. Each class ``register(cls)`` takes goes to the
    family of its base class (``TimelineEngine``, ``NormalizationEngine`` or ``FeatureType``),
    and the plugin is reported as using a deprecated hook. Returns nothing.
    """


@hookspec
def horizon_register_trainers(register: Register) -> None:
    """Register trainers, such as ``dqn`` or ``sac``.

    Called once, when the plugins are loaded. ``register(cls)`` takes a subclass of
    ``horizon_engine.Trainer``; its ``name`` is what ``[trainer] kind`` selects.
    Returns nothing.
    """


@hookspec
def horizon_register_estimators(register: Register) -> None:
    """Register counterfactual policy estimators, such as ``ips`` or ``magic``.

    Called once, when the plugins are loaded. ``register(cls)`` takes a subclass of
    ``horizon_engine.Estimator``; its ``name`` is what ``[[evaluation]] kind`` selects.
    Returns nothing.
    """


@hookspec
def horizon_register_exporters(register: Register) -> None:
    """Register model exporters, such as ``onnx``.

    Called once, when the plugins are loaded. ``register(cls)`` takes a subclass of
    ``horizon_engine.Exporter``; its ``name`` is what ``[export] kind`` selects.
    Returns nothing.
    """


@hookspec
def horizon_register_stages(register: Callable[[Stage], None]) -> None:
    """Register pipeline stages, such as the core's ``train`` or the world model's ``analysis``.

    Called once, when the plugins are loaded. ``register(stage)`` takes a
    ``horizon_engine.Stage``: its name (what ``--stages`` and the manifest say), the section
    of pipeline.toml that configures it with the rule by which that section picks its
    component (``horizon_engine.SectionRule``), the run-relative paths it reads and those it
    writes, and its run function. A run executes the configured stages each after the stages
    whose outputs it reads, ties in registration order. A stage with the name, section or a
    written path of another, one reading a path no stage writes, or one in a cycle of reads
    leaves its plugin out, as a plugin failure. Returns nothing.
    """


@hookspec
def horizon_register_commands(cli: click.Group) -> None:
    """Add subcommands to the ``horizon`` command line, such as ``gym`` or ``serve``.

    Called once, the first time the command line needs a command it does not have built in
    (or lists its commands, for ``horizon --help``). ``cli`` is a ``click.Group``: add commands
    with ``cli.add_command(command)`` or ``@cli.command()``. A command whose name the core or
    an earlier plugin already uses is refused, and the refusal is reported as a plugin failure
    by ``horizon plugins``; the plugin's other commands are kept. Returns nothing.
    """


@hookspec
def horizon_report_sections(folder: RunFolder) -> list[ReportSection] | None:
    """Sections a plugin adds to a run's report page (``horizon report``, the report stage).

    ``folder`` is the run's ``RunFolder``; return ``ReportSection`` objects (their bodies
    built with ``horizon_engine.report_page``'s helpers and ``horizon_engine.figures``'
    charts), one absent with its reason where the run has nothing for it. They follow the
    core's sections. A plugin whose hook raises gets a section saying so, naming the plugin;
    the rest of the page is still written. Returns the sections, or None to add nothing.
    """


@hookspec
def horizon_on_stage_start(run: RunContext, stage: str) -> None:
    """Called before a pipeline stage runs.

    ``run`` is the ``RunContext`` (output folder, seed, run id); ``stage`` is the stage name
    (``source``, ``timeline``, ``normalization``, ``train``, ``evaluation``, ``export``,
    ``report``, or a plugin's).
    Returns nothing.
    """


@hookspec
def horizon_on_stage_end(run: RunContext, stage: str, report: StageReport) -> None:
    """Called after a stage finished, its outputs were renamed into place and the manifest saved.

    ``report`` is the stage's ``StageReport``: rows in and out, rows dropped with reasons,
    files written, seconds taken. An observer that wrote files into the run folder during the
    stage appends their run-relative paths to ``report.outputs``: the manifest is saved again
    after this hook, and the outputs it lists are the run's to replace later. Returns nothing.
    """


@hookspec
def horizon_on_epoch_end(run: RunContext, epoch: int, metrics: dict[str, float]) -> None:
    """Called by the training loop after each epoch, with that epoch's metrics.

    ``metrics`` maps names such as ``Training/td_loss`` to floats (CPE figures included once
    estimators ran). Reporters such as TensorBoard implement this hook. ``horizon gym train``
    calls it after each evaluation, numbered from 1 as ``epoch``, with
    ``Evaluation/mean_return``, ``Gym/timestep`` and the training metrics since the previous
    evaluation. Returns nothing.
    """


@hookspec
def horizon_on_run_end(run: RunContext, manifest: dict[str, Any]) -> None:
    """Called once after the last stage, with the manifest just written to ``manifest.json``.

    Also called when a stage failed; ``manifest["status"]`` then says ``"failed"`` and
    ``manifest["error"]`` holds the message. ``horizon gym train`` calls it once at its end,
    with its own manifest (``manifest["command"]`` is ``"horizon gym train"``). Returns nothing.
    """
