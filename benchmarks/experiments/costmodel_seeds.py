"""How much of a cost model's held-out accuracy is its training seed: the same profile trained with several seeds.

A run's held-out MAPE is one draw: the seed picks the networks' initial weights and the validation shards that stop
training (and, with --hold-out-a-size, the table count kept out of training). This trains the cost model on one
stored profile with seeds 0..N-1, the held-out tables as the run held them out (a pipeline preset's synthetic tables,
split as `benchmarks.profiles.split_workload` splits them), one row per seed with its held-out MAPE and Spearman
beside TorchRec's estimator and the additive baseline (which no seed changes), then the spread and how many seeds
meet a MAPE bar.

    python -m benchmarks costmodel_seeds --archive benchmarks/results/gpu/profiles_2026-11-27_h100_run5.tar.gz
    python -m benchmarks costmodel_seeds --data runs/bench_gpu_method/costs --preset gpu-check --seeds 4
    python -m benchmarks costmodel_seeds --archive ARCHIVE --epochs 400 --patience 40   # training's defaults
    python -m benchmarks costmodel_seeds --archive ARCHIVE --hold-out-a-size   # one table count kept out of training
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from benchmarks.harness import Context, Experiment, ExperimentSettings, Outcome, SuiteRun, register
from benchmarks.profiles import extracted, split_workload

#: the metric stems of the held-out tables' figures, per predictor
PREDICTORS = {"neural": "neural_heldout_tables_total", "torchrec_estimator": "torchrec_estimator_heldout_tables_total",
              "additive": "additive_heldout_tables_total"}
#: the profiles of the H100 run the headline's figures come from
H100_PROFILES = "benchmarks/results/gpu/profiles_2026-11-27_h100_run5.tar.gz"


class CostModelSeedsSettings(ExperimentSettings):
    """Which profile, how many seeds, how training stops."""

    archive: str | None = Field(default=None, description="gpu_check.sh's datasets.tar.gz (its costs/ dataset is "
                                "trained on)")
    data: str | None = Field(default=None, description="a shardwise.costs dataset directory (instead of --archive)")
    preset: str = Field(default="gpu-check", description="the preset whose run profiled the data (held-out tables)")
    seeds: int = Field(default=6, ge=1)
    device: str = Field(default="cpu", description="where to train (cpu or cuda)")
    bar: float = Field(default=6.0, gt=0, description="the held-out MAPE bar counted (the GPU's: 6%)")
    epochs: int | None = Field(default=None, ge=1, description="training's epoch cap (default: the preset's, else "
                               "TrainConfig's)")
    patience: int | None = Field(default=None, ge=1, description="epochs without a better validation loss before "
                                 "training stops (default: the preset's, else TrainConfig's)")
    hold_out_a_size: bool = Field(default=False, description="keep one table count (picked by the seed) out of "
                                  "training")

    @model_validator(mode="after")
    def _one_source(self) -> CostModelSeedsSettings:
        if (self.archive is None) == (self.data is None):
            raise ValueError("give one of --archive and --data")
        return self


def run(settings: CostModelSeedsSettings, context: Context) -> Outcome:
    """Train on the profile with each seed in turn; one row per seed."""
    import torch

    from shardwise.costmodel import TrainConfig, train_cost_model
    from shardwise.pipelines.params import pipeline_params
    from shardwise.profiling.dataset import load_costs

    torch.set_num_threads(min(2, torch.get_num_threads()))
    preset = pipeline_params({}, preset_name=settings.preset)
    _, holdout = split_workload(preset)
    sources = tuple(sorted({t.source or t.name for t in holdout.tables}))
    training: dict[str, Any] = {k: v for k, v in {"epochs": settings.epochs or preset.pretrain_epochs,
                                                  "patience": settings.patience or preset.pretrain_patience}.items()
                                if v}
    extra = {"holdout_num_tables": None} if settings.hold_out_a_size else {}
    rows = []
    with extracted(Path(settings.archive)) if settings.archive else nullcontext(None) as folder:
        df = load_costs(folder / "costs" if folder else Path(str(settings.data)))
        for seed in range(settings.seeds):
            config = TrainConfig(device=settings.device, holdout_sources=sources, progress=False, **training, **extra)
            began = time.perf_counter()
            _, report = train_cost_model(df, seed, config)
            row: dict[str, Any] = {"seed": seed, "train_shards": report.sizes.get("train"),
                                   "sizes_held_out": " ".join(map(str, report.heldout_num_tables)) or "none"}
            for name, stem in PREDICTORS.items():
                row[f"{name}_mape_pct"] = round(report.metrics[f"{stem}_mape_pct"], 2)
                row[f"{name}_spearman"] = round(report.metrics[f"{stem}_spearman"], 4)
            row["epochs_run"], row["best_epoch"] = report.epochs_run, report.best_epoch
            row["train_s"] = round(time.perf_counter() - began, 1)
            rows.append(row)
            print(", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    context.name_model(f"trained in this run, seeds 0-{settings.seeds - 1}")
    mape = [r["neural_mape_pct"] for r in rows]
    summary = (f"neural held-out MAPE over {len(rows)} seeds: min {min(mape):.2f}%, median "
               f"{statistics.median(mape):.2f}%, max {max(mape):.2f}%; {sum(m <= settings.bar for m in mape)} of "
               f"{len(rows)} seeds at or below {settings.bar}%; TorchRec's estimator "
               f"{rows[0]['torchrec_estimator_mape_pct']}%, additive {rows[0]['additive_mape_pct']}%")
    config = TrainConfig(**training)
    sizes = "one table count held out" if settings.hold_out_a_size else "every table count trained on"
    return Outcome(rows, notes=[f"{summary}; held-out tables of preset {settings.preset}; trained on {settings.device}"],
                   title=f"Cost model's held-out accuracy by training seed "
                         f"({Path(str(settings.archive or settings.data)).name}, {config.epochs} epochs at most, "
                         f"patience {config.patience}, {sizes})")


register(Experiment(
    name="costmodel_seeds",
    title="Cost model's held-out accuracy by training seed",
    settings=CostModelSeedsSettings,
    run=run,
    threads=None,  # two, set by run()
    # the headline's figures: the H100 profiles, 12 seeds, a patient schedule
    suites={"claims": (SuiteRun({"archive": H100_PROFILES, "seeds": 12, "epochs": 800, "patience": 200},
                                record_name="costmodel_seeds_all_sizes"),)},
))
