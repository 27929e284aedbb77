"""`shardwise publish` and `shardwise plan show`: plan each production task (a user's model exported with its
TorchRec planner context) with the cost model, measure the plan beside the task's champion plan and TorchRec's
planner's plan in one session, register it as a new version of `shardwise-plan-<task>`, and gate `@champion`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from shardwise.costmodel.types import CostModel
from shardwise.errors import ShardwiseError
from shardwise.evaluation import MeasuredPlanCost
from shardwise.extras import require
from shardwise.integrations.mlflow import CHAMPION, MlflowService, RegistryError
from shardwise.integrations.plan_registry import (
    PLAN_METRIC,
    RegisteredPlan,
    load_registered_plan,
    plan_name,
    register_plan,
    task_digest,
    write_plan_files,
)
from shardwise.profiling import MeasurementSettings
from shardwise.search import Plan
from shardwise.workload import ShardingTask

from .base import JobResult, JobSettings, SettingsError
from .models import load_cost_model
from .workload import fetch_object

if TYPE_CHECKING:
    from shardwise.integrations.torchrec.context import ProductionTask

#: measures named plans of a task in one session (evaluation.evaluate_plans's signature, less its options)
Measure = Callable[..., tuple[list[MeasuredPlanCost], Any, list[Path]]]


class PublishSettings(JobSettings):
    """Which production tasks to plan, with which cost model, and where to register their plans."""

    task: tuple[str, ...] = Field(min_length=1, description="production task file, a path or s3://bucket/key (a "
                                  "shardwise.task/v1 file with a 'torchrec' section: "
                                  "shardwise.integrations.torchrec.export_task); repeat for several")
    model: str | None = Field(default=None, description="cost model URI or directory (default: this hardware's "
                              "champion)")
    tracking_uri: str | None = Field(default=None, description="MLflow tracking URI (else $MLFLOW_TRACKING_URI, "
                                     "else ./mlflow.db)")
    out: str = Field(default="publish", description="directory: each task's plans, measurements and report")
    # about 2 minutes a task: on MLPerf DLRM-DCNv2 (2 CPU cores) it took the registered plan from 1.000 of TorchRec's
    # planner's to 0.895, where the drop-in's default refined nothing (its cost model needed no adaptation)
    refine_s: float = Field(default=120.0, ge=0, allow_inf_nan=False,
                            description="seconds the drop-in planner refines each plan on this machine's kernels "
                            "before it is measured (from the search's plan, the measured-cost greedy's and TorchRec's "
                            "planner's; it may split the slowest device's table); 0: off")
    min_gain: float | None = Field(default=None, ge=0, lt=1, description="the share by which a plan must measure "
                                   "faster than the champion to take @champion (default: the measured noise, how far "
                                   "the plan's ratio to the champion moves between two sessions)")
    dry_run: bool = Field(default=False, description="measure only: register nothing")
    seed: int = 0
    measurement: MeasurementSettings = MeasurementSettings()


class PublishedTask(JobResult):
    """One task's plan: its figures in the session and where it landed in the registry."""

    task: str
    registered_name: str
    version: str | None
    alias: str | None
    reason: str
    plan_ms: float
    torchrec_ms: float
    champion_version: str | None
    champion_ms: float | None
    noise: float | None
    directory: str
    #: TorchRec's plan's mean device in the session: what a placement balancing its work would reach
    torchrec_balanced_ms: float | None = None
    #: refinement's budget, the seconds it took and whether it changed the searched plan (None: it did not run)
    refine_s: float = 0.0
    refinement_s: float | None = None
    refinement_changed: bool | None = None

    def headline(self) -> str:
        """The plan against TorchRec's planner's, measured side by side here, in one line."""
        ratio = self.plan_ms / self.torchrec_ms if self.torchrec_ms > 0 else math.nan
        balanced = ("" if self.torchrec_balanced_ms is None or not self.torchrec_ms > 0 else
                    f"; its work balanced over the devices {self.torchrec_balanced_ms / self.torchrec_ms:.3f}")
        return (f"{self.task}: plan {self.plan_ms:.3f} ms vs TorchRec's planner {self.torchrec_ms:.3f} ms "
                f"(ratio {ratio:.3f}{balanced})")

    def refinement(self) -> str:
        """What refinement did, in words."""
        if not self.refine_s:
            return "not refined (refine_s 0)"
        if self.refinement_s is None:
            return f"not refined (refine_s {self.refine_s:g}: the planner's plan was not the search's)"
        what = "changed the searched plan" if self.refinement_changed else "kept the searched plan"
        return f"refined here for {self.refinement_s:.0f} s of {self.refine_s:g}: {what}"


