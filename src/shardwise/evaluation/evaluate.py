"""Several plans of one task measured in one session, each with its report, and their comparison."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from shardwise.costmodel.types import CostModel
from shardwise.profiling import MeasurementSettings
from shardwise.search.plan import Plan
from shardwise.search.simulator import simulate
from shardwise.workload import ShardingTask

from .measured import MeasuredPlanCost, PlanComparison, compare_measured, measure_plans, save_measured
from .refine_record import Refinement
from .report import write_comparison_report, write_plan_report


def evaluate_plans(
    task: ShardingTask,
    plans: Sequence[tuple[str, Plan]],
    out_dir: str | Path,
    *,
    cost_model: CostModel | None = None,
    measurement: MeasurementSettings | None = None,
    progress: bool = True,
) -> tuple[list[MeasuredPlanCost], PlanComparison, list[Path]]:
    """Measure named plans of `task` in one session; write `<name>.measured.json` and a report per plan, and
    `comparison.json` + `comparison.html` across them.

    One session: one reference calibration, one all-to-all process group with the plans' layouts interleaved,
    so machine drift hits every plan alike. With a cost model, time as its training data was (its
    reference_ms and batch size unless `measurement` sets them) and show its predictions next to the
    measurement."""
    names = [name for name, _ in plans]
    if len(set(names)) != len(names):
        raise ValueError(f"plans: names must be unique, got {names}")
    measurement = measurement or MeasurementSettings()
    if cost_model is not None:
        measurement = measurement.for_cost_model(getattr(cost_model, "reference_ms", None), cost_model.batch_size)
    costs = measure_plans([(task, plan) for _, plan in plans], measurement, progress=progress)
    predicted: list[list[float] | None] = [
        list(simulate(plan, task, cost_model).total_ms) if cost_model is not None else None for _, plan in plans
    ]
    out = Path(out_dir)
    paths: list[Path] = []
    for (name, plan), cost, pred in zip(plans, costs, predicted):
        paths.append(save_measured(cost, out / f"{name}.measured.json"))
        # a refined plan's file carries its rounds: its report shows them
        refinement = Refinement.model_validate(plan.extra["refinement"]) if "refinement" in plan.extra else None
        paths += write_plan_report(cost, out, name=name, predicted_total_ms=pred, refinement=refinement,
                                   cost_model_figures=getattr(getattr(cost_model, "meta", None), "info", None))
    comparison = compare_measured(
        list(zip(names, costs)),
        predicted_max_ms=[max(p) if p else None for p in predicted],
    )
    if len(plans) > 1:
        path = out / "comparison.json"
        path.write_text(json.dumps(comparison.model_dump(mode="json"), indent=1))
        paths.append(path)
        paths += write_comparison_report(comparison, out)
    return costs, comparison, paths
