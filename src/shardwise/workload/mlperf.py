"""The embedding tables of MLPerf training's DLRM-DCNv2 (Criteo 1TB, the v3.0 reference): the one real model the
drop-in planner is benchmarked and tested on."""

from __future__ import annotations

from .tables import TableSpec

#: rows per table (the reference's max_ind_range of 40M caps the largest)
MLPERF_DCNV2_ROWS = (40_000_000, 39_060, 17_295, 7_424, 20_265, 3, 7_122, 1_543, 63, 40_000_000, 3_067_956, 405_282,
                     10, 2_209, 11_938, 155, 4, 976, 14, 40_000_000, 40_000_000, 40_000_000, 590_152, 12_973, 108, 36)
#: multi-hot lookups per sample of each table
MLPERF_DCNV2_POOLING = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
MLPERF_DCNV2_DIM = 128


def mlperf_dcnv2_tables(row_scale: float = 1.0) -> tuple[TableSpec, ...]:
    """The 26 tables as `t0`..`t25`, rows x `row_scale` (at least 2), with their multi-hot pooling factors."""
    return tuple(TableSpec(name=f"t{i}", rows=max(2, int(rows * row_scale)), dim=MLPERF_DCNV2_DIM,
                           pooling_factor=float(pooling))
                 for i, (rows, pooling) in enumerate(zip(MLPERF_DCNV2_ROWS, MLPERF_DCNV2_POOLING, strict=True)))
