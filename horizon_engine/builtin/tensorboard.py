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

import socket
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from horizon_engine import RunFolder, append_output, hookimpl

if TYPE_CHECKING:
    from horizon_engine import RunContext, StageReport


class _EventFile:
    """One run's event file, written synchronously: an epoch's scalars are in the file (handed
    to the operating system) when ``horizon_on_epoch_end`` returns, before the epoch's
    checkpoint is written. tensorboardX's ``SummaryWriter`` queues events for a background
    thread that its ``flush`` does not wait for, so a run killed just after an epoch lost that
    epoch's scalars, and ``--resume`` continues after the epoch.

    The records are framed here rather than by tensorboardX's ``EventsWriter``, whose flush
    also fsyncs the file: 8 ms an epoch on a plain disk (3% of the example's train stage) to
    survive a power cut, which the checkpoints, written without fsync, do not survive either.
    """

    def __init__(self, folder: Path, run_id: str) -> None:
        from tensorboardX.proto.event_pb2 import Event

        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{run_id}"
        self._file = append_output(folder / name)
        self._append(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def write(self, metrics: dict[str, float], step: int) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        for name, value in metrics.items():
            summary = scalar(name, value)
            self._append(Event(wall_time=time.time(), step=step, summary=summary))
        self._file.flush()

    def _append(self, event: Any) -> None:
        """``event`` as a TFRecord: its length, the length's masked CRC-32C, the event, the
        event's masked CRC-32C (little-endian)."""
        from tensorboardX.record_writer import masked_crc32c

        data = event.SerializeToString()
        length = struct.pack("<Q", len(data))
        self._file.write(
            length
            + struct.pack("<I", masked_crc32c(length))
            + data
            + struct.pack("<I", masked_crc32c(data))
        )

    def close(self) -> None:
        self._file.close()


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
