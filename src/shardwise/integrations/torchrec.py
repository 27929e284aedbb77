"""shardwise plans for TorchRec: `ShardwisePlanner`, a drop-in `ShardingPlanner`, and (re-exported from
`shardwise.search.torchrec_plan`, where they live) the export to `ShardingPlan`.

`DistributedModelParallel(model, plan=ShardwisePlanner(topology, batch_size=...).collective_plan(model, sharders,
pg))`, or `DistributedModelParallel(model, plan=to_sharding_plan(plan, task, module_path="ebc"))`. This module
needs TorchRec (the `torchrec` extra); docs/torchrec.md says what is honoured and what is refused.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.types import ShardingPlan, ShardingPlanner
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from shardwise.costmodel.types import CostModel
from shardwise.errors import ShardwiseError
from shardwise.profiling import hardware_kind
from shardwise.search import Plan, PlanError, Searcher, format_plan, get_method, make_searcher
from shardwise.search.torchrec_plan import (
    COMPUTE_KERNEL,
    ebc_on_meta,
    parameter_sharding,
    plan_from_module_sharding,
    to_module_sharding_plan,
    to_sharding_plan,
)
from shardwise.workload import Optimizer, ShardingTask, TableSpec

from .mlflow import MlflowService, champion_uri, cost_model_name

__all__ = [
    "COMPUTE_KERNEL",
    "DEFAULT_STORAGE_RESERVATION",
    "PlannerError",
    "ShardwisePlanner",
    "ebc_on_meta",
    "embedding_bag_collections",
    "parameter_sharding",
    "plan_from_module_sharding",
    "to_module_sharding_plan",
    "to_sharding_plan",
]


log = logging.getLogger("shardwise.torchrec")

#: the share of each device's memory kept free for dense parameters, activations and the allocator: TorchRec's
#: planner reserves 15% by default (HeuristicalStorageReservation(percentage=0.15)) before placing tables
DEFAULT_STORAGE_RESERVATION = 0.15
#: the sharding types shardwise plans (a whole table on one rank, or column slices on several)
PLANNED_SHARDING_TYPES = ("table_wise", "column_wise")


class PlannerError(PlanError):
    """A model or constraint the drop-in planner cannot honour: names the table and what shardwise cannot do."""


def embedding_bag_collections(module: nn.Module) -> dict[str, Any]:
    """Every `EmbeddingBagCollection` in `module` by its module path ("" for `module` itself)."""
    return {path: m for path, m in module.named_modules() if isinstance(m, EmbeddingBagCollection)}


def _unplanned_modules(module: nn.Module) -> dict[str, str]:
    """Embedding modules shardwise does not plan (sequence `EmbeddingCollection`s), by path -> type name."""
    return {path: type(m).__name__ for path, m in module.named_modules() if isinstance(m, EmbeddingCollection)}


class ShardwisePlanner(ShardingPlanner):
    """A TorchRec `ShardingPlanner` (`plan`, `collective_plan`) backed by a shardwise search method.

    Hardware from a TorchRec `Topology` as `EmbeddingShardingPlanner` takes it (world size, local world size,
    HBM per device, compute device), or from the keyword arguments; `storage_reservation` of each device's memory
    is kept free as TorchRec's planner does. Tables (rows, dim, names) come from the module's
    `EmbeddingBagCollection`s; pooling factors from `task` when given (matched by table name), else from TorchRec
    `ParameterConstraints.pooling_factors` (summed over the features a table serves), else 1.0 as in TorchRec.
    The cost model is `cost_model` (an object, a directory or a models:/ URI), else this hardware's champion in
    the MLflow registry. `last_plan`, `last_task` and `last_stats` describe the last plan."""

    def __init__(
        self,
        topology: Any = None,
        batch_size: int | None = None,
        *,
        constraints: Mapping[str, Any] | None = None,
        storage_reservation: float = DEFAULT_STORAGE_RESERVATION,
        method: str = "neuroshard",
        cost_model: CostModel | str | Path | None = None,
        tracking_uri: str | None = None,
        task: ShardingTask | None = None,
        optimizer: Optimizer = "rowwise_adagrad",
        seed: int = 0,
        searcher: Searcher | None = None,
        world_size: int | None = None,
        local_world_size: int | None = None,
        device_memory_bytes: int | None = None,
        device_type: str | None = None,
    ) -> None:
        if not 0.0 <= storage_reservation < 1.0:
            raise PlannerError(f"storage_reservation {storage_reservation}: a share of memory in [0, 1)")
        hbm = topology.devices[0].storage.hbm if topology is not None else None
        self.world_size = world_size or (topology.world_size if topology is not None else None) or (
            task.num_devices if task else None)
        self.device_type = device_type or (topology.compute_device if topology is not None else None) or (
            "cuda" if torch.cuda.is_available() else "cpu")
        self.local_world_size = local_world_size or (topology.local_world_size if topology is not None else None)
        #: each device's memory before the reservation (a task's budget is taken as it is)
        self.device_memory_bytes = device_memory_bytes or hbm
        self.storage_reservation = storage_reservation
        self.batch_size = batch_size or (task.batch_size if task else None)
        self.method = method
        self.cost_model = cost_model
        self.tracking_uri = tracking_uri
        self.task = task
        self.constraints = dict(constraints or {})
        self.optimizer: Optimizer = task.optimizer if task else optimizer
        self.seed = seed
        self.searcher = searcher or make_searcher(method)
        #: the shardwise plan behind the last returned ShardingPlan (with predicted costs in `extra`)
        self.last_plan: Plan | None = None
        self.last_task: ShardingTask | None = None
        #: the per-rank table logged for the last plan (shards, columns, memory, predicted ms)
        self.last_stats: str | None = None

    # -- what is planned -------------------------------------------------------------------------------------
    def _pooling_factor(self, name: str) -> float:
        constraint = self.constraints.get(name)
        factors = getattr(constraint, "pooling_factors", None)
        # a table serving several features is looked up once per feature: its lookups add up
        return float(sum(factors)) if factors else 1.0

    def _table_spec(self, name: str, rows: int, dim: int) -> TableSpec:
        if self.task is not None and name in {t.name for t in self.task.tables}:
            given = self.task.table(name)
            if (given.rows, given.dim) != (rows, dim):
                raise PlannerError(
                    f"table {name!r}: the module has {rows} rows x dim {dim}, the task says "
                    f"{given.rows} x {given.dim}"
                )
            return given
        return TableSpec(name=name, rows=rows, dim=dim, pooling_factor=self._pooling_factor(name))

    def _check_constraints(self, names: Sequence[str]) -> None:
        """Refuse, naming the table, what shardwise cannot plan: other kernels and other sharding types."""
        for name in names:
            constraint = self.constraints.get(name)
            if constraint is None:
                continue
            kernels = getattr(constraint, "compute_kernels", None)
            if kernels and COMPUTE_KERNEL not in kernels:
                raise PlannerError(
                    f"table {name!r}: compute_kernels {list(kernels)} exclude {COMPUTE_KERNEL!r}, the only kernel "
                    "shardwise plans and costs (fbgemm's fused table-batched kernel)"
                )
            types = getattr(constraint, "sharding_types", None)
            if types and not set(types) & set(PLANNED_SHARDING_TYPES):
                raise PlannerError(
                    f"table {name!r}: sharding_types {list(types)}: shardwise plans {' and '.join(PLANNED_SHARDING_TYPES)} "
                    "only (row-wise and data-parallel are not planned yet); allow one of them or plan this model "
                    "with TorchRec's EmbeddingShardingPlanner"
                )

    def _check_plan_constraints(self, plan: Plan) -> None:
        """Column splits the constraints forbid (no column_wise, or narrower than min_partition) are refused."""
        for name, constraint in self.constraints.items():
            widths = [s.dim for s in plan.shards if s.table == name]
            if len(widths) < 2:
                continue
            types = getattr(constraint, "sharding_types", None)
            if types and "column_wise" not in types:
                raise PlannerError(
                    f"table {name!r}: the {plan.method} plan splits it column-wise, which its sharding_types "
                    f"{list(types)} forbid; allow column_wise, or plan with a table-wise method (method='size_greedy')"
                )
            least = getattr(constraint, "min_partition", None)
            if least and min(widths) < least:
                raise PlannerError(
                    f"table {name!r}: the {plan.method} plan splits it into {min(widths)}-column shards, under its "
                    f"min_partition {least}; lower min_partition or plan with a table-wise method"
                )

    def _local_world_size(self, world_size: int) -> int:
        """Ranks per host: as given or in the topology, else $LOCAL_WORLD_SIZE (torchrun), else this host's GPUs,
        else one host (rank r runs on cuda:r % local world size)."""
        if self.local_world_size:
            return self.local_world_size
        if os.environ.get("LOCAL_WORLD_SIZE", "").isdigit():
            return int(os.environ["LOCAL_WORLD_SIZE"])
        if self.device_type == "cuda" and torch.cuda.is_available():
            return min(world_size, torch.cuda.device_count())
        return world_size

    def resolved_cost_model(self) -> CostModel | None:
        """The cost model to plan with: the one given, loaded from a directory or URI, else the champion."""
        if self.cost_model is not None and not isinstance(self.cost_model, str | Path):
            return self.cost_model
        if self.cost_model is None and not get_method(self.method).needs_cost_model:
            return None
        service = MlflowService(self.tracking_uri)
        uri = str(self.cost_model) if self.cost_model is not None else champion_uri(
            cost_model_name(hardware_kind(self.device_type)))
        try:
            model = service.load_cost_model(uri)
        except (ShardwiseError, ValueError, OSError) as err:  # RegistryError, ModelFileError, a damaged file
            raise PlannerError(
                f"ShardwisePlanner: no cost model at {uri} ({err}); make one with `make run` or `shardwise pretrain`,"
                " or pass cost_model=DIR or a models:/ URI"
            ) from None
        self.cost_model = model  # loaded once per planner
        return model

    def task_for(self, module: nn.Module, sharders: Sequence[Any] | None = None) -> tuple[ShardingTask, dict[str, list[str]]]:
        """The sharding task of `module`'s embedding-bag tables, and each collection's table names."""
        if sharders is not None and not any(getattr(s, "module_type", None) is EmbeddingBagCollection for s in sharders):
            raise PlannerError("no EmbeddingBagCollection sharder among `sharders`: nothing shardwise plans is shardable")
        for path, kind in _unplanned_modules(module).items():
            log.warning("ShardwisePlanner: %s at %r is not planned (shardwise plans EmbeddingBagCollection "
                        "tables); plan it with TorchRec's EmbeddingShardingPlanner", kind, path or "<root>")
        collections = embedding_bag_collections(module)
        if not collections:
            raise PlannerError("the module has no EmbeddingBagCollection to shard")
        world_size = self.world_size
        if world_size is None and dist.is_initialized():
            world_size = dist.get_world_size()
        memory = self.device_memory_bytes
        if memory is None and self.device_type == "cuda" and torch.cuda.is_available():
            memory = torch.cuda.get_device_properties(0).total_memory
        budget = None if memory is None else int(memory * (1.0 - self.storage_reservation))
        if self.task is not None and self.device_memory_bytes is None:
            budget = self.task.device_memory_bytes  # a shardwise task states its budget already
        missing = [n for n, v in (("world_size", world_size), ("device_memory_bytes (or a topology)", budget),
                                  ("batch_size", self.batch_size)) if v is None]
        if world_size is None or budget is None or self.batch_size is None:
            raise PlannerError(f"ShardwisePlanner needs {', '.join(missing)} (pass them, or a task)")
        tables: list[TableSpec] = []
        names: dict[str, list[str]] = {}
        for path, ebc in collections.items():
            names[path] = []
            for config in ebc.embedding_bag_configs():
                tables.append(self._table_spec(config.name, config.num_embeddings, config.embedding_dim))
                names[path].append(config.name)
        self._check_constraints([t.name for t in tables])
        task = ShardingTask(
            num_devices=world_size,
            device_memory_bytes=budget,
            batch_size=self.batch_size,
            tables=tuple(tables),
            optimizer=self.optimizer,
        )
        return task, names

    # -- TorchRec's interface ----------------------------------------------------------------------------------
    def plan(self, module: nn.Module, sharders: Sequence[Any] | None = None) -> Any:
        """A `ShardingPlan` for every `EmbeddingBagCollection` in `module` (`sharders` as TorchRec passes them)."""
        task, names = self.task_for(module, sharders)
        plan = self.searcher.search(task, self.resolved_cost_model(), self.seed)
        self._check_plan_constraints(plan)
        self.last_plan, self.last_task = plan, task
        local = self._local_world_size(task.num_devices)
        reserved = f", {self.storage_reservation:.0%} of memory reserved" if self.device_memory_bytes else ""
        self.last_stats = (f"ShardwisePlanner: {len(task.tables)} tables on {task.num_devices} ranks "
                           f"({local} per host{reserved})\n{format_plan(plan)}")
        log.info("%s", self.last_stats)
        return ShardingPlan(
            {
                path: to_module_sharding_plan(
                    plan, task, tables=tables, device_type=self.device_type, local_world_size=local,
                )
                for path, tables in names.items()
            }
        )

    def collective_plan(self, module: nn.Module, sharders: Sequence[Any] | None = None, pg: Any = None) -> Any:
        """`plan` on rank 0, broadcast to every rank of `pg` (so all ranks shard identically)."""
        if not dist.is_initialized():
            return self.plan(module, sharders)
        group = pg if pg is not None else dist.group.WORLD
        assert group is not None  # initialised above
        holder: list[Any] = [self.plan(module, sharders) if dist.get_rank(group) == 0 else None]
        dist.broadcast_object_list(holder, src=dist.get_global_rank(group, 0), group=group)
        return holder[0]
