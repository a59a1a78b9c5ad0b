"""Items made on a background thread ahead of the thread that takes them.

A streamed split's epoch (``streamed.StreamedTimeline.minibatches``) reads and converts its
Parquet slices on a thread of their own while the training thread trains on the slices before
(Arrow's decoding and most of the conversion release the GIL). ``ReadAhead`` starts making its
items when it is made, not when the first is taken, so that an epoch's first slices can be read
while the epoch before trains on its last batches (``NextReading``): an epoch's first shuffle
needs a whole buffer of slices, which training used to wait for every epoch (on the CartPole
benchmark's split, 2.4 buffers long, the training thread waited about 100 ms of an epoch's
400 ms for slices on a loaded machine, 4 ms once read early: ``benchmarks/streamed_throughput.py``
prints the share).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


class _Finished:
    """What the making thread sends last: the end of its items, or the error that stopped it."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class ReadAhead(Generic[T]):
    """``produce()``'s items, made on a background thread from now on, at most ``ahead``
    items before they are taken (in line, as they are taken, for ``ahead = 0``), except that
    the first ``first`` items may all wait at once: an epoch's reading begun early makes the
    first shuffle buffer's slices, which the epoch takes at once. The making's error is raised
    where the items are taken. ``close`` (an epoch ended, abandoned or failed) stops the thread
    after the item it is making and waits for it, so nothing reads on after the epoch: whoever
    makes a ``ReadAhead`` closes it."""

    def __init__(
        self, produce: Callable[[], Generator[T, None, None]], ahead: int, first: int = 0
    ) -> None:
        self._in_line = produce() if ahead <= 0 else None
        self._items: queue.SimpleQueue[T | _Finished] = queue.SimpleQueue()
        self._room = threading.Semaphore(max(ahead, first))
        self._kept = max(0, first - ahead)  # room not given back as the first items are taken
        self._stopped = threading.Event()
        self._finished: _Finished | None = None
        self._thread: threading.Thread | None = None
        if self._in_line is None:
            self._thread = threading.Thread(
                target=self._make, args=(produce,), name="horizon-read-ahead", daemon=True
            )
            self._thread.start()

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._in_line is not None:
            return next(self._in_line)
        if self._finished is None:
            item = self._items.get()
            if not isinstance(item, _Finished):
                if self._kept:
                    self._kept -= 1
                else:
                    self._room.release()
                return item
            self._finished = item
        error, self._finished.error = self._finished.error, None
        if error is not None:
            raise error
        raise StopIteration

    def close(self) -> None:
        """Stop making items, wait for the thread to end and drop the items made."""
        if self._thread is None:
            if self._in_line is not None:
                self._in_line.close()
            return
        self._stopped.set()
        self._room.release()
        self._thread.join()
        with contextlib.suppress(queue.Empty):
            while True:
                self._items.get_nowait()

    def _make(self, produce: Callable[[], Generator[T, None, None]]) -> None:
        finished = _Finished()
        try:
            items = produce()
            try:
                for item in items:
                    self._room.acquire()
                    if self._stopped.is_set():
                        return
                    self._items.put(item)
            finally:
                items.close()
        except BaseException as exc:
            finished = _Finished(exc)
        self._items.put(finished)


class NextReading(Generic[T]):
    """The reading of a streamed split's next epoch, begun before that epoch is asked for,
    with the data-order generator's state it was drawn for: the next epoch takes it when it
    starts from that state (its batches then are those of reading afresh), and closes it
    otherwise (a resumed run's generator, set to a checkpoint's state). One is held per split
    and closed with it (``discard``), so that a reading no epoch takes reads no further than
    its ``ahead`` items."""

    def __init__(self) -> None:
        self._state: torch.Tensor | None = None
        self._reading: ReadAhead[T] | None = None

    def begin(self, state: torch.Tensor, reading: ReadAhead[T]) -> None:
        """Hold ``reading``, begun for the generator at ``state``."""
        self.discard()
        self._state, self._reading = state, reading

    def take(self, generator: torch.Generator) -> ReadAhead[T] | None:
        """The reading held, if it was begun for ``generator``'s state (then the caller's to
        close); none otherwise."""
        import torch

        state, reading = self._state, self._reading
        self._state = self._reading = None
        if reading is None or state is None:
            return None
        if torch.equal(state, generator.get_state()):
            return reading
        reading.close()
        return None

    def discard(self) -> None:
        """Close the reading held, if any."""
        reading, self._state, self._reading = self._reading, None, None
        if reading is not None:
            reading.close()
