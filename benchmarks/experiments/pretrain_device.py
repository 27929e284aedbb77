"""Pre-training on a GPU next to the CPU: the same cost dataset, seed and schedule on each device, in one run.

What a platform team retraining from CI on a GPU node gets (`shardwise pretrain --device cuda`): seconds per epoch and
in all, and the held-out error of the model each device trains (float32 sums differ in the last bits between devices,
so the two models differ a little; their errors should not).

    python -m benchmarks pretrain_device --data runs/local/costs --devices cpu,cuda --record
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import Field

from benchmarks.harness import Context, Experiment, ExperimentSettings, Outcome, register


class PretrainDeviceSettings(ExperimentSettings):
    """Which data, on which devices, for how long."""

    data: tuple[str, ...] = Field(description="cost dataset: parquet file or folder (repeat for several, e.g. the "
                                  "kernel and the all-to-all datasets of a pipeline run)")
    devices: tuple[str, ...] = Field(default=("cpu", "cuda"), description="torch devices to train on, comma "
                                     "separated; ratios are over the first", json_schema_extra={"sep": ","})
    epochs: int = Field(default=100, ge=1, description="epochs per network (fixed: patience is set to the epochs, "
                        "so every device does the same work)")
    seed: int = 0


def run(settings: PretrainDeviceSettings, context: Context) -> Outcome:
    """Train on each device in turn; one row per device."""
    from shardwise.costmodel import TrainConfig, train_cost_model
    from shardwise.profiling import load_costs

    df = load_costs(list(settings.data))
    rows: list[dict[str, Any]] = []
    for device in settings.devices:
        config = TrainConfig(epochs=settings.epochs, patience=settings.epochs, comm_epochs=settings.epochs,
                             device=device, progress=False)
        started = time.perf_counter()
        _, report = train_cost_model(df, settings.seed, config)
        seconds = time.perf_counter() - started
        first_s = rows[0]["seconds"] if rows else seconds
        rows.append({"device": device, "seconds": round(seconds, 1), "epochs": report.epochs_run,
                     "s_per_epoch": round(seconds / max(report.epochs_run, 1), 3),
                     "heldout_total_mape_pct": round(report.metrics["neural_heldout_tables_total_mape_pct"], 2),
                     "time_over_first": round(seconds / first_s, 2)})
    return Outcome(rows, notes=[
        f"dataset: {', '.join(settings.data)} ({len(df)} rows: {(df['kind'] == 'compute').sum()} compute, "
        f"{(df['kind'] == 'comm').sum()} all-to-all); {settings.epochs} epochs per network, seed {settings.seed}; "
        "seconds = the whole training call (features, both networks, the evaluation); s_per_epoch = seconds over the "
        "compute network's epochs; the evaluation's TorchRec baseline is skipped where TorchRec is not installed"])


register(Experiment(
    name="pretrain_device",
    title="Pre-training on each device: time and held-out error",
    settings=PretrainDeviceSettings,
    run=run,
    threads=None,
))
