"""The TensorBoard reporter: every epoch's metrics as scalars under the run's ``tensorboard/``.

A built-in plugin on the lifecycle hooks, as a third-party reporter would be: it writes what
``horizon_on_epoch_end`` receives (``Training/td_loss``, ``Evaluation/mc_loss``, CPE figures,
...) with the epoch as the step, and closes its writer when the run ends. tensorboardX is
imported on the first epoch, so listing plugins stays fast.

Each run's event file ends with its run id and is listed among the outputs of the stage that
wrote it, so the run folder's record says which events are whose: a later run of that stage
replaces them instead of plotting beside them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from horizon_engine import RunFolder, hookimpl

if TYPE_CHECKING:
    from horizon_engine import RunContext, StageReport


class _EventFile:
    """One run's event file, written synchronously: an epoch's scalars are in the file when
    ``horizon_on_epoch_end`` returns, before the epoch's checkpoint is written. tensorboardX's
    ``SummaryWriter`` queues events for a background thread that its ``flush`` does not wait
    for, so a run killed just after an epoch lost that epoch's scalars, and ``--resume``
    continues after the epoch."""

    def __init__(self, folder: Path, run_id: str) -> None:
        from tensorboardX.event_file_writer import EventsWriter

        folder.mkdir(parents=True, exist_ok=True)
        self._events = EventsWriter(str(folder / "events"), f".{run_id}")

    def write(self, metrics: dict[str, float], step: int) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        for name, value in metrics.items():
            summary = scalar(name, value)
            self._events.write_event(Event(wall_time=time.time(), step=step, summary=summary))
        self._events.flush()

    def close(self) -> None:
        self._events.close()


_writers: dict[str, _EventFile] = {}
"""Open event files by run id: a run's epochs append to one event file."""
_listed: set[str] = set()
"""Run ids whose event file is listed already, among the outputs of the stage that began it."""


@hookimpl
def horizon_on_epoch_end(run: RunContext, epoch: int, metrics: dict[str, float]) -> None:
    writer = _writers.get(run.run_id)
    if writer is None:
        writer = _writers[run.run_id] = _EventFile(
            run.output_dir / RunFolder.TENSORBOARD, run.run_id
        )
    writer.write(metrics, epoch)


@hookimpl
def horizon_on_stage_end(run: RunContext, stage: str, report: StageReport) -> None:
    if run.run_id not in _writers or run.run_id in _listed:
        return
    _listed.add(run.run_id)
    folder = run.output_dir / RunFolder.TENSORBOARD
    for path in sorted(folder.glob(f"events.out.tfevents.*.{run.run_id}")):
        relative = f"{RunFolder.TENSORBOARD}/{path.name}"
        if relative not in report.outputs:
            report.outputs.append(relative)


@hookimpl
def horizon_on_run_end(run: RunContext, manifest: dict[str, Any]) -> None:
    _listed.discard(run.run_id)
    writer = _writers.pop(run.run_id, None)
    if writer is not None:
        writer.close()
