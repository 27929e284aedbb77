"""Does replicating the smallest tables pay on this machine? A finished bench_plan_quality run's refined plans,
measured beside the same plans with their k smallest tables made data-parallel, next to what the cost model says.

NeuroShard prices data-parallel roots (the tables in ascending rows, as prefixes of 1, 2, 4, ... tables) and keeps
one only where the model predicts a cheaper plan; on the paper task sets on a 2-core CPU it kept none. This
benchmark asks the hardware the same question without the search: each task's refined plan (`neuroshard+refine` of
--run) and, for each k of --counts, that plan with its k tables of fewest rows taken off their devices and
replicated on every device (their dense kernel on the local batch and their gradients' all-reduce on every device,
the rest where it was), measured together in one session under the run's protocol (`measure_plans`, the run's
reference pinned), and each predicted by the cost model (`simulate`). A variant whose replicas do not fit in a
device's memory beside its shards is left out and said so. It prints, per task and k, the measured and predicted
plan cost over the plan's without replicas, and per k the mean and on how many tasks it measured cheaper:
whether the search's choice (none, or which k) is the hardware's.

    python benchmarks/bench_data_parallel_choice.py --run runs/bench_pq_s28_4 --model runs/model_s28
    python benchmarks/bench_data_parallel_choice.py --run ... --model ... --counts 1,2,4 --num-tasks 5 --record
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from plan_runs import REFINED, finished_run
from record import record

from shardwise.cli import quiet_libraries
from shardwise.costmodel.data_parallel import gradient_bytes
from shardwise.evaluation import measure_plans
from shardwise.integrations.mlflow import MlflowService
from shardwise.profiling import MeasurementSettings
from shardwise.search import Plan, PlanError, load_plan, validate_plan
from shardwise.search.simulator import simulate
from shardwise.workload import ShardingTask, load_task


def replicated(plan: Plan, task: ShardingTask, count: int) -> Plan:
    """`plan` with its `count` tables of fewest rows (that it does not already replicate) data-parallel: their shards
    taken off their devices, the tables on every device. PlanError where the replicas do not fit."""
    chosen = [t.name for t in sorted(task.tables, key=lambda t: (t.rows, t.name))
              if t.name not in plan.data_parallel and t.name not in plan.row_wise][:count]
    variant = plan.model_copy(update={
        "shards": tuple(s for s in plan.shards if s.table not in chosen),
        "data_parallel": tuple(sorted((*plan.data_parallel, *chosen))), "method": f"{plan.method}+dp{count}"})
    validate_plan(variant, task)  # over a device's memory: PlanError
    return variant


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a bench_plan_quality.py --out directory")
    parser.add_argument("--model", required=True, help="the cost model the run planned with (its predictions)")
    parser.add_argument("--counts", default="1,2,4", help="how many of the smallest tables to replicate")
    parser.add_argument("--num-tasks", type=int, default=None, help="the first this many tasks of each set")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/data_parallel_choice.json")
    parser.add_argument("--record-name", default="data_parallel_choice", metavar="NAME",
                        help="record as benchmarks/results/NAME.json instead")
    args = parser.parse_args()
    quiet_libraries(verbose=False)
    run, original = finished_run(args.run)
    counts = [int(c) for c in args.counts.split(",")]
    if any(c < 1 for c in counts):
        parser.error(f"--counts: each at least 1, got {args.counts}")
    model = MlflowService().load_cost_model(args.model)
    measurement = MeasurementSettings(**original["measurement"])  # the run's protocol, its reference pinned
    torch.set_num_threads(1)
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    left_out: list[str] = []
    for task_dir in sorted(run.glob("*/task*")):
        if not (task_dir / f"{REFINED}.plan.json").is_file():
            continue
        index = int(task_dir.name.removeprefix("task"))
        if args.num_tasks is not None and index >= args.num_tasks:
            continue
        task, plan = load_task(task_dir / "task.json"), load_plan(task_dir / f"{REFINED}.plan.json")
        plans = [(0, plan)]
        for count in counts:
            try:
                plans.append((count, replicated(plan, task, count)))
            except PlanError as err:
                left_out.append(f"{task_dir.parent.name} task {index}, {count} replicated: {err}")
        measured = measure_plans([(task, p) for _, p in plans], measurement, progress=False)
        predicted = [simulate(p, task, model).max_cost_ms for _, p in plans]
        mine = [{"task_set": task_dir.parent.name, "task": index, "replicated": count,
                 "gradient_kib": round(gradient_bytes([task.table(n) for n in p.data_parallel]) / 1024, 1),
                 "measured_ms": round(cost.max_cost_ms, 4), "predicted_ms": round(ms, 4),
                 "measured_ratio": round(cost.max_cost_ms / measured[0].max_cost_ms, 4),
                 "predicted_ratio": round(ms / predicted[0], 4)}
                for (count, p), cost, ms in zip(plans, measured, predicted, strict=True)]
        rows += mine
        print(f"{task_dir.parent.name} task {index}: " + ", ".join(
            f"{r['replicated']} replicated {r['measured_ratio']:.3f} measured / {r['predicted_ratio']:.3f} predicted"
            for r in mine[1:]))
    if not rows:
        parser.error(f"--run: no task in {run} has a {REFINED} plan")
    headlines = []
    for name in sorted({r["task_set"] for r in rows}):
        for count in counts:
            mine = [r for r in rows if r["task_set"] == name and r["replicated"] == count]
            if mine:
                cheaper = sum(r["measured_ratio"] < 1 for r in mine)
                headlines.append(
                    f"{name}: {count} smallest replicated, over the plan without: measured "
                    f"{statistics.mean(r['measured_ratio'] for r in mine):.3f} (cheaper on {cheaper} of {len(mine)} "
                    f"tasks, best {min(r['measured_ratio'] for r in mine):.3f}), predicted "
                    f"{statistics.mean(r['predicted_ratio'] for r in mine):.3f}")
    headlines += [f"left out (memory): {line}" for line in left_out]
    print("\n".join(headlines))
    seconds = time.perf_counter() - started
    print(f"({seconds:.0f} s)")
    if args.record:
        print("recorded", record(
            args.record_name, "Replicating the smallest tables: measured and predicted, beside the refined plan",
            rows, notes=(f"the refined plans of {run} (bench_plan_quality.py), each measured beside its variants in "
                         f"one session under the run's protocol ({measurement.timing_rounds} kernel timings, "
                         f"{measurement.comm_rounds} x {measurement.comm_iters} all-to-alls, all-reduces measured), "
                         f"predicted by {args.model}; ratios over the plan without replicas ({seconds:.0f} s); "
                         + "; ".join(headlines))))


if __name__ == "__main__":
    main()
