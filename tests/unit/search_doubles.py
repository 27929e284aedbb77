"""A small deterministic cost model for search tests (the cost model is not the code under test here).

It honours the `CostModel` interface the way the real one does: a per-table embedding summed over a shard,
then a head; the head's fixed cost grows with the square root of the table count, so fused shards are
sub-additive like fbgemm's kernel. Communication grows with a device's width and the layout's total width."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import Field

from shardwise.search import MethodOptions, Plan, Shard, finish_plan
from shardwise.workload import ShardingTask, TableSpec, shard_memory_bytes


class FeatureCostModel:
    """fwd = 0.05 + 0.1 sqrt(tables) + lookups/2e4 + rows*dim/1e8 ms; bwd = 1.5 fwd (0 for no tables)."""

    hardware_kind = "test-double"
    batch_size = 4096

    def table_embeddings(self, tables: Sequence[TableSpec]) -> np.ndarray:
        """[T, 3]: count channel, lookups (dim x pooling), size in elements."""
        return np.array([[1.0, t.dim * t.pooling_factor, t.rows * t.dim] for t in tables]).reshape(-1, 3)

    def compute_from_embeddings(self, summed: np.ndarray) -> np.ndarray:
        """[N, 3] -> [N, 2] forward and backward ms."""
        summed = np.asarray(summed, dtype=np.float64)
        count = summed[:, 0]
        fwd = 0.05 + 0.1 * np.sqrt(count) + summed[:, 1] / 2e4 + summed[:, 2] / 1e8
        fwd = np.where(count > 0.5, fwd, 0.0)
        return np.stack([fwd, 1.5 * fwd], axis=1)

    def predict_compute(self, shards: Sequence[Sequence[TableSpec]]) -> np.ndarray:
        """[N, 2] ms of N shards."""
        summed = np.stack([self.table_embeddings(s).sum(axis=0) for s in shards]) if shards else np.zeros((0, 3))
        return self.compute_from_embeddings(summed)

    def predict_comm(self, widths: np.ndarray, compute_ms: np.ndarray) -> np.ndarray:
        """[N, D] -> [N, D, 2]: own width plus an equal share of everyone's, fwd and 1.2x bwd."""
        widths = np.asarray(widths, dtype=np.float64)
        fwd = 2e-4 * widths + 1e-4 * widths.sum(axis=1, keepdims=True) / widths.shape[1]
        return np.stack([fwd, 1.2 * fwd], axis=-1)


class WidthFreeCostModel(FeatureCostModel):
    """The feature double whose lookups and all-to-alls cost the same at any width: a column half costs what the
    whole table does, so splitting a table never pays."""

    def table_embeddings(self, tables: Sequence[TableSpec]) -> np.ndarray:
        """[T, 3]: count channel, lookups (128 x pooling, whatever the dim), size in elements."""
        return np.array([[1.0, 128 * t.pooling_factor, t.rows * 128] for t in tables]).reshape(-1, 3)

    def predict_comm(self, widths: np.ndarray, compute_ms: np.ndarray) -> np.ndarray:
        """[N, D] -> [N, D, 2]: 0.05 ms each way on every device."""
        return np.full((*np.shape(widths), 2), 0.05)


def random_task(seed: int, num_tables: int, num_devices: int, memory_slack: float = 1.5) -> ShardingTask:
    """Synthetic DLRM-like tables with skewed sizes and poolings; memory = slack x total / devices."""
    from shardwise.workload import shard_memory_bytes

    rng = np.random.default_rng(seed)
    tables = [
        TableSpec(
            name=f"t{i}",
            rows=int(10 ** rng.uniform(3, 5.3)),
            dim=int(rng.choice([16, 32, 64, 128])),
            pooling_factor=float(np.round(10 ** rng.uniform(0, 1.7), 2)),
            zipf_alpha=float(rng.uniform(0.8, 1.2)),
        )
        for i in range(num_tables)
    ]
    batch_size = 4096
    total = shard_memory_bytes(tables, batch_size)
    return ShardingTask(
        num_devices=num_devices,
        device_memory_bytes=int(memory_slack * total / num_devices),
        batch_size=batch_size,
        tables=tuple(tables),
    )


# --- for the learned placement policies (DreamShard, AutoShard) ------------------------------------------
class AnalyticCostModel:
    """Test double for the CostModel protocol: sub-additive fused compute, width-driven all-to-all."""

    hardware_kind = "test-analytic"
    batch_size = 512

    def table_embeddings(self, tables):
        return np.array([[t.pooling_factor * (t.dim + 16) / 1000.0, np.log1p(t.rows) / 10.0, 1.0] for t in tables])

    def compute_from_embeddings(self, summed):
        s = np.asarray(summed, dtype=np.float64)
        # a fixed cost shared by the fused kernel (sqrt of the table count) plus lookup work
        fwd = np.where(s[:, 2] > 0.5, 0.05 * np.sqrt(s[:, 2]) + s[:, 0] * (1 + 0.02 * s[:, 1]), 0.0)
        return np.stack([fwd, 2.0 * fwd], axis=1)

    def predict_compute(self, shards):
        summed = [self.table_embeddings(s).sum(0) if s else np.zeros(3) for s in shards]
        return self.compute_from_embeddings(np.stack(summed)) if shards else np.zeros((0, 2))

    def predict_comm(self, widths, compute_ms):
        w = np.asarray(widths, dtype=np.float64)
        fwd = 0.002 * w + 0.0005 * w.sum(axis=1, keepdims=True) + 0.01
        return np.stack([fwd, fwd], axis=2)


def make_tables(n: int, seed: int, prefix: str) -> list[TableSpec]:
    rng = np.random.default_rng(seed)
    return [
        TableSpec(name=f"{prefix}{i}", rows=int(10 ** rng.uniform(3, 5)), dim=int(rng.choice([8, 16, 32, 64, 128])),
                  pooling_factor=float(rng.uniform(1, 40)), zipf_alpha=float(rng.uniform(0.5, 1.2)))
        for i in range(n)
    ]


def make_task(tables: list[TableSpec], num_devices: int, slack: float = 1.5) -> ShardingTask:
    total = shard_memory_bytes(tables, 512)
    largest = max(shard_memory_bytes([t], 512) for t in tables)
    return ShardingTask(num_devices=num_devices, device_memory_bytes=int(max(slack * total / num_devices, largest)),
                        batch_size=512, tables=tuple(tables))


def heldout_tasks(num_tasks: int, num_tables: int, num_devices: int) -> list[ShardingTask]:
    pool = make_tables(200, seed=7, prefix="holdout")  # names and draws never seen in training
    rng = np.random.default_rng(3)
    return [make_task([pool[j] for j in rng.choice(200, size=num_tables, replace=False)], num_devices)
            for _ in range(num_tasks)]


class RoundRobinOptions(MethodOptions):
    """The test method's one option."""

    offset: int = Field(default=0, ge=0, description="device of the first table")


class RoundRobinSearch:
    """A test method: table i on device (i + offset) mod D."""

    name = "round_robin"

    def __init__(self, options: RoundRobinOptions) -> None:
        self.offset = options.offset

    def search(self, task, cost_model, seed) -> Plan:  # noqa: ANN001
        shards = tuple(Shard(table=t.name, col_offset=0, dim=t.dim, device=(i + self.offset) % task.num_devices)
                       for i, t in enumerate(task.tables))
        plan = Plan(num_devices=task.num_devices, shards=shards, method=self.name)
        return finish_plan(plan, task, cost_model, planning_time_s=0.0, seed=seed, options={"offset": self.offset})
