"""How well data-parallel tables are priced: the all-reduce line's held-out error, and (with --model) the compute
model's error on a table's kernel at the local batch.

1. All-reduces of fp32 gradients measured on this machine (gloo on CPU, NCCL on GPUs) over 2 and 4 processes at
   sizes from 4 KiB to 16 MiB (`AllToAllSession.measure_all_reduce`, the median of --iters each); the latency +
   bandwidth line (`fit_all_reduce`) fitted with each size left out in turn predicts that size: its MAPE is the
   held-out error, for one line per device count (what `pretrain` stores as a cost model's `all_reduce`) and for
   one line over every device count. The lines fitted to every size are printed.
2. With --model DIR: --tables synthetic tables timed alone on the kernel at the local batch (batch / devices) and
   predicted as the model prices them (`local_batch_table`: pooling factor / devices at the model's batch); MAPE,
   beside the naive price (the table at the full batch, divided by the devices).

    python benchmarks/bench_data_parallel_accuracy.py [--model DIR] [--devices 2 4] [--iters 20]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from shardwise.costmodel.data_parallel import fit_all_reduce, heldout_all_reduce_errors, local_batch_table
from shardwise.profiling import AllToAllSession, MeasurementSettings, measure_shard, resolve_timing

SIZES_BYTES = tuple(4096 * 4**k for k in range(7))  # 4 KiB .. 16 MiB


def all_reduce_points(devices: list[int], iters: int) -> list[tuple[int, int, float]]:
    """(devices, bytes, median ms) of every measured all-reduce."""
    points = []
    for count in devices:
        with AllToAllSession(count) as session:
            timed = session.measure_all_reduce(SIZES_BYTES, iters=iters)
        points += [(count, size, statistics.median(ms)) for size, ms in zip(SIZES_BYTES, timed, strict=True)]
    return points


def kernel_errors(model_dir: str, num_tables: int, devices: int, seed: int) -> tuple[float, float]:
    """MAPE (%) of the local-batch price and of the naive full-batch / devices price, on `num_tables` tables."""
    from shardwise.costmodel import NeuralCostModel
    from shardwise.workload import synthesize_tables

    model = NeuralCostModel.load(model_dir)
    tables = synthesize_tables(num_tables, seed=seed)
    settings = MeasurementSettings(reference_ms=model.reference_ms, batch_size=model.batch_size)
    device, protocol = resolve_timing(settings)
    local_batch = -(-model.batch_size // devices)
    measured = np.array([
        (lambda t: t.fwd_ms + t.bwd_ms)(measure_shard([t], local_batch, device=device, protocol=protocol))
        for t in tables])
    local = model.predict_compute([[local_batch_table(t, devices)] for t in tables]).sum(axis=1)
    naive = model.predict_compute([[t] for t in tables]).sum(axis=1) / devices
    return (float(np.mean(np.abs(local - measured) / measured) * 100),
            float(np.mean(np.abs(naive - measured) / measured) * 100))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--model", help="a saved cost model directory: also price tables' kernels at the local batch")
    parser.add_argument("--tables", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    points = all_reduce_points(args.devices, args.iters)
    for count, size, ms in points:
        print(f"all-reduce {count} devices {size / 2**20:8.3f} MiB: {ms:8.3f} ms")
    fitted = fit_all_reduce(points)
    print(f"line over every device count: {fitted.latency_ms:.4f} ms + {fitted.hop_ms:.4f} ms x (D - 1) + "
          f"{fitted.ms_per_mib:.4f} ms/MiB x 2 (D-1)/D x MiB")
    for count, latency_ms, ms_per_mib in fitted.by_devices:
        print(f"line of {count} devices: {latency_ms:.4f} ms + {ms_per_mib:.4f} ms/MiB x 2 (D-1)/D x MiB")
    # held out (each size left out): what the model stores (one line per device count) and one line over all
    for label, per_count in (("per device count", True), ("one line over every count", False)):
        errors = heldout_all_reduce_errors(points, per_device_count=per_count)
        by_count = {c: 100 * float(np.mean([abs(p - ms) / ms for d, _, ms, p in errors if d == c]))
                    for c in args.devices}
        print(f"held-out MAPE, {label}: " + ", ".join(f"{c} devices {v:.1f}%" for c, v in by_count.items())
              + f"; all {100 * float(np.mean([abs(p - ms) / ms for *_, ms, p in errors])):.1f}%")
    if args.model:
        for count in args.devices:
            local, naive = kernel_errors(args.model, args.tables, count, args.seed)
            print(f"kernel at the local batch, {count} devices, {args.tables} tables: MAPE {local:.1f}% "
                  f"(full batch / devices: {naive:.1f}%)")


if __name__ == "__main__":
    main()
