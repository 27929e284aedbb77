"""Measured plan quality: NeuroShard vs TorchRec's planner vs the best greedy vs a measured-single-cost greedy.

Two seeded task sets like the papers' (10-60 tables on 4 devices, 80-120 on 8), drawn from held-out
synthetic tables; every plan measured on the real kernels and all-to-all of this machine. Prints the
comparison table with ratios to TorchRec and to the best baseline.

With --throughput-tasks N it also trains TorchRec's DLRM (DistributedModelParallel, one process per device)
under every method's plan of the first N tasks of each set, all in the same run with the same settings and
warm-up excluded, and adds the mean samples/s and `thru/torchrec` (samples/s over TorchRec's plan's, higher
is better) to the table. Off by default: on CPU each plan costs a training run of several seconds or more.

    python benchmarks/bench_plan_quality.py --model models:/shardwise-cost-cpu-x86_64-2c@champion
    python benchmarks/bench_plan_quality.py --small        # a minute-scale smoke run, no cost model
    python benchmarks/bench_plan_quality.py --small --throughput-tasks 1   # + end-to-end DLRM samples/s
    (--record also writes benchmarks/results/plan_quality.json; with --small, plan_quality_small.json;
     --resume goes on with an interrupted run in the same --out, each task's results are saved as it ends)
    python benchmarks/bench_plan_sessions.py --run runs/bench_plan_quality   # its plans again, in fresh sessions
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import torch
from record import record

from shardwise.cli import quiet_libraries
from shardwise.costmodel.types import CostModel
from shardwise.evaluation import (
    PAPER_TASK_SETS,
    SMALL_TASK_SETS,
    PlanResult,
    TaskSetSpec,
    cost_ratio,
    format_summary,
    make_task_set,
    run_benchmark,
    throughput_ratio,
)
from shardwise.integrations.mlflow import MlflowService
from shardwise.profiling import CommPricing, MeasurementSettings
from shardwise.search import Searcher, get_method, load_plan, make_searcher, method_names
from shardwise.workload import ShardingTask
from shardwise.workload.synthetic import synthesize_tables
from shardwise.workload.tableset import TableSet, load_tables, split_tables

MEASURED_GREEDY = "measured_greedy"
#: NeuroShard's plan refined on this machine (run_benchmark's "<method>+refine")
REFINED = "neuroshard+refine"
#: the columns of the printed summary table, as recorded (the throughput ones only when measured)
RECORDED_COLUMNS = ("task_set", "method", "tasks", "failed", "mean_cost_ms", "mean_compute_ms",
                    "ratio_to_torchrec", "ratio_to_best_baseline", "imbalance", "memory_headroom",
                    "planning_time_s", "prediction_error")
RESUMED = "; with --resume, tasks an earlier call measured with these settings come from --out, their time counted as it was then"
THROUGHPUT_COLUMNS = ("mean_samples_per_s", "throughput_ratio_to_torchrec")


def held_out_pool(seed: int, row_scale: float = 0.01, batch_size: int = 65536, *, small: bool = False) -> TableSet:
    """The held-out share of synthetic DLRM tables the task sets draw from (800 tables, 20% held out; small: 200,
    half)."""
    tables = synthesize_tables(num_tables=200 if small else 800, seed=seed, row_scale=row_scale,
                               batch_size=batch_size, progress=False)
    return split_tables(tables, holdout_fraction=0.5 if small else 0.2, seed=seed)[1]


def paper_tasks(per_set: int, seed: int, batch_size: int) -> list[tuple[str, ShardingTask]]:
    """(set name, task) for the first `per_set` tasks of each paper task set, at `batch_size` (other benchmarks
    compare on these: at 65536, TorchRec's storage estimate finds no plan for them)."""
    pool = held_out_pool(seed, batch_size=batch_size)
    return [(spec.name, task) for spec in PAPER_TASK_SETS
            for task in make_task_set(pool, spec.model_copy(update={"num_tasks": per_set}), seed=seed)]


def default_methods() -> tuple[str, ...]:
    """Every registered method that plans without a trained policy (policies: bench_rl_policies.py)."""
    return tuple(name for name in method_names() if get_method(name).policy is None)


def build_searchers(
    methods: list[str], cost_model: CostModel | None, measurement: MeasurementSettings
) -> dict[str, Searcher]:
    """One searcher per method for the whole run; those that need a cost model are left out without one."""
    searchers: dict[str, Searcher] = {}
    for name in methods:
        spec = get_method(name)
        if spec.policy is not None:
            raise SystemExit(f"--methods {name}: plans with a trained policy; benchmark it with "
                             f"`shardwise benchmark --methods {name}` or bench_rl_policies.py")
        if spec.needs_cost_model and cost_model is None:
            print(f"no cost model: skipping {name}")
            continue
        searchers[name] = make_searcher(name, **({"measurement": measurement} if spec.measures else {}))
    return searchers


def _record(args: argparse.Namespace, specs: tuple[TaskSetSpec, ...], rows: list[dict[str, Any]],
            headlines: list[str], num_methods: int, elapsed_s: float, measurement: MeasurementSettings) -> None:
    """The printed summary table as rows, the headline ratio lines as notes."""
    columns = RECORDED_COLUMNS + (THROUGHPUT_COLUMNS if args.throughput_tasks else ())
    recorded = [{c: round(v, 4) if isinstance(v, float) else v for c, v in ((c, r.get(c)) for c in columns)}
                for r in rows]
    best = {r["task_set"]: r["best_baseline"] for r in rows}
    sets = ", ".join(f"{s.name} ({s.num_tasks} tasks)" for s in specs)
    notes = [
        f"{num_methods} methods on {sets}, measured on this machine's kernels ({measurement.timing_rounds} timings "
        f"per device) and all-to-alls ({measurement.comm_rounds} rounds x {measurement.comm_iters}, each device's "
        f"priced {measurement.comm_pricing!r}) "
        f"({elapsed_s:.0f} s{RESUMED if args.resume else ''}); ratios < 1: cheaper than the reference; memory_headroom and prediction_error "
        "are fractions",
        "best baseline: " + ", ".join(f"{k}: {v}" for k, v in best.items()),
        *headlines,
    ]
    if args.small:
        notes.append("--small: proves the pipeline, its figures are rough")
    record(args.record_name or ("plan_quality_small" if args.small else "plan_quality"),
           "Measured plan cost: NeuroShard, TorchRec's planner and the greedy baselines"
           + (", --small smoke run" if args.small else "")
           + (f", cost model {args.model}" if args.record_name else ""), recorded,
           notes="; ".join(notes))


def finished_run(parser: argparse.ArgumentParser, run: str) -> tuple[Path, dict[str, Any]]:
    """A finished run's --out directory and its results.json (its protocol, `measurement`); a usage error where
    `run` is not one."""
    path = Path(run)
    if not (path / "results.json").is_file():
        parser.error(f"--run: {path} has no results.json (a bench_plan_quality.py --out directory)")
    return path, json.loads((path / "results.json").read_text())


def at_or_below(results: list[PlanResult], method: str, reference: str, value: Callable[[PlanResult], float]) -> str:
    """On how many tasks `method`'s figure is at or below `reference`'s, the worst ratio and the mean of the
    ratios ("" when no task has both)."""
    mine = {r.task_index: value(r) for r in results if r.method == method}
    theirs = {r.task_index: value(r) for r in results if r.method == reference}
    if not (tasks := sorted(set(mine) & set(theirs))):
        return ""
    ratios = [mine[k] / theirs[k] for k in tasks]
    return (f"{method} at or below {reference} on {sum(r <= 1 for r in ratios)} of {len(tasks)} tasks (worst ratio "
            f"{max(ratios):.3f}, mean {statistics.fmean(ratios):.3f})")


def data_parallel_chosen(results: list[PlanResult]) -> str:
    """Which methods replicated tables or split them by rows (issue 35's data-parallel and row-wise types): per method
    whose plans can, in how many of its plans and how many tables ("" when no plan file says)."""
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
             if {"neuroshard", MEASURED_GREEDY} <= rec["starts"].keys() and {(k, "neuroshard"), (k, MEASURED_GREEDY)} <= ms.keys()]
    if not moved:
        return ""
    return (f"noise: NeuroShard's plan over the measured greedy's, measured in refinement's session and again in this "
            f"one, moved by {statistics.median(moved):.1%} (median over {len(moved)} tasks, at most {max(moved):.1%}): "
            "differences between plans below that are within this machine's noise (bench_plan_sessions.py measures "
            "the plans again in fresh sessions)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="cost model URI (models:/..., runs:/..., or a directory)")
    parser.add_argument("--tables", help="held-out shardwise.tables/v1 file (default: synthesize and split)")
    parser.add_argument("--row-scale", type=float, default=0.01, help="scale of synthetic table rows (CPU fit)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="measure at this batch (default: the cost model's, else the task's)")
    parser.add_argument("--num-tasks", type=int, default=None, help="tasks per set (default: the set's)")
    parser.add_argument("--sets", default=None, help="only these task sets (comma separated names)")
    parser.add_argument("--small", action="store_true", help="tiny sets and batch: proves the pipeline works")
    parser.add_argument("--methods", default=",".join(default_methods()),
                        help="comma-separated methods to compare (default: every method without a trained policy)")
    parser.add_argument("--throughput-tasks", type=int, default=0, metavar="N",
                        help="also train TorchRec's DLRM under every plan of the first N tasks per set; samples/s "
                             "and thru/torchrec, higher is better (default 0: off, slow on CPU)")
    parser.add_argument("--throughput-iters", type=int, default=None,
                        help="timed training iterations per plan (default 20, --small 5)")
    parser.add_argument("--throughput-warmup", type=int, default=None,
                        help="warm-up training iterations per plan (default 5, --small 2)")
    parser.add_argument("--refine", type=int, default=3, metavar="ROUNDS",
                        help="also refine each learned method's plan on this machine (<method>+refine; 0: off)")
    parser.add_argument("--refine-budget-s", type=float, default=None, metavar="S",
                        help="start no new refinement round after S seconds on a plan (default: rounds alone)")
    parser.add_argument("--comm-pricing", choices=get_args(CommPricing), default=None,
                        help="each device's all-to-all: a line in width over the devices measured together, or its "
                             "own median (default: measurement's, width)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench_plan_quality")
    parser.add_argument("--resume", action="store_true",
                        help="take the tasks already measured in --out with the same settings from there (a run "
                             "that was interrupted goes on where it stopped)")
    parser.add_argument("--record", action="store_true",
                        help="write benchmarks/results/plan_quality.json (with --small: *_small.json)")
    parser.add_argument("--record-name", default=None, metavar="NAME",
                        help="record as benchmarks/results/NAME.json instead (another cost model's run, say)")
    args = parser.parse_args()
    quiet_libraries(verbose=False)  # MLflow's download bars and INFO logs, as the CLI without -v
    torch.set_num_threads(1)

    cost_model = MlflowService().load_cost_model(args.model) if args.model else None
    if args.tables:
        pool = load_tables(args.tables)
    else:
        # tasks at the batch plans are measured at (the cost model's): at 65536 TorchRec's storage estimate finds
        # no plan for the paper tasks, and the ratios to it would be missing
        batch = 2048 if args.small else args.batch_size or (cost_model.batch_size if cost_model else 65536)
        pool = held_out_pool(args.seed, args.row_scale, batch, small=args.small)
    specs = SMALL_TASK_SETS if args.small else PAPER_TASK_SETS
    # the protocol `shardwise evaluate` measures with (comm 5 x 5 here until 2026-11-25: two plans' ratio then
    # moved 3.8% between sessions, up to 11.5%, bench_measurement_noise.py); --small: a cheaper one
    measurement = MeasurementSettings(
        batch_size=args.batch_size, **({"comm_pricing": args.comm_pricing} if args.comm_pricing else {}),
        **({"warmup_iters": 2, "timing_iters": 5, "timing_rounds": 3, "comm_iters": 3} if args.small else {}))
    if args.sets:
        wanted = args.sets.split(",")
        if unknown := sorted(set(wanted) - {s.name for s in specs}):
            parser.error(f"--sets: no task set {', '.join(unknown)}; there are {', '.join(s.name for s in specs)}")
        specs = tuple(s for s in specs if s.name in wanted)
    if args.num_tasks:
        specs = tuple(s.model_copy(update={"num_tasks": args.num_tasks}) for s in specs)
    task_sets = {s.name: make_task_set(pool, s, seed=args.seed) for s in specs}

    if cost_model is not None:
        # the measured greedy times tables as the model's data was, like the plans are measured
        measurement = measurement.for_cost_model(cost_model.reference_ms, cost_model.batch_size)
    methods = args.methods.split(",")
    searchers = build_searchers(methods, cost_model, measurement)
    started = time.perf_counter()
    results, rows = run_benchmark(
        task_sets, searchers, learned=[m for m in searchers if get_method(m).learned], cost_model=cost_model,
        measurement=measurement, seed=args.seed, out_dir=args.out, throughput_tasks=args.throughput_tasks,
        throughput_iters=args.throughput_iters if args.throughput_iters is not None else (5 if args.small else 20),
        throughput_warmup=args.throughput_warmup if args.throughput_warmup is not None else (2 if args.small else 5),
        refine_rounds=args.refine, refine_budget_s=args.refine_budget_s, resume=args.resume,
    )
    print(format_summary(rows))
    headlines: list[str] = []  # the lines below, kept for --record

    def say(line: str) -> None:
        print(line)
        headlines.append(line)

    # the headline ratios, each over the tasks both methods planned
    for spec in specs:
        in_set = [r for r in results if r.task_set == spec.name]
        greedy = [r for r in rows if r["task_set"] == spec.name and r["method"].endswith("_greedy")
                  and r["method"] != MEASURED_GREEDY and r["mean_cost_ms"] is not None]
        best_greedy = min(greedy, key=lambda r: r["mean_cost_ms"])["method"] if greedy else None
        for name in ("neuroshard", REFINED, MEASURED_GREEDY):
            parts = [
                f"/ {ref} = {ratio:.3f}"
                for ref in ("torchrec", "torchrec_cw", "torchrec_dp", "torchrec_rw", best_greedy, MEASURED_GREEDY)
                if ref and ref != name and (ratio := cost_ratio(in_set, name, ref)) is not None
            ]
            if parts:
                say(f"{spec.name}: {name} " + ", ".join(parts))
        # refinement against the measured greedy, task by task: plan cost, then the kernels alone (placement decides
        # them; on a 2-core CPU the all-to-all is over 40% of an 8-device plan's cost (cost ms against comp ms), and
        # its measurement moves by several percent: bench_eval_comm_consistency.py)
        for part, value in (("", lambda r: r.measured_ms), (" on the slowest device's kernels alone",
                                                               lambda r: r.compute_ms)):
            if line := at_or_below(in_set, REFINED, MEASURED_GREEDY, value):
                say(f"{spec.name}: {line}{part}")
        # how far refinement left each plan from its own balance limit: its slowest device over its mean device
        if spread := sorted(r.imbalance for r in in_set if r.method == REFINED):
            say(f"{spec.name}: {REFINED} slowest device / its own mean device cost per task "
                f"{spread[0]:.3f}-{spread[-1]:.3f} (mean {sum(spread) / len(spread):.3f}): the most balancing alone "
                "could still gain")
        if line := data_parallel_chosen(in_set):
            say(f"{spec.name}: {line}")
        records = refinement_records(in_set)
        for line in (refinement_rounds(records), session_noise(in_set, records)):
            if line:
                say(f"{spec.name}: {line}")
        # what balance alone can buy: the max/mean split of the ratio to TorchRec's plan
        mean_ms = {(r.method, r.task_index): r.measured_ms / r.imbalance for r in in_set}
        max_ms = {(r.method, r.task_index): r.measured_ms for r in in_set}
        both = [k for m, k in mean_ms if m == "neuroshard" and ("torchrec", k) in mean_ms]
        if both:
            torchrec_mean = sum(mean_ms["torchrec", k] for k in both)
            torchrec_max = sum(max_ms["torchrec", k] for k in both)
            say(f"{spec.name}: mean device cost neuroshard / torchrec = "
                f"{sum(mean_ms['neuroshard', k] for k in both) / torchrec_mean:.3f}; a perfectly balanced plan at "
                f"TorchRec's mean device cost would be {torchrec_mean / torchrec_max:.3f} of TorchRec's plan cost")
        if args.throughput_tasks and (thru := throughput_ratio(in_set, "neuroshard", "torchrec")) is not None:
            say(f"{spec.name}: neuroshard DLRM samples/s / torchrec's = {thru:.3f} (higher is better)")
    elapsed_s = time.perf_counter() - started
    if args.resume:  # every task's own time, those measured by an earlier call included
        elapsed_s = json.loads((Path(args.out) / "results.json").read_text())["seconds"]
    print(f"report: {args.out}/benchmark.html ({elapsed_s:.0f} s)")
    if args.record:
        _record(args, specs, rows, headlines, len(searchers), elapsed_s, measurement)


if __name__ == "__main__":
    main()
