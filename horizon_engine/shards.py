"""One rank's share of a split held in memory, for data-parallel training.

Every rank holds the whole split and draws the same permutation from the driver's data-order
generator (seeded alike on every rank); each global minibatch of ``batch_size`` rows is cut in
``world`` nearly equal parts and rank ``r`` trains on part ``r``. With DistributedDataParallel
averaging the gradients, an update is then that of one process on the whole minibatch (exactly
so when ``world`` divides ``batch_size``): the effective batch stays ``[trainer]
minibatch_size`` and the learning rate needs no rule change.

Every rank must make as many updates per epoch, none on an empty batch: a last global
minibatch with fewer rows than ranks is left out of the epoch (fewer than ``world`` rows, a
different few each epoch).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from horizon_engine.errors import HorizonError

if TYPE_CHECKING:
    import torch

    from horizon_engine.dataset import Minibatch, TimelineTensors


@dataclass(frozen=True)
class TimelineShard:
    """Rank ``rank``'s share of ``data``'s minibatches among ``world`` ranks."""

    data: TimelineTensors
    rank: int
    world: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise HorizonError(f"rank {self.rank} is not among {self.world} ranks")

    def __len__(self) -> int:
        """The rows this rank trains on in an epoch, about ``1 / world`` of the split's."""
        return len(self.data) // self.world

    def minibatches(self, batch_size: int, generator: torch.Generator) -> Iterator[Minibatch]:
        """This rank's part of each global minibatch of one epoch."""
        import torch

        from horizon_engine.dataset import Minibatch

        if batch_size < self.world:
            raise HorizonError(
                f"[trainer] minibatch_size = {batch_size} is below the {self.world} processes "
                "training: each needs rows of every minibatch"
            )
        rows = len(self.data)
        tensors = self.data.tensors()
        order = torch.randperm(rows, generator=generator, device="cpu")
        order = order.to(self.data.reward.device)
        for start in range(0, rows, batch_size):
            batch = order[start : start + batch_size]
            if len(batch) < self.world:
                continue
            yield Minibatch(tensors, batch.tensor_split(self.world)[self.rank])

    def with_preprocessed(self, preprocessor: torch.nn.Module) -> TimelineShard:
        """The same share of the split with the state preprocessor's output computed."""
        return TimelineShard(self.data.with_preprocessed(preprocessor), self.rank, self.world)
