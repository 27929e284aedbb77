"""A plan's tables in host memory in TorchRec's terms: the UVM kernel and `CacheParams` emitted and read back, and
what shardwise counts in HBM and host memory for them is what TorchRec's storage estimator counts (meta tensors,
no process group: fbgemm's CPU build has no UVM kernels to run)."""

from __future__ import annotations

import pytest
import torch

from shardwise.search import Plan, Shard
from shardwise.search.plan import TableKernel, plan_host_memory_bytes
from shardwise.search.torchrec_plan import plan_from_module_sharding, to_sharding_plan
from shardwise.workload import ShardingTask, TableSpec, table_hbm_bytes, table_host_bytes

pytestmark = pytest.mark.integration

UVM = ("fused", "fused_uvm_caching", "fused_uvm")
TABLES = (
    TableSpec(name="cached", rows=100_000, dim=64, pooling_factor=3.0, compute_kernels=UVM),
    TableSpec(name="host", rows=50_000, dim=32, pooling_factor=2.0, compute_kernels=UVM),
    TableSpec(name="hbm", rows=1000, dim=16, pooling_factor=1.0),
)
TASK = ShardingTask(num_devices=2, device_memory_bytes=2**30, batch_size=512, tables=TABLES, host_memory_bytes=2**30)
PLAN = Plan(
    num_devices=2,
    method="handmade",
    shards=(Shard(table="cached", col_offset=0, dim=32, device=0), Shard(table="cached", col_offset=32, dim=32, device=1),
            Shard(table="host", col_offset=0, dim=32, device=1), Shard(table="hbm", col_offset=0, dim=16, device=0)),
    kernels={"cached": TableKernel(kernel="fused_uvm_caching", cache_load_factor=0.1),
             "host": TableKernel(kernel="fused_uvm")},
)


def test_the_kernel_and_its_cache_are_emitted_and_read_back() -> None:
    module_plan = to_sharding_plan(PLAN, TASK, module_path="ebc").plan["ebc"]
    cached, host, hbm = module_plan["cached"], module_plan["host"], module_plan["hbm"]
    assert (cached.sharding_type, cached.compute_kernel) == ("column_wise", "fused_uvm_caching")
    assert cached.cache_params is not None and cached.cache_params.load_factor == 0.1
    assert (host.compute_kernel, host.cache_params) == ("fused_uvm", None)
    assert (hbm.compute_kernel, hbm.cache_params) == ("fused", None)
    back = plan_from_module_sharding(module_plan, 2, "handmade")
    assert back.kernels == PLAN.kernels
    assert sorted(back.shards, key=lambda s: (s.table, s.col_offset)) == sorted(PLAN.shards,
                                                                                key=lambda s: (s.table, s.col_offset))


def test_a_caching_sharding_without_a_load_factor_reads_as_torchrecs_default() -> None:
    module_plan = to_sharding_plan(PLAN, TASK, module_path="ebc").plan["ebc"]
    module_plan["cached"].cache_params = None
    assert plan_from_module_sharding(module_plan, 2, "m").kernels["cached"].cache_load_factor == 0.2


def _torchrec_storage(table: TableSpec):
    """TorchRec's storage estimate of `table` alone on one CUDA rank, on its kernel (rowwise Adagrad)."""
    # torchrec: heavy, optional
    from torchrec.distributed.planner.shard_estimators import calculate_shard_storages
    from torchrec.distributed.planner.types import SharderData
    from torchrec.distributed.types import StorageUsageType
    from torchrec.optim import RowWiseAdagrad

    tensor = torch.empty(table.rows, table.dim, device="meta")
    tensor._optimizer_classes = [RowWiseAdagrad]  # type: ignore[attr-defined]
    return calculate_shard_storages(
        sharder_data=SharderData(fused_params={}, qcomm_dtype_sizes={}, storage_usage_type=StorageUsageType.BASE),
        sharding_type="table_wise", tensor=tensor, compute_device="cuda", compute_kernel=table.compute_kernel or "fused",
        shard_sizes=[[table.rows, table.dim]], batch_sizes=[512], world_size=2, local_world_size=2,
        input_lengths=[table.pooling_factor], num_poolings=[1.0], caching_ratio=table.cache_load_factor or 0.2,
        is_pooled=True, input_data_type_size=8, output_data_type_size=4,
    )[0]


@pytest.mark.parametrize(("kernel", "load_factor"), [("fused_uvm_caching", 0.1), ("fused_uvm_caching", 0.5),
                                                     ("fused_uvm", None)])
def test_hbm_and_host_bytes_are_torchrecs_storage_estimate(kernel: str, load_factor: float | None) -> None:
    fused = TableSpec(name="t", rows=100_000, dim=64, pooling_factor=3.0)
    table = fused.on_kernel(kernel, load_factor)  # type: ignore[arg-type]
    # TorchRec adds the batch's ids and pooled outputs to HBM whatever the kernel (shardwise counts its own buffers)
    io_bytes = _torchrec_storage(fused).hbm - table_hbm_bytes(fused)
    storage = _torchrec_storage(table)
    assert table_hbm_bytes(table) == storage.hbm - io_bytes
    assert table_host_bytes(table) == storage.ddr


def test_a_devices_host_memory_is_its_uvm_shards_state() -> None:
    cached_half = TABLES[0].on_kernel("fused_uvm_caching", 0.1).with_dim(32)
    assert plan_host_memory_bytes(PLAN, TASK) == [table_host_bytes(cached_half),
                                                  table_host_bytes(TABLES[1].on_kernel("fused_uvm"))
                                                  + table_host_bytes(cached_half)]
