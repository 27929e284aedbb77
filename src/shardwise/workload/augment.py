"""NeuroShard's table augmentation: more, and more varied, tables to pre-train the cost model on.

From each table: copies at every dim of a grid, column halves, and copies with a resampled pooling factor.
Dim copies and halves keep the table's index data (`source`); a resampled copy needs new index data (bag
sizes change), so it becomes its own source and its reuse bins are measured on its own sampled batch.
A column half is kept only where its dim is not already one of the dim copies (it would be the same table).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .synthetic import DIMS, fit_zipf_alpha, index_seed
from .tables import DIM_ALIGNMENT, TableSpec, reuse_histogram, sample_batch
from .tableset import TableSet

#: pooling factors are rescaled by a factor drawn log-uniformly from this range
POOLING_SCALE_RANGE: tuple[float, float] = (0.25, 4.0)


def resample_pooling(table: TableSpec, factor: float, name: str, batch_size: int) -> TableSpec:
    """`table` with pooling factor x `factor`, its own index data, and reuse bins measured on it."""
    alpha = table.zipf_alpha
    if alpha is None:
        # a measured table: carry its skew over as the Zipf exponent that best explains its reuse bins
        alpha = (
            fit_zipf_alpha(table.rows, table.pooling_factor, batch_size, table.reuse_bins)
            if table.reuse_bins is not None
            else 0.0
        )
    spec = table.model_copy(
        update={
            "name": name,
            "pooling_factor": round(table.pooling_factor * factor, 4),
            "zipf_alpha": alpha,
            "source": None,
            "reuse_bins": None,
        }
    )
    _, indices = sample_batch(spec, batch_size, index_seed(spec))
    return spec.model_copy(update={"reuse_bins": tuple(reuse_histogram(indices).tolist())})


def _variants(base: TableSpec, dims: Sequence[int], halvings: int) -> list[TableSpec]:
    out = [base]
    seen = {base.dim}
    for d in dims:
        if d not in seen:
            out.append(base.with_dim(d, name=f"{base.name}@d{d}"))
            seen.add(d)
    for h in range(1, halvings + 1):
        half = base.dim >> h
        if half < DIM_ALIGNMENT or half % DIM_ALIGNMENT or base.dim % (1 << h):
            break
        if half not in seen:
            out.append(base.with_dim(half, name=f"{base.name}[0:{half}]"))
            seen.add(half)
    return out


def augment_tables(
    tableset: TableSet,
    seed: int,
    dims: Sequence[int] = DIMS,
    halvings: int = 1,
    pooling_resamples: int = 1,
) -> TableSet:
    """Each table and `pooling_resamples` pooling-resampled copies, each at every dim in `dims` plus its halves."""
    for d in dims:
        if d < DIM_ALIGNMENT or d % DIM_ALIGNMENT:
            raise ValueError(f"dims: {d} is not a positive multiple of {DIM_ALIGNMENT}")
    if halvings < 0 or pooling_resamples < 0:
        raise ValueError("halvings and pooling_resamples must be >= 0")
    rng = np.random.default_rng(seed)
    lo, hi = (math.log(x) for x in POOLING_SCALE_RANGE)
    out: list[TableSpec] = []
    for table in tableset.tables:
        bases = [table]
        # empty tables stay empty under any scale: nothing to resample
        if table.pooling_factor > 0:
            for k in range(pooling_resamples):
                factor = math.exp(rng.uniform(lo, hi))
                bases.append(resample_pooling(table, factor, f"{table.name}~pf{k}", tableset.batch_size))
        for base in bases:
            out.extend(_variants(base, dims, halvings))
    return TableSet(batch_size=tableset.batch_size, tables=tuple(out))
