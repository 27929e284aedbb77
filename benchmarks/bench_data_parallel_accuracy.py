"""How well data-parallel and row-wise tables are priced: the held-out error of the lines of each collective (the
all-reduce of data-parallel gradients; the reduce-scatter, all-gather and ids' all-to-all of row-wise tables), and
(with --model) the compute model's error on a table's kernel at the local batch and on a row block's kernel at the
whole batch.

1. All-reduces of fp32 gradients measured on this machine (gloo on CPU, NCCL on GPUs) over 2 and 4 processes at
   sizes from 4 KiB to 16 MiB (`AllToAllSession.measure_all_reduce`, the median of --iters each); the latency +
   bandwidth line (`fit_all_reduce`) fitted with each size left out in turn predicts that size: its MAPE is the
   held-out error, for one line per device count (what `pretrain` stores as a cost model's `all_reduce`) and for
   one line over every device count. The lines fitted to every size are printed. The same for reduce-scatters
   (each device's `size` in, its 1 / D of the sum out: row-wise tables' pooled outputs), all-gathers (their
   gradients) and even all-to-alls (their ids), each `pretrain`'s line of that name; and the MAPE of the
   reduce-scatter lines on all-gathers and all-to-alls, what prices them for a model profiled without them.
2. With --model DIR: --tables synthetic tables timed alone on the kernel at the local batch (batch / devices) and
   predicted as the model prices them (`local_batch_table`: pooling factor / devices at the model's batch); MAPE,
   beside the naive price (the table at the full batch, divided by the devices). And each table's first row block
   over the devices (`TableSpec.row_block`) timed at the model's batch, against the model's price of the block.

    python benchmarks/bench_data_parallel_accuracy.py [--model DIR [--row-scale 0.01] [--skip-collectives]] [--devices 2 4]
        [--iters 20]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from shardwise.costmodel.data_parallel import fit_all_reduce, heldout_all_reduce_errors, local_batch_table
from shardwise.profiling import AllToAllSession, MeasurementSettings, measure_shard, resolve_timing

SIZES_BYTES = tuple(4096 * 4**k for k in range(7))  # 4 KiB .. 16 MiB


COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def collective_points(devices: list[int], iters: int) -> dict[str, list[tuple[int, int, float]]]:
    """Per collective, (devices, bytes, median ms) of every measured one (one process group per device count)."""
    points: dict[str, list[tuple[int, int, float]]] = {op: [] for op in COLLECTIVES}
    for count in devices:
        with AllToAllSession(count) as session:
            for op in COLLECTIVES:
                timed = session.measure_collective(op, SIZES_BYTES, iters=iters)
                points[op] += [(count, size, statistics.median(ms)) for size, ms in zip(SIZES_BYTES, timed, strict=True)]
    return points


def kernel_errors(model_dir: str, num_tables: int, devices: int, seed: int,
                  row_scale: float) -> tuple[float, float, float, float]:
    """MAPE (%) of the local-batch price and of the naive full-batch / devices price, on `num_tables` tables, of the
    price of their first row blocks over `devices` at the model's batch, and of the whole tables' at it (the model's
    own error on these tables, what the other three compare with)."""
    from shardwise.costmodel import NeuralCostModel
    from shardwise.workload import synthesize_tables

    model = NeuralCostModel.load(model_dir)
    tables = synthesize_tables(num_tables, seed=seed, row_scale=row_scale, progress=False).tables
    settings = MeasurementSettings(reference_ms=model.reference_ms, batch_size=model.batch_size)
    device, protocol = resolve_timing(settings)
    local_batch = -(-model.batch_size // devices)
    measured = np.array([
        (lambda t: t.fwd_ms + t.bwd_ms)(measure_shard([t], local_batch, device=device, protocol=protocol))
        for t in tables])
    local = model.predict_compute([[local_batch_table(t, devices)] for t in tables]).sum(axis=1)
    naive = model.predict_compute([[t] for t in tables]).sum(axis=1) / devices
    blocks = [t.row_block(0, devices) for t in tables]
    block_ms = np.array([
        (lambda t: t.fwd_ms + t.bwd_ms)(measure_shard([b], model.batch_size, device=device, protocol=protocol))
        for b in blocks])
    block_price = model.predict_compute([[b] for b in blocks]).sum(axis=1)
    whole_ms = np.array([
        (lambda t: t.fwd_ms + t.bwd_ms)(measure_shard([t], model.batch_size, device=device, protocol=protocol))
        for t in tables])
    whole = model.predict_compute([[t] for t in tables]).sum(axis=1)
    return (float(np.mean(np.abs(local - measured) / measured) * 100),
            float(np.mean(np.abs(naive - measured) / measured) * 100),
            float(np.mean(np.abs(block_price - block_ms) / block_ms) * 100),
            float(np.mean(np.abs(whole - whole_ms) / whole_ms) * 100))


def mape_by_count(errors: list[tuple[int, int, float, float]], devices: list[int]) -> str:
    """'2 devices x%, 4 devices y%; all z%' of (devices, bytes, measured, predicted) rows."""
    by_count = {c: 100 * float(np.mean([abs(p - ms) / ms for d, _, ms, p in errors if d == c])) for c in devices}
    return (", ".join(f"{c} devices {v:.1f}%" for c, v in by_count.items())
            + f"; all {100 * float(np.mean([abs(p - ms) / ms for *_, ms, p in errors])):.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--model", help="a saved cost model directory: also price tables' kernels at the local batch")
    parser.add_argument("--tables", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--row-scale", type=float, default=0.01, help="scale of the synthetic tables' rows (as "
                        "bench_plan_quality's; 1.0 is far outside a CPU-profiled model's tables)")
    parser.add_argument("--skip-collectives", action="store_true", help="with --model: the kernels only")
    args = parser.parse_args()

    measured = {op: [] for op in COLLECTIVES} if args.skip_collectives else collective_points(args.devices, args.iters)
    for op in COLLECTIVES if measured["all_reduce"] else ():  # the collectives `pretrain` fits a line to
        points = measured[op]
        for count, size, ms in points:
            print(f"{op} {count} devices {size / 2**20:8.3f} MiB: {ms:8.3f} ms")
        fitted = fit_all_reduce(points, collective=op)
        volume = "2 (D-1)/D" if op == "all_reduce" else "(D-1)/D"  # RING_VOLUME
        print(f"{op} line over every device count: {fitted.latency_ms:.4f} ms + {fitted.hop_ms:.4f} ms x (D - 1) + "
              f"{fitted.ms_per_mib:.4f} ms/MiB x {volume} x MiB")
        for count, latency_ms, ms_per_mib in fitted.by_devices:
            print(f"{op} line of {count} devices: {latency_ms:.4f} ms + {ms_per_mib:.4f} ms/MiB x {volume} x MiB")
        # held out (each size left out): what the model stores (one line per device count) and one line over all
        for label, per_count in (("per device count", True), ("one line over every count", False)):
            errors = heldout_all_reduce_errors(points, per_device_count=per_count, collective=op)
            print(f"{op} held-out MAPE, {label}: {mape_by_count(errors, args.devices)}")
    for op in ("all_gather", "all_to_all") if measured["all_reduce"] else ():  # how a model without them prices them
        scatter = fit_all_reduce(measured["reduce_scatter"], collective="reduce_scatter")
        errors = [(d, b, ms, float(scatter.predict_ms(b, d))) for d, b, ms in measured[op]]
        print(f"{op} priced by the reduce-scatter lines, MAPE: {mape_by_count(errors, args.devices)}")
    if args.model:
        for count in args.devices:
            local, naive, block, whole = kernel_errors(args.model, args.tables, count, args.seed, args.row_scale)
            print(f"kernel at the local batch, {count} devices, {args.tables} tables (row scale {args.row_scale}): MAPE "
                  f"{local:.1f}% (full batch / devices: {naive:.1f}%); a row block of 1/{count} at the batch: MAPE "
                  f"{block:.1f}%; the whole tables at the batch: MAPE {whole:.1f}%")


if __name__ == "__main__":
    main()
