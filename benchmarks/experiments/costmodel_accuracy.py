"""Cost-model accuracy on shards built only from tables it never saw, against TorchRec's estimator, an additive
baseline and the measurement noise floor, all on this machine's real fbgemm CPU kernels.

Synthetic DLRM tables are split by source table into train and held-out tables before augmentation (every dim, column
halves, pooling resampling), each side is profiled separately, the model is trained on the train side and evaluated
on the held-out side. Target: compute MAPE <= 5%, Spearman >= 0.99, MAPE within 1.5x the noise floor, better than
both baselines.

    python -m benchmarks costmodel_accuracy                       # ~2,800 shards, ~15-20 min on 2 cores
    python -m benchmarks costmodel_accuracy --small               # a few minutes, proves the path
    python -m benchmarks costmodel_accuracy --data runs/bench/costs.parquet --holdout-tables runs/bench/holdout.json
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import Field

from benchmarks.harness import Context, Experiment, ExperimentSettings, Outcome, register

TARGET_MAPE_PCT = 5.0
TARGET_SPEARMAN = 0.99
TARGET_NOISE_RATIO = 1.5
#: --small: a few minutes that prove the path
SMALL = {"num_tables": 20, "train_shards": 150, "holdout_shards": 50, "max_tables": 8, "repeat_shards": 20,
         "epochs": 200}


class CostModelAccuracySettings(ExperimentSettings):
    """Which tables are profiled (or which data is read), how the model is trained."""

    data: tuple[str, ...] | None = Field(default=None, description="existing cost dataset(s) instead of profiling "
                                         "(repeatable)")
    holdout_tables: str | None = Field(default=None, description="with --data: the held-out tables file (else "
                                       "picked from the data)")
    out: str = "runs/bench_costmodel_accuracy"
    small: bool = Field(default=False, description="a few-minute run that proves the path (its own sizes)")
    # distinct source tables matter more than shard count for unseen tables (record costmodel_accuracy_profile_size)
    num_tables: int = Field(default=400, ge=2, description="synthetic source tables before the split")
    row_scale: float = Field(default=0.01, gt=0)
    batch_size: int = Field(default=2048, ge=1)
    holdout_fraction: float = Field(default=0.2, gt=0, lt=1)
    train_shards: int = Field(default=2400, ge=1)
    holdout_shards: int = Field(default=400, ge=1)
    max_tables: int = Field(default=15, ge=1)
    repeat_shards: int = Field(default=60, ge=0, description="configs measured twice (noise floor)")
    epochs: int = Field(default=400, ge=1)
    weight_decay: float | None = Field(default=None, ge=0, description="(default: TrainConfig's)")
    hidden: int | None = Field(default=None, ge=1, description="width of the networks (default: TrainConfig's)")
    seed: int = 0


def _profile(s: CostModelAccuracySettings, out: Path) -> tuple[Path, Any]:
    """Synthesize, split, augment and profile both sides into `out`/costs.parquet (resumes)."""
    from shardwise.profiling.runner import ProfileSettings, profile
    from shardwise.workload.augment import augment_tables
    from shardwise.workload.synthetic import synthesize_tables
    from shardwise.workload.tableset import save_tables, split_tables

    tables = synthesize_tables(s.num_tables, seed=s.seed, row_scale=s.row_scale, batch_size=s.batch_size)
    train, holdout = split_tables(tables, s.holdout_fraction, seed=s.seed)
    train = augment_tables(train, s.seed)
    holdout = augment_tables(holdout, s.seed + 1)
    save_tables(train, out / "train.json")
    save_tables(holdout, out / "holdout.json")
    costs = out / "costs.parquet"
    settings = ProfileSettings(num_shards=s.train_shards, max_tables=s.max_tables, repeats=1,
                               repeat_shards=s.repeat_shards, batch_size=s.batch_size, seed=s.seed, device="cpu")
    start = time.perf_counter()
    profile(train.tables, costs, settings)
    profile(holdout.tables, costs, settings.model_copy(update={"num_shards": s.holdout_shards, "seed": s.seed + 1}))
    print(f"profiled {len(train.tables)} train / {len(holdout.tables)} held-out tables in "
          f"{time.perf_counter() - start:.0f} s")
    return costs, holdout


def run(settings: CostModelAccuracySettings, context: Context) -> Outcome:
    """Profile (or read) the two sides, train, and compare every predictor on the held-out tables."""
    from shardwise.costmodel import TrainConfig, format_table, train_cost_model
    from shardwise.profiling.dataset import load_costs
    from shardwise.workload.tableset import load_tables

    s = settings.model_copy(update=SMALL) if settings.small else settings
    out = Path(s.out)
    out.mkdir(parents=True, exist_ok=True)
    if s.data:
        df = load_costs(list(s.data))
        holdout = load_tables(s.holdout_tables) if s.holdout_tables else None
    else:
        costs, holdout = _profile(s, out)
        df = load_costs(costs)
    sources = tuple(sorted({t.source or t.name for t in holdout.tables})) if holdout else None
    defaults = TrainConfig()
    start = time.perf_counter()
    model, report = train_cost_model(df, s.seed, TrainConfig(
        epochs=s.epochs, weight_decay=defaults.weight_decay if s.weight_decay is None else s.weight_decay,
        hidden=s.hidden or defaults.hidden, holdout_sources=sources))
    train_s = time.perf_counter() - start
    model.save(out / "model")
    report.evaluation.to_csv(out / "evaluation.csv", index=False)
    print(format_table(report.evaluation))

    m = report.metrics
    mape, rho = m["neural_heldout_tables_total_mape_pct"], m["neural_heldout_tables_total_spearman"]
    torchrec = m.get("torchrec_estimator_heldout_tables_total_mape_pct", float("nan"))
    additive = m.get("additive_heldout_tables_total_mape_pct", float("nan"))
    noise = m.get("noise_floor_repeats_total_mape_pct", float("nan"))
    ok = mape <= TARGET_MAPE_PCT and rho >= TARGET_SPEARMAN and mape / noise <= TARGET_NOISE_RATIO and mape < min(
        torchrec, additive)
    predictors = (("neural cost model", "neural_heldout_tables_total"),
                  ("TorchRec estimator (scaled)", "torchrec_estimator_heldout_tables_total"),
                  ("additive baseline", "additive_heldout_tables_total"),
                  ("noise floor (repeats vs first measurement)", "noise_floor_repeats_total"))
    rows = []
    for name, stem in predictors:
        p_mape, p_rho = m.get(f"{stem}_mape_pct"), m.get(f"{stem}_spearman")
        rows.append({"predictor": name, "mape_pct": None if p_mape is None else round(p_mape, 2),
                     "spearman": None if p_rho is None else round(p_rho, 4),
                     "neural_mape_over_this": None if not p_mape else round(mape / p_mape, 2)})
    notes = [f"{report.hardware_kind}, batch {report.batch_size}, shards {report.sizes} (trained in {train_s:.0f} s, "
             f"{report.epochs_run} epochs, best {report.best_epoch}); targets (neural MAPE <= {TARGET_MAPE_PCT}%, "
             f"Spearman >= {TARGET_SPEARMAN}, MAPE / noise floor <= {TARGET_NOISE_RATIO}, below both baselines) "
             f"{'met' if ok else 'not met'} (evaluation: {out / 'evaluation.csv'}, model: {out / 'model'})",
             *(f"note: {note}" for note in report.notes)]
    if s.small:
        notes.append("--small proves the path, its figures are rough")
        return Outcome(rows, notes, record_name="costmodel_accuracy_small", title=f"{EXPERIMENT.title}, --small "
                       "smoke run")
    return Outcome(rows, notes)


EXPERIMENT = register(Experiment(
    name="costmodel_accuracy",
    title="Cost-model accuracy on shards of held-out tables (fwd+bwd)",
    settings=CostModelAccuracySettings,
    run=run,
))
