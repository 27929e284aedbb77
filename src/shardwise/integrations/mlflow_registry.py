"""A tracking server's model registry read without MLflow, and the local cache of the versions downloaded from
any registry.

Planning asks the registry one question (which version does `champion` point at?) and needs that version's files.
MLflow answers both but takes seconds to import, so of a tracking server shardwise asks the question itself, over
MLflow's public REST API with urllib and a timeout. A store of any other kind (an embedded sqlite file, a database
server, Databricks) is asked through MLflow's client (`MlflowService`): its tables are MLflow's to read. Every
version downloaded is kept in a local cache keyed by (registry, name, version), so its files are downloaded once.
An embedded sqlite store's answer is kept there too, with its file's stamp (`store_stamp`): until the file changes,
the next plan reads which version `champion` names from the cache, without MLflow (`cached_version`).

The cache lives in $SHARDWISE_CACHE, else $XDG_CACHE_HOME/shardwise, else ~/.cache/shardwise. An entry is written
under a temporary name and renamed into place once whole, with a manifest of its files (size, sha256): concurrent
plans and interrupts never leave half an entry under a real name, and an entry that does not match its manifest,
or whose version changed behind the same number (a store deleted and registered again), is downloaded again.

Faults of a tracking server are one line within `service_timeout_s()`: unreachable, not authorised (401/403),
or failed (another error status); "not found" (a `RegistryError`) only when the server answered that."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardwise.errors import (
    SERVICE_TIMEOUT_ENV,
    ServiceError,
    ServiceUnauthorisedError,
    ServiceUnreachableError,
    ShardwiseError,
    redacted,
    service_timeout_s,
)

CACHE_ENV = "SHARDWISE_CACHE"
ENTRY_FORMAT = "shardwise.cache-entry/v1"
ENTRY_FILE = "entry.json"  #: the manifest, written last: an entry without it is not used
FILES_DIR = "files"  #: the version's files as MLflow downloaded them
ANSWER_FORMAT = "shardwise.cache-answer/v1"
#: a sqlite store written less than this long ago may be written again within its file time's resolution (1 s and
#: more on some file systems) and keep the same stamp: its answers are not kept until its file has been still this
#: long (as git treats an index entry as "racily clean")
STILL_S = 2.0
#: what MLflow calls a version that can be used
READY = "READY"
_REST = "/api/2.0/mlflow"
#: MLflow's error codes for "the server looked and it is not there"
NOT_FOUND_CODES = ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND")


# models:/<name>@<alias>[/path], models:/<name>/<version>[/path], or a logged model's models:/<model id>[/path]
MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))?(?P<path>/.*)?$")


def cost_model_name(hardware_kind: str) -> str:
    """Registry name of the cost model for one hardware kind."""
    return f"shardwise-cost-{hardware_kind}"


def policy_name(method: str, hardware_kind: str) -> str:
    """Registry name of a placement policy for one method and hardware kind."""
    return f"shardwise-policy-{method}-{hardware_kind}"


def champion_uri(name: str) -> str:
    """`models:/<name>@champion`: what planning uses unless told otherwise."""
    return f"models:/{name}@champion"


def model_name(uri: str) -> str | None:
    """The registered name a models:/ URI names (None for another URI)."""
    match = MODELS_URI.match(uri)
    return match["name"] if match else None


class RegistryError(ShardwiseError):
    """A model, version or alias that cannot be found or loaded: names the URI, the store and what to do."""


class StoreError(RegistryError):
    """The tracking or registry store itself cannot be opened (a missing database driver, no answer)."""


@dataclass(frozen=True)
class RegisteredVersion:
    """One version of a registered model, and what identifies its files (the cache's key and stamp)."""

    registry: str  #: the registry, as `registry_key` names it (no credentials)
    name: str
    version: str
    source: str  #: where its files are (a logged model's models:/m-..., an artifact URI)
    created_ms: int  #: its creation time: a store made again at the same place numbers versions from 1 again

    def describe(self) -> str:
        """`name` version `version`, for messages."""
        return f"{self.name} version {self.version}"


def registry_key(uri: str) -> str:
    """The registry's identity for the cache: a sqlite store by its absolute file, a server by scheme, host, port
    and path (without credentials); two registries never share a key."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "sqlite":
        path = sqlite_path(uri)
        return f"sqlite:///{path.resolve()}" if path is not None else uri
    if parsed.scheme in ("http", "https"):
        host = parsed.hostname or ""
        port = f":{parsed.port}" if parsed.port else ""
        return f"{parsed.scheme}://{host.lower()}{port}{parsed.path.rstrip('/')}"
    return redacted(uri)


def sqlite_path(uri: str) -> Path | None:
    """The file of a sqlite:/// store URI (None for an in-memory database)."""
    path = uri.removeprefix("sqlite://").split("?", 1)[0]
    path = path[1:] if path.startswith("/") else path  # sqlite:///rel.db -> rel.db; sqlite:////abs -> /abs
    return None if path in ("", ":memory:") else Path(path)


def find_version(registry_uri: str, name: str, *, alias: str | None = None, version: str | None = None,
                 timeout_s: float | None = None) -> RegisteredVersion | None:
    """The version `alias` (or number `version`) of `name` in a tracking server's registry, asked over its REST API
    without MLflow; None for any other store (MLflow's client reads it). Raises RegistryError when the server says
    it has no such version, and a ServiceError when it cannot be asked."""
    if (alias is None) == (version is None):
        raise ValueError("find_version: pass one of alias and version")
    if os.environ.get("MLFLOW_WORKSPACE"):  # another workspace's versions: MLflow knows how to select them
        return None
    if urllib.parse.urlparse(registry_uri).scheme in ("http", "https"):
        timeout = service_timeout_s() if timeout_s is None else timeout_s
        return _rest_version(registry_uri, name, alias, version, timeout)
    return None


def _rest_version(uri: str, name: str, alias: str | None, version: str | None,
                  timeout_s: float) -> RegisteredVersion | None:
    if os.environ.get("MLFLOW_TRACKING_AUTH") or os.environ.get("MLFLOW_TRACKING_CLIENT_CERT_PATH"):
        return None  # an auth plugin or client certificate: only MLflow's client speaks it
    if alias is not None:
        answer = rest_get(uri, "/registered-models/alias", {"name": name, "alias": alias},
                          service="the MLflow model registry", timeout_s=timeout_s)
    else:
        answer = rest_get(uri, "/model-versions/get", {"name": name, "version": str(version)},
                          service="the MLflow model registry", timeout_s=timeout_s)
    found = answer.get("model_version") or {}
    if not found.get("version"):
        raise ServiceError(f"the MLflow model registry at {_host(uri)} answered without a model version: not an "
                           "MLflow server?")
    if found.get("status", READY) != READY:
        raise RegistryError(f"{name} version {found['version']} is {found['status']}, not ready")
    return RegisteredVersion(registry_key(uri), name, str(found["version"]), str(found.get("source") or ""),
                             int(found.get("creation_timestamp") or 0))


def _host(uri: str) -> str:
    """scheme://host:port of a server URI, credentials removed: what messages name."""
    parsed = urllib.parse.urlparse(uri)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.hostname or ''}{port}"


