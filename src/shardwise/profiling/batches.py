"""One batch of a shard's inputs (TBE indices and offsets) built with tensor ops on the device that times it.

The host sampler (`shardwise.workload.sample_batch`: numpy, then a copy to the device) took most of a shard's time
at a production batch on a GPU (record `batch_build_cuda`). Here each table's whole batch is drawn with
a few in-place tensor ops on the device, from a torch generator seeded by its source table: bag lengths Poisson
(pooling factor), row ids the same continuous power law over ranks and the same hash permutation of ranks as
`zipf_row_sampler`, so the distribution (bag sizes, reuse bins, skew) is the host sampler's. A table's data depends
on its seed, its description and the batch alone, not on the rest of its shard: column slices of one source share
their data, as on the host. The same seed gives the same batch on every run of the same device type (CPU and CUDA
generators draw different numbers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from shardwise.workload import TableSpec, sample_batch, stable_seed

#: per source table: (lengths [B], indices [sum(lengths)]) int64 arrays (the DLRM dataset reader's output)
IndexData = Mapping[str, tuple[np.ndarray, np.ndarray]]

#: `zipf_row_sampler`'s permutation of ranks over rows (a bijection mod rows), kept identical
_PERMUTE_MUL, _PERMUTE_ADD = 2654435761, 12345


def table_seeds(tables: Sequence[TableSpec]) -> list[int]:
    """Each table's seed: by its source (column slices and copies share their index data), as on the host."""
    return [stable_seed(t.source or t.name) for t in tables]


def zipf_rows_(uniforms: torch.Tensor, rows: int, alpha: float, out: torch.Tensor) -> torch.Tensor:
    """Row ids into `out` (int64) from `uniforms` (float64, overwritten): P(rank r) ~ r^-alpha over `rows` rows,
    ranks permuted over the rows, as `zipf_row_sampler` draws them; in place, so a large batch allocates nothing."""
    if alpha <= 0.0:
        uniforms.mul_(rows)  # uniform access
    elif abs(alpha - 1.0) < 1e-6:
        uniforms.mul_(math.log(rows + 1.0)).exp_().sub_(1.0)
    else:
        a = 1.0 - alpha
        uniforms.mul_((rows + 1.0) ** a - 1.0).add_(1.0).pow_(1.0 / a).sub_(1.0)
    out.copy_(uniforms.clamp_max_(rows - 1))  # ranks >= 0: the cast's truncation is the floor
    return out.mul_(_PERMUTE_MUL).add_(_PERMUTE_ADD).remainder_(rows)


def sample_shard_batch(
    tables: Sequence[TableSpec], batch_size: int, device: torch.device, seeds: Sequence[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices, offsets) of one sampled batch over `tables`, table-major as TBE wants, built on `device`:
    lengths Poisson(pooling factor) and rows Zipf(alpha) over each table's rows, as `sample_batch` draws them."""
    seeds = table_seeds(tables) if seeds is None else list(seeds)
    if len(seeds) != len(tables):
        raise ValueError(f"seeds: {len(seeds)} for {len(tables)} tables")
    generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
    rates = torch.empty(batch_size, dtype=torch.float64, device=device)
    zero = torch.zeros(batch_size, dtype=torch.float64, device=device)
    lengths_int = torch.stack([
        torch.poisson(rates.fill_(t.pooling_factor), generator=g) if t.pooling_factor > 0 else zero
        for t, g in zip(tables, generators)
    ]).to(torch.int64)
    counts = lengths_int.sum(dim=1).tolist()  # the one host sync: the size of each table's ids
    uniforms = torch.empty(sum(counts), dtype=torch.float64, device=device)
    indices = torch.empty(sum(counts), dtype=torch.int64, device=device)
    start = 0
    for table, generator, count in zip(tables, generators, counts):
        end = start + count
        if count:
            zipf_rows_(uniforms[start:end].uniform_(generator=generator), table.rows, table.zipf_alpha or 0.0,
                       indices[start:end])
        start = end
    return indices, _offsets(lengths_int.reshape(-1))


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])


