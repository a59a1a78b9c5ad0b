"""A pipeline stage as a plugin registers it, and the run order derived from what stages read.

Every stage, the core's own included, is registered through ``horizon_register_stages``: the
core's from ``horizon_engine.core_stages``, the world model's analysis from its plugin. A
stage names the section of pipeline.toml that configures it and how that section picks its
component (``SectionRule``), the run-relative paths it reads and those it writes (its claims),
and the function that runs it. Nothing else lists the stages: a run executes them in the order
``order_stages`` derives from their reads, so a plugin's stage runs after the stages whose
outputs it reads, and takes part in ``--stages``, staleness and the manifest as the core's do.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from horizon_engine.errors import HorizonError
from horizon_engine.run_folder import matches

if TYPE_CHECKING:
    from horizon_engine.components import ComponentConfig
    from horizon_engine.config import Choice, PipelineSpec
    from horizon_engine.run_context import StageReport

STAGE_NAME = re.compile(r"[a-z][a-z0-9_]*")
"""A stage's name, which is also how ``--stages`` and the manifest spell it."""


@dataclass(frozen=True)
class SectionRule:
    """How a stage's section of pipeline.toml picks its component: by the name, in ``family``,
    that its key ``selector`` gives (``default_selector`` where the section leaves the key out).

    A section that selects no component (``family`` None) validates its body with ``options``,
    the stage's own config model. ``many`` makes the section an array of tables
    (``[[evaluation]]``, the core's one).
    """

    family: str | None
    selector: str = "kind"
    default_selector: str | None = None
    many: bool = False
    options: type[ComponentConfig] | None = None


@dataclass(frozen=True)
class Stage:
    """A pipeline stage: its section, what it reads and writes, and how it runs."""

    name: str
    section: str
    rule: SectionRule
    reads: tuple[str, ...]
    """Run-relative paths the stage reads: each is some stage's claim, and the stage runs
    after that one."""
    claims: tuple[str, ...]
    """Every path it writes, run-relative (glob patterns allowed): what it may replace."""
    run: Callable[..., StageReport]
    """Called with the run (a ``RunContext``) and the section's ``Choice`` (a list of them for
    a ``many`` section), and ``resume=True`` for a stage that continues from ``resumes_from``."""
    resumes_from: tuple[str, ...] = ()
    """Outputs (claims) an interrupted run of the stage leaves for ``--resume`` to continue
    from, rather than to remove: the train stage's epoch checkpoints and their event files."""
    reads_all: bool = False
    """The stage reads every other stage's outputs (the report): it runs after all of them,
    and a new run of any of them makes it stale. ``reads`` may then stay empty."""
    reads_when_written: tuple[str, ...] = ()
    """Run-relative paths the stage reads only where some configured stage writes them (the
    export's ``cpe.json``, when the evaluation chose the checkpoint to ship): each is some
    stage's claim; the stage runs after that one, and a new run of it makes this one stale,
    as for ``reads``; but a run that does not write them (no ``[[evaluation]]``) is no
    error."""
    check: Callable[[PipelineSpec, str], list[str]] | None = None
    """Problems with the stage's section that its config model cannot see (a trainer chosen
    that cannot do the stage's work), found before any stage runs: called with the validated
    config and the section's name when the section is configured; ``horizon validate``
    reports them."""

    def configured(self, spec: PipelineSpec) -> bool:
        """Whether ``spec`` configures the stage (written, or run at its defaults). A section
        whose options have ``enabled = false`` (``[report]``'s) configures none."""
        if self.rule.many:
            return bool(spec.evaluation)
        choice = spec.sections.get(self.section)
        return choice is not None and getattr(choice.config, "enabled", True) is not False

    def choice(self, spec: PipelineSpec) -> Choice | list[Choice]:
        """The section's choice the stage runs with."""
        return spec.evaluation if self.rule.many else spec.sections[self.section]


class StageOrderError(HorizonError):
    """Registered stages that cannot be put in an order: ``stage`` is the one blamed (the one
    registered later, whose plugin is left out)."""

    def __init__(self, message: str, stage: Stage) -> None:
        super().__init__(message)
        self.stage = stage


