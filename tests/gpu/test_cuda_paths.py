"""The CUDA paths of the pure-torch code: cost-model training and prediction, the searches that use it, the
DreamShard and AutoShard policies, the profiler's CUDA timers, and (where fbgemm has a CUDA build) shards
whose measured cost follows their work and repeats.

These run only where torch sees a GPU (CI and the developer machines have none; `benchmarks/gpu_check.sh` runs
them on a lent GPU machine). The timers are checked on a torch EmbeddingBag in place of fbgemm's TBE; the shard tests
need a CUDA build of fbgemm (`.gpu/on-device.sh` brings one) and fail without it, naming the import error.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from costmodel_synthetic import comm_rows, cost_frame, synthetic_tables
from search_doubles import AnalyticCostModel, heldout_tasks

from shardwise.costmodel import NeuralCostModel, TrainConfig, train_cost_model
from shardwise.profiling.protocol import DEFAULT_CUDA_TIMER
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


def _bag_kernel(batch: int, rows: int = 200_000, dim: int = 64, pooling: int = 16):
    """A torch EmbeddingBag in fbgemm's TBE's place (the same call: indices, offsets) with one batch of inputs."""
    from shardwise.profiling.kernel import ShardKernel

    device = torch.device(DEVICE)
    generator = torch.Generator().manual_seed(0)
    bag = torch.nn.EmbeddingBag(rows, dim, mode="sum", include_last_offset=True).to(device)
    return ShardKernel(
        tbe=bag,
        indices=torch.randint(0, rows, (batch * pooling,), generator=generator).to(device),
        offsets=(torch.arange(batch + 1) * pooling).to(device),
        grad_output=torch.randn(batch, dim, generator=generator).to(device),
    )


@pytest.mark.parametrize("cuda_timer", ["held", "queued", "graph"])
def test_the_device_timers_time_the_gpus_work_and_flush_its_l2(cuda_timer):
    from shardwise.profiling import TimingProtocol
    from shardwise.profiling.kernel import Timer

    device = torch.device(DEVICE)
    timer = Timer(device, TimingProtocol(cuda_timer=cuda_timer).for_device(device))
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    assert timer.flush_buffer is not None and timer.flush_buffer.numel() * 4 == 2 * l2
    assert timer.flush_buffer.device.type == "cuda"
    small, big = _bag_kernel(2048), _bag_kernel(16 * 2048)
    calls = timer.calls(small, 20)
    fwd, bwd = np.median([c.fwd_ms for c in calls]), np.median([c.bwd_ms for c in calls])
    assert 0 < fwd < 100 and 0 < bwd < 100
    # the host's launch time is reported beside the device's; graphs fall back to the held stream, saying so, and
    # a queue's first call is timed held on its own
    assert all(c.launch_ms is not None and c.launch_ms > 0 for c in calls)
    assert {c.timer for c in calls} <= {cuda_timer, "held"}
    # a 16x larger batch takes clearly longer on the device
    big_fwd = np.median([c.fwd_ms for c in timer.calls(big, 20)])
    assert big_fwd > 2 * fwd
    # calls whose launches outlasted the hold are counted (torch's embedding backward may wait on the GPU inside
    # the call, which no hold covers; fbgemm's TBE must not: test_fbgemm_timer_candidates_agree...)
    assert 0 <= timer.uncovered <= timer.held_calls


def test_events_around_the_launches_read_the_launches_where_they_outlast_the_work():
    """The old timer's failure, kept as a check that the comparison still sees it: at a small batch the events
    read about the host's launch time (6.7x the held timer for fbgemm shards at batch 2048 on an H200), and never
    less than the device's work."""
    from shardwise.profiling import TimingProtocol
    from shardwise.profiling.kernel import Timer

    device = torch.device(DEVICE)
    small = _bag_kernel(2048)
    held = [c.fwd_ms + c.bwd_ms for c in Timer(device, TimingProtocol(cuda_timer="held").for_device(device))
            .calls(small, 20)]
    events = Timer(device, TimingProtocol(cuda_timer="events").for_device(device)).calls(small, 20)
    assert {c.timer for c in events} == {"events"}
    assert np.median([c.fwd_ms + c.bwd_ms for c in events]) >= 0.9 * np.median(held)


@pytest.fixture(scope="module")
def fbgemm_gpu():
    """fbgemm_gpu, loaded. Where torch sees a GPU it must load: a GPU machine without it is a broken setup, which
    these tests report rather than skip."""
    from shardwise.profiling.hardware import import_fbgemm

    try:
        return import_fbgemm()
    except Exception as err:  # noqa: BLE001 - whatever stops the import is what the failure names
        pytest.fail(f"CUDA is available but fbgemm_gpu cannot be imported: {type(err).__name__}: {err}",
                    pytrace=False)


needs_fbgemm = pytest.mark.usefixtures("fbgemm_gpu")
#: DLRM-like tables at the `cluster` preset's row scale (0.1 of 4.1M rows on average)
GPU_TABLES = [
    {"rows": 200_000 + 37_000 * i, "dim": (16, 32, 64, 128)[i % 4], "pooling_factor": 4.0 + 3.0 * (i % 5),
     "zipf_alpha": (0.0, 0.8, 1.05, 1.2)[i % 4]}
    for i in range(12)
]


