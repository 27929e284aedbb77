"""A cost model double that has measured fbgemm's UVM kernels: a table in host memory pays, per lookup that misses
its cache, a host read ten times an HBM lookup (the cost model is not the code under test here; the search is)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from search_doubles import FeatureCostModel

from shardwise.workload import TableSpec


def miss_rate(table: TableSpec) -> float:
    """The share of `table`'s lookups that miss its HBM cache: all on "fused_uvm", none in HBM; on a cache of a
    share f of the rows, (1 - f) for uniform access, less the more skewed (Zipf alpha) the lookups."""
    if table.compute_kernel == "fused_uvm":
        return 1.0
    if table.compute_kernel != "fused_uvm_caching":
        return 0.0
    return float((1.0 - (table.cache_load_factor or 0.0)) ** (1.0 + 3.0 * (table.zipf_alpha or 0.0)))


class CachingCostModel(FeatureCostModel):
    """FeatureCostModel plus a fourth channel: lookups that miss the cache, at 1/2e3 ms each (HBM's: 1/2e4)."""

    hardware_kind = "test-double-uvm"
    compute_kernels = ("fused", "fused_uvm_caching", "fused_uvm")

    def table_embeddings(self, tables: Sequence[TableSpec]) -> np.ndarray:
        base = super().table_embeddings(tables)
        missed = np.array([t.dim * t.pooling_factor * miss_rate(t) for t in tables]).reshape(-1, 1)
        return np.concatenate([base, missed], axis=1)

    def compute_from_embeddings(self, summed: np.ndarray) -> np.ndarray:
        summed = np.asarray(summed, dtype=np.float64)
        ms = super().compute_from_embeddings(summed[:, :3])
        return ms + np.stack([summed[:, 3] / 2e3, 1.5 * summed[:, 3] / 2e3], axis=1)

    def predict_compute(self, shards: Sequence[Sequence[TableSpec]]) -> np.ndarray:
        summed = np.stack([self.table_embeddings(s).sum(axis=0) for s in shards]) if shards else np.zeros((0, 4))
        return self.compute_from_embeddings(summed)
