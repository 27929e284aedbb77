"""The drop-in planner against TorchRec's on the MLPerf DLRM-DCNv2 tables and the paper task sets: measured plan
cost and planning time.

The 26 tables of MLPerf training's DLRM-DCNv2 (Criteo 1TB, embedding dim 128, multi-hot pooling per table; rows
scaled down to fit CPU memory), and the first N tasks of each of the plan_quality experiment's paper task sets (10-60
tables on 4 devices, 80-120 on 8), each planned two ways for the same `EmbeddingBagCollection` on meta:
`ShardwisePlanner(...).plan(module)` (the cost model: this hardware's champion or --model) and TorchRec's
`EmbeddingShardingPlanner` (the `torchrec` method: fused kernel, the same pooling factors and memory cap). The
drop-in's plan is the one `plan()` returns: its search's, or TorchRec's greedy proposal where the cost model rates
that faster (the `returned` column says which). All plans are measured in one session on this machine's fbgemm
kernels and all-to-alls (evaluation.measure_plans).

    python -m benchmarks torchrec_dropin --model MODEL_DIR [--devices 4] [--paper-tasks 3] [--adapt SECONDS] [--record]

With --adapt, the DCNv2 tables are also planned after the drop-in adapts the cost model on this machine (the
task's tables timed alone and in fused groups, the model fine-tuned on them: shardwise.evaluation.adapt); the
other runs are planned without adaptation.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

from pydantic import Field

from benchmarks.harness import Context, Experiment, ExperimentSettings, Outcome, SuiteRun, register
from benchmarks.plan_runs import paper_tasks


class TorchrecDropinSettings(ExperimentSettings):
    """Which cost model, which tasks, whether to adapt."""

    model: str | None = Field(default=None, description="cost model directory or URI (default: the champion)")
    devices: int = Field(default=4, ge=1)
    row_scale: float = Field(default=0.001, gt=0, description="rows x this (CPU-sized tables)")
    memory_slack: float = Field(default=1.5, gt=0, description="memory per device = slack x even share")
    paper_tasks: int = Field(default=3, ge=0, description="also the first N tasks of each paper task set (0: the "
                             "DCNv2 tables only)")
    adapt: float = Field(default=0.0, ge=0, description="also plan the DCNv2 tables after adapting the cost model "
                         "here for this many seconds (0: not)")
    seed: int = 0


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


def run(settings: TorchrecDropinSettings, context: Context) -> Outcome:
    """Plan the DCNv2 tables (and adapted), a small task with every default, and paper tasks, both ways; measure every
    plan in one session."""
    from shardwise.evaluation import measure_plans
    from shardwise.integrations.torchrec import ShardwisePlanner, ebc_on_meta
    from shardwise.profiling import MeasurementSettings
    from shardwise.search import make_searcher
    from shardwise.workload import ShardingTask, TableSpec, shard_memory_bytes

    torchrec = make_searcher("torchrec")
    model = context.cost_model(settings.model, required=True)
    module, constraints = dcnv2_module(settings.row_scale)
    tables = [TableSpec(name=c.name, rows=c.num_embeddings, dim=c.embedding_dim, pooling_factor=1.0)
              for c in module.sparse.embedding_bag_configs()]
    need = shard_memory_bytes(tables, 2048)

    def dcnv2_planner(adapt: float) -> Any:
        # 2048 samples a step over the ranks, the batch `make run`'s model was profiled at (TorchRec's is per rank)
        return ShardwisePlanner(world_size=settings.devices, batch_size=2048 // settings.devices,
                                constraints=constraints, device_type="cpu",
                                device_memory_bytes=int(settings.memory_slack * need / settings.devices),
                                storage_reservation=0.0, cost_model=model, adapt=adapt)

    notes: list[str] = []
    planner = dcnv2_planner(0.0)  # the run without adaptation
    runs = [("mlperf-dcnv2", *plan_both(planner, module, torchrec))]
    outside = planner.last_plan.extra.get("outside_training") if planner.last_plan else None
    notes.append(f"mlperf-dcnv2: {outside or 'inside the cost model training ranges'}")
    if settings.adapt:
        adapting = dcnv2_planner(settings.adapt)
        runs.append(("mlperf-dcnv2 adapted", *plan_both(adapting, module, torchrec)))
        notes.append(f"mlperf-dcnv2: {adapting.last_adaptation.line() if adapting.last_adaptation else 'not adapted'}")
        if adapting.last_refinement:  # the starts measured, the rounds and what they kept
            print(adapting.last_refinement.table())
        if adapting.last_plan is not None and adapting.last_task is not None:
            split = sorted({s.table for s in adapting.last_plan.shards
                            if s.dim < adapting.last_task.table(s.table).dim})
            notes.append(f"mlperf-dcnv2 adapted: column-split tables {', '.join(split) or 'none'}")
    # a few small tables, as TorchRec's planner tests have, planned with the drop-in's defaults (batch, reservation,
    # adaptation and refinement where they pay): planning time beside TorchRec's planner given the same arguments
    small = ShardwisePlanner(world_size=2, device_type="cpu", device_memory_bytes=2**30, cost_model=model)
    small_task = ShardingTask(num_devices=2, device_memory_bytes=2**30, batch_size=1024, tables=tuple(
        TableSpec(name=f"t{i}", rows=100, dim=64, pooling_factor=1.0) for i in range(4)))
    runs.append(("small-4x100 defaults", *plan_both(small, ebc_on_meta(small_task), torchrec)))
    notes.append(f"small-4x100 defaults: {'adapted' if small.last_adaptation else 'not adapted'}")
    batch = getattr(model, "batch_size", None) or 2048  # the cost model's, as it was trained and is measured
    for name, task in paper_tasks(settings.paper_tasks, settings.seed, batch) if settings.paper_tasks else []:
        # the task's own tables, pooling and skew; the planner takes its memory budget as it is; not adapted (the
        # line says where the drop-in's default would adapt)
        dropin = ShardwisePlanner(task=task, device_type="cpu", cost_model=model, adapt=0.0)
        runs.append((name, *plan_both(dropin, ebc_on_meta(task), torchrec)))

    # measured as the cost model's data was (its reference timing and batch), like the plan_quality experiment
    measurement = MeasurementSettings(device="cpu").for_cost_model(getattr(model, "reference_ms", None),
                                                                   getattr(model, "batch_size", None))
    pairs = [(task, plan) for _, task, ours, theirs, *_ in runs for plan in (ours, theirs) if plan is not None]
    measured = iter(measure_plans(pairs, measurement))
    # floor: the plan's mean device cost over TorchRec's slowest device, the ratio its shards would reach perfectly
    # balanced (a split that adds work raises it: a column half of a lookup-bound table costs more than half of it)
    rows: list[dict[str, Any]] = []
    for index, (name, task, _, theirs, ours_s, theirs_s, returned, same_s) in enumerate(runs):
        ours_cost = next(measured)
        mine = ours_cost.max_cost_ms
        baseline = next(measured).max_cost_ms if theirs is not None else None
        ratio = mine / baseline if baseline else None
        floor = ours_cost.mean_cost_ms / baseline if baseline else None
        label = name if name.startswith(("mlperf-dcnv2", "small")) else (
            f"{name} #{sum(r[0] == name for r in runs[:index]) + 1}")
        rows.append({"task": label, "tables": len(task.tables), "devices": task.num_devices,
                     "shardwise_max_ms": round(mine, 3), "torchrec_max_ms": baseline and round(baseline, 3),
                     "ratio_to_torchrec": ratio and round(ratio, 3),
                     "balanced_floor": floor and round(floor, 3), "planning_s": round(ours_s, 2),
                     "torchrec_planning_s": round(theirs_s, 2), "torchrec_same_args_planning_s": round(same_s, 2),
                     "returned": returned})
    for name in dict.fromkeys(r[0] for r in runs):
        ratios = [r["ratio_to_torchrec"] for r in rows if r["task"].split(" #")[0] == name and r["ratio_to_torchrec"]]
        if ratios:
            notes.append(f"{name}: ShardwisePlanner / TorchRec's planner = {statistics.fmean(ratios):.3f} on average "
                         f"over the {len(ratios)} task(s) both planned (measured slowest device, lower is better)")
    notes.insert(0, f"DCNv2 on {settings.devices} devices, rows x {settings.row_scale}, memory slack "
                 f"{settings.memory_slack}; first {settings.paper_tasks} task(s) of each paper set"
                 + (f"; DCNv2 also planned after {settings.adapt:g} s of adaptation (planning s includes it)"
                    if settings.adapt else ""))
    return Outcome(rows, notes)


register(Experiment(
    name="torchrec_dropin",
    title="Drop-in planner vs TorchRec's: the MLPerf DLRM-DCNv2 tables and paper tasks (measured)",
    settings=TorchrecDropinSettings,
    run=run,
    suites={"claims": (SuiteRun({"model": "models:/shardwise-cost-cpu-x86_64-2c@champion", "paper_tasks": 3,
                                 "adapt": 120.0}),)},
))
