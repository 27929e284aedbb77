"""The benchmark and the evaluate verb end to end on real CPU kernels and gloo (tiny sizes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from shardwise.cli import main
from shardwise.evaluation import TaskSetSpec, format_summary, make_task_set, run_benchmark
from shardwise.profiling import MeasurementSettings
from shardwise.search import (
    GreedySearch,
    RandomSearch,
    TorchRecPlannerSearch,
    load_plan,
    save_plan,
    validate_plan,
)
from shardwise.workload import TableSpec, load_task, save_task
from shardwise.workload.tableset import TableSet

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from comm_doubles import fixed_all_to_all  # noqa: E402
from search_doubles import FeatureCostModel  # noqa: E402
from timing_settings import FLUSH_MIB  # noqa: E402

pytestmark = pytest.mark.integration

FAST = MeasurementSettings(device="cpu", warmup_iters=1, timing_iters=3, timing_rounds=3, comm_iters=2,
                           flush_mib=FLUSH_MIB)
POOL = TableSet(
    batch_size=512,
    tables=tuple(
        TableSpec(name=f"t{i}", rows=2000 * (1 + i % 3), dim=(16, 32)[i % 2], pooling_factor=2.0 + 3 * (i % 4),
                  zipf_alpha=1.05)
        for i in range(12)
    ),
)


@pytest.mark.slow
def test_benchmark_measures_every_method_and_writes_the_report(tmp_path) -> None:
    spec = TaskSetSpec(name="2dev", num_devices=2, min_tables=4, max_tables=6, num_tasks=2)
    task_sets = {spec.name: make_task_set(POOL, spec, seed=0)}
    measured_greedy = GreedySearch("measured", measurement=FAST)
    searchers = {"size_greedy": GreedySearch("size"), "random": RandomSearch(), "torchrec": TorchRecPlannerSearch(),
                 "measured_greedy": measured_greedy}
    results, rows = run_benchmark(task_sets, searchers, learned={"measured_greedy"}, measurement=FAST,
                                  out_dir=tmp_path)
    assert {(r.task_index, r.method) for r in results} == {(k, m) for k in (0, 1) for m in searchers}
    assert all(r.measured_ms > 0 and r.memory_headroom >= 0 for r in results)
    # one searcher for the whole run: a table drawn for both tasks was timed alone once
    assert measured_greedy.timings.measured == len({t for task in task_sets["2dev"] for t in task.tables})
    by_method = {r["method"]: r for r in rows}
    assert by_method["torchrec"]["ratio_to_torchrec"] == pytest.approx(1.0)
    assert by_method["measured_greedy"]["planning_time_s"] > by_method["size_greedy"]["planning_time_s"]
    # the best baseline leaves out the methods named learned
    assert by_method["measured_greedy"]["best_baseline"] in {"size_greedy", "random", "torchrec"}
    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved["plans"]) == 8 and saved["reference_ms"] > 0
    assert saved["timing"]["comm_iters"] == 2 and saved["timing"]["iters"] == 3
    assert saved["measurement"] == FAST.model_dump(mode="json")
    html = (tmp_path / "benchmark.html").read_text()
    assert "measured_greedy" in html and (tmp_path / "benchmark_methods.png").stat().st_size > 5000
    # throughput off (the default): no DLRM training, the table has no throughput columns
    assert all(r.samples_per_s is None for r in results)
    assert all("mean_samples_per_s" not in r and "throughput_ratio_to_torchrec" not in r for r in rows)
    assert "mean_samples_per_s" not in html and not list(tmp_path.glob("2dev/task00/*.throughput.json"))
    assert (tmp_path / "2dev/task00/torchrec.html").exists()
    # each task is saved next to its plans, so `shardwise evaluate --task ... --plan ...` re-measures any of them
    assert load_task(tmp_path / "2dev/task00/task.json") == task_sets["2dev"][0]
    measured = json.loads((tmp_path / "2dev/task01/random.measured.json").read_text())
    assert measured["timing"]["compute_rounds"] == FAST.timing_rounds


@pytest.mark.slow
def test_benchmark_reports_dlrm_throughput_next_to_torchrecs_plan(tmp_path) -> None:
    spec = TaskSetSpec(name="2dev", num_devices=2, min_tables=3, max_tables=3, num_tasks=2)
    task_sets = {spec.name: make_task_set(POOL, spec, seed=0)}
    results, rows = run_benchmark(
        task_sets, {"size_greedy": GreedySearch("size"), "torchrec": TorchRecPlannerSearch()},
        measurement=FAST.model_copy(update={"batch_size": 128}), out_dir=tmp_path, throughput_tasks=1,
        throughput_iters=2, throughput_warmup=1,
    )
    # only the first task of the set is trained, under both methods' plans
    trained = {(r.task_index, r.method): r.samples_per_s for r in results}
    assert trained[1, "size_greedy"] is None and trained[1, "torchrec"] is None
    assert trained[0, "size_greedy"] > 0 and trained[0, "torchrec"] > 0
    by_method = {r["method"]: r for r in rows}
    assert by_method["torchrec"]["throughput_ratio_to_torchrec"] == pytest.approx(1.0)
    assert by_method["size_greedy"]["mean_samples_per_s"] == pytest.approx(trained[0, "size_greedy"])
    assert by_method["size_greedy"]["throughput_ratio_to_torchrec"] == pytest.approx(
        trained[0, "size_greedy"] / trained[0, "torchrec"]
    )
    assert "thru/torchrec" in format_summary(rows)
    assert "<th>mean_samples_per_s</th><th>throughput_ratio_to_torchrec</th>" in (tmp_path / "benchmark.html").read_text()
    saved = json.loads((tmp_path / "2dev/task00/torchrec.throughput.json").read_text())
    assert saved["iters"] == 2 and saved["warmup"] == 1 and saved["global_batch_size"] == 128
    # each plan's report shows both plans of the task, trained in the same run
    assert "End-to-end DLRM training" in (tmp_path / "2dev/task00/size_greedy.html").read_text()


def test_cli_evaluate_prints_the_per_device_table_and_writes_the_report(tmp_path, capsys) -> None:
    task = make_task_set(POOL, TaskSetSpec(name="s", num_devices=2, min_tables=4, max_tables=4, num_tasks=1), 0)[0]
    plan = GreedySearch("size").search(task, None, seed=0)
    task_path = save_task(task, tmp_path / "task.json")
    plan_path = save_plan(plan, tmp_path / "plans/plan.json")
    status = main(["evaluate", "--task", str(task_path), "--plan", str(plan_path), "--device", "cpu",
                   "--warmup-iters", "1", "--timing-iters", "3", "--timing-rounds", "1", "--comm-iters", "2",
                   "--comm-rounds", "1", "--flush-mib", str(FLUSH_MIB)])
    out = capsys.readouterr().out
    assert status == 0
    assert "a2a_fwd" in out and "plan (size_greedy): max" in out
    report = tmp_path / "plans/plan_eval"  # next to the plan by default
    measured = json.loads((report / "plan.measured.json").read_text())
    assert len(measured["devices"]) == 2 and measured["max_cost_ms"] > 0
    assert f"{measured['max_cost_ms']:.3f}" in (report / "plan.html").read_text()


@pytest.mark.slow
def test_benchmark_refines_learned_plans_from_the_faster_start(tmp_path) -> None:
    """With a cost model and refine_rounds, each learned method's plan gets a "<method>+refine" row: refined on the
    kernels from the faster of it and the measured greedy's plan, measured with the rest, within memory."""
    spec = TaskSetSpec(name="2dev", num_devices=2, min_tables=4, max_tables=6, num_tasks=1)
    task_sets = {spec.name: make_task_set(POOL, spec, seed=0)}
    searchers = {"size_greedy": GreedySearch("size"), "measured_greedy": GreedySearch("measured", measurement=FAST)}
    results, rows = run_benchmark(task_sets, searchers, learned={"size_greedy"}, cost_model=FeatureCostModel(),
                                  measurement=FAST, out_dir=tmp_path, plan_reports=False, refine_rounds=1)
    by_method = {r.method: r for r in results}
    assert set(by_method) == {"size_greedy", "measured_greedy", "size_greedy+refine"}
    refined = json.loads((tmp_path / "2dev/task00/size_greedy+refine.plan.json").read_text())
    record = refined["refinement"]  # the plan file's extra keys sit at its top level
    assert set(record["starts"]) == {"size_greedy", "measured_greedy"}
    assert record["start"] == min(record["starts"], key=record["starts"].get)
    assert record["after_ms"] <= record["before_ms"]
    validate_plan(load_plan(tmp_path / "2dev/task00/size_greedy+refine.plan.json"), task_sets["2dev"][0])
    # its planning time counts the refinement; it is compared as a learned method, not a baseline
    assert by_method["size_greedy+refine"].planning_time_s >= record["seconds"]
    row = next(r for r in rows if r["method"] == "size_greedy+refine")
    assert row["best_baseline"] == "measured_greedy"