def _request(uri: str, path: str, params: dict[str, str] | None) -> urllib.request.Request:
    """A GET of MLflow's REST API with the credentials MLflow's client would send (URI, user/password, token)."""
    parsed = urllib.parse.urlparse(uri)
    netloc = parsed.hostname or ""
    if parsed.port:
        netloc += f":{parsed.port}"
    base = urllib.parse.urlunparse((parsed.scheme, netloc, parsed.path.rstrip("/"), "", "", ""))
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    request = urllib.request.Request(f"{base}{path}{query}", headers={"Accept": "application/json"})
    user = parsed.username or os.environ.get("MLFLOW_TRACKING_USERNAME")
    password = parsed.password or os.environ.get("MLFLOW_TRACKING_PASSWORD")
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if user and password is not None:
        secret = base64.b64encode(f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()).decode()
        request.add_header("Authorization", f"Basic {secret}")
    elif token:
        request.add_header("Authorization", f"Bearer {token}")
    return request


def _tls_context() -> ssl.SSLContext | None:
    """TLS as MLflow's client sets it: $MLFLOW_TRACKING_INSECURE_TLS, $MLFLOW_TRACKING_SERVER_CERT_PATH."""
    if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
        return ssl._create_unverified_context()  # noqa: S323 - the user asked for it, as MLflow honours it
    cafile = os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH")
    return ssl.create_default_context(cafile=cafile) if cafile else None


