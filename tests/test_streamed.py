"""A timeline split streamed from Parquet: the in-memory split's rows and shapes, a row group at a
time, reproducibly shuffled, shared between processes, evaluated in whole episodes, and a train
stage whose memory is bounded by ``[trainer] max_memory_gb`` rather than by the data."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from horizon_engine import dataset
from horizon_engine.dataset import load_timeline
from horizon_engine.driver import ProblemDescription
from horizon_engine.errors import HorizonError
from horizon_engine.pipeline import Engine
from horizon_engine.schema import ActionType
from horizon_engine.streamed import StreamedTimeline, evaluate_split

SOURCES = {
    ActionType.DISCRETE: ({"env": "CartPole-v1", "episodes": 12}, ["0", "1"], 4, []),
    ActionType.PARAMETRIC: (
        {"env": "CartPole-v1", "episodes": 12, "parametric_actions": True},
        [],
        4,
        ["4", "5"],
    ),
    ActionType.CONTINUOUS: ({"env": "Pendulum-v1", "episodes": 1}, [], 3, ["3"]),
}
"""Per action type: the gym source's options, the discrete actions, the state features and the
action features of its timeline."""


def small_row_groups(split: Path, destination: Path, rows_per_group: int = 37) -> Path:
    """``split``'s rows rewritten as two files of small row groups: many groups, one episode
    across two of them, as a large split has."""
    table = pq.read_table(split)
    destination.mkdir()
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), destination / "part-00000.parquet", rows_per_group)
    pq.write_table(table.slice(half), destination / "part-00001.parquet", rows_per_group)
    return destination


@pytest.fixture(scope="module", params=list(SOURCES), ids=lambda kind: kind.value)
def split(request, tmp_path_factory) -> tuple[Path, ProblemDescription]:
    action_type = request.param
    source, actions, states, action_features = SOURCES[action_type]
    folder = tmp_path_factory.mktemp(action_type.value)
    timeline = {"eval_fraction": 0.0, "n_step": 3, **({"actions": actions} if actions else {})}
    config = {
        "pipeline": {"output_dir": str(folder / "run")},
        "source": {"kind": "gym", "ds": "2019-01-01", **source},
        "timeline": timeline,
    }
    Engine(show_progress=False).run(config)
    description = ProblemDescription(
        action_type=action_type,
        actions=actions,
        feature_ids=[str(index) for index in range(states)],
        action_feature_ids=action_features,
        n_step=3,
        seed=0,
        max_feature_value=6.0,
    )
    return small_row_groups(folder / "run" / "timeline" / "train", folder / "grouped"), description


def in_memory(folder: Path, description: ProblemDescription):
    return load_timeline(
        folder,
        description.action_type,
        description.feature_ids,
        description.action_feature_ids,
        description.actions,
    )


def streamed(folder: Path, description: ProblemDescription, buffer_rows: int = 100):
    return StreamedTimeline.open(folder, description, buffer_rows, torch.device("cpu"))


def by_row(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors in (episode, step) order: the same order for any shuffle of the rows."""
    order = torch.argsort(tensors["episode_id"] * 1_000_000 + tensors["step"])
    return {name: tensor[order] for name, tensor in tensors.items()}


def epoch(data: StreamedTimeline, batch_size: int, seed: int) -> list[dict[str, torch.Tensor]]:
    return list(data.minibatches(batch_size, torch.Generator().manual_seed(seed)))


def test_an_epoch_holds_the_splits_rows_once_with_the_in_memory_shapes(split):
    folder, description = split
    memory = in_memory(folder, description)
    data = streamed(folder, description)
    assert len(data.groups) > 4 and len(data) == len(memory)

    batches = epoch(data, 64, seed=0)

    assert [len(batch["reward"]) for batch in batches] == [
        len(rows) for rows in memory.reward.split(64)
    ]
    expected = memory.tensors()
    assert all(set(batch) == set(expected) for batch in batches)
    for name, tensor in expected.items():
        assert all(batch[name].shape[1:] == tensor.shape[1:] for batch in batches), name
    seen = by_row({name: torch.cat([batch[name] for batch in batches]) for name in expected})
    wanted = by_row(expected)
    for name in expected:
        assert torch.equal(seen[name], wanted[name]), name


