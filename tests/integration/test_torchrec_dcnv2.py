"""The real client: TorchRec's `DLRM_DCN` with the MLPerf DLRM-DCNv2 tables (rows scaled down to 2 cores), planned
by `ShardwisePlanner` with TorchRec's own arguments (a `Topology`, `batch_size`, `ParameterConstraints`) from a
trained cost model that has never seen tables like these, and trained by `DistributedModelParallel` on 2 gloo
ranks. By default the plan of tables the model never saw is TorchRec's planner's own; asked to search them anyway
(`adapt=0`), shardwise's plan trains. A CPU `Topology` and a CUDA-shaped one both give a plan; a plan rank 0 cannot
make fails every rank with the same error."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from dcnv2_model import (
    BATCH,
    STEPS,
    WORLD_SIZE,
    dcnv2,
    dcnv2_constraints,
    dcnv2_sharders,
    dcnv2_tables,
    gloo_rank,
    train_dcnv2,
)

pytestmark = pytest.mark.integration

GIB = 2**30


def _planner(topology, cost_model: str, **kwargs):  # noqa: ANN001, ANN003, ANN202 - as a TorchRec user writes it
    from shardwise.integrations.torchrec import ShardwisePlanner

    return ShardwisePlanner(topology, batch_size=BATCH, constraints=dcnv2_constraints(), cost_model=cost_model,
                            **kwargs)


def _worker(rank: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torchrec.distributed.planner.types import Topology

    result: dict = {}
    with gloo_rank(rank, out_dir):
        sharders = dcnv2_sharders()
        # 1 MiB of DDR per rank cannot hold the tables: rank 0's error reaches rank 1 instead of a broken pipe
        tiny = _planner(Topology(world_size=WORLD_SIZE, compute_device="cpu", ddr_cap=2**20), model_dir)
        try:
            tiny.collective_plan(dcnv2(torch.device("meta")), sharders, dist.group.WORLD)
        except Exception as err:  # noqa: BLE001 - its type, kind and message are what the test compares across ranks
            result["error"] = (type(err).__name__, str(getattr(err, "error_type", None)), str(err))

        # searched although the model never saw these tables (adapt=0: measure nothing), so that its plan trains
        planner = _planner(Topology(world_size=WORLD_SIZE, compute_device="cpu", hbm_cap=4 * GIB, ddr_cap=4 * GIB),
                           model_dir, adapt=0)
        plan = planner.collective_plan(dcnv2(torch.device("meta")), sharders, dist.group.WORLD)
        result.update(
            train_dcnv2(plan, rank),
            planned=sorted({(s.table, s.col_offset, s.dim, s.device) for s in planner.last_plan.shards})
            if rank == 0 else None,
            stats=planner.last_stats if rank == 0 else None,
        )
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A cost model trained on synthetic tables of dim at most 64 and pooling at most 40, as `make run`'s is."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
    from costmodel_synthetic import comm_rows, cost_frame, synthetic_tables

    from shardwise.costmodel import TrainConfig, train_cost_model

    tables = [t.model_copy(update={"dim": min(t.dim, 64)}) for t in synthetic_tables("a", 12, 0)]
    frame = pd.concat([cost_frame({"a": tables}, {"a": 60}, 0), comm_rows(10, 0)], ignore_index=True)
    model, _ = train_cost_model(frame, 0, TrainConfig(epochs=5, comm_epochs=5, progress=False))
    return str(model.save(tmp_path_factory.mktemp("model")))


def test_a_cuda_shaped_topology_plans_the_dcnv2_model_as_torchrecs_planner_does(model_dir):
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import Topology
    from torchrec.distributed.sharding_plan import get_default_sharders

    topology = Topology(world_size=WORLD_SIZE, compute_device="cuda", hbm_cap=4 * GIB)
    planner = _planner(topology, model_dir)
    plan = planner.plan(dcnv2(torch.device("meta")), get_default_sharders())
    devices = {str(m.placement.device()) for p in plan.plan["sparse_arch.embedding_bag_collection"].values()
               for m in p.sharding_spec.shards}
    assert devices == {"cuda:0", "cuda:1"}
    # tables the model never saw: TorchRec's planner's plan, the one it makes from the same arguments
    theirs = EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, constraints=dcnv2_constraints())
    assert plan == theirs.plan(dcnv2(torch.device("meta")), get_default_sharders())
    assert planner.last_plan is None and "the plan: TorchRec's planner's own" in planner.last_stats
    searched = _planner(topology, model_dir, adapt=0)
    searched.plan(dcnv2(torch.device("meta")), get_default_sharders())
    assert {s.table for s in searched.last_plan.shards} == {t.name for t in dcnv2_tables()}


@pytest.mark.slow  # DistributedModelParallel on 2 ranks: make test-all
def test_dlrm_dcn_on_the_mlperf_tables_planned_by_shardwise_trains_in_dmp(model_dir, tmp_path, monkeypatch):
    # the spawned workers import this module by its importlib-mode name: they need the repository root on sys.path
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))
    torch.multiprocessing.spawn(_worker, args=(model_dir, str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD_SIZE)]

    # TorchRec's planner's refusal, the same on every rank
    kind, error_type, message = ranks[0]["error"]
    assert ranks[1]["error"] == (kind, error_type, message)
    assert (kind, error_type) == ("PlannerError", "PlannerErrorType.INSUFFICIENT_STORAGE")
    assert message.startswith("Unable to find a plan for this model because of insufficient storage")

    stats = ranks[0]["stats"]
    assert "26 tables on 2 ranks" in stats
    # the cost model never saw dim 128 or 100 lookups per sample: the stats name the DCNv2 tables
    assert "dim 128 is 2x the largest seen (64): t0, t1, t2, t3 and 22 more" in stats
    assert "pooling 100 is 2.7x the largest seen (37.5): t20;" in stats
    assert {table for table, *_ in ranks[0]["planned"]} == {t.name for t in dcnv2_tables()}
    for rank in ranks:
        assert len(rank["losses"]) == STEPS and all(torch.isfinite(torch.tensor(rank["losses"])))
        assert rank["changed"] and all(rank["changed"].values()), rank["changed"]  # the fused optimizer ran
    # the dense layers are replicated and their gradients all-reduced: the ranks stay identical
    for name, value in ranks[0]["dense"].items():
        torch.testing.assert_close(ranks[1]["dense"][name], value, msg=name)
