"""Baselines from the literature: random and key-greedy table-wise placement (they need no cost model), and the
greedy on measured single-table costs."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, Field

from shardwise.costmodel.types import CostModel
from shardwise.profiling import MeasurementSettings, TimingProtocol
from shardwise.workload import ShardingTask, TableSpec

from .plan import GIB, Plan, PlanError, Shard, check_memory_bounds, shard_state_bytes
from .registry import MethodOptions, MethodSpec, NoOptions, register_method
from .report import finish_plan

if TYPE_CHECKING:
    import torch

#: what each greedy sorts and balances by (lookup = dim x pooling factor: floats moved per sample). size_lookup
#: is the papers' key exactly: dim x pooling factor x log10(rows), as in the seeds' `size_lookup_greedy_shard`
#: (NeuroShard's, DreamShard's and AutoShard's sharders.py); a bytes x dim x pooling key planned far worse than it
GREEDY_KEYS: dict[str, Callable[[TableSpec, ShardingTask], float]] = {
    "size": lambda t, task: float(shard_state_bytes(t, task)),
    "dim": lambda t, task: float(t.dim),
    "lookup": lambda t, task: t.dim * t.pooling_factor,
    "size_lookup": lambda t, task: t.dim * t.pooling_factor * math.log10(t.rows),
}
#: the key measured on hardware: each table's fwd+bwd ms alone on the kernel
MEASURED_KEY = "measured"


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


class SingleTableTimings:
    """Each table's measured fwd+bwd ms alone on fbgemm's fused kernel, under one MeasurementSettings.

    The device and protocol are decided on first use, with the reference kernel calibrated once (when timings
    are normalised and the reference is not pinned), so every table is scaled by the same reference. Timings
    are cached per table and batch: tasks drawn from one table pool (a benchmark) measure each table once."""

    def __init__(self, measurement: MeasurementSettings) -> None:
        self.measurement = measurement
        self._setup: tuple[torch.device, TimingProtocol] | None = None
        self._ms: dict[tuple[TableSpec, int, str, str], float] = {}
        #: kernel measurements taken so far (the cache spares the rest)
        self.measured = 0

    def device_and_protocol(self) -> tuple[torch.device, TimingProtocol]:
        """The device timed on and the protocol timed with (reference calibrated on the first call)."""
        if self._setup is None:
            # the kernels (torch, fbgemm) load when a table is first timed: listing the methods does without them
            from shardwise.profiling import resolve_timing

            self._setup = resolve_timing(self.measurement)
        return self._setup

    def batch_size(self, task: ShardingTask) -> int:
        """The batch tables are timed at: the measurement's, else the task's."""
        return self.measurement.batch_size or task.batch_size

    def table_ms(self, task: ShardingTask) -> np.ndarray:
        """[T] measured fwd+bwd ms of each of the task's tables alone."""
        from shardwise.profiling import measure_shard  # the kernels: see device_and_protocol

        batch = self.batch_size(task)
        out = []
        for table in task.tables:
            key = (table, batch, task.optimizer, task.weights_precision)
            if key not in self._ms:
                device, protocol = self.device_and_protocol()
                timing = measure_shard([table], batch, device=device, protocol=protocol, optimizer=task.optimizer,
                                       weights_precision=task.weights_precision)
                self._ms[key] = timing.total_ms
                self.measured += 1
            out.append(self._ms[key])
        return np.array(out)


