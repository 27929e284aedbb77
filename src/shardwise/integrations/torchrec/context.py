"""A TorchRec planner's context as data: the embedding collections a model holds, its topology, batch size,
constraints, sharders and storage reservation, exported from a live model and rebuilt on the meta device.

The pipeline plans a user's model from this record alone (no model code on the cluster), and the plan it registers
is loaded by the training job through TorchRec's `PlanLoader`, whose check compares the planner's context hash
(`hash_planner_context_inputs_str`). Everything that hash reads travels here, so the rebuilt planner's hash is the
training job's (`test_rebuilt_context_hashes_as_the_model`); what cannot travel is refused at export, naming it.

    task = export_task(model, topology, constraints=constraints, batch_size=512, name="ranking")
    save_production_task(task, "ranking.task.json")       # a shardwise.task/v1 file with a "torchrec" section
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import logging
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.constants import POOLING_FACTOR
from torchrec.distributed.planner.storage_reservations import (
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
)
from torchrec.distributed.planner.types import ParameterConstraints, StorageReservation, Topology
from torchrec.distributed.types import CacheParams, ModuleSharder
from torchrec.modules.embedding_configs import (
    BaseEmbeddingConfig,
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
    PoolingType,
)
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from shardwise.errors import ShardwiseError
from shardwise.workload import ShardingTask, TableSpec, load_task
from shardwise.workload.documents import read_json_document, write_json_document

from .export import skew_of

T = TypeVar("T")

FORMAT: Literal["shardwise.torchrec-context/v1"] = "shardwise.torchrec-context/v1"
#: the key of a task file that holds the context (a task reader that does not know it ignores it)
TASK_KEY = "torchrec"
#: where optimizer classes recorded by name may come from (a task file never names code to import elsewhere)
_OPTIMIZER_MODULES = ("torch.optim", "torchrec.optim", "fbgemm_gpu")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class ContextError(ShardwiseError, ValueError):
    """A model, topology or constraint that a context record cannot carry, or a record that is not one."""


class CollectionTable(BaseModel):
    """One table of an embedding collection, as its config states it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    num_embeddings: int = Field(ge=1)
    embedding_dim: int = Field(ge=1)
    feature_names: tuple[str, ...]
    pooling: str = "SUM"
    data_type: str = "FP32"
    #: qualified names of the optimizers the weight's `_optimizer_classes` lists (TorchRec's storage estimator reads
    #: them: optimizer state is part of each option's storage, and of the context hash)
    optimizer_classes: tuple[str, ...] = ()


class Collection(BaseModel):
    """An `EmbeddingBagCollection` ("ebc") or `EmbeddingCollection` ("ec") at its path in the model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    kind: Literal["ebc", "ec"]
    tables: tuple[CollectionTable, ...] = Field(min_length=1)


class SharderSpec(BaseModel):
    """What one sharder offers: its sharding types, each type's kernels, its fused parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["ebc", "ec"]
    sharding_types: tuple[str, ...]
    compute_kernels: dict[str, tuple[str, ...]]
    fused_params: dict[str, Any] | None = None


class TopologySpec(BaseModel):
    """The fields of a TorchRec `Topology` its context hash reads (memory per device, equal on every rank); numbers
    keep their type (the hash reads 2 and 2.0 apart)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    world_size: int = Field(ge=1)
    compute_device: Literal["cpu", "cuda", "mtia"]
    hbm_cap: int
    ddr_cap: int
    ssd_cap: int = 0
    local_world_size: int
    hbm_mem_bw: int | float
    ddr_mem_bw: int | float
    ssd_mem_bw: int | float
    hbm_to_ddr_mem_bw: int | float
    intra_host_bw: int | float
    inter_host_bw: int | float
    bwd_compute_multiplier: int | float
    weighted_feature_bwd_compute_multiplier: int | float
    uneven_sharding_perf_multiplier: int | float


class ReservationSpec(BaseModel):
    """TorchRec's storage reservation: its policy and share."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: Literal["HeuristicalStorageReservation", "FixedPercentageStorageReservation"]
    percentage: float = Field(ge=0.0, lt=1.0)


