"""Shards whose tables live in host memory, as fbgemm's UVM kernels run them (in TorchRec's words
"fused_uvm_caching": the table in host memory, a cache of `cache_load_factor` x its rows in HBM; "fused_uvm": no
cache), on CUDA only: fbgemm's CPU build has no UVM.

A caching table's speed is its cache's hit rate, so a shard is timed in steady training: its calls cycle through
`ROTATION_BATCHES` batches drawn from the same distribution (one batch repeated would hit every time after the
first), and before timing the cache is warmed on them until its hit rate over a cycle settles (`warm_cache`). Which
tables share a kernel follows fbgemm: one TBE over the shard's tables, each at its own location (HBM tables beside
cached ones), one cache for the kernel's cached tables (fbgemm sizes it by one load factor over all their rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from shardwise.errors import ShardwiseError
from shardwise.workload import TableSpec

from .batches import sample_shard_batch, table_seeds
from .run_settings import NEEDS_CUDA

#: distinct batches of one distribution a caching shard's calls cycle through (steady training: each call's ids are
#: new to the batch before); 8 at batch 65536 keep a few hundred MB of ids on the device at most
ROTATION_BATCHES = 8
#: the cache is warm when its hit rate over one cycle of the batches moves less than this from the cycle before
HIT_RATE_TOLERANCE = 0.005
#: the most cycles of warm-up (a cache that never settles is timed after these, its last hit rate recorded)
MAX_WARM_CYCLES = 16
#: positions in fbgemm's UVM cache stats (its UVMCacheStatsIndex: calls, requested ids, distinct ids, distinct misses)
UNIQUE_INDICES, UNIQUE_MISSES = 2, 3


class _CyclingKernel(Protocol):
    """What warming a cache needs of a shard's kernel (`tbe.ShardKernel`)."""

    @property
    def tbe(self) -> Any: ...

    @property
    def grad_output(self) -> torch.Tensor: ...

    @property
    def rotation(self) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]: ...

    def forward(self) -> torch.Tensor: ...


class CachingNeedsCudaError(ShardwiseError, ValueError):
    """A shard on a UVM kernel asked of a device that has none (a CPU)."""


def in_host_memory(tables: Sequence[TableSpec]) -> bool:
    """Whether any of a shard's tables runs a UVM kernel (`TableSpec.compute_kernel`)."""
    return any(t.in_host_memory for t in tables)


def require_uvm(tables: Sequence[TableSpec], device: torch.device) -> None:
    """Refuse in one line a shard with tables in host memory on a device other than CUDA."""
    if in_host_memory(tables) and device.type != "cuda":
        raise CachingNeedsCudaError(NEEDS_CUDA)


def shard_cache_load_factor(tables: Sequence[TableSpec]) -> float | None:
    """The load factor of the shard's one cache (None: no table cached); a shard whose cached tables ask for different
    ones is refused (fbgemm's kernel has one cache, sized by one load factor)."""
    factors = sorted({float(t.cache_load_factor) for t in tables if t.cache_load_factor is not None})
    if len(factors) > 1:
        raise ValueError(f"tables of one shard cached at load factors {factors}: one kernel has one cache (give them "
                         "one cache_load_factor, or place them in two shards)")
    return factors[0] if factors else None


def shard_kernel_name(tables: Sequence[TableSpec]) -> str:
    """The shard's kernel in a cost row's words: "fused_uvm_caching" where any table is cached, else "fused_uvm"
    where any is in host memory, else "fused"."""
    kernels = {t.compute_kernel for t in tables}
    if "fused_uvm_caching" in kernels:
        return "fused_uvm_caching"
    return "fused_uvm" if "fused_uvm" in kernels else "fused"


def locations(tables: Sequence[TableSpec]) -> list[Any]:
    """Each table's fbgemm `EmbeddingLocation` on CUDA: MANAGED_CACHING (cached), MANAGED (host memory, no cache),
    DEVICE (HBM)."""
    # fbgemm_gpu: heavy (registers its operators with torch), loaded by the kernel's builder before this runs
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation

    where = {"fused_uvm_caching": EmbeddingLocation.MANAGED_CACHING, "fused_uvm": EmbeddingLocation.MANAGED}
    return [where.get(t.compute_kernel or "fused", EmbeddingLocation.DEVICE) for t in tables]


def cache_arguments(tables: Sequence[TableSpec]) -> dict[str, Any]:
    """fbgemm's TBE arguments for the shard's one cache: its load factor, and the stats that say when it has settled
    (none for a shard without cached tables: in HBM, or in host memory with nothing to warm)."""
    load_factor = shard_cache_load_factor(tables)
    return {} if load_factor is None else {"cache_load_factor": load_factor, "gather_uvm_cache_stats": True}


def rotation_batches(tables: Sequence[TableSpec], batch_size: int, device: torch.device,
                     count: int = ROTATION_BATCHES) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """`count` batches of the shard's sampled distribution (each table's Zipf skew and pooling), each from its own
    seeds: the first is the batch every other shard of these tables is timed on."""
    base = table_seeds(tables)
    return tuple(sample_shard_batch(tables, batch_size, device, seeds=base if k == 0 else
                                    [(seed * 1_000_003 + k) & 0x7FFFFFFF for seed in base])
                 for k in range(count))


def _cycle_hit_rate(kernel: _CyclingKernel) -> float:
    """Run one cycle of the kernel's batches (forward and backward, as training does) and return its caches' hit rate
    over the distinct ids it looked up (fbgemm's UVM cache stats)."""
    tbe: Any = kernel.tbe
    tbe.reset_uvm_cache_stats()
    for _ in range(len(kernel.rotation)):
        kernel.forward().backward(kernel.grad_output)
    stats = tbe.get_uvm_cache_stats().tolist()
    unique = stats[UNIQUE_INDICES]
    return 1.0 - stats[UNIQUE_MISSES] / unique if unique else 1.0


def warm_cache(kernel: _CyclingKernel) -> float:
    """Warm the kernel's cache on its batches until its hit rate over a cycle settles (`HIT_RATE_TOLERANCE`, at most
    `MAX_WARM_CYCLES`), then stop gathering stats (timed calls pay no bookkeeping); the settled hit rate."""
    tbe: Any = kernel.tbe
    previous = _cycle_hit_rate(kernel)
    for _ in range(MAX_WARM_CYCLES - 1):
        rate = _cycle_hit_rate(kernel)
        settled = abs(rate - previous) < HIT_RATE_TOLERANCE
        previous = rate
        if settled:
            break
    tbe.gather_uvm_cache_stats = False
    return previous


def caching_variants(shard: Sequence[TableSpec], load_factors: Sequence[float]) -> list[list[TableSpec]]:
    """A sampled shard again on the UVM kernels: every table cached, then the first half cached beside the rest in
    HBM (as fbgemm groups them), at each load factor; then every table in host memory without a cache."""
    tables = list(shard)
    half = max(1, len(tables) // 2)
    variants = []
    for factor in load_factors:
        variants.append([t.on_kernel("fused_uvm_caching", factor) for t in tables])
        if len(tables) > 1:
            variants.append([t.on_kernel("fused_uvm_caching", factor) if i < half else t
                             for i, t in enumerate(tables)])
    variants.append([t.on_kernel("fused_uvm") for t in tables])
    return variants