class GreedySearch:
    """Tables in descending `key` order, each onto the device with the least accumulated key it fits on.

    Keys: those of GREEDY_KEYS (from the table's shape), or "measured": each table's fwd+bwd ms measured alone
    on this machine's kernel (what measuring tables one by one buys; fused kernels are not additive, which a
    cost model must capture to beat it). When the key's order strands a large table that is cheap by the key,
    the tables are placed largest first instead (still balancing the key), the usual memory-feasible fallback."""

    def __init__(self, key: str, *, measurement: MeasurementSettings | None = None) -> None:
        if key not in (*GREEDY_KEYS, MEASURED_KEY):
            raise ValueError(f"greedy key {key!r} is not one of {[*GREEDY_KEYS, MEASURED_KEY]}")
        if measurement is not None and key != MEASURED_KEY:
            raise ValueError(f"greedy key {key!r} measures nothing: measurement applies to key {MEASURED_KEY!r}")
        self.key = key
        self.name = f"{key}_greedy"
        self.timings = SingleTableTimings(measurement or MeasurementSettings()) if key == MEASURED_KEY else None

    def keys(self, task: ShardingTask) -> np.ndarray:
        """[T] the key of each of the task's tables."""
        if self.timings is not None:
            return self.timings.table_ms(task)
        return np.array([GREEDY_KEYS[self.key](t, task) for t in task.tables], dtype=np.float64)

    def search(self, task: ShardingTask, cost_model: CostModel | None, seed: int) -> Plan:
        """Deterministic greedy placement (`seed` is recorded, not used)."""
        started = time.perf_counter()
        check_memory_bounds(task, column_split=False)
        keys = self.keys(task)
        need = np.array([shard_state_bytes(t, task) for t in task.tables])
        # stable sorts: equal keys keep task order, so the plan is reproducible
        try:
            devices = self._place(task, np.argsort(-keys, kind="stable"), keys, need)
            order = f"{self.key} (descending)"
        except PlanError:
            devices = self._place(task, np.argsort(-need, kind="stable"), keys, need)
            order = f"memory (descending; the {self.key} order found no room)"
        plan = _table_wise_plan(task, devices, self.name)
        options: dict[str, Any] = {"key": self.key, "order": order}
        if self.timings is not None:
            device, _ = self.timings.device_and_protocol()
            options |= {"batch_size": self.timings.batch_size(task), "device": str(device)}
        return finish_plan(
            plan, task, cost_model, planning_time_s=time.perf_counter() - started, seed=seed, options=options,
        )

    def _place(self, task: ShardingTask, order: np.ndarray, keys: np.ndarray, need: np.ndarray) -> list[int]:
        """Each table (in `order`) onto the device with the least key so far that has room for it."""
        load = np.zeros(task.num_devices)
        free = np.full(task.num_devices, task.device_memory_bytes, dtype=np.int64)
        devices = [0] * len(task.tables)
        for i in order:
            fits = free >= need[i]
            if not fits.any():
                raise _no_room(self.name, task.tables[i], int(need[i]), free)
            d = int(np.argmin(np.where(fits, load, np.inf)))
            devices[i] = d
            load[d] += keys[i]
            free[d] -= need[i]
        return devices


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


class MeasuredGreedyOptions(MethodOptions):
    """The measured-cost greedy's one option, filled in by the job (plan: --device; benchmark: its settings)."""

    measurement: MeasurementSettings = Field(default=MeasurementSettings(),
                                             description="how each table is timed alone")


def _greedy(key: str) -> Callable[[BaseModel], GreedySearch]:
    def factory(options: BaseModel) -> GreedySearch:
        if isinstance(options, MeasuredGreedyOptions):
            return GreedySearch(key, measurement=options.measurement)
        return GreedySearch(key)

    return factory


_GREEDY_DESCRIPTIONS = {
    "size": "greedy balancing memory (largest tables first)",
    "dim": "greedy balancing output dims",
    "lookup": "greedy balancing lookups (dim x pooling factor)",
    "size_lookup": "greedy balancing dim x pooling x log10(rows) (the papers' size-lookup key)",
}
register_method(MethodSpec(
    name="random", factory=lambda options: RandomSearch(), options=NoOptions,
    description="each table on a random device with room for it",
))
for _key in GREEDY_KEYS:
    register_method(MethodSpec(
        name=f"{_key}_greedy", factory=_greedy(_key), options=NoOptions, description=_GREEDY_DESCRIPTIONS[_key],
    ))
register_method(MethodSpec(
    name=f"{MEASURED_KEY}_greedy",
    factory=_greedy(MEASURED_KEY),
    options=MeasuredGreedyOptions,
    description="greedy balancing each table's fwd+bwd ms measured alone on this machine (the strongest "
                "simple baseline: longest processing time first on measured costs)",
    measures=True,
))
