"""Profiling fan-out: the same shards through 1 and through K parallel workers (processes standing in for the
pipeline's profiling pods), each `shardwise profile --worker k --workers K` into one dataset. Per K: the wall time,
the speedup over one worker, and whether the merged dataset holds every shard exactly once (rows missing or measured
twice against the one-worker run's: either fails the run).

    python -m benchmarks profile_fanout [--shards 60] [--workers 1,2] [--record]
    python -m benchmarks profile_fanout --out s3://bucket/prefix   # into an object store (AWS_* variables)

On a 2-core machine K = 2 is the most that can run in parallel (each worker times kernels on one thread), and only on
an otherwise idle machine: a busy process beside it leaves no core for the second worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from pydantic import Field

from benchmarks.harness import Context, Experiment, ExperimentSettings, Outcome, SuiteRun, register

CLI = [sys.executable, "-c", "import sys; from shardwise.cli import main; sys.exit(main(sys.argv[1:]))"]


class ProfileFanoutSettings(ExperimentSettings):
    """How many shards, over how many workers, into which store."""

    shards: int = Field(default=60, ge=1, description="shard configurations in the run")
    workers: tuple[int, ...] = Field(default=(1, 2), description="worker counts to compare (the first is the "
                                     "reference)", json_schema_extra={"sep": ","})
    out: str | None = Field(default=None, description="dataset location prefix (default: a temporary directory); "
                            "s3://bucket/prefix writes to an object store")
    seed: int = 0


def profile_with(workers: int, tables: Path, out: str, shards: int, seed: int) -> float:
    """Wall seconds for `workers` processes to profile `shards` shards between them into `out`."""
    argv = ["profile", "--tables", str(tables), "--out", out, "--num-shards", str(shards), "--comm-layouts", "0",
            "--device", "cpu", "--threads", "1", "--seed", str(seed), "--workers", str(workers)]
    started = time.perf_counter()
    procs = [subprocess.Popen([*CLI, *argv, "--worker", str(k)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for k in range(workers)]
    errors = [p.communicate()[1] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a profiling worker failed: {[e.strip().splitlines()[-1:] for e in errors]}")
    return time.perf_counter() - started


def run(settings: ProfileFanoutSettings, context: Context) -> Outcome:
    """One run of the same shards per worker count; one row per count."""
    from shardwise.profiling.dataset import load_costs
    from shardwise.workload.synthetic import synthesize_tables
    from shardwise.workload.tableset import save_tables

    with tempfile.TemporaryDirectory() as tmp:
        tables = Path(tmp) / "tables.json"
        save_tables(synthesize_tables(40, seed=settings.seed, row_scale=0.001, batch_size=2048, progress=False),
                    tables)
        base = settings.out.rstrip("/") if settings.out else tmp
        rows, reference = [], None
        for k in settings.workers:
            out = f"{base}/fanout-{k}-{os.getpid()}"
            wall = profile_with(k, tables, out, settings.shards, settings.seed)
            found = Counter(load_costs(out)["config_id"])
            reference = reference or (found, wall)
            missing = sum((reference[0] - found).values())
            twice = sum((found - reference[0]).values())
            rows.append({"workers": k, "wall_s": round(wall, 1), "speedup": round(reference[1] / wall, 2),
                         "rows": sum(found.values()), "missing": missing, "measured_twice": twice})
    store = "object store" if settings.out and settings.out.startswith("s3://") else "local directory"
    broken = [str(r["workers"]) for r in rows if r["missing"] or r["measured_twice"]]
    return Outcome(rows, notes=[
        f"{settings.shards} shards of 40 synthetic tables, CPU, one thread per worker; dataset {store}; missing / "
        f"measured_twice: against the {settings.workers[0]}-worker run's shards (same settings, same sampled shards)"],
        failed=f"rows missing or measured twice with {', '.join(broken)} workers" if broken else None)


register(Experiment(
    name="profile_fanout",
    title="Profiling fan-out: one run split over K workers into one dataset",
    settings=ProfileFanoutSettings,
    run=run,
    suites={"quick": (SuiteRun({"shards": 12}),)},
))
