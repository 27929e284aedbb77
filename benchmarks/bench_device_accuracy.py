"""Per-device accuracy of cost models on the device shards that plans actually produce.

A plan's measured cost is its slowest device. When search balances the predicted per-device costs, what is
left of the imbalance is the cost model's error on each device's shard (and measurement noise): with 8
devices whose predictions are off by independent errors of spread s, the slowest one lands about 1.4 s above
the mean. This benchmark re-measures every device shard of the plans a `bench_plan_quality.py` run wrote
(kernel fwd+bwd, `--rounds` interleaved rounds, median as the reference value) and prints, per cost model:
the bias, the mean absolute error once the bias is removed, and the within-plan spread of prediction/measured
(what balance depends on). It also prints the noise of the median of 3 rounds (what the benchmark measures
with) against the `--rounds` median.

    python benchmarks/bench_plan_quality.py --model runs/model400 --tables runs/bench_t400/holdout.json \\
        --num-tasks 8 --out runs/bench_pq                                  # writes the plans and task.json files
    python benchmarks/bench_device_accuracy.py --plans runs/bench_pq/8dev-80to120 \\
        --models runs/model400,runs/model400x                               # ~1 min per round on 2 cores
    (--record also writes benchmarks/results/device_accuracy.json)
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from record import record

from shardwise.cli import quiet_libraries
from shardwise.evaluation import KernelShard, resolve_timing, time_shards_in_rounds
from shardwise.integrations.mlflow import MlflowService
from shardwise.profiling import MeasurementSettings
from shardwise.search.plan import device_specs, load_plan
from shardwise.workload import load_task

#: what the evaluator measures a device with: the median of this many interleaved rounds
COMPUTE_ROUNDS = MeasurementSettings().timing_rounds


def _shards(plans_dir: Path, methods: list[str], batch_size: int) -> tuple[list[str], list[KernelShard]]:
    """(plan label, device shard at `batch_size`) per device of every task's plans under `plans_dir`."""
    labels: list[str] = []
    shards: list[KernelShard] = []
    for task_dir in sorted(p for p in plans_dir.iterdir() if (p / "task.json").exists()):
        task = load_task(task_dir / "task.json")
        for method in methods:
            path = task_dir / f"{method}.plan.json"
            if not path.exists():
                continue
            for tables in device_specs(load_plan(path), task):
                if tables:
                    labels.append(f"{task_dir.name}/{method}")
                    shards.append(KernelShard(tables, batch_size, task.optimizer, task.weights_precision))
    if not shards:
        raise SystemExit(f"no task.json with {methods} plans under {plans_dir} (run bench_plan_quality.py first)")
    return labels, shards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plans", required=True, help="one task set's directory of a bench_plan_quality.py run")
    parser.add_argument("--models", required=True, help="comma-separated cost model dirs or MLflow URIs")
    parser.add_argument("--methods", default="neuroshard,torchrec", help="whose plans' device shards to measure")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved measurement rounds (median = reference)")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/device_accuracy.json")
    args = parser.parse_args()
    quiet_libraries(verbose=False)  # MLflow's download bars and INFO logs, as the CLI without -v
    if args.rounds < COMPUTE_ROUNDS:
        parser.error(f"--rounds must be >= {COMPUTE_ROUNDS}")
    torch.set_num_threads(1)
    started = time.perf_counter()
    mlflow = MlflowService()
    models = {path: mlflow.load_cost_model(path) for path in args.models.split(",")}
    first = next(iter(models.values()))
    if len({m.batch_size for m in models.values()}) > 1 or len({m.reference_ms for m in models.values()}) > 1:
        raise SystemExit("the models were profiled at different batch sizes or references; compare like with like")
    # timed as the models' training data was: their reference and batch
    labels, shards = _shards(Path(args.plans), args.methods.split(","), first.batch_size)
    device, protocol = resolve_timing(MeasurementSettings(device="cpu", reference_ms=first.reference_ms))
    timings = time_shards_in_rounds(shards, args.rounds, device=device, protocol=protocol)
    samples = [[t.total_ms for t in row] for row in timings]
    measured = np.array([statistics.median(row) for row in samples])
    noise = [
        abs(statistics.median(row[i] for i in subset) / ref - 1)
        for row, ref in zip(samples, measured)
        for subset in itertools.combinations(range(args.rounds), COMPUTE_ROUNDS)
    ]
    print(f"{len(shards)} device shards of {len(set(labels))} plans, median of {args.rounds} rounds each")
    print(f"measurement noise: median of {COMPUTE_ROUNDS} rounds vs of {args.rounds}: {np.mean(noise):.2%} mean abs")

    plan_index = {label: i for i, label in enumerate(dict.fromkeys(labels))}
    plan_of = np.array([plan_index[label] for label in labels])
    print(f"{'model':40s} {'bias':>6s} {'MAE':>7s} {'within-plan MAE':>16s} {'within-plan std':>16s}")
    rows = []
    for path, model in models.items():
        ratio = np.asarray(model.predict_compute([s.tables for s in shards]), dtype=np.float64).sum(axis=1) / measured
        bias = ratio.mean()
        plan_mean = (np.bincount(plan_of, weights=ratio) / np.bincount(plan_of))[plan_of]
        within = ratio / plan_mean - 1  # what balancing the predictions leaves between a plan's devices
        print(f"{path:40s} {bias:6.3f} {np.abs(ratio / bias - 1).mean():7.2%} {np.abs(within).mean():16.2%} "
              f"{within.std():16.2%}")
        rows.append({"model": path, "bias": round(float(bias), 3),
                     "mae_pct": round(100 * float(np.abs(ratio / bias - 1).mean()), 2),
                     "within_plan_mae_pct": round(100 * float(np.abs(within).mean()), 2),
                     "within_plan_std_pct": round(100 * float(within.std()), 2)})
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.record:
        what = (f"{len(shards)} device shards of {len(set(labels))} plans ({args.methods}) under "
                f"{args.plans}, each the median of {args.rounds} rounds")
        record("device_accuracy", "Cost-model error on the device shards that plans produce", rows,
               notes=f"{what}; prediction / measured: bias, MAE once the bias is removed, spread within a "
                     f"plan (what balance depends on); median of {COMPUTE_ROUNDS} rounds vs of "
                     f"{args.rounds}: {np.mean(noise):.2%} mean abs")


if __name__ == "__main__":
    main()
