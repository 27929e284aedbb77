"""The real models' tables (workload/mlperf.py): MLPerf DLRM-DCNv2's and the Criteo Kaggle DLRM's, at full size and
scaled down."""

from __future__ import annotations

import pytest

from shardwise.workload import CRITEO_KAGGLE_ROWS, criteo_kaggle_tables, mlperf_dcnv2_tables


def test_the_criteo_kaggle_tables_are_the_published_cardinalities_one_hot_at_dlrm_s_kaggle_width():
    tables = criteo_kaggle_tables()
    assert [t.name for t in tables] == [f"t{i}" for i in range(26)]
    # the Kaggle dataset's 26 categorical features hold 33,762,577 distinct values together
    assert sum(t.rows for t in tables) == sum(CRITEO_KAGGLE_ROWS) == 33_762_577
    assert (tables[2].rows, tables[8].rows, tables[19].rows) == (10_131_227, 3, 4)  # the largest and the smallest
    assert {t.dim for t in tables} == {16} and {t.pooling_factor for t in tables} == {1.0}


@pytest.mark.parametrize("make", [criteo_kaggle_tables, mlperf_dcnv2_tables])
def test_scaled_tables_keep_at_least_two_rows_and_their_order(make):
    full, scaled = make(), make(0.001)
    assert [t.rows for t in scaled] == [max(2, int(t.rows * 0.001)) for t in full]
    assert [t.pooling_factor for t in scaled] == [t.pooling_factor for t in full]
    assert max(t.rows for t in scaled) < max(t.rows for t in full) and min(t.rows for t in scaled) >= 2


def test_criteo_kaggle_at_another_width_keeps_its_rows_and_a_width_fbgemm_cannot_run_is_refused():
    assert [(t.rows, t.dim) for t in criteo_kaggle_tables(dim=128)] == [(rows, 128) for rows in CRITEO_KAGGLE_ROWS]
    with pytest.raises(ValueError, match="dim"):
        criteo_kaggle_tables(dim=30)  # not a multiple of 4: fbgemm's kernels refuse it, so does TableSpec
