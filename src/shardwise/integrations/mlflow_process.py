"""The MLflow client and the process around it made quiet, bounded in time and safe.

MLflow reads its settings from the process: its tracking and registry URIs are process-wide (the fluent API reads
only those), its HTTP retries and telemetry come from the environment, and it prints its own lines. Each is set
for a block and put back after (`process_uris`, `_bounded_http`, `quiet_mlflow_prints`). A tracking server is
asked whether it is up before MLflow's first call to it (`check_servers`), and one that is down, refuses who asks
or stops answering is one ServiceError line (`server_failure`, `bounded`), not minutes of retries. An embedded
sqlite store is made whole or not at all (`_create_sqlite_store`); a database store whose driver is missing or
that does not answer is one StoreError (`open_client`). What MLflow is given is what it takes (`mlflow_params`,
`mlflow_metrics`)."""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, runtime_checkable
from urllib.parse import urlparse

from shardwise.errors import (
    ServiceError,
    ServiceUnauthorisedError,
    ServiceUnreachableError,
    ShardwiseError,
    redacted,
    service_timeout_s,
)
from shardwise.extras import needs_extras

from .mlflow_registry import NOT_FOUND_CODES, StoreError, check_server

if TYPE_CHECKING:
    from mlflow import MlflowClient

T = TypeVar("T")
P = ParamSpec("P")

PARAM_CHARS = 500  # MLflow's limit on a param value's length (older servers)


def first_line(err: BaseException) -> str:
    """An error's first line (its type's name where it has no message)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def mlflow_metrics(values: Mapping[str, Any]) -> dict[str, float]:
    """The values MLflow takes as metrics: finite numbers (not booleans), as floats."""
    return {k: float(v) for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


def mlflow_params(values: Mapping[str, Any]) -> dict[str, str]:
    """The values as MLflow takes params: strings of at most PARAM_CHARS."""
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


def local_store_missing(uri: str) -> bool:
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


#: pip package that provides a missing database driver module (sqlalchemy's default drivers)
_DRIVER_PACKAGES = {"psycopg": "'psycopg[binary]'", "psycopg2": "psycopg2-binary", "MySQLdb": "mysqlclient",
                    "pymysql": "pymysql", "pyodbc": "pyodbc"}


def open_client(tracking_uri: str, registry_uri: str, stores: str) -> MlflowClient:
    """An MLflow client of these stores, an embedded sqlite store made first where it does not exist; a database
    store whose driver is not installed or that does not answer is one StoreError naming `stores`."""
    from mlflow import MlflowClient  # heavy: only when talking to a store

    try:
        for uri in {tracking_uri, registry_uri}:
            _create_sqlite_store(uri)
        return MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri)
    except ModuleNotFoundError as err:  # a database store whose driver is not installed
        raise StoreError(
            f"the MLflow store {stores} needs the Python package {err.name!r}, which is not installed "
            f"(pip install {_DRIVER_PACKAGES.get(str(err.name), err.name)})"
        ) from None
    except Exception as err:  # sqlalchemy's OperationalError and friends: the database did not answer
        if type(err).__module__.startswith("sqlalchemy"):
            hint = ""
            if any(u.startswith("sqlite:") for u in (tracking_uri, registry_uri)) and any(
                    sign in str(err) for sign in _HALF_BUILT):
                hint = ("; its tables are half made (a process killed while MLflow created or upgraded it): a store "
                        "that was new holds no runs, move it aside and run again; else restore it from a backup")
            raise StoreError(f"cannot open the MLflow store {stores}: {redacted(first_line(err))}"
                             f"{hint}") from None
        raise


@contextmanager
def process_uris(tracking_uri: str, registry_uri: str) -> Iterator[None]:
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
def quiet_mlflow_prints() -> Iterator[None]:
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


@runtime_checkable
class _Service(Protocol):
    """What `bounded` wraps the methods of (`MlflowService`): it names its stores."""

    def stores(self) -> str: ...


def bounded(method: Callable[P, T]) -> Callable[P, T]:
    """`method` with MLflow's HTTP retries bounded while it runs (`_bounded_http`); a tracking server that stops
    answering while it runs is one ServiceUnreachableError, and MLflow not installed one MissingExtraError, not
    MLflow's traceback."""

    @wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        with _bounded_http():
            try:
                with needs_extras():  # mlflow (or boto3 for its S3 artifacts) not installed: the extra to add
                    return method(*args, **kwargs)
            except ShardwiseError:
                raise
            except Exception as err:
                service = args[0]
                text = redacted(first_line(err))
                if not (isinstance(service, _Service) and _UNANSWERED.search(text)
                        and type(err).__module__.split(".")[0] in ("mlflow", "requests", "urllib3")):
                    raise
                raise ServiceUnreachableError(
                    f"the MLflow server {service.stores()} stopped answering during {method.__name__} ({text}); "
                    "an alias moves only once a version's files and the gate's evidence are stored, so the "
                    "champion is as it was or whole: rerun to finish"
                ) from None

    return call


def check_servers(tracking_uri: str, registry_uri: str) -> None:
    """A one-line ServiceError now, within the service timeout, if the tracking or registry server is down."""
    servers = {tracking_uri: "the MLflow tracking server"}
    servers.setdefault(registry_uri, "the MLflow model registry")
    for uri, service in servers.items():
        if urlparse(uri).scheme in ("http", "https"):
            check_server(uri, service)


def server_failure(uri: str, err: Exception, tracking_uri: str, registry_uri: str, stores: str) -> ServiceError | None:
    """The ServiceError an MLflow error while fetching `uri` means where the server `stores` could not be reached,
    refused who asked or failed; None where the store answered that `uri` is not there."""
    text = redacted(first_line(err))
    code = str(getattr(err, "error_code", ""))
    remote = any(urlparse(u).scheme in ("http", "https") for u in (tracking_uri, registry_uri))
    if code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        return ServiceUnauthorisedError(
            f"{uri}: the MLflow server {stores} refused the request as not authorised ({text}); set "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)")
    if _UNANSWERED.search(str(err)):  # MLflow's HTTP client gave up (on a download: in a later line)
        return ServiceUnreachableError(f"{uri}: the MLflow server {stores} did not answer ({text})")
    if remote and code not in NOT_FOUND_CODES and not isinstance(err, OSError):
        return ServiceError(f"{uri}: the MLflow server {stores} failed ({text})")
    return None