def test_epochs_are_reproducible_from_the_generator_and_shuffled_across_row_groups(split):
    folder, description = split
    data = streamed(folder, description)
    first, again, other = epoch(data, 64, 0), epoch(data, 64, 0), epoch(data, 64, 1)

    assert all(torch.equal(a["state"], b["state"]) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a["state"], b["state"]) for a, b in zip(first, other, strict=True))


def test_the_buffer_mixes_row_groups_into_every_batch(split):
    folder, description = split
    memory = in_memory(folder, description)
    position = {
        (int(episode), int(step)): row
        for row, (episode, step) in enumerate(zip(memory.episode_id, memory.step, strict=True))
    }
    data = streamed(folder, description, buffer_rows=200)

    first = epoch(data, 32, 0)[0]

    rows = zip(first["episode_id"].tolist(), first["step"].tolist(), strict=True)
    groups = {position[row] // 37 for row in rows}
    assert len(groups) > 2


def sharded_epochs(data, world: int) -> tuple[list, list[list[dict]]]:
    """``data``'s shards for ``world`` processes and an epoch of each, checked to make as many
    batches each, none empty, and to hold ``data``'s rows between them."""
    shards = [data.shard(rank, world) for rank in range(world)]
    epochs = [epoch(shard, 64, 0) for shard in shards]
    assert len({len(batches) for batches in epochs}) == 1
    assert all(len(batch["reward"]) > 0 for batches in epochs for batch in batches)
    assert sum(len(shard) for shard in shards) == len(data)
    return shards, epochs


@pytest.mark.parametrize("world", [2, 3])
def test_shards_cover_every_row_once_with_as_many_nonempty_batches_each(split, world):
    folder, description = split
    data = streamed(folder, description)
    _, epochs = sharded_epochs(data, world)

    keys = torch.cat(
        [batch["episode_id"] * 1_000_000 + batch["step"] for batches in epochs for batch in batches]
    )
    assert len(keys) == len(data) == len(keys.unique())
    assert data.shard(0, 1).groups == data.groups


@pytest.mark.parametrize("world", [3, 5])
def test_fewer_row_groups_than_processes_share_each_groups_rows(split, tmp_path, world):
    """Two row groups among 3 or 5 processes: each takes a run of every group's rows, the
    runs read with the in-memory split's rows and episode numbers, as many batches each."""
    folder, description = split
    memory = in_memory(folder, description)
    grouped = small_row_groups(folder, tmp_path / "two_groups", rows_per_group=len(memory))
    data = streamed(grouped, description)
    shards, _ = sharded_epochs(data, world)

    runs = sorted(
        (run.path.name, run.start, part)
        for shard in shards
        for run in shard.groups
        for part in [_concatenated_rows(replace(shard, groups=(run,)))]
    )
    for name, tensor in memory.tensors().items():
        joined = torch.cat([part[name] for _, _, part in runs])
        assert torch.equal(joined, tensor), name


def _concatenated_rows(data: StreamedTimeline) -> dict[str, torch.Tensor]:
    parts = [part.tensors() for part in data.in_file_order()]
    return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}


def test_a_split_with_fewer_rows_than_processes_is_refused(split, tmp_path):
    folder, description = split
    table = pq.read_table(folder).slice(0, 2)
    (tmp_path / "tiny").mkdir()
    pq.write_table(table, tmp_path / "tiny" / "part-00000.parquet")

    with pytest.raises(HorizonError, match=r"tiny: 2 rows cannot be shared between 3 training"):
        streamed(tmp_path / "tiny", description).shard(0, 3)


