"""Refinement on hardware: NeuroShard's plan before and after refinement, next to the measured-cost greedy and
TorchRec's planner, all measured in one session on this machine's kernels and all-to-alls.

Tasks: the first N of each paper task set (the plan_quality experiment's, from held-out synthetic tables, at the cost
model's batch). Per task: each plan's measured slowest device, the refined plan over NeuroShard's and over the
measured greedy's, and the refinement's rounds (measured gain per round) and extra time.

Refinement goes on from the faster, measured, of NeuroShard's plan and the measured greedy's (as `evaluate` and
`benchmark` do); `--searched-only` refines NeuroShard's plan alone. `--method` refines another method's plan in
NeuroShard's place: `torchrec_rw`, TorchRec's planner offered row-wise, gives plans with row-wise tables, whose
blocks and collectives refinement keeps and moves the other shards around (recorded as `refine_<method>`).

    python -m benchmarks refine --model MODEL_DIR [--tasks 3] [--rounds 4] [--searched-only] [--method torchrec_rw]
    python -m benchmarks refine --model MODEL_DIR --task my_task.json --rounds 3 --record \\
        --record-name refine_readme_example      # tasks of your own (README's example) instead of the paper sets
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from benchmarks.harness import Context, Experiment, ExperimentSettings, Outcome, register
from benchmarks.plan_runs import paper_tasks

BASELINES = ("measured_greedy", "torchrec")


class RefineSettings(ExperimentSettings):
    """Which cost model, which tasks, which plan refined for how many rounds."""

    model: str = Field(description="cost model directory or URI")
    tasks: int = Field(default=3, ge=1, description="tasks per paper task set")
    rounds: int = Field(default=4, ge=1, description="refinement rounds per plan")
    sets: tuple[str, ...] | None = Field(default=None, description="only these paper task sets (comma separated "
                                         "names)", json_schema_extra={"sep": ","})
    searched_only: bool = Field(default=False, description="refine NeuroShard's plan only (not also from the "
                                "measured greedy's)")
    method: str = Field(default="neuroshard", description="the method whose plan is refined (torchrec_rw: plans "
                        "with row-wise tables)")
    seed: int = 0
    task: tuple[str, ...] | None = Field(default=None, description="a shardwise.task/v1 file to refine instead of "
                                         "the paper tasks (repeatable)")


def run(settings: RefineSettings, context: Context) -> Outcome:
    """Plan each task with the method and the baselines, refine, measure every plan in one session."""
    from shardwise.evaluation import measure_plans
    from shardwise.evaluation.refine import refine_plan
    from shardwise.profiling import MeasurementSettings
    from shardwise.search import make_searcher
    from shardwise.workload import load_task

    model = context.cost_model(settings.model, required=True)
    measurement = MeasurementSettings(device="cpu").for_cost_model(model.reference_ms, model.batch_size)
    searched = settings.method
    methods = (searched, *BASELINES)
    tasks = ([(Path(f).stem, load_task(f)) for f in settings.task] if settings.task
             else paper_tasks(settings.tasks, settings.seed, model.batch_size))
    if settings.sets:
        tasks = [(name, task) for name, task in tasks if name in settings.sets]
    rows: list[dict[str, Any]] = []
    for index, (name, task) in enumerate(tasks):
        plans = {m: make_searcher(m, **({"measurement": measurement} if m == "measured_greedy" else {}))
                 .search(task, model, settings.seed) for m in methods}
        started = time.perf_counter()
        starts = [] if settings.searched_only else [plans["measured_greedy"]]
        refined, refinement = refine_plan(task, plans[searched], model, measurement, rounds=settings.rounds,
                                          starts=starts, progress=False)
        refine_s = time.perf_counter() - started
        order = [*methods, "refined"]
        measured = dict(zip(order, measure_plans([(task, plans[m]) for m in methods] + [(task, refined)],
                                                 measurement, progress=False)))
        ms = {m: measured[m].max_cost_ms for m in order}
        label = name if settings.task else f"{name} #{index % settings.tasks + 1}"
        per_round = " ".join(f"{r.measured_max_ms:.2f}{'*' if r.kept else ''}" for r in refinement.rounds)
        print(f"{label}: {refinement.start}: {per_round} -> {refinement.after_ms:.2f}", flush=True)
        rows.append({"task": label, "tables": len(task.tables), "devices": task.num_devices,
                     **{f"{m}_ms": round(ms[m], 3) for m in order},
                     f"refined_over_{searched}": round(ms["refined"] / ms[searched], 3),
                     "refined_over_measured_greedy": round(ms["refined"] / ms["measured_greedy"], 3),
                     "refined_over_torchrec": round(ms["refined"] / ms["torchrec"], 3),
                     # the refined plan's slowest device over its own mean device: what balance alone could still gain
                     "refined_imbalance": round(measured["refined"].imbalance, 3),
                     "row_wise_tables": len(refined.row_wise), "start": refinement.start,
                     "rounds_kept": sum(r.kept for r in refinement.rounds), "refine_s": round(refine_s, 1)})
    what = ", ".join(settings.task) if settings.task else (
        f"first {settings.tasks} task(s) of {','.join(settings.sets) if settings.sets else 'each paper set'}")
    notes = [f"{what}, {settings.rounds} rounds, " + ("from the searched plan only" if settings.searched_only
                                                      else f"from the faster of {searched} and the measured greedy")
             + ", CPU"]
    notes += [f"mean {key}: {statistics.fmean(r[key] for r in rows):.3f}"
              for key in (f"refined_over_{searched}", "refined_over_measured_greedy", "refined_over_torchrec")]
    for devices in sorted({r["devices"] for r in rows}):
        on = [r for r in rows if r["devices"] == devices]
        notes.append(f"{devices} devices: refined / torchrec {statistics.fmean(r['refined_over_torchrec'] for r in on):.3f} "
                     f"on average; at or below the measured greedy on "
                     f"{sum(r['refined_over_measured_greedy'] <= 1.0 for r in on)} of {len(on)} tasks")
    return Outcome(rows, notes, record_name=None if searched == "neuroshard" else f"refine_{searched}",
                   title=f"Refinement on hardware: {searched} before and after, the measured greedy, TorchRec")


register(Experiment(
    name="refine",
    title="Refinement on hardware: neuroshard before and after, the measured greedy, TorchRec",
    settings=RefineSettings,
    run=run,
))
