"""Predicted plan quality: mean predicted plan cost (slowest device) per method over seeded tasks.

Two task sets like the papers': 10-60 tables on 4 devices, and 80-120 tables on 8, drawn from synthetic DLRM
tables. Every plan is scored by the same cost model; ratios are to NeuroShard (> 1: worse). Beside each method: how
many tables its plans made data-parallel and row-wise (the plan space beyond placement). Failures (PlanError: the
method found no plan within memory) are counted, never scored. Measured (not predicted) quality is the plan_quality
experiment.

    python -m benchmarks search_quality --model models:/shardwise-cost-cpu-x86_64-2c@champion --record
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from benchmarks.harness import Context, Experiment, ExperimentSettings, Outcome, SuiteRun, register

TASK_SETS = {"10-60 tables, 4 devices": (10, 60, 4), "80-120 tables, 8 devices": (80, 120, 8)}


class SearchQualitySettings(ExperimentSettings):
    """Which cost model scores the plans, which tasks."""

    model: str | None = Field(default=None, description="cost model (default: this hardware's champion)")
    tasks: int = Field(default=8, ge=1, description="tasks per set")
    row_scale: float = Field(default=0.01, gt=0, description="table rows x this (CPU-sized tables)")
    memory_slack: float = Field(default=1.5, gt=0)
    seed: int = 0


def run(settings: SearchQualitySettings, context: Context) -> Outcome:
    """Every method that plans without a trained policy and without measuring, on every task, scored by the model."""
    from tqdm.auto import tqdm

    from shardwise.search import PlanError, get_method, make_searcher, method_names
    from shardwise.workload.synthetic import synthesize_tables
    from shardwise.workload.tableset import sample_task

    methods = tuple(m for m in method_names() if get_method(m).policy is None and not get_method(m).measures)
    model = context.cost_model(settings.model, required=True)
    tableset = synthesize_tables(300, seed=settings.seed, row_scale=settings.row_scale, batch_size=model.batch_size)
    rng = np.random.default_rng(settings.seed)
    rows: list[dict[str, Any]] = []
    for set_name, (lo, hi, num_devices) in TASK_SETS.items():
        costs: dict[str, list[float]] = {m: [] for m in methods}
        failures = dict.fromkeys(methods, 0)
        typed = {m: [0, 0] for m in methods}  # data-parallel, row-wise tables over the set's plans
        for i in tqdm(range(settings.tasks), desc=set_name, leave=False):
            task = sample_task(tableset, int(rng.integers(lo, hi + 1)), num_devices, seed=settings.seed * 1000 + i,
                               memory_slack=settings.memory_slack)
            for method in methods:
                try:
                    plan = make_searcher(method).search(task, model, i)
                except PlanError:
                    failures[method] += 1
                    continue
                costs[method].append(plan.extra["predicted"]["max_cost_ms"])
                typed[method][0] += len(plan.data_parallel)
                typed[method][1] += len(plan.row_wise)
        reference = float(np.mean(costs["neuroshard"])) if costs["neuroshard"] else float("nan")
        for method in methods:
            mean = float(np.mean(costs[method])) if costs[method] else float("nan")
            ratio = mean / reference
            rows.append({"task_set": set_name, "method": method,
                         "mean_cost_ms": round(mean, 3) if np.isfinite(mean) else None,
                         "vs_neuroshard": round(ratio, 3) if np.isfinite(ratio) else None,
                         "failed": failures[method], "data_parallel_tables": typed[method][0],
                         "row_wise_tables": typed[method][1]})
    return Outcome(rows, notes=[
        f"cost model {context.model} ({model.hardware_kind}, batch {model.batch_size}); {settings.tasks} tasks per "
        f"set, memory slack {settings.memory_slack}, synthetic tables at row scale {settings.row_scale}; "
        "vs_neuroshard > 1: worse; a failed plan (no plan within memory) is counted, never scored; "
        "data_parallel_tables / row_wise_tables: tables of that type over the set's plans"])


register(Experiment(
    name="search_quality",
    title="Predicted plan cost per method (cost model's slowest device)",
    settings=SearchQualitySettings,
    run=run,
    suites={"claims": (SuiteRun({"model": "models:/shardwise-cost-cpu-x86_64-2c@champion"}),)},
))
