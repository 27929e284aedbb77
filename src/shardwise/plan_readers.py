"""Readers of the plans behind a URI ("models:/shardwise-plan-<task>@champion"), by the URI's scheme.

`shardwise.search.load_plan` reads a plan URI with the reader registered for its scheme. A scheme's reader lives
with the store that serves it, in a layer above search (models:/ in `integrations.plan_registry`), and is registered
from above every layer (the top package, `shardwise/__init__.py`), so that search imports no layer above it and the
import contracts see each import. Standard library only: the top package imports it on every `import shardwise`."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

#: reader(uri, tracking_uri=...) -> the shardwise plan at `uri` (typed loosely: the Plan type is search's, above)
PlanReader = Callable[..., Any]

#: the registered readers by URI scheme
PLAN_READERS: dict[str, PlanReader] = {}

#: a URI's scheme then ":/": two characters at least, as one is a Windows drive letter ("C:/plans/plan.json")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):/")


def register_plan_reader(scheme: str, reader: PlanReader) -> None:
    """Read the plans behind `scheme`:/ URIs with `reader(uri, tracking_uri=...)`, in place of any reader before."""
    PLAN_READERS[scheme] = reader


def uri_scheme(path: str) -> str | None:
    """The URI scheme `path` starts with ("models" for models:/...); None for a file path."""
    match = _SCHEME.match(path)
    return match[1] if match else None
