"""MLflow, wrapped once: log a run, register a version and gate its promotion, load by URI or alias.

`MlflowService` holds one tracking URI and one registry URI and passes both to every MLflow call, so a store
named on the command line reaches the model registry too. Cost models and placement policies go through the
same promotion gate (`promote`): a new version takes the `champion` alias only on measured evidence, and the
evidence (metric, both values, the champion it was compared with, the decision) is kept as tags on the model
version and as metrics and tags on its run.

`mlflow` is imported inside the methods that use it: it takes seconds to import, and the jobs that import this
module (plan with a local model, evaluate without tracking) often do not need it. Loading a registered version
(`models:/<name>@<alias>`, `models:/<name>/<version>`) finds the version without MLflow and uses the local copy
in the cache when it has one (`mlflow_registry`); MLflow downloads it the first time.

A tracking server is asked whether it is up (`/health`, within `service_timeout_s()`) before MLflow's first call
to it, and MLflow's HTTP retries are bounded while the service works (unless $MLFLOW_HTTP_REQUEST_* say
otherwise): a server that is down is one line in seconds, not minutes of retries and a wrong "not found"."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar
from urllib.parse import urlparse

from shardwise.costmodel.model import CONFIG_FILE, ModelFileError, NeuralCostModel
from shardwise.errors import (
    ServiceError,
    ServiceUnauthorisedError,
    ServiceUnreachableError,
    ShardwiseError,
    redacted,
    service_timeout_s,
)

from .mlflow_registry import (
    NOT_FOUND_CODES,
    ModelCache,
    RegisteredVersion,
    RegistryError,
    StoreError,
    check_server,
    find_version,
    registry_key,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from shardwise.costmodel import TrainConfig, TrainingReport

T = TypeVar("T")
P = ParamSpec("P")

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
CHAMPION = "champion"
CHALLENGER = "challenger"
PRETRAIN_EXPERIMENT = "shardwise-pretrain"
POLICY_EXPERIMENT = "shardwise-policies"
COST_MODEL_METRIC = "heldout_mape_pct"  # lower is better: MAPE of total compute ms on held-out tables
POLICY_METRIC = "validation_plan_cost"  # lower is better: mean predicted plan cost on validation tasks
MODEL_NAME = "model"  # the pyfunc model's name within a pretraining run
FILES_PATH = "cost_model"  # the cost model's weights + JSON as plain run artifacts (`runs:/<id>/cost_model`)
POLICY_PATH = "policy"  # the policy directory as run artifacts (`runs:/<id>/policy`); a version's source
POLICY_FILE = "policy.json"
PARAM_CHARS = 500  # MLflow's limit on a param value's length (older servers)

# models-from-code: MLflow stores this script with the model instead of a pickled Python object
_PYFUNC_SCRIPT = """\
import mlflow
from shardwise.integrations.mlflow_pyfunc import CostModelPyfunc

mlflow.models.set_model(CostModelPyfunc())
"""

# models:/<name>@<alias>[/path], models:/<name>/<version>[/path], or a logged model's models:/<model id>[/path]
_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))?(?P<path>/.*)?$")


def cost_model_name(hardware_kind: str) -> str:
    """Registry name of the cost model for one hardware kind."""
    return f"shardwise-cost-{hardware_kind}"


def policy_name(method: str, hardware_kind: str) -> str:
    """Registry name of a placement policy for one method and hardware kind."""
    return f"shardwise-policy-{method}-{hardware_kind}"


def champion_uri(name: str) -> str:
    """`models:/<name>@champion`: what planning uses unless told otherwise."""
    return f"models:/{name}@{CHAMPION}"


@dataclass(frozen=True)
class Promotion:
    """Where a new version landed and the evidence that decided it (lower `metric` is better)."""

    name: str
    version: str
    alias: str
    metric: str
    new_value: float
    champion_version: str | None
    champion_value: float | None
    reason: str = ""


@dataclass(frozen=True)
class LoggedRun:
    """A logged run, the URI of what it logged, and (if registered) the gate's outcome."""

    run_id: str
    model_uri: str | None
    promotion: Promotion | None




