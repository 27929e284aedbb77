"""Shards in host memory on fbgemm's UVM: refused on a CPU in one line, sampled as variants of the profile's shards,
their rows saying kernel, load factor and hit rate, and older rows read as fused. The kernel-agnostic parts (the
batches a shard's calls cycle through, the cache's warm-up loop) run here on the CPU kernel or a stand-in."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from shardwise.cli import main
from shardwise.jobs.profile import ProfileJobSettings
from shardwise.profiling import ProfileSettings, append_rows, load_costs, profile
from shardwise.profiling.caching import (
    NEEDS_CUDA,
    CachingNeedsCudaError,
    caching_variants,
    rotation_batches,
    shard_cache_load_factor,
    shard_kernel_name,
    warm_cache,
)
from shardwise.profiling.kernel import ShardTiming, build_shard_kernel
from shardwise.profiling.rows import compute_row
from shardwise.profiling.runner import _plan
from shardwise.workload import TableSet, TableSpec, save_tables

TABLES = [TableSpec(name=f"t{i}", rows=2000 + 500 * i, dim=8, pooling_factor=3.0, zipf_alpha=0.4 * i)
          for i in range(4)]


def test_a_shard_in_host_memory_is_refused_on_a_cpu_in_one_line() -> None:
    cached = [TABLES[0].on_kernel("fused_uvm_caching", 0.2), TABLES[1]]
    with pytest.raises(CachingNeedsCudaError) as err:
        build_shard_kernel(cached, 64, device="cpu")
    assert str(err.value) == NEEDS_CUDA
    assert str(err.value).startswith("fused_uvm_caching needs a CUDA device: profile on a GPU node (shardwise profile "
                                     "--device cuda")
    with pytest.raises(CachingNeedsCudaError):
        build_shard_kernel([TABLES[0].on_kernel("fused_uvm")], 64, device="cpu")


def test_profile_refuses_caching_shards_on_a_cpu_before_measuring(tmp_path) -> None:
    settings = ProfileSettings(num_shards=2, batch_size=64, device="cpu", caching_shards=1)
    with pytest.raises(CachingNeedsCudaError, match="needs a CUDA device"):
        profile(TABLES, tmp_path / "costs", settings, progress=False)
    assert not (tmp_path / "costs").exists()


def test_the_command_refuses_caching_shards_on_a_cpu_in_one_line(tmp_path, capsys) -> None:
    tables = save_tables(TableSet(batch_size=64, tables=tuple(TABLES)), tmp_path / "tables.json")
    argv = ["profile", "--tables", str(tables), "--out", str(tmp_path / "costs"), "--num-shards", "2",
            "--caching-shards", "1"]
    assert main([*argv, "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert NEEDS_CUDA in err and len(err.splitlines()) == 1
    if not torch.cuda.is_available():  # the default device is this CPU: refused when the run starts
        assert main(argv) == 2
        assert NEEDS_CUDA in capsys.readouterr().err
    with pytest.raises(ValueError, match="cache_load_factors"):
        ProfileJobSettings(tables="t", out="o", caching_shards=1, cache_load_factors=(0.0,))


def test_the_variants_cache_all_then_half_the_tables_at_each_load_factor_then_none() -> None:
    variants = caching_variants(TABLES, (0.1, 0.5))
    assert [shard_kernel_name(v) for v in variants] == ["fused_uvm_caching"] * 4 + ["fused_uvm"]
    assert [shard_cache_load_factor(v) for v in variants] == [0.1, 0.1, 0.5, 0.5, None]
    assert [sum(t.compute_kernel == "fused_uvm_caching" for t in v) for v in variants[:4]] == [4, 2, 4, 2]
    assert all(t.compute_kernel is None for t in variants[1][2:])  # the rest of the half-cached shard in HBM
    assert caching_variants(TABLES[:1], (0.2,)) == [[TABLES[0].on_kernel("fused_uvm_caching", 0.2)],
                                                   [TABLES[0].on_kernel("fused_uvm")]]
    with pytest.raises(ValueError, match="one kernel has one cache"):
        shard_cache_load_factor([TABLES[0].on_kernel("fused_uvm_caching", 0.1),
                                 TABLES[1].on_kernel("fused_uvm_caching", 0.2)])


def test_the_run_plans_the_variants_of_its_first_shards_each_its_own_config() -> None:
    settings = ProfileSettings(num_shards=3, batch_size=64, caching_shards=2, cache_load_factors=(0.2,),
                               memory_cap_bytes=2**30, max_tables=3)
    work = _plan(TABLES, settings, torch.device("cuda"), "cuda-test", set())
    plain = _plan(TABLES, settings.model_copy(update={"caching_shards": 0}), torch.device("cuda"), "cuda-test", set())
    extra = work.configs[len(plain.configs):]
    assert work.configs[: len(plain.configs)] == plain.configs
    assert extra == [v for shard in plain.configs[:2] for v in caching_variants(shard, (0.2,))]
    assert len(set(work.ids)) == len(work.ids)


def test_rows_say_the_kernel_and_older_rows_read_as_fused(tmp_path) -> None:
    timing = ShardTiming(fwd_ms=1.0, bwd_ms=2.0, raw_fwd_ms=1.0, raw_bwd_ms=2.0, reference_ms=None,
                         cache_hit_rate=0.93)
    common = {"hardware_kind": "cuda-test", "batch_size": 64}
    shard = caching_variants(TABLES[:2], (0.2,))[1]
    cached = compute_row(shard, timing, config_id="a", repeat=0, common=common, timing="{}",
                         optimizer="rowwise_adagrad", weights_precision="fp32", provenance="profile")
    assert (cached["kernel"], cached["cache_load_factor"], cached["cache_hit_rate"]) == ("fused_uvm_caching", 0.2, 0.93)
    assert json.loads(cached["tables_json"])[0]["compute_kernel"] == "fused_uvm_caching"
    older = {k: v for k, v in cached.items() if k not in ("kernel", "cache_load_factor", "cache_hit_rate")}
    older.update(config_id="b", tables_json=json.dumps([t.model_dump(mode="json") for t in TABLES[:2]]))
    append_rows(tmp_path / "costs", [cached])
    append_rows(tmp_path / "costs", [older])
    frame = load_costs(tmp_path / "costs").set_index("config_id")
    assert frame.loc["a", "kernel"] == "fused_uvm_caching" and frame.loc["a", "cache_hit_rate"] == 0.93
    assert frame.loc["b", "kernel"] == "fused" and frame.loc["b", "cache_load_factor"] == 0.0


class _StandInTbe:
    """fbgemm's UVM cache stats of a cache whose hit rate climbs to 0.9 as it is warmed (CPU has no UVM)."""

    def __init__(self) -> None:
        self.gather_uvm_cache_stats = True
        self.calls = 0
        self.stats = np.zeros(6)

    def reset_uvm_cache_stats(self) -> None:
        self.stats[:] = 0

    def get_uvm_cache_stats(self) -> torch.Tensor:
        return torch.as_tensor(self.stats)

    def look_up(self) -> None:
        self.calls += 1
        hit = 0.9 * (1 - 0.5 ** self.calls)
        self.stats[2] += 1000  # distinct ids
        self.stats[3] += round(1000 * (1 - hit))  # of them missed


