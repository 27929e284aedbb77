"""Which tables leave HBM: for a task whose tables do not fit in its devices' HBM, the kernel of each table the task
lets leave it (fbgemm's UVM kernels, in TorchRec's words "fused_uvm_caching" and "fused_uvm"), before placement.

A table on "fused_uvm_caching" keeps its weights and optimizer state in host memory and a cache of
`cache_load_factor` x its rows in HBM; how fast it runs depends on how often its lookups hit that cache, which the
cost model learns from caching shards profiled on a GPU. The stage prices each table's move off HBM by its predicted
ms over the HBM bytes it frees, and moves the cheapest first (a small cache before none: the load factors in
`CACHE_LOAD_FACTORS` from the largest down, then "fused_uvm"), until the tables fit in HBM with room for the greedy
placement to balance them, within the devices' host memory; then the search places them as it places any table. A
task whose tables fit in HBM is placed as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shardwise.costmodel.caching import with_host_memory
from shardwise.costmodel.types import CostModel
from shardwise.workload import (
    HOST_KERNELS,
    ComputeKernel,
    ShardingTask,
    TableSpec,
    table_hbm_bytes,
    table_host_bytes,
)

from .plan import GIB, HostMemoryError, Plan, PlanError, TableKernel, check_memory_bounds

#: the cache sizes tried, as shares of a table's rows (TorchRec's default is 0.2)
CACHE_LOAD_FACTORS: tuple[float, ...] = (0.5, 0.2, 0.1)
#: the share of the devices' HBM the tables' state may fill before placement: the greedy packs shards of unequal
#: sizes, and a fill near 1 leaves it no room to balance
HBM_FILL = 0.85
#: each round after a placement found no fit frees this much more of the devices' HBM (a share of all of it)
HBM_FILL_STEP = 0.1


def prices_kernel(cost_model: CostModel, kernel: ComputeKernel) -> bool:
    """Whether `cost_model` was trained on shards run by `kernel` (its `compute_kernels`; "fused" for any)."""
    return kernel in getattr(cost_model, "compute_kernels", ("fused",))


def plan_kernels(task: ShardingTask) -> dict[str, TableKernel]:
    """The kernels a task's tables carry (`TableSpec.compute_kernel`), as a plan lists them: UVM tables only."""
    return {t.name: TableKernel(kernel=t.compute_kernel, cache_load_factor=t.cache_load_factor)
            for t in task.tables if t.compute_kernel is not None and t.compute_kernel != "fused"}


@dataclass(frozen=True)
class _Move:
    """One table's next step off HBM: onto `table` (its kernel set), at `extra_ms` more predicted, freeing
    `freed_bytes` of HBM."""

    index: int
    table: TableSpec
    extra_ms: float
    freed_bytes: int

    @property
    def ms_per_gib(self) -> float:
        return self.extra_ms / max(self.freed_bytes / GIB, 1e-12)


