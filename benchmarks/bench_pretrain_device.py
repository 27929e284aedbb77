"""Pre-training on a GPU next to the CPU: the same cost dataset, seed and schedule on each device, in one run.

What a platform team retraining from CI on a GPU node gets (`shardwise pretrain --device cuda`): seconds per epoch
and in all, and the held-out error of the model each device trains (float32 sums differ in the last bits between
devices, so the two models differ a little; their errors should not).

    python benchmarks/bench_pretrain_device.py --data runs/local/costs --devices cpu,cuda
    python benchmarks/bench_pretrain_device.py --data DATASET --devices cpu,cuda --record
"""

from __future__ import annotations

import argparse
import time

from record import record

from shardwise.cli import quiet_libraries
from shardwise.costmodel import TrainConfig, train_cost_model
from shardwise.profiling import load_costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", action="append", required=True, help="cost dataset: parquet file or folder "
                        "(repeat for several, e.g. the kernel and the all-to-all datasets of a pipeline run)")
    parser.add_argument("--devices", default="cpu,cuda", help="torch devices to train on, comma separated; "
                        "ratios are over the first")
    parser.add_argument("--epochs", type=int, default=100, help="epochs per network (fixed: patience is set to "
                        "the epochs, so every device does the same work)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/pretrain_device.json")
    args = parser.parse_args()
    quiet_libraries(verbose=False)
    df = load_costs(args.data)
    print(f"dataset: {len(df)} rows ({(df['kind'] == 'compute').sum()} compute, {(df['kind'] == 'comm').sum()} "
          f"all-to-all) from {', '.join(args.data)}; {args.epochs} epochs per network")
    devices = args.devices.split(",")
    print(f"{'device':>8}  {'seconds':>8}  {'s/epoch':>8}  {'held-out MAPE %':>15}  {'time/' + devices[0]:>10}")
    rows = []
    for device in devices:
        config = TrainConfig(epochs=args.epochs, patience=args.epochs, comm_epochs=args.epochs, device=device,
                             progress=False)
        started = time.perf_counter()
        _, report = train_cost_model(df, args.seed, config)
        seconds = time.perf_counter() - started
        mape = report.metrics["neural_heldout_tables_total_mape_pct"]
        first_s = rows[0]["seconds"] if rows else seconds
        per_epoch = seconds / max(report.epochs_run, 1)
        rows.append({"device": device, "seconds": round(seconds, 1), "epochs": report.epochs_run,
                     "s_per_epoch": round(per_epoch, 3), "heldout_total_mape_pct": round(mape, 2),
                     "time_over_first": round(seconds / first_s, 2)})
        print(f"{device:>8}  {seconds:>8.1f}  {per_epoch:>8.3f}  {mape:>15.2f}  {seconds / first_s:>9.2f}x")
    print(f"seconds = the whole training call (features, both networks, the evaluation); s/epoch = seconds over the "
          f"compute network's epochs; time/{devices[0]} = this device's seconds over the first one's")
    if args.record:
        record("pretrain_device", "Pre-training on each device: time and held-out error", rows,
               notes=f"dataset: {', '.join(args.data)} ({len(df)} rows); {args.epochs} epochs per network, seed "
                     f"{args.seed}; the evaluation's TorchRec baseline is skipped where TorchRec is not installed")


if __name__ == "__main__":
    main()
