"""The workload core: TableSpec validation, reuse bins, features, memory accounting, task files."""

import json

import numpy as np
import pytest
from pydantic import ValidationError

from shardwise.workload import (
    NUM_FEATURES,
    NUM_REUSE_BINS,
    ShardingTask,
    TableSpec,
    TaskError,
    activation_buffer_bytes,
    derive_reuse_bins,
    load_task,
    reuse_histogram,
    sample_batch,
    save_task,
    shard_memory_bytes,
    stable_seed,
    table_features,
    table_memory_bytes,
    tables_features,
)


def _task_doc() -> dict:
    return {
        "format": "shardwise.task/v1",
        "num_devices": 4,
        "device_memory_bytes": 4_000_000_000,
        "batch_size": 65536,
        "tables": [
            {"name": "t0", "rows": 1_000_000, "dim": 64, "pooling_factor": 12.5, "zipf_alpha": 1.05},
            {"name": "t1", "rows": 200, "dim": 8, "pooling_factor": 0.0, "reuse_bins": [0.0] * 17},
        ],
        "comment": "unknown keys are ignored",
    }


def test_round_trip(tmp_path):
    path = tmp_path / "task.json"
    path.write_text(json.dumps(_task_doc()))
    task = load_task(path)
    assert task.tables[0].zipf_alpha == 1.05 and task.optimizer == "rowwise_adagrad"
    again = load_task(save_task(task, tmp_path / "out" / "task.json"))
    assert again == task


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(format="shardwise.plan/v1"), "field 'format'"),
        (lambda d: d.update(num_devices=0), "field 'num_devices'"),
        (lambda d: d.pop("device_memory_bytes"), "field 'device_memory_bytes'"),
        (lambda d: d.update(tables=[]), "field 'tables'"),
        (lambda d: d["tables"][0].update(dim=30), r"field 'tables\.0\.dim': dim 30 is not a multiple of 4"),
        (lambda d: d["tables"][1].update(rows=0), r"field 'tables\.1\.rows'"),
        (lambda d: d["tables"][0].update(pooling_factor=-1), r"field 'tables\.0\.pooling_factor'"),
        (lambda d: d["tables"][1].update(reuse_bins=[0.5] * 3), r"field 'tables\.1\.reuse_bins'"),
        (lambda d: d["tables"][1].update(name="t0"), "appears more than once"),
        (lambda d: d.update(optimizer="lamb"), "field 'optimizer'"),
        (lambda d: d.update(weights_precision="int8"), "field 'weights_precision'"),
        (lambda d: d["tables"][0].update(sharding_types=["row_wise"]),
         r"field 'tables\.0\.sharding_types': sharding_types \['row_wise'\] has neither 'table_wise' nor 'column_wise'"),
        (lambda d: d["tables"][0].update(sharding_types=["table_wise", "grid_shard"]),
         r"field 'tables\.0\.sharding_types\.1': Input should be 'table_wise'"),
        (lambda d: d["tables"][0].update(sharding_types=[]), r"field 'tables\.0\.sharding_types': sharding_types is empty"),
        (lambda d: d["tables"][0].update(sharding_types=["table_wise", "table_wise"]),
         r"field 'tables\.0\.sharding_types': .* more than once"),
        (lambda d: d["tables"][0].update(sharding_types="table_wise"), r"field 'tables\.0\.sharding_types'"),
        (lambda d: d["tables"][0].update(min_partition=2), r"field 'tables\.0\.min_partition'"),
        (lambda d: d["tables"][0].update(min_partition="32"), r"field 'tables\.0\.min_partition'"),
    ],
)
def test_bad_task_refused_naming_field(tmp_path, mutate, field):
    doc = _task_doc()
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TaskError, match=field):
        load_task(path)


def test_a_tables_plan_space_round_trips_and_is_absent_where_unset(tmp_path):
    doc = _task_doc()
    doc["tables"][0].update(sharding_types=["table_wise", "column_wise", "data_parallel"], min_partition=32)
    (tmp_path / "task.json").write_text(json.dumps(doc))
    task = load_task(tmp_path / "task.json")
    assert task.tables[0].sharding_types == ("table_wise", "column_wise", "data_parallel")
    assert task.tables[0].min_partition == 32 and task.tables[1].sharding_types is None
    again = load_task(save_task(task, tmp_path / "out.json"))
    assert again == task
    written = json.loads((tmp_path / "out.json").read_text())["tables"]
    assert written[0]["min_partition"] == 32 and written[0]["sharding_types"] == ["table_wise", "column_wise",
                                                                                   "data_parallel"]
    # unset, a table reads as before in every dump (task files, profiling rows, resume keys)
    assert "sharding_types" not in written[1] and "min_partition" not in written[1]
    assert set(task.tables[1].model_dump()) == {"name", "rows", "dim", "pooling_factor", "zipf_alpha", "reuse_bins",
                                                "source"}
    assert "min_partition" in task.tables[0].model_dump() and "sharding_types" not in task.tables[1].model_dump_json()


