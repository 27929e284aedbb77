"""TorchRec's planner contract, as `ShardwisePlanner` must keep it: TorchRec's default batch, the sharding types the
sharders offer and the constraints allow, fused parameters carried to the plan, TorchRec's error types, storage
reservations, plan loaders and context hash, and plans within each rank's memory. Each on a CUDA-shaped topology
(planned on meta tensors) and a CPU one, for `EmbeddingBagCollection` and `EmbeddingCollection`; the search's cost
model is a test double (the planner is under test). Last, plans made by `collective_plan` train in
`DistributedModelParallel` on 2 gloo ranks."""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import sys
from pathlib import Path

import pytest
import torch
from search_doubles import FeatureCostModel
from torch import nn
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
from torchrec.distributed.planner.constants import BATCH_SIZE
from torchrec.distributed.planner.storage_reservations import (
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
)
from torchrec.distributed.planner.types import PlanLoader, PlannerErrorType, Topology
from torchrec.distributed.planner.types import PlannerError as TorchRecPlannerError
from torchrec.distributed.types import BoundsCheckMode, CacheParams, ShardingPlan

from shardwise.integrations.torchrec import PlannerError, ShardwisePlanner
from shardwise.search import PlanError

pytestmark = pytest.mark.integration

MIB = 2**20
DIM = 64  # one dim for every table: an EmbeddingCollection's tables share theirs
#: 2 ranks whose memory holds these tables table-wise, tightly enough that NeuroShard splits one column-wise
SNUG = ((100_000, 60_000, 50_000, 40_000, 30_000, 20_000), 2, 42_900_000)
#: 4 ranks of 30 MiB: t0 (200k x 64, about 52 MB with its optimizer state) fits no rank whole; NeuroShard splits
#: it into 16-wide slices and splits t2 too
TIGHT = ((200_000, 60_000, 50_000, 40_000, 30_000, 20_000), 4, 30 * MIB)
NO_RESERVATION = FixedPercentageStorageReservation(0.0)


@pytest.fixture(params=["cuda", "cpu"])
def device(request) -> str:
    return request.param


@pytest.fixture(params=["ebc", "ec"])
def kind(request) -> str:
    return request.param


def _topology(device: str, world_size: int, memory_bytes: int) -> Topology:
    """Each rank holds `memory_bytes`: in HBM (and as much host memory, for UVM) on CUDA, in DDR on a CPU."""
    if device == "cuda":
        return Topology(world_size=world_size, compute_device="cuda", hbm_cap=memory_bytes, ddr_cap=memory_bytes)
    return Topology(world_size=world_size, compute_device="cpu", ddr_cap=memory_bytes)