class PublishResult(JobResult):
    tasks: list[PublishedTask]

    def summary(self) -> str:
        """Each task's plan against TorchRec's planner's, then the table of what was measured and registered."""
        return "\n".join([*(t.headline() for t in self.tasks), self.table()])

    def table(self) -> str:
        """Each task's measured figures, where it was registered and why, and what refinement did."""
        head = f"{'task':<20} {'plan ms':>9} {'TorchRec ms':>12} {'champion ms':>12} {'noise':>6}  registered"
        lines = [head]
        for t in self.tasks:
            champion = f"{t.champion_ms:.3f}" if t.champion_ms is not None else "-"
            noise = f"{t.noise:.1%}" if t.noise is not None else "-"
            where = f"{t.registered_name} v{t.version} @{t.alias}" if t.version else "not registered"
            lines.append(f"{t.task:<20} {t.plan_ms:>9.3f} {t.torchrec_ms:>12.3f} {champion:>12} {noise:>6}  {where}")
            lines += [f"{'':<20} {why}" for why in (t.reason, t.refinement()) if why]
        lines.append(f"files: {', '.join(t.directory for t in self.tasks)}")
        return "\n".join(lines)

    def markdown(self) -> str:
        """The same, as Markdown (the Kubeflow UI's step summary): each task's line, then the table."""
        lines = ["# Your models' plans (measured on this node)", "", *(f"- {t.headline()}" for t in self.tasks), "",
                 "| task | plan ms | TorchRec's planner ms | champion ms | noise | registered | why | refinement |",
                 "|---|---|---|---|---|---|---|---|"]
        for t in self.tasks:
            champion = f"{t.champion_ms:.3f}" if t.champion_ms is not None else "-"
            noise = f"{t.noise:.1%}" if t.noise is not None else "-"
            where = f"`{t.registered_name}` v{t.version} @{t.alias}" if t.version else "not registered"
            lines.append(f"| {t.task} | {t.plan_ms:.3f} | {t.torchrec_ms:.3f} | {champion} | {noise} | {where} | "
                         f"{t.reason} | {t.refinement()} |")
        return "\n".join(lines) + "\n"


def run(settings: PublishSettings, *, mlflow: MlflowService | None = None,
        measure: Measure | None = None, progress: bool = True) -> PublishResult:
    """Plan, measure, register and gate every production task, in order (a failed task stops the run); `measure`
    defaults to `evaluation.evaluate_plans`."""
    if not settings.dry_run:
        require("mlflow")
    from shardwise.evaluation import evaluate_plans  # the kernels (torch): not for `publish --help`
    from shardwise.integrations.torchrec.context import load_production_task  # torchrec: heavy, optional

    measure = measure or evaluate_plans
    service = mlflow or MlflowService(settings.tracking_uri)
    paths = _local_copies(settings.task, Path(settings.out) / "tasks")
    productions = [load_production_task(path) for path in paths]  # every file refused before minutes of work
    device = _measuring_device(settings.measurement)
    _check_ranks(settings.task, productions, device)
    cost_model, model_uri = load_cost_model(service, settings.model, device=None, required=True)
    assert cost_model is not None  # required
    _check_refinement(settings.refine_s, cost_model, device)
    return PublishResult(tasks=[_publish(settings, service, cost_model, model_uri or "", Path(path), production,
                                         measure, progress, device) for path, production in zip(paths, productions)])


def _publish(settings: PublishSettings, service: MlflowService, cost_model: CostModel, model_uri: str, path: Path,
             production: ProductionTask, measure: Measure, progress: bool, device: str) -> PublishedTask:
    """One task: planned (refined on the device it is measured on), measured beside TorchRec's planner's plan and
    its champion, registered and gated."""
    from shardwise.integrations.torchrec.production import plan_production_task, torchrec_planner_plan

    planned = plan_production_task(production, cost_model, refine_s=settings.refine_s, device=device,
                                   seed=settings.seed)
    torchrec = torchrec_planner_plan(production)
    name = plan_name(production.name)
    champion = _champion(service, name, planned.torchrec.fingerprint) if not settings.dry_run else None
    out = Path(settings.out) / production.name
    session = _Session(production.task, cost_model, settings.measurement, measure, out / "measured", progress)
    refinement = planned.refinement.figures() if planned.refinement else {}
    figures: dict[str, Any] = {**session.first(planned.plan, torchrec, champion.plan if champion else None),
                               "refine_s": settings.refine_s, "planning_s": planned.planning_s, **refinement}
    files = write_plan_files(out / "files", planned.plan, path, figures, planned.torchrec.model_dump(mode="json"))
    result = PublishedTask(task=production.name, registered_name=name, version=None, alias=None, reason="",
                           plan_ms=figures["plan_ms"], torchrec_ms=figures["torchrec_ms"],
                           champion_version=champion.version if champion else None,
                           champion_ms=figures.get("champion_ms"), noise=figures.get("noise"), directory=str(out),
                           torchrec_balanced_ms=figures["torchrec_balanced_ms"],
                           refine_s=settings.refine_s, refinement_s=refinement.get("refinement_s"),
                           refinement_changed=refinement.get("refinement_changed"))
    if settings.dry_run:
        return result
    promotion = register_plan(
        service, production.name, files, measured_ms=figures["plan_ms"],
        champion_ms=partial(_champion_ms, service, measured=champion, session=session, plan=planned.plan,
                            fingerprint=planned.torchrec.fingerprint),
        min_gain=settings.min_gain if settings.min_gain is not None else figures.get("noise", 0.0),
        tags={"task_digest": task_digest(path), "cost_model": model_uri,
              **{f"figures.{k}": repr(v) for k, v in figures.items() if v is not None}},
        params={"task": production.name, "cost_model": model_uri, "num_devices": production.task.num_devices,
                "tables": len(production.task.tables)},
        metrics={k: v for k, v in figures.items() if isinstance(v, float) and math.isfinite(v)})
    return result.model_copy(update={"version": promotion.version, "alias": promotion.alias,
                                     "reason": promotion.reason})


