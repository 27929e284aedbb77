"""A local run's summary is read from its steps' outputs: the measured comparison, the cost model's accuracy, and
every method's predicted plan cost on the task (the searched plan's first, then the trained policies')."""

from __future__ import annotations

import json
from pathlib import Path

from shardwise.cli.pipeline import LocalRun
from shardwise.pipelines.run import run_figures


def _step_output(run_dir: Path, step: str, artifact: str, metadata: dict[str, object]) -> None:
    path = run_dir / step / "executor_output.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"artifacts": {artifact: {"artifacts": [{"metadata": metadata}]}}}))


def test_the_summary_shows_each_methods_predicted_plan_cost_beside_the_measured_comparison(tmp_path):
    _step_output(tmp_path, "evaluate-plans", "comparison", {"method_max_cost_ms": 2.0, "torchrec_max_cost_ms": 2.5,
                                                            "ratio_to_torchrec": 0.8})
    _step_output(tmp_path, "pretrain-cost-model", "metrics", {"neural_heldout_tables_total_mape_pct": 3.5,
                                                               "neural_heldout_tables_total_top_decile_mape_pct": 4.25,
                                                               "neural_heldout_row_blocks_total_mape_pct": 6.25,
                                                               "data_parallel_kernel_line_heldout_dense_kernels_total"
                                                               "_mape_pct": 7.5,
                                                               "noise_floor_dense_kernel_repeats_total_mape_pct": 5.0,
                                                               "train_shards": 560, "not_reported": 1.0})
    _step_output(tmp_path, "train-policies", "predicted", {"neuroshard_predicted_ms": 1.9,
                                                           "dreamshard_predicted_ms": 2.1, "autoshard_predicted_ms": 2.05})
    figures = run_figures(tmp_path)
    assert "not_reported" not in figures and figures["ratio_to_torchrec"] == 0.8
    text = LocalRun(plan_path="p.json", plan_text="", report_path="r.html", comparison=figures, elapsed_s=60).summary()
    assert ("predicted plan cost on the task (the cost model's ms per iteration): neuroshard 1.900, dreamshard 2.100, "
            "autoshard 2.050") in text
    assert "ratio 0.800" in text and "MAPE 3.50%" in text
    assert ("MAPE 3.50%, on their costliest tenth 4.25%, Spearman nan (560 training shards)\n  their kernels as other sharding types, MAPE: "
            "row-wise (row blocks) 6.25%, data-parallel (dense kernel line) 7.50% (noise floor 5.00%)\nmeasured vs") in text


def test_a_run_without_the_policy_step_has_no_predicted_line(tmp_path):
    _step_output(tmp_path, "evaluate-plans", "comparison", {"method_max_cost_ms": 2.0})
    text = LocalRun(plan_path="p.json", plan_text="", report_path="r.html", comparison=run_figures(tmp_path),
                    elapsed_s=60).summary()
    assert "predicted plan cost" not in text and "other sharding types" not in text


def test_the_refined_plan_shows_its_ratio_to_the_plan_and_refinements_own_paired_session(tmp_path):
    # measured here a little slower than the plan it refines, and faster beside it in refinement's last session:
    # both are shown, so a reader sees the difference is between sessions, not refinement making the plan worse
    _step_output(tmp_path, "evaluate-plans", "comparison", {
        "method_max_cost_ms": 6.016, "torchrec_max_cost_ms": 6.564, "ratio_to_torchrec": 0.917,
        "refined_max_cost_ms": 6.093, "refined_ratio_to_torchrec": 0.928, "refinement_before_ms": 5.879,
        "refinement_after_ms": 5.809})
    text = LocalRun(plan_path="p.json", plan_text="", report_path="r.html", comparison=run_figures(tmp_path),
                    elapsed_s=60).summary()
    assert ("refined on this machine (evaluate step): 6.093 ms per iteration (ratio 0.928 to TorchRec's planner, "
            "1.013 to the plan above)") in text
    assert "refinement's own paired session: 5.879 -> 5.809 ms (0.988x; two plans' ratio moves" in text


