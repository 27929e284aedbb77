"""Predicted plan quality: mean predicted plan cost (slowest device) per method over seeded tasks.

Two task sets like the papers': 10-60 tables on 4 devices, and 80-120 tables on 8, drawn from synthetic
DLRM tables. Every plan is scored by the same cost model; ratios are to NeuroShard (> 1: worse). Beside each
method: how many tables its plans made data-parallel and row-wise (the plan space beyond placement). Failures
(PlanError: the method found no plan within memory) are counted, never scored. Measured (not predicted)
quality is benchmarks/bench_plan_quality.py.

    python benchmarks/bench_search_quality.py --model models:/shardwise-cost-cpu-x86_64-2c@champion
    (--record also writes benchmarks/results/search_quality.json)
"""

from __future__ import annotations

import argparse

import numpy as np
from record import record
from tqdm.auto import tqdm

from shardwise.cli import quiet_libraries
from shardwise.search import PlanError, get_method, make_searcher, method_names
from shardwise.workload.synthetic import synthesize_tables
from shardwise.workload.tableset import sample_task

#: every registered method that plans without a trained policy and without measuring on this machine
METHODS = tuple(m for m in method_names() if get_method(m).policy is None and not get_method(m).measures)
TASK_SETS = {"10-60 tables, 4 devices": (10, 60, 4), "80-120 tables, 8 devices": (80, 120, 8)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="cost model (default: this hardware's champion)")
    parser.add_argument("--tasks", type=int, default=8, help="tasks per set")
    parser.add_argument("--row-scale", type=float, default=0.01, help="table rows x this (CPU-sized tables)")
    parser.add_argument("--memory-slack", type=float, default=1.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/search_quality.json")
    args = parser.parse_args()
    quiet_libraries(verbose=False)  # MLflow's download bars and INFO logs, as the CLI without -v

    from shardwise.integrations.mlflow import MlflowService, champion_uri, cost_model_name
    from shardwise.profiling.hardware import hardware_kind

    uri = args.model or champion_uri(cost_model_name(hardware_kind("cpu")))
    try:
        model = MlflowService().load_cost_model(uri)
    except Exception as err:
        raise SystemExit(
            f"no cost model at {uri} ({type(err).__name__}): predicted quality needs one; get it with "
            "`make run` or `shardwise pretrain`, then pass --model"
        ) from None
    print(f"cost model: {uri} ({model.hardware_kind}, batch {model.batch_size})")
    tableset = synthesize_tables(300, seed=args.seed, row_scale=args.row_scale, batch_size=model.batch_size)
    rng = np.random.default_rng(args.seed)
    rows = []
    for set_name, (lo, hi, num_devices) in TASK_SETS.items():
        costs: dict[str, list[float]] = {m: [] for m in METHODS}
        failures = dict.fromkeys(METHODS, 0)
        typed = {m: [0, 0] for m in METHODS}  # data-parallel, row-wise tables over the set's plans
        for i in tqdm(range(args.tasks), desc=set_name, leave=False):
            task = sample_task(
                tableset, int(rng.integers(lo, hi + 1)), num_devices, seed=args.seed * 1000 + i,
                memory_slack=args.memory_slack,
            )
            for method in METHODS:
                try:
                    plan = make_searcher(method).search(task, model, i)
                except PlanError:
                    failures[method] += 1
                    continue
                costs[method].append(plan.extra["predicted"]["max_cost_ms"])
                typed[method][0] += len(plan.data_parallel)
                typed[method][1] += len(plan.row_wise)
        reference = float(np.mean(costs["neuroshard"])) if costs["neuroshard"] else float("nan")
        print(f"\n{set_name}: {args.tasks} tasks, memory slack {args.memory_slack}")
        print(f"{'method':>20}  {'mean cost ms':>12}  {'vs neuroshard':>13}  {'failed':>6}  {'dp tables':>9}  "
              f"{'rw tables':>9}")
        for method in METHODS:
            mean = float(np.mean(costs[method])) if costs[method] else float("nan")
            print(f"{method:>20}  {mean:>12.3f}  {mean / reference:>12.3f}x  {failures[method]:>6}  "
                  f"{typed[method][0]:>9}  {typed[method][1]:>9}")
            ratio = mean / reference
            rows.append({"task_set": set_name, "method": method,
                         "mean_cost_ms": round(mean, 3) if np.isfinite(mean) else None,
                         "vs_neuroshard": round(ratio, 3) if np.isfinite(ratio) else None,
                         "failed": failures[method], "data_parallel_tables": typed[method][0],
                         "row_wise_tables": typed[method][1]})
    if args.record:
        record("search_quality", "Predicted plan cost per method (cost model's slowest device)", rows,
               notes=f"cost model {uri}; {args.tasks} tasks per set, memory slack {args.memory_slack}, "
                     f"synthetic tables at row scale {args.row_scale}; vs_neuroshard > 1: worse; a failed "
                     "plan (no plan within memory) is counted, never scored; data_parallel_tables / row_wise_tables: tables of "
                     "that type over the set's plans")


if __name__ == "__main__":
    main()