class PlannerContext(BaseModel):
    """Everything a TorchRec planner's context hash reads, as data (`export_context`, `rebuild`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["shardwise.torchrec-context/v1"] = FORMAT
    collections: tuple[Collection, ...] = Field(min_length=1)
    topology: TopologySpec
    batch_size: int = Field(ge=1, description="samples per rank, as TorchRec's planner takes it")
    constraints: dict[str, dict[str, Any]] = {}
    sharders: tuple[SharderSpec, ...] = Field(min_length=1)
    storage_reservation: ReservationSpec

    # -- rebuilt as TorchRec objects ----------------------------------------------------------------------------
    def module(self) -> nn.Module:
        """A model on the meta device with each collection at its path (what the planner enumerates)."""
        root = nn.Module()
        for collection in self.collections:
            *parents, leaf = collection.path.split(".")
            node = root
            for name in parents:
                if not hasattr(node, name):
                    node.add_module(name, nn.Module())
                node = getattr(node, name)
            node.add_module(leaf, _collection_module(collection))
        return root

    def torchrec_topology(self) -> Topology:
        t = self.topology
        return _quietly(Topology,
            world_size=t.world_size, compute_device=t.compute_device, hbm_cap=t.hbm_cap, ddr_cap=t.ddr_cap,
            ssd_cap=t.ssd_cap, local_world_size=t.local_world_size, hbm_mem_bw=t.hbm_mem_bw, ddr_mem_bw=t.ddr_mem_bw,
            ssd_mem_bw=t.ssd_mem_bw, hbm_to_ddr_mem_bw=t.hbm_to_ddr_mem_bw, intra_host_bw=t.intra_host_bw,
            inter_host_bw=t.inter_host_bw, bwd_compute_multiplier=t.bwd_compute_multiplier,
            weighted_feature_bwd_compute_multiplier=t.weighted_feature_bwd_compute_multiplier,
            uneven_sharding_perf_multiplier=t.uneven_sharding_perf_multiplier)

    def torchrec_constraints(self) -> dict[str, ParameterConstraints] | None:
        if not self.constraints:
            return None
        return {table: ParameterConstraints(**{k: _decode(v) for k, v in fields.items()})
                for table, fields in self.constraints.items()}

    def torchrec_sharders(self) -> list[ModuleSharder[nn.Module]]:
        return [_offered_sharder(spec) for spec in self.sharders]

    def torchrec_storage_reservation(self) -> StorageReservation:
        kind = (HeuristicalStorageReservation if self.storage_reservation.policy == "HeuristicalStorageReservation"
                else FixedPercentageStorageReservation)
        return _quietly(kind, self.storage_reservation.percentage)


# -- export -------------------------------------------------------------------------------------------------------
def export_context(
    model: nn.Module,
    topology: Topology,
    *,
    constraints: Mapping[str, ParameterConstraints] | None = None,
    sharders: Sequence[ModuleSharder[nn.Module]] | None = None,
    batch_size: int = 512,
    storage_reservation: StorageReservation | None = None,
) -> PlannerContext:
    """The context TorchRec's planner would hash for `model` planned with these arguments (TorchRec's defaults:
    the EBC and EC sharders, `HeuristicalStorageReservation(0.15)`); refuses what cannot travel, naming it."""
    collections = _collections(model)
    sharders = list(sharders) if sharders is not None else [EmbeddingBagCollectionSharder(),
                                                            EmbeddingCollectionSharder()]
    reservation = storage_reservation or _quietly(HeuristicalStorageReservation, 0.15)
    policy = type(reservation).__name__
    if policy not in ("HeuristicalStorageReservation", "FixedPercentageStorageReservation"):
        raise ContextError(f"storage_reservation {policy}: only TorchRec's HeuristicalStorageReservation and "
                           "FixedPercentageStorageReservation travel in a task file")
    return PlannerContext(
        collections=tuple(collections),
        topology=_topology_spec(topology),
        batch_size=batch_size,
        constraints={table: _constraint_fields(table, c) for table, c in sorted((constraints or {}).items())},
        sharders=tuple(_sharder_spec(s, topology.compute_device) for s in sharders),
        storage_reservation=ReservationSpec(policy=policy,  # type: ignore[arg-type]
                                            percentage=float(reservation._percentage)),  # type: ignore[attr-defined]
    )


def export_task(
    model: nn.Module,
    topology: Topology,
    *,
    name: str,
    constraints: Mapping[str, ParameterConstraints] | None = None,
    sharders: Sequence[ModuleSharder[nn.Module]] | None = None,
    batch_size: int = 512,
    storage_reservation: StorageReservation | None = None,
    zipf_alpha: float | Mapping[str, float] | None = None,
) -> ProductionTask:
    """A production task: the model's tables as a shardwise task (pooling factors from the constraints, access skew
    from `zipf_alpha`, one for every table or each table's by name, as `export_tables` takes it) and the planner's context, for the pipeline to plan and register."""
    context = export_context(model, topology, constraints=constraints, sharders=sharders, batch_size=batch_size,
                             storage_reservation=storage_reservation)
    tables: list[TableSpec] = []
    for collection in context.collections:
        for t in collection.tables:
            fields = context.constraints.get(t.name, {})
            pooling = fields.get("pooling_factors") or [POOLING_FACTOR]  # TorchRec's planner's assumption
            tables.append(TableSpec(
                name=t.name, rows=t.num_embeddings, dim=t.embedding_dim,
                pooling_factor=max(float(sum(pooling)), 1e-3),  # a table's features each pool their own lookups
                zipf_alpha=skew_of(zipf_alpha, t.name),
                sharding_types=tuple(fields["sharding_types"]) if fields.get("sharding_types") else None,
                min_partition=fields.get("min_partition")))
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise ContextError(f"model: table names {sorted({n for n in names if names.count(n) > 1})} repeat across "
                           "embedding collections; a production task names each table once")
    memory = topology.devices[0].storage.hbm if topology.compute_device == "cuda" else topology.devices[0].storage.ddr
    task = ShardingTask(num_devices=topology.world_size, device_memory_bytes=memory,
                        batch_size=batch_size * topology.world_size, tables=tuple(tables))
    return ProductionTask(name=_checked_name(name, "name"), task=task, context=context)


@dataclasses.dataclass(frozen=True)
class ProductionTask:
    """A user's model to plan: its tables as a shardwise task, and the TorchRec planner context it is sharded in."""

    name: str
    task: ShardingTask
    context: PlannerContext


