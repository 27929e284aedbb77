"""What `ShardwisePlanner` chooses, on real TorchRec with a real cost model read from a real `mlflow server`
(conftest's `mlflow_registry`): TorchRec's greedy proposal where the cost model rates it at least as fast as the
search's plan (never worse than TorchRec's by the model), the search's plan where it is faster; the search run again
with less memory where the partitioner refuses its plan, and TorchRec's greedy proposal after its retries; and the
`enumerator=`, `proposer=`, `partitioner=` and `performance_model=` passed to it used in place of shardwise's. The
cost model has not learned these tables: `adapt=0, refine=0` make the search plan them (by default, TorchRec's
planner would)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import ParameterConstraints
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.perf_models import NoopPerfModel
from torchrec.distributed.planner.proposers import GreedyProposer
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import PlannerError, PlannerErrorType, Topology
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from shardwise.integrations.mlflow import MlflowService
from shardwise.integrations.torchrec import PlacedPartitioner, ShardwiseEnumerator, ShardwisePlanner
from shardwise.integrations.torchrec.proposer import ACCOUNTING_REPLANS
from shardwise.search import Plan, Shard, finish_plan, make_searcher

pytestmark = pytest.mark.integration

TOPOLOGY = Topology(world_size=2, compute_device="cpu", ddr_cap=2**30)
BATCH = 256
GREEDY = "the plan: TorchRec's greedy proposal"


#: (dim, rows, pooling factor) of each table: two heavy tables and six light ones, on which the cost model rates
#: NeuroShard's plan faster than TorchRec's greedy proposal
TABLES = ((64, 50_000, 20.0), (8, 100, 1.0), (8, 200, 1.0), (8, 300, 1.0), (8, 400, 1.0), (8, 500, 1.0),
          (128, 30_000, 40.0), (16, 1000, 2.0))
NAMES = {f"t{i}" for i in range(len(TABLES))}


def _model() -> nn.Module:
    model = nn.Module()
    model.sparse = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=rows, feature_names=[f"f{i}"])
        for i, (dim, rows, _) in enumerate(TABLES)], device=torch.device("meta"))
    return model


@pytest.fixture(scope="module")
def cost_model_uri(mlflow_registry, tiny_cost_model, tmp_path_factory):
    """(models:/ URI, tracking URI): a small trained cost model registered on the shared server under a name of this
    module's own."""
    if mlflow_registry.proc is None:  # a fault test left it down
        mlflow_registry.start()
    directory = tiny_cost_model[0].save(tmp_path_factory.mktemp("planner-choices") / "model")
    service = MlflowService(mlflow_registry.url)
    run_id = service.log_run(experiment="planner-choices", run_name="cost-model", params={}, metrics={},
                             artifacts_dir=directory, artifact_path="cost_model")
    name = f"shardwise-cost-planner-choices-{directory.parent.name.lower().replace('_', '-')}"
    version = service.register_version(name, f"{service.artifact_uri(run_id)}/cost_model", run_id,
                                       description="a cost model for ShardwisePlanner's choices")
    return f"models:/{name}/{version}", mlflow_registry.url


def _planner(cost_model_uri, **kwargs) -> ShardwisePlanner:
    uri, tracking_uri = cost_model_uri
    constraints = {f"t{i}": ParameterConstraints(pooling_factors=[pooling]) for i, (*_, pooling) in enumerate(TABLES)}
    return ShardwisePlanner(TOPOLOGY, batch_size=BATCH, storage_reservation=FixedPercentageStorageReservation(0.0),
                            constraints=constraints, cost_model=uri, tracking_uri=tracking_uri, adapt=0, refine=0,
                            **kwargs)


def _ranks(sharding_plan) -> dict[str, list[tuple[int, int]]]:
    """Each table's (column offset, rank) of every shard (a data-parallel table's replicas: offset -1)."""
    return {table: sorted((int(s.shard_offsets[1]), s.placement.rank()) for s in p.sharding_spec.shards)
            if p.sharding_spec is not None else [(-1, rank) for rank in p.ranks]
            for table, p in sharding_plan.plan["sparse"].items()}


def _devices(plan: Plan) -> dict[str, list[tuple[int, int]]]:
    """The same of a shardwise plan."""
    devices: dict[str, list[tuple[int, int]]] = {}
    for shard in sorted(plan.shards, key=lambda s: (s.table, s.col_offset)):
        devices.setdefault(shard.table, []).append((shard.col_offset, shard.device))
    return devices


class OneDevice:
    """A search that puts every table whole on device 0: a plan the cost model rates slower than a spread one."""

    def search(self, task, cost_model, seed) -> Plan:  # noqa: ANN001
        return finish_plan(Plan(num_devices=task.num_devices, method="one_device",
                                shards=tuple(Shard(table=t.name, col_offset=0, dim=t.dim, device=0)
                                             for t in task.tables)), task, cost_model, planning_time_s=0.0, seed=seed)


