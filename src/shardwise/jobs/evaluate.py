"""`shardwise evaluate`: measure plans' per-device cost on this machine's kernels, in one session."""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import Field, model_validator

from shardwise.evaluation import MeasuredPlanCost, PlanComparison
from shardwise.evaluation.refine_record import Refinement
from shardwise.evaluation.report import summary_page
from shardwise.extras import require, require_fbgemm
from shardwise.integrations.mlflow import MlflowService
from shardwise.profiling import MeasurementSettings
from shardwise.search import Plan, PlanError, load_plan, save_plan, validate_plan
from shardwise.workload import ShardingTask, load_task

from .base import JobResult, JobSettings, SettingsError, default_refine_budget_s, refine_budget_field
from .models import load_cost_model

EXPERIMENT = "shardwise-evaluate"
#: refinement rounds when a cost model is given and --refine is not
DEFAULT_REFINE_ROUNDS = 3
#: a report name becomes a file name in the output folder: letters, digits, '.', '_', '-' only
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$")


class EvaluateSettings(JobSettings):
    """Which plans of which task to measure, and how."""

    task: str = Field(description="shardwise.task/v1 file")
    plan: tuple[str, ...] = Field(
        min_length=1, description="shardwise.plan/v1 file (from any tool); repeat to measure and compare several "
        "plans in one session",
    )
    out: str | None = Field(default=None, description="report directory (default: <first plan>_eval next to it)")
    name: tuple[str, ...] = Field(
        default=(), description="report name of each --plan, in order (default: file stems, else methods)"
    )
    model: str | None = Field(default=None,
                              description="cost model URI: its reference timing, batch, predictions")
    tracking_uri: str | None = Field(default=None, description="MLflow tracking URI (else $MLFLOW_TRACKING_URI)")
    refine: int | None = Field(
        default=None, ge=0, le=50,
        description=f"refine the first plan on this machine for up to this many rounds (needs --model; default "
                    f"{DEFAULT_REFINE_ROUNDS} with --model, 0 without): the refined plan is measured beside the others "
                    "as <name>-refined")
    refine_budget_s: float | None = refine_budget_field(scaled=True)
    refine_from_greedy: bool = Field(
        default=True, description="refinement also measures the greedy on measured single-table costs and goes on "
                                  "from the faster of the two plans (each table timed alone once)")
    refine_dataset: str | None = Field(default=None,
                                       description="append every device shard refinement times to this cost dataset "
                                                   "(directory or s3:// prefix), for the next pre-training")
    measurement: MeasurementSettings = MeasurementSettings()

    @model_validator(mode="after")
    def _names(self) -> EvaluateSettings:
        if self.name and len(self.name) != len(self.plan):
            raise ValueError(
                f"--name given {len(self.name)} times for {len(self.plan)} --plan; give one per plan or none"
            )
        for name in self.name:
            if not _SAFE_NAME.match(name):
                raise ValueError(f"--name {name!r}: use letters, digits, '.', '_' and '-' (it names report files)")
        return self


class EvaluateResult(JobResult):
    """Each plan's measured cost, their comparison, and the files written."""

    names: list[str]
    costs: list[MeasuredPlanCost]
    comparison: PlanComparison
    paths: list[str]
    run_id: str | None = None
    refinement: Refinement | None = None

    def summary(self) -> str:
        """Per-device tables, the comparison when several plans, the refinement's rounds, the files."""
        parts = [f"{n}:\n{c.table()}" if len(self.costs) > 1 else c.table() for n, c in zip(self.names, self.costs)]
        if len(self.costs) > 1:
            parts.append(self.comparison.table())
        if self.refinement:
            parts.append(self.refinement.table())
        parts.append(f"wrote {', '.join(self.paths)}")
        if self.run_id:
            parts.append(f"mlflow run {self.run_id}")
        return "\n".join(parts)


