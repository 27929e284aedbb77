"""TorchRec's own `EmbeddingShardingPlanner` as a baseline, on the same task and constraints as shardwise.

Fair configuration (see ENVIRONMENT.md): the fused kernel only, the task's pooling factors, the task's memory
cap as HBM with no storage reservation, the optimizer's state counted; table-wise, or table-wise and
column-wise with `min_partition` (TorchRec's default never splits tables of dim <= 128), or those and data-parallel
(`torchrec_dp`: the sharding types NeuroShard searches; a data-parallel table runs TorchRec's dense kernel, the only
one its data-parallel sharding takes). TorchRec's batch is per
rank (a task's is the step's), and its estimate of a shard's buffers is not shardwise's: a plan over shardwise's
accounting of a device's memory is planned again with that much less (`ACCOUNTING_REPLANS` times at most).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

from shardwise.costmodel.data_parallel import all_reduce_of
from shardwise.costmodel.row_wise import reduce_scatter_of
from shardwise.costmodel.types import CostModel
from shardwise.workload import ShardingTask

from .plan import Plan, PlanError, check_memory_bounds, plan_memory_bytes
from .registry import MethodSpec, NoOptions, register_method
from .report import finish_plan
from .torchrec_plan import ebc_on_meta, plan_from_module_sharding

#: replans at a lower memory cap where TorchRec's plan is over shardwise's accounting of a device's memory
ACCOUNTING_REPLANS = 4


class TorchRecPlannerSearch:
    """TorchRec's `EmbeddingShardingPlanner` run on the task; its plan converted to `shardwise.plan/v1`."""

    def __init__(self, column_wise: bool = False, min_partition: int = 32, timeout_s: int | None = None,
                 data_parallel: bool = False, row_wise: bool = False) -> None:
        self.column_wise = column_wise or data_parallel or row_wise
        self.data_parallel = data_parallel or row_wise
        self.row_wise = row_wise
        self.min_partition = min_partition
        self.timeout_s = timeout_s
        self.name = ("torchrec_rw" if row_wise else "torchrec_dp" if data_parallel else "torchrec_cw" if column_wise
                     else "torchrec")

    @property
    def sharding_types(self) -> list[str]:
        """The sharding types TorchRec's planner is offered, in its words."""
        return ["table_wise"] + (["column_wise"] if self.column_wise else []) + (
            ["data_parallel"] if self.data_parallel else []) + (["row_wise"] if self.row_wise else [])

    def search(self, task: ShardingTask, cost_model: CostModel | None, seed: int) -> Plan:
        """TorchRec's plan for `task`; PlanError when it finds none or it breaks shardwise's memory cap."""
        # torchrec: heavy (seconds to import), and only this baseline plans with it
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import ParameterConstraints
        from torchrec.distributed.planner.types import PlannerError

        started = time.perf_counter()
        check_memory_bounds(task, column_split=self.column_wise)
        constraints = {
            t.name: ParameterConstraints(
                sharding_types=self.sharding_types,
                # fused for the sharded types; TorchRec's data-parallel sharding takes only its dense kernel
                compute_kernels=["fused", "dense"] if self.data_parallel else ["fused"],
                pooling_factors=[t.pooling_factor],
                min_partition=self.min_partition if self.column_wise else None,
            )
            for t in task.tables
        }
        # TorchRec's estimate of a shard's buffers is not shardwise's, and every method's plan is held to
        # shardwise's: where TorchRec's plan is over it, TorchRec plans again with that much less memory
        cap = task.device_memory_bytes
        for attempt in range(ACCOUNTING_REPLANS + 1):
            try:
                with _data_parallel_specs_unwarned():
                    sharding_plan = _torchrec_planner(task, cap, constraints, self.timeout_s).plan(
                        ebc_on_meta(task), [EmbeddingBagCollectionSharder()])
            except PlannerError as err:
                raise PlanError(f"{self.name}: TorchRec's planner found no plan: {str(err).splitlines()[0]}"
                                + (f" (at {cap / 2**30:.3f} GiB a device, planning again within shardwise's memory "
                                   "accounting)" if attempt else "")) from None
            plan = plan_from_module_sharding(sharding_plan.plan[""], task.num_devices, self.name)
            over = max(plan_memory_bytes(plan, task)) - task.device_memory_bytes
            if over <= 0 or attempt == ACCOUNTING_REPLANS:
                break
            cap -= over + task.device_memory_bytes // 1000
        planner_s = time.perf_counter() - started
        plan = plan.model_copy(update={"extra": {"provenance": {"torchrec_planner_s": round(planner_s, 4),
                                                                "torchrec_hbm_cap": cap}}})
        if plan.data_parallel and cost_model is not None and all_reduce_of(cost_model) is None:
            cost_model = None  # no measured all-reduce to price its replicas with: the plan goes out unpriced
        if plan.row_wise and cost_model is not None and reduce_scatter_of(cost_model) is None:
            cost_model = None  # nor a measured reduce-scatter to price its row-wise tables with
        try:
            return finish_plan(
                plan, task, cost_model, planning_time_s=planner_s, seed=seed,
                options={"sharding_types": self.sharding_types, "min_partition": self.min_partition},
            )
        except PlanError as err:
            raise PlanError(f"{self.name}: TorchRec's plan is invalid under shardwise's accounting: {err}") from None


