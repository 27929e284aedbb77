"""`shardwise plan --refine`: the searched plan refined on this machine's kernels when it is the plan's hardware."""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

import pytest

from shardwise.cli import main
from shardwise.jobs import plan as plan_job
from shardwise.profiling import MeasurementSettings
from shardwise.search import load_plan, validate_plan
from shardwise.workload import ShardingTask, TableSpec, load_task, save_task

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from timing_settings import FLUSH_MIB  # noqa: E402

pytestmark = pytest.mark.integration


def test_plan_refine_measures_here_and_writes_the_refined_plan_with_its_rounds(tmp_path, capsys, monkeypatch,
                                                                             tiny_cost_model) -> None:
    # `plan` has no measurement options: the lightest settings that still measure every shard (the defaults' 9
    # timings with a 64 MiB flush took 2 minutes here), as the other refinement tests use
    monkeypatch.setattr(plan_job, "MeasurementSettings", functools.partial(
        MeasurementSettings, warmup_iters=1, timing_iters=3, timing_rounds=1, comm_iters=2, comm_rounds=1,
        flush_mib=FLUSH_MIB))
    tiny_cost_model[0].save(tmp_path / "model")
    tables = [TableSpec(name=f"h{i}", rows=20_000, dim=64, pooling_factor=30.0) for i in range(3)]
    tables += [TableSpec(name=f"l{i}", rows=500, dim=16, pooling_factor=1.0) for i in range(4)]
    task_path = save_task(ShardingTask(num_devices=2, device_memory_bytes=2**30, batch_size=512, tables=tuple(tables)),
                          tmp_path / "task.json")
    status = main(["plan", "--task", str(task_path), "--model", str(tmp_path / "model"), "--device", "cpu",
                   "--refine", "2", "--out", str(tmp_path / "plan.json")])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "refinement: slowest device" in out and "measured; refined from" in out  # the greedy start was measured
    plan = load_plan(tmp_path / "plan.json")
    validate_plan(plan, load_task(task_path))
    record = plan.extra["refinement"]
    assert plan.method == "neuroshard+refine" and set(record["starts"]) == {"neuroshard", "measured_greedy"}
    assert record["after_ms"] <= record["before_ms"]  # never slower, measured, than where it started
    assert record["stopped"] and plan.extra["provenance"]["cost_model_uri"]


#: what `plan --refine` may take beyond its budget in the test below: loading a small model and searching, the first
#: timing of each start's device shards (which always runs to its end), their all-to-alls, the shard timing under
#: way when the clock runs out, and the all-to-all's ranks leaving their group on a busy machine
REFINE_MARGIN_S = 10.0


def test_plan_refine_returns_within_its_time_budget(tmp_path, capsys, monkeypatch, tiny_cost_model) -> None:
    """1,000 timings per device shard and 50 rounds would measure for many minutes on any machine; `--refine-budget-s 2` stops them
    (mid-session: the starts' own session is longer than the budget) and `plan` writes the plan measured fastest so
    far within the budget and a margin."""
    monkeypatch.setattr(plan_job, "MeasurementSettings", functools.partial(
        MeasurementSettings, warmup_iters=1, timing_iters=3, timing_rounds=1000, flush_mib=FLUSH_MIB))
    tiny_cost_model[0].save(tmp_path / "model")
    tables = [TableSpec(name=f"h{i}", rows=20_000, dim=64, pooling_factor=30.0) for i in range(4)]
    tables += [TableSpec(name=f"l{i}", rows=500, dim=16, pooling_factor=1.0) for i in range(4)]
    task_path = save_task(ShardingTask(num_devices=2, device_memory_bytes=2**30, batch_size=512, tables=tuple(tables)),
                          tmp_path / "task.json")
    budget_s = 2.0
    started = time.perf_counter()
    status = main(["plan", "--task", str(task_path), "--model", str(tmp_path / "model"), "--device", "cpu",
                   "--refine", "50", "--refine-budget-s", f"{budget_s:g}", "--out", str(tmp_path / "plan.json")])
    wall_s = time.perf_counter() - started
    assert status == 0, capsys.readouterr().out
    plan = load_plan(tmp_path / "plan.json")
    validate_plan(plan, load_task(task_path))
    record = plan.extra["refinement"]
    assert "the 2 s budget was spent" in record["stopped"], record["stopped"]  # the budget stopped it, not the rounds
    assert wall_s <= budget_s + REFINE_MARGIN_S
    assert record["after_ms"] <= record["before_ms"] and record["devices_measured"] >= 2  # a plan measured here
