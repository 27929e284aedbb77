"""MLflow, wrapped once: log a run, register a version and gate its promotion, load by URI or alias.

`MlflowService` holds one tracking URI and one registry URI and passes both to every MLflow call, so a store
named on the command line reaches the model registry too. Cost models and placement policies go through the
same promotion gate (`promote`, in `promotion`): a new version takes the `champion` alias only on measured
evidence, kept on the model version and on its run.

`mlflow` is imported inside the methods that use it: it takes seconds to import, and the jobs that import this
module (plan with a local model, evaluate without tracking) often do not need it; so is the cost model's module
(torch): a job's settings and options (`shardwise publish --help`) are built without either. Loading a registered version
(`models:/<name>@<alias>`, `models:/<name>/<version>`) finds the version (of a tracking server over its REST API
without MLflow, of any other store with MLflow's client) and uses the local copy in the cache when it has one
(`mlflow_registry`); MLflow downloads it the first time.

A tracking server is asked whether it is up (`/health`, within `service_timeout_s()`) before MLflow's first call
to it, and MLflow's HTTP retries are bounded while the service works (unless $MLFLOW_HTTP_REQUEST_* say
otherwise; `mlflow_process`): a server that is down is one line in seconds, not minutes of retries and a wrong
"not found"."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse

from shardwise.errors import ServiceError, ShardwiseError, redacted

from . import promotion as gate
from .mlflow_process import (
    PARAM_CHARS,
    bounded,
    check_servers,
    first_line,
    local_store_missing,
    local_store_path,
    mlflow_metrics,
    mlflow_params,
    open_client,
    process_uris,
    quiet_mlflow_prints,
    server_failure,
)
from .mlflow_registry import (
    MODELS_URI,
    READY,
    ModelCache,
    RegisteredVersion,
    RegistryError,
    StoreError,
    cached_version,
    champion_uri,
    cost_model_name,
    find_version,
    model_name,
    policy_name,
    registry_key,
)
from .promotion import CHALLENGER, CHAMPION, GATE_SETTLE_S, Promotion

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from shardwise.costmodel import TrainConfig, TrainingReport
    from shardwise.costmodel.model import NeuralCostModel

#: what callers import from here, the gate's names (`promotion`) and the hardening's (`mlflow_process`) among them
__all__ = ["CHALLENGER", "CHAMPION", "COST_MODEL_GUARD_METRIC", "COST_MODEL_METRIC", "DEFAULT_TRACKING_URI",
           "FILES_PATH", "GATE_SETTLE_S", "MODEL_NAME", "PARAM_CHARS", "POLICY_EXPERIMENT", "POLICY_FILE",
           "POLICY_METRIC", "POLICY_PATH", "PRETRAIN_EXPERIMENT", "LoggedRun", "MlflowService", "Promotion", "RegistryError", "StoreError",
           "champion_uri", "cost_model_name", "local_store_path", "policy_name", "redacted"]

T = TypeVar("T")

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
PRETRAIN_EXPERIMENT = "shardwise-pretrain"
POLICY_EXPERIMENT = "shardwise-policies"
COST_MODEL_METRIC = "heldout_mape_pct"  # lower is better: MAPE of total compute ms on held-out tables
COST_MODEL_GUARD_METRIC = "heldout_top_decile_mape_pct"  # no worse than the champion's: the costliest tenth's MAPE
POLICY_METRIC = "validation_plan_cost"  # lower is better: mean predicted plan cost on validation tasks
MODEL_NAME = "model"  # the pyfunc model's name within a pretraining run
FILES_PATH = "cost_model"  # the cost model's weights + JSON as plain run artifacts (`runs:/<id>/cost_model`)
POLICY_PATH = "policy"  # the policy directory as run artifacts (`runs:/<id>/policy`); a version's source
POLICY_FILE = "policy.json"

@dataclass(frozen=True)
class LoggedRun:
    """A logged run, the URI of what it logged, and (if registered) the gate's outcome."""

    run_id: str
    model_uri: str | None
    promotion: Promotion | None


