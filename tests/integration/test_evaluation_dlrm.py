"""End-to-end: a TorchRec DLRM sharded by a plan with DistributedModelParallel over 2 gloo processes."""

from __future__ import annotations

import pytest
import torch

from shardwise.evaluation.dlrm import build_dlrm, measure_dlrm_throughputs, synthetic_batch
from shardwise.search.plan import Plan, PlanError, Shard
from shardwise.workload import ShardingTask, TableSpec

pytestmark = pytest.mark.integration


def _task(dims: list[int]) -> ShardingTask:
    tables = tuple(
        TableSpec(name=f"t{i}", rows=2000, dim=d, pooling_factor=5.0, zipf_alpha=1.05) for i, d in enumerate(dims)
    )
    return ShardingTask(num_devices=2, device_memory_bytes=2**30, batch_size=256, tables=tables)


def _plan(task: ShardingTask, devices: list[int]) -> Plan:
    shards = tuple(Shard(table=t.name, col_offset=0, dim=t.dim, device=d) for t, d in zip(task.tables, devices))
    return Plan(num_devices=2, shards=shards, method="test")


def test_unsharded_dlrm_trains_on_synthetic_batches_of_mixed_width_tables() -> None:
    task = _task([16, 32, 8])
    model = build_dlrm(task, dense_device=torch.device("cpu"), embedding_device=torch.device("cpu"))
    dense, kjt, labels = synthetic_batch(task, 64, rank=0, step=0)
    assert kjt.keys() == ["t0", "t1", "t2"] and dense.shape == (64, 13)
    logits = model(dense, kjt)
    assert logits.shape == (64, 1)
    torch.nn.functional.binary_cross_entropy_with_logits(logits.squeeze(-1), labels).backward()


@pytest.mark.slow
def test_dlrm_throughput_of_two_plans_on_two_gloo_processes_is_positive(capfd: pytest.CaptureFixture[str]) -> None:
    task = _task([16, 32, 16])
    # t1 split column-wise over both ranks, as NeuroShard's plans do
    shards = (
        Shard(table="t0", col_offset=0, dim=16, device=0),
        Shard(table="t1", col_offset=0, dim=16, device=0),
        Shard(table="t1", col_offset=16, dim=16, device=1),
        Shard(table="t2", col_offset=0, dim=16, device=1),
    )
    # two plans in turn in one start of the ranks (validate --compare, the benchmark's methods of a task)
    result, together = measure_dlrm_throughputs(
        task, [Plan(num_devices=2, shards=shards, method="cw"), _plan(task, [0, 0, 0])], iters=4, warmup=2,
        batch_size=128, device="cpu",
    )
    assert together.method == "test" and len(together.iter_ms) == 4 and together.samples_per_s > 0
    assert result.method == "cw" and result.world_size == 2 and result.backend == "gloo"
    assert len(result.iter_ms) == 4 and all(ms > 0 for ms in result.iter_ms)
    assert result.samples_per_s > 0
    assert result.global_batch_size == 128
    assert result.samples_per_s == pytest.approx(128 * 4 / (sum(result.iter_ms) / 1e3))
    # the ranks' library notices (torchrec's DDP deprecation, torch.fx's is_fx_tracing) stay off the console
    err = capfd.readouterr().err
    assert "broadcast_buffers" not in err and "is_fx_tracing" not in err, err


def test_dlrm_throughput_refuses_an_invalid_plan() -> None:
    task = _task([16, 16])
    with pytest.raises(PlanError, match="device"):
        measure_dlrm_throughputs(task, [_plan(task, [0, 2])], iters=1, warmup=0, batch_size=16, device="cpu")



def test_plans_trained_together_must_share_the_ranks() -> None:
    task = _task([16, 16])
    plan = _plan(task, [0, 1])
    with pytest.raises(ValueError, match="num_devices"):
        measure_dlrm_throughputs(task, [plan, plan], world_size=3, iters=1, warmup=0, device="cpu")
    with pytest.raises(ValueError, match="nothing to train"):
        measure_dlrm_throughputs(task, [], iters=1, warmup=0, device="cpu")
