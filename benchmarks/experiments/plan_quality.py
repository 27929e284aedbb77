"""Measured plan quality: NeuroShard vs TorchRec's planner vs the best greedy vs a measured-single-cost greedy.

Two seeded task sets like the papers' (10-60 tables on 4 devices, 80-120 on 8), drawn from held-out synthetic
tables; every plan measured on the real kernels and all-to-all of this machine (`shardwise benchmark` runs the same
job on tables of your own; both plan with `shardwise.jobs.benchmark.default_methods()`). Rows: the comparison with
ratios to TorchRec and to the best baseline; notes: the headline ratios, refinement's rounds and the session noise.

With --throughput-tasks N it also trains TorchRec's DLRM (DistributedModelParallel, one process per device) under
every method's plan of the first N tasks of each set, all in the same run with the same settings and warm-up
excluded, and adds the mean samples/s and `thru/torchrec` (samples/s over TorchRec's plan's, higher is better).
Off by default: on CPU each plan costs a training run of several seconds or more.

    python -m benchmarks plan_quality --model models:/shardwise-cost-cpu-x86_64-2c@champion
    python -m benchmarks plan_quality --small        # a minute-scale smoke run, no cost model (plan_quality_small)
    python -m benchmarks plan_quality --small --throughput-tasks 1   # + end-to-end DLRM samples/s
    (--resume goes on with an interrupted run in the same --out: each task's results are saved as it ends)
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from benchmarks import harness
from benchmarks.plan_runs import MEASURED_GREEDY, REFINED, at_or_below, held_out_pool
from shardwise.evaluation import PlanResult
from shardwise.profiling import CommPricing

#: the columns of the summary table, as recorded (the throughput ones only when measured)
RECORDED_COLUMNS = ("task_set", "method", "tasks", "failed", "mean_cost_ms", "mean_compute_ms",
                    "ratio_to_torchrec", "ratio_to_best_baseline", "imbalance", "memory_headroom",
                    "planning_time_s", "prediction_error")
THROUGHPUT_COLUMNS = ("mean_samples_per_s", "throughput_ratio_to_torchrec")
#: this hardware's registered cost model, as `make run` registers it
CHAMPION = "models:/shardwise-cost-cpu-x86_64-2c@champion"
CLAIM_METHODS = ("neuroshard", "measured_greedy", "size_lookup_greedy", "torchrec", "torchrec_cw", "torchrec_dp",
                 "torchrec_rw")
RESUMED = ("; with --resume, tasks an earlier call measured with these settings come from --out, their time counted "
           "as it was then")


class PlanQualitySettings(harness.ExperimentSettings):
    """Which tasks, which methods, how plans are measured."""

    model: str | None = Field(default=None, description="cost model URI (models:/..., runs:/..., or a directory)")
    tables: str | None = Field(default=None, description="held-out shardwise.tables/v1 file (default: synthesize "
                               "and split)")
    row_scale: float = Field(default=0.01, gt=0, description="scale of synthetic table rows (CPU fit)")
    batch_size: int | None = Field(default=None, ge=1, description="measure at this batch (default: the cost "
                                   "model's, else the task's)")
    num_tasks: int | None = Field(default=None, ge=1, description="tasks per set (default: the set's)")
    sets: tuple[str, ...] | None = Field(default=None, description="only these task sets (comma separated names)",
                                         json_schema_extra={"sep": ","})
    small: bool = Field(default=False, description="tiny sets and batch: proves the pipeline works")
    methods: tuple[str, ...] | None = Field(
        default=None, description="comma-separated methods to compare (default: every method without a trained "
        "policy)", json_schema_extra={"sep": ","})
    throughput_tasks: int = Field(default=0, ge=0, description="also train TorchRec's DLRM under every plan of the "
                                  "first N tasks per set; samples/s and thru/torchrec, higher is better (0: off, "
                                  "slow on CPU)")
    throughput_iters: int | None = Field(default=None, ge=1, description="timed training iterations per plan "
                                         "(default 20, --small 5)")
    throughput_warmup: int | None = Field(default=None, ge=0, description="warm-up training iterations per plan "
                                          "(default 5, --small 2)")
    refine: int = Field(default=3, ge=0, description="also refine each learned method's plan on this machine for "
                        "up to this many rounds (<method>+refine; 0: off)")
    refine_budget_s: float | None = Field(default=None, gt=0, description="start no new refinement round after "
                                          "this many seconds on a plan (default: rounds alone)")
    comm_pricing: CommPricing | None = Field(default=None, description="each device's all-to-all: a line in width "
                                             "over the devices measured together, or its own median (default: "
                                             "measurement's, width)")
    seed: int = 0
    out: str = "runs/bench_plan_quality"
    resume: bool = Field(default=False, description="take the tasks already measured in --out with the same "
                         "settings from there (a run that was interrupted goes on where it stopped)")


def data_parallel_chosen(results: list[PlanResult]) -> str:
    """Which methods replicated tables or split them by rows: per method whose plans can, in how many of its plans
    and how many tables ("" when no plan file says)."""
    from shardwise.search import load_plan

    lines = []
    for kind, offered in (("data_parallel", ("torchrec_dp", "torchrec_rw")), ("row_wise", ("torchrec_rw",))):
        parts = []
        for method in sorted({r.method for r in results}):
            plans = [load_plan(r.plan_path) for r in results if r.method == method and r.plan_path]
            if not plans or not (method.startswith("neuroshard") or method in offered):
                continue
            counts = [len(getattr(p, kind)) for p in plans]
            parts.append(f"{method} in {sum(c > 0 for c in counts)} of {len(counts)} plans"
                         + (f" ({sum(counts)} tables)" if any(counts) else ""))
        if parts:
            lines.append(f"{kind.replace('_', '-')} tables chosen: " + ", ".join(parts))
    return "; ".join(lines)


def refinement_records(results: list[PlanResult]) -> dict[int, dict[str, Any]]:
    """Each task's refinement record (rounds, starts, time), read once from its refined plan's file."""
    from shardwise.search import load_plan

    return {r.task_index: load_plan(r.plan_path).extra["refinement"]
            for r in results if r.method == REFINED and r.plan_path}


def refinement_rounds(records: dict[int, dict[str, Any]]) -> str:
    """Refinement's rounds over a set's tasks: the measured gain of each kept round (its slowest device before over
    after, in that round's paired session) and the time refinement took."""
    if not records:
        return ""
    rounds = [x for rec in records.values() for x in rec["rounds"]]
    kept = [1 - x["after_ms"] / x["measured_max_ms"] for x in rounds if x["kept"]]
    seconds = sorted(rec["seconds"] for rec in records.values())
    gain = f"a measured gain of {statistics.fmean(kept):.1%} each (paired)" if kept else "none"
    return (f"{REFINED} kept {len(kept)} of {len(rounds)} rounds over {len(records)} tasks, {gain}; from the start "
            f"to the returned plan {statistics.fmean(r['after_ms'] / r['before_ms'] for r in records.values()):.3f} "
            f"(mean); refinement took {seconds[0]:.0f}-{seconds[-1]:.0f} s a plan (mean "
            f"{statistics.fmean(seconds):.0f} s)")


def session_noise(results: list[PlanResult], records: dict[int, dict[str, Any]]) -> str:
    """How far two fixed plans' measured ratio moves between sessions: NeuroShard's plan over the measured greedy's,
    as refinement measured them (its first session) and as this benchmark did. A difference between two plans
    smaller than this is within the machine's noise."""
    ms = {(r.task_index, r.method): r.measured_ms for r in results}
    moved = [abs(ms[k, "neuroshard"] / ms[k, MEASURED_GREEDY] / (rec["starts"]["neuroshard"]
                                                                 / rec["starts"][MEASURED_GREEDY]) - 1)
             for k, rec in records.items()
             if {"neuroshard", MEASURED_GREEDY} <= rec["starts"].keys()
             and {(k, "neuroshard"), (k, MEASURED_GREEDY)} <= ms.keys()]
    if not moved:
        return ""
    return (f"noise: NeuroShard's plan over the measured greedy's, measured in refinement's session and again in this "
            f"one, moved by {statistics.median(moved):.1%} (median over {len(moved)} tasks, at most {max(moved):.1%}): "
            "differences between plans below that are within this machine's noise")


def headlines(results: list[PlanResult], rows: list[dict[str, Any]], set_name: str, throughput: bool) -> list[str]:
    """One set's headline lines: the ratios of NeuroShard, its refined plan and the measured greedy to the others
    (each over the tasks both planned), refinement task by task, balance, the plan space chosen, the noise."""
    from shardwise.evaluation import cost_ratio, throughput_ratio

    lines: list[str] = []
    in_set = [r for r in results if r.task_set == set_name]
    greedy = [r for r in rows if r["task_set"] == set_name and r["method"].endswith("_greedy")
              and r["method"] != MEASURED_GREEDY and r["mean_cost_ms"] is not None]
    best_greedy = min(greedy, key=lambda r: r["mean_cost_ms"])["method"] if greedy else None
    for name in ("neuroshard", REFINED, MEASURED_GREEDY):
        parts = [f"/ {ref} = {ratio:.3f}"
                 for ref in ("torchrec", "torchrec_cw", "torchrec_dp", "torchrec_rw", best_greedy, MEASURED_GREEDY)
                 if ref and ref != name and (ratio := cost_ratio(in_set, name, ref)) is not None]
        if parts:
            lines.append(f"{set_name}: {name} " + ", ".join(parts))
    # refinement against the measured greedy, task by task: plan cost, then the kernels alone (placement decides
    # them; on a 2-core CPU the all-to-all's measurement moves by several percent)
    for part, value in (("", lambda r: r.measured_ms), (" on the slowest device's kernels alone",
                                                           lambda r: r.compute_ms)):
        if line := at_or_below(in_set, REFINED, MEASURED_GREEDY, value):
            lines.append(f"{set_name}: {line}{part}")
    # how far refinement left each plan from its own balance limit: its slowest device over its mean device
    if spread := sorted(r.imbalance for r in in_set if r.method == REFINED):
        lines.append(f"{set_name}: {REFINED} slowest device / its own mean device cost per task "
                     f"{spread[0]:.3f}-{spread[-1]:.3f} (mean {sum(spread) / len(spread):.3f}): the most balancing "
                     "alone could still gain")
    if line := data_parallel_chosen(in_set):
        lines.append(f"{set_name}: {line}")
    records = refinement_records(in_set)
    lines += [f"{set_name}: {line}" for line in (refinement_rounds(records), session_noise(in_set, records)) if line]
    # what balance alone can buy: the max/mean split of the ratio to TorchRec's plan
    mean_ms = {(r.method, r.task_index): r.measured_ms / r.imbalance for r in in_set}
    max_ms = {(r.method, r.task_index): r.measured_ms for r in in_set}
    if both := [k for m, k in mean_ms if m == "neuroshard" and ("torchrec", k) in mean_ms]:
        torchrec_mean = sum(mean_ms["torchrec", k] for k in both)
        torchrec_max = sum(max_ms["torchrec", k] for k in both)
        lines.append(f"{set_name}: mean device cost neuroshard / torchrec = "
                     f"{sum(mean_ms['neuroshard', k] for k in both) / torchrec_mean:.3f}; a perfectly balanced plan "
                     f"at TorchRec's mean device cost would be {torchrec_mean / torchrec_max:.3f} of TorchRec's plan "
                     "cost")
    if throughput and (thru := throughput_ratio(in_set, "neuroshard", "torchrec")) is not None:
        lines.append(f"{set_name}: neuroshard DLRM samples/s / torchrec's = {thru:.3f} (higher is better)")
    return lines


def run(settings: PlanQualitySettings, context: harness.Context) -> harness.Outcome:
    """Draw the task sets, plan them with every method, measure every plan, refine the learned ones."""
    from shardwise.evaluation import (
        PAPER_TASK_SETS,
        SMALL_TASK_SETS,
        make_task_set,
        run_benchmark,
    )
    from shardwise.jobs.benchmark import default_methods
    from shardwise.profiling import MeasurementSettings
    from shardwise.search import Searcher, get_method, make_searcher
    from shardwise.workload.tableset import load_tables

    cost_model = context.cost_model(settings.model) if settings.model else None
    if settings.tables:
        pool = load_tables(settings.tables)
    else:
        # tasks at the batch plans are measured at (the cost model's): at 65536 TorchRec's storage estimate finds
        # no plan for the paper tasks, and the ratios to it would be missing
        batch = 2048 if settings.small else settings.batch_size or (cost_model.batch_size if cost_model else 65536)
        pool = held_out_pool(settings.seed, settings.row_scale, batch, small=settings.small)
    specs = SMALL_TASK_SETS if settings.small else PAPER_TASK_SETS
    # the protocol `shardwise evaluate` measures with (record measurement_noise); --small: a cheaper one
    measurement = MeasurementSettings(
        batch_size=settings.batch_size, **({"comm_pricing": settings.comm_pricing} if settings.comm_pricing else {}),
        **({"warmup_iters": 2, "timing_iters": 5, "timing_rounds": 3, "comm_iters": 3} if settings.small else {}))
    if settings.sets:
        if unknown := sorted(set(settings.sets) - {s.name for s in specs}):
            raise harness.BenchmarkError(f"--sets: no task set {', '.join(unknown)}; there are {', '.join(s.name for s in specs)}")
        specs = tuple(s for s in specs if s.name in settings.sets)
    if settings.num_tasks:
        specs = tuple(s.model_copy(update={"num_tasks": settings.num_tasks}) for s in specs)
    task_sets = {s.name: make_task_set(pool, s, seed=settings.seed) for s in specs}
    if cost_model is not None:
        # the measured greedy times tables as the model's data was, like the plans are measured
        measurement = measurement.for_cost_model(cost_model.reference_ms, cost_model.batch_size)

    searchers: dict[str, Searcher] = {}
    for name in settings.methods or default_methods():
        spec = get_method(name)
        if spec.policy is not None:
            raise harness.BenchmarkError(f"--methods {name}: plans with a trained policy; benchmark it with "
                             f"`shardwise benchmark --methods {name}`")
        if spec.needs_cost_model and cost_model is None:
            print(f"no cost model: skipping {name}")
            continue
        searchers[name] = make_searcher(name, **({"measurement": measurement} if spec.measures else {}))
    started = time.perf_counter()
    results, rows = run_benchmark(
        task_sets, searchers, learned=[m for m in searchers if get_method(m).learned], cost_model=cost_model,
        measurement=measurement, seed=settings.seed, out_dir=settings.out, throughput_tasks=settings.throughput_tasks,
        throughput_iters=settings.throughput_iters or (5 if settings.small else 20),
        throughput_warmup=settings.throughput_warmup if settings.throughput_warmup is not None
        else (2 if settings.small else 5),
        refine_rounds=settings.refine, refine_budget_s=settings.refine_budget_s, resume=settings.resume,
    )
    lines = [line for spec in specs for line in headlines(results, rows, spec.name, settings.throughput_tasks > 0)]
    elapsed_s = time.perf_counter() - started
    if settings.resume:  # every task's own time, those measured by an earlier call included
        elapsed_s = json.loads((Path(settings.out) / "results.json").read_text())["seconds"]
    print(f"report: {settings.out}/benchmark.html ({elapsed_s:.0f} s)")

    columns = RECORDED_COLUMNS + (THROUGHPUT_COLUMNS if settings.throughput_tasks else ())
    recorded = [{c: round(v, 4) if isinstance(v, float) else v for c, v in ((c, r.get(c)) for c in columns)}
                for r in rows]
    best = {r["task_set"]: r["best_baseline"] for r in rows}
    sets = ", ".join(f"{s.name} ({s.num_tasks} tasks)" for s in specs)
    notes = [
        f"{len(searchers)} methods on {sets}, measured on this machine's kernels ({measurement.timing_rounds} timings "
        f"per device) and all-to-alls ({measurement.comm_rounds} rounds x {measurement.comm_iters}, each device's "
        f"priced {measurement.comm_pricing!r}) ({elapsed_s:.0f} s{RESUMED if settings.resume else ''}); ratios < 1: "
        "cheaper than the reference; memory_headroom and prediction_error are fractions",
        "best baseline: " + ", ".join(f"{k}: {v}" for k, v in best.items()),
        *lines,
    ]
    if settings.small:
        notes.append("--small: proves the pipeline, its figures are rough")
        return harness.Outcome(recorded, notes, record_name="plan_quality_small",
                       title=f"{EXPERIMENT.title}, --small smoke run")
    return harness.Outcome(recorded, notes, title=EXPERIMENT.title + (f", cost model {settings.model}" if settings.model
                                                              else ""))


EXPERIMENT = harness.register(harness.Experiment(
    name="plan_quality",
    title="Measured plan cost: NeuroShard, TorchRec's planner and the greedy baselines",
    settings=PlanQualitySettings,
    run=run,
    suites={"quick": (harness.SuiteRun({"small": True, "num_tasks": 1, "refine": 1, "out": "runs/bench/plan_quality_small"}),),
            # the headline plan-cost claims: every sharding type offered, 10 tasks a set, resumable (an hour a set)
            "claims": tuple(harness.SuiteRun({"model": CHAMPION, "sets": (task_set,), "num_tasks": 10, "methods": CLAIM_METHODS,
                                      "out": f"runs/bench_plan_quality_{task_set}", "resume": True},
                                     record_name=f"plan_quality_types_{task_set.split('-')[0]}")
                            for task_set in ("4dev-10to60", "8dev-80to120"))},
))