def _model(kind: str, rows: tuple[int, ...], dim: int = DIM) -> nn.Module:
    """Tables t0, t1, ... of `rows` in a collection at `sparse`, on the meta device."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    meta = torch.device("meta")
    model = nn.Module()
    if kind == "ebc":
        model.sparse = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=r, feature_names=[f"f_t{i}"])
            for i, r in enumerate(rows)], device=meta)
    else:
        model.sparse = EmbeddingCollection(tables=[
            EmbeddingConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=r, feature_names=[f"f_t{i}"])
            for i, r in enumerate(rows)], device=meta)
    return model


def _sharder(kind: str, sharding_types: tuple[str, ...] | None = None, **kwargs):  # noqa: ANN202 - a ModuleSharder
    """The collection's sharder, offering only `sharding_types` where given (as TorchRec's own tests restrict it)."""
    base = EmbeddingBagCollectionSharder if kind == "ebc" else EmbeddingCollectionSharder
    if sharding_types is None:
        return base(**kwargs)

    class Offering(base):  # type: ignore[misc, valid-type]
        def sharding_types(self, compute_device_type: str) -> list[str]:
            return list(sharding_types)

    return Offering(**kwargs)


def _planner(topology: Topology, **kwargs) -> ShardwisePlanner:
    kwargs.setdefault("storage_reservation", NO_RESERVATION)
    return ShardwisePlanner(topology, cost_model=FeatureCostModel(), adapt=0, **kwargs)


def _torchrec_planner(topology: Topology, **kwargs) -> EmbeddingShardingPlanner:
    kwargs.setdefault("storage_reservation", NO_RESERVATION)
    return EmbeddingShardingPlanner(topology, **kwargs)


def _types(sharding_plan: ShardingPlan) -> dict[str, str]:
    return {name: p.sharding_type for name, p in sharding_plan.plan["sparse"].items()}


def _column_widths(sharding_plan: ShardingPlan, table: str) -> list[int]:
    spec = sharding_plan.plan["sparse"][table].sharding_spec
    return [int(shard.shard_sizes[1]) for shard in spec.shards]


def _torchrecs_error(planner: EmbeddingShardingPlanner, model: nn.Module, sharders: list) -> TorchRecPlannerError:
    with pytest.raises(TorchRecPlannerError) as raised:
        planner.plan(model, sharders)
    return raised.value


# -- 1. TorchRec's default batch -------------------------------------------------------------------------------------
def test_batch_size_omitted_plans_with_torchrecs_default_per_rank(device, kind):
    rows, world_size, memory = SNUG
    planner = ShardwisePlanner(_topology(device, world_size, memory), cost_model=FeatureCostModel(), adapt=0,
                               storage_reservation=NO_RESERVATION)
    sharding_plan = planner.plan(_model(kind, rows), [_sharder(kind)])
    assert set(sharding_plan.plan["sparse"]) == {f"t{i}" for i in range(len(rows))}
    assert BATCH_SIZE == 512 and planner._batch_size == BATCH_SIZE
    assert {o.batch_size for o in planner.last_best_plan} == {BATCH_SIZE}
    # the shardwise task is the step's batch: TorchRec's per-rank batch on every rank
    assert planner.last_task is not None and planner.last_task.batch_size == BATCH_SIZE * world_size


# -- 2, 3. the sharding types the sharders offer -----------------------------------------------------------------
def test_a_table_wise_only_sharder_gets_table_wise_where_neuroshard_would_split(device, kind):
    rows, world_size, memory = SNUG
    topology = _topology(device, world_size, memory)
    split = _planner(topology).plan(_model(kind, rows), [_sharder(kind, ("table_wise", "column_wise"))])
    assert "column_wise" in _types(split).values(), "the memory must be tight enough that NeuroShard splits a table"
    whole = _planner(topology).plan(_model(kind, rows), [_sharder(kind, ("table_wise",))])
    assert set(_types(whole).values()) == {"table_wise"}
    assert all(len(p.ranks) == 1 for p in whole.plan["sparse"].values())


def test_a_table_wise_only_sharder_that_cannot_fit_raises_torchrecs_error_type(device, kind):
    rows, world_size, memory = TIGHT  # t0 fits no rank whole
    topology = _topology(device, world_size, memory)
    sharders = [_sharder(kind, ("table_wise",))]
    expected = _torchrecs_error(_torchrec_planner(topology), _model(kind, rows), sharders).error_type
    assert expected in (PlannerErrorType.STRICT_CONSTRAINTS, PlannerErrorType.INSUFFICIENT_STORAGE)
    with pytest.raises(TorchRecPlannerError) as raised:
        _planner(topology).plan(_model(kind, rows), sharders)
    assert raised.value.error_type == expected


def test_a_row_wise_and_table_wise_sharder_gets_only_those(device, kind):
    rows, world_size, memory = TIGHT
    sharding_plan = _planner(_topology(device, world_size, memory)).plan(
        _model(kind, rows), [_sharder(kind, ("row_wise", "table_wise"))])
    types = _types(sharding_plan)
    assert set(types.values()) <= {"row_wise", "table_wise"}
    assert types["t0"] == "row_wise"  # it fits no rank whole


# -- 4. constraints --------------------------------------------------------------------------------------------------
def test_a_table_wise_constraint_holds_for_its_table_and_leaves_the_others_free(device, kind):
    rows, world_size, memory = TIGHT
    topology = _topology(device, world_size, memory)
    free = _types(_planner(topology).plan(_model(kind, rows), [_sharder(kind)]))
    assert free["t2"] == "column_wise", "unconstrained, NeuroShard splits t2 here"
    planner = _planner(topology, constraints={"t2": ParameterConstraints(sharding_types=["table_wise"])})
    sharding_plan = planner.plan(_model(kind, rows), [_sharder(kind)])
    assert _types(sharding_plan)["t2"] == "table_wise" and len(sharding_plan.plan["sparse"]["t2"].ranks) == 1
    assert _types(sharding_plan)["t0"] == "column_wise"  # the constraint is t2's alone


def test_min_partition_leaves_no_column_shard_narrower(device, kind):
    rows, world_size, memory = TIGHT
    topology = _topology(device, world_size, memory)
    free = _planner(topology).plan(_model(kind, rows), [_sharder(kind)])
    assert min(_column_widths(free, "t0")) < 32, "unconstrained, NeuroShard cuts t0 narrower than 32 here"
    planner = _planner(topology, constraints={"t0": ParameterConstraints(min_partition=32)})
    sharding_plan = planner.plan(_model(kind, rows), [_sharder(kind)])
    widths = _column_widths(sharding_plan, "t0")
    assert sum(widths) == DIM and min(widths) >= 32


# -- 5, 6. fused parameters and other kernels ------------------------------------------------------------------------
FUSED_FIELDS = ("cache_params", "enforce_hbm", "stochastic_rounding", "bounds_check_mode", "output_dtype",
                "key_value_params")


def test_fused_parameters_reach_the_parameter_sharding_as_torchrecs_planner_gives_them(device, kind):
    rows = (20_000, 10_000, 5_000)
    constraints = {
        "t0": ParameterConstraints(cache_params=CacheParams(load_factor=0.3), enforce_hbm=True,
                                   stochastic_rounding=True, bounds_check_mode=BoundsCheckMode.FATAL),
        "t1": ParameterConstraints(stochastic_rounding=False, bounds_check_mode=BoundsCheckMode.NONE),
    }
    topology = _topology(device, 2, 1024 * MIB)
    ours = _planner(topology, constraints=constraints).plan(_model(kind, rows), [_sharder(kind)]).plan["sparse"]
    theirs = _torchrec_planner(topology, constraints=constraints).plan(
        _model(kind, rows), [_sharder(kind)]).plan["sparse"]
    assert set(ours) == set(theirs)
    assert set(FUSED_FIELDS) | {"sharding_type", "compute_kernel", "ranks", "sharding_spec"} == {
        f.name for f in dataclasses.fields(ours["t0"])}, "ParameterSharding has fields this test does not compare"
    for table in ours:
        for name in FUSED_FIELDS:
            assert getattr(ours[table], name) == getattr(theirs[table], name), f"{table}.{name}"
    assert ours["t0"].cache_params.load_factor == 0.3 and ours["t0"].enforce_hbm is True
    assert ours["t0"].stochastic_rounding is True and ours["t0"].bounds_check_mode == BoundsCheckMode.FATAL
    assert ours["t1"].stochastic_rounding is False and ours["t1"].bounds_check_mode == BoundsCheckMode.NONE


def test_a_uvm_caching_table_keeps_its_kernel_and_cache_params_and_is_priced_by_torchrec(kind):
    rows = (20_000, 10_000, 5_000)
    constraints = {"t1": ParameterConstraints(compute_kernels=["fused_uvm_caching"],
                                              cache_params=CacheParams(load_factor=0.2))}
    planner = _planner(_topology("cuda", 2, 1024 * MIB), constraints=constraints)
    t1 = planner.plan(_model(kind, rows), [_sharder(kind)]).plan["sparse"]["t1"]
    assert t1.compute_kernel == "fused_uvm_caching"
    assert t1.cache_params is not None and t1.cache_params.load_factor == 0.2
    priced = [line for line in (planner.last_stats or "").splitlines() if line.startswith("priced by TorchRec's")]
    assert len(priced) == 1 and "t1 (" in priced[0] and "fused_uvm_caching" in priced[0], planner.last_stats
    assert "t0 (" not in priced[0]  # the fused tables are priced by the cost model


# -- 7, 8. nothing to plan, nothing that fits, what shardwise cannot describe ----------------------------------------
def test_no_sharders_plan_nothing(device, kind):
    assert _planner(_topology(device, 2, 1024 * MIB)).plan(_model(kind, SNUG[0]), []) == ShardingPlan({})


def test_too_little_memory_is_torchrecs_insufficient_storage(device, kind):
    rows, world_size, _ = TIGHT
    with pytest.raises(TorchRecPlannerError) as raised:
        _planner(_topology(device, world_size, MIB)).plan(_model(kind, rows), [_sharder(kind)])
    assert raised.value.error_type == PlannerErrorType.INSUFFICIENT_STORAGE


def test_planning_errors_are_shardwises_planner_error(device, kind):
    """shardwise's callers catch `PlanError`; TorchRec's catch `PlannerError`: a plan that fits nowhere is both."""
    rows, world_size, _ = TIGHT
    with pytest.raises(TorchRecPlannerError) as raised:
        _planner(_topology(device, world_size, MIB)).plan(_model(kind, rows), [_sharder(kind)])
    assert isinstance(raised.value, PlannerError) and isinstance(raised.value, PlanError), type(raised.value).__mro__


def test_a_dim_over_65536_is_planned_from_torchrecs_options_where_torchrecs_planner_plans_it(device, kind):
    topology = _topology(device, 2, 4096 * MIB)
    theirs = _torchrec_planner(topology).plan(_model(kind, (50, 20), dim=65_540), [_sharder(kind)])
    assert set(theirs.plan["sparse"]) == {"t0", "t1"}, "the control: TorchRec's planner plans these tables"
    planner = _planner(topology)
    ours = planner.plan(_model(kind, (50, 20), dim=65_540), [_sharder(kind)])  # neither shardwise's validation error
    assert set(ours.plan["sparse"]) == {"t0", "t1"}                             # nor a PlannerError reaches the caller
    assert all(sum(_column_widths(ours, t)) == 65_540 for t in ("t0", "t1"))
    assert "dim 65540" in (planner.last_stats or ""), "the stats say why shardwise left them to TorchRec"


# -- 9. TorchRec's other arguments -----------------------------------------------------------------------------------
def _within_memory(planner: EmbeddingShardingPlanner, topology: Topology, model: nn.Module, sharders: list,
                   constraints: dict | None = None) -> None:
    """Each rank's shards, as TorchRec's estimator sizes them, within its storage after the reservation."""
    left = planner._storage_reservation.reserve(topology=topology, batch_size=planner._batch_size, module=model,
                                                sharders=sharders, constraints=constraints)
    for rank, device in enumerate(left.devices):
        shards = [s for o in planner._best_plan for s in o.shards if s.rank == rank]
        assert all(s.storage is not None for s in shards)
        for tier in ("hbm", "ddr"):
            used = sum(getattr(s.storage, tier) for s in shards)
            assert used <= getattr(device.storage, tier), f"rank {rank}: {tier} {used} > {getattr(device.storage, tier)}"


@pytest.mark.parametrize("reservation", [FixedPercentageStorageReservation(0.3), HeuristicalStorageReservation(0.15)],
                         ids=["fixed-30%", "heuristical-15%"])
def test_torchrecs_storage_reservations_are_honoured(device, kind, reservation):
    rows, world_size, memory = TIGHT
    topology = _topology(device, world_size, int(memory / 0.7))  # what TIGHT leaves, after a 30% reservation
    sharders = [_sharder(kind)]
    planner = _planner(topology, storage_reservation=reservation)
    model = _model(kind, rows)
    planner.plan(model, sharders)
    assert planner._storage_reservation is reservation
    _within_memory(planner, topology, model, sharders)


def test_torchrecs_stats_timeout_callbacks_and_debug_are_accepted(device, kind):
    rows, world_size, memory = SNUG
    seen = []

    def callback(best_plan):  # noqa: ANN001, ANN202 - TorchRec's callback: the best plan in, a plan out
        seen.append(sorted(o.name for o in best_plan))
        return list(best_plan)  # another list: the planner keeps what the callbacks return

    planner = _planner(_topology(device, world_size, memory), stats=[], timeout_seconds=60, callbacks=[callback],
                       debug=False)
    sharding_plan = planner.plan(_model(kind, rows), [_sharder(kind)])
    assert seen == [sorted(sharding_plan.plan["sparse"])]
    assert planner.last_best_plan is planner._best_plan  # kept after the callbacks given, as TorchRec keeps it
    assert planner._stats == [] and planner.last_stats is None  # no stats stage: none ran


class _Loader(PlanLoader):
    """TorchRec's plan loader interface over a plan held in memory."""

    def __init__(self, options: dict | None, context_hash: str | None) -> None:
        self.options, self.context_hash, self.loads = options, context_hash, 0

    def load(self):  # noqa: ANN201
        self.loads += 1
        return self.options

    def plan_context_hash(self) -> str | None:
        return self.context_hash

    def get_plan_id(self) -> str:
        return "in-memory"


