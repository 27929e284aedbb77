"""Pricing tables in host memory: the share of lookups a cache holds under the profiler's skew, a line per UVM kernel
recovered from profiled shards, and a cost model with it that the search can add tables to one vector at a time."""

from __future__ import annotations

import numpy as np
import pytest
from search_doubles import FeatureCostModel

from shardwise.costmodel.caching import (
    HostMemoryCostModel,
    KernelLine,
    expected_hit_rate,
    fit_kernel_lines,
    host_read_gb,
    in_hbm,
)
from shardwise.profiling.caching import caching_variants
from shardwise.search import NeuroShardSearch, validate_plan
from shardwise.workload import ShardingTask, TableSpec, shard_memory_bytes
from shardwise.workload.tables import zipf_row_sampler

BATCH = 4096


def table(alpha: float, rows: int = 100_000, pooling: float = 8.0, dim: int = 32) -> TableSpec:
    return TableSpec(name=f"t{alpha}-{rows}-{pooling}", rows=rows, dim=dim, pooling_factor=pooling, zipf_alpha=alpha)


def test_a_cache_holds_its_share_of_uniform_lookups_and_more_of_skewed_ones() -> None:
    assert expected_hit_rate(table(0.0).on_kernel("fused_uvm_caching", 0.2)) == pytest.approx(0.2, abs=1e-4)
    small, large = ([expected_hit_rate(table(a).on_kernel("fused_uvm_caching", f)) for a in (0.5, 1.0, 1.3)]
                    for f in (0.1, 0.5))
    assert np.all(np.diff(small) > 0) and np.all(np.diff(large) > 0)  # more skew, more hits
    assert all(s > 0.1 for s in small) and all(lg > s for lg, s in zip(large, small))  # a larger cache, more hits
    assert expected_hit_rate(table(1.0).on_kernel("fused_uvm")) == 0.0 and expected_hit_rate(table(1.0)) == 1.0


def test_the_hit_rate_is_the_share_of_sampled_lookups_to_the_hottest_rows() -> None:
    rng = np.random.default_rng(0)
    for alpha in (0.6, 1.0, 1.2):
        t = table(alpha).on_kernel("fused_uvm_caching", 0.1)
        ids = zipf_row_sampler(t.rows, alpha, rng, 200_000)
        # the sampler's hottest ranks, placed on rows by its fixed permutation
        hot_rows = (np.arange(int(0.1 * t.rows)) * 2654435761 + 12345) % t.rows
        hottest = np.isin(ids, hot_rows).mean()
        assert expected_hit_rate(t) == pytest.approx(hottest, abs=0.01)


