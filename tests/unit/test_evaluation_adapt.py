"""The shards adaptation times: the task's tables alone first, then fused groups, never more than one device holds."""

import itertools

from shardwise.evaluation.adapt import adaptation_shards
from shardwise.workload import ShardingTask, TableSpec, mlperf_dcnv2_tables, shard_memory_bytes

BATCH = 2048


def _task(memory_bytes: int) -> ShardingTask:
    return ShardingTask(num_devices=4, device_memory_bytes=memory_bytes, batch_size=BATCH,
                        tables=mlperf_dcnv2_tables(1e-3))


def test_each_table_alone_first_then_groups_up_to_a_devices_share_and_two_more():
    task = _task(2**30)
    shards = list(itertools.islice(adaptation_shards(task, 0, BATCH), 300))
    assert [s[0].name for s in shards[:26]] == [t.name for t in task.tables] and all(len(s) == 1 for s in shards[:26])
    groups = shards[26:]
    assert {len(g) for g in groups} == set(range(2, 7 + 2 + 1))  # 26 tables on 4 devices: 7 each, and two more
    assert any(t.dim == 64 for g in groups for t in g)  # column halves, as plans split tables
    assert list(itertools.islice(adaptation_shards(task, 0, BATCH), 300)) == shards  # seeded


def test_nothing_timed_is_more_than_one_device_holds():
    largest = shard_memory_bytes([mlperf_dcnv2_tables(1e-3)[0]], BATCH)
    task = _task(int(0.8 * largest))  # the 40,000-row tables fit only as column halves
    shards = list(itertools.islice(adaptation_shards(task, 0, BATCH), 200))
    assert all(shard_memory_bytes(s, BATCH) <= task.device_memory_bytes for s in shards)
    assert shards[0] == [task.tables[0].with_dim(64)]
    assert len({len(s) for s in shards}) > 2  # small tables still group

    narrow = tuple(TableSpec(name=f"n{i}", rows=1000, dim=4, pooling_factor=2.0) for i in range(3))  # no halves
    tight = ShardingTask(num_devices=3, device_memory_bytes=shard_memory_bytes(narrow[:1], BATCH), batch_size=BATCH,
                         tables=narrow)
    assert list(adaptation_shards(tight, 0, BATCH)) == [[t] for t in narrow]  # no pair fits: sampling stops


def test_the_costliest_tables_column_halves_are_timed_alone_after_the_tables():
    task = _task(2**30)
    # as timed alone: t20 (pooling 100) far above the rest, t21 above half a device's even share, the rest below
    alone_ms = {t.name: 1.0 for t in task.tables} | {"t20": 22.0, "t21": 14.0}
    shards = list(itertools.islice(adaptation_shards(task, 0, BATCH, alone_ms), 40))
    assert [s[0].name for s in shards[:26]] == [t.name for t in task.tables]
    # a device's even share is (24 + 22 + 14) / 4 = 15 ms: the tables costlier than half of it, costliest first
    assert shards[26:28] == [[task.table("t20").with_dim(64)], [task.table("t21").with_dim(64)]]
    assert all(len(s) > 1 for s in shards[28:])  # then the fused groups, as before
    without = list(itertools.islice(adaptation_shards(task, 0, BATCH), 40))
    assert without[:26] == shards[:26] and without[26:38] == shards[28:40]  # the same groups, as seeded