def test_a_run_with_production_tasks_shows_the_publish_steps_table_or_says_the_step_did_not_run(tmp_path):
    import pytest

    from shardwise.jobs.publish import PublishedTask, PublishResult
    from shardwise.pipelines.params import pipeline_params
    from shardwise.pipelines.run import PipelineRunError, _published

    params = pipeline_params({"production_tasks": str(tmp_path / "ranking.task.json")}, preset_name="smoke")
    assert _published(tmp_path, pipeline_params(preset_name="smoke")) is None  # none asked: none read
    with pytest.raises(PipelineRunError, match="production_tasks .*: the publish step did not run"):
        _published(tmp_path, params)
    result = PublishResult(tasks=[PublishedTask(
        task="ranking", registered_name="shardwise-plan-ranking", version="2", alias="champion", reason="faster",
        plan_ms=1.5, torchrec_ms=2.0, champion_version="1", champion_ms=1.8, noise=0.02, directory="d")])
    path = tmp_path / "condition-2/publish-plans/published/publish.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(result.to_json()))
    assert _published(tmp_path, params) == path
    text = LocalRun(plan_path="p.json", plan_text="", report_path="r.html", comparison={}, elapsed_s=60,
                    published=result.table()).summary()
    assert "production tasks planned, measured and registered (publish step):\n" in text
    assert "shardwise-plan-ranking v2 @champion" in text


def test_the_summary_leads_with_each_production_tasks_plan_against_torchrecs_before_the_evaluation_task():
    from shardwise.jobs.publish import PublishedTask, PublishResult

    tasks = [PublishedTask(task=name, registered_name=f"shardwise-plan-{name}", version="1", alias="champion",
                           reason="no champion yet", plan_ms=plan_ms, torchrec_ms=2.0, champion_version=None,
                           champion_ms=None, noise=None, directory="d", refine_s=120.0, refinement_s=118.0,
                           refinement_changed=changed)
             for name, plan_ms, changed in (("ranking", 1.79, True), ("ads", 2.0, False))]
    result = PublishResult(tasks=tasks)
    text = LocalRun(plan_path="p.json", plan_text="", report_path="r.html",
                    comparison={"method_max_cost_ms": 3.0, "torchrec_max_cost_ms": 2.5, "ratio_to_torchrec": 1.2},
                    elapsed_s=60, published=result.table(), production=[t.headline() for t in tasks]).summary()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    assert lines[:3] == ["your models, measured here (publish step):",
                         "ranking: plan 1.790 ms vs TorchRec's planner 2.000 ms (ratio 0.895)",
                         "ads: plan 2.000 ms vs TorchRec's planner 2.000 ms (ratio 1.000)"]
    assert lines[3] == "the run's held-out evaluation task:" and lines[4].startswith("plan (p.json)")
    assert text.index("ratio 0.895") < text.index("measured vs TorchRec's planner: 3.000 ms")
    # the table at the end says what refinement did beside where each plan was registered
    assert "refined here for 118 s of 120: changed the searched plan" in text
    assert "refined here for 118 s of 120: kept the searched plan" in text
    # publish's own summary and Markdown lead the same way
    assert result.summary().splitlines()[0] == lines[1]
    markdown = result.markdown()
    assert markdown.index(f"- {lines[2]}") < markdown.index("| ranking | 1.790 |")
    plain = LocalRun(plan_path="p.json", plan_text="", report_path="r.html", comparison={}, elapsed_s=60).summary()
    assert "your models" not in plain and "held-out evaluation task" not in plain  # no production tasks: as before


def test_the_summary_says_what_the_profile_budget_bought_summed_over_the_workers(tmp_path):
    _step_output(tmp_path, "evaluate-plans", "comparison", {"ratio_to_torchrec": 0.9})
    for worker, (shards, left, seconds) in enumerate([(300, 20, 241.0), (260, 60, 246.0)]):
        _step_output(tmp_path, f"for-loop-1-iteration-{worker}/profile-costs", "costs",
                     {"profiled_shards": shards, "profile_shards_left": left, "profile_s": seconds,
                      "hardware_kind": "cpu"})
    figures = run_figures(tmp_path)
    assert (figures["profiled_shards"], figures["profile_shards_left"], figures["profile_s"]) == (560, 80, 246.0)
    text = LocalRun(plan_path="p.json", plan_text="", report_path="r.html", comparison=figures, elapsed_s=60).summary()
    assert "profiled: 560 shards in 4.1 min at 2.3 shards/s (80 left by the time budget)" in text
    # a run that profiled nothing new (every shard stored) says nothing of it
    assert "profiled:" not in LocalRun(plan_path="p.json", plan_text="", report_path="r.html",
                                       comparison={"ratio_to_torchrec": 0.9}, elapsed_s=60).summary()