def save_production_task(production: ProductionTask, path: str | Path) -> Path:
    """A shardwise.task/v1 file with the model's name under "name" and the context under "torchrec" (task readers
    that do not know them ignore them)."""
    doc = {**production.task.to_json(), "name": production.name, TASK_KEY: production.context.model_dump(mode="json")}
    return write_json_document(doc, path, ContextError)


def load_production_task(path: str | Path) -> ProductionTask:
    """A task file with a "torchrec" section; refused in one line where it has none or it is not a context."""
    task = load_task(path)
    doc = read_json_document(path, ContextError, "task")
    if TASK_KEY not in doc:
        raise ContextError(f"{path}: no {TASK_KEY!r} section: not a production task; export one with "
                           "shardwise.integrations.torchrec.export_task(model, topology, name=...)")
    try:
        context = PlannerContext.model_validate(doc[TASK_KEY])
    except ValueError as err:
        first = str(err).splitlines()
        raise ContextError(f"{path}: {TASK_KEY}: {' '.join(first[:3])}") from None
    return ProductionTask(name=_checked_name(doc.get("name"), f"{path}: name"), task=task, context=context)


def _checked_name(name: Any, where: str) -> str:
    """A production task's name names its registered plan (`shardwise-plan-<name>`): letters, digits, '.', '_', '-'."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ContextError(f"{where} {name!r}: a production task's name is 1-64 letters, digits, '.', '_' or '-' "
                           "(it names the registered plan)")
    return name


# -- the pieces ---------------------------------------------------------------------------------------------------
def _quietly(make: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`make(...)` without TorchRec's advice to its own callers (build topologies with its factory, leave the
    heuristical reservation): a recorded context rebuilds what the user's job built, whatever TorchRec advises."""
    types_logger = logging.getLogger("torchrec.distributed.planner.types")
    level = types_logger.level
    types_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return make(*args, **kwargs)
    finally:
        types_logger.setLevel(level)


