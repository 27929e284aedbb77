"""What row-wise tables cost each device: the kernel on its row blocks, priced by the compute model, plus the
collectives of TorchRec's row-wise sharding, priced by a latency + bandwidth line fitted to measured reduce-scatters.

A row-wise table is split by rows over every device, blocks of ceil(rows / devices) (`TableSpec.row_block`). Each
device runs one kernel over its blocks of all row-wise tables for the whole batch B: a block holds rows / devices of
the rows and gets that share of the lookups (the ids of hot rows are spread over the table), so it is priced as a
table of the block's rows with pooling factor x block rows / rows at B. Its pooled output [B, dim] is a partial sum:
TorchRec reduce-scatters the row-wise tables' outputs together (B x their dims x 4 bytes, each device keeping its
B / devices samples' sums) and all-gathers their gradients in backward, the same bytes the other way; before the
kernel, each device sends every other the ids of its samples that fall in that device's rows (its B / devices
samples' lookups, 8 bytes an id). Each is priced by its own latency + bandwidth line, fitted to that collective
measured beside the all-to-alls (`shardwise profile`), the same on every device; a model profiled without
all-gathers and all-to-alls prices them with the reduce-scatter's line (a poor fit for them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardwise.workload import TableSpec, local_batch, row_blocks

from .data_parallel import AllReduceCost
from .types import CostModel

#: fp32 pooled outputs (and their gradients) reduce-scattered (and all-gathered) per element
OUTPUT_BYTES_PER_ELEMENT = 4
#: int64 ids redistributed to the devices that hold their rows
ID_BYTES = 8


def output_bytes(tables: Sequence[TableSpec], batch_size: int) -> int:
    """Bytes each device reduce-scatters in forward (and all-gathers in backward): the row-wise tables' partial
    pooled outputs for the whole batch, B x their dims x 4."""
    return batch_size * sum(t.dim for t in tables) * OUTPUT_BYTES_PER_ELEMENT


def ids_bytes(tables: Sequence[TableSpec], batch_size: int, num_devices: int) -> int:
    """Bytes each device sends in the ids' redistribution: its ceil(B / devices) samples' lookups of the row-wise
    tables, 8 bytes an id."""
    return int(round(local_batch(batch_size, num_devices) * sum(t.pooling_factor for t in tables) * ID_BYTES))


def reduce_scatter_of(cost_model: CostModel) -> AllReduceCost | None:
    """The model's fitted reduce-scatter (None: it has none, so row-wise tables cannot be priced with it)."""
    return _line_of(cost_model, "reduce_scatter")


def _line_of(cost_model: CostModel, collective: str) -> AllReduceCost | None:
    cost = getattr(cost_model, collective, None)
    return cost if isinstance(cost, AllReduceCost) and cost.collective == collective else None


@dataclass(frozen=True, eq=False)
class RowWiseCost:
    """What row-wise tables add to each device: the kernel on its row blocks, and the collectives (the same on
    every device: the outputs' reduce-scatter, their gradients' all-gather, the ids' redistribution)."""

    fwd_ms: np.ndarray
    bwd_ms: np.ndarray
    reduce_scatter_ms: float
    all_gather_ms: float
    ids_ms: float

    @property
    def comm_ms(self) -> float:
        """The collectives' ms, on every device."""
        return self.reduce_scatter_ms + self.all_gather_ms + self.ids_ms

    @property
    def total_ms(self) -> np.ndarray:
        """Kernel plus collectives ms per device."""
        return self.fwd_ms + self.bwd_ms + self.comm_ms


def row_wise_cost(cost_model: CostModel, tables: Sequence[TableSpec], num_devices: int,
                  batch_size: int) -> RowWiseCost:
    """Each device's cost of the row-wise `tables` at `batch_size` (one kernel over its blocks, the collectives of
    all of them together); ValueError when the model has no reduce-scatter to price them with."""
    if not tables:
        zeros = np.zeros(num_devices)
        return RowWiseCost(zeros, zeros, 0.0, 0.0, 0.0)
    line = reduce_scatter_of(cost_model)
    if line is None:
        raise ValueError(f"cost model for {cost_model.hardware_kind!r} has no measured reduce-scatter: it cannot price "
                         "row-wise tables (profile with --comm-layouts and pretrain again)")
    gather = _line_of(cost_model, "all_gather") or line
    exchange = _line_of(cost_model, "all_to_all") or line
    kernel = np.asarray(cost_model.predict_compute(row_blocks(tables, num_devices)), dtype=np.float64)
    out = output_bytes(tables, batch_size)
    return RowWiseCost(kernel[:, 0], kernel[:, 1], float(line.predict_ms(out, num_devices)),
                       float(gather.predict_ms(out, num_devices)),
                       float(exchange.predict_ms(ids_bytes(tables, batch_size, num_devices), num_devices)))
