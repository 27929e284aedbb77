"""What is sharded: an embedding table's description and its access skew."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from .documents import FiniteFloat, StrictInt

#: Upper edges of the access-count bins: (0,1], (1,2], (2,4], ..., (16384,32768], then >32768.
REUSE_BIN_EDGES: tuple[int, ...] = tuple(2**k for k in range(16))
NUM_REUSE_BINS = len(REUSE_BIN_EDGES) + 1  # 17
#: fbgemm's TBE kernels need embedding dims that are a multiple of 4.
DIM_ALIGNMENT = 4
#: Bounds far above any production table (the DLRM 2021 dataset: 4.1M rows and a pooling factor of 15.8 on
#: average) that keep every byte count an int64 and a sampled batch of index data allocatable.
MAX_ROWS = 2**40
MAX_DIM = 2**16
MAX_POOLING_FACTOR = 2.0**16
MAX_NAME_LENGTH = 256
#: how a table may be sharded, in TorchRec's words
ShardingType = Literal["table_wise", "column_wise", "row_wise", "data_parallel"]
#: where a table's rows live and how its kernel reaches them, in TorchRec's words: "fused" all in HBM,
#: "fused_uvm_caching" in host memory with a cache of hot rows in HBM, "fused_uvm" in host memory, no cache
ComputeKernel = Literal["fused", "fused_uvm_caching", "fused_uvm"]
#: the kernels that keep a table's weights in host memory (fbgemm's UVM: EmbeddingLocation.MANAGED[_CACHING])
HOST_KERNELS: tuple[ComputeKernel, ...] = ("fused_uvm_caching", "fused_uvm")
#: the plan-space and placement fields, left out of a table's JSON when unset so that documents and config hashes
#: read as before
PLAN_SPACE_FIELDS = ("sharding_types", "min_partition", "compute_kernels", "compute_kernel", "cache_load_factor")


class TableSpec(BaseModel):
    """One embedding table (or a column slice of one): size, lookups per sample, access skew."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH)
    rows: StrictInt = Field(ge=1, le=MAX_ROWS)
    dim: StrictInt = Field(ge=DIM_ALIGNMENT, le=MAX_DIM)
    pooling_factor: FiniteFloat = Field(ge=0.0, le=MAX_POOLING_FACTOR)
    zipf_alpha: FiniteFloat | None = Field(default=None, ge=0.0)
    reuse_bins: tuple[FiniteFloat, ...] | None = None
    #: the table whose index data this one uses (column slices and augmented copies share it)
    source: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH)
    #: the sharding types a plan may give this table (None: any that shardwise plans); a whole table on one device
    #: counts as table-wise and as column-wise with one shard
    sharding_types: tuple[ShardingType, ...] | None = None
    #: the narrowest column slice a plan may cut (TorchRec's `ParameterConstraints.min_partition`)
    min_partition: StrictInt | None = Field(default=None, ge=DIM_ALIGNMENT, le=MAX_DIM)
    #: the kernels a plan may give this table (None: "fused" only, all in HBM)
    compute_kernels: tuple[ComputeKernel, ...] | None = None
    #: the kernel this table (or slice) runs in a plan, and its cache's share of its rows: set on the tables a plan
    #: places in host memory (`Plan.kernels`), None on a task's tables and on "fused" ones
    compute_kernel: ComputeKernel | None = None
    cache_load_factor: FiniteFloat | None = Field(default=None, gt=0.0, le=1.0)

    @field_validator("name", "source")
    @classmethod
    def _printable(cls, name: str | None) -> str | None:
        # a name ends up in one-line messages, reports and file names: no newlines or other control characters
        if name is not None and not name.isprintable():
            raise ValueError(f"{name!r} holds control characters (a table name is printable text)")
        return name

    @field_validator("dim")
    @classmethod
    def _dim_aligned(cls, dim: int) -> int:
        if dim % DIM_ALIGNMENT:
            raise ValueError(f"dim {dim} is not a multiple of {DIM_ALIGNMENT} (fbgemm needs it)")
        return dim

    @field_validator("reuse_bins")
    @classmethod
    def _bins_shape(cls, bins: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if bins is None:
            return None
        if len(bins) != NUM_REUSE_BINS:
            raise ValueError(f"reuse_bins has {len(bins)} values, expected {NUM_REUSE_BINS}")
        if any(not 0.0 <= b <= 1.0 for b in bins):
            raise ValueError("reuse_bins are fractions of the accessed rows: each in [0, 1]")
        return tuple(float(b) for b in bins)

    @field_validator("sharding_types")
    @classmethod
    def _plan_space(cls, types: tuple[ShardingType, ...] | None) -> tuple[ShardingType, ...] | None:
        if types is None:
            return None
        if not types:
            raise ValueError("sharding_types is empty: list at least 'table_wise' or 'column_wise', or leave it out")
        if len(set(types)) != len(types):
            raise ValueError(f"sharding_types {list(types)} lists a type more than once")
        if "table_wise" not in types and "column_wise" not in types:
            # the search places whole tables and column slices; the caller places row-wise/data-parallel-only ones
            raise ValueError(f"sharding_types {list(types)} has neither 'table_wise' nor 'column_wise' (a table "
                             "restricted to row_wise or data_parallel is placed outside the search)")
        return types

    @field_validator("compute_kernels")
    @classmethod
    def _kernel_space(cls, kernels: tuple[ComputeKernel, ...] | None) -> tuple[ComputeKernel, ...] | None:
        if kernels is not None and not kernels:
            raise ValueError("compute_kernels is empty: list at least 'fused', or leave it out")
        if kernels is not None and len(set(kernels)) != len(kernels):
            raise ValueError(f"compute_kernels {list(kernels)} lists a kernel more than once")
        return kernels

    @model_validator(mode="after")
    def _cache_with_its_kernel(self) -> TableSpec:
        caching = self.compute_kernel == "fused_uvm_caching"
        if caching and self.cache_load_factor is None:
            raise ValueError("compute_kernel 'fused_uvm_caching' needs a cache_load_factor in (0, 1]")
        if not caching and self.cache_load_factor is not None:
            raise ValueError(f"cache_load_factor {self.cache_load_factor} is for compute_kernel 'fused_uvm_caching' "
                             f"only, not {self.compute_kernel or 'fused'!r}")
        return self

    @model_serializer(mode="wrap")
    def _without_unset_plan_space(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        doc: dict[str, Any] = handler(self)
        for key in PLAN_SPACE_FIELDS:
            if key in doc and doc[key] is None:
                del doc[key]
        return doc

    def allows(self, sharding_type: ShardingType) -> bool:
        """Whether the table's plan space lists `sharding_type` (every type, where it sets none)."""
        return self.sharding_types is None or sharding_type in self.sharding_types

    def allows_kernel(self, kernel: ComputeKernel) -> bool:
        """Whether the table's plan space lists `kernel` ("fused" only, where it sets none)."""
        return kernel in (self.compute_kernels or ("fused",))

    @property
    def in_host_memory(self) -> bool:
        """Whether this table's weights live in host memory (a UVM kernel), its HBM holding at most a cache."""
        return self.compute_kernel in HOST_KERNELS

    def on_kernel(self, kernel: ComputeKernel, cache_load_factor: float | None = None) -> TableSpec:
        """The same table run by `kernel` ("fused": back in HBM), with its cache's share of rows for
        "fused_uvm_caching"."""
        if kernel == "fused":
            return self.model_copy(update={"compute_kernel": None, "cache_load_factor": None})
        return TableSpec.model_validate({**self.model_dump(), "compute_kernel": kernel,
                                         "cache_load_factor": cache_load_factor})

    def max_column_pieces(self, num_devices: int) -> int:
        """The most equal column slices (a power of two up to `num_devices`, each a multiple of 4 columns and at
        least `min_partition` wide) the table may be split into; 1 where column_wise is not allowed."""
        if not self.allows("column_wise"):
            return 1
        narrowest = max(self.min_partition or DIM_ALIGNMENT, DIM_ALIGNMENT)
        pieces = 1
        while (2 * pieces <= num_devices and self.dim % (2 * pieces) == 0
               and (self.dim // (2 * pieces)) % DIM_ALIGNMENT == 0 and self.dim // (2 * pieces) >= narrowest):
            pieces *= 2
        return pieces

    def widest_slice_dim(self, num_devices: int) -> int:
        """The columns of the widest slice in the table's narrowest allowed split over `num_devices` devices, slices
        of any 4-aligned width (its dim where column_wise is not allowed): what no column split goes below."""
        narrowest = -(-max(self.min_partition or DIM_ALIGNMENT, DIM_ALIGNMENT) // DIM_ALIGNMENT) * DIM_ALIGNMENT
        pieces = max(1, min(num_devices, self.dim // narrowest)) if self.allows("column_wise") else 1
        widest = -(-self.dim // pieces)
        return widest + -widest % DIM_ALIGNMENT

    def plan_space(self) -> str:
        """The table's plan space in a message's words: `sharding_types [...], min_partition 32`."""
        types = "any sharding type" if self.sharding_types is None else f"sharding_types {list(self.sharding_types)}"
        kernels = f", compute_kernels {list(self.compute_kernels)}" if self.compute_kernels is not None else ""
        return types + (f", min_partition {self.min_partition}" if self.min_partition is not None else "") + kernels

    def with_dim(self, dim: int, name: str | None = None) -> TableSpec:
        """The same table at another width (a column slice or an augmented copy)."""
        return self.model_copy(
            update={"dim": dim, "name": name or self.name, "source": self.source or self.name}
        )

    def row_block(self, rank: int, num_devices: int) -> TableSpec | None:
        """Rank `rank`'s block of this table split row-wise over `num_devices` (`row_wise_rows`), as a table of its own
        named `t[rows lo:hi]`: its rows, and the lookups that fall in them (ids spread over the rows, as the hashed
        hot rows of `zipf_row_sampler` are: pooling factor x block rows / rows); None where the rank holds no rows."""
        # row_wise_rows' block for this rank alone: every rank's sizes for each rank's block is quadratic in ranks
        block = -(-self.rows // num_devices)
        lo = min(rank * block, self.rows)
        rows = min(block, self.rows - lo)
        if rows == 0:
            return None
        return self.model_copy(update={"name": f"{self.name}{ROW_BLOCK_MARK}{lo}:{lo + rows}]", "rows": rows,
                                       "pooling_factor": self.pooling_factor * rows / self.rows,
                                       "source": self.source or self.name})

    @property
    def is_row_block(self) -> bool:
        """Whether this is one device's block of a row-wise table (`row_block`)."""
        return ROW_BLOCK_MARK in self.name

    def reuse_features(self, batch_size: int) -> np.ndarray:
        """The 17 reuse-bin fractions: given ones, else derived from `zipf_alpha` (uniform when neither)."""
        if self.reuse_bins is not None:
            return np.asarray(self.reuse_bins, dtype=np.float64)
        return np.array(
            derive_reuse_bins(self.rows, self.pooling_factor, batch_size, self.zipf_alpha or 0.0)
        )


#: what a row block's name carries after its table's (`TableSpec.row_block`: `t[rows lo:hi]`)
ROW_BLOCK_MARK = "[rows "


def row_wise_rows(rows: int, world_size: int) -> list[int]:
    """Each rank's rows under TorchRec's row-wise sharding: blocks of ceil(rows / ranks), the rest on the last
    rank that gets any (10 rows on 4 ranks: 3, 3, 3, 1)."""
    block = -(-rows // world_size)
    return [max(0, min(block, rows - rank * block)) for rank in range(world_size)]


def row_blocks(tables: Sequence[TableSpec], num_devices: int) -> list[list[TableSpec]]:
    """Per device, its row blocks of the row-wise `tables` (a device past a small table's last row holds none)."""
    blocks: list[list[TableSpec]] = [[] for _ in range(num_devices)]
    for table in tables:
        for rank in range(num_devices):
            block = table.row_block(rank, num_devices)
            if block is not None:
                blocks[rank].append(block)
    return blocks


def reuse_histogram(indices: np.ndarray) -> np.ndarray:
    """Fraction of the accessed unique rows whose access count falls in each of the 17 bins."""
    if indices.size == 0:
        return np.zeros(NUM_REUSE_BINS)
    _, counts = np.unique(indices, return_counts=True)
    # bin k holds counts in (2^(k-1), 2^k]; bin 0 holds count 1; the last bin holds > 32768
    bins = np.ceil(np.log2(counts)).astype(np.int64)
    bins = np.clip(bins, 0, NUM_REUSE_BINS - 1)
    hist = np.bincount(bins, minlength=NUM_REUSE_BINS).astype(np.float64)
    return hist / hist.sum()


def zipf_row_sampler(rows: int, alpha: float, rng: np.random.Generator, size: int) -> np.ndarray:
    """Row ids drawn with P(rank r) ~ r^-alpha over `rows` rows, rank order shuffled by a fixed hash."""
    if size == 0:
        return np.zeros(0, dtype=np.int64)
    if alpha <= 0.0:
        return rng.integers(0, rows, size=size, dtype=np.int64)
    # inverse-CDF sampling on the continuous approximation of the truncated power law
    u = rng.random(size)
    if abs(alpha - 1.0) < 1e-6:
        ranks = np.exp(u * math.log(rows + 1.0))
    else:
        a = 1.0 - alpha
        ranks = (1.0 + u * ((rows + 1.0) ** a - 1.0)) ** (1.0 / a)
    ranks = np.clip(ranks.astype(np.int64) - 1, 0, rows - 1)
    # spread hot rows across the table (real hot ids are not the lowest ids); a bijection mod rows
    return (ranks * 2654435761 + 12345) % rows if rows > 1 else ranks


def sample_lengths(pooling_factor: float, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """Per-sample bag sizes with mean `pooling_factor` (Poisson; empty bags happen as in real data)."""
    if pooling_factor <= 0:
        return np.zeros(batch_size, dtype=np.int64)
    return rng.poisson(pooling_factor, size=batch_size).astype(np.int64)


@lru_cache(maxsize=65536)
def derive_reuse_bins(
    rows: int, pooling_factor: float, batch_size: int, zipf_alpha: float, seed: int = 0
) -> tuple[float, ...]:
    """Reuse bins expected for a Zipf(alpha) table, from one sampled batch (seeded, so deterministic)."""
    rng = np.random.default_rng(seed)
    lookups = int(round(pooling_factor * batch_size))
    return tuple(reuse_histogram(zipf_row_sampler(rows, zipf_alpha, rng, lookups)).tolist())


def sample_batch(table: TableSpec, batch_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One batch of index data for `table`: per-sample bag `lengths` [B] and row `indices` [sum(lengths)].

    Seed it by the source table (not the column slice) so that column slices share index data."""
    rng = np.random.default_rng(seed)
    lengths = sample_lengths(table.pooling_factor, batch_size, rng)
    indices = zipf_row_sampler(table.rows, table.zipf_alpha or 0.0, rng, int(lengths.sum()))
    return lengths, indices


def stable_seed(*parts: object) -> int:
    """A seed derived from names and numbers, equal across processes and runs (unlike `hash`)."""
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


class TableCollection(BaseModel):
    """Base of the documents that hold uniquely named tables (tasks, table sets); each declares `tables`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    tables: tuple[TableSpec, ...]

    @field_validator("tables")
    @classmethod
    def _unique_names(cls, tables: tuple[TableSpec, ...]) -> tuple[TableSpec, ...]:
        seen: set[str] = set()
        for t in tables:
            if t.name in seen:
                raise ValueError(f"table name {t.name!r} appears more than once (names must be unique)")
            seen.add(t.name)
        return tables

    def table(self, name: str) -> TableSpec:
        """The table called `name`."""
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"no table {name!r} in the {type(self).__name__}")

    def to_json(self) -> dict[str, Any]:
        """The JSON document (versioned by its `format` field): header fields first, then the tables."""
        doc = self.model_dump(mode="json", exclude_none=True)
        return {**{k: v for k, v in doc.items() if k != "tables"}, "tables": doc["tables"]}