def fit_batch(lengths: torch.Tensor, indices: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Index data for exactly `batch_size` bags: the first bags of a larger batch, or a smaller one tiled."""
    if lengths.numel() == 0:
        raise ValueError("index data: lengths is empty")
    total = int(lengths.sum())
    if total != indices.numel():
        raise ValueError(f"index data: lengths sum to {total} but there are {indices.numel()} indices")
    if lengths.numel() >= batch_size:
        lengths = lengths[:batch_size]
        return lengths, indices[: int(lengths.sum())]
    reps = -(-batch_size // lengths.numel())
    lengths = lengths.repeat(reps)[:batch_size]
    return lengths, indices.repeat(reps)[: int(lengths.sum())]


def index_data_batch(
    tables: Sequence[TableSpec], batch_size: int, index_data: IndexData, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices, offsets) over `tables` from read index data (by source table), fitted to `batch_size` bags and
    folded into each table's rows (tables scaled down, or column slices of resampled tables, have fewer rows than
    the data's ids), built on `device`."""
    fitted = []
    for t in tables:
        source = t.source or t.name
        if source not in index_data:
            raise ValueError(f"table {t.name!r}: no index data for its source {source!r}")
        raw_lengths, raw_indices = index_data[source]
        fitted.append(fit_batch(torch.as_tensor(np.asarray(raw_lengths, dtype=np.int64)).to(device),
                                torch.as_tensor(np.asarray(raw_indices, dtype=np.int64)).to(device), batch_size))
    counts = [ids.numel() for _, ids in fitted]
    indices = torch.empty(sum(counts), dtype=torch.int64, device=device)
    start = 0
    for t, (_, ids), count in zip(tables, fitted, counts):
        torch.remainder(ids, t.rows, out=indices[start : start + count])  # folded straight into the shard's ids
        start += count
    return indices, _offsets(torch.cat([lengths for lengths, _ in fitted]))


def shard_batch(
    tables: Sequence[TableSpec], batch_size: int, device: torch.device, index_data: IndexData | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A shard's (indices, offsets) on `device`: from `index_data` when given, else sampled."""
    if index_data is not None:
        return index_data_batch(tables, batch_size, index_data, device)
    return sample_shard_batch(tables, batch_size, device)


def host_table_batch(
    table: TableSpec, batch_size: int, index_data: IndexData | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One table's batch (lengths, indices) built on the host, without `shard_batch`: numpy's
    sampler (`sample_batch`, seeded by the source table) or the read data, fitted and folded as `index_data_batch`
    does. The reference the device batches are compared with (tests, record `batch_build`)."""
    source = table.source or table.name
    if index_data is None:
        lengths, indices = sample_batch(table, batch_size, stable_seed(source))
    elif source in index_data:
        lengths, indices = index_data[source]
    else:
        raise ValueError(f"table {table.name!r}: no index data for its source {source!r}")
    fitted = fit_batch(torch.as_tensor(np.asarray(lengths, dtype=np.int64)),
                       torch.as_tensor(np.asarray(indices, dtype=np.int64)), batch_size)
    return fitted[0].numpy(), np.mod(fitted[1].numpy(), table.rows)


def host_shard_batch(
    tables: Sequence[TableSpec], batch_size: int, device: torch.device, index_data: IndexData | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`shard_batch` the host's way: each table built in numpy in turn, concatenated, then copied to `device`."""
    per_table = [host_table_batch(t, batch_size, index_data) for t in tables]
    lengths = np.concatenate([lengths for lengths, _ in per_table])
    indices = np.concatenate([idx for _, idx in per_table])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return torch.from_numpy(indices).to(device), torch.from_numpy(offsets).to(device)


def split_batch(
    indices: torch.Tensor, offsets: torch.Tensor, num_tables: int
) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Per table, its (lengths [B], indices) as host arrays: a table-major batch taken apart."""
    lengths = torch.diff(offsets).cpu().numpy()
    if num_tables < 1 or lengths.size % num_tables:
        raise ValueError(f"{lengths.size} bags do not split into {num_tables} tables")
    per_table = lengths.reshape(num_tables, -1)
    ends = np.cumsum(per_table.sum(axis=1))
    flat = indices.cpu().numpy()
    return tuple((per_table[t], flat[ends[t] - per_table[t].sum() : ends[t]]) for t in range(num_tables))
