"""fbgemm's UVM kernels as the profiler times them (a CUDA build of fbgemm; skipped without a GPU): a cached table's
steady hit rate grows with its cache and its skew, its time falls as its cache grows, and a table without a cache
in host memory is slower than in HBM; a profile of caching shards writes their kernel, load factor and hit rate.
`scripts/gpu_uvm_check.py` runs the whole method on them (profile, price, plan, measure)."""

from __future__ import annotations

import pytest
import torch

from shardwise.profiling import ProfileSettings, TimingProtocol, load_costs, measure_shard, profile
from shardwise.profiling.kernel import build_shard_kernel
from shardwise.workload import TableSpec

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

BATCH = 16384
PROTOCOL = TimingProtocol(iters=10)


def table(alpha: float) -> TableSpec:
    return TableSpec(name=f"zipf{alpha}", rows=500_000, dim=64, pooling_factor=20.0, zipf_alpha=alpha)


@pytest.mark.parametrize("alpha", [0.0, 1.1])
def test_a_larger_cache_hits_more_and_runs_faster(alpha: float) -> None:
    timings = [measure_shard([table(alpha).on_kernel("fused_uvm_caching", factor)], BATCH, device="cuda",
                             protocol=PROTOCOL) for factor in (0.05, 0.2, 0.8)]
    rates, ms = [t.cache_hit_rate for t in timings], [t.total_ms for t in timings]
    assert all(r is not None and 0.0 <= r <= 1.0 for r in rates) and rates[0] < rates[1] < rates[2]
    assert ms[2] <= 1.05 * ms[0]
    print(f"alpha {alpha}: hit rates {[round(r, 3) for r in rates]}, ms {[round(m, 3) for m in ms]}")


def test_skewed_lookups_hit_a_small_cache_more_than_uniform_ones() -> None:
    uniform, skewed = (build_shard_kernel([table(a).on_kernel("fused_uvm_caching", 0.1)], BATCH,
                                          device="cuda").cache_hit_rate for a in (0.0, 1.1))
    assert skewed > uniform + 0.2


def test_host_memory_without_a_cache_is_slower_than_hbm_and_a_mixed_kernel_runs() -> None:
    hbm = measure_shard([table(1.0)], BATCH, device="cuda", protocol=PROTOCOL).total_ms
    uvm = measure_shard([table(1.0).on_kernel("fused_uvm")], BATCH, device="cuda", protocol=PROTOCOL).total_ms
    assert uvm > hbm
    mixed = [table(1.0).on_kernel("fused_uvm_caching", 0.2), table(0.5).model_copy(update={"name": "hbm"})]
    timing = measure_shard(mixed, BATCH, device="cuda", protocol=PROTOCOL)
    assert timing.cache_hit_rate is not None and timing.total_ms > 0


def test_a_profile_of_caching_shards_writes_kernel_load_factor_and_hit_rate(tmp_path) -> None:
    tables = [TableSpec(name=f"t{i}", rows=200_000, dim=32, pooling_factor=10.0, zipf_alpha=0.4 * i) for i in range(4)]
    settings = ProfileSettings(num_shards=3, max_tables=3, batch_size=4096, device="cuda", caching_shards=2,
                               cache_load_factors=(0.1, 0.5), protocol=TimingProtocol(iters=5))
    profile(tables, tmp_path / "costs", settings, progress=False)
    rows = load_costs(tmp_path / "costs")
    cached = rows[rows["kernel"] == "fused_uvm_caching"]
    assert set(rows["kernel"]) == {"fused", "fused_uvm_caching", "fused_uvm"}
    assert set(cached["cache_load_factor"]) == {0.1, 0.5} and cached["cache_hit_rate"].between(0, 1).all()
