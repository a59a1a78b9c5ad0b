"""The normalization stage's sample: a seeded reservoir over the train split's row groups,
uniform, reproducible, and every row (as the whole-split read gave) when it holds them all."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from horizon_engine import Reservoir, group_map_values
from horizon_engine.builtin.normalization import LocalNormalization
from horizon_engine.normalization import NormalizationConfig

ROWS = 50_000
SIZE = 5_000
BINS = 20
CHI_SQUARE_LIMIT = 43.82
"""The 0.1% upper point of chi-square with BINS - 1 = 19 degrees of freedom."""


def positions(rows: int, batch: int) -> list[pa.Table]:
    """Batches of a table whose one column is each row's position in the stream."""
    return [
        pa.table({"position": np.arange(start, min(start + batch, rows))})
        for start in range(0, rows, batch)
    ]


def drawn(seed: int, rows: int = ROWS, size: int = SIZE, batch: int = 4_096) -> np.ndarray:
    reservoir = Reservoir(size, seed)
    for table in positions(rows, batch):
        reservoir.add(table)
    return reservoir.sample(pa.schema([("position", pa.int64())]))["position"].to_numpy()


def test_the_sample_is_uniform_over_the_stream():
    sample = drawn(seed=11)
    assert len(sample) == SIZE and len(np.unique(sample)) == SIZE
    counts = np.bincount(sample * BINS // ROWS, minlength=BINS)
    expected = SIZE / BINS
    assert ((counts - expected) ** 2 / expected).sum() < CHI_SQUARE_LIMIT, counts


def test_each_row_is_drawn_as_often_as_any_other():
    # Over many seeds, the first, a middle and the last rows of a stream of 40 enter a sample
    # of 10 a quarter of the time each (a row's chance is 10/40, whichever batch it came in).
    draws = np.stack([np.isin([0, 17, 39], drawn(seed, 40, 10, 7)) for seed in range(2_000)])
    assert np.all(np.abs(draws.mean(axis=0) - 0.25) < 0.035), draws.mean(axis=0)


def test_the_same_seed_draws_the_same_sample_in_stream_order():
    first = drawn(seed=3)
    assert np.array_equal(first, drawn(seed=3))
    assert np.array_equal(first, np.sort(first))
    assert not np.array_equal(first, drawn(seed=4))
    assert np.array_equal(drawn(seed=3, rows=SIZE), np.arange(SIZE))


def timeline_split(folder, rows: int) -> None:
    """A train split of two files of several row groups; feature "1" is missing in odd rows."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    maps = [
        {"0": float(value), **({"1": float(value * 2)} if row % 2 == 0 else {})}
        for row, value in enumerate(rng.normal(size=rows))
    ]
    column = pa.array(maps, pa.map_(pa.string(), pa.float64()))
    half = rows // 2
    for number, part in enumerate((column.slice(0, half), column.slice(half))):
        table = pa.table({"state_features": part})
        pq.write_table(table, folder / f"part-{number:05d}.parquet", row_group_size=700)


@pytest.mark.parametrize("num_samples", [5_000, 10_000])
def test_a_sample_of_every_row_is_the_whole_split(tmp_path, num_samples):
    timeline_split(tmp_path / "train", 5_000)
    sample = LocalNormalization(NormalizationConfig()).sample(
        SimpleNamespace(seed=1), tmp_path / "train", "state_features", num_samples
    )
    whole = pq.read_table(tmp_path / "train")["state_features"].combine_chunks()
    expected = group_map_values(whole)
    assert sample.keys() == expected.keys()
    for feature, values in expected.items():
        assert np.array_equal(sample[feature], values)


def test_a_smaller_sample_is_reproducible_and_spans_the_files(tmp_path):
    timeline_split(tmp_path / "train", 5_000)
    engine = LocalNormalization(NormalizationConfig())

    def sample(seed: int) -> dict[str, np.ndarray]:
        return engine.sample(
            SimpleNamespace(seed=seed), tmp_path / "train", "state_features", 1_000
        )

    first = sample(1)
    assert len(first["0"]) == 1_000
    assert 400 < len(first["1"]) < 600
    assert all(np.array_equal(first[name], values) for name, values in sample(1).items())
    assert not np.array_equal(first["0"], sample(2)["0"])
    whole = pq.read_table(tmp_path / "train")["state_features"].combine_chunks()
    order = {value: row for row, value in enumerate(group_map_values(whole)["0"].tolist())}
    rows = np.array([order[value] for value in first["0"].tolist()])
    assert (rows < 2_500).any() and (rows >= 2_500).any()