#: pip package that provides a missing database driver module (sqlalchemy's default drivers)
_DRIVER_PACKAGES = {"psycopg": "'psycopg[binary]'", "psycopg2": "psycopg2-binary", "MySQLdb": "mysqlclient",
                    "pymysql": "pymysql", "pyodbc": "pyodbc"}


def _how_to_register(name: str | None) -> str:
    if name and name.startswith("shardwise-policy-"):
        method = name.removeprefix("shardwise-policy-").split("-", 1)[0]
        return f"train one with `shardwise train-policy --method {method} ...` or pass a policy directory"
    return ("register one with `make run` (the local pipeline) or `shardwise pretrain --data costs.parquet ...`, "
            "or pass a model directory")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _finite(values: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


def _params(values: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v)[:PARAM_CHARS] for k, v in values.items()}


def local_store_path(uri: str) -> Path | None:
    """The file or folder of an embedded store or a local artifact location (sqlite file, file: URI, plain path);
    None for a server, an object store or an in-memory database."""
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        path = uri.removeprefix("sqlite://").split("?", 1)[0]
        path = path[1:] if path.startswith("/") else path  # sqlite:///rel.db -> rel.db; sqlite:////abs -> /abs
        return None if path in ("", ":memory:") else Path(path)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if not parsed.scheme or len(parsed.scheme) == 1:  # a plain path (or a Windows drive)
        return Path(uri)
    return None


def _local_store_missing(uri: str) -> bool:
    """True for an embedded store (sqlite file, file-store directory) that does not exist: opening it would
    create it."""
    path = local_store_path(uri)
    if path is None:
        return False
    return not (path.is_file() if urlparse(uri).scheme == "sqlite" else path.is_dir())


#: what MLflow's migrations say when they meet a schema a killed process left half made
_HALF_BUILT = ("already exists", "duplicate column name")


def _create_sqlite_store(uri: str) -> None:
    """An embedded sqlite store that does not exist yet, made whole or not at all. MLflow makes its tables and runs
    its migrations in the file itself, and a process killed meanwhile (a pipeline step SIGKILLed in its first
    seconds) left a half-made schema that every later open refused ("table latest_metrics already exists"): the
    schema is made in a temporary file beside the store and linked into place, never over a store that another
    process made meanwhile."""
    path = local_store_path(uri) if urlparse(uri).scheme == "sqlite" else None
    if path is None or path.exists():
        return
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore  # makes all of MLflow's tables

    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.creating"):  # left by a process killed while making it
        with suppress(FileNotFoundError):  # another process's, gone meanwhile
            if time.time() - stale.stat().st_mtime > 3600:
                stale.unlink()
    temporary = path.with_name(f".{path.name}.{os.getpid()}-{time.monotonic_ns()}.creating")
    try:
        SqlAlchemyStore(f"sqlite:///{temporary.resolve()}").engine.dispose()
        try:
            os.link(temporary, path)  # never over a store another process made first: that fails
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links
            if not path.exists():
                os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


