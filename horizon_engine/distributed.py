"""Training on several processes and machines: everything about processes, in one place.

Horizon Engine runs no cluster code of its own: processes are started by torch's launcher
(``horizon run --nproc N`` calls it on this machine, ``torchrun`` does on several) and talk
through ``torch.distributed``. A launched process finds its rank and the world in the
environment torch's launcher sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``); ``process_group`` joins them for the length of a run:

- the backend follows the device: gloo for CPU tensors, nccl for CUDA ones when there is a GPU;
- rank 0 is the writer (``is_writer``): the only process that writes to the run folder, which
  every rank must see at the same path (one machine, or a shared filesystem across machines);
- the other ranks wait for the writer's word between stages (``publish`` / ``receive``) on a
  group of their own whose timeout outlasts a long timeline stage, while collectives of
  training keep torch's default timeout;
- the epoch's metrics are averaged over every rank (``all_reduce_metrics``);
- leaving: after a run that succeeded, each rank collects garbage, meets a barrier and destroys
  the process group (on a CPU with gloo about one run in ten aborts at exit otherwise); after a
  failure a rank leaves without the barrier, which could meet another rank's gradient exchange.

A single process (no ``WORLD_SIZE`` above 1 in its environment) imports nothing of
``torch.distributed`` and pays nothing: every accessor answers from the environment.
"""

from __future__ import annotations

import gc
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from horizon_engine.errors import HorizonError

if TYPE_CHECKING:
    import torch

WRITER_WAIT = timedelta(days=2)
"""How long the other ranks wait for the writer between stages: the stages before training run
on rank 0 alone (a timeline over a large log takes hours); a writer that dies ends the wait at
once (its connection closes), so this bounds only a writer that hangs."""

LAUNCH_MONITOR_SECONDS = 0.1
"""How often the local launcher checks its processes: a rank that fails is noticed within it,
and the others are stopped."""

_waiting_group: Any = None
"""The gloo group the other ranks wait on for the writer (``WRITER_WAIT``); None outside a
process group."""


class WriterFailed(HorizonError):
    """Raised on a rank other than 0 when the writer's run failed before training: the
    writer's own message says why, so this rank only stops."""


def world_size() -> int:
    """The processes training together: ``WORLD_SIZE`` as torch's launcher sets it, 1 alone."""
    return _environment_number("WORLD_SIZE", 1)


def rank() -> int:
    """This process's rank among ``world_size()`` (0 alone)."""
    return _environment_number("RANK", 0)


def local_rank() -> int:
    """This process's rank on its machine: the GPU it trains on."""
    return _environment_number("LOCAL_RANK", 0)


def is_distributed() -> bool:
    """Whether this process is one of several training together."""
    return world_size() > 1


def is_writer() -> bool:
    """Whether this process writes the run folder (rank 0; a single process always)."""
    return rank() == 0


def _environment_number(name: str, default: int) -> int:
    """A whole number torch's launcher put in the environment, or ``default`` when unset."""
    found = os.environ.get(name)
    if found is None:
        return default
    try:
        return int(found)
    except ValueError:
        raise HorizonError(
            f"environment variable {name} = {found!r} is not a whole number (torch's launcher "
            "sets it; check how this process was started)"
        ) from None


def device_for_rank(device: torch.device) -> torch.device:
    """The device this rank trains on: a CUDA device's ``LOCAL_RANK``-th GPU when several
    processes share a machine, ``device`` otherwise."""
    import torch

    if device.type != "cuda" or not is_distributed():
        return device
    chosen = torch.device("cuda", local_rank())
    torch.cuda.set_device(chosen)
    return chosen


@contextmanager
def process_group() -> Iterator[None]:
    """This process joined to the others of its launch for the duration (nothing alone).

    On leaving after success: garbage collected, a barrier, the group destroyed; after a
    failure, only destroyed (see the module docstring). Inside another (a program running
    several pipelines in one launch), it is that one's group, left as it is: a process joins
    its launch once (joining again meets the first group's leftovers in the launcher's store)."""
    global _waiting_group

    if not is_distributed():
        yield
        return
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return

    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise HorizonError(
                f"WORLD_SIZE is {world_size()} but {name} is not set: start several processes "
                "with `horizon run --nproc N` or with torchrun"
            )
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, rank=rank(), world_size=world_size())
    _waiting_group = dist.new_group(backend="gloo", timeout=WRITER_WAIT)
    succeeded = False
    try:
        yield
        succeeded = True
    finally:
        _waiting_group = None
        if succeeded:
            gc.collect()
            dist.barrier()
        dist.destroy_process_group()


