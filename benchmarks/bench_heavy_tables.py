"""Cost-model error on new tables by weight: the heaviest tables of a fresh synthetic population (pooling x dim),
each alone and with three typical companions (as a balanced plan's slowest device holds one), next to typical
tables alone, measured on this machine and predicted by each model.

make run's pretrain reports its held-out MAPE on shards of held-out tables drawn from the same long-tailed
population as the training tables, so those shards seldom hold a heavy table; the slowest device of a balanced plan
usually does. This prints both kinds side by side, in one measurement session (timed as the models' training data
was: their reference and batch).

    python benchmarks/bench_heavy_tables.py --models runs/model_s28,models:/shardwise-cost-<kind>@champion
    (--record also writes benchmarks/results/heavy_tables.json)
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from record import record

from shardwise.cli import quiet_libraries
from shardwise.evaluation import KernelShard, resolve_timing, time_shards_in_rounds
from shardwise.integrations.mlflow import MlflowService
from shardwise.profiling import MeasurementSettings
from shardwise.workload import TableSpec, synthesize_tables


def _groups(tables: list[TableSpec], heavy: int, seed: int) -> dict[str, list[list[TableSpec]]]:
    """The shards measured, by kind: the `heavy` heaviest tables alone, each with three typical companions, and as
    many typical tables (drawn from the rest) alone."""
    by_work = sorted(tables, key=lambda t: t.pooling_factor * t.dim, reverse=True)
    rest = by_work[heavy:]
    rng = np.random.default_rng(seed)
    typical = [rest[i] for i in rng.choice(len(rest), size=min(4 * heavy, len(rest)), replace=False)]
    return {"heavy table alone": [[t] for t in by_work[:heavy]],
            "heavy table + 3 typical": [[t, *typical[heavy + 3 * k: heavy + 3 * k + 3]] for k, t in
                                        enumerate(by_work[:heavy])],
            "typical table alone": [[t] for t in typical[:heavy]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", required=True, help="comma-separated cost model dirs or MLflow URIs")
    parser.add_argument("--num-tables", type=int, default=200, help="tables in the fresh population")
    parser.add_argument("--heavy", type=int, default=10, help="how many of its heaviest tables (and typical ones)")
    parser.add_argument("--seed", type=int, default=7, help="the population's seed (README's example: 7)")
    parser.add_argument("--row-scale", type=float, default=0.002, help="rows scale, as make run's tables")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved measurement rounds (median)")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/heavy_tables.json")
    args = parser.parse_args()
    quiet_libraries(verbose=False)
    torch.set_num_threads(1)
    started = time.perf_counter()
    mlflow = MlflowService()
    models = {uri: mlflow.load_cost_model(uri) for uri in args.models.split(",")}
    first = next(iter(models.values()))
    if len({m.batch_size for m in models.values()}) > 1:
        raise SystemExit("the models were profiled at different batch sizes; compare like with like")
    population = synthesize_tables(args.num_tables, seed=args.seed, row_scale=args.row_scale,
                                   batch_size=first.batch_size, progress=False)
    groups = _groups(list(population.tables), args.heavy, args.seed)
    shards = [KernelShard(g, first.batch_size) for kind in groups.values() for g in kind]
    kinds = [kind for kind, gs in groups.items() for _ in gs]
    device, protocol = resolve_timing(MeasurementSettings(device="cpu", reference_ms=first.reference_ms,
                                                          batch_size=first.batch_size))
    timed = time_shards_in_rounds(shards, args.rounds, device=device, protocol=protocol)
    fwd = np.array([statistics.median(t.fwd_ms for t in row) for row in timed])
    total = np.array([statistics.median(t.total_ms for t in row) for row in timed])
    heaviest = groups["heavy table alone"]
    print(f"{args.num_tables} new tables (seed {args.seed}); the {args.heavy} heaviest have pooling x dim "
          f"{min(t[0].pooling_factor * t[0].dim for t in heaviest):,.0f}-"
          f"{max(t[0].pooling_factor * t[0].dim for t in heaviest):,.0f}; median of {args.rounds} rounds each")
    print(f"{'model':44s} {'shards':24s} {'n':>3s} {'signed':>8s} {'MAPE':>7s} {'fwd signed':>11s} "
          f"{'MAPE / typical':>15s}")
    rows, per_table = [], []
    kind_of = np.array(kinds)
    alone = np.flatnonzero(kind_of == "heavy table alone")
    for uri, model in models.items():
        # in the measured session's units: a model predicts its training data's ratios to the reference kernel
        # times its own reference_ms
        scale = first.reference_ms / model.reference_ms if first.reference_ms and model.reference_ms else 1.0
        predicted = scale * np.asarray(model.predict_compute([s.tables for s in shards]), dtype=np.float64)
        error = predicted.sum(axis=1) / total - 1
        fwd_error = predicted[:, 0] / fwd - 1
        typical = float(np.abs(error[kind_of == "typical table alone"]).mean())
        for kind in groups:
            k = kind_of == kind
            mape = float(np.abs(error[k]).mean())
            print(f"{uri:44s} {kind:24s} {k.sum():3d} {error[k].mean():8.1%} {mape:7.1%} {fwd_error[k].mean():11.1%} "
                  f"{mape / typical:15.2f}")
            rows.append({"model": uri, "shards": kind, "n": int(k.sum()),
                         "signed_error_pct": round(100 * float(error[k].mean()), 1),
                         "mape_pct": round(100 * mape, 1),
                         "fwd_signed_error_pct": round(100 * float(fwd_error[k].mean()), 1),
                         "mape_over_typical": round(mape / typical, 2)})
        # which heavy tables it misses, how they are accessed, and whether its training ranges flag them
        flagged = model.outside_training([shards[i].tables[0] for i in alone], first.batch_size) or ""
        per_table.append(f"{uri}: " + ", ".join(
            f"{t.name} (pooling x dim {t.pooling_factor * t.dim:,.0f}, zipf {t.zipf_alpha:g}"
            f"{', outside training' if t.name in flagged else ''}) {error[i]:+.0%}"
            for i in alone for t in shards[i].tables))
    print("\n".join(per_table))
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.record:
        record("heavy_tables", "Cost-model error on new heavy tables, beside typical ones", rows,
               notes=f"{args.num_tables} tables synthesized with seed {args.seed}, rows x {args.row_scale}; the "
                     f"{args.heavy} heaviest (pooling x dim) alone and each with 3 typical companions, and "
                     f"{args.heavy} typical tables alone; measured in one session, the median of {args.rounds} "
                     "interleaved rounds, at the models' reference and batch; signed error: predicted / measured - 1."
                     " Each heavy table alone, predicted / measured - 1: " + "; ".join(per_table))


if __name__ == "__main__":
    main()