def _local_copies(tasks: Sequence[str], folder: Path) -> list[str]:
    """Each task file's path: an object in the object store copied under `folder` first (one folder each, so two
    tasks of one file name stay apart)."""
    return [str(fetch_object(task, folder / str(i) / task.rsplit("/", 1)[-1], what="production task"))
            if task.startswith("s3://") else task for i, task in enumerate(tasks)]


def _measuring_device(measurement: MeasurementSettings) -> str:
    """The device the plans are measured (and refined) on: the one named, else CUDA where present."""
    import torch

    return measurement.device or ("cuda" if torch.cuda.is_available() else "cpu")


def _check_refinement(refine_s: float, cost_model: CostModel, device: str) -> None:
    """Refinement times kernels on `device` for the cost model's hardware: refused before minutes of planning where
    the model is for other hardware (the plan would be refined on kernels it was not searched for)."""
    if not refine_s:
        return
    from shardwise.evaluation.adapt import cannot_adapt_here  # the drop-in refines under the same condition

    reason = cannot_adapt_here(cost_model, device)
    if reason:
        reason = reason.replace("adaptation", "refinement").replace("adapt where", "publish where")
        raise SettingsError(f"refine_s {refine_s:g}: {reason}; or refine_s 0 (--refine-s 0) to register the plan "
                            "unrefined")


def _check_ranks(given: Sequence[str], productions: Sequence[Any], device: str) -> None:
    """A task measured on GPUs has a rank per GPU here: one with more is refused before minutes of planning, not by
    NCCL mid-measurement (on a CPU, ranks are processes: any count)."""
    if not device.startswith("cuda"):
        return
    import torch

    gpus = torch.cuda.device_count()
    for location, production in zip(given, productions):
        if production.task.num_devices > gpus:
            raise SettingsError(f"production task {location}: {production.task.num_devices} ranks, more than the "
                                f"{gpus} GPUs here")


class _Session:
    """Measurements of one task's plans on this machine, each call one session."""

    def __init__(self, task: ShardingTask, cost_model: CostModel, measurement: MeasurementSettings, measure: Measure,
                 out: Path, progress: bool) -> None:
        self.task, self.cost_model, self.measurement, self.measure = task, cost_model, measurement, measure
        self.out, self.progress, self.rounds = out, progress, 0
        self.mean_ms: dict[str, float] = {}  # the last session's mean device of each plan
        self.first_plan_ms: float = math.nan
        self.first_champion_ms: float | None = None

    def __call__(self, named: Sequence[tuple[str, Plan]]) -> dict[str, float]:
        self.rounds += 1
        costs, _, _ = self.measure(self.task, list(named), self.out / f"session-{self.rounds}",
                                   cost_model=self.cost_model, measurement=self.measurement, progress=self.progress)
        self.mean_ms = {name: cost.mean_cost_ms for (name, _), cost in zip(named, costs)}
        return {name: cost.max_cost_ms for (name, _), cost in zip(named, costs)}

    def first(self, plan: Plan, torchrec: Plan, champion: Plan | None) -> dict[str, float]:
        """The plan beside TorchRec's planner's and the champion's; with a champion, the plan and the champion again
        in a second session: how far the plan's ratio to the champion moved between the two is the noise a plan must
        beat the champion by (a session times each distinct device shard once, so two plans of one session never
        differ by chance where they share shards)."""
        named = [("plan", plan), ("torchrec", torchrec)] + ([("champion", champion)] if champion is not None else [])
        ms = self(named)
        figures = {"plan_ms": ms["plan"], "torchrec_ms": ms["torchrec"],
                   "ratio_to_torchrec": ms["plan"] / ms["torchrec"] if ms["torchrec"] > 0 else math.nan,
                   "torchrec_balanced_ms": self.mean_ms["torchrec"]}
        self.first_plan_ms = ms["plan"]
        if champion is not None and ms["champion"] > 0:
            again = self([("plan", plan), ("champion", champion)])
            ratio = ms["plan"] / ms["champion"]
            ratio_again = again["plan"] / again["champion"] if again["champion"] > 0 else ratio
            figures |= {"champion_ms": ms["champion"], "ratio_to_champion": ratio,
                        "ratio_to_champion_again": ratio_again, "noise": abs(ratio - ratio_again)}
            self.first_champion_ms = ms["champion"]
        return figures


