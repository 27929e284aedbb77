"""Neural cost models: networks, pre-training, honest evaluation, fast batched prediction."""

from .evaluate import (
    ComputeSamples,
    evaluate_compute,
    format_table,
    heldout_mape_pct,
    regression_metrics,
    torchrec_estimates,
)
from .model import ModelFileError, ModelMeta, NetworkConfig, NeuralCostModel
from .train import CostDataError, TrainConfig, TrainingReport, compute_samples, train_cost_model
from .types import CostModel

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