def _placements(sharding_plan: ShardingPlan) -> dict[str, tuple]:
    return {name: (p.sharding_type, p.compute_kernel, tuple(p.ranks),
                   tuple((tuple(s.shard_offsets), tuple(s.shard_sizes)) for s in p.sharding_spec.shards))
            for name, p in sharding_plan.plan["sparse"].items()}


def _rotated(best_plan: list, world_size: int) -> list:
    """The planner's chosen options with every shard moved to the next rank: a valid plan (each rank takes over a
    neighbour's shards whole, within the same memory) that the deterministic search does not make."""
    options = copy.deepcopy(best_plan)
    for option in options:
        for shard in option.shards:
            shard.rank = (shard.rank + 1) % world_size
    return options


def _reloaded(topology: Topology, kind: str, rows: tuple[int, ...], sharders: list) -> None:
    """A plan the planner made, its shards moved to other ranks and stored as TorchRec stores a best plan, then loaded
    by a new planner: the stored plan, not the one a search makes, and no search."""
    first = _planner(topology)
    made = first.plan(_model(kind, rows), sharders)
    stored = _rotated(first.last_best_plan, topology.world_size)
    loader = _Loader({o.storage_hash(): o for o in stored}, first.hash_planner_context_inputs_str())
    again = _planner(topology, plan_loader=loader)
    loaded = again.plan(_model(kind, rows), sharders)
    assert loader.loads == 1 and again.last_plan is None
    rotated = {name: (kind_, kernel, tuple((r + 1) % topology.world_size for r in ranks), shards)
               for name, (kind_, kernel, ranks, shards) in _placements(made).items()}
    assert _placements(loaded) == rotated != _placements(made)


