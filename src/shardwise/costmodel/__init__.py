"""Neural cost models: networks, pre-training, honest evaluation, fast batched prediction.

Evaluation (scipy, pandas) and training (pandas) load on first use of one of their names: planning with a
trained model needs neither, and scipy.stats alone took 1.1 s of `shardwise plan`'s start."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .model import ModelFileError, ModelMeta, NetworkConfig, NeuralCostModel
from .types import CostModel

if TYPE_CHECKING:
    from .evaluate import (
        ComputeSamples,
        evaluate_compute,
        format_table,
        heldout_mape_pct,
        regression_metrics,
        torchrec_estimates,
    )
    from .train import CostDataError, TrainConfig, TrainingReport, compute_samples, train_cost_model

#: the names of the modules that load on first use
_ON_FIRST_USE = {
    **dict.fromkeys(("ComputeSamples", "evaluate_compute", "format_table", "heldout_mape_pct", "regression_metrics",
                     "torchrec_estimates"), "evaluate"),
    **dict.fromkeys(("CostDataError", "TrainConfig", "TrainingReport", "compute_samples", "train_cost_model"),
                    "train"),
}


def __getattr__(name: str) -> Any:
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_ON_FIRST_USE[name]}"), name)

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
    "regression_metrics",
    "torchrec_estimates",
    "train_cost_model",
]
