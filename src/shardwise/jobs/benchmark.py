"""`shardwise benchmark`: the papers' task sets, planned by every method, every plan measured on hardware."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from shardwise.extras import require
from shardwise.integrations.mlflow import MlflowService
from shardwise.profiling import MeasurementSettings
from shardwise.search import Searcher, get_method, method_names
from shardwise.workload import load_tables

from .base import JobResult, JobSettings, SettingsError, refine_budget_field
from .models import load_cost_model
from .plan import build_searcher

if TYPE_CHECKING:
    from shardwise.evaluation import TaskSetSpec

EXPERIMENT = "shardwise-benchmark"
_METRICS = ("mean_cost_ms", "mean_compute_ms", "ratio_to_torchrec", "ratio_to_best_baseline", "imbalance",
            "memory_headroom", "planning_time_s", "prediction_error", "mean_samples_per_s",
            "throughput_ratio_to_torchrec")


def default_methods() -> tuple[str, ...]:
    """Every registered method that plans without a trained policy (policies are benchmarked when named)."""
    return tuple(name for name in method_names() if get_method(name).policy is None)


class BenchmarkSettings(JobSettings):
    """Which tables the tasks come from, which methods plan them, how plans are measured."""

    tables: str = Field(description="held-out shardwise.tables/v1 file the tasks are drawn from")
    methods: tuple[str, ...] | None = Field(
        default=None, description="comma-separated (default: every method that needs no trained policy)",
        json_schema_extra={"sep": ","},
    )
    task_sets: Literal["paper", "small"] = Field(
        default="paper", description="paper: 10-60 tables on 4 devices, 80-120 on 8; small: 6-10 on 4, 16-24 on 8"
    )
    num_tasks: int | None = Field(default=None, ge=1, description="tasks per set (default: the set's)")
    seed: int = 0
    out: str = Field(default="runs/benchmark", description="plans, measurements and the report")
    model: str | None = Field(default=None,
                              description="cost model URI: its reference timing, batch, predictions")
    tracking_uri: str | None = Field(default=None, description="MLflow tracking URI (else $MLFLOW_TRACKING_URI)")
    throughput_tasks: int = Field(
        default=0, ge=0, description="also train TorchRec's DLRM under every method's plan of the first N tasks "
        "of each set (as `validate` does) and report samples/s and thru/torchrec, higher is better (0: off)",
    )
    throughput_iters: int = Field(default=20, ge=1, description="timed training iterations per plan")
    throughput_warmup: int = Field(default=5, ge=0, description="warm-up training iterations per plan (not timed)")
    refine: int = Field(
        default=3, ge=0, le=50, description="also refine every learned method's plan on this machine for up to this "
        "many rounds, from the faster of it and the measured greedy's plan, reported as <method>+refine (needs "
        "--model; 0: off)")
    refine_budget_s: float | None = refine_budget_field()
    resume: bool = Field(
        default=False, description="take each task already measured in --out with the same task, methods, settings "
        "and cost model from there instead of measuring it again (an interrupted run goes on where it stopped)")
    measurement: MeasurementSettings = MeasurementSettings()

    @field_validator("methods")
    @classmethod
    def _registered(cls, methods: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for method in methods or ():
            get_method(method)
        return methods


class BenchmarkResult(JobResult):
    """Per task set and method: measured cost and its ratios (the summary rows), and where the report is."""

    rows: list[dict[str, Any]]
    out: str
    run_id: str | None = None

    def summary(self) -> str:
        """The summary table and the report's path."""
        # the suite (torch): the run that made the rows has loaded it
        from shardwise.evaluation import format_summary

        lines = [format_summary(self.rows), f"report: {self.out}/benchmark.html"]
        if self.run_id:
            lines.append(f"mlflow run {self.run_id}")
        return "\n".join(lines)


def run(settings: BenchmarkSettings, *, mlflow: MlflowService | None = None) -> BenchmarkResult:
    """Draw the task sets, build each method's searcher once, plan and measure everything."""
    # the suite (torch, the kernels) loads only when it runs: `benchmark --help` and a command line's mistakes answer
    # without it
    from shardwise.evaluation import TASK_SETS, make_task_set, run_benchmark

    pool = load_tables(settings.tables)
    specs: tuple[TaskSetSpec, ...] = TASK_SETS[settings.task_sets]
    if settings.num_tasks:
        specs = tuple(s.model_copy(update={"num_tasks": settings.num_tasks}) for s in specs)
    try:
        task_sets = {s.name: make_task_set(pool, s, seed=settings.seed) for s in specs}
    except ValueError as err:
        raise SettingsError(f"--tables {settings.tables}: {err}") from None
    tracking = settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    require("report")  # a missing extra said before minutes of measuring, not after
    if tracking and mlflow is None:
        require("mlflow")
    service = mlflow or MlflowService(settings.tracking_uri)
    cost_model = None
    if settings.model:
        cost_model, _ = load_cost_model(service, settings.model, device=settings.measurement.device, required=True)
    measurement = settings.measurement
    if cost_model is not None:
        measurement = measurement.for_cost_model(cost_model.reference_ms, cost_model.batch_size)
    methods = list(settings.methods or default_methods())
    if cost_model is None:
        skipped = [m for m in methods if get_method(m).needs_cost_model]
        if skipped:
            print(f"benchmark: no cost model, skipping {', '.join(skipped)}")
        methods = [m for m in methods if m not in skipped]
    searchers: dict[str, Searcher] = {
        m: build_searcher(m, {}, mlflow=service, measurement=measurement,
                          hardware=cost_model.hardware_kind if cost_model is not None else None)
        for m in methods
    }
    _, rows = run_benchmark(
        task_sets, searchers, learned=[m for m in methods if get_method(m).learned], cost_model=cost_model,
        measurement=measurement, seed=settings.seed, out_dir=settings.out,
        throughput_tasks=settings.throughput_tasks, throughput_iters=settings.throughput_iters,
        throughput_warmup=settings.throughput_warmup, refine_rounds=settings.refine,
        refine_budget_s=settings.refine_budget_s, resume=settings.resume,
    )
    run_id = None
    if tracking or mlflow is not None:
        metrics = {f"{r['task_set']}.{r['method']}.{key}": r[key] for r in rows for key in _METRICS
                   if isinstance(r.get(key), int | float)}
        params = {**settings.model_dump(mode="json", exclude={"measurement", "tracking_uri"}), "methods": ",".join(methods),
                  "batch_size": measurement.batch_size, "task_sets": [s.model_dump() for s in specs]}
        run_id = service.log_run(experiment=EXPERIMENT, run_name="benchmark", params=params, metrics=metrics,
                                 artifacts_dir=settings.out, artifact_path="benchmark")
    return BenchmarkResult(rows=rows, out=settings.out, run_id=run_id)
