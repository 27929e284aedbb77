"""A table that alone exceeds a balanced device's share: NeuroShard prices its column halves and quarters from the
first depth on and splits it where that pays, keeps it whole where the model says a half costs as much, and a plan
whose slowest device holds one shard alone says so (plan extra, `shardwise plan`'s text, the HTML report)."""

import numpy as np
import pytest
import torch
from search_doubles import FeatureCostModel, WidthFreeCostModel

from shardwise.evaluation import DeviceCost, MeasuredPlanCost
from shardwise.evaluation.report import measured_bottleneck, summary_page, write_plan_report
from shardwise.search import NeuroShardConfig, NeuroShardSearch, format_plan, make_searcher, validate_plan
from shardwise.search.bottleneck import bottleneck_line, slowest_alone
from shardwise.workload import ShardingTask, TableSpec

torch.set_num_threads(1)

#: two tables each about 1.8x a balanced device's share on 4 devices, and eight small ones: halving either alone
#: leaves the other setting the slowest device, so a beam that stops at the first depth without gain keeps both whole
TWO_HOT = ShardingTask(
    num_devices=4, device_memory_bytes=2**30, batch_size=4096,
    tables=(TableSpec(name="hot_a", rows=20_000, dim=128, pooling_factor=400.0),
            TableSpec(name="hot_b", rows=20_000, dim=128, pooling_factor=400.0),
            *(TableSpec(name=f"s{i}", rows=10_000, dim=32, pooling_factor=5.0) for i in range(8))))
ONE_HOT = TWO_HOT.model_copy(update={"tables": TWO_HOT.tables[1:]})


def _pieces(plan, name: str) -> int:  # noqa: ANN001 - a Plan
    return sum(s.table == name for s in plan.shards)


def test_tables_above_the_balanced_share_are_split_where_one_split_alone_does_not_pay():
    model = FeatureCostModel()
    plan = NeuroShardSearch().search(TWO_HOT, model, 0)
    validate_plan(plan, TWO_HOT)
    assert _pieces(plan, "hot_a") >= 2 and _pieces(plan, "hot_b") >= 2
    assert plan.extra["search"]["column_roots_tried"] >= 4  # halves and quarters of each, and both in halves
    whole = NeuroShardSearch(NeuroShardConfig(max_depth=0)).search(TWO_HOT, model, 0)
    assert _pieces(whole, "hot_a") == 1 and whole.extra["search"]["column_roots_tried"] == 0
    assert plan.extra["predicted"]["max_cost_ms"] < 0.7 * whole.extra["predicted"]["max_cost_ms"]
    # the whole plan's slowest device holds one hot table alone, the split plan's does not
    assert whole.extra["bottleneck"]["table"] in ("hot_a", "hot_b") and "bottleneck" not in plan.extra


def test_a_table_above_the_share_is_kept_whole_where_a_half_costs_what_the_whole_does():
    plan = NeuroShardSearch().search(ONE_HOT, WidthFreeCostModel(), 0)
    assert plan.extra["search"]["column_roots_tried"] >= 1  # its halves and quarters were priced, and lost
    assert _pieces(plan, "hot_b") == 1 and plan.extra["search"]["split_tables"] == {}
    alone = plan.extra["bottleneck"]
    device = next(s.device for s in plan.shards if s.table == "hot_b")
    assert alone["table"] == "hot_b" and alone["alone"] and alone["device"] == device
    assert alone["predicted_ms"] == pytest.approx(plan.extra["predicted"]["max_cost_ms"], abs=1e-3)
    assert alone["balanced_share_ms"] == pytest.approx(np.mean(plan.extra["predicted"]["total_ms"]), abs=1e-3)
    assert alone["predicted_ms"] > 1.5 * alone["balanced_share_ms"]
    line = f"hot_b alone on device {device}: "
    assert line in format_plan(plan) and "ms predicted, balanced share" in format_plan(plan)


def test_neuroshard_with_bottleneck_roots_is_never_worse_than_the_greedy_baselines():
    for task in (TWO_HOT, ONE_HOT):
        ours = NeuroShardSearch().search(task, FeatureCostModel(), 0).extra["predicted"]["max_cost_ms"]
        for method in ("size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy"):
            theirs = make_searcher(method).search(task, FeatureCostModel(), 0)
            assert ours <= theirs.extra["predicted"]["max_cost_ms"] + 1e-9, method


def test_slowest_alone_names_the_one_shard_of_the_slowest_device_only():
    found = slowest_alone([["t1", "t2"], ["t20[0:64]"], ["t3"]], [50.0, 62.9, 45.8])
    assert found == {"table": "t20", "shard": "t20[0:64]", "alone": True, "device": 1, "predicted_ms": 62.9,
                     "balanced_share_ms": 52.9}
    assert bottleneck_line(found) == "t20[0:64] alone on device 1: 62.9 ms predicted, balanced share 52.9 ms"
    assert slowest_alone([["t1", "t2"], ["t20"]], [70.0, 62.9]) is None  # the slowest holds two
    assert slowest_alone([["t20"]], [62.9]) is None  # one device: nothing to balance


def _measured(shards: list[tuple[str, ...]], total_ms: list[float], **plan: tuple[str, ...]) -> MeasuredPlanCost:
    devices = tuple(DeviceCost(device=d, shards=names, width=128, fwd_ms=ms / 2, bwd_ms=ms / 2, comm_fwd_ms=0.0,
                               comm_bwd_ms=0.0, memory_bytes=2**20, comm_fwd_measured_ms=0.0, comm_bwd_measured_ms=0.0)
                    for d, (names, ms) in enumerate(zip(shards, total_ms)))
    return MeasuredPlanCost(method="neuroshard", batch_size=2048, device_kind="cpu", hardware_kind="cpu-test",
                            device_memory_bytes=2**30, devices=devices, **plan)


def test_the_html_report_says_when_the_measured_slowest_device_holds_one_table_alone(tmp_path):
    # the data-parallel table's replica and the row-wise table's block are on every device: not counted
    cost = _measured([("t20", "dp", "rw[rows 0:5]"), ("t1", "t2", "dp", "rw[rows 5:10]")], [62.9, 42.9],
                     data_parallel=("dp",), row_wise=("rw",))
    line = "t20 alone on device 0: 62.9 ms measured, balanced share 52.9 ms"
    assert bottleneck_line(measured_bottleneck(cost)) == line
    page = write_plan_report(cost, tmp_path, name="p")[0].read_text()
    assert line in page
    assert line in summary_page("t", "intro", [], [("neuroshard", cost)], [])
    balanced = _measured([("t20", "t0"), ("t1", "t2")], [62.9, 42.9])
    assert measured_bottleneck(balanced) is None and "alone" not in write_plan_report(balanced, tmp_path)[0].read_text()
