"""NeuroShard's table augmentation: more, and more varied, tables to pre-train the cost model on.

From each table: copies at every dim of a grid, column halves, and copies with a resampled pooling factor.
Dim copies and halves keep the table's index data (`source`); a resampled copy needs new index data (bag
sizes change), so it becomes its own source and its reuse bins are measured on its own sampled batch.
A column half is kept only where its dim is not already one of the dim copies (it would be the same table).

With `cover_extremes` (the user's own tables, whose extremes a plan for them meets): the heaviest tables by
`cost_proxy` also at the population's largest pooling factor and widest dim, and at its fewest and most rows, so
the tables the slowest device holds are inside what the cost model is trained on.
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
#: the share of a population (at least one table) that `heaviest` returns: the tables that set the slowest device
HEAVY_SHARE = 0.1
#: the per-row bytes-ish overhead in `cost_proxy`: single-table CPU cost ranks best with pooling x (dim + 16)
#: (Spearman 0.92 over 191 tables, ENVIRONMENT.md)
PROXY_DIM_OFFSET = 16


def cost_proxy(table: TableSpec) -> float:
    """A table's cost before any model prices it: pooling factor x (dim + 16)."""
    return table.pooling_factor * (table.dim + PROXY_DIM_OFFSET)


def heaviest(tables: Sequence[TableSpec], share: float = HEAVY_SHARE) -> list[TableSpec]:
    """The costliest `share` of `tables` by `cost_proxy` (at least one where any), costliest first."""
    ranked = sorted(tables, key=cost_proxy, reverse=True)
    return ranked[: max(1, math.ceil(share * len(ranked)))] if ranked else []


def resample_pooling(table: TableSpec, factor: float, name: str, batch_size: int) -> TableSpec:
    """`table` with pooling factor x `factor`, its own index data, and reuse bins measured on it."""
    return resampled(table, name, batch_size, pooling_factor=round(table.pooling_factor * factor, 4))


def resampled(table: TableSpec, name: str, batch_size: int, *, pooling_factor: float | None = None,
              rows: int | None = None) -> TableSpec:
    """`table` with another pooling factor or row count (bag sizes or ids change): its own index data, its skew
    carried over as a Zipf exponent, and reuse bins measured on it."""
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
            "pooling_factor": table.pooling_factor if pooling_factor is None else pooling_factor,
            "rows": table.rows if rows is None else rows,
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


def extreme_copies(tableset: TableSet) -> list[TableSpec]:
    """The heaviest tables (`heaviest`) at the population's largest pooling factor and widest dim, and at its fewest
    and most rows: each a table of its own (`<name>^max`, `^rows_min`, `^rows_max`) where it is not there already."""
    tables = tableset.tables
    max_pooling = max(t.pooling_factor for t in tables)
    max_dim = max(t.dim for t in tables)
    row_range = {"rows_min": min(t.rows for t in tables), "rows_max": max(t.rows for t in tables)}
    out: list[TableSpec] = []
    for table in heaviest(tables):
        if table.pooling_factor < max_pooling:  # at the largest, its dim copies are there already
            out.append(resampled(table.with_dim(max_dim), f"{table.name}^max", tableset.batch_size,
                                 pooling_factor=max_pooling))
        out += [resampled(table, f"{table.name}^{end}", tableset.batch_size, rows=rows)
                for end, rows in row_range.items() if rows != table.rows]
    return out


def augment_tables(
    tableset: TableSet,
    seed: int,
    dims: Sequence[int] = DIMS,
    halvings: int = 1,
    pooling_resamples: int = 1,
    cover_extremes: bool = False,
) -> TableSet:
    """Each table and `pooling_resamples` pooling-resampled copies, each at every dim in `dims` plus its halves;
    with `cover_extremes`, the heaviest tables' copies at the population's extremes too (`extreme_copies`)."""
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
    if cover_extremes:
        out.extend(extreme_copies(tableset))
    return TableSet(batch_size=tableset.batch_size, tables=tuple(out), given=tableset.given)
