"""Predicted cost of a plan: per-device forward, backward and all-to-all ms from a cost model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardwise.costmodel.data_parallel import data_parallel_cost
from shardwise.costmodel.row_wise import row_wise_cost
from shardwise.costmodel.types import CostModel
from shardwise.workload import ShardingTask, TableSpec

from .plan import Plan, PlanError, data_parallel_specs, device_specs, row_wise_specs

ShardKey = tuple[tuple[str, int, int, float, str, float], ...]


@dataclass(frozen=True, eq=False)
class PlanCost:
    """Predicted per-device costs of one plan, in ms per training iteration; the plan waits for the slowest."""

    fwd_ms: np.ndarray
    bwd_ms: np.ndarray
    comm_fwd_ms: np.ndarray
    comm_bwd_ms: np.ndarray
    #: the data-parallel tables' gradient all-reduce per device (zeros where a plan has none); their kernel on the
    #: local batch is in fwd_ms and bwd_ms
    all_reduce_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: the row-wise tables' collectives per device (outputs' reduce-scatter, gradients' all-gather, ids'
    #: redistribution; zeros where a plan has none); their kernel on the device's row blocks is in fwd_ms and bwd_ms
    row_wise_comm_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def compute_ms(self) -> np.ndarray:
        """Forward plus backward kernel time per device."""
        return self.fwd_ms + self.bwd_ms

    @property
    def total_ms(self) -> np.ndarray:
        """Compute plus communication per device."""
        total = self.fwd_ms + self.bwd_ms + self.comm_fwd_ms + self.comm_bwd_ms
        for extra in (self.all_reduce_ms, self.row_wise_comm_ms):
            if extra.size:
                total = total + extra
        return total

    @property
    def max_cost_ms(self) -> float:
        """The plan's cost: the slowest device."""
        return float(self.total_ms.max())

    @property
    def imbalance(self) -> float:
        """Slowest device over the mean device (1.0 is perfectly balanced)."""
        mean = float(self.total_ms.mean())
        return self.max_cost_ms / mean if mean > 0 else 1.0

    def to_json(self) -> dict[str, Any]:
        """Per-device lists and the summary, rounded to microseconds."""

        def ms(a: np.ndarray) -> list[float]:
            return [round(float(x), 3) for x in a]

        return {
            "fwd_ms": ms(self.fwd_ms),
            "bwd_ms": ms(self.bwd_ms),
            "comm_fwd_ms": ms(self.comm_fwd_ms),
            "comm_bwd_ms": ms(self.comm_bwd_ms),
            **({"all_reduce_ms": ms(self.all_reduce_ms)} if self.all_reduce_ms.size else {}),
            **({"row_wise_comm_ms": ms(self.row_wise_comm_ms)} if self.row_wise_comm_ms.size else {}),
            "total_ms": ms(self.total_ms),
            "max_cost_ms": round(self.max_cost_ms, 3),
            "imbalance": round(self.imbalance, 4),
        }


def shard_key(tables: Sequence[TableSpec]) -> ShardKey:
    """Cache key of a shard: its tables (slices by name and width, on their kernels), order-free."""
    return tuple(sorted((t.name, t.dim, t.rows, t.pooling_factor, t.compute_kernel or "fused",
                         t.cache_load_factor or 0.0) for t in tables))


class ShardCostCache:
    """Compute-cost predictions of shards, batched over cache misses and memoised by the shard's tables.

    Valid for one cost model and one task (table names are the identity)."""

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        self._compute_ms: dict[ShardKey, np.ndarray] = {}
        self.hits = 0
        self.misses = 0

    def compute_ms(self, shards: Sequence[Sequence[TableSpec]]) -> np.ndarray:
        """[N, 2] forward and backward ms of N shards, one cost-model call for all misses."""
        keys = [shard_key(s) for s in shards]
        missing: dict[ShardKey, Sequence[TableSpec]] = {}
        for key, shard in zip(keys, shards):
            if key not in self._compute_ms and key not in missing:
                missing[key] = shard
        self.misses += len(missing)
        self.hits += len(keys) - len(missing)
        if missing:
            # empty shards cost nothing; the model is only asked about the rest
            to_ask = [(k, s) for k, s in missing.items() if s]
            for k, s in missing.items():
                if not s:
                    self._compute_ms[k] = np.zeros(2)
            if to_ask:
                predicted = np.asarray(self.cost_model.predict_compute([s for _, s in to_ask]), dtype=np.float64)
                for (k, _), row in zip(to_ask, predicted):
                    self._compute_ms[k] = row
        if not keys:
            return np.zeros((0, 2))
        return np.stack([self._compute_ms[k] for k in keys])


def predict_comm_ms(cost_model: CostModel, widths: np.ndarray, compute_ms: np.ndarray) -> np.ndarray:
    """[N, D, 2] all-to-all ms of N layouts; zeros for a model trained without communication data."""
    if not getattr(cost_model, "has_comm", True):
        return np.zeros((*np.shape(widths), 2))
    return np.asarray(cost_model.predict_comm(widths, compute_ms), dtype=np.float64)