class _Offloader:
    """The tables' kernels as the stage moves them off HBM, cheapest predicted ms per freed byte first."""

    def __init__(self, task: ShardingTask, cost_model: CostModel) -> None:
        self.task = task
        self.model = cost_model
        self.tables = list(task.tables)
        self.host_used = 0
        self.host_capacity = (task.host_memory_bytes or 0) * task.num_devices
        self._ms: dict[TableSpec, float] = {}

    def _price(self, tables: list[TableSpec]) -> None:
        missing = [t for t in dict.fromkeys(tables) if t not in self._ms]
        if missing:
            ms = self.model.predict_compute([[t] for t in missing]).sum(axis=1)
            self._ms.update(zip(missing, map(float, ms)))

    def _steps(self, table: TableSpec) -> list[TableSpec]:
        """`table`'s kernels that keep less of it in HBM than now, in the order the stage tries them."""
        def allowed(kernel: ComputeKernel) -> bool:
            return table.allows_kernel(kernel) and prices_kernel(self.model, kernel)

        steps = [table.on_kernel("fused_uvm_caching", f) for f in CACHE_LOAD_FACTORS if allowed("fused_uvm_caching")]
        if allowed("fused_uvm"):
            steps.append(table.on_kernel("fused_uvm"))
        now = self._hbm(table)
        return [step for step in steps if self._hbm(step) < now]

    def _hbm(self, table: TableSpec) -> int:
        return table_hbm_bytes(table, self.task.optimizer, self.task.weights_precision)

    def _host(self, table: TableSpec) -> int:
        return table_host_bytes(table, self.task.optimizer, self.task.weights_precision)

    def _fits_host(self, now: TableSpec, step: TableSpec) -> bool:
        """Whether moving `now` to `step` keeps the tables within all devices' host memory, and its widest slice
        within one device's."""
        extra = self._host(step) - self._host(now)
        widest = step.with_dim(step.widest_slice_dim(self.task.num_devices), name=step.name)
        return (self.host_used + extra <= self.host_capacity
                and self._host(widest) <= (self.task.host_memory_bytes or 0))

    def next_move(self) -> _Move | None:
        """The cheapest step left (predicted ms per freed GiB), or None where no table can leave more of HBM."""
        options: list[tuple[int, TableSpec, TableSpec]] = []
        for i, table in enumerate(self.tables):
            if self.task.may_leave_hbm(self.task.tables[i]):
                options += [(i, table, step) for step in self._steps(table) if self._fits_host(table, step)]
        if not options:
            return None
        self._price([t for _, table, step in options for t in (table, step)])
        moves = [_Move(i, step, self._ms[step] - self._ms[table], self._hbm(table) - self._hbm(step))
                 for i, table, step in options]
        return min(moves, key=lambda m: (m.ms_per_gib, m.index))

    def apply(self, move: _Move) -> None:
        now = self.tables[move.index]
        self.host_used += self._host(move.table) - self._host(now)
        # a table in host memory stays table-wise or column-wise: replicas or row blocks on every device would
        # bring it back to every device's HBM
        kept = tuple(t for t in (now.sharding_types or ("table_wise", "column_wise")) if t in ("table_wise",
                                                                                             "column_wise"))
        self.tables[move.index] = move.table.model_copy(update={"sharding_types": kept})

    def hbm_bytes(self) -> int:
        """The tables' state in HBM (caches and bookkeeping for those that left), buffers aside."""
        return sum(self._hbm(t) for t in self.tables)

    def placed_task(self) -> ShardingTask:
        return self.task.model_copy(update={"tables": tuple(self.tables)})


def place_within_memory(task: ShardingTask, cost_model: CostModel,
                        place: Callable[[ShardingTask, CostModel], Plan]) -> Plan:
    """`place(task, cost_model)` where the task's tables fit in HBM (or none may leave it); else the tables cheapest
    to move put in host memory, more after each placement that finds no fit, and `place` given the task with their
    kernels set (`TableSpec.compute_kernel`) and the model that prices them (`costmodel.caching.with_host_memory`);
    PlanError in one line where no kernels fit both memories or the cost model cannot price a table off HBM."""
    movable = [t for t in task.tables if task.may_leave_hbm(t)]
    if not movable:
        return place(task, cost_model)
    try:
        check_memory_bounds(task, column_split=True, row_wise=True)
        return place(task, cost_model)
    except HostMemoryError:
        raise
    except PlanError as err:
        in_hbm = err
    kernels = sorted({k for t in movable for k in HOST_KERNELS if t.allows_kernel(k)})
    unpriced = [k for k in kernels if not prices_kernel(cost_model, k)]
    if unpriced == kernels:
        raise PlanError(f"{in_hbm}; the task lets {len(movable)} table(s) leave HBM, and the cost model has not "
                        f"measured {' or '.join(repr(k) for k in kernels)} (profile caching shards on a GPU: "
                        "shardwise profile --device cuda --caching-shards N, then pretrain)")
    cost_model = with_host_memory(cost_model)
    offloader = _Offloader(task, cost_model)
    capacity = task.device_memory_bytes * task.num_devices
    fill = HBM_FILL
    moved = 0
    while True:
        while offloader.hbm_bytes() > fill * capacity:
            move = offloader.next_move()
            if move is None:
                break
            offloader.apply(move)
            moved += 1
        placed = offloader.placed_task()
        try:
            return place(placed, cost_model)
        except HostMemoryError:
            raise
        except PlanError as err:
            if offloader.next_move() is None:
                host = task.host_memory_bytes or 0
                raise PlanError(f"no plan fits in HBM and host memory: with {moved} table move(s) off HBM, {err} "
                                f"({task.num_devices} device(s) x {task.device_memory_bytes / GIB:.3f} GiB of HBM, "
                                f"{host / GIB:.3f} GiB of host memory)") from None
            # below what the tables hold now, so that the next round moves at least one more
            fill = max(0.0, min(fill, offloader.hbm_bytes() / capacity) - HBM_FILL_STEP)
