"""Memory accounting: weights, optimizer state and the kernel's activation buffers, in bytes."""

from __future__ import annotations

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


def activation_buffer_bytes(batch_size: int, total_dim: int) -> int:
    """The kernel's pooled output and its gradient for one device (fp32, full batch)."""
    return 2 * 4 * batch_size * total_dim


def shard_memory_bytes(
    tables: Iterable[TableSpec],
    batch_size: int,
    optimizer: Optimizer = "rowwise_adagrad",
    weights_precision: WeightsPrecision = "fp32",
) -> int:
    """Everything one device holds for these tables (or column slices): state plus kernel buffers."""
    tables = list(tables)
    state = sum(table_memory_bytes(t.rows, t.dim, optimizer, weights_precision) for t in tables)
    return state + activation_buffer_bytes(batch_size, sum(t.dim for t in tables)) if tables else 0


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