class _Counting:
    """A searcher that counts the tasks it was asked to plan (what a resumed benchmark must not ask again)."""

    def __init__(self, inner: GreedySearch) -> None:
        self.inner, self.name, self.searched = inner, inner.name, 0

    def search(self, task, cost_model, seed):  # type: ignore[no-untyped-def]
        self.searched += 1
        return self.inner.search(task, cost_model, seed)


@pytest.mark.slow
def test_an_interrupted_benchmark_resumes_where_it_stopped_and_only_with_the_same_settings(tmp_path,
                                                                                           monkeypatch) -> None:
    # what is checked is which tasks are planned and measured again: the all-to-all at fixed figures (comm_doubles)
    monkeypatch.setattr("shardwise.evaluation.measured.measure_all_to_all_many", fixed_all_to_all)
    spec = TaskSetSpec(name="2dev", num_devices=2, min_tables=3, max_tables=4, num_tasks=2)
    task_sets = {spec.name: make_task_set(POOL, spec, seed=0)}
    size = _Counting(GreedySearch("size"))
    searchers = {"size_greedy": size, "random": RandomSearch()}
    first, _ = run_benchmark(task_sets, searchers, cost_model=FeatureCostModel(), measurement=FAST, out_dir=tmp_path,
                             plan_reports=False)
    assert size.searched == 2
    # as if the run had been killed while measuring the last task: its results were never written
    (tmp_path / "2dev/task01/results.json").unlink()
    again, rows = run_benchmark(task_sets, searchers, cost_model=FeatureCostModel(), measurement=FAST,
                                out_dir=tmp_path, plan_reports=False, resume=True)
    assert size.searched == 3  # only the task without results was planned and measured again
    by_task = {(r.task_index, r.method): r.measured_ms for r in again}
    assert {k: v for k, v in by_task.items() if k[0] < 1} == {
        (r.task_index, r.method): r.measured_ms for r in first if r.task_index < 1}
    assert len(by_task) == 4 and {r["tasks"] for r in rows} == {2}
    summary = json.loads((tmp_path / "results.json").read_text())
    assert len(summary["plans"]) == 4
    # the run's time counts the resumed tasks' own seconds, as their checkpoints stored them
    stored = [json.loads((tmp_path / f"2dev/task{k:02d}/results.json").read_text())["seconds"] for k in range(2)]
    assert all(s > 0 for s in stored) and summary["seconds"] == pytest.approx(sum(stored), abs=0.1)
    # other settings (here another measurement protocol) measure every task again; so does no --resume
    run_benchmark(task_sets, searchers, cost_model=FeatureCostModel(), measurement=FAST.model_copy(
        update={"timing_iters": 2}), out_dir=tmp_path, plan_reports=False, resume=True)
    assert size.searched == 5
    run_benchmark(task_sets, searchers, cost_model=FeatureCostModel(), measurement=FAST, out_dir=tmp_path,
                  plan_reports=False)
    assert size.searched == 7
    with pytest.raises(ValueError, match="resume needs out_dir"):
        run_benchmark(task_sets, searchers, measurement=FAST, resume=True)
