"""The TensorBoard reporter: every epoch's metrics as scalars under the run's ``tensorboard/``.

A built-in plugin on the lifecycle hooks, as a third-party reporter would be: it writes what
``horizon_on_epoch_end`` receives (``Training/td_loss``, ``Evaluation/mc_loss``, CPE figures,
...) with the epoch as the step, and closes its writer when the run ends. tensorboardX is
imported on the first epoch, so listing plugins stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from horizon_engine.hookspecs import hookimpl

if TYPE_CHECKING:
    from horizon_engine.pipeline import RunContext

TENSORBOARD = "tensorboard"
"""The run's folder of event files."""

_writers: dict[str, Any] = {}
"""Open writers by run id: a run's epochs append to one event file."""


@hookimpl
def horizon_on_epoch_end(run: RunContext, epoch: int, metrics: dict[str, float]) -> None:
    writer = _writers.get(run.run_id)
    if writer is None:
        from tensorboardX import SummaryWriter

        writer = SummaryWriter(logdir=str(run.output_dir / TENSORBOARD))
        _writers[run.run_id] = writer
    for name, value in metrics.items():
        writer.add_scalar(name, value, epoch)
    writer.flush()


@hookimpl
def horizon_on_run_end(run: RunContext, manifest: dict[str, Any]) -> None:
    writer = _writers.pop(run.run_id, None)
    if writer is not None:
        writer.close()