def test_a_plan_loader_plan_is_used_instead_of_a_search(device, kind):
    rows, world_size, memory = SNUG
    _reloaded(_topology(device, world_size, memory), kind, rows, [_sharder(kind, ("table_wise",))])


def test_a_plan_with_column_splits_loads_back_through_torchrecs_plan_loader(device, kind):
    """TorchRec keys a loaded option by its table, type, kernel and shard count: a column split the search chose
    must load back as the planner made it."""
    rows, world_size, memory = TIGHT
    _reloaded(_topology(device, world_size, memory), kind, rows, [_sharder(kind)])


def test_a_plan_loader_for_other_inputs_is_refused(device, kind):
    rows, world_size, memory = SNUG
    planner = _planner(_topology(device, world_size, memory), plan_loader=_Loader({}, "another context"))
    with pytest.raises(TorchRecPlannerError) as raised:
        planner.plan(_model(kind, rows), [_sharder(kind)])
    assert raised.value.error_type == PlannerErrorType.PLANNER_INPUT_CONTEXT_MISMATCH


@pytest.mark.parametrize(("ours", "theirs"), [
    (None, None), (0.3, FixedPercentageStorageReservation(0.3)),
    (HeuristicalStorageReservation(0.2), HeuristicalStorageReservation(0.2))],
    ids=["default", "share", "heuristical"])
