"""A plan's tables in host memory: their kernels in `shardwise.plan/v1`, their memory in HBM and in host memory, and
the plans validation refuses."""

from __future__ import annotations

import pytest

from shardwise.search import Plan, PlanError, Shard, plan_from_json, validate_plan
from shardwise.search.plan import HostMemoryError, TableKernel, plan_host_memory_bytes, plan_memory_bytes
from shardwise.workload import (
    ShardingTask,
    TableSpec,
    table_hbm_bytes,
    table_host_bytes,
    table_memory_bytes,
    task_fits,
)

UVM = ("fused", "fused_uvm_caching", "fused_uvm")


def two_tables(kernels: tuple[str, ...] | None = UVM, host: int | None = 2**30) -> ShardingTask:
    specs = (TableSpec(name="big", rows=1_000_000, dim=64, pooling_factor=4.0, compute_kernels=kernels),
             TableSpec(name="small", rows=1000, dim=32, pooling_factor=2.0))
    return ShardingTask(num_devices=2, device_memory_bytes=2**28, batch_size=1024, tables=specs,
                        host_memory_bytes=host)


def cached_plan(load_factor: float = 0.2) -> Plan:
    return Plan(num_devices=2, shards=(Shard(table="big", col_offset=0, dim=64, device=0),
                                       Shard(table="small", col_offset=0, dim=32, device=1)),
                kernels={"big": TableKernel(kernel="fused_uvm_caching", cache_load_factor=load_factor)})


def test_a_caching_table_keeps_its_state_in_host_memory_and_a_cache_with_its_bookkeeping_in_hbm() -> None:
    table = TableSpec(name="t", rows=1_000_000, dim=64, pooling_factor=4.0)
    state = table_memory_bytes(table.rows, table.dim)
    cached = table.on_kernel("fused_uvm_caching", 0.2)
    # TorchRec's storage estimator: state x load factor, plus rows x (4 + 16 x load factor) bytes of cache state
    assert table_hbm_bytes(cached) == round(0.2 * state) + round(1_000_000 * (4 + 0.2 * 16))
    assert table_host_bytes(cached) == state and table_host_bytes(table) == 0
    assert table_hbm_bytes(table.on_kernel("fused_uvm")) == 0 and table_host_bytes(table.on_kernel("fused_uvm")) == state
    assert table_hbm_bytes(table) == state


def test_a_plan_with_kernels_round_trips_and_a_plan_without_reads_as_before() -> None:
    plan = cached_plan()
    doc = plan.to_json()
    assert doc["kernels"] == {"big": {"kernel": "fused_uvm_caching", "cache_load_factor": 0.2}}
    assert plan_from_json(doc).kernels == plan.kernels
    plain = plan.model_copy(update={"kernels": {}})
    assert "kernels" not in plain.to_json()
    assert plan.compute_kernel("big") == "fused_uvm_caching" and plan.compute_kernel("small") == "fused"
    uvm = plan_from_json({**doc, "kernels": {"big": {"kernel": "fused_uvm"}}})
    assert "cache_load_factor" not in uvm.to_json()["kernels"]["big"]


@pytest.mark.parametrize("entry", [{"kernel": "fused_uvm_caching"}, {"kernel": "fused_uvm", "cache_load_factor": 0.2},
                                   {"kernel": "fused_uvm_caching", "cache_load_factor": 1.5}, {"kernel": "ssd"}])
def test_a_kernel_entry_without_its_cache_or_with_a_wrong_one_is_refused(entry: dict) -> None:
    doc = {**cached_plan().to_json(), "kernels": {"big": entry}}
    with pytest.raises(PlanError, match="kernels"):
        plan_from_json(doc)


def test_memory_counts_the_cache_in_hbm_and_the_table_in_host_memory() -> None:
    task = two_tables()
    plan = cached_plan()
    validate_plan(plan, task)
    fused = plan_memory_bytes(plan.model_copy(update={"kernels": {}}), task)
    hbm = plan_memory_bytes(plan, task)
    assert hbm[1] == fused[1] and hbm[0] < fused[0]
    assert plan_host_memory_bytes(plan, task) == [table_memory_bytes(1_000_000, 64), 0]
    assert plan_memory_bytes(cached_plan(0.5), task)[0] > hbm[0]


def test_a_plan_over_host_memory_is_refused_naming_the_device_and_the_tier() -> None:
    with pytest.raises(HostMemoryError) as err:
        validate_plan(cached_plan(), two_tables(host=2**20))
    assert str(err.value).startswith("device 0 needs") and "of host memory, over its host_memory_bytes" in str(err.value)
    with pytest.raises(HostMemoryError, match="sets no host_memory_bytes"):
        validate_plan(cached_plan(), two_tables(host=None))
    over_hbm = two_tables().model_copy(update={"device_memory_bytes": 2**20})
    with pytest.raises(PlanError, match=r"^device 0 needs .* GiB, over its cap of 0.001 GiB of device memory by"):
        validate_plan(cached_plan(), over_hbm)


def test_a_kernel_its_plan_space_forbids_is_refused() -> None:
    with pytest.raises(PlanError, match="does not allow it"):
        validate_plan(cached_plan(), two_tables(kernels=None))
    with pytest.raises(PlanError, match="does not allow it"):
        validate_plan(cached_plan(), two_tables(kernels=("fused", "fused_uvm")))


def test_a_data_parallel_table_stays_in_hbm() -> None:
    task = two_tables()
    plan = Plan(num_devices=2, shards=(Shard(table="big", col_offset=0, dim=64, device=0),), data_parallel=("small",),
                kernels={"small": TableKernel(kernel="fused_uvm")})
    with pytest.raises(PlanError, match="data_parallel and runs 'fused_uvm'"):
        validate_plan(plan, task)


def test_task_fits_counts_what_a_table_allowed_off_hbm_keeps_there() -> None:
    tight = two_tables().model_copy(update={"device_memory_bytes": 2**26})
    assert task_fits(tight) is None
    assert "no plan fits" in (task_fits(tight.model_copy(update={"host_memory_bytes": None})) or "")


def test_a_table_on_a_cache_needs_a_load_factor_and_only_then() -> None:
    table = TableSpec(name="t", rows=10, dim=4, pooling_factor=1.0)
    with pytest.raises(ValueError, match="needs a cache_load_factor"):
        TableSpec(name="t", rows=10, dim=4, pooling_factor=1.0, compute_kernel="fused_uvm_caching")
    with pytest.raises(ValueError, match="only"):
        TableSpec(name="t", rows=10, dim=4, pooling_factor=1.0, cache_load_factor=0.5)
    with pytest.raises(ValueError, match="compute_kernels is empty"):
        TableSpec(name="t", rows=10, dim=4, pooling_factor=1.0, compute_kernels=())
    assert "compute_kernels" not in table.model_dump(mode="json")
