"""shardwise plans for TorchRec: `ShardwisePlanner`, a drop-in `ShardingPlanner`, and (re-exported from
`shardwise.search.torchrec_plan`, where they live) the export to `ShardingPlan`.

`DistributedModelParallel(model, plan=ShardwisePlanner(topology, batch_size=...).collective_plan(model, sharders,
pg))`, or `DistributedModelParallel(model, plan=to_sharding_plan(plan, task, module_path="ebc"))`. This module
needs TorchRec (the `torchrec` extra); docs/torchrec.md says what is honoured and what is refused.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.sharding_plan import get_module_to_default_sharders
from torchrec.distributed.types import ShardingPlan, ShardingPlanner
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from shardwise.costmodel.model import NeuralCostModel
from shardwise.costmodel.types import CostModel, KnowsItsTraining
from shardwise.errors import ServiceError, ShardwiseError
from shardwise.profiling import MeasurementSettings, hardware_kind
from shardwise.search import Plan, PlanError, Searcher, format_plan, get_method, make_searcher
from shardwise.search.torchrec_plan import (
    COMPUTE_KERNEL,
    DATA_PARALLEL_KERNEL,
    data_parallel_sharding,
    ebc_on_meta,
    parameter_sharding,
    plan_from_module_sharding,
    row_wise_sharding,
    to_module_sharding_plan,
    to_sharding_plan,
)
from shardwise.workload import Optimizer, ShardingTask, TableSpec, WeightsPrecision, row_wise_rows
from shardwise.workload.memory import activation_buffer_bytes, table_memory_bytes

from .mlflow import MlflowService, champion_uri, cost_model_name

if TYPE_CHECKING:
    from shardwise.evaluation.adapt import AdaptRecord
    from shardwise.evaluation.refine import Refinement

__all__ = [
    "COMPUTE_KERNEL",
    "DEFAULT_STORAGE_RESERVATION",
    "ModuleTable",
    "PlannerError",
    "ShardwisePlanner",
    "ebc_on_meta",
    "planned_modules",
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
#: the sharding types emitted as TorchRec lays them out for tables restricted to them, in order of preference
EMITTED_SHARDING_TYPES = ("row_wise", "data_parallel")
GIB = 2**30
#: seconds of adaptation by default, where a task is outside the cost model's training and this machine is its
#: hardware: the 26 MLPerf DLRM-DCNv2 tables and a few hundred fused groups of them time within it on 2 CPU cores
DEFAULT_ADAPT_S = 120.0
#: seconds of refinement by default after adaptation ran (its plans are measured here, so they can be refined on
#: the same kernels and all-to-alls): adaptation and refinement of the DCNv2 tables within 3 minutes on 2 CPU cores
DEFAULT_REFINE_S = 50.0
#: refinement's rounds at most (its time budget ends it first)
REFINE_ROUNDS = 20
#: interleaved kernel timings per device shard while refining within that budget, as `make run`'s evaluate step
#: (presets.yaml `local`): 3 instead of MeasurementSettings' 9, whose side-by-side measurement of the starts ran past
#: the budget. bench_torchrec_dropin.py, the DCNv2 tables adapted for 120 s on 2 cores: 202 s of planning with 9
#: (2026-11-27 14:57 UTC), 158 s with 3 (17:56 UTC, with TorchRec's plan among the starts); paired comparisons keep
#: their meaning, two sessions' ratio moves about 2.8% instead of 1.1% (bench_measurement_noise.py)
REFINE_TIMING_ROUNDS = 3


class PlannerError(PlanError):
    """A model or constraint the drop-in planner cannot honour: names the table and what shardwise cannot do."""


#: the embedding modules shardwise plans: pooled bags, and sequence embeddings (one vector per id, not pooled)
PLANNED_MODULES: tuple[type[nn.Module], ...] = (EmbeddingBagCollection, EmbeddingCollection)


@dataclass(frozen=True)
class ModuleTable:
    """One embedding table of the model as the drop-in planner sees it."""

    path: str  #: the module path of its collection ("" for the model itself)
    name: str  #: its name in the collection (what TorchRec's plan and constraints key on)
    key: str  #: its name in the shardwise task: `name`, or `path.name` where two collections share a name
    rows: int
    dim: int
    sequence: bool  #: from an EmbeddingCollection: one output vector per id instead of one pooled vector
    sharding: str  #: "planned" (table-wise / column-wise by the search), "row_wise" or "data_parallel"


def _configs(collection: nn.Module) -> list[Any]:
    """The table configs of an EmbeddingBagCollection or EmbeddingCollection."""
    if isinstance(collection, EmbeddingBagCollection):
        return list(collection.embedding_bag_configs())
    return list(collection.embedding_configs())  # type: ignore[operator]


def planned_modules(module: nn.Module, sharders: Sequence[Any] | None) -> dict[str, nn.Module]:
    """The embedding collections to plan (those with a sharder; both kinds when `sharders` is None, as TorchRec's
    default sharders), by module path; the others TorchRec could shard are named in a warning."""
    allowed = PLANNED_MODULES if sharders is None else tuple(
        t for t in PLANNED_MODULES if any(getattr(s, "module_type", None) is t for s in sharders))
    if not allowed:
        raise PlannerError("no EmbeddingBagCollection or EmbeddingCollection sharder among `sharders`: nothing "
                           "shardwise plans is shardable")
    shardable = tuple(get_module_to_default_sharders())
    found: dict[str, nn.Module] = {}
    others: list[str] = []  # modules TorchRec shards whole: the collections inside them are theirs
    for path, child in module.named_modules():
        where = repr(path or "<root>")
        if any(path.startswith(f"{other}.") or not other for other in others):
            continue
        if type(child) in PLANNED_MODULES and isinstance(child, allowed):
            found[path] = child
        elif type(child) in PLANNED_MODULES:
            log.warning("ShardwisePlanner: %s at %s has no sharder in `sharders`: not planned, DMP leaves it "
                        "unsharded", type(child).__name__, where)
        elif isinstance(child, shardable):
            others.append(path)
            log.warning("ShardwisePlanner: %s at %s is not planned (shardwise plans EmbeddingBagCollection and "
                        "EmbeddingCollection tables); plan it with TorchRec's EmbeddingShardingPlanner",
                        type(child).__name__, where)
    return found


def _size(num_bytes: float) -> str:
    """Bytes in the largest unit that keeps them above 1 (never "0.00 GiB" for a few MiB)."""
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{num_bytes:.0f} bytes"


def _held_for(table: ModuleTable) -> str:
    """What every rank keeps for a table the search does not place, by its name."""
    if table.sharding == "planned":
        return f"the sequence outputs of {table.name!r}"
    return f"{table.sharding.replace('_', '-')} {table.name!r}"


class ShardwisePlanner(ShardingPlanner):
    """A TorchRec `ShardingPlanner` (`plan`, `collective_plan`) backed by a shardwise search method.

    Hardware from a TorchRec `Topology` as `EmbeddingShardingPlanner` takes it (world size, local world size,
    HBM per device, or DDR on a CPU topology as TorchRec's planner takes it, compute device), or from the keyword
    arguments; `storage_reservation` of each device's memory
    is kept free as TorchRec's planner does. Tables (rows, dim, names) come from the module's
    `EmbeddingBagCollection`s and `EmbeddingCollection`s; pooling factors (lookups per sample) from `task` when
    given (matched by table name), else from TorchRec `ParameterConstraints.pooling_factors` (summed over the
    features a table serves), else 1.0 as in TorchRec. Tables whose `sharding_types` allow neither table-wise nor
    column-wise are emitted row-wise or data-parallel, their memory taken off every rank's budget first.
    The cost model is `cost_model` (an object, a directory or a models:/ URI), else this hardware's champion in
    the MLflow registry. Where the task's tables lie outside what that model was trained on and this machine is
    its hardware, it is first adapted here for `adapt` seconds (default `DEFAULT_ADAPT_S`; 0: never): the tables
    timed alone and in fused groups, the model fine-tuned on them (`shardwise.evaluation.adapt`; the rows go to
    `adapt_dataset` when given). A plan of an adapted model is then refined on this machine's kernels and
    all-to-alls for `refine` seconds (default `DEFAULT_REFINE_S` after adaptation ran; 0: never; a number: also
    without adaptation), from the fastest of it and the greedy on measured single-table costs
    (`shardwise.evaluation.refine`). `last_plan`, `last_task`, `last_stats`, `last_adaptation` and
    `last_refinement` describe the last plan."""

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
        adapt: float | None = None,
        adapt_dataset: str | Path | None = None,
        refine: float | None = None,
    ) -> None:
        if not 0.0 <= storage_reservation < 1.0:
            raise PlannerError(f"storage_reservation {storage_reservation}: a share of memory in [0, 1)")
        if refine is not None and not (0.0 <= refine < math.inf):
            raise PlannerError(f"refine {refine}: seconds of refinement, >= 0 (0: off; None: {DEFAULT_REFINE_S:g} s "
                               "after adaptation ran)")
        if adapt is not None and not (0.0 <= adapt < math.inf):
            raise PlannerError(f"adapt {adapt}: seconds of adaptation, >= 0 (0: off; None: {DEFAULT_ADAPT_S:g} s where "
                               "the task is outside the cost model's training and the hardware is this machine's)")
        # a CPU topology's tables live in DDR (TorchRec gives it no HBM: hbm 0), a GPU's in HBM
        topology_memory = None if topology is None else (
            topology.devices[0].storage.ddr if topology.compute_device == "cpu" else topology.devices[0].storage.hbm)
        self.world_size = world_size or (topology.world_size if topology is not None else None) or (
            task.num_devices if task else None)
        self.device_type = device_type or (topology.compute_device if topology is not None else None) or (
            "cuda" if torch.cuda.is_available() else "cpu")
        self.local_world_size = local_world_size or (topology.local_world_size if topology is not None else None)
        #: each device's memory before the reservation (a task's budget is taken as it is)
        self.device_memory_bytes = device_memory_bytes or topology_memory
        self.storage_reservation = storage_reservation
        if batch_size is not None and batch_size < 1:
            raise PlannerError(f"batch_size {batch_size}: samples per rank, >= 1")
        #: samples per rank, as TorchRec's planners take `batch_size` (a shardwise task's batch is global: its
        #: batch over the ranks, rounded up)
        self.batch_size = batch_size or (math.ceil(task.batch_size / task.num_devices) if task else None)
        self.method = method
        self.cost_model = cost_model
        self.tracking_uri = tracking_uri
        self.task = task
        self.constraints = dict(constraints or {})
        self.optimizer: Optimizer = task.optimizer if task else optimizer
        self.weights_precision: WeightsPrecision = task.weights_precision if task else "fp32"
        self.seed = seed
        self.searcher = searcher or make_searcher(method)
        #: the shardwise plan behind the last returned ShardingPlan (with predicted costs in `extra`)
        self.last_plan: Plan | None = None
        self.last_task: ShardingTask | None = None
        #: the per-rank table logged for the last plan (shards, columns, memory, predicted ms)
        self.last_stats: str | None = None
        #: seconds to adapt the cost model on this machine before planning (None: when out of range, 0: never)
        self.adapt = adapt
        self.adapt_dataset = adapt_dataset
        #: what adaptation did for the last plan (None: it did not run)
        self.last_adaptation: AdaptRecord | None = None
        #: seconds to refine the searched plan on this machine (None: after adaptation ran, 0: never)
        self.refine = refine
        #: what refinement did for the last plan (None: it did not run)
        self.last_refinement: Refinement | None = None
        self._adapted_to: set[frozenset[TableSpec]] = set()  # the table sets adapted to

    # -- what is planned -------------------------------------------------------------------------------------
    def _pooling_factor(self, name: str) -> float:
        constraint = self.constraints.get(name)
        factors = getattr(constraint, "pooling_factors", None)
        # a table serving several features is looked up once per feature: its lookups add up
        return float(sum(factors)) if factors else 1.0

    def _table_spec(self, table: ModuleTable) -> TableSpec:
        if self.task is not None and table.key in {t.name for t in self.task.tables}:
            given = self.task.table(table.key)
            if (given.rows, given.dim) != (table.rows, table.dim):
                raise PlannerError(
                    f"table {table.key!r}: the module has {table.rows} rows x dim {table.dim}, the task says "
                    f"{given.rows} x {given.dim}"
                )
            return given
        return TableSpec(name=table.key, rows=table.rows, dim=table.dim, pooling_factor=self._pooling_factor(table.name))

    def _sharding_of(self, name: str) -> str:
        """How a table is sharded under its constraints: "planned" (table-wise / column-wise by the search),
        "row_wise" or "data_parallel" (emitted as TorchRec lays them out); what shardwise cannot do is refused."""
        constraint = self.constraints.get(name)
        types = list(getattr(constraint, "sharding_types", None) or PLANNED_SHARDING_TYPES)
        sharding = "planned" if set(types) & set(PLANNED_SHARDING_TYPES) else next(
            (t for t in EMITTED_SHARDING_TYPES if t in types), None)
        if sharding is None:
            raise PlannerError(
                f"table {name!r}: sharding_types {types}: shardwise plans {' and '.join(PLANNED_SHARDING_TYPES)} and "
                f"emits {' and '.join(EMITTED_SHARDING_TYPES)}; allow one of them or plan this model with TorchRec's "
                "EmbeddingShardingPlanner"
            )
        kernel = DATA_PARALLEL_KERNEL if sharding == "data_parallel" else COMPUTE_KERNEL
        kernels = getattr(constraint, "compute_kernels", None)
        if kernels and kernel not in kernels:
            what = ("TorchRec's data-parallel sharding runs" if sharding == "data_parallel" else
                    "the only kernel shardwise plans and costs (fbgemm's fused table-batched kernel) is")
            raise PlannerError(f"table {name!r}: compute_kernels {list(kernels)} exclude {kernel!r}: {what} {kernel!r}")
        return sharding

    def _check_plan_constraints(self, plan: Plan, tables: Sequence[ModuleTable]) -> None:
        """Column splits the constraints forbid (no column_wise, or narrower than min_partition), and data-parallel
        and row-wise tables they forbid (no data_parallel with the dense kernel, no row_wise with the fused one) are
        refused."""
        for table in tables:
            constraint = self.constraints.get(table.name)
            for sharding, names, kernel, what in (
                    ("data_parallel", plan.data_parallel, DATA_PARALLEL_KERNEL, "data-parallel"),
                    ("row_wise", plan.row_wise, COMPUTE_KERNEL, "row-wise")):
                if table.key not in names or constraint is None:
                    continue
                types = getattr(constraint, "sharding_types", None)
                kernels = getattr(constraint, "compute_kernels", None)
                if (types and sharding not in types) or (kernels and kernel not in kernels):
                    raise PlannerError(
                        f"table {table.name!r}: the {plan.method} plan makes it {what}, which its constraints "
                        f"(sharding_types {list(types or [])}, compute_kernels {list(kernels or [])}) forbid; allow "
                        f"{sharding} with the {kernel} kernel, or pass searcher=NeuroShardSearch({sharding}=False)"
                    )
            widths = [s.dim for s in plan.shards if s.table == table.key]
            if constraint is None or len(widths) < 2:
                continue
            types = getattr(constraint, "sharding_types", None)
            if types and "column_wise" not in types:
                raise PlannerError(
                    f"table {table.name!r}: the {plan.method} plan splits it column-wise, which its sharding_types "
                    f"{list(types)} forbid; allow column_wise, or plan with a table-wise method (method='size_greedy')"
                )
            least = getattr(constraint, "min_partition", None)
            if least and min(widths) < least:
                raise PlannerError(
                    f"table {table.name!r}: the {plan.method} plan splits it into {min(widths)}-column shards, under "
                    f"its min_partition {least}; lower min_partition or plan with a table-wise method"
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
        except ServiceError:  # the registry is down or refused: its own line says which, not "no cost model"
            raise
        except (ShardwiseError, ValueError, OSError) as err:  # RegistryError, ModelFileError, a damaged file
            raise PlannerError(
                f"ShardwisePlanner: no cost model at {uri} ({err}); make one with `make run` or `shardwise pretrain`,"
                " or pass cost_model=DIR or a models:/ URI"
            ) from None
        self.cost_model = model  # loaded once per planner
        return model

    def _adapted_cost_model(self, task: ShardingTask) -> CostModel | None:
        """The cost model to plan `task` with: adapted on this machine first (`adapt` seconds; by default where the
        task's tables lie outside what the model was trained on and this machine is the hardware it is for)."""
        model = self.resolved_cost_model()
        self.last_adaptation = None
        if self.adapt == 0 or model is None:
            return model
        # at the batch the model was profiled at: adaptation times there too, so only the tables can be new to it
        if self.adapt is None and (frozenset(task.tables) in self._adapted_to or not (
                isinstance(model, KnowsItsTraining) and model.outside_training(task.tables, model.batch_size))):
            return model
        # the measuring stack (fbgemm's kernels, the cost dataset, training) loads only where adaptation may run
        from shardwise.evaluation.adapt import AdaptError, adapt_cost_model, cannot_adapt_here

        reason = cannot_adapt_here(model, self.device_type)
        if reason and self.adapt is None:
            log.info("ShardwisePlanner: not adapting (%s)", reason)
            return model
        if reason:
            raise PlannerError(f"ShardwisePlanner(adapt={self.adapt:g}): {reason}")
        assert isinstance(model, NeuralCostModel)  # cannot_adapt_here refuses the others
        try:
            adapted, self.last_adaptation = adapt_cost_model(
                task, model, self.adapt or DEFAULT_ADAPT_S, seed=self.seed,
                measurement=MeasurementSettings(device=self.device_type), dataset=self.adapt_dataset)
        except AdaptError as err:
            raise PlannerError(f"ShardwisePlanner: {err}") from None
        self.cost_model = adapted  # the next plan of these tables needs no adaptation
        self._adapted_to.add(frozenset(task.tables))  # nor where fine-tuning did not help: it would not again
        return adapted

    def _refined(self, task: ShardingTask, plan: Plan, model: CostModel | None) -> Plan:
        """`plan` refined on this machine's kernels and all-to-alls for `refine` seconds (by default, where adaptation
        ran: its plans are measured here), from the fastest of it, the greedy on measured single-table costs and
        TorchRec's planner's plan of the same task, measured side by side."""
        budget = self.refine if self.refine is not None else DEFAULT_REFINE_S if self.last_adaptation else 0.0
        self.last_refinement = None
        if not budget or model is None:
            return plan
        # the measuring stack loads only where refinement runs
        from shardwise.evaluation.adapt import cannot_adapt_here
        from shardwise.evaluation.refine import measured_greedy_start, refine_plan, search_resplit

        reason = cannot_adapt_here(model, self.device_type)  # the same condition: this machine is the model's hardware
        if reason:
            raise PlannerError(f"ShardwisePlanner(refine={budget:g}): {reason.replace('adaptation', 'refinement')}")
        started = time.perf_counter()
        measurement = MeasurementSettings(device=self.device_type, timing_rounds=REFINE_TIMING_ROUNDS).for_cost_model(
            getattr(model, "reference_ms", None), model.batch_size)
        starts = measured_greedy_start(task, measurement)
        # TorchRec's planner's plan of the same task: refinement never returns one measured slower than it (none
        # where it finds no plan within this memory: its estimate counts more than shardwise's)
        with contextlib.suppress(PlanError):
            starts.append(make_searcher("torchrec").search(task, None, self.seed))
        refined, self.last_refinement = refine_plan(
            task, plan, model, measurement, rounds=REFINE_ROUNDS, starts=starts, progress=False,
            time_budget_s=max(budget - (time.perf_counter() - started), 1.0),
            resplit=search_resplit(self.searcher, task, model, self.seed))
        return refined

    def tables_of(self, module: nn.Module, sharders: Sequence[Any] | None = None) -> list[ModuleTable]:
        """Every table of the collections to plan, with its sharding under the constraints."""
        collections = planned_modules(module, sharders)
        if not collections:
            raise PlannerError("the module has no EmbeddingBagCollection or EmbeddingCollection to shard")
        tables: list[ModuleTable] = []
        keys: set[str] = set()
        for path, collection in collections.items():
            for config in _configs(collection):
                key = config.name if config.name not in keys else f"{path}.{config.name}"
                if key in keys:
                    raise PlannerError(f"table {config.name!r} appears twice in the collection at {path!r}")
                keys.add(key)
                tables.append(ModuleTable(
                    path=path, name=config.name, key=key, rows=config.num_embeddings, dim=config.embedding_dim,
                    sequence=isinstance(collection, EmbeddingCollection), sharding=self._sharding_of(config.name)))
        return tables

    def _emitted_bytes(self, tables: Sequence[ModuleTable], world_size: int) -> int:
        """Memory every rank keeps for what the search does not place: row-wise blocks and data-parallel replicas
        (the largest rank's), and the output of sequence tables beyond one vector per sample (wherever they land,
        so counted on every rank: never over memory)."""
        assert self.batch_size is not None  # checked by the caller
        batch = self._global_batch(world_size)
        reserved = 0
        for table in tables:
            # a sequence table outputs one vector per id; at least one per sample is what the planner counts
            lookups = max(1.0, self._pooling_factor(table.name)) if table.sequence else 1.0
            # a replica pools its rank's own samples; a row-wise block (and a shard placed by the search) the step's
            samples = self.batch_size if table.sharding == "data_parallel" else batch
            outputs = activation_buffer_bytes(samples, math.ceil(lookups * table.dim))
            if table.sharding == "row_wise":
                reserved += table_memory_bytes(row_wise_rows(table.rows, world_size)[0], table.dim, self.optimizer,
                                               self.weights_precision)
            elif table.sharding == "data_parallel":
                reserved += table_memory_bytes(table.rows, table.dim, self.optimizer, self.weights_precision)
            else:
                outputs -= activation_buffer_bytes(batch, table.dim)  # the planner counts one vector
            reserved += outputs
        return reserved

    def _global_batch(self, world_size: int) -> int:
        """The samples of one step over every rank: a shardwise task's batch (a given task's own)."""
        assert self.batch_size is not None  # checked by the caller
        if self.task is not None and self.task.num_devices == world_size:
            return self.task.batch_size
        return self.batch_size * world_size

    def task_for(self, tables: Sequence[ModuleTable]) -> tuple[ShardingTask, int]:
        """The sharding task of the tables the search places, on each rank's memory left by the rest; and the
        bytes every rank keeps for the rest (`_emitted_bytes`)."""
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
        planned = [t for t in tables if t.sharding == "planned"]
        if not planned:
            raise PlannerError("every table is restricted to row-wise or data-parallel sharding: nothing for shardwise "
                               "to plan; use TorchRec's EmbeddingShardingPlanner")
        if budget <= 0:
            raise PlannerError(
                f"each rank's memory is {memory or 0} bytes ({self.storage_reservation:.0%} reserved): nothing to place "
                "tables in; give a Topology's hbm_cap (cuda) or ddr_cap (cpu), or device_memory_bytes")
        reserved = self._emitted_bytes(tables, world_size)
        if reserved >= budget:
            kept = [t for t in tables if t.sharding != "planned" or (t.sequence and self._emitted_bytes([t], world_size))]
            raise PlannerError(
                f"{', '.join(_held_for(t) for t in kept)} need {_size(reserved)} on every rank, at least its "
                f"{_size(budget)} budget: nothing is left for the other tables; give each rank more memory or allow "
                "them table_wise or column_wise"
            )
        return ShardingTask(
            num_devices=world_size,
            device_memory_bytes=budget - reserved,
            batch_size=self._global_batch(world_size),
            tables=tuple(self._table_spec(t) for t in planned),
            optimizer=self.optimizer,
            weights_precision=self.weights_precision,
        ), reserved

    def _stats(self, plan: Plan, task: ShardingTask, tables: Sequence[ModuleTable], local: int, emitted: int) -> str:
        """TorchRec-style per-rank stats, and what the cost model did not see."""
        reserved = f", {self.storage_reservation:.0%} of memory reserved" if self.device_memory_bytes else ""
        lines = [f"ShardwisePlanner: {len(tables)} tables on {task.num_devices} ranks ({local} per host{reserved})",
                 format_plan(plan)]
        for sharding, how in (("row_wise", "row-wise over every rank"), ("data_parallel", "data-parallel on every rank")):
            names = [t.name for t in tables if t.sharding == sharding]
            if names:
                lines.append(f"{how}, not costed by the cost model (their constraints allow nothing else; it costs "
                             f"table-wise, column-wise and the data-parallel and row-wise tables search chooses): "
                             f"{', '.join(names)}")
        sequence = [t.name for t in tables if t.sequence]
        if sequence:
            lines.append(f"sequence tables (EmbeddingCollection), costed as pooled lookups: {', '.join(sequence)}")
        if emitted:
            lines.append(f"memory cap above is what is left per rank after {emitted / GIB:.3f} GiB for those")
        if plan.extra.get("outside_training"):
            lines.append(plan.extra["outside_training"])
        if self.last_adaptation is not None:
            lines.append(self.last_adaptation.line())
        if self.last_refinement is not None:
            lines.append(f"refined on this machine: {self.last_refinement.outcome()}")
        return "\n".join(lines)

    # -- TorchRec's interface ----------------------------------------------------------------------------------
    def plan(self, module: nn.Module, sharders: Sequence[Any] | None = None) -> Any:
        """A `ShardingPlan` for every `EmbeddingBagCollection` and `EmbeddingCollection` in `module` (those with a
        sharder among `sharders`, as TorchRec passes them)."""
        tables = self.tables_of(module, sharders)
        task, emitted = self.task_for(tables)
        model = self._adapted_cost_model(task)
        plan = self._refined(task, self.searcher.search(task, model, self.seed), model)
        self._check_plan_constraints(plan, tables)
        self.last_plan, self.last_task = plan, task
        local = self._local_world_size(task.num_devices)
        self.last_stats = self._stats(plan, task, tables, local, emitted)
        log.info("%s", self.last_stats)
        if plan.extra.get("outside_training"):  # worth seeing without INFO logging: the plan may be far off
            log.warning("ShardwisePlanner: %s", plan.extra["outside_training"])
        modules: dict[str, Any] = {}
        for path in dict.fromkeys(t.path for t in tables):
            mine = [t for t in tables if t.path == path]
            module_plan = to_module_sharding_plan(plan, task, tables={t.key: t.name for t in mine if t.sharding == "planned"},
                                                  device_type=self.device_type, local_world_size=local)
            for t in mine:
                if t.sharding == "row_wise":
                    module_plan[t.name] = row_wise_sharding(t.rows, t.dim, task.num_devices,
                                                            device_type=self.device_type, local_world_size=local)
                elif t.sharding == "data_parallel":
                    module_plan[t.name] = data_parallel_sharding(task.num_devices)
            modules[path] = module_plan
        return ShardingPlan(modules)

    def collective_plan(self, module: nn.Module, sharders: Sequence[Any] | None = None, pg: Any = None) -> Any:
        """`plan` on rank 0, broadcast to every rank of `pg` (so all ranks shard identically); where rank 0 cannot
        plan, every rank raises its error (the others would otherwise wait on a broadcast that never comes)."""
        if not dist.is_initialized():
            return self.plan(module, sharders)
        group = pg if pg is not None else dist.group.WORLD
        assert group is not None  # initialised above
        failure: BaseException | None = None
        holder: list[Any] = [None]
        if dist.get_rank(group) == 0:
            try:
                holder[0] = self.plan(module, sharders)
            except Exception as err:  # noqa: BLE001 - sent to the other ranks, then raised here as it was
                failure = err
                holder[0] = _PlanFailure(_sendable(err))
        dist.broadcast_object_list(holder, src=dist.get_global_rank(group, 0), group=group)
        if failure is not None:
            raise failure
        if isinstance(holder[0], _PlanFailure):
            raise holder[0].error
        return holder[0]


@dataclass(frozen=True)
class _PlanFailure:
    """What rank 0 broadcasts in place of a plan when planning failed."""

    error: Exception


def _sendable(err: Exception) -> Exception:
    """`err` itself where it pickles (a PlannerError does), else a PlannerError with the same one line."""
    try:
        return pickle.loads(pickle.dumps(err))  # noqa: S301 - our own bytes, round-tripped to check they travel
    except Exception:  # noqa: BLE001 - any exception type, any reason it does not pickle
        return PlannerError(f"rank 0 could not plan: {type(err).__name__}: {err}")