def test_the_context_hash_is_torchrecs_planners(device, kind, ours, theirs):
    rows, world_size, _ = SNUG
    topology = _topology(device, world_size, 1024 * MIB)
    constraints = {"t1": ParameterConstraints(min_partition=32)}
    planner = ShardwisePlanner(topology, cost_model=FeatureCostModel(), adapt=0, storage_reservation=ours,
                               constraints=constraints)
    planner.plan(_model(kind, rows), [_sharder(kind)])
    torchrecs = EmbeddingShardingPlanner(topology, storage_reservation=theirs, constraints=constraints)
    torchrecs.plan(_model(kind, rows), [_sharder(kind)])
    assert planner.hash_planner_context_inputs_str() == torchrecs.hash_planner_context_inputs_str()


# -- 10. within memory -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["snug", "tight", "tight-min-partition", "tight-row-wise"])
def test_a_plan_is_never_over_a_ranks_memory(device, kind, case):
    rows, world_size, memory = SNUG if case == "snug" else TIGHT
    topology = _topology(device, world_size, memory)
    constraints = {"t0": ParameterConstraints(min_partition=32)} if case == "tight-min-partition" else None
    sharders = [_sharder(kind, ("row_wise", "table_wise", "column_wise") if case == "tight-row-wise" else None)]
    planner = _planner(topology, constraints=constraints)
    model = _model(kind, rows)
    planner.plan(model, sharders)
    _within_memory(planner, topology, model, sharders, constraints)


