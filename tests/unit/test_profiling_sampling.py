"""Sampling of shard configurations and all-to-all layouts; stable config ids; repeat scheduling."""

from __future__ import annotations

import pytest

from shardwise.profiling.runner import _schedule
from shardwise.profiling.sampling import (
    comm_config_id,
    sample_comm_layouts,
    sample_shard_configs,
    shard_config_id,
)
from shardwise.workload import TableSpec, shard_memory_bytes


def population(n: int = 40) -> list[TableSpec]:
    return [
        TableSpec(name=f"t{i}", rows=1000 * (i + 1), dim=4 * (1 + i % 32), pooling_factor=float(i % 7))
        for i in range(n)
    ]


def test_shards_respect_size_and_memory_cap_and_are_seeded() -> None:
    tables = population()
    cap = 2_000_000
    configs = sample_shard_configs(tables, 50, batch_size=256, seed=3, max_tables=6, memory_cap_bytes=cap)
    assert len(configs) == 50
    for shard in configs:
        assert 1 <= len(shard) <= 6
        assert len({t.name for t in shard}) == len(shard)
        assert shard_memory_bytes(shard, 256) <= cap
    again = sample_shard_configs(tables, 50, batch_size=256, seed=3, max_tables=6, memory_cap_bytes=cap)
    other = sample_shard_configs(tables, 50, batch_size=256, seed=4, max_tables=6, memory_cap_bytes=cap)
    assert configs == again
    assert configs != other
    # without a tight cap the sizes cover the whole range
    sizes = {len(s) for s in sample_shard_configs(tables, 200, batch_size=256, seed=0, max_tables=6)}
    assert sizes == set(range(1, 7))


def test_impossible_memory_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="memory_cap_bytes"):
        sample_shard_configs(population(), 3, batch_size=256, seed=0, memory_cap_bytes=10)


def test_config_ids_are_stable_and_distinguish_what_was_measured() -> None:
    shard = population(3)
    cid = shard_config_id(shard, 512, "rowwise_adagrad", "fp32", "cpu-x86_64-2c")
    assert cid == shard_config_id(list(shard), 512, "rowwise_adagrad", "fp32", "cpu-x86_64-2c")
    assert cid != shard_config_id(shard, 1024, "rowwise_adagrad", "fp32", "cpu-x86_64-2c")
    assert cid != shard_config_id(shard, 512, "sgd", "fp32", "cpu-x86_64-2c")
    assert cid != shard_config_id(shard[::-1], 512, "rowwise_adagrad", "fp32", "cpu-x86_64-2c")
    assert comm_config_id([8, 16], 512, "gloo", "k") != comm_config_id([16, 8], 512, "gloo", "k")


def test_comm_layouts_use_power_of_two_device_counts_and_population_dims() -> None:
    layouts = sample_comm_layouts(100, dims=[4, 64], seed=1, max_devices=4, max_tables_per_device=3)
    assert {len(w) for w in layouts} == {2, 4}
    for widths in layouts:
        for w in widths:
            assert 0 <= w <= 3 * 64 and w % 4 == 0
    assert layouts == sample_comm_layouts(100, dims=[4, 64], seed=1, max_devices=4, max_tables_per_device=3)
    with pytest.raises(ValueError, match="max_devices"):
        sample_comm_layouts(1, dims=[4], seed=0, max_devices=1)


def test_repeats_are_spread_over_the_run() -> None:
    jobs = _schedule(num_configs=30, repeats=2, repeat_shards=5)
    assert len(jobs) == 30 + 2 * 5
    assert sorted((j.index, j.repeat) for j in jobs if j.repeat == 0) == [(i, 0) for i in range(30)]
    positions = {r: [k for k, j in enumerate(jobs) if j.repeat == r] for r in (1, 2)}
    # each repeat round sits between blocks of first measurements, not all at the end
    assert max(positions[1]) < min(positions[2])
    assert min(positions[2]) < len(jobs) - 5
    assert _schedule(4, repeats=0, repeat_shards=10) == _schedule(4, repeats=3, repeat_shards=0)


def test_a_share_of_shards_is_seeded_with_the_heaviest_tables_some_alone() -> None:
    tables = population(30)  # heaviest tenth by pooling x (dim + 16): 6 x 128, 5 x 124, 6 x 100
    heavy = ["t27", "t26", "t20"]
    plain = sample_shard_configs(tables, 300, batch_size=256, seed=0, max_tables=6)
    assert sample_shard_configs(tables, 300, batch_size=256, seed=0, max_tables=6, heavy_share=0.0) == plain
    seeded = sample_shard_configs(tables, 300, batch_size=256, seed=0, max_tables=6, heavy_share=0.3)
    # spread over the run (3 in every 10: the 4th, 7th and 10th), seeded with each heaviest table in turn
    at = [i for i in range(300) if int((i + 1) * 0.3) > int(i * 0.3)]
    assert len(at) == 90 and [seeded[i][0].name for i in at[:6]] == heavy * 2
    # in rounds of the three: the first round alone, the next two with companions, and so on
    assert [len(seeded[i]) == 1 for i in at[:9]] == [True] * 3 + [False] * 6
    alone = [s[0].name for s in seeded if len(s) == 1 and s[0].name in heavy]
    assert len(alone) >= 30 and set(alone) == set(heavy)  # a third of the 90 seeded shards, each table alone
    assert len([s for s in plain if len(s) == 1 and s[0].name in heavy]) < 10
    with pytest.raises(ValueError, match="heavy_share"):
        sample_shard_configs(tables, 3, batch_size=256, seed=0, heavy_share=1.5)