def _server_message(body: bytes) -> tuple[str, str]:
    """(error_code, first line of the message) of an MLflow error answer; ("", the body's first line) else."""
    text = body.decode("utf-8", "replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return "", text.splitlines()[0][:200] if text else ""
    message = str(doc.get("message") or "").strip()
    return str(doc.get("error_code") or ""), message.splitlines()[0][:200] if message else ""


def _http_get(uri: str, path: str, params: dict[str, str] | None, service: str, timeout_s: float | None) -> bytes:
    """The body of a GET of `path` at the server `uri` within the timeout; HTTP errors raised as they came,
    no answer as a one-line ServiceUnreachableError."""
    timeout = service_timeout_s() if timeout_s is None else timeout_s
    started = time.monotonic()
    try:
        with urllib.request.urlopen(_request(uri, path, params), timeout=timeout, context=_tls_context()) as response:
            return bytes(response.read())
    except urllib.error.HTTPError:
        raise
    except (urllib.error.URLError, OSError) as err:  # refused, unknown host, reset, timed out
        reason = getattr(err, "reason", err)
        why = (f"no answer within {timeout:g} s" if isinstance(reason, TimeoutError)
               else redacted(str(reason).strip() or type(reason).__name__))
        raise ServiceUnreachableError(
            f"{service} at {_host(uri)} is unreachable ({why}, after {time.monotonic() - started:.1f} s); is it "
            f"running? (${SERVICE_TIMEOUT_ENV} raises the wait)") from None


def rest_get(uri: str, path: str, params: dict[str, str] | None = None, *, service: str,
             timeout_s: float | None = None) -> dict[str, Any]:
    """GET `path` of MLflow's REST API (under /api/2.0/mlflow) at the server `uri` within the timeout: its JSON
    answer. Raises RegistryError for what the server answered is not there (RESOURCE_DOES_NOT_EXIST),
    ServiceUnauthorisedError (401/403), ServiceUnreachableError (no answer in time) and ServiceError (any other
    error), each one line naming `service` and the host."""
    host = _host(uri)
    try:
        body = _http_get(uri, f"{_REST}{path}", params, service, timeout_s)
    except urllib.error.HTTPError as err:
        code, message = _server_message(err.read() or b"")
        detail = f"HTTP {err.code} {err.reason}" + (f": {redacted(message)}" if message else "")
        if err.code in (401, 403) or code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
            raise ServiceUnauthorisedError(
                f"{service} at {host} refused the request as not authorised ({detail}); set "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) to an account "
                "allowed to read it") from None
        if code in NOT_FOUND_CODES or (code == "INVALID_PARAMETER_VALUE" and "not found" in message.lower()):
            raise RegistryError(redacted(message) or detail) from None
        raise ServiceError(f"{service} at {host} failed: {detail}") from None
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise ServiceError(f"{service} at {host} answered {path} with something other than MLflow's JSON: not an "
                           "MLflow server?")
    return doc


