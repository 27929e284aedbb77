"""The greedy with a measured key: each table timed alone on fbgemm's CPU kernel (tiny tables, a few seconds),
then placed costliest first onto the least-loaded device. Plans are valid, balance the measured costs, and a
table is measured once per searcher."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from timing_settings import FLUSH_MIB

from shardwise.profiling import MeasurementSettings, kernel
from shardwise.search import GreedySearch, RandomSearch, make_searcher, validate_plan
from shardwise.workload import ShardingTask, TableSpec

pytestmark = pytest.mark.integration

#: short timings: these tests check placement and caching, not timing accuracy
FAST = MeasurementSettings(device="cpu", batch_size=256, warmup_iters=1, timing_iters=3, timing_rounds=3,
                           flush_mib=FLUSH_MIB)


def _task(tables, num_devices: int) -> ShardingTask:
    return ShardingTask(num_devices=num_devices, device_memory_bytes=2**30, batch_size=4096, tables=tuple(tables))


def _light(i: int) -> TableSpec:
    return TableSpec(name=f"light{i}", rows=200, dim=8, pooling_factor=1.0, zipf_alpha=1.0)


HEAVY = TableSpec(name="heavy", rows=20000, dim=128, pooling_factor=400.0, zipf_alpha=1.0)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_a_table_measured_costlier_than_all_others_together_lands_alone():
    task = _task([_light(0), HEAVY, _light(1), _light(2)], num_devices=2)
    searcher = make_searcher("measured_greedy", measurement=FAST)
    plan = searcher.search(task, None, 0)
    validate_plan(plan, task)
    ms = dict(zip([t.name for t in task.tables], searcher.keys(task)))
    assert ms["heavy"] > sum(v for k, v in ms.items() if k != "heavy"), ms  # what the test relies on
    device = {s.table: s.device for s in plan.shards}
    assert [t for t, d in device.items() if d == device["heavy"]] == ["heavy"]
    options = plan.extra["provenance"]["options"]
    assert options["key"] == "measured" and options["batch_size"] == 256 and options["device"] == "cpu"


def test_the_plan_balances_measured_costs_better_than_random():
    rng = np.random.default_rng(0)
    tables = [TableSpec(name=f"t{i}", rows=int(rng.integers(500, 5000)), dim=int(rng.choice([16, 32, 64])),
                        pooling_factor=float(rng.uniform(1, 60)), zipf_alpha=1.0) for i in range(9)]
    task = _task(tables, num_devices=3)
    searcher = GreedySearch("measured", measurement=FAST)
    plan = searcher.search(task, None, 0)
    validate_plan(plan, task)
    ms = dict(zip([t.name for t in tables], searcher.keys(task)))

    def spread(p) -> float:
        load = np.zeros(task.num_devices)
        for s in p.shards:
            load[s.device] += ms[s.table]
        return float(load.max() / load.mean())

    random_spread = np.mean([spread(RandomSearch().search(task, None, seed)) for seed in range(8)])
    assert spread(plan) < random_spread
    assert spread(plan) < 1.25  # nine tables on three devices: the greedy gets close to even


def test_tables_are_measured_once_and_the_reference_calibrated_once(monkeypatch):
    calibrations = []
    calibrate = kernel.calibrate_reference
    monkeypatch.setattr(kernel, "calibrate_reference",
                        lambda device, protocol: calibrations.append(device) or calibrate(device, protocol))
    searcher = GreedySearch("measured", measurement=FAST)
    assert searcher.timings is not None and searcher.timings.measured == 0  # building measures nothing
    first = _task([_light(0), _light(1), _light(2)], num_devices=2)
    plan = searcher.search(first, None, 0)
    assert searcher.timings.measured == 3 and len(calibrations) == 1
    assert searcher.search(first, None, 1).shards == plan.shards
    searcher.search(_task([_light(2), _light(0)], num_devices=2), None, 0)  # the same tables in another task
    assert searcher.timings.measured == 3
    searcher.search(_task([_light(0), _light(3)], num_devices=2), None, 0)  # one new table
    assert searcher.timings.measured == 4 and len(calibrations) == 1
    # a pinned reference is never calibrated
    pinned = GreedySearch("measured", measurement=FAST.model_copy(update={"reference_ms": 5.0}))
    pinned.search(first, None, 0)
    assert len(calibrations) == 1
    assert pinned.timings is not None and pinned.timings.device_and_protocol()[1].reference_ms == 5.0
