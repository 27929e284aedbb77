"""Real models through the user's loop: TorchRec's DLRM_DCN on the MLPerf DLRM-DCNv2 tables (multi-hot) and DLRM on
the Criteo Kaggle tables (one-hot), exported (4 CPU ranks, batch 512 a rank, memory 2x the tables' even share),
`shardwise pipeline run --local` on them in a store of each set's own (WORKDIR/<preset>/<set>/mlflow.db; a rerun adds
versions), then in one session here, twice: (a) the registered @champion plan, (b) `ShardwisePlanner(cost_model=the
store's champion, adapt=0, refine=0).plan(model, sharders)` and (c) TorchRec's planner given the same arguments.
Criteo Kaggle at dim 128, not the Kaggle run's 16: at 16 a device's quarter of the tables measured 1.38 ms to a lone
tiny table's fixed 0.74 ms (batch 2048, rows x 0.001, 2-core CPU): any plan is mostly kernel overhead; at 128, 2.51 ms.

    python -m benchmarks real_models [--sets dcnv2,criteo_kaggle] [--preset smoke] [--publish-refine-s S] [--record]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from benchmarks import harness

# TorchRec's default batch a rank; memory 2x the even share: at 1.5x TorchRec's DCNv2 plan overran shardwise's count
BATCH_PER_RANK, MEMORY_SLACK = 512, 2.0  # of a rank's memory by 7%, and the publish step refused to measure it


class RealModelsSettings(harness.ExperimentSettings):
    """Which models, at which size, with which pipeline preset."""

    sets: tuple[Annotated[str, Field(pattern="^(dcnv2|criteo_kaggle)$")], ...] = Field(
        ("dcnv2", "criteo_kaggle"), min_length=1, json_schema_extra={"sep": ","}, description="table sets")
    row_scale: float = Field(default=0.001, gt=0, le=1, description="rows x this (CPU-sized tables)")
    criteo_dim: int = Field(default=128, ge=4, multiple_of=4, description="Criteo Kaggle's embedding dim")
    preset: str = Field(default="local", description="the pipeline's preset (smoke: minutes, rough figures)")
    devices: int = Field(default=4, ge=2, description="CPU ranks of the production task")
    timing_rounds: int | None = Field(default=None, ge=1, description="kernel timings a device shard (default: 9)")
    publish_refine_s: float | None = Field(default=None, ge=0, description="publish refinement s (default: preset's)")
    workdir: str = "runs/bench_real_models"


def export(name: str, settings: RealModelsSettings, folder: Path) -> tuple[Any, list[Any], Any, Path]:
    """The user's side: the model on meta (DLRM_DCN with MLPerf's dense layers, DLRM with the Kaggle run's), pooling
    as constraints, the fused row-wise Adagrad sharder; its tables and production task exported into `folder`."""
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import Topology
    from torchrec.models.dlrm import DLRM, DLRM_DCN
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from shardwise.integrations.torchrec import export_tables, export_task, save_production_task
    from shardwise.workload import criteo_kaggle_tables, mlperf_dcnv2_tables, save_tables, shard_memory_bytes

    meta, dcn, scale, batch = torch.device("meta"), name == "dcnv2", settings.row_scale, BATCH_PER_RANK * settings.devices
    tables = mlperf_dcnv2_tables(scale) if dcn else criteo_kaggle_tables(scale, settings.criteo_dim)
    ebc = EmbeddingBagCollection(device=meta, tables=[EmbeddingBagConfig(name=t.name, embedding_dim=t.dim,
        num_embeddings=t.rows, feature_names=[f"cat_{i}"]) for i, t in enumerate(tables)])
    model = (DLRM_DCN(ebc, 13, [512, 256, 128], [1024, 1024, 512, 256, 1], dcn_num_layers=3, dcn_low_rank_dim=512,
                      dense_device=meta) if dcn else DLRM(ebc, 13, [512, 256, 64, tables[0].dim], [512, 256, 1],
                                                          dense_device=meta))
    sharders = [EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD})]
    constraints = {t.name: ParameterConstraints(pooling_factors=[t.pooling_factor]) for t in tables}
    save_tables(export_tables(model, constraints, batch_size=batch), folder / "tables.json")
    memory = int(MEMORY_SLACK * shard_memory_bytes(tables, batch) / settings.devices)
    production = export_task(model, Topology(world_size=settings.devices, compute_device="cpu", hbm_cap=memory,
                                             ddr_cap=memory), name=name, constraints=constraints, sharders=sharders,
                             batch_size=BATCH_PER_RANK, storage_reservation=FixedPercentageStorageReservation(0.0))
    return model, sharders, production, save_production_task(production, folder / f"{name}.task.json")


def pipeline(name: str, settings: RealModelsSettings, folder: Path, store: str, task_path: Path) -> float:
    """`shardwise pipeline run --local` on the set's exported tables and task, in `store`; its seconds."""
    refine = ["--publish-refine-s", f"{settings.publish_refine_s:g}"] if settings.publish_refine_s is not None else []
    argv = [str(Path(sys.executable).parent / "shardwise"), "pipeline", "run", "--local", "--workdir",
            str(folder / "pipeline"), "--tracking-uri", store, "--preset", settings.preset, "--workload-tables",
            str(folder / "tables.json"), "--production-tasks", str(task_path), "--task-num-tables", "4",
            "--num-devices", str(settings.devices), *refine]
    started, log = time.perf_counter(), folder / "pipeline-run.log"
    with open(log, "w") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False,
                              env={**os.environ, "MLFLOW_TRACKING_URI": store, "OMP_NUM_THREADS": "1"})
    if done.returncode:  # the CLI's error is its last line
        raise harness.BenchmarkError(f"{name}: the pipeline failed: {log.read_text().strip().splitlines()[-1]} ({log})")
    return time.perf_counter() - started


