"""Sequential table-wise placement, the arithmetic DreamShard and AutoShard share: a task's per-table arrays
in placement order, predicted costs of layouts and assignments, memory masks, and the plan an assignment makes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from shardwise.costmodel.types import CostModel
from shardwise.workload import ShardingTask, tables_features

from .plan import Plan, PlanError, Shard, check_memory_bounds, shard_state_bytes

if TYPE_CHECKING:
    import torch

#: rough log-scales of dim, rows, pooling factor and size in bytes, so policy inputs are O(1)
_LOG_FEATURE_SCALE = np.array([8.0, 20.0, 6.0, 26.0])


def policy_table_features(task: ShardingTask) -> np.ndarray:
    """[T, 21] policy inputs: log-scaled dim, rows, pooling factor, size, then the 17 reuse bins."""
    raw = tables_features(task.tables, task.batch_size, task.weights_precision)
    out = raw.copy()
    out[:, :4] = np.log1p(raw[:, :4]) / _LOG_FEATURE_SCALE
    return out.astype(np.float32)


@dataclass(frozen=True)
class PlacementTask:
    """A task prepared for sequential placement: tables in placement order (descending predicted cost)."""

    task: ShardingTask
    order: np.ndarray  # [T] task table index of the t-th table placed
    features: np.ndarray  # [T, 21] policy features, in placement order
    embeddings: np.ndarray  # [T, H] the cost model's table embeddings, in placement order
    table_cost_ms: np.ndarray  # [T] predicted fwd+bwd ms of each table alone, in placement order
    memory_bytes: np.ndarray  # [T] bytes each table adds to a device, in placement order
    dims: np.ndarray  # [T] output widths, in placement order
    scale_ms: float  # sum of single-table costs / num_devices: the unit rewards and cost features use

    @property
    def num_tables(self) -> int:
        """Tables to place."""
        return int(self.order.shape[0])

    @property
    def num_devices(self) -> int:
        """Devices to place on."""
        return self.task.num_devices

    @property
    def capacity_bytes(self) -> int:
        """Memory per device."""
        return self.task.device_memory_bytes


def prepare_task(task: ShardingTask, cost_model: CostModel) -> PlacementTask:
    """Order the task's tables by predicted cost and precompute what placement needs; refuse tasks that cannot fit."""
    tables = task.tables
    check_memory_bounds(task, column_split=False)
    # memory is additive per table (state plus its share of the kernel buffers), so masks update incrementally
    memory = np.array([shard_state_bytes(t, task) for t in tables], dtype=np.int64)
    embeddings = np.asarray(cost_model.table_embeddings(tables), dtype=np.float64)
    single_ms = np.asarray(cost_model.compute_from_embeddings(embeddings)).sum(axis=1)
    # stable sort: ties keep task order, so placement is deterministic
    order = np.argsort(-single_ms, kind="stable")
    return PlacementTask(
        task=task,
        order=order,
        features=policy_table_features(task)[order],
        embeddings=embeddings[order],
        table_cost_ms=single_ms[order],
        memory_bytes=memory[order],
        dims=np.array([tables[i].dim for i in order], dtype=np.int64),
        scale_ms=max(float(single_ms.sum()) / task.num_devices, 1e-6),
    )


def layout_costs_ms(
    cost_model: CostModel, summed: np.ndarray, widths: np.ndarray, counts: np.ndarray
) -> np.ndarray:
    """Per-device [N, D, 3] fwd, bwd and all-to-all ms of N layouts, from summed embeddings [N, D, H],
    output widths [N, D] and table counts [N, D] (an empty device computes nothing)."""
    n, d, h = summed.shape
    compute = np.asarray(cost_model.compute_from_embeddings(summed.reshape(n * d, h))).reshape(n, d, 2)
    compute = np.where((counts > 0)[..., None], compute, 0.0)
    comm = np.asarray(cost_model.predict_comm(widths.astype(np.float64), compute.sum(axis=2)))
    return np.concatenate([compute, comm.sum(axis=2, keepdims=True)], axis=2)


def assignment_costs_ms(cost_model: CostModel, prepared: PlacementTask, assignments: np.ndarray) -> np.ndarray:
    """Per-device [N, D, 3] predicted costs of N assignments [N, T] (device per table, placement order)."""
    onehot = np.eye(prepared.num_devices)[assignments]  # [N, T, D]
    summed = np.einsum("ntd,th->ndh", onehot, prepared.embeddings)
    widths = np.einsum("ntd,t->nd", onehot, prepared.dims.astype(np.float64))
    return layout_costs_ms(cost_model, summed, widths, onehot.sum(axis=1))


