"""Shard batches built with tensor ops on the device (here the CPU): the host sampler's distribution, determinism,
valid offsets; the DLRM index data path as the host built it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shardwise.profiling.batches import (
    host_shard_batch,
    index_data_batch,
    sample_shard_batch,
    shard_batch,
    split_batch,
)
from shardwise.workload import TableSpec, reuse_histogram
from shardwise.workload.synthetic import collapse_reuse_bins, expected_reuse_shares

CPU = torch.device("cpu")
BATCH = 4096
#: alphas of every branch of the Zipf sampler: uniform, below 1, the log law at 1, above 1, steep
TABLES = [
    TableSpec(name=f"z{i}", rows=rows, dim=8, pooling_factor=pooling, zipf_alpha=alpha)
    for i, (rows, pooling, alpha) in enumerate(
        [(5_000, 10.0, 0.0), (20_000, 6.0, 0.5), (8_000, 12.0, 1.0), (50_000, 8.0, 1.05), (3_000, 20.0, 2.0)]
    )
]


def _assert_valid(indices: torch.Tensor, offsets: torch.Tensor, tables: list[TableSpec], batch: int) -> None:
    assert offsets.dtype == indices.dtype == torch.int64
    assert offsets.shape == (len(tables) * batch + 1,) and int(offsets[0]) == 0
    assert bool((torch.diff(offsets) >= 0).all()) and int(offsets[-1]) == indices.numel()
    for table, (lengths, ids) in zip(tables, split_batch(indices, offsets, len(tables))):
        assert lengths.shape == (batch,) and lengths.sum() == ids.size
        assert ids.size == 0 or (ids.min() >= 0 and ids.max() < table.rows)


def test_a_sampled_shard_has_valid_offsets_and_ids_in_each_tables_rows() -> None:
    tables = [*TABLES, TableSpec(name="empty", rows=100, dim=4, pooling_factor=0.0)]
    indices, offsets = sample_shard_batch(tables, BATCH, CPU)
    _assert_valid(indices, offsets, tables, BATCH)
    assert split_batch(indices, offsets, len(tables))[-1][0].sum() == 0  # no lookups: every bag empty


@pytest.mark.parametrize("table", TABLES, ids=lambda t: f"alpha{t.zipf_alpha}")
def test_sampled_batches_have_the_host_samplers_distribution(table: TableSpec) -> None:
    (lengths, ids), = split_batch(*sample_shard_batch([table], BATCH, CPU), 1)
    (host_lengths, host_ids), = split_batch(*host_shard_batch([table], BATCH, CPU), 1)
    # bag sizes: Poisson(pooling factor), mean and variance both the pooling factor
    assert lengths.mean() == pytest.approx(table.pooling_factor, rel=0.03)
    assert lengths.var() == pytest.approx(table.pooling_factor, rel=0.1)
    # reuse bins (the cost model's skew features) as the host's batch and as expected for the sampler's law
    shares, host_shares = collapse_reuse_bins(reuse_histogram(ids)), collapse_reuse_bins(reuse_histogram(host_ids))
    expected = expected_reuse_shares(table.rows, ids.size, [table.zipf_alpha])[0]
    assert np.abs(shares - host_shares).sum() < 0.08
    assert np.abs(shares - expected).sum() < 0.08
    # skew: the share of lookups that go to the 1% most accessed rows
    assert _top_share(ids, table.rows) == pytest.approx(_top_share(host_ids, table.rows), abs=0.01)


def _top_share(ids: np.ndarray, rows: int) -> float:
    counts = np.sort(np.bincount(ids, minlength=rows))[::-1]
    return float(counts[: max(rows // 100, 1)].sum() / ids.size)


def test_a_tables_batch_depends_on_its_seed_alone() -> None:
    first = split_batch(*sample_shard_batch(TABLES, 256, CPU), len(TABLES))
    again = split_batch(*sample_shard_batch(TABLES, 256, CPU), len(TABLES))
    alone = split_batch(*sample_shard_batch(TABLES[2:3], 256, CPU), 1)
    for (a_len, a_ids), (b_len, b_ids) in zip(first, again):
        assert np.array_equal(a_len, b_len) and np.array_equal(a_ids, b_ids)
    # the same table in another shard gets the same batch; another seed, another batch
    assert np.array_equal(alone[0][1], first[2][1])
    other = split_batch(*sample_shard_batch(TABLES[2:3], 256, CPU, seeds=[7]), 1)
    assert not np.array_equal(other[0][1], first[2][1])


def test_column_slices_of_a_source_share_their_batch_in_a_shard() -> None:
    table = TABLES[3]
    halves = [table.with_dim(4, name="z3[0:4]"), table.with_dim(4, name="z3[4:8]")]
    (a_len, a_ids), (b_len, b_ids) = split_batch(*sample_shard_batch(halves, 512, CPU), 2)
    assert np.array_equal(a_len, b_len) and np.array_equal(a_ids, b_ids)


def test_index_data_is_built_as_the_host_built_it() -> None:
    # a dataset's batch larger than the profiled batch (cut), one smaller (tiled), and ids past the table's rows
    rng = np.random.default_rng(0)
    data = {}
    for name, bags in (("big", 3000), ("small", 700)):
        lengths = rng.poisson(4.0, bags).astype(np.int64)
        data[name] = (lengths, rng.integers(0, 10**6, int(lengths.sum())).astype(np.int64))
    tables = [TableSpec(name="big", rows=1000, dim=8, pooling_factor=4.0),
              TableSpec(name="small", rows=500, dim=8, pooling_factor=4.0),
              TableSpec(name="big[0:4]", rows=1000, dim=4, pooling_factor=4.0, source="big")]
    indices, offsets = index_data_batch(tables, 2048, data, CPU)
    host_indices, host_offsets = host_shard_batch(tables, 2048, CPU, data)
    assert torch.equal(indices, host_indices) and torch.equal(offsets, host_offsets)
    _assert_valid(indices, offsets, tables, 2048)
    assert torch.equal(shard_batch(tables, 2048, CPU, data)[0], indices)
    with pytest.raises(ValueError, match="no index data for its source 'missing'"):
        index_data_batch([TableSpec(name="missing", rows=10, dim=4, pooling_factor=1.0)], 8, data, CPU)
