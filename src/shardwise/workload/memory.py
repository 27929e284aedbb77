"""Memory accounting: weights, optimizer state and the kernel's activation buffers, in bytes, in HBM and (for
tables a UVM kernel keeps in host memory) in host memory."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

from .tables import TableSpec

Optimizer = Literal["sgd", "rowwise_adagrad", "adam"]
WeightsPrecision = Literal["fp32", "fp16"]

BYTES_PER_ELEMENT: dict[str, int] = {"fp32": 4, "fp16": 2}
#: fp32 optimizer state per table: (values per row, values per element)
OPTIMIZER_STATE: dict[str, tuple[int, int]] = {
    "sgd": (0, 0),
    "rowwise_adagrad": (1, 0),  # one momentum value per row
    "adam": (0, 2),  # first and second moments per element
}


def table_memory_bytes(
    rows: int, dim: int, optimizer: Optimizer = "rowwise_adagrad", weights_precision: WeightsPrecision = "fp32"
) -> int:
    """Weights plus optimizer state of a `rows` x `dim` table (or column slice)."""
    if optimizer not in OPTIMIZER_STATE:
        raise ValueError(f"optimizer {optimizer!r} is not one of {sorted(OPTIMIZER_STATE)}")
    if weights_precision not in BYTES_PER_ELEMENT:
        raise ValueError(f"weights_precision {weights_precision!r} is not one of {sorted(BYTES_PER_ELEMENT)}")
    per_row, per_element = OPTIMIZER_STATE[optimizer]
    weights = rows * dim * BYTES_PER_ELEMENT[weights_precision]
    return weights + 4 * rows * (per_row + per_element * dim)


#: fbgemm's cache bookkeeping for a UVM-caching table, as TorchRec's storage estimator counts it: per table row an
#: int32 cache_index_table_map entry, per cache slot an int64 lxu_cache_state and an int64 lru_state
CACHE_INDEX_BYTES_PER_ROW = 4
CACHE_STATE_BYTES_PER_SLOT = 16


def table_hbm_bytes(
    table: TableSpec, optimizer: Optimizer = "rowwise_adagrad", weights_precision: WeightsPrecision = "fp32"
) -> int:
    """What `table` (or a slice) keeps in HBM, buffers aside: all its state on "fused"; on "fused_uvm_caching" its
    cache (cache_load_factor of its state, as TorchRec's estimator counts it) and the cache's bookkeeping; nothing on
    "fused_uvm"."""
    state = table_memory_bytes(table.rows, table.dim, optimizer, weights_precision)
    if table.compute_kernel == "fused_uvm":
        return 0
    if table.compute_kernel == "fused_uvm_caching":
        load_factor = float(table.cache_load_factor or 0.0)
        bookkeeping = math.ceil(table.rows * (CACHE_INDEX_BYTES_PER_ROW + load_factor * CACHE_STATE_BYTES_PER_SLOT))
        return round(state * load_factor) + bookkeeping
    return state


def table_host_bytes(
    table: TableSpec, optimizer: Optimizer = "rowwise_adagrad", weights_precision: WeightsPrecision = "fp32"
) -> int:
    """What `table` (or a slice) keeps in host memory: its weights and optimizer state on a UVM kernel, else 0."""
    if not table.in_host_memory:
        return 0
    return table_memory_bytes(table.rows, table.dim, optimizer, weights_precision)


def activation_buffer_bytes(batch_size: int, total_dim: int) -> int:
    """The kernel's pooled output and its gradient for one device (fp32, full batch)."""
    return 2 * 4 * batch_size * total_dim


def shard_memory_bytes(
    tables: Iterable[TableSpec],
    batch_size: int,
    optimizer: Optimizer = "rowwise_adagrad",
    weights_precision: WeightsPrecision = "fp32",
) -> int:
    """Everything one device holds in HBM for these tables (or column slices): state (or a UVM table's cache) plus
    kernel buffers."""
    tables = list(tables)
    state = sum(table_hbm_bytes(t, optimizer, weights_precision) for t in tables)
    return state + activation_buffer_bytes(batch_size, sum(t.dim for t in tables)) if tables else 0


def shard_host_memory_bytes(
    tables: Iterable[TableSpec], optimizer: Optimizer = "rowwise_adagrad", weights_precision: WeightsPrecision = "fp32"
) -> int:
    """What one device holds in host memory for these tables: the state of those on a UVM kernel."""
    return sum(table_host_bytes(t, optimizer, weights_precision) for t in tables)


def local_batch(batch_size: int, num_devices: int) -> int:
    """The samples each of `num_devices` devices looks up of a `batch_size` batch as a data-parallel table (and sends
    as a row-wise table's ids): ceil(B / D), the most any device gets."""
    return -(-int(batch_size) // max(int(num_devices), 1))


def data_parallel_memory_bytes(
    tables: Iterable[TableSpec],
    local_batch_size: int,
    optimizer: Optimizer = "rowwise_adagrad",
    weights_precision: WeightsPrecision = "fp32",
) -> int:
    """What every device holds for data-parallel tables: a replica of each with its optimizer state, its dense fp32
    gradient (what DDP all-reduces), and the kernel's buffers for the device's own `local_batch_size` samples."""
    tables = list(tables)
    if not tables:
        return 0
    state = sum(table_memory_bytes(t.rows, t.dim, optimizer, weights_precision) + 4 * t.rows * t.dim for t in tables)
    return state + activation_buffer_bytes(local_batch_size, sum(t.dim for t in tables))