def stage_problem(stage: object) -> str | None:
    """What is wrong with a registered stage on its own, or None if it can be used."""
    if not isinstance(stage, Stage):
        return f"expected a horizon_engine.Stage, found {stage!r}"
    if not isinstance(stage.name, str) or not STAGE_NAME.fullmatch(stage.name):
        return f"stage name {stage.name!r} is not a lowercase word (letters, digits, _)"
    if not isinstance(stage.section, str) or not STAGE_NAME.fullmatch(stage.section):
        return f"stage '{stage.name}': section {stage.section!r} is not a lowercase word"
    if stage.section == "pipeline":
        return f"stage '{stage.name}': [pipeline] is the core's own section"
    if not isinstance(stage.rule, SectionRule):
        return f"stage '{stage.name}': its rule is not a horizon_engine.SectionRule"
    if (stage.rule.family is None) == (stage.rule.options is None):
        return (
            f"stage '{stage.name}': its section rule needs either a component family or, "
            "for a section that selects no component, its options model (not both)"
        )
    if stage.rule.many and stage.section != "evaluation":
        return f"stage '{stage.name}': only [[evaluation]] is an array of tables"
    if not stage.claims:
        return f"stage '{stage.name}' claims no path: it would write nothing"
    for path in (*stage.reads, *stage.reads_when_written, *stage.claims):
        parts = PurePosixPath(path).parts if isinstance(path, str) else ()
        if not parts or PurePosixPath(path).is_absolute() or ".." in parts:
            return (
                f"stage '{stage.name}': {path!r} is not a path inside the run folder "
                "(relative, without '..')"
            )
    if not callable(stage.run):
        return f"stage '{stage.name}': run is not callable"
    return None


def order_stages(stages: Sequence[Stage]) -> list[Stage]:
    """``stages`` (in registration order) in the order a run executes them: each after the
    stages whose claims it reads, ties in registration order. Refused with a
    ``StageOrderError`` for two stages with one name, section or claimed path, a read no
    stage claims, and stages that read each other's outputs (a cycle)."""
    for index, stage in enumerate(stages):
        for earlier in stages[:index]:
            clash = _clash(earlier, stage)
            if clash:
                raise StageOrderError(f"stages '{earlier.name}' and '{stage.name}' {clash}", stage)
    producers = {stage.name: _producers(stage, stages) for stage in stages}
    ordered: list[Stage] = []
    waiting = list(stages)
    while waiting:
        done = {stage.name for stage in ordered}
        ready = next((s for s in waiting if producers[s.name] <= done), None)
        if ready is None:
            names = ", ".join(f"'{stage.name}'" for stage in waiting)
            raise StageOrderError(
                f"stages {names} read each other's outputs (a cycle): none of them can run first",
                waiting[-1],
            )
        ordered.append(ready)
        waiting.remove(ready)
    return ordered


def _clash(earlier: Stage, later: Stage) -> str | None:
    if earlier.name == later.name:
        return "have one name"
    if earlier.section == later.section:
        return f"are both configured by [{later.section}]"
    for claim in later.claims:
        if matches(claim, earlier.claims) or any(matches(own, (claim,)) for own in earlier.claims):
            return f"both claim {claim!r}: a path has one writer"
    return None


def readers_of(stage: Stage, stages: Sequence[Stage]) -> list[str]:
    """The stages that read ``stage``'s outputs, directly or through another such stage's:
    those a new run of ``stage`` makes stale. A stage that reads none of them (the analysis
    after a new export) is not."""
    readers: list[str] = []
    replaced = [stage]
    while replaced:
        producer = replaced.pop()
        for reader in stages:
            reads_it = reader.reads_all or any(
                matches(path, producer.claims)
                for path in (*reader.reads, *reader.reads_when_written)
            )
            if reads_it and reader.name not in readers and reader is not stage:
                readers.append(reader.name)
                replaced.append(reader)
    return readers


def _producers(stage: Stage, stages: Sequence[Stage]) -> set[str]:
    """The stages whose claims ``stage`` reads (every other one, for a ``reads_all``
    stage)."""
    if stage.reads_all:
        return {other.name for other in stages if other is not stage}
    found = set()
    for needed in (*stage.reads, *stage.reads_when_written):
        writers = [other.name for other in stages if matches(needed, other.claims)]
        if not writers:
            raise StageOrderError(
                f"stage '{stage.name}' reads {needed!r}, which no stage writes", stage
            )
        found.update(writers)
    if stage.name in found:
        raise StageOrderError(f"stage '{stage.name}' reads its own output", stage)
    return found