def predict_comm_after_ms(cost_model: CostModel, widths: np.ndarray, compute_ms: np.ndarray, devices: np.ndarray,
                          added_width: np.ndarray, new_compute_ms: np.ndarray,
                          layout_of: np.ndarray | None = None) -> np.ndarray:
    """[N, K, 2] all-to-all ms of candidate device `devices[n, j]` of layout n once it takes `added_width[n]` more
    columns and computes for `new_compute_ms[n, j]`: through the model's `predict_comm_after` where it has one,
    else `predict_comm_ms` on each changed layout. With `layout_of` ([N]), layout n is row `layout_of[n]` of
    [L, D] `widths` and `compute_ms` (candidates that share a layout pass it once)."""
    devices = np.asarray(devices)
    if not getattr(cost_model, "has_comm", True):
        return np.zeros((*devices.shape, 2))
    after = getattr(cost_model, "predict_comm_after", None)
    if after is not None:
        if layout_of is None:
            return np.asarray(after(widths, compute_ms, devices, added_width, new_compute_ms), dtype=np.float64)
        return np.asarray(after(widths, compute_ms, devices, added_width, new_compute_ms, layout_of=layout_of),
                          dtype=np.float64)
    if layout_of is not None:
        widths, compute_ms = np.asarray(widths)[layout_of], np.asarray(compute_ms)[layout_of]
    n, k = devices.shape
    num_devices = widths.shape[1]
    onehot = np.arange(num_devices)[None, None, :] == devices[:, :, None]  # [N, K, D]
    layout_width = widths[:, None, :] + np.asarray(added_width)[:, None, None] * onehot
    layout_compute = np.where(onehot, np.asarray(new_compute_ms)[:, :, None], compute_ms[:, None, :])
    comm = predict_comm_ms(cost_model, layout_width.reshape(-1, num_devices), layout_compute.reshape(-1, num_devices))
    return comm.reshape(n, k, num_devices, 2)[np.arange(n)[:, None], np.arange(k)[None, :], devices]


def simulate_devices(
    devices: Sequence[Sequence[TableSpec]], cost_model: CostModel, cache: ShardCostCache | None = None
) -> PlanCost:
    """Predicted cost of a layout given as the tables (or slices) on each device."""
    cache = cache or ShardCostCache(cost_model)
    compute = cache.compute_ms(devices)
    widths = np.array([[sum(t.dim for t in d) for d in devices]], dtype=np.float64)
    comm = predict_comm_ms(cost_model, widths, compute.sum(axis=1)[None, :])[0]
    return PlanCost(
        fwd_ms=compute[:, 0], bwd_ms=compute[:, 1], comm_fwd_ms=comm[:, 0], comm_bwd_ms=comm[:, 1]
    )


def simulate(
    plan: Plan, task: ShardingTask, cost_model: CostModel, cache: ShardCostCache | None = None
) -> PlanCost:
    """Predicted per-device forward, backward and communication ms of `plan`, and its cost (data-parallel tables:
    their kernel on the local batch and their all-reduce on every device, `data_parallel_cost`; row-wise tables:
    each device's kernel on its row blocks and their collectives, `row_wise_cost`)."""
    cost = simulate_devices(device_specs(plan, task), cost_model, cache)
    if not plan.data_parallel and not plan.row_wise:
        return cost
    try:
        replicated = data_parallel_cost(cost_model, data_parallel_specs(plan, task), plan.num_devices)
        rows = row_wise_cost(cost_model, row_wise_specs(plan, task), plan.num_devices, task.batch_size)
    except ValueError as err:
        raise PlanError(f"plan {plan.method!r}: {err}") from None
    every = np.ones(plan.num_devices)
    return PlanCost(fwd_ms=cost.fwd_ms + replicated.fwd_ms + rows.fwd_ms,
                    bwd_ms=cost.bwd_ms + replicated.bwd_ms + rows.bwd_ms,
                    comm_fwd_ms=cost.comm_fwd_ms, comm_bwd_ms=cost.comm_bwd_ms,
                    all_reduce_ms=every * replicated.all_reduce_ms if plan.data_parallel else np.zeros(0),
                    row_wise_comm_ms=every * rows.comm_ms if plan.row_wise else np.zeros(0))


@dataclass(frozen=True)
class BalanceBound:
    """How far a plan's compute is from an even spread of its shards, by the cost model.

    The papers' bound fuses all shards on one device and divides by the devices; a fused shard of hundreds of
    tables is far outside what the model was trained on (at 1,000 tables it predicted 3e7 ms), so the shards are
    dealt round-robin over the devices instead, largest first, and the mean of those device costs is the even
    spread. It is a reference, not a guarantee: it is a lower bound for an additive cost, and the fused kernel's
    sub-additivity lets a clever grouping go somewhat below it. No device is faster than its largest shard."""

    fused_per_device_ms: float
    largest_shard_ms: float
    plan_compute_ms: float

    @property
    def bound_ms(self) -> float:
        """The larger of the two references."""
        return max(self.fused_per_device_ms, self.largest_shard_ms)

    def to_json(self) -> dict[str, float]:
        """The bound, its parts and the plan's slowest compute over it (1.0: nothing left to balance)."""
        bound = self.bound_ms
        return {
            "bound_ms": round(bound, 3),
            "fused_per_device_ms": round(self.fused_per_device_ms, 3),
            "largest_shard_ms": round(self.largest_shard_ms, 3),
            "compute_over_bound": round(self.plan_compute_ms / bound, 4) if bound > 0 else 1.0,
        }


def balance_bound(plan: Plan, task: ShardingTask, cost_model: CostModel, cost: PlanCost) -> BalanceBound:
    """The cost model's even-spread reference for `plan`'s shards (see BalanceBound)."""
    shards = [spec for device in device_specs(plan, task) for spec in device]
    alone = np.asarray(cost_model.predict_compute([[spec] for spec in shards]), dtype=np.float64).sum(axis=1)
    order = np.argsort(-alone, kind="stable")
    dealt = [[shards[i] for i in order[d :: plan.num_devices]] for d in range(plan.num_devices)]
    spread = np.asarray(cost_model.predict_compute(dealt), dtype=np.float64).sum(axis=1)
    return BalanceBound(fused_per_device_ms=float(spread.mean()),
                        largest_shard_ms=float(alone.max(initial=0.0)),
                        plan_compute_ms=float(cost.compute_ms.max()))
