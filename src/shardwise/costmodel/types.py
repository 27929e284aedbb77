"""The cost-model interface that search, simulation and evaluation program against."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from shardwise.workload import TableSpec


@runtime_checkable
class CostModel(Protocol):
    """Predicts what shards cost on one hardware kind, at the batch size it was profiled with.

    Compute cost is a per-table embedding summed over a shard's tables, then a head, so search can
    add a table to a device by adding one vector (`table_embeddings` + `compute_from_embeddings`).
    """

    hardware_kind: str
    batch_size: int

    def table_embeddings(self, tables: Sequence[TableSpec]) -> np.ndarray:
        """Per-table representations [T, H]; a shard's representation is the sum over its tables."""
        ...

    def compute_from_embeddings(self, summed: np.ndarray) -> np.ndarray:
        """[N, H] summed shard representations -> [N, 2] forward and backward ms."""
        ...

    def predict_compute(self, shards: Sequence[Sequence[TableSpec]]) -> np.ndarray:
        """[N, 2] forward and backward ms of N shards (an empty shard costs 0)."""
        ...

    def predict_comm(self, widths: np.ndarray, compute_ms: np.ndarray) -> np.ndarray:
        """[N, D] per-device output widths and compute ms of N layouts -> [N, D, 2] fwd/bwd all-to-all ms."""
        ...


@runtime_checkable
class KnowsItsTraining(Protocol):
    """A cost model that says where a task lies outside what it was trained on (`NeuralCostModel`)."""

    def outside_training(self, tables: Sequence[TableSpec], batch_size: int,
                         tables_per_device: Sequence[int] = ()) -> str | None:
        """One line naming what is outside and how far (None: all inside, or nothing recorded)."""
        ...
