"""The 21 table features the papers use: dim, rows, pooling factor, size, 17 access-reuse bins."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .memory import BYTES_PER_ELEMENT, WeightsPrecision
from .tables import NUM_REUSE_BINS, TableSpec

FEATURE_NAMES: tuple[str, ...] = ("dim", "rows", "pooling_factor", "size_bytes") + tuple(
    f"reuse_bin_{k}" for k in range(NUM_REUSE_BINS)
)
NUM_FEATURES = len(FEATURE_NAMES)  # 21


def table_features(
    table: TableSpec, batch_size: int, weights_precision: WeightsPrecision = "fp32"
) -> np.ndarray:
    """One table's 21 raw features (unnormalised; the cost model fits its own normaliser)."""
    head = [
        float(table.dim),
        float(table.rows),
        float(table.pooling_factor),
        float(table.rows * table.dim * BYTES_PER_ELEMENT[weights_precision]),
    ]
    return np.concatenate([np.asarray(head), table.reuse_features(batch_size)])


def tables_features(
    tables: Sequence[TableSpec], batch_size: int, weights_precision: WeightsPrecision = "fp32"
) -> np.ndarray:
    """Feature matrix [len(tables), 21]."""
    if not tables:
        return np.zeros((0, NUM_FEATURES))
    return np.stack([table_features(t, batch_size, weights_precision) for t in tables])
