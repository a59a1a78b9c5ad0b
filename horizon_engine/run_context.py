"""What every stage and plugin family is handed: the run's context, and a stage's report.

At the bottom of the core: it imports no other stage or component module at run time, so
sources, transforms, trainers, exporters and the hooks can all name these types without
importing the pipeline that runs them (``horizon_engine.pipeline``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from horizon_engine.progress import progress_bar

if TYPE_CHECKING:
    from horizon_engine.config import PipelineSpec
    from horizon_engine.plugins import PluginHost


@dataclass
class StageReport:
    """What a stage did: rows in and out, rows dropped by reason, files written, time taken."""

    stage: str
    rows_in: int = 0
    rows_out: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    """Wall time of the stage, imports included."""
    import_seconds: float = 0.0
    """The part of ``seconds`` spent importing modules (torch, scipy, ...) the stage was the
    first to need: paid once per process, not by the stage's work."""


@dataclass
class RunContext:
    """What a component gets of the run: its folder, seed and id, a progress bar, and where to
    send per-epoch metrics. Nothing else: a component reads its own config section (its
    ``config``), never the whole pipeline's, and reaches other plugins only through the core."""

    output_dir: Path
    seed: int
    run_id: str
    show_progress: bool = False

    def progress(
        self, description: str, total: int | None = None
    ) -> AbstractContextManager[Callable[[int], None]]:
        """A progress bar on a terminal, nothing otherwise; yields ``advance(amount)``."""
        return progress_bar(description, total, self.show_progress)

    def emit_epoch_metrics(self, epoch: int, metrics: dict[str, float]) -> None:
        """Report one epoch's metrics (``horizon_on_epoch_end``: TensorBoard, reporters). A
        context made by hand (a test, a notebook) has nowhere to send them; one made by
        ``for_command`` or by the core sends them to the plugins."""

    @classmethod
    def for_command(
        cls,
        output_dir: Path,
        seed: int,
        run_id: str,
        show_progress: bool = False,
        plugins: PluginHost | None = None,
    ) -> RunContext:
        """The context of a run a command drives itself (a ``TrainingDriver`` fed by its own
        loop, as ``horizon gym train``): its epoch metrics reach ``plugins`` (the process's
        plugins unless given)."""
        from horizon_engine.plugins import get_plugin_host

        return HostedRun(
            output_dir=Path(output_dir),
            seed=seed,
            run_id=run_id,
            show_progress=show_progress,
            plugins=plugins or get_plugin_host(),
        )


@dataclass(kw_only=True)
class HostedRun(RunContext):
    """A run whose epoch metrics reach its plugins' ``horizon_on_epoch_end``."""

    plugins: PluginHost

    def emit_epoch_metrics(self, epoch: int, metrics: dict[str, float]) -> None:
        """Every plugin's ``horizon_on_epoch_end`` with this run's context."""
        self.plugins.on_epoch_end(self, epoch, metrics)


@dataclass(kw_only=True)
class StageRun(HostedRun):
    """The core's own view of a run, which its stage code holds: the component's context plus
    the validated config and the plugin host. Components, and a plugin's stage run function
    (``run(run: RunContext, choice: Choice)``), are handed it as a ``RunContext`` and read only
    that: a stage gets its section through its ``Choice``."""

    spec: PipelineSpec

    @classmethod
    def start(
        cls,
        spec: PipelineSpec,
        plugins: PluginHost,
        run_id: str,
        show_progress: bool = False,
        output_dir: Path | None = None,
    ) -> StageRun:
        """The context of a run of ``spec`` (its ``[pipeline]`` seed and output folder, or
        ``output_dir`` when given)."""
        folder = Path(spec.pipeline.output_dir) if output_dir is None else Path(output_dir)
        return cls(
            output_dir=folder,
            seed=spec.pipeline.seed,
            run_id=run_id,
            show_progress=show_progress,
            spec=spec,
            plugins=plugins,
        )
