"""shardwise plans for TorchRec: `ShardwisePlanner`, a drop-in planner, and (re-exported from
`shardwise.search.torchrec_plan`, where they live) the export to `ShardingPlan`.

`DistributedModelParallel(model, plan=to_sharding_plan(plan, task, module_path="ebc"))`, or
`DistributedModelParallel(model, plan=ShardwisePlanner(...).collective_plan(model, sharders))`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from shardwise.costmodel.types import CostModel
from shardwise.search import Plan, PlanError, Searcher, make_searcher
from shardwise.search.torchrec_plan import (
    COMPUTE_KERNEL,
    ebc_on_meta,
    parameter_sharding,
    plan_from_module_sharding,
    to_module_sharding_plan,
    to_sharding_plan,
)
from shardwise.workload import Optimizer, ShardingTask, TableSpec

__all__ = [
    "COMPUTE_KERNEL",
    "ShardwisePlanner",
    "ebc_on_meta",
    "embedding_bag_collections",
    "parameter_sharding",
    "plan_from_module_sharding",
    "to_module_sharding_plan",
    "to_sharding_plan",
]


def embedding_bag_collections(module: nn.Module) -> dict[str, Any]:
    """Every `EmbeddingBagCollection` in `module` by its module path ("" for `module` itself)."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection  # heavy: only when planning a model

    return {path: m for path, m in module.named_modules() if isinstance(m, EmbeddingBagCollection)}


class ShardwisePlanner:
    """TorchRec's planner call shape (`plan`, `collective_plan`) backed by a shardwise search method.

    Tables (rows, dim, names) come from the module's `EmbeddingBagCollection`s; pooling factors and
    access skew from `task` when given (matched by table name), else from TorchRec `ParameterConstraints`
    (`pooling_factors`), else 1.0 as in TorchRec's planner."""

    def __init__(
        self,
        *,
        world_size: int | None = None,
        device_memory_bytes: int | None = None,
        batch_size: int | None = None,
        method: str = "neuroshard",
        cost_model: CostModel | None = None,
        task: ShardingTask | None = None,
        constraints: Mapping[str, Any] | None = None,
        optimizer: Optimizer = "rowwise_adagrad",
        device_type: str | None = None,
        local_world_size: int | None = None,
        seed: int = 0,
        searcher: Searcher | None = None,
    ) -> None:
        self.world_size = world_size or (task.num_devices if task else None)
        self.device_memory_bytes = device_memory_bytes or (task.device_memory_bytes if task else None)
        self.batch_size = batch_size or (task.batch_size if task else None)
        self.cost_model = cost_model
        self.task = task
        self.constraints = dict(constraints or {})
        self.optimizer: Optimizer = task.optimizer if task else optimizer
        self.device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
        self.local_world_size = local_world_size
        self.seed = seed
        self.searcher = searcher or make_searcher(method)
        #: the shardwise plan behind the last returned ShardingPlan (with predicted costs in `extra`)
        self.last_plan: Plan | None = None
        self.last_task: ShardingTask | None = None

    def _table_spec(self, name: str, rows: int, dim: int) -> TableSpec:
        if self.task is not None and name in {t.name for t in self.task.tables}:
            given = self.task.table(name)
            if (given.rows, given.dim) != (rows, dim):
                raise PlanError(
                    f"table {name!r}: the module has {rows} rows x dim {dim}, the task says "
                    f"{given.rows} x {given.dim}"
                )
            return given
        pooling = 1.0
        constraint = self.constraints.get(name)
        if constraint is not None and getattr(constraint, "pooling_factors", None):
            pooling = float(constraint.pooling_factors[0])
        return TableSpec(name=name, rows=rows, dim=dim, pooling_factor=pooling)

    def task_for(self, module: nn.Module) -> tuple[ShardingTask, dict[str, list[str]]]:
        """The sharding task of `module`'s embedding-bag tables, and each collection's table names."""
        collections = embedding_bag_collections(module)
        if not collections:
            raise PlanError("the module has no EmbeddingBagCollection to shard")
        world_size = self.world_size
        if world_size is None and torch.distributed.is_initialized():
            world_size = torch.distributed.get_world_size()
        memory = self.device_memory_bytes
        if memory is None and self.device_type == "cuda" and torch.cuda.is_available():
            memory = torch.cuda.get_device_properties(0).total_memory
        missing = [n for n, v in (("world_size", world_size), ("device_memory_bytes", memory),
                                  ("batch_size", self.batch_size)) if v is None]
        if world_size is None or memory is None or self.batch_size is None:
            raise PlanError(f"ShardwisePlanner needs {', '.join(missing)} (pass them, or a task)")
        tables: list[TableSpec] = []
        names: dict[str, list[str]] = {}
        for path, ebc in collections.items():
            names[path] = []
            for config in ebc.embedding_bag_configs():
                tables.append(self._table_spec(config.name, config.num_embeddings, config.embedding_dim))
                names[path].append(config.name)
        task = ShardingTask(
            num_devices=world_size,
            device_memory_bytes=memory,
            batch_size=self.batch_size,
            tables=tuple(tables),
            optimizer=self.optimizer,
        )
        return task, names

    def plan(self, module: nn.Module, sharders: Sequence[Any] | None = None) -> Any:
        """A `ShardingPlan` for every `EmbeddingBagCollection` in `module` (`sharders` as TorchRec passes them)."""
        from torchrec.distributed.types import ShardingPlan  # heavy: only when planning a model

        task, names = self.task_for(module)
        plan = self.searcher.search(task, self.cost_model, self.seed)
        self.last_plan, self.last_task = plan, task
        return ShardingPlan(
            {
                path: to_module_sharding_plan(
                    plan, task, tables=tables, device_type=self.device_type,
                    local_world_size=self.local_world_size,
                )
                for path, tables in names.items()
            }
        )

    def collective_plan(self, module: nn.Module, sharders: Sequence[Any] | None = None, pg: Any = None) -> Any:
        """`plan` on rank 0, broadcast to every rank of `pg` (so all ranks shard identically)."""
        import torch.distributed as dist  # only when planning collectively

        if not dist.is_initialized():
            return self.plan(module, sharders)
        group = pg if pg is not None else dist.group.WORLD
        assert group is not None  # initialised above
        holder: list[Any] = [self.plan(module, sharders) if dist.get_rank(group) == 0 else None]
        dist.broadcast_object_list(holder, src=dist.get_global_rank(group, 0), group=group)
        return holder[0]