@contextmanager
def _process_uris(tracking_uri: str, registry_uri: str) -> Iterator[None]:
    """Point mlflow's process-wide tracking and registry URIs at these stores for the block, then put back
    exactly what was there. The fluent API (start_run, pyfunc.log_model) reads only those, and
    `mlflow.set_tracking_uri` also writes $MLFLOW_TRACKING_URI, so both the globals and the variables are
    restored."""
    import mlflow  # heavy: only when logging
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    saved_tracking, saved_registry = tracking_utils._tracking_uri, registry_utils._registry_uri
    saved_env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(registry_uri)
    try:
        yield
    finally:
        # None puts it back to unset; any change also resets mlflow's tracer provider
        mlflow.set_tracking_uri(saved_tracking)  # type: ignore[arg-type]
        registry_utils._registry_uri = saved_registry
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def _bounded_http() -> Iterator[None]:
    """MLflow's HTTP retries bounded for the block, where the environment does not set them: MLflow's defaults
    (7 retries, backoff factor 2, 120 s per request) spend 257 s on a server that is down. What the user set in
    the environment is left as it is; the variables are put back after."""
    bounded = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, math.ceil(service_timeout_s()))),
        "AWS_MAX_ATTEMPTS": "3",  # boto3's, for artifacts MLflow reads from an object store itself
        # where MLflow's telemetry cannot reach its endpoint (pods without egress), its thread unsets a variable
        # of os.environ while requests reads the environment: a KeyError failed a registration at random. Read
        # when mlflow is first imported, which the methods of MlflowService do inside this block.
        "MLFLOW_DISABLE_TELEMETRY": "true",
        # shardwise prints its own line for a logged run and a registered version
        "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
    }
    added = [key for key in bounded if key not in os.environ]
    os.environ.update({key: bounded[key] for key in added})
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


@contextmanager
def _quiet_mlflow_prints() -> Iterator[None]:
    """MLflow's own console lines ("Successfully registered model ...", "Created version ...", its log records)
    off for the block where its log level is above INFO (the CLI's default; `-v` keeps them): they repeat what
    shardwise reports, or are progress chatter."""
    level = os.environ.get("MLFLOW_LOGGING_LEVEL", "INFO").upper()
    if level in ("DEBUG", "INFO"):
        yield
        return
    # MLflow's own switch for its event stream (eprint and its loggers), counted so that its nested uses (model
    # logging turns it off and on again) do not turn it back on inside this block
    from mlflow.utils.autologging_utils.logging_and_warnings import MlflowEventsAndWarningsBehaviorGlobally

    with MlflowEventsAndWarningsBehaviorGlobally(disable_event_logs=True, disable_warnings=False,
                                                 reroute_warnings=False):
        yield


#: how MLflow's HTTP client and requests word a server that stopped answering mid-way
_UNANSWERED = re.compile(r"failed with exception|Max retries exceeded|Connection (?:refused|reset|aborted)|"
                         r"RemoteDisconnected|timed out", re.IGNORECASE)


def _bounded(method: Callable[P, T]) -> Callable[P, T]:
    """`method` with MLflow's HTTP retries bounded while it runs (`_bounded_http`); a tracking server that stops
    answering while it runs is one ServiceUnreachableError, not MLflow's traceback."""

    @wraps(method)
    def bounded(*args: P.args, **kwargs: P.kwargs) -> T:
        with _bounded_http():
            try:
                return method(*args, **kwargs)
            except ShardwiseError:
                raise
            except Exception as err:
                service = args[0]
                text = redacted(_first_line(err))
                if not (isinstance(service, MlflowService) and _UNANSWERED.search(text)
                        and type(err).__module__.split(".")[0] in ("mlflow", "requests", "urllib3")):
                    raise
                raise ServiceUnreachableError(
                    f"the MLflow server {service._stores()} stopped answering during {method.__name__} ({text}); "
                    "an alias moves only once a version's files and the gate's evidence are stored, so the "
                    "champion is as it was or whole: rerun to finish"
                ) from None

    return bounded


