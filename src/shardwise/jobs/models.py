"""Which cost model and which placement policy a job uses: an explicit URI, else this hardware's champion in
the registry. Shared by plan, evaluate, benchmark and train-policy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from shardwise.errors import ShardwiseError
from shardwise.integrations.mlflow import (
    MlflowService,
    RegistryError,
    StoreError,
    champion_uri,
    cost_model_name,
    policy_name,
    redacted,
)

if TYPE_CHECKING:
    from shardwise.costmodel import NeuralCostModel

T = TypeVar("T")

HOW_TO_GET_A_MODEL = (
    "Get one with `make run` (the local pipeline) or `shardwise profile ... && shardwise pretrain --data "
    "costs.parquet --out MODEL_DIR`, then pass --model MODEL_DIR or models:/<name>@champion"
)


def registered_model_uri(hardware_kind: str, alias: str) -> str:
    """`models:/shardwise-cost-<hardware kind>@<alias>`: the registered cost model a pipeline step uses."""
    return f"models:/{cost_model_name(hardware_kind)}@{alias}"


def store_uri(tracking_uri: str | None = None) -> str:
    """The MLflow store a job logs to: `tracking_uri`, else $MLFLOW_TRACKING_URI, else the default embedded
    store; a relative sqlite path made absolute (a pipeline's steps run in other directories)."""
    uri = MlflowService(tracking_uri).tracking_uri
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return f"sqlite:///{Path(uri.removeprefix('sqlite:///')).resolve()}"
    return uri


def store_folders(tracking_uri: str) -> list[Path]:
    """The folders on this machine an MLflow store keeps its data in (none for a server): what a step in a
    container must see of it."""
    return MlflowService(tracking_uri).local_folders()


def load_cost_model(
    mlflow: MlflowService, uri: str | None, *, device: str | None, required: bool
) -> tuple[NeuralCostModel | None, str | None]:
    """The cost model at `uri`, else the champion for `device`'s hardware; (None, None) when optional and absent.

    The model is loaded on the CPU whatever `device` is: search makes thousands of small predictions, which run
    faster on a GPU node's CPU than on its GPU (record `planning_time_cuda`). An embedded store that does not exist
    is not created by looking for a champion in it."""
    if uri:
        try:
            return mlflow.load_cost_model(uri, device="cpu"), uri
        except (RegistryError, OSError, ValueError) as err:
            raise ShardwiseError(f"--model {uri}: cannot load the cost model: {err}") from None
    from shardwise.profiling import hardware_kind  # torch: only when the champion is looked for

    default = champion_uri(cost_model_name(hardware_kind(device)))
    how = f"no cost model: {default} is not in the registry at {redacted(mlflow.registry_uri)}. {HOW_TO_GET_A_MODEL}"
    if not mlflow.store_exists():
        if required:
            raise ShardwiseError(how)
        return None, None
    try:
        return mlflow.load_cost_model(default, device="cpu"), default
    except StoreError:
        raise
    except RegistryError:
        if required:
            raise ShardwiseError(how) from None
        return None, None


def with_policy(
    mlflow: MlflowService, method: str, policy: str | None, hardware: str, use: Callable[[str], T]
) -> T:
    """`use(local policy directory)` for `policy` (a directory or registry URI), else the champion policy of
    `method` for `hardware`; the directory lives while `use` runs."""
    uri = policy or champion_uri(policy_name(method, hardware))
    try:
        return mlflow.load(uri, lambda directory: use(str(directory)))
    except RegistryError as err:
        raise ShardwiseError(
            f"{method}: no trained policy at {uri} ({err}); train one with "
            f"`shardwise train-policy --method {method} ...` or pass --policy DIR"
        ) from None
