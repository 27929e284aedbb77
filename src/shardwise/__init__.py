"""shardwise: plans for sharding DLRM embedding tables, from a cost model pre-trained on real kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardwise.plan_readers import register_plan_reader
from shardwise.version import __version__ as __version__

if TYPE_CHECKING:
    from shardwise.search import Plan


def _read_registered_plan(uri: str, *, tracking_uri: str | None = None) -> Plan:
    """The plan registered at a models:/ URI (`shardwise.search.load_plan`'s reader of them)."""
    # the plan registry (and MLflow) load only for such a URI: `import shardwise` stays light
    from shardwise.integrations.plan_registry import read_registered_plan

    return read_registered_plan(uri, tracking_uri=tracking_uri)


# registered here, above every layer and imported by none, so that search reads models:/ without importing integrations
register_plan_reader("models", _read_registered_plan)