class _DataParallelSpecFilter(logging.Filter):
    """Drops TorchRec's "Sharding spec not found for .t" warning: its planner checks its own plan and warns on the
    root logger for every data-parallel table, which carries no sharding spec by design (a user planning with
    `torchrec_dp` got it once per table per attempt)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Sharding spec not found for ")


@contextlib.contextmanager
def _data_parallel_specs_unwarned() -> Iterator[None]:
    """TorchRec's planner without its warning on data-parallel tables (`_DataParallelSpecFilter`)."""
    root, spec_filter = logging.getLogger(), _DataParallelSpecFilter()
    root.addFilter(spec_filter)
    try:
        yield
    finally:
        root.removeFilter(spec_filter)


def _torchrec_planner(task: ShardingTask, hbm_cap: int, constraints: dict[str, Any], timeout_s: int | None) -> Any:
    """TorchRec's EmbeddingShardingPlanner for `task`'s devices with `hbm_cap` each, no storage reserved."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation

    # "cuda": a "cpu" topology drops HBM and the sharding options compared here; the explicit constructor is the
    # documented way to set hbm_cap, so its advisory warning is silenced
    types_logger = logging.getLogger("torchrec.distributed.planner.types")
    level = types_logger.level
    types_logger.setLevel(logging.ERROR)
    try:
        topology = Topology(world_size=task.num_devices, compute_device="cuda", hbm_cap=hbm_cap)
    finally:
        types_logger.setLevel(level)
    return EmbeddingShardingPlanner(
        topology=topology,
        batch_size=math.ceil(task.batch_size / task.num_devices),  # TorchRec's is per rank, a task's global
        storage_reservation=FixedPercentageStorageReservation(0.0),
        constraints=constraints,
        debug=False,
        timeout_seconds=timeout_s,
    )


register_method(MethodSpec(
    name="torchrec", factory=lambda options: TorchRecPlannerSearch(), options=NoOptions,
    description="TorchRec's EmbeddingShardingPlanner, table-wise",
))
register_method(MethodSpec(
    name="torchrec_cw", factory=lambda options: TorchRecPlannerSearch(column_wise=True), options=NoOptions,
    description="TorchRec's EmbeddingShardingPlanner, table-wise and column-wise",
))
register_method(MethodSpec(
    name="torchrec_dp", factory=lambda options: TorchRecPlannerSearch(data_parallel=True), options=NoOptions,
    description="TorchRec's EmbeddingShardingPlanner, table-wise, column-wise and data-parallel",
))
register_method(MethodSpec(
    name="torchrec_rw", factory=lambda options: TorchRecPlannerSearch(row_wise=True), options=NoOptions,
    description="TorchRec's EmbeddingShardingPlanner, table-wise, column-wise, data-parallel and row-wise "
                "(NeuroShard's types)",
))
