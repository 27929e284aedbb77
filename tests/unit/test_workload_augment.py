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
from shardwise.workload.augment import cost_proxy, heaviest


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


def _users_tables() -> TableSet:
    """The heaviest by pooling x (dim + 16) is "wide" (30 x 144), not "many" (40 x 32): the proxy, not pooling."""
    return TableSet(
        batch_size=256,
        tables=(
            TableSpec(name="wide", rows=4000, dim=128, pooling_factor=30.0, zipf_alpha=1.0),
            TableSpec(name="many", rows=300, dim=16, pooling_factor=40.0, zipf_alpha=0.5),
            *(TableSpec(name=f"s{i}", rows=100 * (i + 2), dim=32, pooling_factor=1.0 + i, zipf_alpha=0.8)
              for i in range(8)),
            TableSpec(name="long", rows=90_000, dim=8, pooling_factor=2.0, zipf_alpha=1.2),
        ),
    )


def test_heaviest_ranks_by_pooling_times_dim_plus_16():
    assert [t.name for t in heaviest(_users_tables().tables)] == ["wide", "many"]  # ceil(10% of 11)
    assert heaviest(_users_tables().tables, share=0.01) == [_users_tables().table("wide")]
    assert cost_proxy(_users_tables().table("many")) == pytest.approx(40 * 32)


def test_covering_extremes_spans_the_users_pooling_max_at_the_widest_dim_and_their_row_range():
    ts = _users_tables()
    plain = augment_tables(ts, seed=0)
    out = augment_tables(ts, seed=0, cover_extremes=True)
    assert out.tables[: len(plain.tables)] == plain.tables  # the usual augmentation, then the extremes
    added = {t.name: t for t in out.tables[len(plain.tables):]}
    assert len({t.name for t in out.tables}) == len(out.tables)
    # the heaviest tables at pooling 40 (the users' max) and dim 128 (their widest): "wide" was at 30; "many", at 40
    # already, has its dim copy at 128 from the usual augmentation
    extreme = added["wide^max"]
    assert (extreme.pooling_factor, extreme.dim, extreme.rows) == (40.0, 128, 4000)
    assert "many^max" not in added and plain.table("many@d128").pooling_factor == 40.0
    # and at the fewest (200) and most (90,000) rows, each with index data of its own, its reuse bins measured on it
    assert added["wide^rows_min"].rows == 200 and added["wide^rows_max"].rows == 90_000
    assert added["many^rows_min"].rows == 200 and "many^rows_max" in added
    for spec in added.values():
        assert spec.source is None and spec.zipf_alpha == ts.table(spec.name.split("^")[0]).zipf_alpha
        _, indices = sample_batch(spec, ts.batch_size, index_seed(spec))
        np.testing.assert_allclose(spec.reuse_bins, reuse_histogram(indices))
    assert not any("^" in t.name for t in plain.tables)  # synthetic populations (no cover_extremes) unchanged