def load_task_and_plans(task_path: str, plan_paths: tuple[str, ...]) -> tuple[ShardingTask, list[Plan]]:
    """The task and its plans, each checked against it (a PlanError names the plan file and what is wrong)."""
    task = load_task(task_path)
    plans = []
    for path in plan_paths:
        try:
            plan = load_plan(path)
            validate_plan(plan, task)
        except PlanError as err:
            raise PlanError(f"{path}: invalid plan for {task_path}: {err}") from None
        plans.append(plan)
    return task, plans


def report_names(paths: tuple[str, ...], plans: list[Plan]) -> list[str]:
    """Report names: file stems, else methods, else stem-<i>; all unique and safe as file names."""
    for names in ([Path(p).stem for p in paths], [plan.method for plan in plans]):
        if len(set(names)) == len(names) and all(_SAFE_NAME.match(n) for n in names):
            return names
    return [f"plan-{i}" for i in range(len(paths))]


def run(settings: EvaluateSettings, *, mlflow: MlflowService | None = None, progress: bool = True) -> EvaluateResult:
    """Measure every plan in one session; write reports; log to MLflow when a tracking URI is set."""
    # the kernels (torch, fbgemm) load only when measuring: `evaluate --help` and a command line's mistakes answer
    # without them
    from shardwise.evaluation import evaluate_plans
    from shardwise.evaluation.refine import refine_plan

    task, plans = load_task_and_plans(settings.task, settings.plan)
    names = list(settings.name) or report_names(settings.plan, plans)
    # log to MLflow only when asked: --tracking-uri or $MLFLOW_TRACKING_URI
    tracking = settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    require("report")  # a missing extra said before minutes of measuring, not after
    require_fbgemm()
    if tracking and mlflow is None:
        require("mlflow")
    service = mlflow or MlflowService(settings.tracking_uri)
    cost_model = None
    if settings.model:
        cost_model, _ = load_cost_model(service, settings.model, device="cpu", required=True)
    first = Path(settings.plan[0])
    out = Path(settings.out) if settings.out else first.with_name(first.stem + "_eval")
    refinement: Refinement | None = None
    rounds = settings.refine if settings.refine is not None else DEFAULT_REFINE_ROUNDS if cost_model else 0
    if rounds:
        if cost_model is None:
            raise SettingsError("--refine needs --model: refinement corrects the cost model's predictions by "
                                "measured residuals")
        measurement = settings.measurement.for_cost_model(getattr(cost_model, "reference_ms", None),
                                                          cost_model.batch_size)
        budget_s = settings.refine_budget_s or default_refine_budget_s(len(task.tables))
        try:
            refined, refinement = refine_plan(task, plans[0], cost_model, measurement, rounds=rounds,
                                              time_budget_s=budget_s, dataset=settings.refine_dataset,
                                              measured_greedy=settings.refine_from_greedy, progress=progress)
        except ValueError as err:  # measurement settings the machine cannot honour
            raise SettingsError(str(err)) from None
        names.append(f"{names[0]}-refined")
        plans.append(refined)
    try:
        costs, comparison, paths = evaluate_plans(
            task, list(zip(names, plans)), out, cost_model=cost_model, measurement=settings.measurement,
            progress=progress,
        )
    except ValueError as err:  # measurement settings the machine cannot honour (e.g. no such device)
        raise SettingsError(str(err)) from None
    if refinement:
        paths.append(save_plan(plans[-1], out / f"{names[-1]}.plan.json"))
    run_id = None
    if tracking or mlflow is not None:
        metrics: dict[str, float] = {}
        for name, cost in zip(names, costs):
            prefix = f"{name}_" if len(costs) > 1 else ""
            metrics |= {f"{prefix}max_cost_ms": cost.max_cost_ms, f"{prefix}imbalance": cost.imbalance,
                        f"{prefix}memory_headroom": cost.memory_headroom}
        run_id = service.log_run(
            experiment=EXPERIMENT,
            run_name="evaluate-" + "-vs-".join(names if len(names) > 1 else [plans[0].method]),
            params={"methods": ",".join(p.method for p in plans), "num_devices": plans[0].num_devices,
                    "batch_size": costs[0].batch_size},
            metrics=metrics, artifacts_dir=out, artifact_path="evaluation",
        )
    return EvaluateResult(names=names, costs=costs, comparison=comparison, paths=[str(p) for p in paths],
                          run_id=run_id, refinement=refinement)