# -- 11. errors travel -----------------------------------------------------------------------------------------------
def test_a_planner_error_keeps_its_type_through_pickle(device, kind):
    """`collective_plan` sends rank 0's error to the other ranks pickled."""
    rows, world_size, _ = TIGHT
    with pytest.raises(TorchRecPlannerError) as raised:
        _planner(_topology(device, world_size, MIB)).plan(_model(kind, rows), [_sharder(kind)])
    travelled = pickle.loads(pickle.dumps(raised.value))  # noqa: S301 - our own bytes
    assert type(travelled) is type(raised.value) and str(travelled) == str(raised.value)
    assert travelled.error_type == PlannerErrorType.INSUFFICIENT_STORAGE
    made = pickle.loads(pickle.dumps(PlannerError("table 't0': no", PlannerErrorType.STRICT_CONSTRAINTS)))  # noqa: S301
    assert isinstance(made, PlannerError) and made.error_type == PlannerErrorType.STRICT_CONSTRAINTS


# -- DistributedModelParallel ----------------------------------------------------------------------------------------
#: (name, rows, lookups per sample) of the trained model's tables
TRAINED = (("t0", 400, 3), ("t1", 300, 2), ("t2", 200, 2), ("t3", 100, 1))
TRAINED_DIM = 16
#: what each DMP case's sharder offers (None: the sharder's own types) and its constraints; "unrestricted" is the
#: control: what the planner picks where the sharder does not narrow it
CASES = {
    "unrestricted": (None, None),
    "table_wise": (("table_wise",), None),
    "row_wise": (("row_wise",), None),
    "row_wise+table_wise": (("row_wise", "table_wise"), None),
    "fused-params": (None, {
        "t0": dict(compute_kernels=["fused"], stochastic_rounding=True, bounds_check_mode=BoundsCheckMode.FATAL),
        "t1": dict(compute_kernels=["fused"], stochastic_rounding=False, bounds_check_mode=BoundsCheckMode.NONE)}),
}


