"""`shardwise pretrain`: train the cost model on cost datasets, evaluate it on held-out tables, register it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from shardwise.costmodel.train_config import HELDOUT_TOP_DECILE_METRIC, TrainConfig
from shardwise.extras import require
from shardwise.integrations.mlflow import MlflowService
from shardwise.profiling import check_device_name
from shardwise.workload import load_tables

from .base import JobResult, JobSettings

_TRAIN = TrainConfig.model_fields  # training's own defaults, shared rather than repeated
_MAPE = "neural_heldout_tables_total_mape_pct"


#: the MLflow run tag naming the Kubeflow Pipelines run a model was trained in
PIPELINE_RUN_TAG = "kfp.run_id"

class PretrainSettings(JobSettings):
    """Which measurements to train on, what to hold out, where the model goes."""

    data: tuple[str, ...] = Field(min_length=1, description="cost dataset (Parquet file or dir); repeatable")
    out: str = Field(description="directory for the model (weights.pt + cost_model.json)")
    seed: int = 0
    epochs: int = Field(default=_TRAIN["epochs"].default, ge=1,
                        description="maximum epochs (early stopping on validation)")
    patience: int = Field(default=_TRAIN["patience"].default, ge=1,
                          description="epochs without a better validation loss before training stops")
    holdout_fraction: float = Field(default=_TRAIN["holdout_fraction"].default, gt=0, lt=1,
                                    description="share of shards on held-out tables")
    holdout_tables: str | None = Field(
        default=None, description="tables file whose source tables are the held-out ones (default: found in the data)"
    )
    cost_weight_power: float = Field(
        default=_TRAIN["cost_weight_power"].default, ge=0, le=2,
        description="each training shard's error weighted by its measured ms to this power (the costliest shards "
                    "set a plan's slowest device; 0: every shard alike)")
    holdout_num_tables: tuple[int, ...] = Field(
        default=_TRAIN["holdout_num_tables"].default,
        description="shard sizes kept out of training and reported separately (default: none, every size trained on)",
        json_schema_extra={"nargs": "*"},
    )
    device: Annotated[str, AfterValidator(check_device_name)] = Field(default=_TRAIN["device"].default, description="torch device to train on (cpu, cuda)")
    tracking_uri: str | None = Field(
        default=None, description="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)"
    )
    no_register: bool = Field(default=False, description="skip MLflow logging and registration")
    pipeline_run_id: str | None = Field(
        default=None, description="the Kubeflow Pipelines run this training belongs to: tagged on the MLflow run "
        f"as {PIPELINE_RUN_TAG}")


class PretrainResult(JobResult):
    """The saved model, its held-out evaluation and where the registry put it."""

    out: str
    hardware_kind: str
    batch_size: int
    train_shards: int
    heldout_sources: int
    metrics: dict[str, float]
    evaluation_table: str
    notes: list[str] = []
    run_id: str | None = None
    registered_name: str | None = None
    registered_version: str | None = None
    alias: str | None = None
    heldout_mape_pct: float | None = None
    champion_version: str | None = None
    champion_mape_pct: float | None = None
    #: the gate's second figure: MAPE over the costliest tenth of the held-out shards, this model's and the champion's
    heldout_top_decile_mape_pct: float | None = None
    champion_top_decile_mape_pct: float | None = None
    reason: str = ""

    def summary(self) -> str:
        """The evaluation table, notes, the model and the registry outcome."""
        lines = [self.evaluation_table]
        lines.append(f"model: {self.out} ({self.hardware_kind}, batch {self.batch_size}, "
                     f"{self.train_shards} training shards)")
        mape, top = (self.metrics.get(k, math.nan) for k in (_MAPE, HELDOUT_TOP_DECILE_METRIC))
        lines.append(f"held-out tables: MAPE {mape:.2f}%, {top:.2f}% on the costliest tenth of their shards")
        if self.registered_name:
            versus = ("" if self.champion_mape_pct is None
                      else f" vs champion v{self.champion_version} {self.champion_mape_pct:.2f}%")
            top_versus = ("" if self.champion_top_decile_mape_pct is None
                          else f" vs {self.champion_top_decile_mape_pct:.2f}%")
            top_decile = ("" if self.heldout_top_decile_mape_pct is None
                          else f", costliest tenth {self.heldout_top_decile_mape_pct:.2f}%{top_versus}")
            lines.append(f"registered {self.registered_name} v{self.registered_version} as {self.alias!r} "
                         f"(held-out MAPE {self.heldout_mape_pct:.2f}%{versus}{top_decile}); run {self.run_id}")
            if self.reason:
                lines.append(f"gate: {self.reason}")
        return "\n".join(lines)


def run(settings: PretrainSettings, *, mlflow: MlflowService | None = None) -> PretrainResult:
    """Train, save, evaluate on held-out tables; log and register unless `no_register`."""
    # training (torch, pandas, scipy) loads only when it runs: `pretrain --help` and a command line's mistakes
    # answer without it
    from shardwise.costmodel import format_table, train_cost_model
    from shardwise.profiling import load_costs

    if not settings.no_register and mlflow is None:
        require("mlflow")  # said before training, not after
    costs = load_costs(list(settings.data))
    sources = None
    if settings.holdout_tables:
        sources = tuple(sorted({t.source or t.name for t in load_tables(settings.holdout_tables).tables}))
    config = TrainConfig(
        epochs=settings.epochs, patience=settings.patience, holdout_fraction=settings.holdout_fraction,
        device=settings.device, cost_weight_power=settings.cost_weight_power,
        holdout_sources=sources, holdout_num_tables=settings.holdout_num_tables,
    )
    model, report = train_cost_model(costs, settings.seed, config)
    model.save(settings.out)
    report.evaluation.to_csv(Path(settings.out) / "evaluation.csv", index=False)
    result: dict[str, Any] = dict(
        out=settings.out, hardware_kind=report.hardware_kind, batch_size=report.batch_size,
        train_shards=report.sizes["train"], heldout_sources=len(report.heldout_sources),
        metrics=report.metrics, evaluation_table=format_table(report.evaluation), notes=list(report.notes),
    )
    if settings.no_register:
        return PretrainResult(**result)
    service = mlflow or MlflowService(settings.tracking_uri)
    tags = {PIPELINE_RUN_TAG: settings.pipeline_run_id} if settings.pipeline_run_id else {}
    logged = service.log_cost_model(model, report, config=config, params={"data": ",".join(settings.data)},
                                    tags=tags)
    promo = logged.promotion
    if promo is not None:
        result.update(
            registered_name=promo.name, registered_version=promo.version, alias=promo.alias,
            heldout_mape_pct=promo.new_value, champion_version=promo.champion_version,
            champion_mape_pct=promo.champion_value, reason=promo.reason,
        )
        if HELDOUT_TOP_DECILE_METRIC in promo.guard_values:
            ours, theirs = promo.guard_values[HELDOUT_TOP_DECILE_METRIC]
            result.update(heldout_top_decile_mape_pct=ours, champion_top_decile_mape_pct=theirs)
    return PretrainResult(**result, run_id=logged.run_id)
