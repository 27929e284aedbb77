"""Synthetic DLRM tables: how close the population comes to the DLRM 2021 dataset statistics, and how fast.

For each (row_scale, batch_size) it prints pooling/rows moments, the mean reuse shares over non-empty tables
(measured on the sampled batches) next to the targets, the largest per-bin gap, and the same gap when every
table gets one shared alpha (the best single alpha for the population) as the comparison.
Usage: python benchmarks/bench_workload_synthetic.py [--full] [--record]
(--full adds row_scale 1.0, batch 65536: ~3 min; --record writes benchmarks/results/workload_synthetic.json)
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from record import record

from shardwise.workload import index_seed, reuse_histogram, sample_batch
from shardwise.workload.synthetic import (
    ALPHA_GRID,
    collapse_reuse_bins,
    expected_reuse_shares,
    synthesize_tables,
    target_reuse_shares,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="add row_scale 1.0, batch 65536 (~3 min)")
    parser.add_argument("--record", action="store_true",
                        help="write benchmarks/results/workload_synthetic.json")
    args = parser.parse_args()
    configs = [(0.001, 512), (0.01, 2048)] + ([(1.0, 65536)] if args.full else [])
    target = target_reuse_shares()
    print("targets (0,1] (1,2] (2,4] (4,8] (8,16] (16,32] >32:", np.round(target, 3))
    records = []
    for row_scale, batch in configs:
        start = time.perf_counter()
        ts = synthesize_tables(856, seed=0, row_scale=row_scale, batch_size=batch, progress=False)
        seconds = time.perf_counter() - start
        nonempty = [t for t in ts.tables if t.pooling_factor > 0]
        pooling = np.array([t.pooling_factor for t in ts.tables])
        rows = np.array([t.rows for t in ts.tables]) / row_scale
        shares = collapse_reuse_bins(np.array([t.reuse_bins for t in nonempty])).mean(axis=0)
        # comparison: the one alpha that fits the population best (expected shares, then measured)
        expected = np.stack(
            [expected_reuse_shares(t.rows, round(t.pooling_factor * batch), ALPHA_GRID) for t in nonempty]
        ).mean(axis=0)
        best = float(ALPHA_GRID[np.abs(expected - target).max(axis=1).argmin()])
        single = [
            reuse_histogram(sample_batch(t.model_copy(update={"zipf_alpha": best}), batch, index_seed(t))[1])
            for t in nonempty
        ]
        single_shares = collapse_reuse_bins(np.array(single)).mean(axis=0)
        gap, single_gap = np.abs(shares - target).max(), np.abs(single_shares - target).max()
        print(
            f"row_scale {row_scale} batch {batch}: {seconds:.1f} s; pooling mean {pooling.mean():.1f} "
            f"sd {pooling.std():.1f} empty {(pooling == 0).mean():.1%}; rows/scale mean {rows.mean() / 1e6:.2f}M "
            f"sd {rows.std() / 1e6:.2f}M"
        )
        print(f"  per-table alphas: shares {np.round(shares, 3)} max gap {gap:.3f}")
        print(f"  one alpha {best:.1f}:    shares {np.round(single_shares, 3)} max gap {single_gap:.3f}")
        print(f"  gap ratio (one alpha / per-table alphas): {single_gap / gap:.2f}x")
        records.append({
            "row_scale": row_scale, "batch": batch, "seconds": round(seconds, 1),
            "pooling_mean": round(float(pooling.mean()), 1), "pooling_sd": round(float(pooling.std()), 1),
            "empty_pct": round(100 * float((pooling == 0).mean()), 1),
            "rows_over_scale_mean_m": round(float(rows.mean()) / 1e6, 2),
            "rows_over_scale_sd_m": round(float(rows.std()) / 1e6, 2),
            "reuse_max_gap": round(float(gap), 3), "one_alpha": round(best, 1),
            "one_alpha_max_gap": round(float(single_gap), 3), "gap_ratio": round(float(single_gap / gap), 2),
        })
    if args.record:
        targets = [round(float(x), 3) for x in target]
        record("workload_synthetic", "Synthetic DLRM tables against the DLRM 2021 dataset statistics",
               records, notes="856 tables, seed 0; reuse_max_gap: largest per-bin gap between the mean reuse "
                              "shares (non-empty tables, measured on sampled batches) and the targets "
                              f"{targets} (bins (0,1] (1,2] (2,4] (4,8] (8,16] (16,32] >32); "
                              "one_alpha_max_gap: the same with the one alpha that fits the population best; "
                              "gap_ratio = one_alpha_max_gap / reuse_max_gap")


if __name__ == "__main__":
    main()