def _champion(service: MlflowService, name: str, fingerprint: dict[str, Any]) -> RegisteredPlan | None:
    """The task's champion plan where it was made for the same inputs; None where there is none or it was not."""
    try:
        champion = load_registered_plan(f"models:/{name}@{CHAMPION}", service=service)
    except RegistryError:
        return None
    made_for = (champion.torchrec or {}).get("fingerprint")
    return champion if made_for == fingerprint else None


def _champion_ms(service: MlflowService, uri: str, *, measured: RegisteredPlan | None, session: _Session, plan: Plan,
                 fingerprint: dict[str, Any]) -> float | None:
    """The champion at `uri` in the plan's session units: the first session's figure where it is the champion
    measured there; else (another run moved the alias meanwhile) both measured again in a new session, the champion's
    figure scaled by the plan's ratio between the two; None where it was made for other inputs."""
    if measured is not None and uri == f"models:/{measured.name}/{measured.version}":
        return session.first_champion_ms
    other = load_registered_plan(uri, service=service)
    if (other.torchrec or {}).get("fingerprint") != fingerprint:
        return None
    ms = session([("plan", plan), ("champion", other.plan)])
    return ms["champion"] * session.first_plan_ms / ms["plan"] if ms["plan"] > 0 else None


def show(uri: str, *, tracking_uri: str | None = None) -> str:
    """A registered plan as text: its version, figures, and each device's shards."""
    try:
        registered = load_registered_plan(uri, tracking_uri=tracking_uri)
    except RegistryError as err:
        raise ShardwiseError(str(err)) from None
    where = f"{registered.name} v{registered.version}" if registered.version else str(registered.directory)
    lines = [f"{where}: {len(registered.task.tables)} tables on {registered.plan.num_devices} devices, planned by "
             f"{registered.plan.method}"]
    labels = {"plan_ms": "plan, ms (slowest device, measured)", "torchrec_ms": "TorchRec's planner's plan, ms",
              "ratio_to_torchrec": "ratio to TorchRec's planner",
              "torchrec_balanced_ms": "TorchRec's plan's mean device, ms (what balancing its work would reach)",
              "champion_ms": "champion then, ms",
              "ratio_to_champion": "ratio to the champion then",
              "ratio_to_champion_again": "ratio to the champion, a second session",
              "noise": "noise: the ratio's move between the two sessions",
              "refine_s": "refinement's budget here, s (0: off)", "planning_s": "planning, s (refinement included)",
              "refinement_s": "refinement, s", "refinement_changed": "refinement changed the searched plan",
              "unrefined_predicted_ms": "searched plan before refinement, ms (predicted)",
              "predicted_ms": "plan, ms (predicted)",
              "unrefined_measured_ms": "searched plan before refinement, ms (refinement's first session)",
              "refinement_start": "refinement went on from the plan of",
              "refinement_before_ms": "refinement's start, ms (its last paired session)",
              "refinement_after_ms": "refined plan, ms (the same session)"}
    lines += [f"  {labels.get(k, k)}: {_shown(v)}" for k, v in registered.figures.items() if v is not None]
    for device in range(registered.plan.num_devices):
        shards = [s.table if s.dim == registered.task.table(s.table).dim else f"{s.table}[{s.col_offset}:{s.col_offset + s.dim}]"
                  for s in registered.plan.device_shards(device)]
        lines.append(f"  device {device}: {', '.join(shards) or '-'}")
    if registered.plan.data_parallel:
        lines.append(f"  data-parallel: {', '.join(registered.plan.data_parallel)}")
    if registered.plan.row_wise:
        lines.append(f"  row-wise: {', '.join(registered.plan.row_wise)}")
    return "\n".join(lines)


def _shown(value: Any) -> str:
    """A figure as `plan show` prints it: numbers to 4 significant digits, yes/no, words as they are."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:.4g}" if isinstance(value, int | float) else str(value)


__all__ = ["PLAN_METRIC", "PublishResult", "PublishSettings", "PublishedTask", "run", "show"]
