"""The embedding tables of two public DLRM models, the real models the drop-in planner is benchmarked and tested on:
MLPerf training's DLRM-DCNv2 (Criteo 1TB, the v3.0 reference) and the Criteo Kaggle Display Advertising DLRM
(facebookresearch/dlrm's Kaggle run)."""

from __future__ import annotations

from .tables import TableSpec

#: rows per table (the reference's max_ind_range of 40M caps the largest)
MLPERF_DCNV2_ROWS = (40_000_000, 39_060, 17_295, 7_424, 20_265, 3, 7_122, 1_543, 63, 40_000_000, 3_067_956, 405_282,
                     10, 2_209, 11_938, 155, 4, 976, 14, 40_000_000, 40_000_000, 40_000_000, 590_152, 12_973, 108, 36)
#: multi-hot lookups per sample of each table
MLPERF_DCNV2_POOLING = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
MLPERF_DCNV2_DIM = 128

#: rows per table: the 26 categorical features' cardinalities in the Kaggle dataset, as facebookresearch/dlrm's
#: Kaggle run sizes its tables (its --arch-embedding-size); one lookup per sample each (one-hot)
CRITEO_KAGGLE_ROWS = (1_460, 583, 10_131_227, 2_202_608, 305, 24, 12_517, 633, 3, 93_145, 5_683, 8_351_593, 3_194, 27,
                      14_992, 5_461_306, 10, 5_652, 2_173, 4, 7_046_547, 18, 15, 286_181, 105, 142_572)
#: the Kaggle run's --arch-sparse-feature-size (its bottom MLP 13-512-256-64-16 ends at it)
CRITEO_KAGGLE_DIM = 16


def mlperf_dcnv2_tables(row_scale: float = 1.0) -> tuple[TableSpec, ...]:
    """The 26 tables as `t0`..`t25`, rows x `row_scale` (at least 2), with their multi-hot pooling factors."""
    return tuple(TableSpec(name=f"t{i}", rows=max(2, int(rows * row_scale)), dim=MLPERF_DCNV2_DIM,
                           pooling_factor=float(pooling))
                 for i, (rows, pooling) in enumerate(zip(MLPERF_DCNV2_ROWS, MLPERF_DCNV2_POOLING, strict=True)))


def criteo_kaggle_tables(row_scale: float = 1.0, dim: int = CRITEO_KAGGLE_DIM) -> tuple[TableSpec, ...]:
    """The Criteo Kaggle DLRM's 26 tables as `t0`..`t25`, rows x `row_scale` (at least 2), `dim` wide, one lookup
    per sample."""
    return tuple(TableSpec(name=f"t{i}", rows=max(2, int(rows * row_scale)), dim=dim, pooling_factor=1.0)
                 for i, rows in enumerate(CRITEO_KAGGLE_ROWS))
