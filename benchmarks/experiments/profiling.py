"""Profiling throughput and noise floor: shards measured per minute, and the run-to-run spread of repeated
measurements of the same shards, with and without reference normalisation, for the CPU clocks.

Each of `--shards` sampled shards is measured `--repeats` times, round-robin (so repeats of one shard are spread over
the whole run, as drift happens over seconds to minutes). One measurement yields both the normalised (fwd_ms, bwd_ms)
and the raw medians (raw_fwd_ms, raw_bwd_ms), so the two are compared on the very same kernel runs. The spread of a
shard is max/min - 1 of its total (fwd + bwd) ms over the repeats.

    python -m benchmarks profiling --shards 10 --repeats 5 --batch-size 2048 --record
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np
from pydantic import Field

from benchmarks.harness import Context, Experiment, ExperimentSettings, Outcome, SuiteRun, register


class ProfilingSettings(ExperimentSettings):
    """Which shards, how many repeats, on which device."""

    shards: int = Field(default=10, ge=1)
    repeats: int = Field(default=5, ge=2)
    batch_size: int = Field(default=2048, ge=1)
    row_scale: float = Field(default=0.01, gt=0, description="rows x this (CPU memory)")
    max_tables: int = Field(default=15, ge=1)
    seed: int = 0
    device: str | None = Field(default=None, description="cpu or cuda (default: cuda when present)")


def spreads(totals: np.ndarray) -> tuple[float, float]:
    """(median, max) over shards of max/min - 1 across repeats; `totals` is [shards, repeats]."""
    per_shard = totals.max(axis=1) / totals.min(axis=1) - 1.0
    return float(np.median(per_shard)), float(np.max(per_shard))


def run_variant(shards: list[Any], batch_size: int, repeats: int, protocol: Any, device: Any) -> dict[str, Any]:
    """Measure every shard `repeats` times round-robin under `protocol`; spreads and throughput."""
    from shardwise.profiling.kernel import calibrate_reference, measure_shard

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
    return {"shards_per_min": len(shards) * repeats / minutes, "norm": spreads(normalised), "raw": spreads(raw)}


def run(settings: ProfilingSettings, context: Context) -> Outcome:
    """Each clock's throughput and spread on the same sampled shards."""
    from shardwise.profiling.hardware import hardware_kind, resolve_device
    from shardwise.profiling.kernel import TimingProtocol
    from shardwise.profiling.sampling import sample_shard_configs
    from shardwise.workload.synthetic import synthesize_tables

    device = resolve_device(settings.device)
    tables = synthesize_tables(num_tables=100, seed=settings.seed, row_scale=settings.row_scale,
                               batch_size=settings.batch_size, progress=False).tables
    shards = sample_shard_configs(tables, settings.shards, batch_size=settings.batch_size, seed=settings.seed,
                                  max_tables=settings.max_tables, memory_cap_bytes=1 << 30)
    load_before = os.getloadavg()[0]
    variants = {"default (see TimingProtocol)": TimingProtocol()}
    if device.type == "cpu":
        variants = {"thread clock (default)": TimingProtocol(clock="thread"),
                    "wall clock (perf_counter)": TimingProtocol(clock="wall")}
    rows = []
    for name, protocol in variants.items():
        result = run_variant(shards, settings.batch_size, settings.repeats, protocol, device)
        (nm, nx), (rm, rx) = result["norm"], result["raw"]
        rows.append({
            "protocol": name, "shards_per_min": round(result["shards_per_min"]),
            "spread_normalised_median_pct": round(100 * nm, 1), "spread_normalised_max_pct": round(100 * nx, 1),
            "spread_raw_median_pct": round(100 * rm, 1), "spread_raw_max_pct": round(100 * rx, 1),
            "raw_over_normalised": round(rm / nm, 2) if nm > 0 else None,
        })
    median_tables = statistics.median([len(s) for s in shards])
    return Outcome(rows, notes=[
        f"{hardware_kind(device)}: {settings.shards} shards (1-{settings.max_tables} tables, median {median_tables}, "
        f"batch {settings.batch_size}) x {settings.repeats} repeats, round-robin, 1 thread per measurement; spread = "
        f"max/min - 1 of a shard's fwd+bwd ms over its repeats; load average (1 min) {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} during, on {os.cpu_count()} cores"])


register(Experiment(
    name="profiling",
    title="Profiling throughput and noise floor",
    settings=ProfilingSettings,
    run=run,
    suites={"quick": (SuiteRun({"shards": 4, "repeats": 2}),)},
))
