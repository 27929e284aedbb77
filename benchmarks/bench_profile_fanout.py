"""Profiling fan-out: the same shards through 1 and through K parallel workers (processes standing in for the
pipeline's profiling pods), each `shardwise profile --worker k --workers K` into one dataset. Prints, per K, the
wall time, the speedup over one worker, and whether the merged dataset holds every shard exactly once (rows
missing or measured twice against the one-worker run's).

    python benchmarks/bench_profile_fanout.py [--shards 60] [--workers 1,2] [--record]
    python benchmarks/bench_profile_fanout.py --out s3://bucket/prefix   # into an object store (AWS_* variables)

On this 2-core machine K = 2 is the most that can run in parallel (each worker times kernels on one thread), and
only on an otherwise idle machine: a busy process beside it leaves no core for the second worker.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from record import record

from shardwise.profiling.dataset import load_costs
from shardwise.workload.synthetic import synthesize_tables
from shardwise.workload.tableset import save_tables

CLI = [sys.executable, "-c", "import sys; from shardwise.cli import main; sys.exit(main(sys.argv[1:]))"]


def profile_with(workers: int, tables: Path, out: str, shards: int, seed: int) -> float:
    """Wall seconds for `workers` processes to profile `shards` shards between them into `out`."""
    argv = ["profile", "--tables", str(tables), "--out", out, "--num-shards", str(shards), "--comm-layouts", "0",
            "--device", "cpu", "--threads", "1", "--seed", str(seed), "--workers", str(workers)]
    started = time.perf_counter()
    procs = [subprocess.Popen([*CLI, *argv, "--worker", str(k)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for k in range(workers)]
    errors = [p.communicate()[1] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a worker failed: {[e.strip().splitlines()[-1:] for e in errors]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=60, help="shard configurations in the run")
    parser.add_argument("--workers", default="1,2", help="worker counts to compare (the first is the reference)")
    parser.add_argument("--out", default=None, help="dataset location prefix (default: a temporary directory); "
                        "s3://bucket/prefix writes to an object store")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/profile_fanout.json")
    args = parser.parse_args()
    counts = [int(k) for k in args.workers.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        tables = Path(tmp) / "tables.json"
        save_tables(synthesize_tables(40, seed=args.seed, row_scale=0.001, batch_size=2048, progress=False), tables)
        base = args.out.rstrip("/") if args.out else tmp
        rows, reference = [], None
        print(f"{'workers':>7}  {'wall s':>7}  {'speedup':>7}  {'rows':>5}  {'missing':>7}  {'twice':>5}")
        for k in counts:
            out = f"{base}/fanout-{k}-{os.getpid()}"
            wall = profile_with(k, tables, out, args.shards, args.seed)
            found = Counter(load_costs(out)["config_id"])
            reference = reference or (found, wall)
            missing = sum((reference[0] - found).values())
            twice = sum((found - reference[0]).values())
            speedup = reference[1] / wall
            print(f"{k:>7}  {wall:>7.1f}  {speedup:>6.2f}x  {sum(found.values()):>5}  {missing:>7}  {twice:>5}")
            rows.append({"workers": k, "wall_s": round(wall, 1), "speedup": round(speedup, 2),
                         "rows": sum(found.values()), "missing": missing, "measured_twice": twice})
    print(f"missing / twice: against the {counts[0]}-worker run's shards (same settings, same sampled shards)")
    if args.record:
        record("profile_fanout", "Profiling fan-out: one run split over K workers into one dataset", rows,
               notes=f"{args.shards} shards of 40 synthetic tables, CPU, one thread per worker, machine otherwise idle; "
                     f"dataset {'object store' if args.out and args.out.startswith('s3://') else 'local directory'}")


if __name__ == "__main__":
    main()
