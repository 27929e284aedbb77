"""The cost dataset's rows made from measurements (`schema.py`'s columns): a shard's timed kernel, one device's share
of an all-to-all layout, one collective size."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

from shardwise.workload import TableSpec

from .caching import shard_cache_load_factor, shard_kernel_name
from .comm import CommTiming
from .kernel import ShardTiming

#: where a training step runs each: in forward (its ms in fwd_ms) or backward (bwd_ms)
FORWARD_COLLECTIVES = ("reduce_scatter", "all_to_all")

def compute_row(
    shard: Sequence[TableSpec],
    timing_result: ShardTiming,
    *,
    config_id: str,
    repeat: int,
    common: dict[str, Any],
    timing: str,
    optimizer: str,
    weights_precision: str,
    provenance: str,
) -> dict[str, Any]:
    """One `kind == "compute"` row of the cost dataset: a shard's measured medians with what measured them
    (`common`: the hardware columns and batch size; `timing`: the protocol's JSON)."""
    return {
        **common,
        "kind": "compute",
        "config_id": config_id,
        "repeat": repeat,
        "fwd_ms": timing_result.fwd_ms,
        "bwd_ms": timing_result.bwd_ms,
        "raw_fwd_ms": timing_result.raw_fwd_ms,
        "raw_bwd_ms": timing_result.raw_bwd_ms,
        "reference_ms": timing_result.reference_ms,
        "launch_ms": timing_result.launch_ms,
        "timer": timing_result.timer,
        "measured_at": time.time(),
        "timing": timing,
        "tables_json": json.dumps([{**t.model_dump(mode="json"), "source": t.source or t.name} for t in shard]),
        "num_tables": len(shard),
        "optimizer": optimizer,
        "weights_precision": weights_precision,
        "provenance": provenance,
        "kernel": shard_kernel_name(shard),
        "cache_load_factor": shard_cache_load_factor(shard) or 0.0,
        "cache_hit_rate": timing_result.cache_hit_rate,
    }


def collective_row(op: str, num_devices: int, size_bytes: int, config_id: str, samples_ms: Sequence[float],
                   backend: str, common: dict[str, Any], timing: str, measured_at: float) -> dict[str, Any]:
    """The row of one measured collective size: the median of its timed collectives (each from the last rank's start
    to the last rank's end) where a training step runs it: an all-reduce (a gradient's) or all-gather (row-wise
    gradients') as bwd_ms, a reduce-scatter (row-wise outputs') or all-to-all (row-wise ids) as fwd_ms."""
    ms = statistics.median(samples_ms)
    fwd_ms, bwd_ms = (ms, 0.0) if op in FORWARD_COLLECTIVES else (0.0, ms)
    return {
        **common, "num_threads": 1, "kind": op, "config_id": config_id, "repeat": 0,
        "fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "raw_fwd_ms": fwd_ms, "raw_bwd_ms": bwd_ms, "measured_at": measured_at,
        "timing": timing, "num_devices": num_devices, "size_bytes": int(size_bytes), "backend": backend,
        "provenance": "profile",
    }


def comm_rows(
    widths: list[int],
    config_id: str,
    per_device: list[CommTiming],
    backend: str,
    common: dict[str, Any],
    timing: str,
    measured_at: float,
) -> list[dict[str, Any]]:
    """One row per device of a measured all-to-all layout."""
    return [
        {
            **common,
            "num_threads": 1,
            "kind": "comm",
            "config_id": config_id,
            "repeat": 0,
            "fwd_ms": t.fwd_ms,
            "bwd_ms": t.bwd_ms,
            "raw_fwd_ms": t.fwd_ms,
            "raw_bwd_ms": t.bwd_ms,
            "measured_at": measured_at,
            "timing": timing,
            "num_devices": len(widths),
            "device": rank,
            "widths_json": json.dumps(widths),
            "backend": backend,
            "provenance": "profile",
        }
        for rank, t in enumerate(per_device)
    ]