class _StandInKernel:
    def __init__(self) -> None:
        self.tbe = _StandInTbe()
        self.rotation = ((torch.zeros(1), torch.zeros(1)),) * 4
        self.grad_output = torch.ones(1)

    def forward(self) -> torch.Tensor:
        self.tbe.look_up()
        return torch.ones(1, requires_grad=True) * 1.0


def test_the_cache_is_warmed_until_its_hit_rate_settles_then_timed_without_stats() -> None:
    kernel = _StandInKernel()
    rate = warm_cache(kernel)
    assert rate == pytest.approx(0.9, abs=0.005)
    assert kernel.tbe.calls % 4 == 0 and 8 <= kernel.tbe.calls < 16 * 4
    assert kernel.tbe.gather_uvm_cache_stats is False


def test_a_kernels_calls_cycle_through_batches_of_its_distribution() -> None:
    import dataclasses

    kernel = build_shard_kernel(TABLES[:2], 256, device="cpu")
    batches = rotation_batches(TABLES[:2], 256, torch.device("cpu"), count=3)
    assert torch.equal(batches[0][0], kernel.indices)  # the first is the batch the shard is timed on in HBM
    assert not torch.equal(batches[1][0][:100], batches[2][0][:100])
    with torch.no_grad():
        for weights in kernel.tbe.split_embedding_weights():
            weights.uniform_()
    cycling = dataclasses.replace(kernel, rotation=batches)
    outputs = [cycling.forward().detach().clone() for _ in range(4)]
    assert torch.equal(outputs[0], kernel.forward()) and torch.equal(outputs[3], outputs[0])
    assert not torch.equal(outputs[0], outputs[1])
    # every batch draws from the same tables: ids within their rows, the same mean bag size
    for indices, offsets in batches:
        assert int(indices.max()) < TABLES[1].rows and len(offsets) == 2 * 256 + 1
        assert abs(len(indices) / (2 * 256) - 3.0) < 0.5


def test_the_compute_network_trains_on_shards_in_hbm_only() -> None:
    from costmodel_synthetic import cost_frame, synthetic_tables

    from shardwise.costmodel.samples import compute_samples

    frame = cost_frame({"a": synthetic_tables("a", 4, 0)}, {"a": 3}, 0)
    frame["kernel"] = None
    cached = frame.iloc[[0]].assign(config_id="cached", kernel="fused_uvm_caching", cache_load_factor=0.2)
    samples = compute_samples(pd.concat([frame.assign(kernel="fused"), cached], ignore_index=True))
    assert "cached" not in samples.config_ids and len(samples.config_ids) == frame["config_id"].nunique()
    assert len(compute_samples(frame).config_ids) == frame["config_id"].nunique()  # no kernel: in HBM (COMPUTE_DEFAULTS)


def test_the_hit_rate_reads_fbgemms_cache_stats_where_it_keeps_them() -> None:
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import UVMCacheStatsIndex

    from shardwise.profiling.caching import UNIQUE_INDICES, UNIQUE_MISSES

    fbgemms = (UVMCacheStatsIndex.num_unique_indices, UVMCacheStatsIndex.num_unique_misses)
    assert fbgemms == (UNIQUE_INDICES, UNIQUE_MISSES)


def test_each_table_gets_its_fbgemm_location_and_a_cached_shard_its_cache() -> None:
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation

    from shardwise.profiling.caching import cache_arguments, locations

    shard = [TABLES[0].on_kernel("fused_uvm_caching", 0.2), TABLES[1].on_kernel("fused_uvm"), TABLES[2]]
    assert locations(shard) == [EmbeddingLocation.MANAGED_CACHING, EmbeddingLocation.MANAGED,
                                EmbeddingLocation.DEVICE]
    assert cache_arguments(shard) == {"cache_load_factor": 0.2, "gather_uvm_cache_stats": True}
    assert cache_arguments(shard[1:]) == {} and cache_arguments(TABLES) == {}
