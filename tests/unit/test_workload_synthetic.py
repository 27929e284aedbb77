"""Synthetic DLRM tables against the published DLRM 2021 dataset statistics, with stated tolerances.

Tolerances: pooling factor and rows mean within 5% and sd within 10% of the targets; empty tables 3-5%;
reuse shares (mean over non-empty tables of each table's measured bins) within 0.04 absolute per bin
(the targets' smallest share is 0.03, a uniform-access population misses bin 0 by > 0.4).
"""

import numpy as np
import pytest
from scipy.stats import skew

from shardwise.workload import DIMS, TableSpec, index_seed, read_dlrm_dataset, reuse_histogram, sample_batch
from shardwise.workload.synthetic import (
    collapse_reuse_bins,
    expected_reuse_shares,
    fit_zipf_alpha,
    synthesize_tables,
    target_reuse_shares,
    write_index_data,
)

REUSE_TOLERANCE = 0.04


@pytest.fixture(scope="module")
def population():
    # CPU-friendly: the rows scaled by 0.01, one batch of 2048 samples (the scale `make run` profiles at)
    return synthesize_tables(856, seed=0, row_scale=0.01, batch_size=2048, progress=False)


def _mean_shares(tableset):
    bins = np.array([t.reuse_bins for t in tableset.tables if t.pooling_factor > 0])
    return collapse_reuse_bins(bins).mean(axis=0)


def test_pooling_statistics(population):
    pooling = np.array([t.pooling_factor for t in population.tables])
    assert len(pooling) == 856
    assert pooling.mean() == pytest.approx(15.8, rel=0.05)
    assert pooling.std() == pytest.approx(25.6, rel=0.10)
    assert 0.03 <= (pooling == 0).mean() <= 0.05
    assert skew(pooling) > 2.0  # heavy right tail, as in the dataset
    assert np.percentile(pooling, 99) > 5 * np.median(pooling)


def test_rows_and_dims(population):
    rows_full_scale = np.array([t.rows for t in population.tables]) / 0.01
    assert rows_full_scale.mean() == pytest.approx(4.1e6, rel=0.05)
    assert rows_full_scale.std() == pytest.approx(3.1e6, rel=0.10)
    dims = {t.dim for t in population.tables}
    assert dims == set(DIMS)


def test_reuse_shares_near_targets(population):
    shares = _mean_shares(population)
    np.testing.assert_allclose(shares, target_reuse_shares(), atol=REUSE_TOLERANCE)


def test_reuse_shares_hold_at_another_batch_and_scale():
    small = synthesize_tables(200, seed=1, row_scale=0.001, batch_size=512, progress=False)
    np.testing.assert_allclose(_mean_shares(small), target_reuse_shares(), atol=REUSE_TOLERANCE)


def test_one_alpha_for_all_misses_the_targets(population):
    """The tolerance discriminates: the same tables with one shared alpha fall outside it."""
    tables = [
        t.model_copy(update={"zipf_alpha": 1.0})
        for t in population.tables[:200]
        if t.pooling_factor > 0
    ]
    bins = [reuse_histogram(sample_batch(t, 2048, index_seed(t))[1]) for t in tables]
    miss = np.abs(collapse_reuse_bins(np.array(bins)).mean(axis=0) - target_reuse_shares()).max()
    assert miss > REUSE_TOLERANCE


def test_stored_bins_are_measured_on_the_index_data(population):
    for t in population.tables[:20]:
        _, indices = sample_batch(t, population.batch_size, index_seed(t))
        np.testing.assert_allclose(t.reuse_bins, reuse_histogram(indices))


def test_seeded():
    a = synthesize_tables(12, seed=5, row_scale=0.001, batch_size=256, progress=False)
    assert a == synthesize_tables(12, seed=5, row_scale=0.001, batch_size=256, progress=False)
    assert a != synthesize_tables(12, seed=6, row_scale=0.001, batch_size=256, progress=False)
    assert all(t.rows >= 100 for t in a.tables)


@pytest.mark.parametrize(("rows", "lookups", "alpha"), [(5000, 20000, 0.0), (50000, 30000, 1.2), (3000, 90000, 0.7)])
def test_expected_shares_match_the_sampler(rows, lookups, alpha):
    table = TableSpec(name="x", rows=rows, dim=8, pooling_factor=lookups / 1000, zipf_alpha=alpha)
    measured = collapse_reuse_bins(reuse_histogram(sample_batch(table, 1000, seed=3)[1]))
    np.testing.assert_allclose(expected_reuse_shares(rows, lookups, [alpha])[0], measured, atol=0.02)
    assert fit_zipf_alpha(rows, lookups / 1000, 1000, reuse_histogram(sample_batch(table, 1000, 4)[1])) == (
        pytest.approx(alpha, abs=0.15)
    )


def test_index_data_file_reads_back_as_the_same_tables(tmp_path):
    ts = synthesize_tables(6, seed=2, row_scale=0.001, batch_size=128, progress=False)
    path = write_index_data(ts, tmp_path / "indices.pt", progress=False)
    ds = read_dlrm_dataset(path, dim=[t.dim for t in ts.tables])
    for spec, back in zip(ts.tables, ds.tables.tables):
        assert back.rows <= spec.rows
        np.testing.assert_allclose(back.reuse_bins, spec.reuse_bins)
        lengths, _ = sample_batch(spec, 128, index_seed(spec))
        assert back.pooling_factor == pytest.approx(lengths.mean())
