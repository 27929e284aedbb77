"""Building a shard's batch: the host path (numpy per table, concatenated, copied to the device) against the tensor
path the profiler uses (`profiling.batches.shard_batch`: tensor ops on the device), side by side in one run.

Shards of 1..`--max-tables` synthetic DLRM tables at `--batch-size` (65536, the papers' batch) and `--row-scale`;
each shard's batch built both ways in turns, `--rounds` times, medians per shard; both sampled batches and batches
from DLRM index data (one batch per source table held in memory, as `read_index_data` gives it). On CUDA the time
runs until the batch is on the device (synchronised).

    python benchmarks/bench_batch_build.py [--device cpu|cuda] [--shards 6 --rounds 3] [--record]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
from record import record

from shardwise.profiling.batches import IndexData, host_shard_batch, shard_batch
from shardwise.profiling.hardware import device_name, resolve_device
from shardwise.profiling.sampling import sample_shard_configs
from shardwise.workload import TableSpec, index_seed, sample_batch
from shardwise.workload.synthetic import synthesize_tables

Build = Callable[[list[TableSpec], IndexData | None], object]


def _timed(build: Build, tables: list[TableSpec], index_data: IndexData | None, device: torch.device) -> float:
    start = time.perf_counter()
    build(tables, index_data)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (where the batch is built and timed)")
    parser.add_argument("--batch-size", type=int, default=65536)
    parser.add_argument("--row-scale", type=float, default=0.1)
    parser.add_argument("--num-tables", type=int, default=60, help="synthetic tables the shards are drawn from")
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument("--max-tables", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3, help="builds of each shard each way (their median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/batch_build[_cuda].json")
    args = parser.parse_args()
    device = resolve_device(args.device)
    torch.set_num_threads(1)  # as the profiler builds them (one core per timed device)

    tables = synthesize_tables(args.num_tables, seed=args.seed, row_scale=args.row_scale,
                               batch_size=args.batch_size, progress=False).tables
    shards = sample_shard_configs(tables, args.shards, batch_size=args.batch_size, seed=args.seed,
                                  max_tables=args.max_tables)
    sources = {t.name: sample_batch(t, args.batch_size, index_seed(t)) for shard in shards for t in shard}

    def host(shard: list[TableSpec], data: IndexData | None) -> object:
        return host_shard_batch(shard, args.batch_size, device, data)

    def tensor(shard: list[TableSpec], data: IndexData | None) -> object:
        return shard_batch(shard, args.batch_size, device, data)

    tensor(shards[0], None)  # first use: the device's context and allocator, not the build
    rows = []
    for source, data in (("sampled", None), ("index data", sources)):
        seconds: dict[str, list[float]] = {"host": [], "tensor": []}
        for shard in shards:
            per_way: dict[str, list[float]] = {"host": [], "tensor": []}
            for _ in range(args.rounds):  # in turns: machine drift hits both ways alike
                per_way["host"].append(_timed(host, shard, data, device))
                per_way["tensor"].append(_timed(tensor, shard, data, device))
            for way, times in per_way.items():
                seconds[way].append(statistics.median(times))
        host_s, tensor_s = statistics.median(seconds["host"]), statistics.median(seconds["tensor"])
        lookups = statistics.median(sum(t.pooling_factor for t in shard) * args.batch_size for shard in shards)
        rows.append({"batch": source, "host_s": round(host_s, 4), "tensor_s": round(tensor_s, 4),
                     "speedup": round(host_s / tensor_s, 2), "median_lookups": int(lookups)})
        print(f"{source:>10}: host path {host_s * 1e3:8.1f} ms a shard, tensor path {tensor_s * 1e3:8.1f} ms "
              f"(speedup {host_s / tensor_s:.2f}x; median over {len(shards)} shards of {args.rounds} builds each, "
              f"median {int(lookups):,} lookups a shard)")
    if args.record:
        record("batch_build" + ("_cuda" if device.type == "cuda" else ""),
               f"Building a shard's batch at batch {args.batch_size}: host numpy path vs tensor ops on the "
               f"{device.type.upper()}", rows,
               notes=f"{device_name(device)}; {len(shards)} shards of 1-{args.max_tables} of {args.num_tables} "
                     f"synthetic tables (row scale {args.row_scale}), {args.rounds} builds each way in turns, median "
                     f"seconds a shard; one torch thread; load average {os.getloadavg()[0]:.1f} on "
                     f"{os.cpu_count()} cores at the end (other processes time against it)")


if __name__ == "__main__":
    main()
