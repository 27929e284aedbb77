"""Adaptation on this machine: a cost model trained on other tables times a task's own tables (alone, then in fused
groups) within its budget on the real kernels, is fine-tuned on them and predicts them better; the rows go to the
cost dataset with provenance "adapt"; `shardwise plan --adapt` and the drop-in planner use it and say what it did."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from shardwise.cli import main
from shardwise.evaluation.adapt import AdaptError, adapt_cost_model
from shardwise.profiling import MeasurementSettings, hardware_kind, load_costs
from shardwise.workload import ShardingTask, TableSpec, mlperf_dcnv2_tables, save_task

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from costmodel_synthetic import comm_rows, cost_frame, synthetic_tables  # noqa: E402
from timing_settings import FLUSH_MIB  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # each times kernels for its 8 s budget: make test-all

GIB = 2**30
MEASUREMENT = MeasurementSettings(device="cpu", warmup_iters=2, timing_iters=5, flush_mib=FLUSH_MIB)
BUDGET_S = 8.0
#: 8 of the DCNv2 tables (dim 128, up to 7 lookups per sample, the big ones at 4,000 rows)
TASK = ShardingTask(num_devices=2, device_memory_bytes=GIB, batch_size=512, tables=mlperf_dcnv2_tables(1e-4)[:8])


def _trained(kind: str):  # noqa: ANN202 - a NeuralCostModel of synthetic tables of dim <= 64 for hardware `kind`
    from shardwise.costmodel import TrainConfig, train_cost_model

    torch.set_num_threads(1)
    tables = [t.model_copy(update={"dim": min(t.dim, 64)}) for t in synthetic_tables("a", 12, 0)]
    frame = pd.concat([cost_frame({"a": tables}, {"a": 60}, 0), comm_rows(10, 0)], ignore_index=True)
    frame["hardware_kind"] = kind
    return train_cost_model(frame, 0, TrainConfig(epochs=5, comm_epochs=5, progress=False))[0]


@pytest.fixture(scope="module")
def here():  # noqa: ANN201 - a model for this machine's CPU that has never seen the DCNv2 tables
    return _trained(hardware_kind("cpu"))


def test_adaptation_times_the_tasks_tables_within_its_budget_and_learns_them(here, tmp_path):
    assert here.outside_training(TASK.tables, here.batch_size) is not None
    start = time.perf_counter()
    tuned, record = adapt_cost_model(TASK, here, BUDGET_S, measurement=MEASUREMENT, dataset=tmp_path / "costs")
    assert time.perf_counter() - start < BUDGET_S + 3  # fine-tuning stops at the budget too
    assert record.singles == len(TASK.tables) and record.groups > 0
    assert record.kept and tuned is not here
    assert record.fine_tune.heldout_mape_after_pct < record.fine_tune.heldout_mape_before_pct
    assert tuned.outside_training(TASK.tables, tuned.batch_size) is None  # it has seen them now
    line = record.line()
    halves = f", {record.halves} column halves alone" if record.halves else ""
    assert line.startswith(f"adapted on this machine in {record.seconds:.0f} s: 8 tables alone{halves} and "
                           f"{record.groups} fused groups timed, error on ") and "the adapted model plans" in line

    rows = load_costs(tmp_path / "costs")
    assert len(rows) == record.singles + record.halves + record.groups and set(rows["provenance"]) == {"adapt"}
    assert set(rows["batch_size"]) == {here.batch_size} and set(rows["hardware_kind"]) == {here.hardware_kind}
    alone = [json.loads(t)[0] for t in rows["tables_json"] if len(json.loads(t)) == 1]
    assert sorted(t["name"] for t in alone if t["dim"] == 128) == sorted(t.name for t in TASK.tables)
    # the column halves of the costliest tables alone (the tables a plan splits), at most one per device
    assert len([t for t in alone if t["dim"] == 64]) == record.halves <= TASK.num_devices


def test_a_model_for_other_hardware_is_not_adapted_here():
    with pytest.raises(AdaptError, match="adaptation times kernels on this machine .*, but the cost model is for "
                                         "cpu-test: adapt where the plan will run"):
        adapt_cost_model(TASK, _trained("cpu-test"), BUDGET_S, measurement=MEASUREMENT)


def test_the_drop_in_asked_to_refine_adapts_where_the_tables_are_new_and_says_so(here, monkeypatch):
    import shardwise.integrations.torchrec.search as dropin_search
    from shardwise.integrations.torchrec import ShardwisePlanner, ebc_on_meta

    module = torch.nn.Module()
    module.sparse = ebc_on_meta(TASK)
    monkeypatch.setattr(dropin_search, "DEFAULT_ADAPT_S", BUDGET_S)  # the default's 120 s, shortened for the suite
    planner = ShardwisePlanner(task=TASK, device_type="cpu", cost_model=here, refine=BUDGET_S)
    planner.plan(module)
    record = planner.last_adaptation
    assert record is not None and record.kept and record.line() in planner.last_stats
    assert planner.resolved_cost_model() is not here  # planned with the adapted model, kept for the next plan
    # and its plan refined here: measured beside the greedy on measured tables and TorchRec's planner's plan, never
    # slower than the fastest
    refined = planner.last_refinement
    assert refined is not None and {"measured_greedy", "torchrec"} <= set(refined.starts)
    assert planner.last_plan.method.endswith("+refine")
    assert refined.after_ms <= refined.before_ms
    assert f"refined on this machine: {refined.outcome()}" in planner.last_stats
    planner.plan(module)
    # the adapted model has seen these tables: nothing to adapt again (refined again, as asked)
    assert planner.last_adaptation is None and planner.last_refinement is not None

    off = ShardwisePlanner(task=TASK, device_type="cpu", cost_model=here, adapt=0)
    off.plan(module)
    assert off.last_adaptation is None and "outside what the cost model was trained on" in off.last_stats
    elsewhere = ShardwisePlanner(task=TASK, device_type="cpu", cost_model=_trained("cpu-test"))
    elsewhere.plan(module)  # by default, tables new to the model get TorchRec's planner's plan: nothing is measured
    assert elsewhere.last_adaptation is None and elsewhere.last_refinement is None
    assert "the plan: TorchRec's planner's own" in elsewhere.last_stats


def test_the_drop_in_does_not_adapt_where_the_step_is_the_kernels_overhead(here):
    from shardwise.integrations.torchrec import ShardwisePlanner, ebc_on_meta

    # a few small tables, as TorchRec's planner tests have: outside the model's training, and cheap whatever the plan
    small = ShardingTask(num_devices=2, device_memory_bytes=GIB, batch_size=512,
                         tables=tuple(TableSpec(name=f"s{i}", rows=100, dim=64, pooling_factor=1.0) for i in range(4)))
    module = torch.nn.Module()
    module.sparse = ebc_on_meta(small)
    planner = ShardwisePlanner(task=small, device_type="cpu", cost_model=here, refine=0)
    planner.plan(module)
    assert "outside what the cost model was trained on" in planner.last_stats
    assert planner.last_adaptation is None and planner.last_refinement is None
    assert "adaptation" not in planner.search.last_seconds


def test_the_drop_in_refuses_to_refine_a_model_for_other_hardware():
    from shardwise.integrations.torchrec import PlannerError, ShardwisePlanner, ebc_on_meta

    module = torch.nn.Module()
    module.sparse = ebc_on_meta(TASK)
    with pytest.raises(PlannerError, match=r"refine=5\): refinement times kernels on this machine"):
        ShardwisePlanner(task=TASK, device_type="cpu", cost_model=_trained("cpu-test"), refine=5).plan(module)


def test_shardwise_plan_adapts_and_notes_it(here, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    save_task(TASK, "task.json")
    here.save("model")
    assert main(["plan", "--task", "task.json", "--model", "model", "--out", "plan.json", "--adapt", str(BUDGET_S),
                 "--adapt-dataset", "costs", "--method", "size_greedy"]) == 0
    note = next(line for line in capsys.readouterr().err.splitlines() if "adapted on this machine" in line)
    assert note.startswith("shardwise plan: note: adapted on this machine in ") and "rows appended to costs" in note
    assert set(load_costs("costs")["provenance"]) == {"adapt"}

    _trained("cpu-test").save("other")
    assert main(["plan", "--task", "task.json", "--model", "other", "--out", "plan.json", "--adapt", "5"]) == 2
    assert "--adapt: adaptation times kernels on this machine" in capsys.readouterr().err
