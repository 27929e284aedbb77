"""The loop on the real client: TorchRec's `DLRM_DCN` with the MLPerf DLRM-DCNv2 tables exported as a workload and as a
production task, planned, measured and registered by `shardwise publish` in an MLflow store, then a 2-rank gloo
`DistributedModelParallel` job that loads `@champion` through `MlflowPlanLoader`, with TorchRec's own planner and
with the drop-in, and trains; the same job with one table grown fails on every rank with one line naming it."""

from __future__ import annotations

from pathlib import Path

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

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GIB = 2**30
URI = "models:/shardwise-plan-dcnv2@champion"


def _topology():  # noqa: ANN202 - the job's TorchRec Topology
    from torchrec.distributed.planner.types import Topology

    return Topology(world_size=WORLD_SIZE, compute_device="cpu", hbm_cap=4 * GIB, ddr_cap=4 * GIB)


def _worker(rank: int, store: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    from shardwise.integrations.torchrec import MlflowPlanLoader, ShardwiseEnumerator, ShardwisePlanner

    result: dict = {}
    with gloo_rank(rank, out_dir):
        topology, constraints, sharders = _topology(), dcnv2_constraints(), dcnv2_sharders()
        # TorchRec's own planner: its enumerator shardwise's, so that column slices the plan holds are options
        enumerator = ShardwiseEnumerator(topology=topology, batch_size=BATCH, constraints=constraints)
        theirs = EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, constraints=constraints,
                                          enumerator=enumerator,
                                          plan_loader=MlflowPlanLoader(URI, tracking_uri=store, enumerator=enumerator))
        plan = theirs.collective_plan(dcnv2(torch.device("meta")), sharders, dist.group.WORLD)
        result["torchrec"] = str(plan)
        result.update(train_dcnv2(plan, rank))
        # the drop-in, as a training job writes it: no cost model, the registered plan taken
        ours = ShardwisePlanner(topology, batch_size=BATCH, constraints=constraints,
                                plan_loader=MlflowPlanLoader(URI, tracking_uri=store))
        result["drop_in"] = str(ours.collective_plan(dcnv2(torch.device("meta")), sharders, dist.group.WORLD))
        grown = ShardwisePlanner(topology, batch_size=BATCH, constraints=constraints,
                                 plan_loader=MlflowPlanLoader(URI, tracking_uri=store))
        try:
            grown.collective_plan(dcnv2(torch.device("meta"), rows={"t3": 9000}), sharders, dist.group.WORLD)
        except Exception as err:  # noqa: BLE001 - its type and message are what the test compares across ranks
            result["error"] = (type(err).__name__, str(err))
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")


def test_dcnv2_exported_published_and_loaded_by_a_dmp_job(tmp_path, tiny_cost_model, monkeypatch):
    from shardwise.integrations.mlflow import MlflowService
    from shardwise.integrations.plan_registry import load_registered_plan
    from shardwise.integrations.torchrec import export_tables, export_task, save_production_task
    from shardwise.jobs import publish
    from shardwise.profiling import MeasurementSettings
    from shardwise.workload import save_tables

    monkeypatch.setenv("SHARDWISE_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))  # the spawned workers import this module by name
    meta = dcnv2(torch.device("meta"))
    tables = save_tables(export_tables(meta, dcnv2_constraints(), batch_size=BATCH * WORLD_SIZE),
                         tmp_path / "tables.json")
    assert tables.is_file()
    task = save_production_task(export_task(meta, _topology(), name="dcnv2", constraints=dcnv2_constraints(),
                                            sharders=dcnv2_sharders(), batch_size=BATCH), tmp_path / "dcnv2.task.json")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    model_dir = tiny_cost_model[0].save(tmp_path / "model")
    done = publish.run(publish.PublishSettings(
        task=(str(task),), model=str(model_dir), out=str(tmp_path / "publish"), refine_s=0,
        measurement=MeasurementSettings(timing_rounds=1, comm_rounds=1, comm_iters=2)),
        mlflow=MlflowService(store), progress=False)
    (published,) = done.tasks
    assert (published.version, published.alias) == ("1", "champion")
    assert published.plan_ms > 0 and published.torchrec_ms > 0
    registered = load_registered_plan(URI, tracking_uri=store)
    assert {s.table for s in registered.plan.shards} | set(registered.plan.data_parallel) | set(
        registered.plan.row_wise) == {t.name for t in dcnv2_tables()}

    torch.multiprocessing.spawn(_worker, args=(store, str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD_SIZE)]
    for rank in ranks:
        assert rank["torchrec"] == rank["drop_in"] == ranks[0]["torchrec"]  # the registered plan, both ways
        assert len(rank["losses"]) == STEPS and all(torch.isfinite(torch.tensor(rank["losses"])))
        assert rank["changed"] and all(rank["changed"].values()), rank["changed"]  # the fused optimizer ran
    kind, message = ranks[0]["error"]
    assert ranks[1]["error"] == (kind, message)
    assert kind == "PlannerError" and "\n" not in message
    assert "table 'sparse_arch.embedding_bag_collection.t3' rows" in message and "-> 9000" in message