def test_eval_chunks_hold_whole_episodes_and_evaluation_weights_them_by_rows(split):
    folder, description = split
    memory = in_memory(folder, description)
    data = streamed(folder, description, buffer_rows=90)

    chunks = list(data.episodes(90))

    # A chunk passes 90 rows only by the rest of an episode; one longer than that is one chunk.
    assert all(len(chunk) < 90 + 37 or len(chunk.episode_id.unique()) == 1 for chunk in chunks)
    ends = [int(chunk.episode_id[-1]) for chunk in chunks[:-1]]
    starts = [int(chunk.episode_id[0]) for chunk in chunks[1:]]
    assert all(start == end + 1 for start, end in zip(starts, ends, strict=True))
    joined = torch.cat([chunk.reward for chunk in chunks])
    assert torch.equal(joined, memory.reward)

    class MeanReward:
        def evaluate(self, rows):
            return {"reward": float(rows.reward.mean())}

    found = evaluate_split(MeanReward(), data)["reward"]
    assert found == pytest.approx(float(memory.reward.mean()))


def test_first_rows_are_the_in_memory_splits_first_rows(split):
    folder, description = split
    memory = in_memory(folder, description)

    first = streamed(folder, description).first_rows(50)

    for name, tensor in first.tensors().items():
        assert torch.equal(tensor, memory.tensors()[name][:50]), name


def test_reading_ahead_gives_the_batches_read_in_line(split):
    """A background thread reads and converts the slices; the generator is drawn from on the
    training thread alone, so the batches and their order are those of reading in line."""
    folder, description = split
    data = streamed(folder, description)
    assert data.read_ahead > 0

    ahead, in_line = epoch(data, 32, 0), epoch(replace(data, read_ahead=0), 32, 0)

    assert len(ahead) == len(in_line)
    for found, expected in zip(ahead, in_line, strict=True):
        assert set(found) == set(expected)
        for name, tensor in expected.items():
            assert torch.equal(found[name], tensor), name


def epochs(data: StreamedTimeline, generator: torch.Generator, count: int) -> list[list[dict]]:
    return [[dict(batch) for batch in data.minibatches(32, generator)] for _ in range(count)]


def assert_same_batches(found: list[list[dict]], expected: list[list[dict]]) -> None:
    assert [len(batches) for batches in found] == [len(batches) for batches in expected]
    for found_epoch, expected_epoch in zip(found, expected, strict=True):
        for batch, expected_batch in zip(found_epoch, expected_epoch, strict=True):
            assert set(batch) == set(expected_batch)
            for name, tensor in expected_batch.items():
                assert torch.equal(batch[name], tensor), name


def test_the_next_epoch_read_while_this_one_ends_gives_the_batches_read_in_line(split):
    """Each epoch's last shuffle tells the next epoch's row group order: its first slices are
    read while the last batches train, and the epochs are those read in line."""
    folder, description = split
    data = streamed(folder, description)
    ahead_generator, in_line_generator = torch.Generator(), torch.Generator()
    ahead_generator.manual_seed(4)
    in_line_generator.manual_seed(4)

    ahead = epochs(data, ahead_generator, 3)

    assert_same_batches(ahead, epochs(replace(data, read_ahead=0), in_line_generator, 3))
    assert torch.equal(ahead_generator.get_state(), in_line_generator.get_state())


def test_a_generator_set_between_epochs_reads_the_next_epoch_afresh(split):
    """A run resumed from a checkpoint sets the generator to its state: the reading begun for
    the state the last epoch left is not used."""
    folder, description = split
    data = streamed(folder, description)
    generator = torch.Generator()
    epochs(data, generator.manual_seed(0), 1)

    resumed = epochs(data, generator.manual_seed(9), 1)

    assert_same_batches(resumed, epochs(replace(data, read_ahead=0), generator.manual_seed(9), 1))


def test_an_epoch_closed_in_its_last_batches_stops_the_next_epochs_reading(split):
    folder, description = split
    data = streamed(folder, description)
    batches = data.minibatches(32, torch.Generator().manual_seed(0))
    count = len(data.batch_sizes(32))
    for _ in range(count):
        next(batches)
    assert read_ahead_threads()

    batches.close()

    assert not read_ahead_threads()


