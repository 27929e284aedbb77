"""Small cost datasets with the real columns and a known sub-additive cost law, for fast cost-model tests."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd

from shardwise.workload import TableSpec


def synthetic_tables(prefix: str, count: int, seed: int) -> list[TableSpec]:
    """`count` varied tables named `<prefix><i>`."""
    rng = np.random.default_rng(seed)
    return [
        TableSpec(
            name=f"{prefix}{i}",
            rows=int(10 ** rng.uniform(3, 5.5)),
            dim=int(rng.choice([4, 8, 16, 32, 64, 128])),
            pooling_factor=float(rng.uniform(1, 40)),
            zipf_alpha=float(rng.uniform(0, 1.2)),
        )
        for i in range(count)
    ]


def law_ms(shard: list[TableSpec]) -> tuple[float, float]:
    """A fused kernel's fwd/bwd ms: a fixed per-call cost plus sub-additive per-table work."""
    work = sum(t.pooling_factor * (t.dim + 16) * (1.0 + 0.1 * np.log10(t.rows)) * 1e-4 for t in shard)
    return 0.08 + work**0.9, 0.12 + 1.7 * work**0.95


def cost_frame(
    table_sets: dict[str, list[TableSpec]],
    shards_per_set: dict[str, int],
    seed: int,
    *,
    max_tables: int = 6,
    noise: float = 0.01,
    repeats: int = 2,
    hardware_kind: str = "cpu-test",
    batch_size: int = 512,
) -> pd.DataFrame:
    """Compute rows (single-table shards of every table, then random shards per set) with repeats."""
    rng = np.random.default_rng(seed)
    rows = []
    for set_name, tables in table_sets.items():
        shards = [[t] for t in tables]
        for _ in range(shards_per_set[set_name]):
            k = int(rng.integers(1, max_tables + 1))
            shards.append([tables[i] for i in rng.choice(len(tables), size=min(k, len(tables)), replace=False)])
        for shard in shards:
            text = json.dumps([t.model_dump(mode="json") for t in shard])
            cid = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
            fwd, bwd = law_ms(shard)
            for r in range(1 + (repeats if rng.random() < 0.3 else 0)):
                rows.append({
                    "kind": "compute", "config_id": cid, "repeat": r,
                    "fwd_ms": fwd * float(np.exp(rng.normal(0, noise))),
                    "bwd_ms": bwd * float(np.exp(rng.normal(0, noise))),
                    "batch_size": batch_size, "hardware_kind": hardware_kind, "tables_json": text,
                    "num_tables": len(shard), "reference_ms": 1.0,
                })
    return pd.DataFrame(rows)


def comm_rows(num_layouts: int, seed: int, *, hardware_kind: str = "cpu-test", batch_size: int = 512) -> pd.DataFrame:
    """Comm rows: per-device a2a ms growing with own and total width."""
    rng = np.random.default_rng(seed)
    rows = []
    for layout in range(num_layouts):
        d = int(rng.choice([2, 4]))
        widths = rng.integers(0, 512, size=d)
        for dev in range(d):
            fwd = 0.05 + 1e-3 * widths[dev] + 2e-4 * widths.sum()
            rows.append({
                "kind": "comm", "config_id": f"c{layout}", "repeat": 0, "fwd_ms": fwd * float(np.exp(rng.normal(0, 0.01))),
                "bwd_ms": 1.1 * fwd, "batch_size": batch_size, "hardware_kind": hardware_kind,
                "num_devices": d, "device": dev, "widths_json": json.dumps(widths.tolist()),
            })
    return pd.DataFrame(rows)