def assignment_fits(prepared: PlacementTask, assignment: np.ndarray) -> bool:
    """Whether every device holds at most its memory."""
    used = np.bincount(assignment, weights=prepared.memory_bytes, minlength=prepared.num_devices)
    return bool((used <= prepared.capacity_bytes).all())


def best_assignment(
    cost_model: CostModel, prepared: PlacementTask, candidates: list[np.ndarray], method: str
) -> tuple[np.ndarray, float]:
    """The fitting candidate with the lowest predicted plan cost (max device ms), and that cost."""
    fitting = [a for a in candidates if assignment_fits(prepared, a)]
    if not fitting:
        raise PlanError(
            f"{method}: no placement of the {prepared.num_tables} tables fits in device_memory_bytes "
            f"{prepared.capacity_bytes} (every rollout reached a table no device had room for)"
        )
    plan_ms = assignment_costs_ms(cost_model, prepared, np.stack(fitting)).sum(axis=2).max(axis=1)
    best = int(np.argmin(plan_ms))
    return fitting[best], float(plan_ms[best])


def plan_from_assignment(prepared: PlacementTask, assignment: np.ndarray, method: str,
                         extra: Mapping[str, Any] | None = None) -> Plan:
    """A table-wise Plan from a device per table (placement order)."""
    device_of = {int(prepared.order[i]): int(assignment[i]) for i in range(prepared.num_tables)}
    shards = tuple(
        Shard(table=t.name, col_offset=0, dim=t.dim, device=device_of[i]) for i, t in enumerate(prepared.task.tables)
    )
    return Plan(num_devices=prepared.num_devices, shards=shards, method=method, extra=dict(extra or {}))


def legal_devices(prepared: PlacementTask, used_bytes: np.ndarray, t: int, lookahead: int = 8) -> np.ndarray:
    """[K, D] devices that can take table t in K partial placements with `used_bytes` [K, D].

    Besides room for table t, a device must leave room for what is still to come: the remaining bytes in
    total, and the `lookahead` largest remaining tables placed worst-fit (largest first). Where that check
    rules out every device it is dropped (it is a heuristic), and plain room for table t decides."""
    capacity = float(prepared.capacity_bytes)
    k, d = used_bytes.shape
    after = used_bytes[:, None, :] + np.eye(d)[None] * float(prepared.memory_bytes[t])  # [K, Dc, D]
    fits = used_bytes + float(prepared.memory_bytes[t]) <= capacity
    remaining = prepared.memory_bytes[t + 1 :].astype(np.float64)
    if remaining.size == 0:
        return fits
    free = capacity - after
    ahead = fits & (np.clip(free, 0, None).sum(axis=2) >= remaining.sum())
    rows_k, rows_c = np.meshgrid(np.arange(k), np.arange(d), indexing="ij")
    for need in np.sort(remaining)[::-1][:lookahead]:
        roomiest = free.argmax(axis=2)
        room = free[rows_k, rows_c, roomiest]
        ahead &= room >= need
        free[rows_k, rows_c, roomiest] = room - need
    return np.where(ahead.any(axis=1, keepdims=True), ahead, fits)


def masked_logits(logits: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    """Illegal actions get -inf; rows with no legal action keep all (their episode is already lost)."""
    any_legal = legal.any(dim=-1, keepdim=True)
    keep = legal | ~any_legal
    return logits.masked_fill(~keep, float("-inf"))


def select_device(device: str | None = None) -> torch.device:
    """The torch device to run policies on: `device` if given, else CUDA when present, else CPU."""
    import torch  # here, not at the top: the search package's modules import without torch (`plan --help`)

    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


class PlacementPolicy(Protocol):
    """A trained placement policy: candidate table -> device assignments for a prepared task; saved as a
    policy directory (`policy.json` + `weights.pt`, see policy_files)."""

    method: str
    provenance: dict[str, Any]

    def candidates(
        self, cost_model: CostModel, prepared: PlacementTask, samples: int, seed: int
    ) -> list[np.ndarray]:
        """The greedy assignment plus `samples` sampled ones, each [T] device per table (placement order)."""
        ...

    def save(self, directory: str | Path) -> Path:
        """Write the policy to `directory`."""
        ...
