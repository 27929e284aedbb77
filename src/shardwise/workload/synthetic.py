"""Synthetic tables with the statistics of the DLRM 2021 embedding dataset, and their index data.

Targets (facebookresearch/dlrm_datasets, 856 tables, batch 65536): pooling factor mean 15.8, sd 25.6, heavy
tailed, about 4% empty tables; rows mean 4.1M, sd 3.1M; unique-row access-count shares (0,1] 0.47, (1,2] 0.15,
(2,4] 0.14, (4,8] 0.11, (8,16] 0.07, (16,32] 0.03 (the rest above 32).

Access skew: every table draws its rows from `zipf_row_sampler` with its own `zipf_alpha`. The shares a
table shows depend on its rows, its lookups per batch (pooling x batch) and alpha, so alpha is chosen for the
batch size and row scale the generator is told: for each table the expected shares are computed for a grid of
alphas (exactly for the sampler, Poisson counts per row), then a coordinate descent assigns each table an
alpha so that the mean shares over the non-empty tables come closest (L1) to the targets. A pure power law
cannot make every table look like the mean, but the population can: some tables get near-uniform access, others
steep skew. The stored `reuse_bins` are then measured on each table's actual sampled batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .dlrm_datasets import write_dlrm_dataset
from .tables import TableSpec, reuse_histogram, sample_batch, stable_seed
from .tableset import TableSet

DLRM_2021_NUM_TABLES = 856
DLRM_2021_BATCH_SIZE = 65536
DLRM_2021_POOLING_MEAN = 15.8
DLRM_2021_POOLING_SD = 25.6
DLRM_2021_EMPTY_FRACTION = 0.04
DLRM_2021_ROWS_MEAN = 4.1e6
DLRM_2021_ROWS_SD = 3.1e6
#: unique-row shares accessed (0,1], (1,2], (2,4], (4,8], (8,16], (16,32] times per batch; the rest is > 32
DLRM_2021_REUSE_SHARES: tuple[float, ...] = (0.47, 0.15, 0.14, 0.11, 0.07, 0.03)
DIMS: tuple[int, ...] = (4, 8, 16, 32, 64, 128)
#: scaled-down tables keep at least this many rows (a hash table of a handful of rows is not a DLRM table)
MIN_ROWS = 100

#: the alphas a table may get; 0 is uniform access
ALPHA_GRID = np.round(np.arange(0.0, 3.0001, 0.1), 2)
#: access-count edges of the first six reuse bins: counts (0,1], (1,2], (2,4], ..., (16,32], then > 32
_COUNT_EDGES = np.array([0, 1, 2, 4, 8, 16, 32], dtype=np.float64)
_COORDINATE_SWEEPS = 6


def target_reuse_shares() -> np.ndarray:
    """The seven target shares: the six published bins and the remainder (> 32 accesses)."""
    head = np.asarray(DLRM_2021_REUSE_SHARES)
    return np.concatenate([head, [1.0 - head.sum()]])


def collapse_reuse_bins(bins: Sequence[float] | np.ndarray) -> np.ndarray:
    """17 reuse bins -> the seven shares the targets are stated in (bins 6..16 summed)."""
    bins = np.asarray(bins, dtype=np.float64)
    return np.concatenate([bins[..., :6], bins[..., 6:].sum(axis=-1, keepdims=True)], axis=-1)


def _zipf_cdf(x: np.ndarray, rows: int, alpha: float) -> np.ndarray:
    """CDF of the continuous rank law on [1, rows+1] that `zipf_row_sampler` inverts."""
    if alpha <= 0.0:
        return (x - 1.0) / rows
    if abs(alpha - 1.0) < 1e-6:
        return np.log(x) / math.log(rows + 1.0)
    a = 1.0 - alpha
    return (x**a - 1.0) / ((rows + 1.0) ** a - 1.0)


def expected_reuse_shares(rows: int, lookups: int, alphas: Sequence[float] | np.ndarray) -> np.ndarray:
    """Expected seven shares [len(alphas), 7] of a `rows`-row table hit `lookups` times by the Zipf sampler."""
    from scipy.special import gammaincc  # imported here: scipy is slow to import and rarely needed

    # rank k gets mass F(k+1) - F(k); the first ranks one by one, the long tail in log-spaced groups
    exact = min(rows, 64)
    lo = np.arange(1, exact + 1, dtype=np.float64)
    hi = lo + 1.0
    if rows > exact:
        cuts = np.unique(np.round(np.geomspace(exact + 1, rows + 1, 128)))
        lo, hi = np.concatenate([lo, cuts[:-1]]), np.concatenate([hi, cuts[1:]])
    width = hi - lo
    alphas = np.asarray(alphas, dtype=np.float64)
    mass = np.stack([_zipf_cdf(hi, rows, a) - _zipf_cdf(lo, rows, a) for a in alphas])  # [K, G]
    lam = np.clip(lookups * mass / width, 0.0, None)[:, :, None]  # mean accesses of one row in each group
    cdf = gammaincc(_COUNT_EDGES + 1.0, lam)  # P(count <= edge), Poisson
    per_row = np.concatenate([np.diff(cdf, axis=2), 1.0 - cdf[:, :, -1:]], axis=2)  # [K, G, 7]
    counts = (per_row * width[None, :, None]).sum(axis=1)
    return counts / np.maximum(counts.sum(axis=1, keepdims=True), 1e-300)


def assign_zipf_alphas(
    rows: Sequence[int], lookups: Sequence[int], seed: int, target: np.ndarray | None = None
) -> np.ndarray:
    """One alpha per table so that the mean expected shares over tables with lookups come closest to `target`."""
    target = target_reuse_shares() if target is None else np.asarray(target)
    alphas = np.zeros(len(rows))
    active = [i for i, n in enumerate(lookups) if n > 0]
    if not active:
        return alphas
    shares = np.stack([expected_reuse_shares(int(rows[i]), int(lookups[i]), ALPHA_GRID) for i in active])
    n = len(active)
    choice = np.abs(shares - target).sum(axis=2).argmin(axis=1)  # each table's own best fit first
    total = shares[np.arange(n), choice].sum(axis=0)
    rng = np.random.default_rng(seed)
    for _ in range(_COORDINATE_SWEEPS):
        changed = 0
        for i in rng.permutation(n):
            rest = total - shares[i, choice[i]]
            k = int(np.abs((rest + shares[i]) / n - target).sum(axis=1).argmin())
            if k != choice[i]:
                changed += 1
                choice[i] = k
                total = rest + shares[i, k]
        if not changed:
            break
    alphas[active] = ALPHA_GRID[choice]
    return alphas


def fit_zipf_alpha(rows: int, pooling_factor: float, batch_size: int, reuse_bins: Sequence[float]) -> float:
    """The grid alpha whose expected shares are closest (L1) to a table's measured reuse bins."""
    lookups = int(round(pooling_factor * batch_size))
    if lookups == 0:
        return 0.0
    shares = expected_reuse_shares(rows, lookups, ALPHA_GRID)
    return float(ALPHA_GRID[np.abs(shares - collapse_reuse_bins(reuse_bins)).sum(axis=1).argmin()])


