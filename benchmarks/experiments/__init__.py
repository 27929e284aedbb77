"""The experiments, one module each; each registers itself with the harness at its bottom. A module imports
shardwise, the harness and record.py, never another experiment (tests/unit/test_bench_harness.py checks)."""

from . import faults, memory_property, plan_quality, planning_time, search_quality  # noqa: F401