def _collections(model: nn.Module) -> list[Collection]:
    found: list[Collection] = []
    for path, module in model.named_modules():
        if isinstance(module, EmbeddingBagCollection):
            configs: Sequence[BaseEmbeddingConfig] = module.embedding_bag_configs()
            kind: Literal["ebc", "ec"] = "ebc"
        elif isinstance(module, EmbeddingCollection):
            configs, kind = module.embedding_configs(), "ec"
        else:
            continue
        if not path:
            raise ContextError("model: the embedding collection is the model itself; wrap it in a module so that "
                               "its tables have a path, as DistributedModelParallel shards them")
        weights = dict(module.named_parameters())
        found.append(Collection(path=path, kind=kind, tables=tuple(
            CollectionTable(
                name=c.name, num_embeddings=c.num_embeddings, embedding_dim=c.embedding_dim,
                feature_names=tuple(c.feature_names),
                pooling=c.pooling.name if isinstance(c, EmbeddingBagConfig) else "NONE",
                data_type=c.data_type.name,
                optimizer_classes=_optimizers(path, c.name, weights))
            for c in configs)))
    if not found:
        raise ContextError("model: no EmbeddingBagCollection or EmbeddingCollection to plan")
    return found


def _optimizers(path: str, table: str, weights: Mapping[str, nn.Parameter]) -> tuple[str, ...]:
    weight = next((w for name, w in weights.items() if name.endswith(f".{table}.weight")), None)
    classes = getattr(weight, "_optimizer_classes", None) or []
    names = []
    for cls in classes:
        qualified = f"{cls.__module__}.{cls.__qualname__}"
        if not qualified.startswith(_OPTIMIZER_MODULES):
            raise ContextError(f"{path}.{table}: optimizer {qualified} is not one of torch's, torchrec's or fbgemm's; "
                               "a task file names only those")
        names.append(qualified)
    return tuple(names)


def _collection_module(collection: Collection) -> nn.Module:
    meta = torch.device("meta")
    if collection.kind == "ebc":
        module: nn.Module = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
                               feature_names=list(t.feature_names), pooling=PoolingType[t.pooling],
                               data_type=DataType[t.data_type]) for t in collection.tables], device=meta)
    else:
        module = EmbeddingCollection(tables=[
            EmbeddingConfig(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
                            feature_names=list(t.feature_names), data_type=DataType[t.data_type])
            for t in collection.tables], device=meta)
    weights = dict(module.named_parameters())
    for t in collection.tables:
        if t.optimizer_classes:
            weight = next(w for name, w in weights.items() if name.endswith(f".{t.name}.weight"))
            weight._optimizer_classes = [_import_optimizer(q) for q in t.optimizer_classes]  # type: ignore[attr-defined]
    return module


def _import_optimizer(qualified: str) -> type:
    if not qualified.startswith(_OPTIMIZER_MODULES):
        raise ContextError(f"optimizer {qualified}: a task file names only torch's, torchrec's or fbgemm's")
    module, _, name = qualified.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
    except (ImportError, AttributeError):
        raise ContextError(f"optimizer {qualified}: not found in this environment") from None


def _topology_spec(topology: Topology) -> TopologySpec:
    storages = {(d.storage.hbm, d.storage.ddr, d.storage.ssd) for d in topology.devices}
    if len(storages) != 1:
        raise ContextError("topology: devices of unequal memory do not travel in a task file; give every rank the "
                           "same hbm_cap and ddr_cap")
    (hbm, ddr, ssd), = storages
    bandwidths = topology.comms_bandwidths
    return TopologySpec(
        world_size=topology.world_size, compute_device=topology.compute_device,  # type: ignore[arg-type]
        hbm_cap=hbm, ddr_cap=ddr, ssd_cap=ssd, local_world_size=topology.local_world_size,
        hbm_mem_bw=topology.hbm_mem_bw, ddr_mem_bw=topology.ddr_mem_bw, ssd_mem_bw=topology.ssd_mem_bw,
        hbm_to_ddr_mem_bw=topology.hbm_to_ddr_mem_bw, intra_host_bw=bandwidths.intra_host_bw,
        inter_host_bw=bandwidths.inter_host_bw, bwd_compute_multiplier=topology.bwd_compute_multiplier,
        weighted_feature_bwd_compute_multiplier=topology.weighted_feature_bwd_compute_multiplier,
        uneven_sharding_perf_multiplier=topology.uneven_sharding_perf_multiplier)


