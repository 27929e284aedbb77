"""DLRM validation of several plans: every plan in one start of the ranks (what `validate --compare`, the
pipeline's evaluate step and the benchmark do) next to one start per plan (what they did before), in one run.

The smoke pipeline's sizes by default: 12 synthetic tables on 4 gloo ranks, global batch 512, 5 warm-up and 2
timed iterations per plan, two table-wise greedy plans.

    python benchmarks/bench_dlrm_validate.py [--plans 3] [--record]
"""

from __future__ import annotations

import argparse
import time

from record import record

from shardwise.cli import quiet_libraries
from shardwise.evaluation import measure_dlrm_throughputs
from shardwise.search import make_searcher
from shardwise.workload.synthetic import synthesize_tables
from shardwise.workload.tableset import sample_task

METHODS = ("size_greedy", "dim_greedy", "lookup_greedy", "random")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=2, choices=range(2, len(METHODS) + 1), help="plans validated")
    parser.add_argument("--tables", type=int, default=12)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/dlrm_validate.json")
    args = parser.parse_args()
    quiet_libraries(verbose=False)
    tableset = synthesize_tables(args.tables, seed=0, row_scale=0.001, batch_size=512, progress=False)
    task = sample_task(tableset, args.tables, args.devices, seed=0, memory_slack=2.0)
    plans = [make_searcher(method).search(task, None, 0) for method in METHODS[:args.plans]]
    settings = {"iters": args.iters, "warmup": 5, "batch_size": 512, "device": "cpu"}
    started = time.perf_counter()
    measure_dlrm_throughputs(task, plans, **settings)
    together_s = time.perf_counter() - started
    started = time.perf_counter()
    for plan in plans:
        measure_dlrm_throughputs(task, [plan], **settings)
    apart_s = time.perf_counter() - started
    print(f"{len(plans)} plans, {args.tables} tables on {args.devices} gloo ranks, {args.iters} timed iterations each")
    print(f"one start for all: {together_s:6.1f} s   one start per plan: {apart_s:6.1f} s   "
          f"ratio {together_s / apart_s:.2f}")
    if args.record:
        record("dlrm_validate", "DLRM validation of several plans: one start of the ranks, or one per plan",
               [{"plans": len(plans), "one_start_s": round(together_s, 1), "start_per_plan_s": round(apart_s, 1),
                 "one_start_over_per_plan": round(together_s / apart_s, 2)}],
               notes=f"{args.tables} synthetic tables (row scale 0.001) on {args.devices} gloo ranks, global batch "
                     f"512, 5 warm-up and {args.iters} timed iterations per plan; plans: {', '.join(METHODS[:args.plans])}")


if __name__ == "__main__":
    main()
