"""`shardwise plan`: a memory-safe sharding plan for a task, by any registered search method."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from shardwise.integrations.mlflow import MlflowService
from shardwise.profiling import DeviceName, MeasurementSettings
from shardwise.search import Plan, PlanError, Searcher, format_plan, get_method, make_searcher, save_plan
from shardwise.workload import load_task

from .base import JobResult, JobSettings
from .models import load_cost_model, with_policy


class PlanSettings(JobSettings):
    """The task, the method and its options, and which cost model to search with."""

    task: str = Field(description="shardwise.task/v1 JSON file")
    out: str = Field(description="where to write the plan (shardwise.plan/v1 JSON)")
    method: str = Field(default="neuroshard", description="search method")
    model: str | None = Field(
        default=None, description="cost model: directory, models:/<name>@<alias> or runs:/... "
        "(default: models:/shardwise-cost-<hardware kind>@champion)",
    )
    tracking_uri: str | None = Field(
        default=None, description="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)"
    )
    device: DeviceName = Field(
        default=None, description="hardware the plan is for (cpu, cuda): picks the default cost model "
        "(default: cuda if available)",
    )
    seed: int = 0
    #: the method's own options (its registry entry's options model validates them)
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("method")
    @classmethod
    def _registered(cls, method: str) -> str:
        get_method(method)  # refuses an unknown name, listing the registered ones
        return method


class PlanJobResult(JobResult):
    """The plan written, and what the terminal shows of it."""

    out: str
    plan: Plan
    cost_model_uri: str | None
    notes: list[str] = []

    def summary(self) -> str:
        """The per-device table and where the plan went."""
        return f"{format_plan(self.plan)}\nwrote {self.out}"

    def markdown(self) -> str:
        """The per-device table as a Markdown page (the Kubeflow UI shows it as the plan's artifact)."""
        return f"# {self.plan.method} plan\n\n```\n{format_plan(self.plan)}\n```\n"


def build_searcher(
    method: str, options: dict[str, Any], *, mlflow: MlflowService, hardware: str | None,
    measurement: MeasurementSettings,
) -> Searcher:
    """The method's searcher, its trained policy (when it plans with one) and measurement settings (when it
    measures) filled in."""
    spec = get_method(method)
    options = dict(options)
    if spec.measures:
        options.setdefault("measurement", measurement)
    if spec.policy is None:
        return make_searcher(method, **options)
    if hardware is None:
        raise PlanError(f"{method} needs a cost model (pass --model)")
    return with_policy(
        mlflow, method, options.pop("policy", None), hardware,
        lambda directory: make_searcher(method, **options, policy=directory),
    )


def run(settings: PlanSettings, *, mlflow: MlflowService | None = None) -> PlanJobResult:
    """Load the task and the cost model, search, record provenance, write the plan."""
    task = load_task(settings.task)
    service = mlflow or MlflowService(settings.tracking_uri)
    spec = get_method(settings.method)
    model, model_uri = load_cost_model(service, settings.model, device=settings.device,
                                       required=spec.needs_cost_model)
    notes = []
    if model is None:
        notes.append("no cost model found, predicted costs are not shown (pass --model)")
    elif model.batch_size != task.batch_size:
        notes.append(f"the cost model was profiled at batch {model.batch_size}, the task's batch is "
                     f"{task.batch_size}; predicted ms are at the model's batch size")
    searcher = build_searcher(
        settings.method, settings.options, mlflow=service,
        hardware=model.hardware_kind if model is not None else None,
        measurement=MeasurementSettings(device=settings.device),
    )
    try:
        plan = searcher.search(task, model, settings.seed)
    except PlanError as err:
        raise PlanError(f"{settings.task}: {err}") from None
    if model_uri:
        provenance = {**plan.extra.get("provenance", {}), "cost_model_uri": model_uri}
        plan = plan.model_copy(update={"extra": {**plan.extra, "provenance": provenance}})
    save_plan(plan, settings.out)
    return PlanJobResult(out=settings.out, plan=plan, cost_model_uri=model_uri, notes=notes)
