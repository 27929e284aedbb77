"""Measured plan quality: NeuroShard vs TorchRec's planner vs the best greedy vs a measured-single-cost greedy.

Two seeded task sets like the papers' (10-60 tables on 4 devices, 80-120 on 8), drawn from held-out
synthetic tables; every plan measured on the real kernels and all-to-all of this machine. Prints the
comparison table with ratios to TorchRec and to the best baseline.

    python benchmarks/bench_plan_quality.py --model models:/shardwise-cost-cpu-x86_64-2c@champion
    python benchmarks/bench_plan_quality.py --small        # a minute-scale smoke run, no cost model
"""

from __future__ import annotations

import argparse
import time

import torch

from shardwise.evaluation.suite import (
    MEASURED_GREEDY,
    PAPER_TASK_SETS,
    SMALL_TASK_SETS,
    cost_ratio,
    format_summary,
    make_task_set,
    run_benchmark,
)
from shardwise.profiling.kernel import TimingProtocol
from shardwise.workload.synthetic import synthesize_tables
from shardwise.workload.tableset import load_tables, split_tables

METHODS = ("neuroshard", "torchrec", "torchrec_cw", "size_greedy", "dim_greedy", "lookup_greedy",
           "size_lookup_greedy", "random", MEASURED_GREEDY)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="cost model URI (models:/..., runs:/..., or a directory)")
    parser.add_argument("--tables", help="held-out shardwise.tables/v1 file (default: synthesize and split)")
    parser.add_argument("--row-scale", type=float, default=0.01, help="scale of synthetic table rows (CPU fit)")
    parser.add_argument("--batch-size", type=int, default=None, help="measure at this batch (default: task's)")
    parser.add_argument("--num-tasks", type=int, default=None, help="tasks per set (default: the set's)")
    parser.add_argument("--small", action="store_true", help="tiny sets and batch: proves the pipeline works")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated methods to compare")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench_plan_quality")
    args = parser.parse_args()
    torch.set_num_threads(1)

    if args.tables:
        pool = load_tables(args.tables)
    else:
        synthetic_batch = 2048 if args.small else 65536
        tables = synthesize_tables(num_tables=200 if args.small else 800, seed=args.seed,
                                   row_scale=args.row_scale, batch_size=synthetic_batch, progress=False)
        _, pool = split_tables(tables, holdout_fraction=0.2 if not args.small else 0.5, seed=args.seed)
    if args.small:
        specs = SMALL_TASK_SETS
        protocol = TimingProtocol(warmup_iters=2, iters=5, calibration_runs=20)
    else:
        specs = PAPER_TASK_SETS
        protocol = TimingProtocol()
    if args.num_tasks:
        specs = tuple(s.model_copy(update={"num_tasks": args.num_tasks}) for s in specs)
    task_sets = {s.name: make_task_set(pool, s, seed=args.seed) for s in specs}

    cost_model = None
    if args.model:
        from shardwise.integrations.mlflow import load_cost_model

        cost_model = load_cost_model(args.model)
    batch = args.batch_size or (cost_model.batch_size if cost_model is not None else None)
    started = time.perf_counter()
    results, rows = run_benchmark(
        task_sets, tuple(args.methods.split(",")), cost_model=cost_model, protocol=protocol, batch_size=batch,
        comm_iters=3 if args.small else 5, seed=args.seed, out_dir=args.out,
    )
    print(format_summary(rows))
    # the headline ratios, each over the tasks both methods planned
    for spec in specs:
        in_set = [r for r in results if r.task_set == spec.name]
        greedy = [r for r in rows if r["task_set"] == spec.name and r["method"].endswith("_greedy")
                  and r["method"] != MEASURED_GREEDY and r["mean_cost_ms"] is not None]
        best_greedy = min(greedy, key=lambda r: r["mean_cost_ms"])["method"] if greedy else None
        for name in ("neuroshard", MEASURED_GREEDY):
            parts = [
                f"/ {ref} = {ratio:.3f}"
                for ref in ("torchrec", "torchrec_cw", best_greedy, MEASURED_GREEDY)
                if ref and ref != name and (ratio := cost_ratio(in_set, name, ref)) is not None
            ]
            if parts:
                print(f"{spec.name}: {name} " + ", ".join(parts))
    print(f"report: {args.out}/benchmark.html ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
