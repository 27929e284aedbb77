"""`shardwise plan`: a memory-safe sharding plan for a task, by any registered search method."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from shardwise.profiling import DeviceName, MeasurementSettings
from shardwise.search import Plan, PlanError, Searcher, format_plan, get_method, make_searcher, save_plan
from shardwise.workload import ShardingTask, load_task

from .base import JobResult, JobSettings, SettingsError, default_refine_budget_s, refine_budget_field

if TYPE_CHECKING:
    from shardwise.costmodel import CostModel, NeuralCostModel
    from shardwise.integrations.mlflow import MlflowService


class PlanSettings(JobSettings):
    """The task, the method and its options, and which cost model to search with."""

    task: str = Field(description="shardwise.task/v1 JSON file")
    out: str = Field(description="where to write the plan (shardwise.plan/v1 JSON)")
    method: str = Field(default="neuroshard", description="search method")
    model: str | None = Field(
        default=None, description="cost model: directory, models:/<name>@<alias> or runs:/... "
        "(default: models:/shardwise-cost-<hardware kind>@champion); a registered version is kept in "
        "$SHARDWISE_CACHE (else ~/.cache/shardwise) after its first use",
    )
    tracking_uri: str | None = Field(
        default=None, description="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db); "
        "a server that does not answer within $SHARDWISE_SERVICE_TIMEOUT_S seconds (default 10) is an error"
    )
    device: DeviceName = Field(
        default=None, description="hardware the plan is for (cpu, cuda): picks the default cost model "
        "(default: cuda if available)",
    )
    seed: int = 0
    refine: int = Field(
        default=0, ge=0, le=50, description="refine the plan on this machine's kernels and all-to-alls for up to "
        "this many rounds, from the faster of it and the greedy on measured single-table costs (the plan must be "
        "for this machine's hardware: the cost model's kind; 0: off)")
    refine_budget_s: float | None = refine_budget_field(scaled=True)
    adapt: float = Field(
        default=0, ge=0, le=3600, description="seconds to adapt the cost model on this machine before searching: "
        "the task's tables timed alone and in fused groups, the model fine-tuned on them (the model must be for this "
        "machine's hardware; 0: off)")
    adapt_dataset: str | None = Field(
        default=None, description="append every shard adaptation times to this cost dataset (provenance 'adapt'), "
        "so the next pre-training learns them")
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
    #: the refinement's rounds as the terminal shows them ("" without --refine; the record is in the plan file)
    refinement: str = ""

    def summary(self) -> str:
        """The per-device table, the refinement's rounds, and where the plan went."""
        refined = f"{self.refinement}\n" if self.refinement else ""
        return f"{format_plan(self.plan)}\n{refined}wrote {self.out}"

    def markdown(self) -> str:
        """The per-device table as a Markdown page (the Kubeflow UI shows it as the plan's artifact)."""
        return f"# {self.plan.method} plan\n\n```\n{format_plan(self.plan)}\n```\n"


def build_searcher(
    method: str, options: dict[str, Any], *, mlflow: MlflowService, hardware: str | None,
    measurement: MeasurementSettings,
) -> Searcher:
    """The method's searcher, its trained policy (when it plans with one) and measurement settings (when it
    measures) filled in."""
    from .models import with_policy  # the registry's client: loads only when planning

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
    # the cost model (torch) and the registry's client load only when planning: `plan --help` and a command line's
    # mistakes answer without them
    from shardwise.integrations.mlflow import MlflowService

    from .models import load_cost_model

    task = load_task(settings.task)
    service = mlflow or MlflowService(settings.tracking_uri)
    spec = get_method(settings.method)
    model, model_uri = load_cost_model(service, settings.model, device=settings.device,
                                       required=spec.needs_cost_model or settings.refine > 0 or settings.adapt > 0)
    notes = []
    if model is None:
        notes.append("no cost model found, predicted costs are not shown (pass --model)")
    if settings.adapt:
        model, adapted = _adapt(task, model, settings)
        notes.append(adapted)
    searcher = build_searcher(
        settings.method, settings.options, mlflow=service,
        hardware=model.hardware_kind if model is not None else None,
        measurement=MeasurementSettings(device=settings.device),
    )
    try:
        plan = searcher.search(task, model, settings.seed)
    except PlanError as err:
        raise PlanError(f"{settings.task}: {err}") from None
    if plan.extra.get("outside_training"):  # the tables (and batch) the model has not seen, and how far out
        notes.append(plan.extra["outside_training"])
    elif model is not None and model.batch_size != task.batch_size:  # a model saved without its ranges
        notes.append(f"the cost model was profiled at batch {model.batch_size}, the task's batch is "
                     f"{task.batch_size}; predicted ms are at the model's batch size")
    refinement = ""
    if settings.refine:
        plan, refinement = _refine(task, plan, model, settings, searcher)
    if model_uri:
        provenance = {**plan.extra.get("provenance", {}), "cost_model_uri": model_uri}
        plan = plan.model_copy(update={"extra": {**plan.extra, "provenance": provenance}})
    save_plan(plan, settings.out)
    return PlanJobResult(out=settings.out, plan=plan, cost_model_uri=model_uri, notes=notes, refinement=refinement)


def _adapt(task: ShardingTask, model: NeuralCostModel | None, settings: PlanSettings) -> tuple[NeuralCostModel, str]:
    """The cost model adapted on this machine to the task's tables, and the line saying what adaptation did."""
    # the kernels, the cost dataset and training load only when adapting
    from shardwise.evaluation.adapt import AdaptError, adapt_cost_model

    assert model is not None  # loaded as required when adapting
    try:
        adapted, record = adapt_cost_model(task, model, settings.adapt, seed=settings.seed,
                                           measurement=MeasurementSettings(device=settings.device),
                                           dataset=settings.adapt_dataset)
    except AdaptError as err:
        raise SettingsError(f"--adapt: {err}") from None
    return adapted, record.line()


def _refine(task: ShardingTask, plan: Plan, model: CostModel | None, settings: PlanSettings,
            searcher: Searcher) -> tuple[Plan, str]:
    """The searched plan refined here (asking `searcher` for a plan with a table split where one holds the slowest
    device up), and its rounds' table; refused when here is not the hardware the plan is for."""
    # the kernels and torchrec load only when refining
    from shardwise.evaluation.refine import refine_plan, search_resplit
    from shardwise.profiling import hardware_kind

    assert model is not None  # loaded as required when refining
    try:
        here = hardware_kind(settings.device)
    except (RuntimeError, ValueError) as err:
        raise SettingsError(f"--refine measures on this machine: {err}") from None
    if model.hardware_kind != here:
        raise SettingsError(f"--refine measures on this machine ({here}), but the plan is for {model.hardware_kind} "
                            f"(its cost model's hardware): plan without --refine, then refine where it runs with "
                            f"`shardwise evaluate --model ... --refine N`")
    measurement = MeasurementSettings(device=settings.device).for_cost_model(
        getattr(model, "reference_ms", None), model.batch_size)
    budget_s = settings.refine_budget_s or default_refine_budget_s(len(task.tables))
    refined, record = refine_plan(task, plan, model, measurement, rounds=settings.refine, time_budget_s=budget_s,
                                  measured_greedy=True, resplit=search_resplit(searcher, task, model, settings.seed))
    return refined, record.table()
