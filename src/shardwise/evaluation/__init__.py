"""Evaluation on hardware: measured plan cost, end-to-end DLRM throughput, benchmark suites, reports.

Modules, each importing only those before it: `measured_records` (a measured plan's per-device costs and plans
compared, and their JSON), `measured` (plans measured on the kernels and the all-to-all),
`dlrm` (TorchRec DLRM training throughput), `report` (HTML pages and plots), `evaluate` (named plans of one
task measured together, with reports), `suite` (the benchmark: task sets x searchers, measured).

The records load with the package; the modules that measure (torch, fbgemm, torchrec) load on first use of one of
their names, so a job's settings and results are declared (`shardwise evaluate --help`) without them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardwise.lazy import on_first_use

from .measured_records import (
    DeviceCost,
    DLRMThroughput,
    MeasuredPlanCost,
    PlanComparison,
    compare_measured,
    save_measured,
)

if TYPE_CHECKING:
    from .dlrm import build_dlrm, measure_dlrm_throughputs
    from .evaluate import evaluate_plans
    from .measured import KernelShard, measure_plan, measure_plans, resolve_timing, time_shards_in_rounds
    from .report import write_benchmark_report, write_comparison_report, write_plan_report
    from .suite import (
        PAPER_TASK_SETS,
        SMALL_TASK_SETS,
        TASK_SETS,
        PlanResult,
        TaskSetSpec,
        cost_ratio,
        format_summary,
        make_task_set,
        run_benchmark,
        summarize,
        throughput_ratio,
    )

#: the modules that load on first use of one of their names
__getattr__ = on_first_use(__name__, {
    "dlrm": ("build_dlrm", "measure_dlrm_throughputs"),
    "evaluate": ("evaluate_plans",),
    "measured": ("KernelShard", "measure_plan", "measure_plans", "resolve_timing", "time_shards_in_rounds"),
    "report": ("write_benchmark_report", "write_comparison_report", "write_plan_report"),
    "suite": ("PAPER_TASK_SETS", "SMALL_TASK_SETS", "TASK_SETS", "PlanResult", "TaskSetSpec", "cost_ratio",
              "format_summary", "make_task_set", "run_benchmark", "summarize", "throughput_ratio"),
})

__all__ = [
    "PAPER_TASK_SETS",
    "SMALL_TASK_SETS",
    "TASK_SETS",
    "DLRMThroughput",
    "DeviceCost",
    "KernelShard",
    "MeasuredPlanCost",
    "PlanComparison",
    "PlanResult",
    "TaskSetSpec",
    "build_dlrm",
    "compare_measured",
    "cost_ratio",
    "evaluate_plans",
    "format_summary",
    "make_task_set",
    "measure_dlrm_throughputs",
    "measure_plan",
    "measure_plans",
    "resolve_timing",
    "run_benchmark",
    "save_measured",
    "summarize",
    "throughput_ratio",
    "time_shards_in_rounds",
    "write_benchmark_report",
    "write_comparison_report",
    "write_plan_report",
]