class _Trained(nn.Module):
    """A collection on the meta device (DistributedModelParallel makes its shards), a dense layer on the CPU."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
        from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

        meta = torch.device("meta")
        self.kind = kind
        if kind == "ebc":
            self.sparse = EmbeddingBagCollection(tables=[
                EmbeddingBagConfig(name=n, embedding_dim=TRAINED_DIM, num_embeddings=r, feature_names=[f"f_{n}"])
                for n, r, _ in TRAINED], device=meta)
        else:
            self.sparse = EmbeddingCollection(tables=[
                EmbeddingConfig(name=n, embedding_dim=TRAINED_DIM, num_embeddings=r, feature_names=[f"f_{n}"])
                for n, r, _ in TRAINED], device=meta)
        self.dense = nn.Linear(TRAINED_DIM, 1)

    def forward(self, features):  # noqa: ANN001, ANN201 - a KeyedJaggedTensor in, the loss out
        if self.kind == "ebc":
            pooled = self.sparse(features).to_dict()
            embedded = torch.cat([pooled[f"f_{n}"] for n, *_ in TRAINED])
        else:
            sequences = self.sparse(features)
            embedded = torch.cat([sequences[f"f_{n}"].values() for n, *_ in TRAINED])
        return self.dense(embedded).square().mean()


def _fused_seen(dmp: nn.Module) -> dict[str, tuple]:
    """Per table: the fused parameters of TorchRec's kernel config holding it, and the fbgemm module's own."""
    seen = {}
    # a sharded collection keeps its lookups in a plain list (not submodules), each a module of TorchRec's kernels
    lookups = [lookup for sharded in dmp.modules() for lookup in getattr(sharded, "_lookups", [])]
    for module in (kernel for lookup in lookups for kernel in lookup.modules()):
        config, tbe = getattr(module, "_config", None), getattr(module, "_emb_module", None)
        if config is None or tbe is None or not hasattr(config, "embedding_tables"):
            continue
        fused = config.fused_params or {}
        for table in config.embedding_tables:
            seen[table.name] = (fused.get("stochastic_rounding"), fused.get("bounds_check_mode"),
                                getattr(tbe, "stochastic_rounding", None), getattr(tbe, "bounds_check_mode_int", None))
    return seen


def _built_types(dmp: nn.Module) -> dict[str, str]:
    """Each table's sharding as DistributedModelParallel built it, read from its state dict: a sharded tensor's
    shards (one whole: table-wise; full rows: column-wise; full columns: row-wise), or a whole tensor on every rank
    (data-parallel)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    built = {}
    for name, value in dmp.state_dict().items():
        if not (".embedding_bags." in name or ".embeddings." in name) or not name.endswith(".weight"):
            continue
        table = name.split(".")[-2]
        if not isinstance(value, ShardedTensor):
            built[table] = "data_parallel"
            continue
        rows, dim = value.size()
        shards = value.metadata().shards_metadata
        built[table] = ("table_wise" if len(shards) == 1 else
                        "column_wise" if all(s.shard_sizes[0] == rows for s in shards) else
                        "row_wise" if all(s.shard_sizes[1] == dim for s in shards) else "other")
    return built


def _local_shards(dmp: nn.Module) -> dict[str, list[torch.Tensor]]:
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    held: dict[str, list[torch.Tensor]] = {}
    for name, value in dmp.state_dict().items():
        if isinstance(value, ShardedTensor) and value.local_shards():
            held[name.split(".")[-2]] = [s.tensor.detach().clone() for s in value.local_shards()]
    return held