def _profiled(base: FeatureCostModel, slope: float, intercept: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    shards = []
    for _ in range(12):
        tables = [table(float(rng.uniform(0, 1.3)), int(rng.integers(10_000, 500_000)), float(rng.uniform(1, 30)))
                  for _ in range(int(rng.integers(1, 4)))]
        shards += caching_variants(tables, (0.1, 0.2, 0.5))
    hbm = base.predict_compute([[in_hbm(t) for t in s] for s in shards])
    read = np.array([sum(host_read_gb(t, BATCH) for t in s) for s in shards])
    return shards, hbm[:, 0] + slope * read + intercept, hbm[:, 1] + 2 * slope * read + intercept


def test_a_line_per_kernel_is_recovered_from_profiled_shards() -> None:
    base = FeatureCostModel()
    shards, fwd, bwd = _profiled(base, slope=40.0, intercept=0.05)
    lines = fit_kernel_lines(base, shards, fwd, bwd, BATCH)
    assert set(lines) == {"fused_uvm_caching", "fused_uvm"}
    line = lines["fused_uvm_caching"]
    assert line.slope_ms_per_gb == pytest.approx((40.0, 80.0), rel=1e-6)
    assert line.intercept_ms == pytest.approx((0.05, 0.05), abs=1e-6) and line.fit_mape_pct < 0.01
    assert fit_kernel_lines(base, shards[:3], fwd[:3], bwd[:3], BATCH).keys() <= {"fused_uvm_caching"}


def test_the_model_prices_shards_as_its_embeddings_add_up_and_hbm_shards_as_its_base() -> None:
    base = FeatureCostModel()
    line = KernelLine((40.0, 80.0), (0.05, 0.05), 10)
    model = HostMemoryCostModel(base, {"fused_uvm_caching": line})
    assert model.compute_kernels == ("fused", "fused_uvm_caching")
    hbm = [table(0.5), table(1.1, pooling=3.0)]
    mixed = [hbm[0].on_kernel("fused_uvm_caching", 0.2), hbm[1]]
    shards = [hbm, mixed, [], [mixed[0]]]
    direct = model.predict_compute(shards)
    summed = np.stack([model.table_embeddings(s).sum(axis=0) if s else np.zeros(model.table_embeddings(hbm).shape[1])
                       for s in shards])
    assert np.allclose(model.compute_from_embeddings(summed)[[0, 1, 3]], direct[[0, 1, 3]])
    assert np.allclose(direct[0], base.predict_compute([hbm])[0]) and np.all(direct[1] > direct[0])
    assert np.allclose(direct[2], 0.0)


def test_neuroshard_plans_a_task_over_hbm_with_the_fitted_model() -> None:
    base = FeatureCostModel()
    shards, fwd, bwd = _profiled(base, slope=40.0, intercept=0.05)
    model = HostMemoryCostModel(base, fit_kernel_lines(base, shards, fwd, bwd, base.batch_size))
    specs = [TableSpec(name=f"t{i}", rows=200_000, dim=64, pooling_factor=10.0, zipf_alpha=0.3 * i,
                       compute_kernels=("fused", "fused_uvm_caching")) for i in range(6)]
    task = ShardingTask(num_devices=2, device_memory_bytes=int(0.35 * shard_memory_bytes(specs, BATCH)),
                        batch_size=BATCH, tables=tuple(specs), host_memory_bytes=2**33)
    plan = NeuroShardSearch().search(task, model, seed=0)
    validate_plan(plan, task)
    cached = sorted(plan.kernels)
    assert cached and "t5" in cached and "t0" not in cached  # the most skewed first, the uniform one last


def _frame_with_uvm_shards(ms_per_gb: float = 4000.0):
    """costmodel_synthetic's shards (training set "a", held-out set "h"), and the first of each again on the UVM
    kernels: their law's ms plus `ms_per_gb` per GB their lookups read from host memory."""
    import json

    import pandas as pd
    from costmodel_synthetic import cost_frame, law_ms, synthetic_tables

    sets = {"a": synthetic_tables("a", 16, 0), "h": synthetic_tables("h", 6, 1)}
    frame = cost_frame(sets, {"a": 120, "h": 30}, 0)
    rows = []
    for name, tables in sets.items():
        for i in range(0, len(tables) - 1, 2):
            for variant in caching_variants(tables[i:i + 2], (0.1, 0.5)):
                fwd, bwd = law_ms([in_hbm(t) for t in variant])
                extra = ms_per_gb * sum(host_read_gb(t, 512) for t in variant)
                rows.append({"kind": "compute", "config_id": f"{name}{i}-{len(rows)}", "repeat": 0,
                             "fwd_ms": fwd + extra, "bwd_ms": bwd + 2 * extra, "batch_size": 512,
                             "hardware_kind": "cpu-test", "reference_ms": 1.0, "num_tables": len(variant),
                             "tables_json": json.dumps([t.model_dump(mode="json") for t in variant]),
                             "kernel": "fused_uvm_caching" if any(t.cache_load_factor for t in variant) else "fused_uvm"})
    return pd.concat([frame.assign(kernel="fused"), pd.DataFrame(rows)], ignore_index=True)


def test_pretrain_fits_the_uvm_lines_reports_them_held_out_and_saves_them(tmp_path) -> None:
    from shardwise.costmodel import NeuralCostModel, TrainConfig, train_cost_model

    frame = _frame_with_uvm_shards()
    model, report = train_cost_model(frame, 0, TrainConfig(epochs=5, progress=False, holdout_sources=tuple(
        f"h{i}" for i in range(6))))
    assert model.compute_kernels == ("fused", "fused_uvm_caching", "fused_uvm")
    assert model.uvm_kernels["fused_uvm_caching"].slope_ms_per_gb[0] > 0
    assert report.sizes["uvm_kernel_shards"] == sum(line.num_shards for line in model.uvm_kernels.values())
    assert "uvm_kernel_line_heldout_fused_uvm_caching_shards_total_mape_pct" in report.metrics
    assert "torchrec_estimator_heldout_fused_uvm_caching_shards_total_mape_pct" in report.metrics
    # the network trained on the HBM shards only: as many as the frame has
    assert report.sizes["train"] + report.sizes["val"] + report.sizes["test"] + report.sizes["size_test"] == \
        frame[frame["kernel"] == "fused"]["config_id"].nunique()
    loaded = NeuralCostModel.load(model.save(tmp_path / "model"))
    assert loaded.uvm_kernels == model.uvm_kernels

    specs = [TableSpec(name=f"t{i}", rows=200_000, dim=32, pooling_factor=8.0, zipf_alpha=0.25 * i,
                       compute_kernels=("fused", "fused_uvm_caching")) for i in range(6)]
    task = ShardingTask(num_devices=2, device_memory_bytes=int(0.4 * shard_memory_bytes(specs, 512)),
                        batch_size=512, tables=tuple(specs), host_memory_bytes=2**33)
    plan = NeuroShardSearch().search(task, loaded, seed=0)
    validate_plan(plan, task)
    assert plan.kernels and "t5" in plan.kernels


def test_a_model_profiled_without_uvm_shards_keeps_every_table_in_hbm(tmp_path) -> None:
    import json

    from costmodel_synthetic import cost_frame, synthetic_tables

    from shardwise.costmodel import NeuralCostModel, TrainConfig, train_cost_model

    model, _ = train_cost_model(cost_frame({"a": synthetic_tables("a", 12, 0)}, {"a": 60}, 0), 0,
                                TrainConfig(epochs=3, progress=False))
    assert model.compute_kernels == ("fused",)
    path = model.save(tmp_path / "model")
    assert json.loads((path / "cost_model.json").read_text())["uvm_kernels"] is None
    assert NeuralCostModel.load(path).uvm_kernels == {}