def _sharder_spec(sharder: ModuleSharder[nn.Module], device: str) -> SharderSpec:
    if isinstance(sharder, EmbeddingBagCollectionSharder):
        kind: Literal["ebc", "ec"] = "ebc"
    elif isinstance(sharder, EmbeddingCollectionSharder):
        kind = "ec"
    else:
        raise ContextError(f"sharder {type(sharder).__name__}: only EmbeddingBagCollection and EmbeddingCollection "
                           "sharders travel in a task file")
    types = tuple(sharder.sharding_types(device))
    fused = getattr(sharder, "fused_params", None)
    return SharderSpec(kind=kind, sharding_types=types,
                       compute_kernels={t: tuple(sharder.compute_kernels(t, device)) for t in types},
                       fused_params={k: _encode(f"sharder fused_params[{k!r}]", v) for k, v in fused.items()}
                       if fused else None)


def _offered_sharder(spec: SharderSpec) -> ModuleSharder[nn.Module]:
    base = EmbeddingBagCollectionSharder if spec.kind == "ebc" else EmbeddingCollectionSharder
    fused = {k: _decode(v) for k, v in spec.fused_params.items()} if spec.fused_params else None

    class Offered(base):  # type: ignore[valid-type,misc]
        """The recorded sharder: the sharding types and kernels it offered."""

        def sharding_types(self, compute_device_type: str) -> list[str]:
            return list(spec.sharding_types)

        def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
            return list(spec.compute_kernels.get(sharding_type, ()))

    return Offered(fused_params=fused)  # type: ignore[no-any-return]


def _constraint_fields(table: str, constraint: ParameterConstraints) -> dict[str, Any]:
    """The constraint's fields that differ from `ParameterConstraints()`'s, encoded for JSON."""
    default = ParameterConstraints()
    return {f.name: _encode(f"constraints[{table!r}].{f.name}", getattr(constraint, f.name))
            for f in dataclasses.fields(constraint) if getattr(constraint, f.name) != getattr(default, f.name)}


#: what a context may name besides JSON values: these enums and TorchRec's CacheParams
_ENUMS: dict[str, type[enum.Enum]] = {}


def _enum_types() -> dict[str, type[enum.Enum]]:
    if not _ENUMS:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode, CacheAlgorithm

        _ENUMS.update({e.__name__: e for e in (BoundsCheckMode, CacheAlgorithm, DataType, EmbOptimType, PoolingType,
                                               SparseType)})
    return _ENUMS


def _encode(where: str, value: Any) -> Any:
    if isinstance(value, enum.Enum) and type(value).__name__ in _enum_types():  # before int: IntEnums hash apart
        return {"enum": type(value).__name__, "name": value.name}
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ContextError(f"{where}: {value} is not a finite number")
        return value
    if isinstance(value, list | tuple):
        return [_encode(where, v) for v in value]
    if isinstance(value, CacheParams) and value.stats is None and value.multipass_prefetch_config is None:
        return {"cache_params": {f.name: _encode(f"{where}.{f.name}", getattr(value, f.name))
                                 for f in dataclasses.fields(value) if getattr(value, f.name) is not None}}
    raise ContextError(f"{where}: a {type(value).__name__} does not travel in a task file; leave it out to export")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict) and "enum" in value:
        kind = _enum_types().get(value["enum"])
        if kind is None or value.get("name") not in kind.__members__:
            raise ContextError(f"{value}: not an enum member a context may name")
        return kind[value["name"]]
    if isinstance(value, dict) and "cache_params" in value:
        return CacheParams(**{k: _decode(v) for k, v in value["cache_params"].items()})
    return value
