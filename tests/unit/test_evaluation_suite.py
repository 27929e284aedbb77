"""Benchmark suite: seeded task sets, the comparison arithmetic, failures reported, not fatal."""

from __future__ import annotations

import pytest

from shardwise.evaluation import (
    PlanResult,
    TaskSetSpec,
    cost_ratio,
    format_summary,
    make_task_set,
    run_benchmark,
    summarize,
    throughput_ratio,
)
from shardwise.search import GreedySearch
from shardwise.workload import TableSpec
from shardwise.workload.tableset import TableSet

POOL = TableSet(
    batch_size=512,
    tables=tuple(TableSpec(name=f"t{i}", rows=1000 + 10 * i, dim=16, pooling_factor=2.0) for i in range(30)),
)


def _result(
    method: str, task: int, ms: float, predicted: float | None = None, samples_per_s: float | None = None
) -> PlanResult:
    return PlanResult(task_set="s", task_index=task, num_tables=10, method=method, measured_ms=ms, compute_ms=ms / 2, imbalance=1.1,
                      memory_headroom=0.2, planning_time_s=0.01, predicted_ms=predicted, samples_per_s=samples_per_s)


def test_task_sets_are_seeded_and_within_the_table_range() -> None:
    spec = TaskSetSpec(name="s", num_devices=4, min_tables=5, max_tables=12, num_tasks=4)
    first, again = make_task_set(POOL, spec, seed=3), make_task_set(POOL, spec, seed=3)
    assert [t.tables for t in first] == [t.tables for t in again]
    assert all(5 <= len(t.tables) <= 12 and t.num_devices == 4 for t in first)
    assert [t.tables for t in make_task_set(POOL, spec, seed=4)] != [t.tables for t in first]


def test_task_set_larger_than_the_pool_is_refused() -> None:
    spec = TaskSetSpec(name="big", num_devices=8, min_tables=80, max_tables=120, num_tasks=1)
    with pytest.raises(ValueError, match="max_tables 120 exceeds the 30 tables"):
        make_task_set(POOL, spec, seed=0)


def test_summary_ratios_compare_the_tasks_both_methods_planned() -> None:
    results = [
        _result("torchrec", 0, 10.0), _result("torchrec", 1, 20.0),
        _result("size_greedy", 0, 8.0), _result("size_greedy", 1, 30.0),
        _result("neuroshard", 0, 6.0, predicted=6.6),  # task 1: neuroshard failed
    ]
    rows = {r["method"]: r for r in summarize(results, failures=[("s", 1, "neuroshard", "no room")],
                                                learned={"neuroshard"})}
    assert rows["neuroshard"]["failed"] == 1 and rows["neuroshard"]["tasks"] == 1
    assert rows["neuroshard"]["ratio_to_torchrec"] == pytest.approx(0.6)  # task 0 only
    assert rows["size_greedy"]["ratio_to_torchrec"] == pytest.approx(38.0 / 30.0)
    # the best baseline is the lowest mean among non-learned methods: torchrec (15) beats size_greedy (19)
    assert rows["neuroshard"]["best_baseline"] == "torchrec"
    assert rows["neuroshard"]["prediction_error"] == pytest.approx(0.1)
    assert rows["torchrec"]["prediction_error"] is None
    assert rows["torchrec"]["mean_compute_ms"] == pytest.approx(7.5)
    assert cost_ratio(results, "neuroshard", "size_greedy") == pytest.approx(6.0 / 8.0)
    text = format_summary(list(rows.values()))
    assert "neuroshard" in text and "0.600" in text and "best baseline: s: torchrec" in text


def test_the_best_baseline_is_the_cheapest_method_not_named_learned() -> None:
    results = [_result("torchrec", 0, 10.0), _result("size_greedy", 0, 8.0), _result("neuroshard", 0, 6.0)]
    assert summarize(results)[0]["best_baseline"] == "neuroshard"  # nothing named learned: all are baselines
    rows = {r["method"]: r for r in summarize(results, learned=("neuroshard",))}
    assert rows["neuroshard"]["best_baseline"] == "size_greedy"
    assert rows["neuroshard"]["ratio_to_best_baseline"] == pytest.approx(6.0 / 8.0)


def test_throughput_columns_compare_the_tasks_both_methods_trained() -> None:
    results = [
        _result("torchrec", 0, 10.0, samples_per_s=1000.0), _result("torchrec", 1, 20.0, samples_per_s=500.0),
        _result("size_greedy", 0, 8.0, samples_per_s=1500.0), _result("size_greedy", 1, 30.0, samples_per_s=400.0),
        _result("neuroshard", 0, 6.0, samples_per_s=1200.0), _result("neuroshard", 1, 5.0),  # task 1 not trained
        _result("random", 0, 40.0),  # never trained
    ]
    rows = {r["method"]: r for r in summarize(results, throughput=True)}
    assert rows["torchrec"]["mean_samples_per_s"] == pytest.approx(750.0)
    assert rows["torchrec"]["throughput_ratio_to_torchrec"] == pytest.approx(1.0)
    assert rows["size_greedy"]["throughput_ratio_to_torchrec"] == pytest.approx(950.0 / 750.0)
    assert rows["neuroshard"]["throughput_ratio_to_torchrec"] == pytest.approx(1.2)  # task 0 only
    assert rows["random"]["mean_samples_per_s"] is None and rows["random"]["throughput_ratio_to_torchrec"] is None
    assert throughput_ratio(results, "neuroshard", "size_greedy") == pytest.approx(1200.0 / 1500.0)
    text = format_summary(list(rows.values()))
    assert "samples/s" in text and "thru/torchrec" in text and "1,200" in text and "1.200" in text


def test_without_throughput_the_summary_has_no_throughput_columns() -> None:
    rows = summarize([_result("torchrec", 0, 10.0), _result("size_greedy", 0, 8.0)])
    assert all("mean_samples_per_s" not in r and "throughput_ratio_to_torchrec" not in r for r in rows)
    assert "samples/s" not in format_summary(rows) and "thru/torchrec" not in format_summary(rows)


@pytest.mark.parametrize("flag, value", [("--throughput-tasks", "-1"), ("--throughput-iters", "0")])
def test_benchmark_cli_refuses_bad_throughput_options(flag: str, value: str, capsys) -> None:
    from shardwise.cli import main

    assert main(["benchmark", "--tables", "unused.json", flag, value]) == 2
    assert f"{flag} {value}: Input should be greater than or equal to" in capsys.readouterr().err


def test_run_benchmark_refuses_a_negative_throughput_task_count() -> None:
    with pytest.raises(ValueError, match="throughput_tasks must be >= 0"):
        run_benchmark({}, {"size_greedy": GreedySearch("size")}, throughput_tasks=-1)


def test_summary_reports_measured_compute_over_the_bound_and_where_it_failed() -> None:
    """compute_ms is ms / 2: task 0 (3.0 ms) sits above a 2.5 ms bound, task 1 (4.0 ms) below a 5.0 ms one."""
    results = [_result("neuroshard", 0, 6.0).model_copy(update={"bound_ms": 2.5}),
               _result("neuroshard", 1, 8.0).model_copy(update={"bound_ms": 5.0}),
               _result("torchrec", 0, 10.0)]
    rows = {r["method"]: r for r in summarize(results)}
    assert rows["neuroshard"]["compute_over_bound"] == pytest.approx((3.0 / 2.5 + 4.0 / 5.0) / 2)
    assert rows["neuroshard"]["under_bound"] == 1
    assert rows["torchrec"]["compute_over_bound"] is None
    assert "comp/bound" in format_summary(list(rows.values()))
