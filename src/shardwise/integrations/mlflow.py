"""MLflow for cost models: track a training run, register the model per hardware kind, gate the `champion`
alias on held-out accuracy, and load a ready `NeuralCostModel` from a registry URI, run URI or directory."""

from __future__ import annotations

import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from shardwise.costmodel.evaluate import ComputeSamples, format_table, regression_metrics
from shardwise.costmodel.model import CONFIG_FILE, NeuralCostModel
from shardwise.costmodel.train import TrainConfig, TrainingReport

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_EXPERIMENT = "shardwise-pretrain"
CHAMPION = "champion"
CHALLENGER = "challenger"
MODEL_NAME = "model"  # the pyfunc model's name within a run
FILES_PATH = "cost_model"  # the same weights + JSON as plain run artifacts (`runs:/<id>/cost_model`)

# models-from-code: MLflow stores this script instead of a pickled Python object
_PYFUNC_SCRIPT = """\
import mlflow
from shardwise.integrations.mlflow import CostModelPyfunc

mlflow.models.set_model(CostModelPyfunc())
"""


def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """The `--tracking-uri` flag, else $MLFLOW_TRACKING_URI, else the embedded `sqlite:///mlflow.db`."""
    return tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def registered_model_name(hardware_kind: str) -> str:
    """Registry name of the cost model for one hardware kind."""
    return f"shardwise-cost-{hardware_kind}"


def default_model_uri(hardware_kind: str) -> str:
    """`models:/shardwise-cost-<kind>@champion`: what search uses unless told otherwise."""
    return f"models:/{registered_model_name(hardware_kind)}@{CHAMPION}"


try:
    import mlflow.pyfunc as _pyfunc

    class CostModelPyfunc(_pyfunc.PythonModel):
        """Pyfunc wrapper: a DataFrame with `tables_json` per row -> `fwd_ms`, `bwd_ms` per row."""

        def load_context(self, context: Any) -> None:
            self.model = NeuralCostModel.load(context.artifacts["cost_model"])

        def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
            import json

            from shardwise.workload import TableSpec

            shards = [[TableSpec.model_validate(t) for t in json.loads(s)] for s in model_input["tables_json"]]
            costs = self.model.predict_compute(shards)
            return pd.DataFrame({"fwd_ms": costs[:, 0], "bwd_ms": costs[:, 1]})
except ImportError:  # pragma: no cover - mlflow is a dependency; keep `load_cost_model` on a directory usable
    pass


@dataclass(frozen=True)
class PromotionResult:
    """Where the new version landed and the held-out MAPE that decided it."""

    name: str
    version: str
    alias: str
    new_mape_pct: float
    champion_version: str | None
    champion_mape_pct: float | None


@dataclass(frozen=True)
class TrainingRun:
    """A logged training run and (if registered) its registry outcome."""

    run_id: str
    model_uri: str
    promotion: PromotionResult | None


def _find_model_dir(root: Path) -> Path:
    if (root / CONFIG_FILE).is_file():
        return root
    found = sorted(root.rglob(CONFIG_FILE))
    if not found:
        raise FileNotFoundError(f"{root}: no {CONFIG_FILE} found (not a shardwise cost model)")
    return found[0].parent


def load_cost_model(uri: str, *, tracking_uri: str | None = None, device: str = "cpu") -> NeuralCostModel:
    """A ready model from "models:/<name>@<alias>", "models:/<name>/<version>", "runs:/<id>/...", or a directory."""
    if Path(uri).exists():
        return NeuralCostModel.load(_find_model_dir(Path(uri)), device=device)
    if not uri.startswith(("models:/", "runs:/")) and "://" not in uri:
        raise FileNotFoundError(f"cost model {uri!r}: no such directory, and not a models:/ or runs:/ URI")
    import mlflow

    with tempfile.TemporaryDirectory(prefix="shardwise-model-") as tmp:
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=uri, dst_path=tmp, tracking_uri=resolve_tracking_uri(tracking_uri)
        )
        return NeuralCostModel.load(_find_model_dir(Path(local)), device=device)


def _heldout_mape(model: NeuralCostModel, samples: ComputeSamples) -> float:
    pred = model.predict_compute(samples.shards).sum(axis=1)
    return regression_metrics(pred, samples.costs_ms.sum(axis=1))["mape_pct"]


