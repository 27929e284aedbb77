"""Profiling throughput and noise floor: shards measured per minute, and the run-to-run spread of repeated
measurements of the same shards, with and without reference normalisation, for the CPU clocks.

Each of `--shards` sampled shards is measured `--repeats` times, round-robin (so repeats of one shard are
spread over the whole run, as drift happens over seconds to minutes). One measurement yields both the
normalised (fwd_ms, bwd_ms) and the raw medians (raw_fwd_ms, raw_bwd_ms), so the two are compared on the very
same kernel runs. The spread of a shard is max/min - 1 of its total (fwd + bwd) ms over the repeats.

    .venv/bin/python benchmarks/bench_profiling.py [--shards 10 --repeats 5 --batch-size 2048] [--record]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from record import record

from shardwise.profiling.hardware import hardware_kind, resolve_device
from shardwise.profiling.kernel import TimingProtocol, calibrate_reference, measure_shard
from shardwise.profiling.sampling import sample_shard_configs
from shardwise.workload.synthetic import synthesize_tables


def spreads(totals: np.ndarray) -> tuple[float, float]:
    """(median, max) over shards of max/min - 1 across repeats; `totals` is [shards, repeats]."""
    per_shard = totals.max(axis=1) / totals.min(axis=1) - 1.0
    return float(np.median(per_shard)), float(np.max(per_shard))


def run_variant(shards, batch_size: int, repeats: int, protocol: TimingProtocol, device) -> dict[str, float]:
    """Measure every shard `repeats` times round-robin under `protocol`; spreads and throughput."""
    protocol = protocol.for_device(device)
    if protocol.reference_normalised:
        protocol = protocol.model_copy(update={"reference_ms": calibrate_reference(device, protocol)})
    normalised = np.zeros((len(shards), repeats))
    raw = np.zeros((len(shards), repeats))
    start = time.perf_counter()
    for r in range(repeats):
        for s, shard in enumerate(shards):
            timing = measure_shard(shard, batch_size, device=device, protocol=protocol)
            normalised[s, r] = timing.fwd_ms + timing.bwd_ms
            raw[s, r] = timing.raw_fwd_ms + timing.raw_bwd_ms
    minutes = (time.perf_counter() - start) / 60.0
    return {
        "shards_per_min": len(shards) * repeats / minutes,
        "norm": spreads(normalised),
        "raw": spreads(raw),
        "median_ms": float(np.median(normalised)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--row-scale", type=float, default=0.01, help="rows x this (CPU memory)")
    parser.add_argument("--max-tables", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None)
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/profiling.json")
    args = parser.parse_args()

    device = resolve_device(args.device)
    tables = synthesize_tables(num_tables=100, seed=args.seed, row_scale=args.row_scale,
                               batch_size=args.batch_size, progress=False).tables
    shards = sample_shard_configs(tables, args.shards, batch_size=args.batch_size, seed=args.seed,
                                  max_tables=args.max_tables, memory_cap_bytes=1 << 30)
    load_before = os.getloadavg()[0]
    print(f"load average before (1 min) {load_before:.1f} on {os.cpu_count()} cores")
    print(f"{hardware_kind(device)}: {args.shards} shards (1-{args.max_tables} tables, batch {args.batch_size}) "
          f"x {args.repeats} repeats, round-robin; 1 thread per measurement")
    variants = {"default (see TimingProtocol)": TimingProtocol()}
    if device.type == "cpu":
        variants = {
            "thread clock (default)": TimingProtocol(clock="thread"),
            "wall clock (perf_counter)": TimingProtocol(clock="wall"),
        }
    print(f"{'protocol':28s} {'shards/min':>10s} {'spread normalised (med / max)':>30s} "
          f"{'spread raw (med / max)':>24s} {'raw/normalised':>15s}")
    rows = []
    for name, protocol in variants.items():
        result = run_variant(shards, args.batch_size, args.repeats, protocol, device)
        (nm, nx), (rm, rx) = result["norm"], result["raw"]
        ratio = (rm / nm) if nm > 0 else float("nan")
        print(f"{name:28s} {result['shards_per_min']:10.0f} {nm:14.1%} / {nx:6.1%}      "
              f"{rm:10.1%} / {rx:6.1%}   {ratio:10.2f}x")
        rows.append({
            "protocol": name, "shards_per_min": round(result["shards_per_min"]),
            "spread_normalised_median_pct": round(100 * nm, 1),
            "spread_normalised_max_pct": round(100 * nx, 1),
            "spread_raw_median_pct": round(100 * rm, 1), "spread_raw_max_pct": round(100 * rx, 1),
            "raw_over_normalised": round(ratio, 2) if nm > 0 else None,
        })
    median_tables = statistics.median([len(s) for s in shards])
    load_during = os.getloadavg()[0]
    print(f"median shard size {median_tables} tables; "
          f"load average during the run (1 min) {load_during:.1f} on {os.cpu_count()} cores")
    if args.record:
        record("profiling", "Profiling throughput and noise floor", rows,
               notes=f"{args.shards} shards (1-{args.max_tables} tables, median {median_tables}, batch "
                     f"{args.batch_size}) x {args.repeats} repeats, round-robin; spread = max/min - 1 of a "
                     f"shard's fwd+bwd ms over its repeats; load average (1 min) {load_before:.1f} before, "
                     f"{load_during:.1f} during, on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