def one_set(name: str, settings: RealModelsSettings, context: harness.Context) -> tuple[list[dict[str, Any]], str]:
    """Export, run the pipeline, plan (b) and (c) timed, measure (a)-(c) twice: the set's rows and its note."""
    from mlflow import MlflowClient
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    from shardwise.evaluation import evaluate_plans
    from shardwise.integrations.mlflow import CHAMPION, MlflowService, cost_model_name
    from shardwise.integrations.plan_registry import load_registered_plan, plan_name
    from shardwise.integrations.torchrec import ShardwisePlanner
    from shardwise.integrations.torchrec.production import as_shardwise_plan
    from shardwise.jobs.models import load_cost_model
    from shardwise.profiling import MeasurementSettings, hardware_kind

    (folder := (Path(settings.workdir) / settings.preset / name).resolve()).mkdir(parents=True, exist_ok=True)
    model, sharders, production, task_path = export(name, settings, folder)
    pipeline_s = pipeline(name, settings, folder, store := f"sqlite:///{folder / 'mlflow.db'}", task_path)
    service, client, ctx = MlflowService(store), MlflowClient(store), production.context
    cost_model, uri = load_cost_model(service, None, device="cpu", required=True)
    context.name_model(f"{name}: {harness.model_identity(service, uri or '')}")
    version = client.get_model_version_by_alias(cost_model_name(hardware_kind("cpu")), CHAMPION)
    registered = load_registered_plan(f"models:/{plan_name(name)}@{CHAMPION}", service=service)
    newest = max(int(v.version) for v in client.search_model_versions(f"name='{plan_name(name)}'"))
    plans: dict[str, tuple[Any, float | None]] = {"champion": (registered.plan, None)}
    for label, make in (("dropin", lambda **a: ShardwisePlanner(**a, cost_model=cost_model, adapt=0.0, refine=0.0)),
                        ("torchrec", EmbeddingShardingPlanner)):
        planner = make(topology=ctx.torchrec_topology(), batch_size=ctx.batch_size,
                       constraints=ctx.torchrec_constraints(), storage_reservation=ctx.torchrec_storage_reservation())
        started = time.perf_counter()  # the conversion to shardwise's form inside: microseconds
        plans[label] = (as_shardwise_plan(planner.plan(model, sharders), production, label), time.perf_counter() - started)
    measurement = MeasurementSettings(device="cpu", **settings.model_dump(include={"timing_rounds"}, exclude_none=True))
    measured = [dict(zip(plans, evaluate_plans(production.task, [
        (label, plan) for label, (plan, _) in plans.items()], folder / f"session-{i}", cost_model=cost_model,
        measurement=measurement, progress=False)[0])) for i in (1, 2)]
    sessions = [{label: cost.max_cost_ms for label, cost in costs.items()} for costs in measured]
    # a plan's mean device over TorchRec's slowest: for TorchRec's own plan, the ratio a placement balancing the same
    # work would reach (moving tables changes the work only by fused kernels' and all-to-alls' sub-additivity)
    means = [{label: cost.mean_cost_ms / costs["torchrec"].max_cost_ms for label, cost in costs.items()}
             for costs in measured]
    rows = [{"set": name, "plan": label, "session_1_ms": round(sessions[0][label], 3),
             "session_2_ms": round(sessions[1][label], 3), "ratio_to_torchrec": round((r[0] + r[1]) / 2, 3),
             "ratio_moved": round(abs(r[0] - r[1]), 3),
             "mean_device_ratio": round((means[0][label] + means[1][label]) / 2, 3),
             "planning_s": None if seconds is None else round(seconds, 2)}
            for label, (_, seconds) in plans.items() for r in [[s[label] / s["torchrec"] for s in sessions]]]
    mape = {k: round(v, 2) for k, v in client.get_run(version.run_id).data.metrics.items()
            if k in ("neural_heldout_tables_total_mape_pct", "heldout_top_decile_mape_pct")}  # the champion's own
    return rows, (f"{name}: {len(production.task.tables)} tables dim {production.task.tables[0].dim}, rows x "
                  f"{settings.row_scale}, {settings.devices} ranks x batch {BATCH_PER_RANK}; pipeline --preset "
                  f"{settings.preset} {pipeline_s:.0f} s; cost model {version.name} v{version.version} held-out "
                  f"{mape}; {plan_name(name)} v{newest} registered, champion v{registered.version}")


def run(settings: RealModelsSettings, context: harness.Context) -> harness.Outcome:
    """Each set through the loop: one table, a note per set."""
    done = [one_set(name, settings, context) for name in settings.sets]
    notes = [note for _, note in done] + [
        "ratio_to_torchrec: slowest devices', two sessions' mean (lower is better); mean_device_ratio: the plan's mean "
        "device over TorchRec's slowest, two sessions' mean (TorchRec's row: what balancing its work would reach)"]
    variant = settings.preset.replace("-", "_") if settings.preset != "local" else None  # a smoke run: its own record
    return harness.Outcome([row for rows, _ in done for row in rows], notes, variant and f"real_models_{variant}",
                           variant and f"Real models through the loop, --preset {settings.preset} (rough figures)")


harness.register(harness.Experiment(name="real_models", title="Real models through the loop: DLRM-DCNv2 and Criteo "
                                    "Kaggle DLRM, registered plans against TorchRec's planner (measured)",
                                    settings=RealModelsSettings, run=run, suites={"claims": (harness.SuiteRun({}),)}))
