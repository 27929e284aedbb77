"""Shared test setup: test-support modules (cost-data makers, cost-model doubles) importable by name."""

import sys
from pathlib import Path

# pytest runs with --import-mode=importlib (test files in unit/ and integration/ share basenames),
# which does not put test folders on sys.path; the support modules live beside the unit tests.
sys.path.insert(0, str(Path(__file__).parent / "unit"))