def test_a_split_let_go_stops_the_reading_it_began(split):
    folder, description = split
    data = streamed(folder, description)
    epoch(data, 32, 0)

    del data

    assert not read_ahead_threads()


def read_ahead_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "horizon-read-ahead"]


def test_a_slice_that_fails_to_convert_is_named_on_the_training_thread(split, monkeypatch):
    """The conversion fails on the reading thread; training gets an error naming the file and
    row group (not the thread's bare exception), and the thread is gone."""
    folder, description = split
    converted = dataset.timeline_tensors
    calls: list[int] = []

    def fail_on_the_third_slice(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("a list column holds a null")
        return converted(*args, **kwargs)

    monkeypatch.setattr(dataset, "timeline_tensors", fail_on_the_third_slice)
    pattern = r"part-0000[01]\.parquet: row group \d+: cannot read the timeline split: a list"
    with pytest.raises(HorizonError, match=pattern):
        epoch(streamed(folder, description), 32, 0)
    assert not read_ahead_threads()


def test_an_abandoned_epoch_stops_reading(split, monkeypatch):
    """Closing an epoch's batches after the first stops the thread, the epoch's slices unread."""
    folder, description = split
    converted = dataset.timeline_tensors
    calls: list[int] = []

    def counted(*args, **kwargs):
        calls.append(1)
        return converted(*args, **kwargs)

    monkeypatch.setattr(dataset, "timeline_tensors", counted)
    data = streamed(folder, description)
    batches = data.minibatches(32, torch.Generator().manual_seed(0))
    next(batches)

    batches.close()

    assert not read_ahead_threads()
    read = len(calls)
    epoch(replace(data, read_ahead=0), 32, 0)
    assert read < len(calls) - read


def test_an_update_that_fails_stops_reading(split):
    """An error in training leaves the loop over the batches, which closes them: the thread
    stops there, while the error's traceback (and the loop's frame) is still held."""
    folder, description = split

    with pytest.raises(InjectedCrash) as crash:
        for _ in streamed(folder, description).minibatches(32, torch.Generator()):
            raise InjectedCrash

    assert crash.tb is not None
    assert not read_ahead_threads()


def test_an_unreadable_part_file_is_named(tmp_path):
    folder = tmp_path / "train"
    folder.mkdir()
    (folder / "part-00000.parquet").write_bytes(b"not parquet")
    description = ProblemDescription(ActionType.DISCRETE, ["0", "1"], ["0"], [], 1, 0, 6.0)
    with pytest.raises(HorizonError, match=r"part-00000\.parquet: cannot read the timeline split"):
        streamed(folder, description)


MEASURE_TRAIN_STAGE = """
import json, sys
from pathlib import Path
from horizon_engine import streamed
from horizon_engine.dataset import load_timeline
from horizon_engine.pipeline import Engine
from horizon_engine.schema import ActionType

opened = streamed.StreamedTimeline.open.__func__
before = []

def peak_kib():
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmHWM:")).split()[1])

def open_and_mark(cls, *args, **kwargs):
    before.append(peak_kib())
    return opened(cls, *args, **kwargs)

config = json.loads(sys.argv[1])
warm_up = Path(config["pipeline"]["output_dir"]) / "timeline" / "eval"
load_timeline(warm_up, ActionType.DISCRETE, ["0", "1", "2", "3"], actions=["0", "1"])
streamed.StreamedTimeline.open = classmethod(open_and_mark)
manifest = Engine(show_progress=False).run(config, stages=["train"])
grown = peak_kib() - before[0]
details = manifest["stages"]["train"]["details"]
print(json.dumps({"grown_bytes": grown * 1024, "data": details["data"]}))
"""
"""Runs the train stage of the run configured by argv[1] and prints how much the process's peak
memory grew from just before the stage read its data, after a warm-up that reads the small eval
split (Arrow's reader and the conversion are set up first). The peak is Linux's ``VmHWM``:
``ru_maxrss`` would keep the forking pytest's peak across the exec."""

BOUND_GB = 0.01

FIXED_MIB = 40
"""What the streamed train stage's peak grows by besides its data, allowed above the bound:
Arrow's, torch's and the C allocator's own memory, which does not grow with the split (measured
here: 28.3-29.6 MiB of growth at 0.01 GiB in ten runs, where loading the same split in memory
grew the peak by 73-82 MiB in six: the bound lies about 20 MiB from either). The engine has
Arrow allocate from the C allocator (``horizon_engine.arrow_memory``); with Arrow's mimalloc
the streamed growth varied from 55 to 83 MiB with the threads' timing."""


@pytest.fixture(scope="module")
def large_run(tmp_path_factory) -> dict:
    """A CartPole run whose train split is 24 copies of a random policy's (each its own episodes):
    about 156,000 rows, whose tensors alone are four times ``BOUND_GB``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    folder = tmp_path_factory.mktemp("large") / "run"
    config = {
        "pipeline": {"output_dir": str(folder)},
        "source": {"kind": "gym", "env": "CartPole-v1", "episodes": 300, "ds": "2019-01-01"},
        "timeline": {"actions": ["0", "1"], "eval_fraction": 0.05},
        "normalization": {"quantiles": False},
        "trainer": {
            "kind": "dqn",
            "epochs": 1,
            "layers": [16],
            "threads": 1,
            "minibatch_size": 2048,
        },
    }
    Engine(show_progress=False).run(config, stages=["source", "timeline", "normalization"])
    split = folder / "timeline" / "train"
    table = pq.read_table(split)
    copies = [
        table.set_column(
            table.schema.get_field_index("mdp_id"),
            "mdp_id",
            pc.binary_join_element_wise(pa.scalar(f"copy{copy}-"), table["mdp_id"], ""),
        )
        for copy in range(24)
    ]
    for part in split.iterdir():
        part.unlink()
    pq.write_table(pa.concat_tables(copies), split / "part-00000.parquet", 65_536)
    return config


def train_stage_growth(config: dict, data: str) -> dict:
    trainer = {**config["trainer"], "data": data, "max_memory_gb": BOUND_GB}
    found = subprocess.run(
        [sys.executable, "-c", MEASURE_TRAIN_STAGE, json.dumps({**config, "trainer": trainer})],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(found.stdout.splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's VmHWM")
@pytest.mark.parametrize("data", ["streamed", "memory"])
def test_streamed_training_memory_is_bounded_by_the_setting_not_the_data(large_run, data):
    """The same measurement of the in-memory train stage exceeds the bound: it measures."""
    measured = train_stage_growth(large_run, data)

    assert measured["data"].startswith("streamed" if data == "streamed" else "in memory")
    within = measured["grown_bytes"] < BOUND_GB * 2**30 + FIXED_MIB * 2**20
    assert within if data == "streamed" else not within, measured


class InjectedCrash(BaseException):
    """A kill in the middle of the second epoch: nothing a stage catches."""


def streamed_cartpole(output_dir: Path, **trainer: object) -> dict:
    return {
        "pipeline": {"output_dir": str(output_dir), "seed": 5},
        "source": {"kind": "gym", "env": "CartPole-v1", "episodes": 60, "ds": "2019-01-01"},
        "timeline": {"actions": ["0", "1"], "eval_fraction": 0.2, "n_step": 2},
        "normalization": {"quantiles": False},
        "trainer": {
            "kind": "dqn",
            "epochs": 3,
            "layers": [16],
            "threads": 1,
            "minibatch_size": 64,
            "data": "streamed",
            "max_memory_gb": 0.0005,
            **trainer,
        },
    }


def test_a_streamed_training_resumes_to_the_uninterrupted_parameters(tmp_path, monkeypatch):
    from horizon_engine.driver import TrainingDriver

    whole = Engine(show_progress=False).run(streamed_cartpole(tmp_path / "whole"))
    assert whole["stages"]["train"]["details"]["data"].startswith("streamed")
    config = streamed_cartpole(tmp_path / "resumed")
    original = TrainingDriver.train_batch
    seen: list[int] = []

    def crash_in_second_epoch(driver: TrainingDriver, batch) -> None:
        seen.extend([1] if driver.epoch == 1 else [])
        if len(seen) == 3:
            raise InjectedCrash
        original(driver, batch)

    with monkeypatch.context() as patch, pytest.raises(InjectedCrash):
        patch.setattr(TrainingDriver, "train_batch", crash_in_second_epoch)
        Engine(show_progress=False).run(config)
    resumed = Engine(show_progress=False).run(config, resume=True)

    assert resumed["stages"]["train"]["details"]["resumed_after_epoch"] == 1
    expected = torch.load(tmp_path / "whole" / "checkpoints" / "latest.pt", weights_only=True)
    found = torch.load(tmp_path / "resumed" / "checkpoints" / "latest.pt", weights_only=True)
    networks = expected["trainer"]["q_network"]
    assert networks.keys() == found["trainer"]["q_network"].keys()
    for name, tensor in networks.items():
        assert torch.equal(tensor, found["trainer"]["q_network"][name]), name


@pytest.mark.slow
def test_offline_cartpole_learns_from_a_streamed_timeline(tmp_path):
    """``test_dqn``'s offline CartPole (its seed 3, options and bar), the timeline streamed
    through a shuffle buffer of about 60% of the 30,000 rows."""
    from tests.test_dqn import onnx_greedy_return

    run = tmp_path / "run"
    config = {
        "pipeline": {"output_dir": str(run), "seed": 3},
        "source": {"kind": "gym", "env": "CartPole-v1", "policy": "random", "episodes": 1370},
        "timeline": {"actions": ["0", "1"], "reward": {"reward": 1.0}, "n_step": 3},
        "normalization": {"quantiles": False},
        "trainer": {
            "kind": "dqn",
            "n_step": 3,
            "cql_alpha": 1.0,
            "cql_weighting": "constant",
            "minibatch_size": 256,
            "epochs": 20,
            "data": "streamed",
            "max_memory_gb": 0.03,
        },
        "export": {"kind": "onnx"},
    }
    manifest = Engine(show_progress=False).run(config)

    assert manifest["stages"]["train"]["details"]["data"].startswith("streamed")
    score = onnx_greedy_return(run / "model.onnx")
    print(f"offline CartPole, streamed: mean return {score:.1f} over 50 episodes")
    assert score >= 150


def test_estimators_on_an_eval_split_over_the_budget_run_on_whole_first_episodes_and_say_so(
    tmp_path,
):
    config = streamed_cartpole(tmp_path / "run", epochs=1, max_memory_gb=0.00005)
    config["evaluation"] = [{"kind": "snips"}]

    manifest = Engine(show_progress=False).run(config)

    train, evaluation = manifest["stages"]["train"], manifest["stages"]["evaluation"]
    assert "streamed in whole episodes" in train["details"]["data"]
    for stage in (train, evaluation):
        assert any("the estimators ran on its first" in warning for warning in stage["warnings"])
    cpe = json.loads((tmp_path / "run" / "cpe.json").read_text())
    assert 0 < cpe["eval_rows"] < train["details"]["eval_rows"]


def test_the_estimators_sample_is_the_whole_episodes_within_the_rows_that_fit(split):
    """Read in slices of many rows, cut back to the episodes a row at a time would give (one
    whole episode where the first is longer than the rows that fit: Pendulum's 200)."""
    from horizon_engine.streamed import EVAL_SHARE, episodes_within, memory_budget, row_bytes
    from horizon_engine.training import TrainerConfig

    folder, description = split
    cpu = torch.device("cpu")
    data = streamed(folder, description)
    config = TrainerConfig(max_memory_gb=len(data) // 3 * row_bytes(data) / EVAL_SHARE / 2**30)
    fit = int(EVAL_SHARE * memory_budget(config.max_memory_gb, cpu)) // row_bytes(data)

    sample, warnings = episodes_within(folder, description, config, cpu)

    one_row_at_a_time = next(streamed(folder, description, buffer_rows=1).episodes(fit))
    assert len(sample) > 0 and len(warnings) == 1
    for name, tensor in one_row_at_a_time.tensors().items():
        assert torch.equal(sample.tensors()[name], tensor), name


def test_auto_streams_only_the_data_that_does_not_fit(split):
    from horizon_engine.streamed import choose_data, row_bytes
    from horizon_engine.training import TrainerConfig

    folder, description = split
    data = streamed(folder, description)
    size_gb = len(data) * row_bytes(data) / 2**30

    half = data.shard(0, 2)  # an eval split of about half as many rows

    roomy = choose_data(TrainerConfig(max_memory_gb=2 * size_gb), data, half)
    tight = choose_data(TrainerConfig(max_memory_gb=1.2 * size_gb), data, half)
    told = choose_data(TrainerConfig(data="memory", max_memory_gb=size_gb / 10), data, half)

    assert (roomy.train, roomy.eval) == ("memory", "memory")
    assert (tight.train, tight.eval) == ("streamed", "memory")
    assert tight.reason.startswith("streamed: they do not fit")
    assert (told.train, told.eval) == ("memory", "memory")


def test_auto_budget_on_a_gpu_is_bounded_by_the_devices_memory_too(monkeypatch):
    """A split held in memory is moved to the device whole: on a GPU with less memory than
    the machine's share, "auto" is the device's share."""
    from types import SimpleNamespace

    from horizon_engine.streamed import MEMORY_SHARE, memory_budget

    host = memory_budget("auto")
    device_memory = host  # a device as large as the host's share: its own share is smaller
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device: SimpleNamespace(total_memory=device_memory),
    )

    assert memory_budget("auto", torch.device("cpu")) == host
    assert memory_budget("auto", torch.device("cuda", 0)) == device_memory // MEMORY_SHARE
    assert memory_budget(2, torch.device("cuda", 0)) == 2 * 2**30


class Masked(torch.nn.Module):
    """A stand-in preprocessor: the values where present."""

    def forward(self, values: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
        return values * presence


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batches_on_a_gpu_are_the_cpu_batches_moved_and_preprocessed_there(split):
    folder, description = split
    on_cpu = streamed(folder, description).with_preprocessed(Masked())
    device = torch.device("cuda")
    on_gpu = StreamedTimeline.open(folder, description, 100, device).with_preprocessed(Masked())

    for cpu, gpu in zip(epoch(on_cpu, 64, 0), epoch(on_gpu, 64, 0), strict=True):
        assert gpu["state_preprocessed"].device.type == "cuda"
        assert set(cpu) == set(gpu)
        for name in cpu:
            assert torch.equal(cpu[name], gpu[name].cpu()), name


@pytest.mark.parametrize("size", [0, -1, True, float("inf"), float("nan"), "lots"])
def test_a_memory_budget_that_is_no_finite_size_is_refused_with_the_option_named(size):
    from pydantic import ValidationError

    from horizon_engine.training import TrainerConfig

    with pytest.raises(ValidationError, match="max_memory_gb"):
        TrainerConfig(max_memory_gb=size)


def test_a_split_read_in_memory_a_slice_at_a_time_is_the_whole_table_converted(split):
    """``read_in_memory`` (what training in memory reads) holds exactly what converting the
    whole table at once gives, tensor for tensor, in the same order."""
    from horizon_engine.streamed import read_in_memory

    folder, description = split
    expected = in_memory(folder, description).tensors()

    found = read_in_memory(folder, description).tensors()

    assert found.keys() == expected.keys()
    for name, tensor in expected.items():
        assert found[name].dtype == tensor.dtype, name
        assert torch.equal(found[name], tensor), name