def check_server(uri: str, service: str, timeout_s: float | None = None) -> None:
    """Raise a one-line ServiceError unless the server at `uri` answers its health check within the timeout
    (any answer below 500 counts, one that asks for credentials too: the calls that follow say what they lack);
    MLflow's own retries would otherwise spend minutes on a server that is down."""
    try:
        _http_get(uri, "/health", None, service, timeout_s)
    except urllib.error.HTTPError as err:
        if err.code >= 500:  # MLflow retries these for minutes: a proxy without its server, an overloaded one
            raise ServiceError(f"{service} at {_host(uri)} failed: HTTP {err.code} {err.reason}") from None


# -- the cache ------------------------------------------------------------------------------------------------
def store_stamp(registry_uri: str) -> list[int] | None:
    """What changes whenever an embedded sqlite store is written: its file's and its write-ahead log's inode, size
    and modification time (ns). None for any other store, a store that is not there, a store being written (its
    rollback journal present) or written less than STILL_S seconds ago: its answers are not kept."""
    path = sqlite_path(registry_uri) if urllib.parse.urlparse(registry_uri).scheme == "sqlite" else None
    if path is None or os.environ.get("MLFLOW_WORKSPACE"):  # another workspace's answers: not keyed here
        return None
    if path.with_name(f"{path.name}-journal").exists():
        return None
    stamp: list[int] = []
    for file in (path, path.with_name(f"{path.name}-wal")):
        try:
            stat = file.stat()
        except FileNotFoundError:
            if file == path:
                return None
            stamp += [0, 0, 0]
            continue
        except OSError:
            return None
        if time.time_ns() - stat.st_mtime_ns < STILL_S * 1e9:
            return None
        stamp += [stat.st_ino, stat.st_size, stat.st_mtime_ns]
    return stamp


def cached_version(registry_uri: str, name: str, alias: str | None, version: str | None,
                   ask: Callable[[], RegisteredVersion]) -> RegisteredVersion:
    """`ask()`'s answer (MLflow's client reading the store) to which version `alias` (or number `version`) of `name`
    is, or the answer it gave last, kept in the local cache, where the store is an embedded sqlite file that has not
    changed since (`store_stamp`): a moved alias writes the file, so it is asked again."""
    stamp = store_stamp(registry_uri)  # before asking: a write while the client reads leaves the answer unmatched
    cache = ModelCache()
    if stamp is not None:
        kept = cache.answer(registry_uri, name, alias, version, stamp)
        if kept is not None:
            return kept
    ref = ask()
    if stamp is not None and cache.writable():
        cache.keep_answer(registry_uri, name, alias, version, stamp, ref)
    return ref


