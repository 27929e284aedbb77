"""Evaluation on hardware: measured plan cost, end-to-end DLRM throughput, benchmark suites, reports."""

from .dlrm import DLRMThroughput, build_dlrm, measure_dlrm_throughput
from .measured import (
    DeviceCost,
    MeasuredPlanCost,
    PlanComparison,
    compare_measured,
    evaluate_plans,
    measure_plan,
    measure_plans,
    save_measured,
)
from .report import write_benchmark_report, write_comparison_report, write_plan_report
from .suite import (
    PAPER_TASK_SETS,
    SMALL_TASK_SETS,
    MeasuredCostGreedySearch,
    PlanResult,
    TaskSetSpec,
    make_task_set,
    run_benchmark,
    summarize,
)

__all__ = [
    "PAPER_TASK_SETS",
    "SMALL_TASK_SETS",
    "DLRMThroughput",
    "DeviceCost",
    "MeasuredCostGreedySearch",
    "MeasuredPlanCost",
    "PlanComparison",
    "PlanResult",
    "TaskSetSpec",
    "build_dlrm",
    "compare_measured",
    "evaluate_plans",
    "make_task_set",
    "measure_dlrm_throughput",
    "measure_plan",
    "measure_plans",
    "run_benchmark",
    "save_measured",
    "summarize",
    "write_benchmark_report",
    "write_comparison_report",
    "write_plan_report",
]
