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
    """What a stage gets: the validated config, the run's folder, its seed and the plugins."""

    spec: PipelineSpec
    output_dir: Path
    plugins: PluginHost
    run_id: str
    show_progress: bool = False

    @property
    def seed(self) -> int:
        return self.spec.pipeline.seed

    def progress(
        self, description: str, total: int | None = None
    ) -> AbstractContextManager[Callable[[int], None]]:
        """A progress bar on a terminal, nothing otherwise; yields ``advance(amount)``."""
        return progress_bar(description, total, self.show_progress)
