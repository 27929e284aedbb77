"""Where one timing of a device shard goes: building fbgemm's kernel, the cache flush, the paired reference kernel.

Refinement and the evaluator time every device shard `timing_rounds` times (9 by default), and each timing is
`measure_shard`: build the kernel, then `time_kernel` under the profiler's protocol (warm-up and timed iterations,
a cache flush before each, each iteration paired with one of the reference kernel). This prints, per shard timing,
the seconds of the build and of the protocol's timing, and how much of the timing the flush and the reference
pairing take (the same built kernel timed with either turned off, in turn within each round). Shards: an 8-device
paper task's tables dealt round-robin over its devices (about 12 a device, as the plans there hold).

    .venv/bin/python benchmarks/bench_shard_timing.py [--rounds 3] [--record]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_plan_quality import paper_tasks
from record import record

from shardwise.profiling import MeasurementSettings
from shardwise.profiling.kernel import build_shard_kernel, resolve_timing, time_kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the task's device shards")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/shard_timing.json")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    torch.set_num_threads(1)
    measurement = MeasurementSettings()
    task = next(task for name, task in paper_tasks(1, seed=0, batch_size=2048) if name.startswith("8dev"))
    devices = task.num_devices
    shards = [list(task.tables[d::devices]) for d in range(devices)]
    device, protocol = resolve_timing(measurement)
    variants = {"protocol": protocol, "no flush": protocol.model_copy(update={"flush_cache": False}),
                "no reference": protocol.model_copy(update={"reference_normalised": False})}
    seconds: dict[str, list[float]] = {"build": [], **{name: [] for name in variants}}
    print(f"{len(task.tables)} tables over {devices} devices, batch {task.batch_size}, {args.rounds} rounds; "
          f"protocol: {protocol.warmup_iters} warm-up + {protocol.iters} timed iterations")
    for r in range(args.rounds):
        for tables in shards:
            started = time.perf_counter()
            kernel = build_shard_kernel(tables, task.batch_size, device=device, optimizer=task.optimizer,
                                        weights_precision=task.weights_precision)
            seconds["build"].append(time.perf_counter() - started)
            names = list(variants)
            for name in names[r % len(names):] + names[:r % len(names)]:  # each variant first in turn
                started = time.perf_counter()
                time_kernel(kernel, device, variants[name])
                seconds[name].append(time.perf_counter() - started)
        print(f"  round {r + 1} done", flush=True)
    build, timing = statistics.median(seconds["build"]), statistics.median(seconds["protocol"])
    total = build + timing
    parts = {"build the kernel": build,
             "cache flush": timing - statistics.median(seconds["no flush"]),
             "reference kernel, paired": timing - statistics.median(seconds["no reference"])}
    parts["the shard's own iterations"] = total - sum(parts.values())
    rows = [{"part": name, "seconds_per_timing": round(s, 4), "share": round(s / total, 3)}
            for name, s in parts.items()]
    rows.append({"part": "one timing (measure_shard)", "seconds_per_timing": round(total, 4), "share": 1.0})
    print(f"{'part':<28} {'s per timing':>12} {'share':>6}")
    for row in rows:
        print(f"{row['part']:<28} {row['seconds_per_timing']:>12.4f} {row['share']:>6.1%}")
    timings = devices * measurement.timing_rounds
    once = f"{devices} device shards x {measurement.timing_rounds} timings = {total * timings:.1f} s"
    print(f"a plan measured once: {once}")
    if args.record:
        record("shard_timing", "Where one timing of a device shard goes", rows,
               notes=f"the first task of the 8-device paper set, its {len(task.tables)} tables dealt round-robin "
                     f"over {devices} devices, batch {task.batch_size}; median over {args.rounds} rounds of each "
                     "part; flush and reference: the protocol's timing less the same kernel's timing with either "
                     f"turned off; a plan measured once: {once}")


if __name__ == "__main__":
    main()
