"""Baselines from the literature: random and key-greedy table-wise placement (they need no cost model)."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from shardwise.costmodel.types import CostModel
from shardwise.workload import ShardingTask, TableSpec

from .plan import GIB, Plan, PlanError, Shard, check_memory_bounds, shard_state_bytes
from .report import finish_plan

#: what each greedy sorts and balances by (lookup = dim x pooling factor: floats moved per sample)
GREEDY_KEYS: dict[str, Callable[[TableSpec, ShardingTask], float]] = {
    "size": lambda t, task: float(shard_state_bytes(t, task)),
    "dim": lambda t, task: float(t.dim),
    "lookup": lambda t, task: t.dim * t.pooling_factor,
    "size_lookup": lambda t, task: float(shard_state_bytes(t, task)) * t.dim * t.pooling_factor,
}


def _table_wise_plan(task: ShardingTask, devices: list[int], method: str) -> Plan:
    return Plan(
        num_devices=task.num_devices,
        shards=tuple(
            Shard(table=t.name, col_offset=0, dim=t.dim, device=d) for t, d in zip(task.tables, devices)
        ),
        method=method,
    )


def _no_room(method: str, table: TableSpec, need: int, free: np.ndarray) -> PlanError:
    return PlanError(
        f"{method}: table {table.name!r} needs {need / GIB:.3f} GiB, the most free on any device is "
        f"{free.max() / GIB:.3f} GiB (a method that splits columns may still fit)"
    )


class GreedySearch:
    """Tables in descending `key` order, each onto the device with the least accumulated key it fits on."""

    def __init__(self, key: str) -> None:
        if key not in GREEDY_KEYS:
            raise ValueError(f"greedy key {key!r} is not one of {sorted(GREEDY_KEYS)}")
        self.key = key
        self.name = f"{key}_greedy"

    def search(self, task: ShardingTask, cost_model: CostModel | None, seed: int) -> Plan:
        """Deterministic greedy placement (`seed` is recorded, not used)."""
        started = time.perf_counter()
        check_memory_bounds(task, column_split=False)
        keys = np.array([GREEDY_KEYS[self.key](t, task) for t in task.tables])
        need = np.array([shard_state_bytes(t, task) for t in task.tables])
        load = np.zeros(task.num_devices)
        free = np.full(task.num_devices, task.device_memory_bytes, dtype=np.int64)
        devices = [0] * len(task.tables)
        # stable sort: equal keys keep task order, so the plan is reproducible
        for i in np.argsort(-keys, kind="stable"):
            fits = free >= need[i]
            if not fits.any():
                raise _no_room(self.name, task.tables[i], int(need[i]), free)
            d = int(np.argmin(np.where(fits, load, np.inf)))
            devices[i] = d
            load[d] += keys[i]
            free[d] -= need[i]
        plan = _table_wise_plan(task, devices, self.name)
        return finish_plan(
            plan, task, cost_model, planning_time_s=time.perf_counter() - started, seed=seed,
            options={"key": self.key},
        )


class RandomSearch:
    """Each table onto a uniformly random device that still has room for it (largest tables first)."""

    name = "random"

    def __init__(self, attempts: int = 100) -> None:
        self.attempts = attempts

    def search(self, task: ShardingTask, cost_model: CostModel | None, seed: int) -> Plan:
        """A random memory-feasible table-wise plan; PlanError after `attempts` dead ends."""
        started = time.perf_counter()
        check_memory_bounds(task, column_split=False)
        rng = np.random.default_rng(seed)
        need = np.array([shard_state_bytes(t, task) for t in task.tables])
        # largest first: a random order would dead-end on tight tasks that have plenty of plans
        order = np.argsort(-need, kind="stable")
        for _ in range(self.attempts):
            free = np.full(task.num_devices, task.device_memory_bytes, dtype=np.int64)
            devices = [0] * len(task.tables)
            for i in order:
                room = np.flatnonzero(free >= need[i])
                if room.size == 0:
                    break
                d = int(rng.choice(room))
                devices[i] = d
                free[d] -= need[i]
            else:
                plan = _table_wise_plan(task, devices, self.name)
                return finish_plan(
                    plan, task, cost_model, planning_time_s=time.perf_counter() - started, seed=seed,
                    options={"attempts": self.attempts},
                )
        raise PlanError(f"random: no memory-feasible placement in {self.attempts} attempts (seed {seed})")
