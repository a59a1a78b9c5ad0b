"""The ends of ``TrainingDriver.train_epochs``'s epochs, run beside the next epoch's updates.

An epoch's end (``TrainingDriver.end_epoch``: the evaluation on the eval split, the per-epoch
estimators, ``horizon_on_epoch_end``, the checkpoint) took 16% of the CartPole example's train
stage, in line, while the stage trains on one thread (``[trainer] threads = "auto"`` on a small
network) and a second core idles. ``EpochEnds`` does the same work on one background thread
while the next epoch trains: torch's and numpy's kernels release the GIL.

The result is the in-line one, figure for figure and file for file:

- the background reads a snapshot: a copy of the trainer's state when the epoch ended, loaded
  into a second trainer set up for one process (``TrainingDriver.spare_trainer``), and the
  generators' states of that moment for the checkpoint;
- the epochs' metrics reach ``history``, ``horizon_on_epoch_end`` and the checkpoints in epoch
  order: one thread, and an epoch's end starts only once the previous one has finished;
- the first epoch's end runs in line, and a part that drew from torch's generators there
  (SAC's and TD3's evaluations sample actions) stays in line for good, where its draws come
  between the same updates as always. A part running beside training must not touch torch's
  generators at all (nor seed or fork them): the built-in estimators draw from their own,
  seeded with the run's seed. The last epoch's end runs in line too: training waits for it;
- an error in the background is raised again, the same exception, by the next epoch's end or
  by the end of training; training returns only once the last epoch's checkpoint is written,
  and a training that stops on an error of its own (Ctrl-C too) first lets the epoch being
  ended finish. A kill (SIGKILL) early in an epoch can find the previous epoch's checkpoint
  not yet written: resuming then continues from the one before, to the same result.

With several processes only rank 0 ends epochs this way; the others have nothing to do beyond
the training metrics, which every rank adds up in line.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING, Any

from horizon_engine import distributed

if TYPE_CHECKING:
    import torch

    from horizon_engine.dataset import TimelineTensors
    from horizon_engine.driver import TrainingDriver
    from horizon_engine.evaluation import EpisodeEvaluation
    from horizon_engine.streamed import StreamedTimeline
    from horizon_engine.training import TrainerBase

Part = Callable[["TrainerBase"], dict[str, float]]
"""A part of an epoch's end that computes figures from a trainer: evaluation, estimators."""


class EpochEnds:
    """Ends ``driver``'s epochs as ``end_epoch`` does, beside the next epoch's updates; used as
    a context manager around the epochs (leaving it waits for the last epoch's end)."""

    def __init__(
        self,
        driver: TrainingDriver,
        epochs: int,
        eval_data: TimelineTensors | StreamedTimeline | None = None,
        estimators: EpisodeEvaluation | None = None,
    ) -> None:
        from horizon_engine.driver import evaluation_metrics

        self.driver = driver
        self.epochs = epochs
        """The epochs of the training: the last one's end runs in line."""
        self.estimators = estimators
        self.parts: dict[str, Part] = {}
        """The parts in the order their figures join an epoch's metrics."""
        if eval_data is not None and len(eval_data):
            self.parts["evaluation"] = lambda trainer: evaluation_metrics(trainer, eval_data)
        if estimators is not None:
            self.parts["estimators"] = estimators.epoch_metrics
        self.in_line: list[str] | None = None
        """The parts that drew from torch's generators at the first epoch's end."""
        self._spare: TrainerBase | None = None
        self._pending: Future[None] | None = None
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="horizon-epoch-end")

    def __enter__(self) -> EpochEnds:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Wait for the last epoch's end and raise its error, if it had one (an earlier
        epoch's error comes before the training's own, as it would in line)."""
        try:
            self.wait()
        finally:
            self._worker.shutdown(wait=True)

    def wait(self) -> None:
        """Wait for the epoch's end in progress; raise its error, if it had one."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def end_epoch(self) -> None:
        """End the epoch the driver just trained: its training metrics now; on rank 0 the
        parts that stay in line, then the rest of its end on the background thread. The first
        epoch's end runs in line whole (it finds the parts that draw from torch's generators,
        and does the first-time work, such as the hook's imports and files, on the training
        thread), and so does the last, which training waits for anyway."""
        driver = self.driver
        found = driver.training_metrics()
        if not distributed.is_writer():
            driver.history.append(found)
            return
        self.wait()
        if self.in_line is None or driver.epoch == self.epochs:
            self._end_in_line(found)
            return
        figures = {name: self.parts[name](driver.trainer) for name in self.in_line}
        beside = [name for name in self.parts if name not in figures]
        if beside and self._spare is None:
            self._spare = driver.spare_trainer()
        # deepcopy keeps tensors that share storage sharing it: the checkpoint's bytes are
        # those of one written in line (a clone per tensor is faster, but writes other bytes).
        state = copy.deepcopy(driver.trainer.state_dict())
        generators = driver.generator_state()
        self._pending = self._worker.submit(
            self._finish, driver.epoch, found, figures, beside, state, generators
        )

    def _end_in_line(self, found: dict[str, float]) -> None:
        """The epoch's end as ``end_epoch`` makes it; at the first, each part's draws from
        torch's generators are looked for."""
        driver = self.driver
        first = self.in_line is None
        self.in_line = self.in_line or []
        for name, part in self.parts.items():
            before = generator_states(driver.device) if first else []
            found |= part(driver.trainer)
            if first and not same_states(before, generator_states(driver.device)):
                self.in_line.append(name)
        driver.record_epoch(driver.epoch, found, driver.trainer.state_dict(), self.estimators)

    def _finish(
        self,
        epoch: int,
        found: dict[str, float],
        figures: dict[str, dict[str, float]],
        beside: list[str],
        state: dict[str, Any],
        generators: dict[str, Any],
    ) -> None:
        """On the background thread: the parts left to run on the snapshot ``state``, the
        figures joined in the parts' order, then the epoch recorded as ``end_epoch`` does."""
        if beside:
            assert self._spare is not None  # end_epoch sets it up for parts beside training
            self._spare.load_state_dict(state)
            figures = {**figures, **{name: self.parts[name](self._spare) for name in beside}}
        for name in self.parts:
            found |= figures[name]
        self.driver.record_epoch(epoch, found, state, self.estimators, generators=generators)


def generator_states(device: torch.device) -> list[torch.Tensor]:
    """torch's CPU generator's state, and ``device``'s when it is a GPU."""
    import torch

    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states


def same_states(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    """Whether no generator was drawn from between ``before`` and ``after``."""
    import torch

    return all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