def _moment_matched_lognormal(n: int, mean: float, sd: float, rng: np.random.Generator) -> np.ndarray:
    """`n` lognormal draws whose sample mean and sd equal `mean` and `sd` (stratified scores, fitted sigma)."""
    if n == 1:
        return np.array([mean])
    from scipy.special import ndtri

    # one normal score per stratum keeps the tail present but not wild at n = 856
    quantiles = (rng.permutation(n) + rng.uniform(0.01, 0.99, n)) / n
    z = ndtri(quantiles)
    cv = sd / mean

    def sample_cv(sigma: float) -> float:
        x = np.exp(sigma * z)
        return float(x.std() / x.mean())

    lo, hi = 1e-4, 6.0  # cv grows monotonically with sigma
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if sample_cv(mid) < cv else (lo, mid)
    x = np.exp(0.5 * (lo + hi) * z)
    return x * (mean / x.mean())


def index_seed(table: TableSpec) -> int:
    """The seed of a table's index data: by source, so column slices and dim copies share it."""
    return stable_seed(table.source or table.name)


def synthesize_tables(
    num_tables: int = DLRM_2021_NUM_TABLES,
    seed: int = 0,
    row_scale: float = 1.0,
    batch_size: int = DLRM_2021_BATCH_SIZE,
    dims: Sequence[int] = DIMS,
    progress: bool = True,
) -> TableSet:
    """`num_tables` DLRM-like tables (pooling, rows x `row_scale`, dims, skew) with reuse bins measured at `batch_size`."""
    if num_tables < 1:
        raise ValueError(f"num_tables {num_tables} must be >= 1")
    if row_scale <= 0:
        raise ValueError(f"row_scale {row_scale} must be > 0")
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size} must be >= 1")
    rng = np.random.default_rng(seed)
    num_empty = round(DLRM_2021_EMPTY_FRACTION * num_tables) if num_tables > 1 else 0
    # the non-empty tables carry the whole mean and variance: rescale the targets to them
    nonzero_fraction = (num_tables - num_empty) / num_tables
    mean_nz = DLRM_2021_POOLING_MEAN / nonzero_fraction
    second_moment_nz = (DLRM_2021_POOLING_SD**2 + DLRM_2021_POOLING_MEAN**2) / nonzero_fraction
    pooling = np.zeros(num_tables)
    nonempty = np.sort(rng.permutation(num_tables)[num_empty:])
    pooling[nonempty] = _moment_matched_lognormal(
        len(nonempty), mean_nz, math.sqrt(max(second_moment_nz - mean_nz**2, 0.0)), rng
    )
    rows_full = _moment_matched_lognormal(num_tables, DLRM_2021_ROWS_MEAN, DLRM_2021_ROWS_SD, rng)
    rows = np.maximum(np.round(rows_full * row_scale), MIN_ROWS).astype(np.int64)
    table_dims = rng.choice(np.asarray(dims), size=num_tables)
    lookups = np.round(pooling * batch_size).astype(np.int64)
    alphas = assign_zipf_alphas(rows.tolist(), lookups.tolist(), seed=int(rng.integers(2**31)))

    tables = []
    for i in tqdm(range(num_tables), desc="synthesize tables", disable=not progress, leave=False):
        spec = TableSpec(
            name=f"t{i}",
            rows=int(rows[i]),
            dim=int(table_dims[i]),
            pooling_factor=round(float(pooling[i]), 4),
            zipf_alpha=float(alphas[i]),
        )
        _, indices = sample_batch(spec, batch_size, index_seed(spec))
        tables.append(spec.model_copy(update={"reuse_bins": tuple(reuse_histogram(indices).tolist())}))
    return TableSet(batch_size=batch_size, tables=tuple(tables))


def write_index_data(tableset: TableSet, path: str | Path, compress: bool = False, progress: bool = True) -> Path:
    """Sample one batch per table (`sample_batch`, seeded by `index_seed`) and write it in the DLRM dataset format."""
    batches = [
        sample_batch(t, tableset.batch_size, index_seed(t))
        for t in tqdm(tableset.tables, desc="index data", disable=not progress, leave=False)
    ]
    return write_dlrm_dataset(path, batches, compress=compress)