class MlflowService:
    """One MLflow tracking store and model registry: runs, registered versions, aliases, loading."""

    def __init__(self, tracking_uri: str | None = None, registry_uri: str | None = None) -> None:
        self.tracking_uri: str = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
        self.registry_uri: str = registry_uri or os.environ.get("MLFLOW_REGISTRY_URI") or self.tracking_uri
        self._servers_checked = False

    def __repr__(self) -> str:
        return f"MlflowService(tracking_uri={redacted(self.tracking_uri)!r}, registry_uri={redacted(self.registry_uri)!r})"

    def _stores(self) -> str:
        if self.registry_uri == self.tracking_uri:
            return redacted(self.tracking_uri)
        return f"{redacted(self.tracking_uri)} (registry {redacted(self.registry_uri)})"

    def store_exists(self) -> bool:
        """False when the tracking or registry store is an embedded sqlite file (or file store) that does not
        exist: looking in it would create it."""
        return not (_local_store_missing(self.tracking_uri) or _local_store_missing(self.registry_uri))

    @_bounded
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
        from mlflow import MlflowClient  # heavy: only when talking to a store

        try:
            for uri in {self.tracking_uri, self.registry_uri}:
                _create_sqlite_store(uri)
            return MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.registry_uri)
        except ModuleNotFoundError as err:  # a database store whose driver is not installed
            raise StoreError(
                f"the MLflow store {self._stores()} needs the Python package {err.name!r}, which is not installed "
                f"(pip install {_DRIVER_PACKAGES.get(str(err.name), err.name)})"
            ) from None
        except Exception as err:  # sqlalchemy's OperationalError and friends: the database did not answer
            if type(err).__module__.startswith("sqlalchemy"):
                hint = ""
                if any(u.startswith("sqlite:") for u in (self.tracking_uri, self.registry_uri)) and any(
                        sign in str(err) for sign in _HALF_BUILT):
                    hint = ("; its tables are half made (a process killed while MLflow created or upgraded it): a store "
                            "that was new holds no runs, move it aside and run again; else restore it from a backup")
                raise StoreError(f"cannot open the MLflow store {self._stores()}: {redacted(_first_line(err))}"
                                 f"{hint}") from None
            raise

    def _check_servers(self) -> None:
        """A one-line ServiceError now, within the service timeout, if a tracking or registry server is down
        (once per service: MLflow's own calls follow)."""
        if self._servers_checked:
            return
        servers = {self.tracking_uri: "the MLflow tracking server"}
        servers.setdefault(self.registry_uri, "the MLflow model registry")
        for uri, service in servers.items():
            if urlparse(uri).scheme in ("http", "https"):
                check_server(uri, service)
        self._servers_checked = True

    def _failure(self, uri: str, err: Exception) -> ShardwiseError:
        """What an MLflow error while fetching `uri` means: a server that cannot be reached or refused who asked
        (a ServiceError), else what the store answered is not there (a RegistryError)."""
        text = redacted(_first_line(err))
        code = str(getattr(err, "error_code", ""))
        remote = any(urlparse(u).scheme in ("http", "https") for u in (self.tracking_uri, self.registry_uri))
        if code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
            return ServiceUnauthorisedError(
                f"{uri}: the MLflow server {self._stores()} refused the request as not authorised ({text}); set "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)")
        if _UNANSWERED.search(str(err)):  # MLflow's HTTP client gave up (on a download: in a later line)
            return ServiceUnreachableError(f"{uri}: the MLflow server {self._stores()} did not answer ({text})")
        if remote and code not in NOT_FOUND_CODES and not isinstance(err, OSError):
            return ServiceError(f"{uri}: the MLflow server {self._stores()} failed ({text})")
        return RegistryError(f"{uri}: not found in {self._stores()} ({text}); {_how_to_register(_model_name(uri))}")

    # -- loading ------------------------------------------------------------------------------------------------
    @_bounded
    def load(self, uri: str | Path, load_dir: Callable[[Path], T]) -> T:
        """`load_dir(local directory)` for a directory, "models:/<name>@<alias>", "models:/<name>/<version>",
        a logged model's "models:/<id>", "runs:/<id>/<path>" or an artifact URI. A registered version (the
        first two) is found without MLflow and read from the local cache (MLflow downloads it there the first
        time); any other download lives while `load_dir` runs."""
        uri = str(uri)
        if Path(uri).exists():
            return load_dir(Path(uri))
        scheme = urlparse(uri).scheme
        if len(scheme) < 2:  # no scheme (or a Windows drive letter): meant as a local directory
            raise RegistryError(f"{uri}: no such directory, and not a models:/ or runs:/ URI; {_how_to_register(None)}")
        registry = scheme in ("models", "runs")
        if registry and not self.store_exists():
            raise RegistryError(
                f"{uri}: no MLflow store at {self._stores()} (the file does not exist); "
                f"{_how_to_register(_model_name(uri))}, or pass --tracking-uri of the store that has it"
            )
        match = _MODELS_URI.match(uri) if scheme == "models" else None
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

    def _version(self, uri: str, name: str, alias: str | None, version: str | None) -> RegisteredVersion:
        """The version `uri` names, found without MLflow where the store allows (sqlite, a tracking server)."""
        try:
            found = find_version(self.registry_uri, name, alias=alias, version=version)
        except RegistryError as err:
            raise RegistryError(f"{uri}: not found in {self._stores()} ({err}); {_how_to_register(name)}") from None
        except ServiceError as err:  # the same one line, saying what was being looked up
            raise type(err)(f"{uri}: {err}") from None
        if found is not None:
            return found
        from mlflow.exceptions import MlflowException  # heavy: a store only MLflow reads

        client = self._client()
        try:
            got = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, str(version))
        except MlflowException as err:
            raise self._failure(uri, err) from None
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
            match = _MODELS_URI.match(uri)
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
        raise RegistryError(f"{original}: models:/ URIs point at each other more than 4 deep in {self._stores()}")

    def load_cost_model(self, uri: str | Path, device: str = "cpu") -> NeuralCostModel:
        """A ready cost model from a directory, "models:/<name>@<alias>", "models:/<name>/<version>" or
        "runs:/<id>/cost_model"."""
        return self.load(uri, lambda root: NeuralCostModel.load(_find_cost_model_dir(root), device=device))

    # -- runs ---------------------------------------------------------------------------------------------------
    @contextmanager
    def _run(self, experiment: str, run_name: str | None) -> Iterator[Any]:
        """An active MLflow run in `experiment` of this store (the fluent API points here only inside)."""
        import mlflow  # heavy: only when logging

        client = self._client()
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(experiment)
        with _quiet_mlflow_prints(), _process_uris(self.tracking_uri, self.registry_uri), mlflow.start_run(
            experiment_id=experiment_id, run_name=run_name
        ) as run:
            yield run

    @_bounded
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
            mlflow.log_params(_params(params))
            mlflow.log_metrics(_finite(metrics))
            if artifacts_dir is not None:
                mlflow.log_artifacts(str(artifacts_dir), artifact_path=artifact_path)
            return str(run.info.run_id)

    @_bounded
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
        `cost_model/`); register it as `shardwise-cost-<kind>` and gate `champion` on held-out MAPE."""
        import mlflow  # heavy: only when logging
        import torch
        from mlflow.models import ModelSignature
        from mlflow.types import ColSpec, Schema

        # scipy and pandas: only when logging (the plan path never imports them)
        from shardwise.costmodel.evaluate import format_table, heldout_mape_pct

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
            mlflow.log_params(_params(logged))
            mlflow.set_tags(dict(tags or {}))
            mlflow.log_metrics(_finite({**report.metrics, "epochs_run": report.epochs_run,
                                        "best_val_log_mse": report.best_val_loss}))
            mlflow.log_text(report.evaluation.to_csv(index=False), "evaluation/evaluation.csv")
            mlflow.log_text(format_table(report.evaluation) + "\n", "evaluation/evaluation.txt")
            model_dir = model.save(Path(tmp) / FILES_PATH)
            mlflow.log_artifacts(str(model_dir), FILES_PATH)
            script = Path(tmp) / "cost_model_pyfunc.py"
            script.write_text(_PYFUNC_SCRIPT)
            with warnings.catch_warnings():
                # an input example would make MLflow load and run the model while logging: slow, and the
                # signature below already says what goes in and out
                warnings.filterwarnings("ignore", message=".*input example was not provided.*")
                info = mlflow.pyfunc.log_model(
                    name=MODEL_NAME,
                    python_model=str(script),
                    artifacts={mlflow_pyfunc.ARTIFACT_KEY: str(model_dir)},
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
            run_id = str(run.info.run_id)
        if not register:
            return LoggedRun(run_id, info.model_uri, None)

        def champion_mape(uri: str) -> float | None:
            champion = self.load_cost_model(uri)
            # a champion profiled at another batch size is not comparable: the newer model (this batch size) wins
            if champion.batch_size != model.batch_size:
                return None
            # the held-out shards are in the new model's units: a champion calibrated at another reference time
            # is compared in them (else a slower reference on the day decides, not the models)
            scale = model.reference_ms / champion.reference_ms if model.reference_ms and champion.reference_ms else 1.0
            return heldout_mape_pct(champion, report.test, scale)

        promotion = self.promote(
            name, str(info.registered_model_version), metric=COST_MODEL_METRIC,
            new_value=heldout_mape_pct(model, report.test), champion_value=champion_mape,
        )
        return LoggedRun(run_id, info.model_uri, promotion)

    @_bounded
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
            mlflow.log_params(_params({"method": method, "hardware_kind": hardware_kind, **params}))
            for step, row in enumerate(history):
                mlflow.log_metrics(_finite(row), step=step)
            mlflow.log_text(json.dumps(history, indent=1), "training/history.json")  # with any NaN
            mlflow.log_metrics(_finite({POLICY_METRIC: validation_cost}))
            mlflow.log_artifacts(str(policy_dir), POLICY_PATH)
            run_id, artifact_uri = str(run.info.run_id), str(run.info.artifact_uri)
        model_uri = f"runs:/{run_id}/{POLICY_PATH}"
        if not register:
            return LoggedRun(run_id, model_uri, None)
        from mlflow.exceptions import MlflowException  # heavy: only when registering

        client = self._client()
        name = policy_name(method, hardware_kind)
        try:
            client.get_registered_model(name)
        except MlflowException:
            client.create_registered_model(name, description=f"shardwise {method} placement policy for {hardware_kind}")
        version = client.create_model_version(name, source=f"{artifact_uri}/{POLICY_PATH}", run_id=run_id).version
        promotion = self.promote(name, str(version), metric=POLICY_METRIC, new_value=validation_cost,
                                 champion_value=champion_value)
        return LoggedRun(run_id, model_uri, promotion)

    # -- the promotion gate -------------------------------------------------------------------------------------
    @_bounded
    def promote(
        self,
        name: str,
        version: str,
        *,
        metric: str,
        new_value: float,
        champion_value: Callable[[str], float | None] | None,
    ) -> Promotion:
        """Give `version` the `champion` alias if its `metric` (lower is better) beats the champion's, else
        `challenger`; keep the evidence on the version (tags) and on its run (metrics, tags).

        No champion yet: the new version wins. A champion that cannot be compared (`champion_value` is None or
        returns None for its models:/<name>/<version> URI): the newer version wins. No finite `new_value`
        (nothing to measure it on): `challenger`, a champion is never replaced blindly.

        Runs registering at once, and a server that dies mid-way: the evidence is stored on the version before its
        alias moves (an alias never points at a version the gate did not finish), the champion is read again right
        before the alias moves (one that moved during the comparison is compared with instead), and again
        GATE_SETTLE_S after (a run that moved it in between is compared with, and the better takes it back)."""
        client = self._client()
        version = str(version)
        compared: dict[str, float | None] = {}  # champion version -> its metric (each compared once)

        def decide(current: str | None) -> tuple[bool, str]:
            if current is None:
                return True, "no champion yet"
            if current == version:
                return True, "already the champion"
            if not math.isfinite(new_value):
                return False, f"no {metric} to compare on: a champion is never replaced blindly"
            if current not in compared:
                compared[current] = champion_value(f"models:/{name}/{current}") if champion_value else None
            if compared[current] is None:
                newer = int(version) > int(current)
                return newer, f"champion v{current} is not comparable: the newer version wins"
            wins = new_value < compared[current]  # type: ignore[operator]
            return wins, f"{metric} {new_value:.6g} {'<' if wins else '>='} champion v{current}'s {compared[current]:.6g}"

        current = _champion_version(client, name)
        for _ in range(_GATE_ROUNDS):
            wins, reason = decide(current)
            alias = CHAMPION if wins else CHALLENGER
            evidence = {
                "gate.metric": metric,
                "gate.value": repr(float(new_value)),
                "gate.champion_version": current or "",
                "gate.champion_value": "" if compared.get(current or "") is None else repr(compared[current or ""]),
                "gate.decision": alias,
                "gate.reason": reason,
            }
            for key, value in evidence.items():
                client.set_model_version_tag(name, version, key, value)
            latest = _champion_version(client, name)  # the comparison took seconds: did the champion move?
            if latest != current:
                current = latest
                continue
            client.set_registered_model_alias(name, alias, version)
            if not wins:
                break
            time.sleep(GATE_SETTLE_S)
            latest = _champion_version(client, name)
            if latest == version:
                break
            current = latest  # another run moved it between our read and our write: compare with it
        else:
            raise RegistryError(f"{name} v{version}: the champion kept moving under {_GATE_ROUNDS} comparisons in "
                                f"{self._stores()} (runs registering at once); rerun to compare again")
        champ_value = compared.get(current or "")
        run_id = client.get_model_version(name, version).run_id
        if run_id:
            from mlflow.entities import Metric, RunTag

            metrics = _finite({f"gate_new_{metric}": new_value, f"gate_champion_{metric}": champ_value})
            tags = {**evidence, "registered_name": name, "registered_version": version, "alias": alias}
            client.log_batch(
                run_id,
                metrics=[Metric(k, v, _now_ms(), 0) for k, v in metrics.items()],
                tags=[RunTag(k, v) for k, v in tags.items()],
            )
        return Promotion(name, version, alias, metric, float(new_value), current, champ_value, reason)


#: seconds between moving `champion` and reading it back: longer than another run takes between reading the
#: champion and moving the alias (one request on loopback, tens of ms under load), so a move that overwrote
#: another run's is seen by one of the two
GATE_SETTLE_S = 1.0
_GATE_ROUNDS = 8  # comparisons before giving up on a champion that keeps moving


def _champion_version(client: MlflowClient, name: str) -> str | None:
    """The version `champion` points at; None where the store answered that there is none (any other failure,
    a server that is down included, is raised: never taken for "no champion")."""
    from mlflow.exceptions import MlflowException  # heavy: only when registering

    try:
        return str(client.get_model_version_by_alias(name, CHAMPION).version)
    except MlflowException as err:
        code, text = str(err.error_code), str(err.message).lower()
        if code in NOT_FOUND_CODES or (code == "INVALID_PARAMETER_VALUE" and "not found" in text):
            return None
        raise


def _now_ms() -> int:
    return int(time.time() * 1000)


def _model_name(uri: str) -> str | None:
    match = _MODELS_URI.match(uri)
    return match["name"] if match else None


def _find_cost_model_dir(root: Path) -> Path:
    if (root / CONFIG_FILE).is_file():
        return root
    found = sorted(root.rglob(CONFIG_FILE))
    if not found:
        raise ModelFileError(f"{root}: no {CONFIG_FILE} found (not a shardwise cost model)")
    if len(found) > 1:  # never pick one silently
        dirs = ", ".join(str(f.parent.relative_to(root)) for f in found[:4])
        raise RegistryError(f"{root}: {len(found)} cost models inside ({dirs}); pass the one you mean")
    return found[0].parent


def __getattr__(name: str) -> Any:
    # cost models registered before the pyfunc moved to `mlflow_pyfunc` import it from here
    if name == "CostModelPyfunc":
        from .mlflow_pyfunc import CostModelPyfunc  # imports mlflow: only for those old models

        return CostModelPyfunc
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
