"""The experiments, one module each; each registers itself with the harness at its bottom. A module imports shardwise
and the modules kept beside the harness (harness, record, plan_runs, profiles), never another experiment
(tests/unit/test_bench_harness.py checks)."""

from . import (  # noqa: F401
    cli_startup,
    costmodel_seeds,
    data_parallel_accuracy,
    faults,
    gpu_method,
    memory_property,
    plan_quality,
    planning_time,
    real_models,
    refine,
    search_quality,
    workload_synthetic,
)