def versus_baseline(evaluated: EvaluateResult, baseline: str) -> dict[str, float]:
    """The first plan's measured cost against the plan named `baseline` (ratio < 1: the first plan wins)."""
    first = evaluated.costs[0]
    base = evaluated.costs[evaluated.names.index(baseline)]
    figures = {
        "method_max_cost_ms": first.max_cost_ms,
        "torchrec_max_cost_ms": base.max_cost_ms,
        "ratio_to_torchrec": first.max_cost_ms / base.max_cost_ms if base.max_cost_ms > 0 else float("nan"),
        "method_imbalance": first.imbalance,
        "torchrec_imbalance": base.imbalance,
    }
    if evaluated.refinement:  # the refined plan is the last one measured
        refined = evaluated.costs[-1]
        figures |= {"refined_max_cost_ms": refined.max_cost_ms,
                    "refined_ratio_to_torchrec": refined.max_cost_ms / base.max_cost_ms if base.max_cost_ms > 0
                    else float("nan"),
                    # refinement's own final paired session: its start and the refined plan side by side
                    "refinement_before_ms": evaluated.refinement.before_ms,
                    "refinement_after_ms": evaluated.refinement.after_ms}
    return figures


#: the figures of versus_baseline (and validate's) the run's summaries show: key, label, format
_FIGURES = (
    ("method_max_cost_ms", "plan cost, ms (slowest device, measured)", ".3f"),
    ("torchrec_max_cost_ms", "TorchRec's planner's plan cost, ms", ".3f"),
    ("ratio_to_torchrec", "ratio to TorchRec's planner (below 1 is better)", ".3f"),
    ("refined_max_cost_ms", "refined on this node, ms", ".3f"),
    ("refined_ratio_to_torchrec", "refined, ratio to TorchRec's planner", ".3f"),
    ("refinement_before_ms", "refinement's paired session: its start, ms", ".3f"),
    ("refinement_after_ms", "refinement's paired session: refined, ms", ".3f"),
    ("method_imbalance", "imbalance (max / mean device)", ".3f"),
    ("torchrec_imbalance", "TorchRec's planner's imbalance", ".3f"),
    ("method_samples_per_s", "DLRM training, samples/s", ",.0f"),
    ("torchrec_samples_per_s", "DLRM training under TorchRec's plan, samples/s", ",.0f"),
    ("throughput_ratio_to_torchrec", "DLRM samples/s, ratio to TorchRec's plan (above 1 is better)", ".3f"),
)


def _figure_rows(figures: dict[str, float]) -> list[tuple[str, str]]:
    return [(label, format(figures[key], fmt)) for key, label, fmt in _FIGURES if key in figures]


def comparison_markdown(method: str, figures: dict[str, float]) -> str:
    """The comparison against TorchRec's planner as a Markdown table (the Kubeflow UI's run summary)."""
    rows = [f"| {label} | {value} |" for label, value in _figure_rows(figures)]
    return "\n".join([f"# {method} vs TorchRec's planner (measured on this node)", "", "| figure | value |",
                      "|---|---|", *rows, ""])


def comparison_page(method: str, figures: dict[str, float], evaluated: EvaluateResult) -> str:
    """The page the pipeline hands the Kubeflow UI: the figures against TorchRec's planner, the plots the
    evaluation drew, the refinement's rounds, each plan's measured per-device costs."""
    return summary_page(
        f"{method} vs TorchRec's planner (measured)",
        "Both plans were measured on this node in one session; plan cost is the slowest device's forward + "
        "backward + all-to-all ms (lower is better); DLRM samples/s higher is better.",
        _figure_rows(figures),
        list(zip(evaluated.names, evaluated.costs)),
        [p for p in evaluated.paths if p.endswith(".png") and Path(p).is_file()],
        evaluated.refinement,
    )