@pytest.mark.parametrize(
    ("plan_space", "allowed", "pieces_on_8"),
    [
        ({}, {"table_wise", "column_wise", "row_wise", "data_parallel"}, 8),  # 8 slices of 8 columns
        ({"sharding_types": ["table_wise", "row_wise"]}, {"table_wise", "row_wise"}, 1),
        ({"sharding_types": ["column_wise"]}, {"column_wise"}, 8),
        ({"min_partition": 16}, {"table_wise", "column_wise", "row_wise", "data_parallel"}, 4),
        ({"min_partition": 17}, {"table_wise", "column_wise", "row_wise", "data_parallel"}, 2),
        ({"min_partition": 64}, {"table_wise", "column_wise", "row_wise", "data_parallel"}, 1),
    ],
)
def test_a_tables_plan_space_says_which_types_and_how_many_column_slices(plan_space, allowed, pieces_on_8):
    table = TableSpec.model_validate({"name": "t", "rows": 100, "dim": 64, "pooling_factor": 1.0, **plan_space})
    assert {k for k in ("table_wise", "column_wise", "row_wise", "data_parallel") if table.allows(k)} == allowed
    assert table.max_column_pieces(8) == pieces_on_8
    assert table.max_column_pieces(3) == min(pieces_on_8, 2) and table.max_column_pieces(1) == 1
    assert table.with_dim(32, "t[0:32]").sharding_types == table.sharding_types  # a slice keeps its table's


def test_max_column_pieces_keeps_slices_on_the_4_column_grid():
    table = TableSpec(name="t", rows=10, dim=24, pooling_factor=1.0)
    assert table.max_column_pieces(8) == 2  # 2 x 12; 4 x 6 is off the grid


def test_unreadable_task_files(tmp_path):
    with pytest.raises(TaskError, match="no such task file"):
        load_task(tmp_path / "absent.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(TaskError, match="expected a JSON object"):
        load_task(tmp_path / "list.json")


@pytest.mark.parametrize(
    ("optimizer", "precision", "expected"),
    [
        ("sgd", "fp32", 1000 * 64 * 4),
        ("sgd", "fp16", 1000 * 64 * 2),
        ("rowwise_adagrad", "fp32", 1000 * 64 * 4 + 1000 * 4),
        ("rowwise_adagrad", "fp16", 1000 * 64 * 2 + 1000 * 4),
        ("adam", "fp32", 1000 * 64 * 4 + 2 * 1000 * 64 * 4),
    ],
)
def test_table_memory_per_optimizer_and_precision(optimizer, precision, expected):
    assert table_memory_bytes(1000, 64, optimizer, precision) == expected


def test_shard_memory_adds_state_and_kernel_buffers():
    tables = [TableSpec(name="a", rows=100, dim=16, pooling_factor=1), TableSpec(name="b", rows=50, dim=8, pooling_factor=2)]
    state = table_memory_bytes(100, 16) + table_memory_bytes(50, 8)
    assert shard_memory_bytes(tables, 1024) == state + activation_buffer_bytes(1024, 24) == state + 2 * 4 * 1024 * 24
    assert shard_memory_bytes([], 1024) == 0
    with pytest.raises(ValueError, match="optimizer 'lamb'"):
        table_memory_bytes(10, 4, "lamb")  # type: ignore[arg-type]


def test_reuse_histogram_bins():
    # row 0 once, row 1 twice, row 2 three times, row 3 five times, row 4 forty times
    indices = np.repeat(np.arange(5), [1, 2, 3, 5, 40])
    hist = reuse_histogram(indices)
    assert hist.shape == (NUM_REUSE_BINS,)
    np.testing.assert_allclose(hist[[0, 1, 2, 3, 6]], 0.2)
    assert hist.sum() == pytest.approx(1.0)
    assert reuse_histogram(np.zeros(0, dtype=np.int64)).sum() == 0.0


def test_skew_moves_mass_to_high_reuse_bins():
    uniform = np.array(derive_reuse_bins(10_000, 10.0, 1024, 0.0))
    skewed = np.array(derive_reuse_bins(10_000, 10.0, 1024, 1.3))
    # uniform access at 1 lookup per row: nobody is hit more than 8 times; Zipf 1.3 makes hot rows
    assert uniform[4:].sum() == 0.0 and skewed[4:].sum() > 0.05
    assert np.nonzero(skewed)[0].max() >= 10  # some rows hit over 512 times


def test_column_slices_share_index_data():
    table = TableSpec(name="t", rows=1000, dim=64, pooling_factor=5.0, zipf_alpha=1.0)
    half = table.with_dim(32, name="t[0:32]")
    assert half.source == "t" and half.with_dim(16).source == "t"
    a = sample_batch(table, 64, stable_seed(table.source or table.name))
    b = sample_batch(half, 64, stable_seed(half.source or half.name))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert stable_seed("t") == stable_seed("t") != stable_seed("u")


def test_features():
    table = TableSpec(name="t", rows=1000, dim=16, pooling_factor=3.0, zipf_alpha=1.0)
    f = table_features(table, 512)
    assert f.shape == (NUM_FEATURES,) and NUM_FEATURES == 21
    assert list(f[:4]) == [16.0, 1000.0, 3.0, 1000 * 16 * 4]
    assert table_features(table, 512, "fp16")[3] == 1000 * 16 * 2
    assert f[4:].sum() == pytest.approx(1.0)
    assert tables_features([table, table], 512).shape == (2, 21)
    assert tables_features([], 512).shape == (0, 21)


def test_tablespec_refusals():
    with pytest.raises(ValidationError, match="multiple of 4"):
        TableSpec(name="t", rows=10, dim=6, pooling_factor=1.0)
    with pytest.raises(ValidationError, match="expected 17"):
        TableSpec(name="t", rows=10, dim=8, pooling_factor=1.0, reuse_bins=(1.0,))
    with pytest.raises(ValidationError):
        ShardingTask(num_devices=1, device_memory_bytes=1, batch_size=1, tables=())
