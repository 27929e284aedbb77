"""shardwise plans in TorchRec's terms and back: `ShardingPlan` export for `DistributedModelParallel` (a plan's
data-parallel tables as TorchRec's data-parallel sharding, and the row-wise and data-parallel shardings the drop-in
planner emits for tables restricted to them; a table in host memory with its UVM kernel and `CacheParams`), import of
TorchRec's table-wise and column-wise module plans, and a task's tables as a meta-device EmbeddingBagCollection.

    DistributedModelParallel(model, plan=to_sharding_plan(plan, task, module_path="ebc"))

torchrec (and torch) are imported inside each function: torchrec is heavy (seconds to import) and optional for most
commands, while this module is imported with every `shardwise.search` (the torchrec baseline registers from it), which
a command's options (`plan --help`) import without torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from shardwise.workload import Optimizer, ShardingTask, row_wise_rows

from .plan import Plan, PlanError, Shard, TableKernel, validate_plan

if TYPE_CHECKING:
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

#: a table in HBM runs fbgemm's fused TBE, optimizer in backward (a plan's `kernels` name those in host memory)
COMPUTE_KERNEL = "fused"
#: the cache TorchRec and fbgemm give a "fused_uvm_caching" table whose sharding names no load factor
#: (torchrec.distributed.planner.constants.UVM_CACHING_RATIO)
DEFAULT_CACHE_LOAD_FACTOR = 0.2
#: TorchRec's data-parallel sharding runs only the dense kernel (replicated weights, gradients all-reduced)
DATA_PARALLEL_KERNEL = "dense"


def parameter_sharding(
    shards: Sequence[Shard], rows: int, *, device_type: str = "cuda", local_world_size: int | None = None,
    kernel: TableKernel | None = None,
) -> ParameterSharding:
    """One table's shards as a TorchRec `ParameterSharding` (table-wise, or column-wise for slices), on `kernel`
    (its compute kernel and, for "fused_uvm_caching", `CacheParams(load_factor=...)`; None: "fused")."""
    # torchrec: heavy, optional for most commands (see the module docstring); torch.distributed's sharding specs
    # only where a plan is exported (they took 14 ms of `shardwise plan`, which never exports)
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
    from torchrec.distributed.sharding_plan import placement
    from torchrec.distributed.types import CacheParams, ParameterSharding

    ordered = sorted(shards, key=lambda s: s.col_offset)
    local = local_world_size or max(s.device for s in ordered) + 1
    spec = EnumerableShardingSpec(
        [
            ShardMetadata(
                shard_offsets=[0, s.col_offset],
                shard_sizes=[rows, s.dim],
                placement=placement(device_type, s.device, local),
            )
            for s in ordered
        ]
    )
    load_factor = kernel.cache_load_factor if kernel is not None else None
    return ParameterSharding(
        sharding_type="table_wise" if len(ordered) == 1 else "column_wise",
        compute_kernel=kernel.kernel if kernel is not None else COMPUTE_KERNEL,
        ranks=[s.device for s in ordered],
        sharding_spec=spec,
        cache_params=CacheParams(load_factor=load_factor) if load_factor is not None else None,
    )


def to_module_sharding_plan(
    plan: Plan,
    task: ShardingTask,
    *,
    tables: Mapping[str, str] | Sequence[str] | None = None,
    device_type: str = "cuda",
    local_world_size: int | None = None,
) -> EmbeddingModuleShardingPlan:
    """An `EmbeddingModuleShardingPlan` for one embedding collection: its `tables` (task names, or a mapping of
    task name -> the module's table name where they differ; default all of the task's)."""
    from torchrec.distributed.types import EmbeddingModuleShardingPlan  # torchrec: heavy, optional

    if tables is None:
        tables = [t.name for t in task.tables]
    renamed = dict(tables) if isinstance(tables, Mapping) else {name: name for name in tables}
    by_table: dict[str, list[Shard]] = {}
    for s in plan.shards:
        if s.table in renamed:
            by_table.setdefault(s.table, []).append(s)
    local = local_world_size or plan.num_devices
    module_plan = {
        renamed[name]: parameter_sharding(shards, task.table(name).rows, device_type=device_type, local_world_size=local,
                                          kernel=plan.kernels.get(name))
        for name, shards in by_table.items()
    }
    module_plan |= {renamed[name]: data_parallel_sharding(plan.num_devices)
                    for name in plan.data_parallel if name in renamed}
    module_plan |= {renamed[name]: row_wise_sharding(task.table(name).rows, task.table(name).dim, plan.num_devices,
                                                     device_type=device_type, local_world_size=local)
                    for name in plan.row_wise if name in renamed}
    return EmbeddingModuleShardingPlan(module_plan)


def row_wise_sharding(
    rows: int, dim: int, world_size: int, *, device_type: str = "cuda", local_world_size: int | None = None
) -> ParameterSharding:
    """A table split by rows over every rank as TorchRec's row-wise sharding lays it out (fused kernel)."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
    from torchrec.distributed.sharding_plan import placement  # torchrec: heavy, optional
    from torchrec.distributed.types import ParameterSharding

    local = local_world_size or world_size
    sizes = row_wise_rows(rows, world_size)
    offsets = [sum(sizes[:rank]) for rank in range(world_size)]
    spec = EnumerableShardingSpec([
        ShardMetadata(shard_offsets=[offset, 0], shard_sizes=[size, dim], placement=placement(device_type, rank, local))
        for rank, (offset, size) in enumerate(zip(offsets, sizes, strict=True))
    ])
    return ParameterSharding(sharding_type="row_wise", compute_kernel=COMPUTE_KERNEL, ranks=list(range(world_size)),
                             sharding_spec=spec)