class Moving:
    """NeuroShard's plan, its first k tables moved to the other device on the k-th search (a new placement each
    search, so that TorchRec's planner partitions each), recording the memory each search was given."""

    def __init__(self) -> None:
        self.memory_bytes: list[int] = []
        self.plans: list[Plan] = []
        self._search = make_searcher("neuroshard")

    def search(self, task, cost_model, seed) -> Plan:  # noqa: ANN001
        moved = {t.name for t in task.tables[:len(self.plans)]}
        plan = self._search.search(task, cost_model, seed)
        plan = plan.model_copy(update={"shards": tuple(
            s.model_copy(update={"device": (s.device + 1) % task.num_devices}) if s.table in moved else s
            for s in plan.shards)})
        self.memory_bytes.append(task.device_memory_bytes)
        self.plans.append(plan)
        return plan


def test_torchrecs_greedy_proposal_is_kept_where_the_cost_model_rates_it_at_least_as_fast(cost_model_uri):
    planner = _planner(cost_model_uri, searcher=OneDevice())
    chosen = _ranks(planner.plan(_model(), [EmbeddingBagCollectionSharder()]))
    searched = planner.last_plan
    assert searched is not None and {s.device for s in searched.shards} == {0}  # the search ran
    assert {rank for shards in chosen.values() for _, rank in shards} == {0, 1}, chosen  # TorchRec's greedy proposal
    assert f"{GREEDY} (the cost model rates it at least as fast as the search's)" in (planner.last_stats or "")


def test_the_searchs_plan_is_chosen_where_the_cost_model_rates_it_faster(cost_model_uri):
    """The control: the same planner with NeuroShard returns the search's plan."""
    planner = _planner(cost_model_uri)
    chosen = _ranks(planner.plan(_model(), [EmbeddingBagCollectionSharder()]))
    assert planner.last_plan is not None and set(_devices(planner.last_plan)) == NAMES
    assert chosen == _devices(planner.last_plan)
    assert "the plan: shardwise's neuroshard search" in (planner.last_stats or "")


class Refusing(PlacedPartitioner):
    """Refuses the search's placed proposals `limit` times, as TorchRec's partitioner refuses a plan over a rank's
    storage; TorchRec's proposals (no ranks) it partitions as shardwise's partitioner does."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.refused, self.taken = limit, 0, 0

    def partition(self, proposal, storage_constraint):  # noqa: ANN001, ANN201
        placed = any(o.shards and all(s.rank is not None for s in o.shards) for o in proposal)
        if placed and self.refused < self.limit:
            self.refused += 1
            raise PlannerError("over a rank's storage (refused)", PlannerErrorType.PARTITION)
        self.taken += placed
        return super().partition(proposal, storage_constraint)


def test_a_refused_plan_is_searched_again_with_less_memory_until_the_partitioner_takes_it(cost_model_uri):
    searcher, partitioner = Moving(), Refusing(limit=2)
    planner = _planner(cost_model_uri, searcher=searcher, partitioner=partitioner)
    planner.plan(_model(), [EmbeddingBagCollectionSharder()])
    assert (partitioner.refused, partitioner.taken, len(searcher.plans)) == (2, 1, 3)
    assert searcher.memory_bytes[0] > searcher.memory_bytes[1] > searcher.memory_bytes[2], searcher.memory_bytes
    assert planner.last_plan == searcher.plans[-1] and planner.search.last_error is None


def test_a_plan_refused_after_every_retry_falls_back_to_torchrecs_greedy_proposal(cost_model_uri):
    searcher, partitioner = Moving(), Refusing(limit=100)
    planner = _planner(cost_model_uri, searcher=searcher, partitioner=partitioner)
    chosen = _ranks(planner.plan(_model(), [EmbeddingBagCollectionSharder()]))
    assert len(searcher.plans) == 1 + ACCOUNTING_REPLANS == partitioner.refused and partitioner.taken == 0
    assert f"{GREEDY} (shardwise's search found no plan that fits)" in (planner.last_stats or "")
    assert f"after {ACCOUNTING_REPLANS} searches with less memory" in (planner.search.last_error or "")
    assert set(chosen) == NAMES


# -- the stages passed in are the ones used ---------------------------------------------------------------------------
def _counting(base: type, method: str) -> type:
    """`base` with `method` counting its calls in the class's `calls`."""
    def counted(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        type(self).calls += 1
        return getattr(base, method)(self, *args, **kwargs)

    return type(f"Counting{base.__name__}", (base,), {"calls": 0, method: counted})


@pytest.mark.parametrize("argument, stage", [
    ("enumerator", lambda: _counting(ShardwiseEnumerator, "enumerate")(topology=TOPOLOGY, batch_size=BATCH)),
    ("proposer", lambda: _counting(GreedyProposer, "propose")()),
    ("partitioner", lambda: _counting(GreedyPerfPartitioner, "partition")()),
    ("performance_model", lambda: _counting(NoopPerfModel, "rate")(TOPOLOGY)),
])
def test_a_stage_passed_to_the_planner_is_the_one_it_plans_with(cost_model_uri, argument, stage):
    counting = stage()
    planner = _planner(cost_model_uri, **{argument: counting})
    chosen = _ranks(planner.plan(_model(), [EmbeddingBagCollectionSharder()]))
    assert set(chosen) == NAMES
    assert type(counting).calls > 0, argument
    if argument == "proposer":  # shardwise's proposer replaced: no search ran
        assert planner.last_plan is None
    else:
        assert planner.last_plan is not None
