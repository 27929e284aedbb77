"""Timing settings and index data preparation (no kernels run here; see tests/integration)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from shardwise.profiling import MeasurementSettings
from shardwise.profiling.batches import fit_batch, host_table_batch
from shardwise.profiling.comm import expected_received, local_batch_sizes, pooled_output
from shardwise.profiling.hardware import hardware_info, hardware_kind
from shardwise.profiling.kernel import TimingProtocol
from shardwise.workload import TableSpec, sample_batch, stable_seed


def test_protocol_defaults_depend_on_the_device() -> None:
    cpu = TimingProtocol().for_device("cpu")
    assert cpu.reference_normalised is True and cpu.clock == "thread"
    assert TimingProtocol(num_threads=2).for_device("cpu").clock == "wall"
    assert TimingProtocol(reference_normalised=False).for_device("cpu").reference_normalised is False
    settings = json.loads(TimingProtocol(reference_ms=1.5).settings_json())
    assert "reference_ms" not in settings and settings["iters"] == 10
    # warm-up: a CPU's 3 calls (its stored settings as before), a GPU's one (its first, allocating, call); asked, kept
    assert cpu.warmup_calls == 3 and json.loads(cpu.settings_json())["warmup_iters"] == 3
    assert TimingProtocol(warmup_iters=0).for_device("cpu").warmup_calls == 0
    assert MeasurementSettings(warmup_iters=2).protocol().for_device("cpu").warmup_calls == 2
    with pytest.raises(ValueError, match="for a device first"):
        _ = TimingProtocol().warmup_calls


@pytest.mark.parametrize(("cache_mib", "flush_mib"), [(16, 32), (32, 64), (480, 64)])
def test_the_flush_is_twice_the_last_level_cache_up_to_its_cap(monkeypatch, cache_mib, flush_mib) -> None:
    from shardwise.profiling import hardware, protocol

    monkeypatch.setattr(hardware, "_cpu_last_level_cache_bytes", lambda: cache_mib * 2**20)
    assert protocol.MAX_CPU_FLUSH_BYTES == 64 * 2**20
    decided = TimingProtocol().for_device("cpu")
    assert decided.flush_bytes == flush_mib * 2**20
    # what was flushed is stored with every row; a size asked for is kept
    assert json.loads(decided.settings_json())["flush_bytes"] == flush_mib * 2**20
    assert TimingProtocol(flush_bytes=2**20).for_device("cpu").flush_bytes == 2**20
    # a plan measurement can ask for its own size (0: none)
    assert MeasurementSettings(flush_mib=8).protocol().for_device("cpu").flush_bytes == 8 * 2**20
    assert MeasurementSettings(flush_mib=0).protocol().flush_cache is False


def test_the_timer_overwrites_the_protocols_flush_before_each_call(monkeypatch) -> None:
    import torch

    from shardwise.profiling import kernel

    class Counting:
        calls = 0

        def forward(self):
            Counting.calls += 1
            return torch.ones(2, requires_grad=True) * 2

        grad_output = torch.ones(2)

    timer = kernel.Timer(torch.device("cpu"), TimingProtocol(flush_bytes=4096).for_device("cpu"))
    assert timer.flush_buffer is not None and timer.flush_buffer.numel() * 4 == 4096
    before = timer.flush_buffer.sum().item()
    timer.run(Counting())  # type: ignore[arg-type]
    assert timer.flush_buffer.sum().item() == before + 1024 and Counting.calls == 1
    assert kernel.Timer(torch.device("cpu"), TimingProtocol(flush_cache=False).for_device("cpu")).flush_buffer is None


def test_bad_protocol_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="iters"):
        TimingProtocol(iters=0)
    with pytest.raises(ValidationError, match="warmup"):
        TimingProtocol(warmup_iter=3)


def test_index_data_is_folded_into_the_rows_and_fitted_to_the_batch() -> None:
    table = TableSpec(name="t", rows=10, dim=8, pooling_factor=3.0)
    lengths, indices = host_table_batch(table, 16, {"t": (np.array([2, 1]), np.array([5, 17, 123]))})
    assert lengths.tolist() == [2, 1] * 8
    assert indices.tolist() == [5, 7, 3] * 8
    lengths, indices = fit_batch(torch.tensor([1, 2, 3]), torch.arange(6), 2)
    assert lengths.tolist() == [1, 2] and indices.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="no index data"):
        host_table_batch(table, 4, {"other": (np.array([1]), np.array([0]))})
    with pytest.raises(ValueError, match="lengths sum"):
        fit_batch(torch.tensor([2]), torch.arange(3), 1)


def test_column_slices_share_their_source_tables_index_data() -> None:
    table = TableSpec(name="t", rows=1000, dim=64, pooling_factor=5.0, zipf_alpha=1.1)
    half = table.with_dim(32, name="t[0:32]")
    a, b = host_table_batch(table, 64), host_table_batch(half, 64)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    expected = sample_batch(table, 64, stable_seed("t"))
    assert np.array_equal(a[1], expected[1])


def test_cuda_timer_is_decided_for_cuda_and_left_out_on_cpu() -> None:
    cpu = TimingProtocol(cuda_timer="graph").for_device("cpu")
    # a CPU times with its clock: no CUDA timer is stored, so CPU rows' settings are as before the timers existed
    assert cpu.cuda_timer is None and "cuda_timer" not in json.loads(cpu.settings_json())
    if torch.cuda.is_available():
        assert TimingProtocol().for_device("cuda").cuda_timer == "queued"
        assert TimingProtocol().for_device("cuda").warmup_calls == 1
        assert json.loads(TimingProtocol(cuda_timer="graph").for_device("cuda").settings_json())["cuda_timer"] == "graph"
    with pytest.raises(ValidationError, match="cuda_timer"):
        TimingProtocol(cuda_timer="profiler")


def test_hardware_kind_names_cpu_and_cores() -> None:
    kind = hardware_kind("cpu")
    assert kind.startswith("cpu-") and kind.endswith("c") and kind == kind.lower()
    info = hardware_info("cpu")
    assert info["hardware_kind"] == kind and info["cpu_count"] >= 1 and info["fbgemm_version"]


def test_all_to_all_expectation_gives_each_device_its_batch_slice() -> None:
    assert local_batch_sizes(10, 4) == [3, 3, 2, 2]
    got = expected_received([2, 3], batch_size=5, rank=1)
    assert got.shape == (2, 5)  # rows 3..4 of both devices' outputs
    assert got[:, :2].equal(pooled_output(0, 2, 5, got.device)[3:])
    assert got[:, 2:].equal(pooled_output(1, 3, 5, got.device)[3:])


def test_an_fbgemm_build_that_cannot_load_here_is_one_error_saying_which_build_is_needed(monkeypatch):
    """The image's CUDA fbgemm on a machine without the NVIDIA driver fails to load: one line, not a traceback."""
    import builtins

    from shardwise.profiling.hardware import KernelUnavailableError, import_fbgemm

    real_import = builtins.__import__

    def load_fails(name: str, *args: object, **kwargs: object) -> object:  # the CUDA build without the driver
        if name == "fbgemm_gpu":
            raise OSError("libnvidia-ml.so.1: cannot open shared object file: No such file or directory")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", load_fails)
    with pytest.raises(KernelUnavailableError, match="needs an NVIDIA driver.*fbgemm-gpu-cpu") as err:
        import_fbgemm()
    assert "libnvidia-ml.so.1" in str(err.value) and "\n" not in str(err.value)
