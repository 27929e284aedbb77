"""scripts/gpu_uvm_check.py on a CPU: every step that has a CPU path (the profile in HBM, the pricing of shards on UVM
given their rows, both plans of a task over HBM, the plans' kernels timed with their tables back in HBM), so that the
GPU session runs a script whose logic has run; the UVM profile and measurement are the GPU's alone."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from shardwise.costmodel.caching import host_read_gb
from shardwise.profiling import load_costs
from shardwise.profiling.caching import caching_variants, shard_cache_load_factor, shard_kernel_name
from shardwise.search import validate_plan

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
BATCH = 256


def _script():
    spec = importlib.util.spec_from_file_location("gpu_uvm_check", ROOT / "scripts" / "gpu_uvm_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _with_uvm_rows(frame: pd.DataFrame, ms_per_gb: float = 4000.0) -> pd.DataFrame:
    """The profile's HBM shards again as the GPU profiles them on UVM, timed by a known law: their HBM ms plus
    `ms_per_gb` per GB read from host memory (what a CPU cannot run)."""
    compute = frame[frame["kind"] == "compute"].drop_duplicates("config_id")
    held = compute["tables_json"].str.contains('"name": "h')
    rows = []
    for _, row in pd.concat([compute[~held].head(10), compute[held].head(4)]).iterrows():
        tables = [pd.Series(t) for t in json.loads(row["tables_json"])]
        from shardwise.workload import TableSpec

        shard = [TableSpec.model_validate(t.to_dict()) for t in tables]
        for k, variant in enumerate(caching_variants(shard, (0.1, 0.5))):
            extra = ms_per_gb * sum(host_read_gb(t, BATCH) for t in variant)
            rows.append({**row.to_dict(), "config_id": f"{row['config_id']}-uvm{k}", "fwd_ms": row["fwd_ms"] + extra,
                         "bwd_ms": row["bwd_ms"] + 2 * extra, "kernel": shard_kernel_name(variant),
                         "cache_load_factor": shard_cache_load_factor(variant) or 0.0,
                         "tables_json": json.dumps([{**t.model_dump(mode="json"), "source": t.source or t.name}
                                                    for t in variant])})
    return pd.concat([frame, pd.DataFrame(rows)], ignore_index=True)


def test_every_step_with_a_cpu_path_runs_on_a_cpu(tmp_path, capsys) -> None:
    check = _script()
    train = check.check_tables("a", 8, 0, 60_000)
    heldout = check.check_tables("h", 6, 1, 60_000)
    frame = check.profile_step(train, heldout, tmp_path / "costs", CPU, batch_size=BATCH, shards=24, heldout_shards=8,
                               caching_shards=4, timing_iters=2)
    assert "shards on UVM: CUDA only" in capsys.readouterr().out
    assert set(frame["kernel"].dropna()) == {"fused"}
    frame = _with_uvm_rows(frame)
    model, accuracy = check.price_step(frame, {t.name for t in heldout}, CPU, epochs=3)
    assert set(model.compute_kernels) == {"fused", "fused_uvm_caching", "fused_uvm"}
    # the lines recover the known law from the training tables' UVM shards: 1x forward, 2x backward, per GB read
    for kernel in ("fused_uvm_caching", "fused_uvm"):
        assert accuracy["lines"][kernel]["slope_ms_per_gb"] == pytest.approx([4000.0, 8000.0], rel=0.15)
    assert {"shardwise_mape_pct", "torchrec_mape_pct"} <= set(accuracy["fused"])
    # held-out shards that read every lookup from host memory: the line prices what the network's HBM price cannot
    # (behind a cache the host reads are a few ms beside the 3-epoch network's own error, so no ranking there)
    uncached = accuracy["fused_uvm"]
    assert uncached["shardwise_mape_pct"] < 0.5 * uncached["network_in_hbm_mape_pct"]
    assert all(accuracy[k]["torchrec_mape_pct"] > 0 for k in ("fused_uvm_caching", "fused_uvm"))

    task = check.check_task(heldout, 2, BATCH, hbm_share=0.5)
    plans = check.plan_step(task, model)
    assert plans["neuroshard"].kernels, "a task over HBM puts tables in host memory"
    for plan in plans.values():
        validate_plan(plan, task)
    measured = check.measure_step(task, plans, CPU, rounds=1, timing_iters=2)
    assert set(measured) == set(plans) and all(ms > 0 for ms in measured.values())
    assert "tables on UVM timed: CUDA only" in capsys.readouterr().out


def test_the_whole_check_runs_end_to_end_and_writes_its_figures(tmp_path) -> None:
    check = _script()
    doc = check.run_check(tmp_path, CPU, batch_size=BATCH, tables=8, max_rows=60_000, shards=24, heldout_shards=8,
                          caching_shards=4, task_tables=6, num_devices=2, hbm_share=0.5, timing_iters=2, rounds=1,
                          epochs=3)
    assert json.loads((tmp_path / "uvm_check.json").read_text()) == doc
    # no UVM rows on a CPU: the cost model has not measured fused_uvm_caching, and the plan step says so in one line
    assert "has not measured 'fused_uvm_caching'" in doc["plan"]["error"]
    assert load_costs(tmp_path / "costs")["kernel"].dropna().unique().tolist() == ["fused"]
    assert np.isfinite(doc["accuracy"]["fused"]["shardwise_mape_pct"])
