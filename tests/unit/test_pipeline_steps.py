"""The library helpers the pipeline components run in their containers (steps.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shardwise.pipelines import steps


def _measured(max_ms: float, method: str) -> dict:
    devices = [{"device": 0, "total_ms": max_ms, "fwd_ms": max_ms / 2}, {"device": 1, "total_ms": max_ms / 2}]
    return {"format": steps.MEASURED_FORMAT, "method": method, "max_cost_ms": max_ms, "imbalance": 1.33,
            "devices": devices}


def test_run_step_raises_with_the_failing_command(tmp_path):
    with pytest.raises(steps.StepError, match=r"`shardwise task check .*absent.json` exited with status 2"):
        steps.run_step(["task", "check", str(tmp_path / "absent.json")])


def test_load_measured_finds_the_measured_document_among_other_files(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps({"format": "shardwise.plan/v1"}))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "m.json").write_text(json.dumps(_measured(3.0, "neuroshard")))
    assert steps.load_measured(tmp_path)["max_cost_ms"] == 3.0


def test_load_measured_says_what_is_missing(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps({"format": "shardwise.plan/v1"}))
    with pytest.raises(FileNotFoundError, match="no shardwise.measured/v1 document"):
        steps.load_measured(tmp_path)


def test_comparison_ratio_is_method_over_torchrec():
    result = steps.comparison(_measured(3.0, "neuroshard"), _measured(4.0, "torchrec"))
    assert result["ratio_to_torchrec"] == pytest.approx(0.75)
    assert result["method_max_cost_ms"] == 3.0 and result["torchrec_max_cost_ms"] == 4.0


def test_throughput_comparison_reads_validate_output(tmp_path):
    path = tmp_path / "validate.json"
    path.write_text(json.dumps([{"method": "neuroshard", "samples_per_s": 1200.0},
                                {"method": "torchrec", "samples_per_s": 1000.0}]))
    result = steps.throughput_comparison(path)
    assert result == {"method_samples_per_s": 1200.0, "torchrec_samples_per_s": 1000.0,
                      "throughput_ratio_to_torchrec": pytest.approx(1.2)}


def test_comparison_html_shows_both_plans_and_escapes_names():
    docs = {"<neuro>": _measured(3.0, "n"), "torchrec": _measured(4.0, "t")}
    page = steps.comparison_html("<neuro>", {"ratio_to_torchrec": 0.75}, docs, {"a": "/x/report.html"})
    assert "&lt;neuro&gt; vs TorchRec" in page and "<neuro>" not in page
    assert page.count("per device (measured)") == 2 and "0.75" in page and "/x/report.html" in page


def test_model_ref_prefers_the_registered_alias():
    assert steps.model_ref("champion", "cpu-x86_64-2c", "/m") == "models:/shardwise-cost-cpu-x86_64-2c@champion"
    assert steps.model_ref("", "cpu-x86_64-2c", "/m") == "/m"
    assert steps.model_ref("", "cpu-x86_64-2c", None) is None


def test_evaluation_metrics_flattens_numeric_cells(tmp_path):
    table = tmp_path / "evaluation.csv"
    table.write_text("split,mape_pct,spearman,note\nheld-out tables,4.5,0.99,ok\ntrain,2.0,,x\n")
    assert steps.evaluation_metrics(table) == {
        "held-out_tables_mape_pct": 4.5, "held-out_tables_spearman": 0.99, "train_mape_pct": 2.0,
    }


def test_steps_import_inside_a_kfp_step_container():
    # KFP runs component code with _KFP_RUNTIME=true: kfp.dsl then lacks the pipeline API and
    # kfp.kubernetes fails to import, so what a step imports must not pull the pipeline definition in
    code = "import shardwise.pipelines.steps, shardwise.cli; import sys; print(sorted(m for m in sys.modules if m.startswith('kfp.kubernetes')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "_KFP_RUNTIME": "true"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_plan_names_stay_distinct_when_the_method_is_torchrec():
    assert steps.plan_names("neuroshard") == ("neuroshard", "torchrec")
    assert steps.plan_names("torchrec") == ("torchrec", "torchrec-baseline")


def test_load_evaluation_reads_each_named_plan_and_lists_pages(tmp_path):
    (tmp_path / "neuroshard.measured.json").write_text(json.dumps(_measured(3.0, "neuroshard")))
    (tmp_path / "torchrec.measured.json").write_text(json.dumps(_measured(4.0, "torchrec")))
    (tmp_path / "comparison.html").write_text("<html></html>")
    docs, pages = steps.load_evaluation(tmp_path, ("neuroshard", "torchrec"))
    assert docs["torchrec"]["max_cost_ms"] == 4.0 and list(pages) == ["comparison.html"]
    with pytest.raises(FileNotFoundError, match="absent.measured.json"):
        steps.load_evaluation(tmp_path, ("absent",))


def _profile_argvs(**overrides):
    settings = {"num_shards": 560, "holdout_shards": 100, "comm_layouts": 40, "max_tables": 15, "repeats": 1,
                "seed": 7, "device": "cpu", **overrides}
    return steps.profile_argvs("train.json", "holdout.json", "costs.parquet", **settings)


def test_profile_step_profiles_held_out_tables_apart_into_the_same_dataset():
    from shardwise.cli import build_parser

    train, holdout = (build_parser().parse_args(argv) for argv in _profile_argvs())
    assert (train.tables, train.num_shards, train.seed, train.comm_layouts) == ("train.json", 560, 7, 40)
    # another seed (other shard draws), no second set of all-to-alls, same dataset and measurement settings
    assert (holdout.tables, holdout.num_shards, holdout.seed, holdout.comm_layouts) == ("holdout.json", 100, 8, 0)
    for name in ("out", "max_tables", "repeats", "device"):
        assert getattr(holdout, name) == getattr(train, name), name


def test_profile_step_refuses_no_held_out_shards_naming_the_parameter():
    with pytest.raises(ValueError, match="holdout_shards 0: the pretrain step evaluates"):
        _profile_argvs(holdout_shards=0)


def test_training_size_metrics_come_from_the_saved_model(tmp_path):
    doc = {"format": "x", "meta": {"info": {"seed": 0, "train_shards": 468, "heldout_sources": 36, "torch": "2"}}}
    (tmp_path / "cost_model.json").write_text(json.dumps(doc))
    assert steps.training_size_metrics(tmp_path) == {"train_shards": 468.0, "heldout_sources": 36.0}