TRAINING_STAGE = "train"
"""The stage every rank runs; rank 0 runs the others alone."""


class Followers:
    """The writer's side of the other ranks' wait: it tells them when the train stage starts
    and when the run is over, and remembers whether they are training (then they are inside
    collectives, not waiting: a failure ends them by closing the connection, not by a word)."""

    def __init__(self) -> None:
        self.training = False

    def start_training(self, run_id: str, resume: bool) -> None:
        """The other ranks join the train stage of run ``run_id`` (resuming it or not)."""
        publish({"stage": TRAINING_STAGE, "run_id": run_id, "resume": resume})
        self.training = is_distributed()

    def training_done(self) -> None:
        self.training = False

    def end(self, succeeded: bool) -> None:
        """The run is over: the waiting ranks leave (with an error when it failed)."""
        if not self.training:
            publish({"end": True, "succeeded": succeeded})


def publish(message: Any) -> None:
    """The writer tells every other rank ``message`` (plain data); alone, nothing."""
    if is_distributed():
        _broadcast(message)


def receive() -> Any:
    """What the writer ``publish``es next, waited for up to ``WRITER_WAIT``."""
    return _broadcast(None)


def _broadcast(message: Any) -> Any:
    import torch.distributed as dist

    carried = [message]
    dist.broadcast_object_list(carried, src=0, group=_waiting_group)
    return carried[0]


def all_reduce_metrics(
    sums: Mapping[str, float], counts: Mapping[str, int]
) -> tuple[dict[str, float], dict[str, int]]:
    """The epoch's metric sums and counts added over every rank (as they are alone), so each
    metric's mean is over every rank's batches. Ranks may name different metrics: the union is
    reduced, a metric a rank lacks counting zero there."""
    if not is_distributed():
        return dict(sums), dict(counts)
    import torch
    import torch.distributed as dist

    everyone: list[Sequence[str]] = [[] for _ in range(world_size())]
    dist.all_gather_object(everyone, sorted(sums))
    names = sorted({name for found in everyone for name in found})
    values = torch.tensor(
        [float(sums.get(name, 0.0)) for name in names]
        + [float(counts.get(name, 0)) for name in names],
        dtype=torch.float64,
    )
    dist.all_reduce(values)
    added = values.tolist()
    reduced_sums = dict(zip(names, added[: len(names)], strict=True))
    reduced_counts = {
        name: round(count) for name, count in zip(names, added[len(names) :], strict=True)
    }
    return reduced_sums, reduced_counts


def data_parallel(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``module`` wrapped in ``DistributedDataParallel`` (its gradients averaged over every
    rank in backward): every rank must wrap the same modules in the same order."""
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device] if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=device_ids)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a local launch's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def launch_local(processes: int, command: Sequence[str]) -> None:
    """Run ``command`` (a program and its arguments) as ``processes`` ranks on this machine
    through torch's elastic launcher (a standalone rendezvous on 127.0.0.1); returns when every
    rank has succeeded. A rank that fails stops the others; the error names it and its exit
    status (its own message is what it printed). Ctrl-C or SIGTERM stops every rank (each
    records its run as interrupted) and raises ``KeyboardInterrupt``."""
    import logging
    import uuid

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if processes < 1:
        raise HorizonError(f"--nproc {processes}: give a number of processes (1 or more)")
    if is_distributed():
        raise HorizonError(
            "--nproc starts processes on this machine; under torchrun the launch already "
            "has them (leave --nproc out)"
        )
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=processes,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        max_restarts=0,
        monitor_interval=LAUNCH_MONITOR_SECONDS,
        local_addr="127.0.0.1",
    )
    launcher_log = logging.getLogger("torch.distributed.elastic")
    level = launcher_log.level
    launcher_log.setLevel(logging.CRITICAL)
    try:
        elastic_launch(config, entrypoint=command[0])(*command[1:])
    except ChildFailedError as exc:
        rank_failed, failure = min(exc.failures.items(), key=lambda item: item[1].timestamp)
        raise HorizonError(
            f"rank {rank_failed} of {processes} failed (exit status {failure.exitcode}); "
            "its message is above, and the other ranks were stopped"
        ) from None
    except SignalException:
        raise KeyboardInterrupt from None
    finally:
        launcher_log.setLevel(level)
