"""A registered plan loaded through `MlflowPlanLoader` under TorchRec's own `EmbeddingShardingPlanner.collective_plan`
on 2 gloo ranks with a 60 s group timeout: only rank 0 plans there, and where the loader refuses (a table grown, the
planner's context changed otherwise, a version without torchrec_plan.json) every rank raises the same one-line
`PlannerError` within seconds, none waiting out the group's timeout for a broadcast; the unchanged model gets the
registered plan on both ranks, before and after the refusals (the group stays in step)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch
from dcnv2_model import WORLD_SIZE, gloo_rank
from torch import nn

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BATCH = 256
ROWS = 1000
#: each case: the first table's rows, the storage reservation's share (None: TorchRec's default), the files' folder
CASES = {
    "unchanged": (ROWS, None, "files"),
    "grown": (3 * ROWS, None, "files"),
    "other reservation": (ROWS, 0.3, "files"),
    "no torchrec_plan.json": (ROWS, None, "broken"),
    "unchanged again": (ROWS, None, "files"),
}
#: what a rank waiting for a broadcast would wait (dcnv2_model.gloo_rank's group timeout)
GROUP_TIMEOUT_S = 60.0


def _topology():  # noqa: ANN202 - TorchRec's Topology
    from torchrec.distributed.planner.types import Topology

    return Topology(world_size=WORLD_SIZE, compute_device="cpu", ddr_cap=2**30)


def _model(rows0: int = ROWS) -> nn.Module:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    model = nn.Module()
    model.sparse = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=16 * (1 + i % 2), num_embeddings=rows0 if i == 0 else 500 * i,
                           feature_names=[f"f{i}"]) for i in range(4)], device=torch.device("meta"))
    return model


def _constraints():  # noqa: ANN202 - TorchRec's ParameterConstraints by table
    from torchrec.distributed.planner import ParameterConstraints

    return {f"t{i}": ParameterConstraints(pooling_factors=[1.0 + i]) for i in range(4)}


def _worker(rank: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation

    from shardwise.integrations.torchrec import MlflowPlanLoader, ShardwiseEnumerator

    results = {}
    with gloo_rank(rank, out_dir):
        for case, (rows0, reserved, folder) in CASES.items():
            enumerator = ShardwiseEnumerator(topology=_topology(), batch_size=BATCH, constraints=_constraints())
            planner = EmbeddingShardingPlanner(
                topology=_topology(), batch_size=BATCH, constraints=_constraints(), enumerator=enumerator,
                storage_reservation=FixedPercentageStorageReservation(reserved) if reserved is not None else None,
                plan_loader=MlflowPlanLoader(Path(out_dir) / folder, enumerator=enumerator))
            started = time.monotonic()
            try:
                plan = planner.collective_plan(_model(rows0), [EmbeddingBagCollectionSharder()], dist.group.WORLD)
                results[case] = ("plan", {t: list(p.ranks) for t, p in plan.plan["sparse"].items()}, None)
            except Exception as err:  # noqa: BLE001 - its type, line and error type are compared across ranks
                error_type = getattr(err, "error_type", None)
                results[case] = (type(err).__name__, str(err), error_type.name if error_type else None)
            results[case] += (time.monotonic() - started,)
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")


def test_a_refused_registered_plan_fails_every_rank_of_torchrecs_collective_plan_at_once(tmp_path, tiny_cost_model,
                                                                                        monkeypatch):
    from shardwise.integrations.plan_registry import write_plan_files
    from shardwise.integrations.torchrec.context import (
        export_task,
        load_production_task,
        save_production_task,
    )
    from shardwise.integrations.torchrec.production import plan_production_task

    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))  # the spawned workers import this module by name
    task = save_production_task(export_task(_model(), _topology(), name="ranks", constraints=_constraints(),
                                            batch_size=BATCH), tmp_path / "ranks.task.json")
    planned = plan_production_task(load_production_task(task), tiny_cost_model[0], refine_s=0)
    files = write_plan_files(tmp_path / "files", planned.plan, task, {"plan_ms": 1.0},
                             planned.torchrec.model_dump(mode="json"))
    shutil.copytree(files, tmp_path / "broken")
    (tmp_path / "broken" / "torchrec_plan.json").unlink()
    registered = {o.name: [s.rank for s in o.shards] for o in planned.torchrec.options}

    torch.multiprocessing.spawn(_worker, args=(str(tmp_path),), nprocs=WORLD_SIZE, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD_SIZE)]
    refused = {"grown": ("PLANNER_INPUT_CONTEXT_MISMATCH", "table 'sparse.t0' rows 1000 -> 3000"),
               "other reservation": ("PLANNER_INPUT_CONTEXT_MISMATCH", "context hash"),
               "no torchrec_plan.json": ("PLAN_LOADING_FAILED", "has no torchrec_plan.json")}
    for case, (error_type, words) in refused.items():
        kind, message, seen_type, _ = ranks[0][case]
        assert (kind, seen_type) == ("PlannerError", error_type), ranks[0][case]
        assert words in message and "\n" not in message, message
        for rank in ranks:
            assert rank[case][:3] == (kind, message, seen_type), (case, rank[case])
            assert rank[case][3] < GROUP_TIMEOUT_S / 3, (case, rank[case])  # none waited for the group's timeout
    for case in ("unchanged", "unchanged again"):
        assert [r[case][:2] for r in ranks] == [("plan", registered)] * WORLD_SIZE, case
