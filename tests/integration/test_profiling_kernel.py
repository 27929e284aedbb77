"""The real fbgemm CPU kernel: correct forward, costs that grow with the work, fused cheaper than separate."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from shardwise.profiling.kernel import (
    TimingProtocol,
    build_shard_kernel,
    calibrate_reference,
    measure_shard,
)
from shardwise.workload import TableSpec

pytestmark = pytest.mark.integration

BATCH = 512


@pytest.fixture(scope="module")
def protocol() -> TimingProtocol:
    torch.set_num_threads(1)
    base = TimingProtocol(warmup_iters=2, iters=7, calibration_runs=20).for_device("cpu")
    return base.model_copy(update={"reference_ms": calibrate_reference("cpu", base)})


def total_ms(tables: list[TableSpec], protocol: TimingProtocol) -> float:
    timing = measure_shard(tables, BATCH, device="cpu", protocol=protocol)
    assert timing.fwd_ms > 0 and timing.bwd_ms > 0 and timing.reference_ms == protocol.reference_ms
    # the CPU times with its clock and has no launch to report (the host runs the kernel itself)
    assert timing.timer == protocol.clock and timing.launch_ms is None
    return timing.total_ms


def test_forward_matches_embedding_bag_sum() -> None:
    tables = [
        TableSpec(name="a", rows=50, dim=8, pooling_factor=3.0, zipf_alpha=1.1),
        TableSpec(name="b", rows=300, dim=16, pooling_factor=0.0),  # empty bags everywhere
        TableSpec(name="c", rows=7, dim=4, pooling_factor=5.0),
    ]
    kernel = build_shard_kernel(tables, 32, device="cpu", optimizer="sgd")
    out = kernel.forward().detach()
    weights = kernel.tbe.split_embedding_weights()
    col = 0
    for table, weight, (lengths, indices) in zip(tables, weights, kernel.per_table):
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]))
        expected = torch.nn.functional.embedding_bag(
            torch.from_numpy(indices), weight.float(), offsets, mode="sum"
        )
        torch.testing.assert_close(out[:, col : col + table.dim], expected)
        col += table.dim
    assert col == out.shape[1]


def test_cost_grows_with_pooling_factor(protocol: TimingProtocol) -> None:
    low, high = [], []
    for i in range(3):
        base = TableSpec(name=f"p{i}", rows=20_000, dim=32 + 32 * i, pooling_factor=2.0)
        low.append(total_ms([base], protocol))
        high.append(total_ms([base.model_copy(update={"pooling_factor": 40.0})], protocol))
    assert np.mean(high) > 1.3 * np.mean(low)


def test_cost_grows_with_rows_times_dim(protocol: TimingProtocol) -> None:
    small, large = [], []
    for i in range(3):
        pooling = 8.0 + 4 * i
        small.append(total_ms([TableSpec(name=f"s{i}", rows=1_000, dim=8, pooling_factor=pooling)], protocol))
        large.append(total_ms([TableSpec(name=f"l{i}", rows=200_000, dim=128, pooling_factor=pooling)], protocol))
    assert np.mean(large) > 1.3 * np.mean(small)


def test_fused_shard_costs_less_than_its_tables_alone(protocol: TimingProtocol) -> None:
    tables = [
        TableSpec(name=f"f{i}", rows=5_000 * (i + 1), dim=16 * (1 + i % 4), pooling_factor=4.0 + 3 * i,
                  zipf_alpha=1.05)
        for i in range(6)
    ]
    fused = total_ms(tables, protocol)
    separate = sum(total_ms([t], protocol) for t in tables)
    assert fused < separate


def test_adam_on_cpu_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="adam"):
        measure_shard([TableSpec(name="t", rows=10, dim=4, pooling_factor=1.0)], 8, device="cpu",
                      optimizer="adam")


def test_fp16_weights_and_sgd_run() -> None:
    timing = measure_shard(
        [TableSpec(name="t", rows=1000, dim=16, pooling_factor=4.0)], 64, device="cpu",
        protocol=TimingProtocol(warmup_iters=1, iters=3, reference_normalised=False),
        optimizer="sgd", weights_precision="fp16",
    )
    assert timing.reference_ms is None and timing.fwd_ms == timing.raw_fwd_ms > 0


def test_fbgemm_configuration_logs_hidden_unless_asked(caplog: pytest.LogCaptureFixture) -> None:
    """fbgemm logs each kernel's configuration through the root logger: a pipeline step (root at INFO) built
    thousands and its log grew by megabytes. Shown only with the fbgemm_gpu logger at INFO (`shardwise -v`)."""
    tables = [TableSpec(name="a", rows=100, dim=8, pooling_factor=2.0)]
    caplog.set_level(logging.INFO)  # the root logger, as under KFP's executor
    logging.getLogger("shardwise.test").info("a log of ours")
    build_shard_kernel(tables, 16)
    assert [r.getMessage() for r in caplog.records] == ["a log of ours"]
    assert logging.getLogger().filters == []  # nothing left behind

    caplog.clear()
    caplog.set_level(logging.INFO, logger="fbgemm_gpu")
    build_shard_kernel(tables, 16)
    assert any(r.getMessage().startswith("[TBE=") for r in caplog.records)


def test_the_dense_kernel_is_torchrecs_data_parallel_step_and_costs_every_row() -> None:
    """TorchRec's data-parallel kernel: fbgemm's dense TBE, its gradient nn.EmbeddingBag's, and the SGD step over
    every row in backward."""
    tables = [TableSpec(name="a", rows=50, dim=8, pooling_factor=3.0, zipf_alpha=1.1),
              TableSpec(name="c", rows=7, dim=4, pooling_factor=5.0)]
    kernel = build_shard_kernel(tables, 32, device="cpu", compute_kernel="dense")
    before = kernel.tbe.weights.detach().clone()
    out = kernel.forward()
    out.backward(kernel.grad_output)
    grads, col, start = [], 0, 0
    for table, (lengths, indices) in zip(tables, kernel.per_table):
        weight = before[start : start + table.rows * table.dim].view(table.rows, table.dim).requires_grad_()
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]))
        pooled = torch.nn.functional.embedding_bag(torch.from_numpy(indices), weight, offsets, mode="sum")
        torch.testing.assert_close(out[:, col : col + table.dim].detach(), pooled.detach())
        pooled.backward(kernel.grad_output[:, col : col + table.dim])
        grads.append(weight.grad.flatten())
        col, start = col + table.dim, start + table.rows * table.dim
    # the step: weights - lr x the dense gradient, then the gradient dropped for the next step
    torch.testing.assert_close(kernel.tbe.weights.detach(), before - 0.01 * torch.cat(grads))
    assert kernel.tbe.weights.grad is None
    with pytest.raises(ValueError, match="compute_kernel 'sparse' is not one of"):
        build_shard_kernel(tables, 32, device="cpu", compute_kernel="sparse")  # type: ignore[arg-type]


def test_the_dense_kernels_backward_grows_with_the_tables_rows_at_the_same_lookups(protocol: TimingProtocol) -> None:
    """The dense gradient and the optimizer's step cover every row: 40x the rows at the same lookups costs a dense
    kernel's backward far more, and the fused kernel's (which touches the rows looked up) far less than that."""
    small = [TableSpec(name=f"s{i}", rows=5_000, dim=64, pooling_factor=4.0) for i in range(2)]
    large = [t.model_copy(update={"rows": 200_000}) for t in small]

    def bwd(tables: list[TableSpec], compute_kernel: str) -> float:
        return measure_shard(tables, BATCH, device="cpu", protocol=protocol, compute_kernel=compute_kernel).bwd_ms

    dense_growth = bwd(large, "dense") / bwd(small, "dense")
    fused_growth = bwd(large, "fused") / bwd(small, "fused")
    assert dense_growth > 4 and dense_growth > 2 * fused_growth


def test_timing_the_dense_kernel_leaves_the_console_quiet() -> None:
    """torch warns of a missing autograd kernel on the dense TBE's backward (fbgemm's lookup reaches autograd through
    a composite function; the gradient is right, above): a profile must not print it."""
    import subprocess
    import sys

    code = ("from shardwise.profiling.kernel import measure_shard, TimingProtocol\n"
            "from shardwise.workload import TableSpec\n"
            "measure_shard([TableSpec(name='a', rows=100, dim=8, pooling_factor=2.0)], 16, device='cpu', "
            "protocol=TimingProtocol(warmup_iters=1, iters=2, calibration_runs=2), compute_kernel='dense')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "autograd kernel" not in run.stderr, run.stderr
