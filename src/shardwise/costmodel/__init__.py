"""Neural cost models: networks, pre-training, honest evaluation, fast batched prediction.

Evaluation (scipy, pandas) and training (pandas) load on first use of one of their names: planning with a
trained model needs neither, and scipy.stats alone took 1.1 s of `shardwise plan`'s start. The model (torch) loads on
first use too: a command's options (`shardwise plan --help`) are built without it, as are pre-training's
(`TrainConfig`, in train_config.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardwise.lazy import on_first_use

from .train_config import TrainConfig
from .types import CostModel

if TYPE_CHECKING:
    from .evaluate import (
        ComputeSamples,
        evaluate_compute,
        format_table,
        heldout_mape_pct,
        heldout_metrics,
        regression_metrics,
        top_decile_mape_pct,
        torchrec_estimates,
    )
    from .model import ModelFileError, ModelMeta, NetworkConfig, NeuralCostModel
    from .train import CostDataError, TrainingReport, compute_samples, train_cost_model

#: the modules that load on first use of one of their names
__getattr__ = on_first_use(__name__, {
    "evaluate": ("ComputeSamples", "evaluate_compute", "format_table", "heldout_mape_pct", "heldout_metrics",
                 "regression_metrics", "top_decile_mape_pct", "torchrec_estimates"),
    "model": ("ModelFileError", "ModelMeta", "NetworkConfig", "NeuralCostModel"),
    "train": ("CostDataError", "TrainingReport", "compute_samples", "train_cost_model"),
})

__all__ = [
    "ComputeSamples",
    "CostDataError",
    "CostModel",
    "ModelFileError",
    "ModelMeta",
    "NetworkConfig",
    "NeuralCostModel",
    "TrainConfig",
    "TrainingReport",
    "compute_samples",
    "evaluate_compute",
    "format_table",
    "heldout_mape_pct",
    "heldout_metrics",
    "regression_metrics",
    "top_decile_mape_pct",
    "torchrec_estimates",
    "train_cost_model",
]