def _dmp_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.model_parallel import DistributedModelParallel

    sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))  # search_doubles
    from tests.integration.test_torchrec_dmp_models import _jagged

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    results = {}
    try:
        for kind in ("ebc", "ec"):
            for case, (offered, constraints) in CASES.items():
                torch.manual_seed(0)
                sharder = _sharder(kind, offered, fused_params={
                    "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.5})
                planner = ShardwisePlanner(
                    Topology(world_size=world_size, compute_device="cpu", ddr_cap=64 * MIB), batch_size=8,
                    storage_reservation=NO_RESERVATION, cost_model=FeatureCostModel(), adapt=0,
                    constraints={n: ParameterConstraints(**c) for n, c in (constraints or {}).items()} or None)
                model = _Trained(kind)
                plan = planner.collective_plan(model, [sharder], dist.group.WORLD)
                dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=[sharder])
                before = _local_shards(dmp)
                loss = dmp(_jagged(TRAINED, rank, 100))
                loss.backward()  # the fused optimizer steps the tables in the backward pass
                after = _local_shards(dmp)
                planned = {n: p.sharding_type for n, p in plan.plan["sparse"].items()}
                results[(kind, case)] = {
                    "loss": float(loss.detach()),
                    "offered": sorted(sharder.sharding_types("cpu")),
                    "rank_types": sorted({planned[t] for t in after}),
                    "planned": planned,
                    "built": _built_types(dmp),
                    "changed": sorted(t for t in after if any(
                        not torch.equal(a, b) for a, b in zip(before[t], after[t]))),
                    "held": sorted(after),
                    "fused": _fused_seen(dmp),
                }
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_collective_plans_train_one_step_in_distributed_model_parallel(tmp_path, monkeypatch):
    # the spawned workers import this module by its importlib-mode name: they need the repository root on sys.path
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))
    from tests.integration.test_torchrec_dmp_models import _free_port

    world_size = 2
    torch.multiprocessing.spawn(_dmp_worker, args=(world_size, _free_port(), str(tmp_path)), nprocs=world_size,
                                join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
    for key in ranks[0]:
        held = set()
        for rank, results in enumerate(ranks):
            result = results[key]
            assert torch.isfinite(torch.tensor(result["loss"])), key
            assert set(result["rank_types"]) <= set(result["offered"]), (key, rank, result["rank_types"])
            assert result["built"] == result["planned"], (key, rank)  # DMP built the plan, every table of it
            assert set(result["built"].values()) <= set(result["offered"]), (key, rank, result["built"])
            assert result["changed"], f"{key}, rank {rank}: no shard it holds was trained"
            held |= set(result["held"])
        assert held == {n for n, *_ in TRAINED}, key  # every table is held somewhere
    for kind in ("ebc", "ec"):  # the control: unrestricted, the planner picks a type some restricted sharder refuses
        free = set(ranks[0][(kind, "unrestricted")]["planned"].values())
        narrowed = [case for case, (offered, _) in CASES.items() if offered and free - set(offered)]
        assert narrowed, (kind, free)
        for case in narrowed:
            assert set(ranks[0][(kind, case)]["planned"].values()) != free, (kind, case)
    for kind in ("ebc", "ec"):
        for rank, results in enumerate(ranks):
            fused = results[(kind, "fused-params")]["fused"]
            if "t0" in fused:
                assert fused["t0"] == (True, BoundsCheckMode.FATAL, True, BoundsCheckMode.FATAL.value), (kind, rank)
            if "t1" in fused:
                assert fused["t1"] == (False, BoundsCheckMode.NONE, False, BoundsCheckMode.NONE.value), (kind, rank)
        assert any("t0" in r[(kind, "fused-params")]["fused"] for r in ranks), kind
        assert any("t1" in r[(kind, "fused-params")]["fused"] for r in ranks), kind
