"""Progress bars on long work, shown only on a terminal so logs and pipes stay clean."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def progress_bar(
    description: str, total: int | None = None, enabled: bool = True
) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(amount)``; draws a rich progress bar when ``enabled``, else does nothing."""
    if not enabled:
        yield lambda amount: None
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda amount: bar.advance(task, amount)
