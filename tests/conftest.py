"""Shared test setup: test-support modules (cost-data makers, cost-model doubles) importable by name."""

import sys
from pathlib import Path

# pytest runs with --import-mode=importlib (test files in unit/ and integration/ share basenames),
# which does not put test folders on sys.path; the support modules live beside the unit tests.
sys.path.insert(0, str(Path(__file__).parent / "unit"))


import pytest  # noqa: E402 - after the path set-up above


@pytest.fixture()
def round_robin():
    """A search method registered for one test only (one registry entry, nothing else lists it)."""
    from search_doubles import RoundRobinOptions, RoundRobinSearch

    from shardwise.search import MethodSpec, register_method, unregister_method

    register_method(MethodSpec(name="round_robin", factory=RoundRobinSearch, options=RoundRobinOptions,
                               description="table i on device i + offset (a test method)"))
    yield "round_robin"
    unregister_method("round_robin")
