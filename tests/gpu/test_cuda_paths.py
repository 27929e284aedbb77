"""The CUDA paths of the pure-torch code: cost-model training and prediction, the searches that use it, the
DreamShard and AutoShard policies, and the profiler's CUDA-event timer.

These run only where torch sees a GPU (CI and the developer machines have none; `benchmarks/gpu_check.sh` runs
them on a lent GPU machine). fbgemm is not needed: the timer is checked on a torch EmbeddingBag in its place.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from costmodel_synthetic import comm_rows, cost_frame, synthetic_tables
from search_doubles import AnalyticCostModel, heldout_tasks

from shardwise.costmodel import NeuralCostModel, TrainConfig, train_cost_model
from shardwise.search import make_searcher, simulate
from shardwise.search.autoshard import AutoShardConfig, AutoShardPolicy, train_autoshard
from shardwise.search.dreamshard import DreamShardConfig, DreamShardPolicy, train_dreamshard
from shardwise.search.placement import prepare_task

DEVICE = "cuda"
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.fixture(scope="module")
def frame():
    import pandas as pd

    # as the CPU training test's data (test_costmodel_train.py), with all-to-all rows
    tables = {"a": synthetic_tables("a", 30, 0), "h": synthetic_tables("h", 8, 1)}
    return pd.concat([cost_frame(tables, {"a": 300, "h": 80}, 0), comm_rows(40, 0)], ignore_index=True)


@pytest.fixture(scope="module")
def cuda_model(frame):
    torch.cuda.reset_peak_memory_stats()
    trained = train_cost_model(frame, 0, TrainConfig(epochs=120, comm_epochs=60, device=DEVICE, progress=False))
    return (*trained, torch.cuda.max_memory_allocated())


def test_cost_model_trains_on_cuda_and_comes_back_on_the_cpu(cuda_model):
    model, report, gpu_bytes = cuda_model
    assert gpu_bytes > 0  # the networks and batches lived on the GPU while training
    assert next(model.compute_net.parameters()).device.type == "cpu"  # as training returns every model
    assert model.has_comm
    # a real fit, not a broken run: the bound the CPU training test sets on the same data
    assert report.metrics["neural_heldout_tables_total_mape_pct"] < 10
    tables = synthetic_tables("new", 5, 9)
    ms = model.predict_compute([tables[:2], tables[2:]])
    assert ms.shape == (2, 2) and np.all(np.isfinite(ms)) and np.all(ms > 0)


def test_a_model_trained_on_cuda_loads_on_cpu_with_the_same_predictions(cuda_model, tmp_path):
    model, _, _ = cuda_model
    model.to(DEVICE).save(tmp_path / "model")
    on_cpu = NeuralCostModel.load(tmp_path / "model", device="cpu")
    assert next(model.compute_net.parameters()).device.type == DEVICE
    tables = synthetic_tables("new", 8, 4)
    shards = [tables[:3], tables[3:5], tables[5:]]
    np.testing.assert_allclose(on_cpu.predict_compute(shards), model.predict_compute(shards), rtol=1e-4)
    widths, compute = np.array([[96.0, 64.0, 128.0]]), np.array([[1.0, 0.7, 1.3]])
    np.testing.assert_allclose(on_cpu.predict_comm(widths, compute), model.predict_comm(widths, compute), rtol=1e-4)


def test_neuroshard_plans_the_same_with_the_model_on_cuda_or_cpu(cuda_model, tmp_path):
    model, _, _ = cuda_model
    model.to(DEVICE).save(tmp_path / "model")
    on_cpu = NeuralCostModel.load(tmp_path / "model", device="cpu")
    task = heldout_tasks(1, num_tables=24, num_devices=4)[0]
    on_gpu_plan = make_searcher("neuroshard").search(task, model, 0)
    on_cpu_plan = make_searcher("neuroshard").search(task, on_cpu, 0)
    # float32 sums differ in the last bits between devices: a near-tie may break the other way, costs may not move
    gpu_cost, cpu_cost = simulate(on_gpu_plan, task, on_cpu).max_cost_ms, simulate(on_cpu_plan, task, on_cpu).max_cost_ms
    assert gpu_cost == pytest.approx(cpu_cost, rel=1e-3)


@pytest.mark.parametrize("method", ["dreamshard", "autoshard"])
def test_policies_train_and_plan_on_cuda_and_move_to_cpu(method, tmp_path):
    cost_model = AnalyticCostModel()
    tasks = heldout_tasks(2, num_tables=10, num_devices=2)
    if method == "dreamshard":
        config = DreamShardConfig(hidden=8, iterations=1, episodes_per_iteration=2, rollouts=4, cost_steps=5,
                                  initial_random_plans=4)
        policy, _ = train_dreamshard(cost_model, tasks, seed=0, config=config, device=DEVICE, progress=False)
        loader = DreamShardPolicy.load
    else:
        policy, _ = train_autoshard(cost_model, tasks, seed=0, config=AutoShardConfig(hidden=8, episodes=4),
                                    device=DEVICE, progress=False)
        loader = AutoShardPolicy.load
    assert policy.device.type == DEVICE
    prepared = prepare_task(tasks[0], cost_model)
    on_gpu = policy.candidates(cost_model, prepared, samples=3, seed=5)
    policy.save(tmp_path / method)
    on_cpu = loader(tmp_path / method, device="cpu").candidates(cost_model, prepared, samples=3, seed=5)
    # every candidate is a legal placement: one device per table, within the task's devices
    for assignment in on_gpu:
        assert assignment.shape == (prepared.num_tables,)
        assert assignment.min() >= 0 and assignment.max() < prepared.num_devices
    # the greedy placement is the same on both devices (sampling uses the CPU generator on both)
    np.testing.assert_array_equal(on_gpu[0], on_cpu[0])


def test_the_timer_uses_cuda_events_and_flushes_the_gpus_l2():
    from shardwise.profiling import TimingProtocol
    from shardwise.profiling.kernel import ShardKernel, _Timer

    device = torch.device("cuda")
    batch, rows, dim, pooling = 2048, 200_000, 64, 16
    generator = torch.Generator().manual_seed(0)
    bag = torch.nn.EmbeddingBag(rows, dim, mode="sum", include_last_offset=True).to(device)
    kernel = ShardKernel(  # a torch EmbeddingBag stands in for fbgemm's TBE (same call: indices, offsets)
        tbe=bag,
        indices=torch.randint(0, rows, (batch * pooling,), generator=generator).to(device),
        offsets=(torch.arange(batch + 1) * pooling).to(device),
        grad_output=torch.randn(batch, dim, generator=generator).to(device),
        per_table=(),
    )
    timer = _Timer(device, TimingProtocol().for_device(device))
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    assert timer.flush_buffer is not None and timer.flush_buffer.numel() * 4 == 2 * l2
    assert timer.flush_buffer.device.type == "cuda"
    timings = [timer.run(kernel) for _ in range(20)]
    fwd, bwd = np.median(np.array(timings), axis=0)
    assert 0 < fwd < 100 and 0 < bwd < 100
    # the events time the GPU's work, not the launch: a 16x larger batch takes clearly longer
    big = ShardKernel(tbe=bag, indices=kernel.indices.repeat(16), offsets=torch.arange(16 * batch + 1, device=device) * pooling,
                      grad_output=kernel.grad_output.repeat(16, 1), per_table=())
    big_fwd = np.median([timer.run(big)[0] for _ in range(20)])
    assert big_fwd > 2 * fwd
