"""The cost model as an MLflow pyfunc, for MLflow's own tooling (`mlflow.pyfunc.load_model`, serving).

Registered cost models store a models-from-code script that imports `CostModelPyfunc` from here; shardwise itself
loads the saved weights and JSON directly (`MlflowService.load_cost_model`), and logs the pyfunc beside them
(`log_pyfunc`). This module imports mlflow at the top, so only MLflow (loading a model) and
`MlflowService.log_cost_model` import it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import torch
from mlflow.models import ModelSignature
from mlflow.models.model import ModelInfo
from mlflow.pyfunc import PythonModel
from mlflow.types import ColSpec, Schema

from shardwise.costmodel import NeuralCostModel
from shardwise.workload import TableSpec

#: the key of the saved cost model (weights + JSON) among the pyfunc model's artifacts
ARTIFACT_KEY = "cost_model"

# models-from-code: MLflow stores this script with the model instead of a pickled Python object
_PYFUNC_SCRIPT = """\
import mlflow
from shardwise.integrations.mlflow_pyfunc import CostModelPyfunc

mlflow.models.set_model(CostModelPyfunc())
"""


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


def log_pyfunc(name: str, model_dir: Path, work_dir: Path, registered_model_name: str | None) -> ModelInfo:
    """Log the cost model saved in `model_dir` as the pyfunc `name` of the active run (its models-from-code script
    written in `work_dir`), registered as `registered_model_name` unless None."""
    script = work_dir / "cost_model_pyfunc.py"
    script.write_text(_PYFUNC_SCRIPT)
    with warnings.catch_warnings():
        # an input example would make MLflow load and run the model while logging: slow, and the
        # signature below already says what goes in and out
        warnings.filterwarnings("ignore", message=".*input example was not provided.*")
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=str(script),
            artifacts={ARTIFACT_KEY: str(model_dir)},
            pip_requirements=[
                "shardwise",
                f"torch=={torch.__version__.split('+')[0]}",
                f"mlflow=={mlflow.__version__}",
                "numpy",
                "pandas",
                "pydantic>=2",
            ],
            registered_model_name=registered_model_name,
            signature=ModelSignature(
                inputs=Schema([ColSpec("string", "tables_json")]),
                outputs=Schema([ColSpec("double", "fwd_ms"), ColSpec("double", "bwd_ms")]),
            ),
        )
