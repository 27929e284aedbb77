"""The one error base: every failure a user can fix (a bad file, a missing model, a plan that cannot fit) is a
ShardwiseError. `shardwise` prints it as one line and exits 2; the traceback only with `--debug`.

Services around the tool (the model registry, the tracking server, the object store) fail as `ServiceError`s:
one line naming the service and its host (credentials redacted) and whether it did not answer
(`ServiceUnreachableError`) or refused who asked (`ServiceUnauthorisedError`); what a service answered is not
there is the caller's own "not found" error. How long to wait for one is `service_timeout_s()`."""

from __future__ import annotations

import os
import re

#: user:password@ after a URI scheme
_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")
#: the setting that raises the wait for a service (seconds)
SERVICE_TIMEOUT_ENV = "SHARDWISE_SERVICE_TIMEOUT_S"
#: seconds a registry, tracking server or object store may take to answer before it is called unreachable: left to
#: MLflow's own retries, a down server costs minutes before any message
DEFAULT_SERVICE_TIMEOUT_S = 10.0


class ShardwiseError(Exception):
    """A user-facing failure whose message names the input that was wrong and what would be right."""

    #: the process exit status `shardwise` returns for it (2: bad input or missing prerequisite)
    exit_code = 2


class ServiceError(ShardwiseError):
    """A registry, tracking server or object store that failed to serve a request (an error status, a broken
    answer): names the service and its host."""


class ServiceUnreachableError(ServiceError):
    """A service that did not answer within the timeout (refused, unknown host, no reply)."""


class ServiceUnauthorisedError(ServiceError):
    """A service that answered 401 or 403: the credentials are missing or lack the permission."""


def redacted(text: str) -> str:
    """`text` with any URI's user:password@ replaced by ***@ (secrets never appear in messages or logs)."""
    return _CREDENTIALS.sub("***@", text)


def service_timeout_s() -> float:
    """Seconds to wait for a service before calling it unreachable: $SHARDWISE_SERVICE_TIMEOUT_S, else 10."""
    raw = os.environ.get(SERVICE_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_SERVICE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ShardwiseError(f"${SERVICE_TIMEOUT_ENV}={raw!r}: a number of seconds above 0 (default "
                             f"{DEFAULT_SERVICE_TIMEOUT_S:g})")
    return value