def promote(
    name: str, version: str, model: NeuralCostModel, heldout: ComputeSamples, *, tracking_uri: str | None = None
) -> PromotionResult:
    """Give `version` the `champion` alias if it beats the current champion on `heldout`, else `challenger`."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    uri = resolve_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    new_mape = _heldout_mape(model, heldout) if len(heldout) else float("nan")
    try:
        current = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        current = None
    if current is not None and not len(heldout):
        # nothing to compare on: never replace a champion blindly
        client.set_registered_model_alias(name, CHALLENGER, version)
        return PromotionResult(name, str(version), CHALLENGER, new_mape, str(current.version), None)
    champ_mape = None
    if current is not None and current.version != version:
        champion = load_cost_model(f"models:/{name}/{current.version}", tracking_uri=uri)
        if champion.batch_size == model.batch_size:
            champ_mape = _heldout_mape(champion, heldout)
    # a champion profiled at another batch size is not comparable: the newer model (this batch size) wins
    wins = current is None or champ_mape is None or new_mape < champ_mape
    alias = CHAMPION if wins else CHALLENGER
    client.set_registered_model_alias(name, alias, version)
    return PromotionResult(name, str(version), alias, new_mape, None if current is None else str(current.version), champ_mape)


def log_training_run(
    model: NeuralCostModel,
    report: TrainingReport,
    *,
    config: TrainConfig | None = None,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
    register: bool = True,
    extra_params: dict[str, Any] | None = None,
) -> TrainingRun:
    """Log params, metrics, the evaluation table and the model; register it and apply the promotion gate."""
    import mlflow
    import torch
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    uri = resolve_tracking_uri(tracking_uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    mlflow.set_experiment(experiment)
    params: dict[str, Any] = {
        "seed": report.seed,
        "hardware_kind": report.hardware_kind,
        "batch_size": report.batch_size,
        "heldout_num_tables": list(report.heldout_num_tables),
        "heldout_sources": len(report.heldout_sources),
        **{f"n_{k}": v for k, v in report.sizes.items()},
        **(config.model_dump(exclude={"holdout_sources", "progress"}) if config else {}),
        **(extra_params or {}),
    }
    with tempfile.TemporaryDirectory(prefix="shardwise-log-") as tmp, mlflow.start_run() as run:
        mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        mlflow.log_metrics({**report.metrics, "epochs_run": report.epochs_run, "best_val_log_mse": report.best_val_loss})
        mlflow.log_text(report.evaluation.to_csv(index=False), "evaluation/evaluation.csv")
        mlflow.log_text(format_table(report.evaluation) + "\n", "evaluation/evaluation.txt")
        model_dir = model.save(Path(tmp) / "cost_model")
        mlflow.log_artifacts(str(model_dir), FILES_PATH)
        script = Path(tmp) / "cost_model_pyfunc.py"
        script.write_text(_PYFUNC_SCRIPT)
        name = registered_model_name(report.hardware_kind)
        with warnings.catch_warnings():
            # an input example would make MLflow load and run the model while logging: slow, and the
            # signature below already says what goes in and out
            warnings.filterwarnings("ignore", message=".*input example was not provided.*")
            info = mlflow.pyfunc.log_model(
                name=MODEL_NAME,
                python_model=str(script),
                artifacts={"cost_model": str(model_dir)},
                pip_requirements=[
                    "shardwise",
                    f"torch=={torch.__version__.split('+')[0]}",
                    f"mlflow=={mlflow.__version__}",
                    "numpy",
                    "pandas",
                    "pydantic>=2",
                ],
                registered_model_name=name if register else None,
                signature=ModelSignature(
                    inputs=Schema([ColSpec("string", "tables_json")]),
                    outputs=Schema([ColSpec("double", "fwd_ms"), ColSpec("double", "bwd_ms")]),
                ),
            )
        promotion = None
        if register:
            version = str(info.registered_model_version)
            promotion = promote(name, version, model, report.test, tracking_uri=uri)
            gate = {"gate_new_mape_pct": promotion.new_mape_pct, "gate_champion_mape_pct": promotion.champion_mape_pct}
            mlflow.log_metrics({k: v for k, v in gate.items() if v is not None and v == v})
            mlflow.set_tags({"registered_version": version, "alias": promotion.alias})
        return TrainingRun(run.info.run_id, info.model_uri, promotion)

