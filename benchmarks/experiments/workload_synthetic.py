"""Synthetic DLRM tables: how close the population comes to the DLRM 2021 dataset statistics, and how fast.

For each (row_scale, batch_size): pooling/rows moments, the mean reuse shares over non-empty tables (measured on the
sampled batches) next to the targets, the largest per-bin gap, and the same gap when every table gets one shared alpha
(the best single alpha for the population) as the comparison.

    python -m benchmarks workload_synthetic [--full] [--record]     # --full adds row_scale 1.0, batch 65536: ~3 min
"""

from __future__ import annotations

import time

import numpy as np
from pydantic import Field

from benchmarks.harness import Context, Experiment, ExperimentSettings, Outcome, SuiteRun, register


class WorkloadSyntheticSettings(ExperimentSettings):
    """Which sizes are synthesized."""

    full: bool = Field(default=False, description="add row_scale 1.0, batch 65536 (~3 min)")


def run(settings: WorkloadSyntheticSettings, context: Context) -> Outcome:
    """856 tables per (row scale, batch): their moments and reuse shares against the targets."""
    from shardwise.workload import index_seed, reuse_histogram, sample_batch
    from shardwise.workload.synthetic import (
        ALPHA_GRID,
        collapse_reuse_bins,
        expected_reuse_shares,
        synthesize_tables,
        target_reuse_shares,
    )

    configs = [(0.001, 512), (0.01, 2048)] + ([(1.0, 65536)] if settings.full else [])
    target = target_reuse_shares()
    rows = []
    for row_scale, batch in configs:
        start = time.perf_counter()
        ts = synthesize_tables(856, seed=0, row_scale=row_scale, batch_size=batch, progress=False)
        seconds = time.perf_counter() - start
        nonempty = [t for t in ts.tables if t.pooling_factor > 0]
        pooling = np.array([t.pooling_factor for t in ts.tables])
        table_rows = np.array([t.rows for t in ts.tables]) / row_scale
        shares = collapse_reuse_bins(np.array([t.reuse_bins for t in nonempty])).mean(axis=0)
        # comparison: the one alpha that fits the population best (expected shares, then measured)
        expected = np.stack(
            [expected_reuse_shares(t.rows, round(t.pooling_factor * batch), ALPHA_GRID) for t in nonempty]
        ).mean(axis=0)
        best = float(ALPHA_GRID[np.abs(expected - target).max(axis=1).argmin()])
        single = [reuse_histogram(sample_batch(t.model_copy(update={"zipf_alpha": best}), batch, index_seed(t))[1])
                  for t in nonempty]
        single_shares = collapse_reuse_bins(np.array(single)).mean(axis=0)
        gap, single_gap = np.abs(shares - target).max(), np.abs(single_shares - target).max()
        rows.append({
            "row_scale": row_scale, "batch": batch, "seconds": round(seconds, 1),
            "pooling_mean": round(float(pooling.mean()), 1), "pooling_sd": round(float(pooling.std()), 1),
            "empty_pct": round(100 * float((pooling == 0).mean()), 1),
            "rows_over_scale_mean_m": round(float(table_rows.mean()) / 1e6, 2),
            "rows_over_scale_sd_m": round(float(table_rows.std()) / 1e6, 2),
            "reuse_max_gap": round(float(gap), 3), "one_alpha": round(best, 1),
            "one_alpha_max_gap": round(float(single_gap), 3), "gap_ratio": round(float(single_gap / gap), 2),
        })
    targets = [round(float(x), 3) for x in target]
    return Outcome(rows, notes=[
        "856 tables, seed 0; reuse_max_gap: largest per-bin gap between the mean reuse shares (non-empty tables, "
        f"measured on sampled batches) and the targets {targets} (bins (0,1] (1,2] (2,4] (4,8] (8,16] (16,32] >32); "
        "one_alpha_max_gap: the same with the one alpha that fits the population best; gap_ratio = "
        "one_alpha_max_gap / reuse_max_gap"])


register(Experiment(
    name="workload_synthetic",
    title="Synthetic DLRM tables against the DLRM 2021 dataset statistics",
    settings=WorkloadSyntheticSettings,
    run=run,
    suites={"quick": (SuiteRun(),)},
))
