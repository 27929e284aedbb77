"""What the drop-in experiments share: the MLPerf DLRM-DCNv2 tables as a TorchRec module, and one task planned by the
drop-in planner and by TorchRec's planner side by side. Imported as `benchmarks.dropin`."""

from __future__ import annotations

import contextlib
import time
from typing import Any


def dcnv2_module(row_scale: float) -> tuple[Any, dict[str, Any]]:
    """The DCNv2 embedding tables as an `EmbeddingBagCollection` on meta (in a torch module), and their
    ParameterConstraints."""
    import torch
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from shardwise.workload import mlperf_dcnv2_tables

    tables = mlperf_dcnv2_tables(row_scale)
    configs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[f"cat_{i}"])
               for i, t in enumerate(tables)]
    module = torch.nn.Module()
    module.sparse = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    constraints = {t.name: ParameterConstraints(pooling_factors=[t.pooling_factor]) for t in tables}
    return module, constraints


def plan_both(planner: Any, module: Any, torchrec: Any) -> tuple[Any, Any, Any, float, float, str, float]:
    """The drop-in planner's plan of `module` (the plan `plan()` returns) and TorchRec's planner's of the same task
    (None where it finds none: its storage estimate is larger than shardwise's), their seconds, which plan the
    drop-in returned ("search" or "torchrec_greedy"), and the seconds of TorchRec's `EmbeddingShardingPlanner` given
    the drop-in's own arguments (topology, batch, constraints, reservation, default sharders)."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import PlannerError
    from torchrec.distributed.sharding_plan import get_default_sharders

    from shardwise.search import Plan, PlanError

    start = time.perf_counter()
    sharding_plan = planner.plan(module)
    ours_s = time.perf_counter() - start
    task, searched = planner.last_task, planner.last_plan
    # every table here is one shardwise searches: its task holds them all
    assert task is not None and searched is not None, planner.last_stats
    (module_plan,) = sharding_plan.plan.values()  # the one EmbeddingBagCollection, wherever it sits
    ours, returned = _returned(module_plan, task.num_devices, searched)
    start = time.perf_counter()
    try:
        theirs: Plan | None = torchrec.search(task, None, 0)
    except PlanError as err:
        print(f"{len(task.tables)} tables on {task.num_devices} devices: {err}")
        theirs = None
    theirs_s = time.perf_counter() - start
    same = EmbeddingShardingPlanner(topology=planner._topology, batch_size=planner._batch_size,
                                    constraints=planner._constraints, storage_reservation=planner._storage_reservation,
                                    debug=False)
    start = time.perf_counter()
    with contextlib.suppress(PlannerError):
        same.plan(module, get_default_sharders())
    return task, ours, theirs, ours_s, theirs_s, returned, time.perf_counter() - start


def _returned(module_plan: Any, num_devices: int, searched: Any) -> tuple[Any, str]:
    """The plan the drop-in returned, as a shardwise plan: its search's, or TorchRec's greedy proposal (where that
    has sharding types shardwise does not measure, the search's plan, and the label says so)."""
    from shardwise.integrations.torchrec import plan_from_module_sharding
    from shardwise.search import PlanError

    try:
        plan = plan_from_module_sharding(module_plan, num_devices, "dropin_torchrec_greedy")
    except PlanError as err:
        print(f"the drop-in returned TorchRec's greedy proposal, not measurable here ({err}): measuring the search's")
        return searched, "torchrec_greedy (search's measured)"
    return (searched, "search") if _placements(plan) == _placements(searched) else (plan, "torchrec_greedy")


def _placements(plan: Any) -> tuple[list[tuple[str, int, int, int]], set[str], set[str]]:
    return (sorted((s.table, s.col_offset, s.dim, s.device) for s in plan.shards), set(plan.data_parallel),
            set(plan.row_wise))
