"""What to profile: multi-table shard configurations and all-to-all layouts, sampled with explicit seeds."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

import numpy as np
import torch

from shardwise.workload import Optimizer, TableSpec, WeightsPrecision, shard_memory_bytes
from shardwise.workload.augment import heaviest

#: the heaviest tables seed shards in rounds, each table once a round; every this many-th round holds each alone (a
#: device that holds only it), the others with companions
HEAVY_ALONE_EVERY = 3


def config_id(*parts: object) -> str:
    """A stable hash of what is measured (JSON of `parts`), equal across processes and runs."""
    payload = json.dumps(parts, sort_keys=True, default=_jsonable)
    return hashlib.blake2b(payload.encode(), digest_size=10).hexdigest()


def _jsonable(value: object) -> object:
    if isinstance(value, TableSpec):
        return value.model_dump(mode="json")
    raise TypeError(f"cannot hash {type(value).__name__}")


def shard_config_id(
    tables: Sequence[TableSpec], batch_size: int, optimizer: str, weights_precision: str, hardware_kind: str
) -> str:
    """The resume key of one shard measurement."""
    return config_id("compute", list(tables), batch_size, optimizer, weights_precision, hardware_kind)


def comm_config_id(widths: Sequence[int], batch_size: int, backend: str, hardware_kind: str) -> str:
    """The resume key of one all-to-all layout measurement."""
    return config_id("comm", [int(w) for w in widths], batch_size, backend, hardware_kind)


def collective_config_id(collective: str, size_bytes: int, num_devices: int, backend: str, hardware_kind: str) -> str:
    """The resume key of one collective's measurement ("all_reduce" or "reduce_scatter", a size over a device
    count)."""
    return config_id(collective, int(size_bytes), int(num_devices), backend, hardware_kind)


#: the smallest all-reduce profiled: a data-parallel table of 1,000 rows x dim 1 in fp32
MIN_ALL_REDUCE_BYTES = 4096


def all_reduce_sizes(max_bytes: int) -> list[int]:
    """The all-reduce sizes to profile: 4 KiB, 16 KiB, ... (x4) up to `max_bytes` (none below 4 KiB)."""
    sizes = []
    size = MIN_ALL_REDUCE_BYTES
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    return sizes


def comm_device_counts(max_devices: int) -> list[int]:
    """The device counts all-to-alls and all-reduces are profiled over: 2, 4, 8, ... up to `max_devices`."""
    return [d for d in (2**k for k in range(1, 12)) if d <= max_devices]


def sample_shard_configs(
    tables: Sequence[TableSpec],
    num_configs: int,
    *,
    batch_size: int,
    seed: int,
    max_tables: int = 15,
    memory_cap_bytes: int | None = None,
    optimizer: Optimizer = "rowwise_adagrad",
    weights_precision: WeightsPrecision = "fp32",
    heavy_share: float = 0.0,
) -> list[list[TableSpec]]:
    """`num_configs` shards of 1..`max_tables` distinct tables each, each under `memory_cap_bytes`.

    With `heavy_share`, that share of the shards (spread over the run) is seeded with the population's heaviest
    tables (`workload.augment.heaviest`) in rounds, each table once a round: alone in every `HEAVY_ALONE_EVERY`-th
    round, else beside tables drawn as any shard's are, so the tables that set a plan's slowest device are measured
    often, alone included."""
    if not tables:
        raise ValueError("tables: the population to sample shards from is empty")
    if max_tables < 1:
        raise ValueError(f"max_tables must be >= 1, got {max_tables}")
    if num_configs < 0:
        raise ValueError(f"num_configs must be >= 0, got {num_configs}")
    if not 0.0 <= heavy_share <= 1.0:
        raise ValueError(f"heavy_share must be in [0, 1], got {heavy_share}")
    rng = np.random.default_rng(seed)
    heavy = heaviest(tables) if heavy_share > 0 else []
    configs: list[list[TableSpec]] = []
    attempts = seeded = 0
    while len(configs) < num_configs:
        attempts += 1
        if attempts > 100 * max(num_configs, 1):
            raise ValueError(f"memory_cap_bytes {memory_cap_bytes}: too small for any table of the population")
        done = len(configs)
        if int((done + 1) * heavy_share) > int(done * heavy_share):  # spread evenly over the run
            alone = (seeded // len(heavy)) % HEAVY_ALONE_EVERY == 0
            picked = _seeded_shard(tables, heavy[seeded % len(heavy)], alone, max_tables, rng)
            seeded += 1
        else:
            count = int(rng.integers(1, min(max_tables, len(tables)) + 1))
            picked = [tables[i] for i in rng.choice(len(tables), size=count, replace=False)]
        # drop tables until the shard fits, so large caps keep large shards and small caps still sample
        while picked and memory_cap_bytes is not None and (
            shard_memory_bytes(picked, batch_size, optimizer, weights_precision) > memory_cap_bytes
        ):
            picked.pop()
        if picked:
            configs.append(picked)
    return configs


def _seeded_shard(tables: Sequence[TableSpec], seed_table: TableSpec, alone: bool, max_tables: int,
                  rng: np.random.Generator) -> list[TableSpec]:
    """`seed_table` first (dropped last where the shard does not fit), `alone` or with 1.. `max_tables` - 1 other
    tables of `tables`."""
    others = [t for t in tables if t is not seed_table]
    if alone or not others or max_tables < 2:
        return [seed_table]
    count = int(rng.integers(1, min(max_tables - 1, len(others)) + 1))
    return [seed_table, *(others[j] for j in rng.choice(len(others), size=count, replace=False))]


def default_max_devices(device_type: str) -> int:
    """The largest all-to-all this machine can run: its GPU count, or on CPU max(4, cores) processes."""
    if device_type == "cuda":
        return torch.cuda.device_count()
    return max(4, os.cpu_count() or 1)


def sample_comm_layouts(
    num_layouts: int,
    *,
    dims: Sequence[int],
    seed: int,
    max_devices: int,
    max_tables_per_device: int = 15,
) -> list[list[int]]:
    """`num_layouts` per-device output widths over D in {2, 4, ..., max_devices}; each device's width is the
    sum of the dims of 0..`max_tables_per_device` tables drawn from `dims` (the population's dims)."""
    if max_devices < 2:
        raise ValueError(f"max_devices must be >= 2 for an all-to-all, got {max_devices}")
    if not dims:
        raise ValueError("dims: need the population's table dims to sample widths")
    device_counts = comm_device_counts(max_devices)
    rng = np.random.default_rng(seed)
    layouts = []
    for _ in range(num_layouts):
        num_devices = int(rng.choice(device_counts))
        widths = [
            int(np.sum(rng.choice(dims, size=int(rng.integers(0, max_tables_per_device + 1)))))
            for _ in range(num_devices)
        ]
        layouts.append(widths)
    return layouts
