"""NeuroShard augmentation: dim copies, column halves sharing index data, pooling resampling."""

import numpy as np
import pytest

from shardwise.workload import (
    DIMS,
    TableSet,
    TableSpec,
    augment_tables,
    index_seed,
    reuse_histogram,
    sample_batch,
)


def _tableset() -> TableSet:
    return TableSet(
        batch_size=256,
        tables=(
            TableSpec(name="a", rows=5000, dim=64, pooling_factor=8.0, zipf_alpha=1.1),
            TableSpec(name="b", rows=800, dim=96, pooling_factor=3.0, zipf_alpha=0.3),
            TableSpec(name="empty", rows=100, dim=16, pooling_factor=0.0, zipf_alpha=0.0),
        ),
    )


def test_every_table_at_every_dim_with_unique_names():
    out = augment_tables(_tableset(), seed=0)
    names = [t.name for t in out.tables]
    assert len(names) == len(set(names))
    for source in ("a", "a~pf0", "b", "b~pf0", "empty"):
        family = [t for t in out.tables if (t.source or t.name) == source]
        assert set(DIMS) <= {t.dim for t in family}, source
    assert not any(t.name.startswith("empty~") for t in out.tables)  # nothing to resample


def test_halves_share_index_data_and_are_not_duplicates():
    out = augment_tables(_tableset(), seed=0, halvings=2)
    half = out.table("b[0:48]")
    quarter = out.table("b[0:24]")
    assert half.source == quarter.source == "b" and half.dim == 48 and quarter.dim == 24
    assert index_seed(half) == index_seed(out.table("b"))
    # "a" is 64 wide: its halves (32, 16) are already dim copies, so no separate half entries
    assert not any(t.name.startswith("a[") for t in out.tables)


def test_pooling_resampling_rederives_reuse_bins():
    ts = _tableset()
    out = augment_tables(ts, seed=3, pooling_resamples=2)
    for k in range(2):
        spec = out.table(f"a~pf{k}")
        factor = spec.pooling_factor / 8.0
        assert 0.25 <= factor <= 4.0 and spec.source is None and spec.zipf_alpha == 1.1
        _, indices = sample_batch(spec, ts.batch_size, index_seed(spec))
        np.testing.assert_allclose(spec.reuse_bins, reuse_histogram(indices))
        assert out.table(f"a~pf{k}@d4").source == f"a~pf{k}"
    assert out.table("a~pf0").pooling_factor != out.table("a~pf1").pooling_factor
    assert augment_tables(ts, seed=3) == augment_tables(ts, seed=3)
    assert augment_tables(ts, seed=3) != augment_tables(ts, seed=4)


def test_measured_tables_keep_their_skew_when_resampled():
    """A table read from data has bins but no alpha: the resampled copy's alpha is fitted to its bins."""
    skewed = TableSpec(name="s", rows=20000, dim=32, pooling_factor=20.0, zipf_alpha=1.4)
    bins = reuse_histogram(sample_batch(skewed, 512, 0)[1])
    measured = skewed.model_copy(update={"zipf_alpha": None, "reuse_bins": tuple(bins)})
    out = augment_tables(TableSet(batch_size=512, tables=(measured,)), seed=0, dims=(32,))
    assert out.table("s~pf0").zipf_alpha == pytest.approx(1.4, abs=0.2)


def test_refuses_bad_dims():
    with pytest.raises(ValueError, match="dims: 6"):
        augment_tables(_tableset(), seed=0, dims=(4, 6))