def _tables(count: int):
    from shardwise.workload import TableSpec

    return [TableSpec(name=f"g{i}", **GPU_TABLES[i]) for i in range(count)]


@needs_fbgemm
@pytest.mark.parametrize("batch", [2048, 65536])
def test_fbgemm_shard_cost_grows_with_its_tables_and_repeats_agree(batch):
    from shardwise.profiling import TimingProtocol, measure_shard

    protocol = TimingProtocol(warmup_iters=3, iters=10)
    counts = [1, 2, 4, 8, 12]
    costs = [measure_shard(_tables(n), batch, device=DEVICE, protocol=protocol) for n in counts]
    totals = [c.total_ms for c in costs]
    assert all(c.timer == DEFAULT_CUDA_TIMER and c.launch_ms is not None for c in costs)
    # the cost follows the work: the kernels, not the launches, are timed
    assert np.corrcoef(counts, totals)[0, 1] >= 0.9, totals
    assert totals[-1] > 2 * totals[0], totals
    # the same shard measured again: within 10% (the bar is 10% for the widest spread)
    again = [measure_shard(_tables(4), batch, device=DEVICE, protocol=protocol).total_ms for _ in range(4)]
    spread = max(again + [totals[2]]) / min(again + [totals[2]]) - 1
    assert spread < 0.10, (totals[2], again)


@needs_fbgemm
def test_fbgemm_timer_candidates_agree_where_kernels_dominate():
    from shardwise.profiling import TimingProtocol
    from shardwise.profiling.kernel import Timer, build_shard_kernel, time_kernel

    device = torch.device(DEVICE)
    kernel = build_shard_kernel(_tables(8), 65536, device=device)
    totals = {name: time_kernel(kernel, device, TimingProtocol(warmup_iters=3, iters=10, cuda_timer=name))
              for name in ("held", "queued", "graph", "events")}
    held = totals["held"].total_ms
    for name, timing in totals.items():
        # where graphs could not be captured (fbgemm's TBE on an H200), the timing says so and was held
        assert timing.timer in (name, "held")
        if name == "events":  # around the launches: the device's work, and some of the host's launch (1.11x)
            assert timing.total_ms >= 0.98 * held, {k: v.total_ms for k, v in totals.items()}
        else:  # the device's work alone: 0.06% apart on an H200
            assert timing.total_ms == pytest.approx(held, rel=0.03), {k: v.total_ms for k, v in totals.items()}
    # the hold covered every call's launches: the host does not wait on the GPU inside a TBE's forward or backward
    timer = Timer(device, TimingProtocol(cuda_timer="held").for_device(device))
    launches = [timer.call(kernel).launch_ms for _ in range(13)]
    assert timer.uncovered == 0, f"{timer.uncovered} of {timer.held_calls} calls not covered (launch ms {launches})"
    # and one hold covered a queue of them: no call fell back to its own hold
    queue = Timer(device, TimingProtocol(cuda_timer="queued").for_device(device))
    assert {c.timer for c in queue.calls(kernel, 13)[1:]} == {"queued"} and queue.cuda_timer == "queued"


@needs_fbgemm
def test_fbgemm_shards_timed_while_the_next_is_built_match_those_timed_alone():
    """The profiler builds the next shard's kernel while the device runs this one's queued calls: the same
    timings (within 3%) as each shard built and timed on its own, in the protocol's GPU warm-up (one call)."""
    from shardwise.profiling import TimingProtocol, measure_shard
    from shardwise.profiling.kernel import measure_shards

    protocol = TimingProtocol(iters=10)
    assert protocol.for_device(DEVICE).warmup_calls == 1
    shards = [_tables(n) for n in (3, 8, 1, 12, 5)]
    alone = [measure_shard(tables, 65536, device=DEVICE, protocol=protocol).total_ms for tables in shards]
    overlapped = [t.total_ms for t in measure_shards(shards, 65536, device=DEVICE, protocol=protocol)]
    assert overlapped == pytest.approx(alone, rel=0.03), (alone, overlapped)
    three = [measure_shard(tables, 65536, device=DEVICE, protocol=TimingProtocol(warmup_iters=3, iters=10)).total_ms
             for tables in shards]
    assert alone == pytest.approx(three, rel=0.03), (alone, three)


@needs_fbgemm
def test_a_freshly_built_fbgemm_kernels_first_held_call_is_covered_at_once():
    """fbgemm's first forward waits for the device (it copies the table dims to the host): the kernel is built with
    that call done, so a held timer's first call on it is covered by its first hold, not timed again."""
    from shardwise.profiling import TimingProtocol
    from shardwise.profiling.kernel import Timer, build_shard_kernel

    device = torch.device(DEVICE)
    for batch in (2048, 65536):
        kernel = build_shard_kernel(_tables(8), batch, device=device)
        # a hold several times an H100 host's launch of such a call (1.0-1.3 ms)
        timer = Timer(device, TimingProtocol(cuda_timer="held").for_device(device), hold_ms=6.0)
        timer.call(kernel)
        assert (timer.retried, timer.uncovered) == (0, 0), f"batch {batch}: hold {timer.hold_ms:.2f} ms"
