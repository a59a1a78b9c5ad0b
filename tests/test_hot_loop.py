"""The train stage's loop does no work its results do not need.

A minibatch gathers a tensor's rows when the trainer first reads it (``Minibatch``), so a
tensor read and then ignored costs an index operation every update; the step-count and
no-boost paths of the targets skip the arithmetic that would only reproduce their input. An
epoch's TensorBoard events are handed to the operating system, not fsynced.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping
from types import SimpleNamespace

import torch
from tensorboardX.record_writer import masked_crc32c
from test_dqn import batch, trainer
from test_training import scalars

from horizon_engine.builtin import tensorboard
from horizon_plugins_dqn.targets import n_step_return, one_step_discount

WINDOWS = {
    "next_n_rewards": [[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]],
    "next_n_time_diffs": [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]],
    "next_n_not_terminal": [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]],
    "next_n_length": [3, 2],
    "next_n_state": [[0.0], [1.0]],
    "next_n_possible_next_actions": [[0, 1, 1], [0, 0, 0]],
}


class ReadRecorder(Mapping[str, torch.Tensor]):
    """A batch that records the names a trainer reads, as ``Minibatch`` gathers them."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors
        self.read: set[str] = set()

    def __getitem__(self, name: str) -> torch.Tensor:
        self.read.add(name)
        return self.tensors[name]

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


def names_read(**options: object) -> set[str]:
    """The batch tensors one ``train_step`` of a ``dqn`` trainer with ``options`` reads."""
    recorded = ReadRecorder(batch(reward=[1.0, 4.0], **WINDOWS))
    trainer(**options).train_step(recorded)
    return recorded.read


def test_an_update_reads_the_time_differences_only_when_it_discounts_by_them():
    assert "next_n_time_diffs" not in names_read(n_step=3, cql_alpha=0.1)
    assert "next_n_time_diffs" in names_read(n_step=3, use_time_diff=True)
    assert "time_diff" not in names_read(n_step=1)
    assert "time_diff" in names_read(n_step=1, use_time_diff=True)


def test_the_step_count_discounts_equal_unit_time_differences_to_the_bit():
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randn(300, 4, generator=generator)
    lengths = torch.randint(1, 5, (300,), generator=generator)
    inside = torch.arange(4) < lengths.unsqueeze(1)
    rewards = rewards * inside
    not_terminal = (torch.rand(300, 4, generator=generator) > 0.1).float() * inside
    ones = inside.float()
    for gamma in (0.9, 0.99, 0.5):
        counted = n_step_return(rewards, None, not_terminal, lengths, gamma, False)
        timed = n_step_return(rewards, ones, not_terminal, lengths, gamma, True)
        assert all(torch.equal(a, b) for a, b in zip(counted, timed, strict=True))
        one_step = one_step_discount(not_terminal[:, 0], None, gamma, False)
        assert torch.equal(one_step, one_step_discount(not_terminal[:, 0], ones[:, 0], gamma, True))


def test_an_epochs_events_are_in_the_file_when_the_hook_returns_without_an_fsync(
    tmp_path, monkeypatch
):
    def refuse(descriptor: int) -> None:
        raise AssertionError("an epoch's events were fsynced")

    monkeypatch.setattr(os, "fsync", refuse)
    run = SimpleNamespace(run_id="run-1", output_dir=tmp_path)
    for epoch in (1, 2):
        tensorboard.horizon_on_epoch_end(run, epoch, {"Training/td_loss": 0.5 / epoch})
    written = scalars(tmp_path / "tensorboard")
    assert written == {"Training/td_loss": [(1, 0.5), (2, 0.25)]}
    tensorboard.horizon_on_run_end(run, {})
    (events,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*.run-1")
    data, position = events.read_bytes(), 0
    while position < len(data):
        length = data[position : position + 8]
        end = position + 12 + struct.unpack("<Q", length)[0]
        record = data[position + 12 : end]
        found = struct.unpack("<II", data[position + 8 : position + 12] + data[end : end + 4])
        assert found == (masked_crc32c(length), masked_crc32c(record))
        position = end + 4
    assert position == len(data)