def data_parallel_sharding(world_size: int) -> ParameterSharding:
    """A table replicated on every rank (TorchRec's data-parallel sharding runs the dense kernel)."""
    from torchrec.distributed.types import ParameterSharding  # torchrec: heavy, optional

    return ParameterSharding(sharding_type="data_parallel", compute_kernel=DATA_PARALLEL_KERNEL,
                             ranks=list(range(world_size)))


def to_sharding_plan(
    plan: Plan,
    task: ShardingTask,
    *,
    module_path: str = "",
    device_type: str = "cuda",
    local_world_size: int | None = None,
) -> ShardingPlan:
    """A TorchRec `ShardingPlan` placing the `EmbeddingBagCollection` at `module_path` as `plan` says."""
    from torchrec.distributed.types import ShardingPlan  # torchrec: heavy, optional

    validate_plan(plan, task)
    return ShardingPlan(
        {
            module_path: to_module_sharding_plan(
                plan, task, device_type=device_type, local_world_size=local_world_size
            )
        }
    )


def plan_from_module_sharding(module_plan: EmbeddingModuleShardingPlan, num_devices: int, method: str) -> Plan:
    """A TorchRec `EmbeddingModuleShardingPlan` (table-wise / column-wise / data-parallel / row-wise over every rank
    in ceil(rows / ranks) blocks) as a shardwise plan, with the tables on UVM kernels and their caches' load factors."""
    shards: list[Shard] = []
    replicated: list[str] = []
    by_rows: list[str] = []
    kernels: dict[str, TableKernel] = {}
    for table, sharding in module_plan.items():
        if sharding.compute_kernel in ("fused_uvm_caching", "fused_uvm") and sharding.sharding_type in ("table_wise",
                                                                                                         "column_wise"):
            kernels[table] = _table_kernel(sharding)
        if sharding.sharding_type == "data_parallel":
            replicated.append(table)
            continue
        if sharding.sharding_type == "row_wise":
            assert sharding.sharding_spec is not None  # row-wise shardings always carry one
            metas = sorted(sharding.sharding_spec.shards, key=lambda m: m.placement.rank())  # type: ignore[attr-defined]
            sizes = [m.shard_sizes[0] for m in metas if m.shard_sizes[0]]
            if sizes != [r for r in row_wise_rows(sum(sizes), num_devices) if r]:
                raise PlanError(f"table {table!r}: row-wise blocks {sizes} are not ceil(rows / {num_devices}) in rank "
                                "order (shardwise's row-wise layout)")
            by_rows.append(table)
            continue
        if sharding.sharding_type not in ("table_wise", "column_wise"):
            raise PlanError(f"table {table!r}: sharding type {sharding.sharding_type!r} has no shardwise form")
        assert sharding.sharding_spec is not None  # table-wise and column-wise shardings always carry one
        for meta in sharding.sharding_spec.shards:  # type: ignore[attr-defined]
            row_offset, col_offset = meta.shard_offsets
            if row_offset != 0:
                raise PlanError(f"table {table!r}: row-split shards have no shardwise form")
            shards.append(
                Shard(table=table, col_offset=col_offset, dim=meta.shard_sizes[1], device=meta.placement.rank())
            )
    return Plan(num_devices=num_devices, shards=tuple(shards), data_parallel=tuple(replicated),
                row_wise=tuple(by_rows), kernels=kernels, method=method)


def _table_kernel(sharding: ParameterSharding) -> TableKernel:
    """A UVM sharding's kernel and its cache's load factor (TorchRec's default where its `CacheParams` set none)."""
    if sharding.compute_kernel == "fused_uvm":
        return TableKernel(kernel="fused_uvm")
    cache = sharding.cache_params
    load_factor = cache.load_factor if cache is not None and cache.load_factor is not None else None
    return TableKernel(kernel="fused_uvm_caching", cache_load_factor=load_factor or DEFAULT_CACHE_LOAD_FACTOR)


def _optimizer_class(optimizer: Optimizer) -> type:
    """The torch optimizer class TorchRec's storage estimator reads for `optimizer`."""
    import torch
    from torchrec.optim import RowWiseAdagrad  # torchrec: heavy, optional

    return {"rowwise_adagrad": RowWiseAdagrad, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}[optimizer]


def ebc_on_meta(task: ShardingTask) -> EmbeddingBagCollection:
    """The task's tables as an `EmbeddingBagCollection` on the meta device (one feature per table)."""
    import torch
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig  # torchrec: heavy, optional
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    data_type = DataType.FP16 if task.weights_precision == "fp16" else DataType.FP32
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[t.name], data_type=data_type
            )
            for t in task.tables
        ],
        device=torch.device("meta"),
    )
    optimizer = _optimizer_class(task.optimizer)
    for param in ebc.parameters():
        # TorchRec's storage estimator reads the optimizer from this attribute (set by its fused optimizers)
        param._optimizer_classes = [optimizer]  # type: ignore[attr-defined]
    return ebc
