"""The cost model as an MLflow pyfunc, for MLflow's own tooling (`mlflow.pyfunc.load_model`, serving).

Registered cost models store a models-from-code script that imports `CostModelPyfunc` from here; shardwise itself
loads the saved weights and JSON directly (`MlflowService.load_cost_model`). This module imports mlflow at the
top, so only MLflow (loading a model) and `MlflowService.log_cost_model` import it."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
from mlflow.pyfunc import PythonModel

from shardwise.costmodel import NeuralCostModel
from shardwise.workload import TableSpec

#: the key of the saved cost model (weights + JSON) among the pyfunc model's artifacts
ARTIFACT_KEY = "cost_model"


class CostModelPyfunc(PythonModel):
    """Pyfunc wrapper: a DataFrame with `tables_json` per row -> `fwd_ms`, `bwd_ms` per row."""

    def load_context(self, context: Any) -> None:
        """Load the saved cost model from the pyfunc model's artifacts."""
        self.model = NeuralCostModel.load(context.artifacts[ARTIFACT_KEY])

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        """Forward and backward ms of the shard whose tables each row's `tables_json` lists."""
        shards = [[TableSpec.model_validate(t) for t in json.loads(s)] for s in model_input["tables_json"]]
        costs = self.model.predict_compute(shards)
        return pd.DataFrame({"fwd_ms": costs[:, 0], "bwd_ms": costs[:, 1]})