def cache_root() -> Path:
    """Where downloaded registry versions are kept: $SHARDWISE_CACHE, else $XDG_CACHE_HOME/shardwise, else
    ~/.cache/shardwise."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "shardwise"


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def _manifest(files: Path) -> dict[str, list[Any]]:
    return {p.relative_to(files).as_posix(): [p.stat().st_size, _digest(p)]
            for p in sorted(files.rglob("*")) if p.is_file()}


class ModelCache:
    """Registry versions on local disk, one directory per (registry, name, version), checked before each use."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or cache_root()) / "models"

    def entry(self, ref: RegisteredVersion) -> Path:
        """The directory of `ref`'s entry (the name readable, the hash keeping registries apart)."""
        key = hashlib.sha256(json.dumps([ref.registry, ref.name, ref.version]).encode()).hexdigest()[:16]
        readable = re.sub(r"[^A-Za-z0-9._-]+", "_", ref.name)[:80]
        return self.root / f"{readable}-v{ref.version}-{key}"

    def get(self, ref: RegisteredVersion) -> Path | None:
        """The files of `ref` if a whole, unchanged entry holds them; else None."""
        entry = self.entry(ref)
        try:
            doc = json.loads((entry / ENTRY_FILE).read_text())
            stamp = [doc["format"], doc["registry"], doc["name"], doc["version"], doc["source"], doc["created_ms"]]
            if stamp != [ENTRY_FORMAT, ref.registry, ref.name, ref.version, ref.source, ref.created_ms]:
                return None
            if not doc["files"] or _manifest(entry / FILES_DIR) != doc["files"]:
                return None  # a file changed, went missing or was added since it was written
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return entry / FILES_DIR

    def writable(self) -> bool:
        """True where entries can be written (a read-only home in a container: no cache, MLflow downloads)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError:
            return False
        return os.access(self.root, os.W_OK)

    def put(self, ref: RegisteredVersion, fill: Callable[[Path], None]) -> Path:
        """`fill(directory)` writes `ref`'s files into a fresh directory; the entry appears whole or not at all.
        An invalid entry in the way is replaced; a valid one another process wrote meanwhile is kept."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{uuid.uuid4().hex}"
        try:
            (tmp / FILES_DIR).mkdir(parents=True)
            fill(tmp / FILES_DIR)
            doc = {"format": ENTRY_FORMAT, "registry": ref.registry, "name": ref.name, "version": ref.version,
                   "source": ref.source, "created_ms": ref.created_ms, "files": _manifest(tmp / FILES_DIR)}
            (tmp / ENTRY_FILE).write_text(json.dumps(doc, indent=1))
            final = self.entry(ref)
            for _ in range(3):
                try:
                    os.rename(tmp, final)
                    return final / FILES_DIR
                except OSError:  # an entry is there: another plan's (keep it if whole), or a broken one
                    if self.get(ref) is not None:
                        return final / FILES_DIR
                    trash = self.root / f".trash-{uuid.uuid4().hex}"
                    with contextlib.suppress(OSError):
                        os.rename(final, trash)
                    shutil.rmtree(trash, ignore_errors=True)
            raise OSError(f"{final}: could not be replaced")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _answer_file(self, registry_uri: str, name: str, alias: str | None, version: str | None) -> Path:
        asked = ["alias", alias] if alias is not None else ["version", version]
        key = hashlib.sha256(json.dumps([registry_key(registry_uri), name, *asked]).encode()).hexdigest()[:16]
        return self.root.parent / "answers" / f"{key}.json"

    def answer(self, registry_uri: str, name: str, alias: str | None, version: str | None,
               stamp: list[int]) -> RegisteredVersion | None:
        """The version a lookup of `alias` (or `version`) of `name` answered, kept while the store had `stamp`."""
        try:
            doc = json.loads(self._answer_file(registry_uri, name, alias, version).read_text())
            asked = [doc["format"], doc["registry"], doc["name"], doc["alias"], doc["asked_version"], doc["stamp"]]
            if asked != [ANSWER_FORMAT, registry_key(registry_uri), name, alias, version, stamp]:
                return None
            found = doc["version"]
            return RegisteredVersion(registry_key(registry_uri), name, str(found["version"]), str(found["source"]),
                                     int(found["created_ms"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def keep_answer(self, registry_uri: str, name: str, alias: str | None, version: str | None, stamp: list[int],
                    ref: RegisteredVersion) -> None:
        """Keep `ref` as the answer to a lookup of `alias` (or `version`) of `name` while the store has `stamp`
        (written whole under a temporary name, then renamed in: a reader sees the old answer or the new one)."""
        path = self._answer_file(registry_uri, name, alias, version)
        doc = {"format": ANSWER_FORMAT, "registry": registry_key(registry_uri), "name": name, "alias": alias,
               "asked_version": version, "stamp": stamp,
               "version": {"version": ref.version, "source": ref.source, "created_ms": ref.created_ms}}
        tmp = path.with_name(f".tmp-{uuid.uuid4().hex}.json")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, path)
        except OSError:  # a cache that cannot be written only costs the next plan MLflow's client
            with contextlib.suppress(OSError):
                tmp.unlink()

    def clear_stale_temporaries(self, older_than_s: float = 3600.0) -> None:
        """Remove what interrupted writers left (temporary and trash directories older than `older_than_s`)."""
        now = time.time()
        for path in self.root.glob(".t*-*"):
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > older_than_s:
                    shutil.rmtree(path, ignore_errors=True)