def _how_to_register(name: str | None) -> str:
    if name and name.startswith("shardwise-plan-"):  # plan_registry.plan_name's
        return "plan and register one with `shardwise publish --task TASK` (the pipeline's publish step runs it)"
    if name and name.startswith("shardwise-policy-"):
        method = name.removeprefix("shardwise-policy-").split("-", 1)[0]
        return f"train one with `shardwise train-policy --method {method} ...` or pass a policy directory"
    return ("register one with `make run` (the local pipeline) or `shardwise pretrain --data costs.parquet ...`, "
            "or pass a model directory")


class MlflowService:
    """One MLflow tracking store and model registry: runs, registered versions, aliases, loading."""

    def __init__(self, tracking_uri: str | None = None, registry_uri: str | None = None) -> None:
        self.tracking_uri: str = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
        self.registry_uri: str = registry_uri or os.environ.get("MLFLOW_REGISTRY_URI") or self.tracking_uri
        self._servers_checked = False

    def __repr__(self) -> str:
        return f"MlflowService(tracking_uri={redacted(self.tracking_uri)!r}, registry_uri={redacted(self.registry_uri)!r})"

    def stores(self) -> str:
        """The tracking store and, where another, the registry, as errors name them (credentials redacted)."""
        if self.registry_uri == self.tracking_uri:
            return redacted(self.tracking_uri)
        return f"{redacted(self.tracking_uri)} (registry {redacted(self.registry_uri)})"

    def store_exists(self) -> bool:
        """False when the tracking or registry store is an embedded sqlite file (or file store) that does not
        exist: looking in it would create it."""
        return not (local_store_missing(self.tracking_uri) or local_store_missing(self.registry_uri))

    @bounded
    def local_folders(self) -> list[Path]:
        """The folders on this machine the store keeps its data in: an embedded store's own folder and its
        experiments' local artifact folders (none for a server or an object store)."""
        folders = []
        for uri in {self.tracking_uri, self.registry_uri}:
            path = local_store_path(uri)
            if path is not None:
                folders.append(path.resolve().parent if urlparse(uri).scheme == "sqlite" else path.resolve())
        if folders and self.store_exists():
            for experiment in self._client().search_experiments():
                path = local_store_path(experiment.artifact_location)
                if path is not None:
                    folders.append(path.resolve())
        return folders

    def _client(self) -> MlflowClient:
        self._check_servers()  # before importing MLflow: a server that is down is said in seconds
        return open_client(self.tracking_uri, self.registry_uri, self.stores())

    def _check_servers(self) -> None:
        """A one-line ServiceError now, within the service timeout, if a tracking or registry server is down
        (once per service: MLflow's own calls follow)."""
        if not self._servers_checked:
            check_servers(self.tracking_uri, self.registry_uri)
            self._servers_checked = True

    def _failure(self, uri: str, err: Exception) -> ShardwiseError:
        """What an MLflow error while fetching `uri` means: a server that cannot be reached or refused who asked
        (a ServiceError), else what the store answered is not there (a RegistryError)."""
        failure = server_failure(uri, err, self.tracking_uri, self.registry_uri, self.stores())
        if failure is not None:
            return failure
        text = redacted(first_line(err))
        return RegistryError(f"{uri}: not found in {self.stores()} ({text}); {_how_to_register(model_name(uri))}")

    # -- loading ------------------------------------------------------------------------------------------------
    @bounded
    def load(self, uri: str | Path, load_dir: Callable[[Path], T]) -> T:
        """`load_dir(local directory)` for a directory, "models:/<name>@<alias>", "models:/<name>/<version>",
        a logged model's "models:/<id>", "runs:/<id>/<path>" or an artifact URI. A registered version (the
        first two) is found (`_version`) and read from the local cache (MLflow downloads it there the first time);
        any other download lives while `load_dir` runs."""
        uri = str(uri)
        if Path(uri).exists():
            return load_dir(Path(uri))
        scheme = urlparse(uri).scheme
        if len(scheme) < 2:  # no scheme (or a Windows drive letter): meant as a local directory
            raise RegistryError(f"{uri}: no such directory, and not a models:/ or runs:/ URI; {_how_to_register(None)}")
        if scheme in ("models", "runs"):
            self._check_store_exists(uri)
        match = MODELS_URI.match(uri) if scheme == "models" else None
        if match is not None and (match["alias"] is not None or match["version"] is not None):
            return self._load_version(uri, match["name"], match["alias"], match["version"], match["path"], load_dir)
        self._check_servers()  # before importing MLflow: a server that is down is said in seconds
        from mlflow.exceptions import MlflowException  # heavy: only when resolving a URI

        with tempfile.TemporaryDirectory(prefix="shardwise-mlflow-") as tmp:
            try:
                local = self._download(uri, tmp)
            except (MlflowException, OSError) as err:
                raise self._failure(uri, err) from None
            return load_dir(Path(local))

    def _check_store_exists(self, uri: str) -> None:
        """A RegistryError naming `uri` where the store is a local file that does not exist (looking would make it)."""
        if not self.store_exists():
            raise RegistryError(
                f"{uri}: no MLflow store at {self.stores()} (the file does not exist); "
                f"{_how_to_register(model_name(uri))}, or pass --tracking-uri of the store that has it"
            )

    def _load_version(self, uri: str, name: str, alias: str | None, version: str | None, path: str | None,
                      load_dir: Callable[[Path], T]) -> T:
        """`load_dir` on a registered version's files from the cache, downloaded into it when absent."""
        ref = self._version(uri, name, alias, version)
        cache = ModelCache()
        files = cache.get(ref)
        if files is None and not cache.writable():  # no cache here (a read-only home): a download per use
            with tempfile.TemporaryDirectory(prefix="shardwise-mlflow-") as tmp:
                self._fetch(uri, ref, Path(tmp) / "files")
                return load_dir(Path(tmp) / "files" / (path or "").lstrip("/"))
        if files is None:
            cache.clear_stale_temporaries()
            files = cache.put(ref, lambda target: self._fetch(uri, ref, target))
        return load_dir(files / (path or "").lstrip("/"))

    @bounded
    def registered_version(self, name: str, *, alias: str | None = None,
                           version: str | None = None) -> RegisteredVersion:
        """The version `alias` (or number `version`) of `name`: what the local cache keys its files by."""
        if (alias is None) == (version is None):
            raise ValueError("registered_version: pass one of alias and version")
        uri = f"models:/{name}@{alias}" if alias is not None else f"models:/{name}/{version}"
        self._check_store_exists(uri)
        return self._version(uri, name, alias, version)

    def _version(self, uri: str, name: str, alias: str | None, version: str | None) -> RegisteredVersion:
        """The version `uri` names: of a tracking server, asked over its REST API without MLflow; of any other store
        (an embedded sqlite file among them), through MLflow's client, which alone reads its tables (an embedded
        store's answer kept in the local cache until its file changes: `cached_version`)."""
        try:
            found = find_version(self.registry_uri, name, alias=alias, version=version)
        except RegistryError as err:
            raise RegistryError(f"{uri}: not found in {self.stores()} ({err}); {_how_to_register(name)}") from None
        except ServiceError as err:  # the same one line, saying what was being looked up
            raise type(err)(f"{uri}: {err}") from None
        if found is not None:
            return found
        return cached_version(self.registry_uri, name, alias, version,
                              lambda: self._client_version(uri, name, alias, version))

    def _client_version(self, uri: str, name: str, alias: str | None, version: str | None) -> RegisteredVersion:
        """The version `uri` names, asked of MLflow's client."""
        from mlflow.exceptions import MlflowException  # heavy: a store only MLflow's client reads

        client = self._client()
        try:
            got = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, str(version))
        except MlflowException as err:
            raise self._failure(uri, err) from None
        if got.status != READY:
            raise RegistryError(f"{uri}: {name} version {got.version} is {got.status}, not ready; wait for its "
                                "registration to finish, or register it again")
        return RegisteredVersion(registry_key(self.registry_uri), name, str(got.version), str(got.source or ""),
                                 int(got.creation_timestamp or 0))

    def _fetch(self, uri: str, ref: RegisteredVersion, target: Path) -> None:
        """Download `ref`'s files to the directory `target` (which must not exist)."""
        from mlflow.exceptions import MlflowException  # heavy: only when the cache lacks the version

        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".download-", dir=target.parent) as tmp:
            try:
                local = Path(self._download(f"models:/{ref.name}/{ref.version}", tmp))
            except (MlflowException, OSError) as err:
                raise self._failure(uri, err) from None
            if local.is_dir():
                os.rename(local, target)
            else:  # a version whose source is one file
                target.mkdir()
                os.rename(local, target / local.name)

    def _download(self, uri: str, dst: str) -> str:
        import mlflow  # heavy: only when downloading

        self._check_servers()
        if uri.startswith("models:"):
            uri = self._resolve_models_uri(uri)
        # MLflow's progress bar off unless asked for: a training job loading its plan or model keeps a quiet console
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        return str(mlflow.artifacts.download_artifacts(
            artifact_uri=uri, dst_path=dst, tracking_uri=self.tracking_uri, registry_uri=self.registry_uri
        ))

    def _resolve_models_uri(self, uri: str) -> str:
        """The artifact location behind a models:/ URI, found with this service's stores. (mlflow 3.17's own
        `download_artifacts` resolves models:/ with the process-wide registry URI whatever registry_uri it is
        given, and a registered version's source is itself a logged model's models:/m-... URI.)"""
        client = self._client()
        original = uri
        for _ in range(4):  # a version's source may be a models:/ URI again; never loop forever
            if not uri.startswith("models:"):
                return uri
            match = MODELS_URI.match(uri)
            if match is None:
                raise RegistryError(
                    f"{original}: not a models:/ URI shardwise can resolve; expected models:/<name>@<alias>, "
                    f"models:/<name>/<version> or models:/<model id>"
                )
            name, alias, version, path = match["name"], match["alias"], match["version"], match["path"] or ""
            if alias is not None:
                version = str(client.get_model_version_by_alias(name, alias).version)
            if version is not None:
                location = client.get_model_version_download_uri(name, version)
            else:  # models:/<model id>: a logged model (what pyfunc.log_model returns)
                location = client.get_logged_model(name).artifact_location
            uri = location.rstrip("/") + path
        raise RegistryError(f"{original}: models:/ URIs point at each other more than 4 deep in {self.stores()}")

    def load_cost_model(self, uri: str | Path, device: str = "cpu") -> NeuralCostModel:
        """A ready cost model from a directory, "models:/<name>@<alias>", "models:/<name>/<version>" or
        "runs:/<id>/cost_model"."""
        from shardwise.costmodel.model import NeuralCostModel  # torch: only when a model is loaded

        return self.load(uri, lambda root: NeuralCostModel.load(_find_cost_model_dir(root), device=device))

    # -- runs ---------------------------------------------------------------------------------------------------
    @contextmanager
    def _run(self, experiment: str, run_name: str | None) -> Iterator[Any]:
        """An active MLflow run in `experiment` of this store (the fluent API points here only inside)."""
        import mlflow  # heavy: only when logging

        client = self._client()
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(experiment)
        with quiet_mlflow_prints(), process_uris(self.tracking_uri, self.registry_uri), mlflow.start_run(
            experiment_id=experiment_id, run_name=run_name
        ) as run:
            yield run

    @bounded
    def log_run(
        self,
        *,
        experiment: str,
        run_name: str,
        params: Mapping[str, Any],
        metrics: Mapping[str, float],
        artifacts_dir: str | Path | None = None,
        artifact_path: str | None = None,
    ) -> str:
        """One run with params (stringified), finite metrics and a directory of artifacts; its run id."""
        import mlflow  # heavy: only when logging

        with self._run(experiment, run_name) as run:
            mlflow.log_params(mlflow_params(params))
            mlflow.log_metrics(mlflow_metrics(metrics))
            if artifacts_dir is not None:
                mlflow.log_artifacts(str(artifacts_dir), artifact_path=artifact_path)
            return str(run.info.run_id)

    @bounded
    def log_cost_model(
        self,
        model: NeuralCostModel,
        report: TrainingReport,
        *,
        config: TrainConfig | None = None,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        register: bool = True,
    ) -> LoggedRun:
        """Log params, metrics, `tags`, the evaluation table and the model (a pyfunc, and its files at
        `cost_model/`); register it as `shardwise-cost-<kind>` and gate `champion` on held-out MAPE, guarded by the
        MAPE over the costliest tenth of the same shards (no worse than the champion's)."""
        import mlflow  # heavy: only when logging

        # scipy and pandas: only when logging (the plan path never imports them)
        from shardwise.costmodel.evaluate import format_table, heldout_metrics

        from . import mlflow_pyfunc  # imports mlflow.pyfunc at the top

        logged: dict[str, Any] = {
            "seed": report.seed,
            "hardware_kind": report.hardware_kind,
            "batch_size": report.batch_size,
            "heldout_num_tables": list(report.heldout_num_tables),
            "heldout_sources": len(report.heldout_sources),
            **{f"n_{k}": v for k, v in report.sizes.items()},
            **(config.model_dump(exclude={"holdout_sources", "progress"}) if config else {}),
            **(params or {}),
        }
        name = cost_model_name(report.hardware_kind)
        with tempfile.TemporaryDirectory(prefix="shardwise-log-") as tmp, self._run(PRETRAIN_EXPERIMENT, None) as run:
            mlflow.log_params(mlflow_params(logged))
            mlflow.set_tags(dict(tags or {}))
            mlflow.log_metrics(mlflow_metrics({**report.metrics, "epochs_run": report.epochs_run,
                                               "best_val_log_mse": report.best_val_loss}))
            mlflow.log_text(report.evaluation.to_csv(index=False), "evaluation/evaluation.csv")
            mlflow.log_text(format_table(report.evaluation) + "\n", "evaluation/evaluation.txt")
            model_dir = model.save(Path(tmp) / FILES_PATH)
            mlflow.log_artifacts(str(model_dir), FILES_PATH)
            info = mlflow_pyfunc.log_pyfunc(MODEL_NAME, model_dir, Path(tmp),
                                            registered_model_name=name if register else None)
            run_id = str(run.info.run_id)
        if not register:
            return LoggedRun(run_id, info.model_uri, None)

        @functools.cache
        def champion_metrics(uri: str) -> dict[str, float] | None:
            champion = self.load_cost_model(uri)
            # a champion profiled at another batch size is not comparable: the newer model (this batch size) wins
            if champion.batch_size != model.batch_size:
                return None
            # the held-out shards are in the new model's units: a champion calibrated at another reference time
            # is compared in them (else a slower reference on the day decides, not the models)
            scale = model.reference_ms / champion.reference_ms if model.reference_ms and champion.reference_ms else 1.0
            return heldout_metrics(champion, report.test, scale)

        def champion_value(key: str) -> Callable[[str], float | None]:
            return lambda uri: None if (found := champion_metrics(uri)) is None else found[key]

        new = heldout_metrics(model, report.test)
        top_decile = gate.Guard(COST_MODEL_GUARD_METRIC, new["top_decile_mape_pct"],
                                champion_value("top_decile_mape_pct"))
        promotion = self.promote(
            name, str(info.registered_model_version), metric=COST_MODEL_METRIC, new_value=new["mape_pct"],
            champion_value=champion_value("mape_pct"), guards=(top_decile,),
        )
        return LoggedRun(run_id, info.model_uri, promotion)

    @bounded
    def log_policy(
        self,
        policy_dir: Path,
        *,
        method: str,
        hardware_kind: str,
        history: list[dict[str, float]],
        params: Mapping[str, Any],
        validation_cost: float,
        register: bool = True,
        champion_value: Callable[[str], float | None] | None = None,
    ) -> LoggedRun:
        """Log a saved policy directory, its training curve, params and validation plan cost; register it as
        `shardwise-policy-<method>-<kind>` and gate `champion` on the validation plan cost. `champion_value`
        plans the same validation tasks with the champion at a models:/ URI (None: not comparable)."""
        import mlflow  # heavy: only when logging

        policy_dir = Path(policy_dir)
        if not (policy_dir / POLICY_FILE).is_file():
            raise ShardwiseError(f"{policy_dir}: no {POLICY_FILE} (not a saved placement policy); nothing logged")
        with self._run(POLICY_EXPERIMENT, f"train-{method}") as run:
            mlflow.log_params(mlflow_params({"method": method, "hardware_kind": hardware_kind, **params}))
            for step, row in enumerate(history):
                mlflow.log_metrics(mlflow_metrics(row), step=step)
            mlflow.log_text(json.dumps(history, indent=1), "training/history.json")  # with any NaN
            mlflow.log_metrics(mlflow_metrics({POLICY_METRIC: validation_cost}))
            mlflow.log_artifacts(str(policy_dir), POLICY_PATH)
            run_id, artifact_uri = str(run.info.run_id), str(run.info.artifact_uri)
        model_uri = f"runs:/{run_id}/{POLICY_PATH}"
        if not register:
            return LoggedRun(run_id, model_uri, None)
        name = policy_name(method, hardware_kind)
        version = self.register_version(name, f"{artifact_uri}/{POLICY_PATH}", run_id,
                                        description=f"shardwise {method} placement policy for {hardware_kind}")
        promotion = self.promote(name, version, metric=POLICY_METRIC, new_value=validation_cost,
                                 champion_value=champion_value)
        return LoggedRun(run_id, model_uri, promotion)

    @bounded
    def register_version(self, name: str, source: str, run_id: str, *, description: str,
                         tags: Mapping[str, str] | None = None) -> str:
        """A new version of registered model `name` (created where missing) from a run's artifacts at `source`,
        with `tags`; no alias yet (the gate gives one)."""
        from mlflow.exceptions import MlflowException  # heavy: only when registering

        client = self._client()
        try:
            client.get_registered_model(name)
        except MlflowException:
            client.create_registered_model(name, description=description)
        return str(client.create_model_version(name, source=source, run_id=run_id, tags=dict(tags or {})).version)

    @bounded
    def artifact_uri(self, run_id: str) -> str:
        """Where run `run_id` keeps its artifacts."""
        return str(self._client().get_run(run_id).info.artifact_uri)

    # -- the promotion gate -------------------------------------------------------------------------------------
    @bounded
    def promote(
        self,
        name: str,
        version: str,
        *,
        metric: str,
        new_value: float,
        champion_value: Callable[[str], float | None] | None,
        min_gain: float = 0.0,
        guards: Sequence[gate.Guard] = (),
    ) -> Promotion:
        """Give `version` the `champion` alias if its `metric` (lower is better) beats the champion's by more than
        `min_gain` of it (and it is no worse on each of `guards`), else `challenger`, keeping the evidence on the
        version and its run (`promotion.promote` says how)."""
        return gate.promote(self._client(), name, version, metric=metric, new_value=new_value,
                           champion_value=champion_value, stores=self.stores(), min_gain=min_gain, guards=guards)


def _find_cost_model_dir(root: Path) -> Path:
    from shardwise.costmodel.model import CONFIG_FILE, ModelFileError  # torch: where a model is looked for

    if (root / CONFIG_FILE).is_file():
        return root
    found = sorted(root.rglob(CONFIG_FILE))
    if not found:
        raise ModelFileError(f"{root}: no {CONFIG_FILE} found (not a shardwise cost model)")
    if len(found) > 1:  # never pick one silently
        dirs = ", ".join(str(f.parent.relative_to(root)) for f in found[:4])
        raise RegistryError(f"{root}: {len(found)} cost models inside ({dirs}); pass the one you mean")
    return found[0].parent
