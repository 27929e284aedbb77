"""Cost-model error on new tables by weight: the heaviest tables of a fresh synthetic population (pooling x dim), each
alone and with three typical companions (as a balanced plan's slowest device holds one), next to typical tables alone,
measured on this machine and predicted by each model.

make run's pretrain reports its held-out MAPE on shards of held-out tables drawn from the same long-tailed population
as the training tables, so those shards seldom hold a heavy table; the slowest device of a balanced plan usually does.
This sets both kinds side by side, in one measurement session (timed as the models' training data was: their
reference and batch).

    python -m benchmarks heavy_tables --models runs/model_s28,models:/shardwise-cost-cpu-x86_64-2c@champion --record
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np
from pydantic import Field

from benchmarks.harness import BenchmarkError, Context, Experiment, ExperimentSettings, Outcome, register


class HeavyTablesSettings(ExperimentSettings):
    """Which models, which population, how many rounds."""

    models: tuple[str, ...] = Field(description="comma-separated cost model dirs or MLflow URIs",
                                    json_schema_extra={"sep": ","})
    num_tables: int = Field(default=200, ge=2, description="tables in the fresh population")
    heavy: int = Field(default=10, ge=1, description="how many of its heaviest tables (and typical ones)")
    seed: int = Field(default=7, description="the population's seed (README's example: 7)")
    row_scale: float = Field(default=0.002, gt=0, description="rows scale, as make run's tables")
    rounds: int = Field(default=7, ge=1, description="interleaved measurement rounds (median)")


def _groups(tables: list[Any], heavy: int, seed: int) -> dict[str, list[list[Any]]]:
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


def run(settings: HeavyTablesSettings, context: Context) -> Outcome:
    """Measure each kind of shard once, in rounds; each model's error on each kind."""
    from shardwise.evaluation import KernelShard, resolve_timing, time_shards_in_rounds
    from shardwise.profiling import MeasurementSettings
    from shardwise.workload import synthesize_tables

    started = time.perf_counter()
    models = {uri: context.cost_model(uri, required=True) for uri in settings.models}
    first = next(iter(models.values()))
    if len({m.batch_size for m in models.values()}) > 1:
        raise BenchmarkError(f"--models {','.join(settings.models)}: profiled at different batch sizes; compare like "
                         "with like")
    population = synthesize_tables(settings.num_tables, seed=settings.seed, row_scale=settings.row_scale,
                                   batch_size=first.batch_size, progress=False)
    groups = _groups(list(population.tables), settings.heavy, settings.seed)
    shards = [KernelShard(g, first.batch_size) for kind in groups.values() for g in kind]
    kinds = [kind for kind, gs in groups.items() for _ in gs]
    device, protocol = resolve_timing(MeasurementSettings(device="cpu", reference_ms=first.reference_ms,
                                                          batch_size=first.batch_size))
    timed = time_shards_in_rounds(shards, settings.rounds, device=device, protocol=protocol)
    fwd = np.array([statistics.median(t.fwd_ms for t in row) for row in timed])
    total = np.array([statistics.median(t.total_ms for t in row) for row in timed])
    heaviest = groups["heavy table alone"]
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
            rows.append({"model": uri, "shards": kind, "n": int(k.sum()),
                         "signed_error_pct": round(100 * float(error[k].mean()), 1), "mape_pct": round(100 * mape, 1),
                         "fwd_signed_error_pct": round(100 * float(fwd_error[k].mean()), 1),
                         "mape_over_typical": round(mape / typical, 2)})
        # which heavy tables it misses, how they are accessed, and whether its training ranges flag them
        flagged = model.outside_training([shards[i].tables[0] for i in alone], first.batch_size) or ""
        per_table.append(f"{uri}: " + ", ".join(
            f"{t.name} (pooling x dim {t.pooling_factor * t.dim:,.0f}, zipf {t.zipf_alpha:g}"
            f"{', outside training' if t.name in flagged else ''}) {error[i]:+.0%}"
            for i in alone for t in shards[i].tables))
    work = [t[0].pooling_factor * t[0].dim for t in heaviest]
    return Outcome(rows, notes=[
        f"{settings.num_tables} tables synthesized with seed {settings.seed}, rows x {settings.row_scale}; the "
        f"{settings.heavy} heaviest (pooling x dim {min(work):,.0f}-{max(work):,.0f}) alone and each with 3 typical "
        f"companions, and {settings.heavy} typical tables alone; measured in one session, the median of "
        f"{settings.rounds} interleaved rounds, at the models' reference and batch; signed error: predicted / "
        f"measured - 1 ({time.perf_counter() - started:.0f} s). Each heavy table alone, predicted / measured - 1: "
        + "; ".join(per_table)])


register(Experiment(
    name="heavy_tables",
    title="Cost-model error on new heavy tables, beside typical ones",
    settings=HeavyTablesSettings,
    run=run,
))
