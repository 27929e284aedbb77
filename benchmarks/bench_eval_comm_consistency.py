"""How reproducible is the evaluator's per-device all-to-all time within one session?

Measures, in one `measure_plans` session: a 4-device plan, the same plan again, and a symmetric plan (equal
tables on every device, so every device's exchange is the same). Prints, per all-to-all setting, the per-device
ratio between the two copies of the plan and the max/min across the symmetric plan's devices (1.00 is perfect),
for the old setting (3 rounds x 5 exchanges) against the current default (MeasurementSettings' comm_rounds x
comm_iters).

    .venv/bin/python benchmarks/bench_eval_comm_consistency.py [--devices 4] [--batch-size 2048] [--record]
"""

from __future__ import annotations

import argparse
import time

import torch
from record import record

from shardwise.evaluation import measure_plans
from shardwise.profiling import MeasurementSettings
from shardwise.search.plan import Plan, Shard
from shardwise.workload import ShardingTask, TableSpec


def _spread(values: list[float]) -> float:
    return max(values) / min(values) if min(values) > 0 else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--record", action="store_true",
                        help="write benchmarks/results/eval_comm_consistency.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    d = args.devices
    dims = [16, 32, 64, 128, 32, 64, 16, 128] * d
    tables = tuple(
        TableSpec(name=f"t{i}", rows=5000, dim=dim, pooling_factor=8.0, zipf_alpha=1.05) for i, dim in enumerate(dims)
    )
    task = ShardingTask(num_devices=d, device_memory_bytes=2**30, batch_size=args.batch_size, tables=tables)
    # uneven: device k takes tables k, k+d, ... (widths differ); symmetric: same dim multiset on every device
    uneven = Plan(num_devices=d, method="uneven", shards=tuple(
        Shard(table=t.name, col_offset=0, dim=t.dim, device=(i * 7 // 3) % d) for i, t in enumerate(tables)))
    symmetric = Plan(num_devices=d, method="symmetric", shards=tuple(
        Shard(table=t.name, col_offset=0, dim=t.dim, device=i // 8) for i, t in enumerate(tables)))
    base = MeasurementSettings(device="cpu", warmup_iters=2, timing_iters=5, reference_ms=1.0)
    default = MeasurementSettings()
    print(f"{d} devices, batch {args.batch_size}; widths uneven "
          f"{[sum(s.dim for s in uneven.shards if s.device == k) for k in range(d)]}, symmetric {sum(dims[:8])} each")
    print(f"{'setting':<22} {'copy ratio fwd (max)':>20} {'copy ratio bwd (max)':>20} "
          f"{'sym spread fwd':>14} {'sym spread bwd':>14} {'seconds':>8}")
    settings = (("old: 3 rounds x 5", 5, 3),
                (f"now: {default.comm_rounds} rounds x {default.comm_iters}", default.comm_iters, default.comm_rounds))
    rows = []
    for label, iters, rounds in settings:
        started = time.perf_counter()
        a, b, sym = measure_plans([(task, uneven), (task, uneven), (task, symmetric)],
                                  base.model_copy(update={"comm_iters": iters, "comm_rounds": rounds}), progress=False)
        elapsed = time.perf_counter() - started
        copy_fwd = max(_spread([x.comm_fwd_ms, y.comm_fwd_ms]) for x, y in zip(a.devices, b.devices))
        copy_bwd = max(_spread([x.comm_bwd_ms, y.comm_bwd_ms]) for x, y in zip(a.devices, b.devices))
        sym_fwd = _spread([x.comm_fwd_ms for x in sym.devices])
        sym_bwd = _spread([x.comm_bwd_ms for x in sym.devices])
        print(f"{label:<22} {copy_fwd:>20.3f} {copy_bwd:>20.3f} {sym_fwd:>14.3f} {sym_bwd:>14.3f} {elapsed:>8.1f}")
        rows.append({"setting": label, "copy_ratio_fwd_max": round(copy_fwd, 3),
                     "copy_ratio_bwd_max": round(copy_bwd, 3), "symmetric_spread_fwd": round(sym_fwd, 3),
                     "symmetric_spread_bwd": round(sym_bwd, 3), "seconds": round(elapsed, 1)})
        print("  per device a2a fwd/bwd ms, copy 1:", [(round(x.comm_fwd_ms, 3), round(x.comm_bwd_ms, 3)) for x in a.devices])
        print("  per device a2a fwd/bwd ms, copy 2:", [(round(x.comm_fwd_ms, 3), round(x.comm_bwd_ms, 3)) for x in b.devices])
        print("  symmetric:                        ", [(round(x.comm_fwd_ms, 3), round(x.comm_bwd_ms, 3)) for x in sym.devices])

    if args.record:
        record("eval_comm_consistency", "All-to-all timing: reproducibility within one evaluation session",
               rows, notes=f"{d} devices, batch {args.batch_size}; copy ratio: max over devices of max/min "
                           "between two copies of the same plan; symmetric spread: max/min over the devices "
                           "of a plan whose devices all exchange the same widths (1.000 is perfect)")


if __name__ == "__main__":
    main()
