"""TableSet IO, train/holdout splits by source, and task sampling with memory caps."""

import json
import math

import pytest

from shardwise.workload import (
    TableSet,
    TableSetError,
    TableSpec,
    load_tables,
    sample_task,
    save_tables,
    shard_memory_bytes,
    split_tables,
)


def _tableset(n: int = 10, batch_size: int = 512) -> TableSet:
    tables = [
        TableSpec(name=f"t{i}", rows=1000 * (i + 1), dim=4 * (i % 4 + 1), pooling_factor=float(i), zipf_alpha=1.0)
        for i in range(n)
    ]
    return TableSet(batch_size=batch_size, tables=tuple(tables))


def test_round_trip(tmp_path):
    ts = _tableset()
    path = save_tables(ts, tmp_path / "sub" / "tables.json")
    assert json.loads(path.read_text())["format"] == "shardwise.tables/v1"
    assert load_tables(path) == ts


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(format="shardwise.task/v1"), "'format'"),
        (lambda d: d.update(batch_size=0), "'batch_size'"),
        (lambda d: d.pop("tables"), "'tables'"),
        (lambda d: d["tables"][2].update(dim=30), "'tables.2.dim'"),
        (lambda d: d["tables"][1].update(rows=0), "'tables.1.rows'"),
        (lambda d: d["tables"][3].pop("pooling_factor"), "'tables.3.pooling_factor'"),
        (lambda d: d["tables"][4].update(name="t0"), "appears more than once"),
    ],
)
def test_bad_file_refused_naming_field(tmp_path, mutate, field):
    doc = _tableset().to_json()
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TableSetError, match=field.replace(".", r"\.")):
        load_tables(path)


def test_missing_and_garbled_files(tmp_path):
    with pytest.raises(TableSetError, match="no such table file"):
        load_tables(tmp_path / "absent.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(TableSetError, match="not valid JSON"):
        load_tables(tmp_path / "x.json")


def test_split_keeps_sources_together_and_is_seeded():
    base = _tableset(20)
    # copies sharing index data with their source must land on the same side
    copies = [t.with_dim(8, name=f"{t.name}@d8") for t in base.tables]
    ts = base.model_copy(update={"tables": base.tables + tuple(copies)})
    train, holdout = split_tables(ts, holdout_fraction=0.2, seed=3)
    train_sources = {t.source or t.name for t in train.tables}
    holdout_sources = {t.source or t.name for t in holdout.tables}
    assert not train_sources & holdout_sources
    assert len(holdout_sources) == 4 and len(train_sources) == 16
    assert len(train.tables) + len(holdout.tables) == len(ts.tables)
    assert split_tables(ts, 0.2, seed=3) == (train, holdout)
    assert split_tables(ts, 0.2, seed=4)[1] != holdout


def test_split_refuses_bad_fraction():
    with pytest.raises(TableSetError, match="holdout_fraction"):
        split_tables(_tableset(), 1.0, seed=0)


def test_sample_task_memory_is_slack_times_total_over_devices():
    ts = _tableset(10)
    task = sample_task(ts, num_tables=6, num_devices=3, seed=1, memory_slack=1.5)
    assert len(task.tables) == 6 and task.num_devices == 3 and task.batch_size == ts.batch_size
    total = shard_memory_bytes(task.tables, task.batch_size, "rowwise_adagrad")
    largest = max(shard_memory_bytes([t], task.batch_size) for t in task.tables)
    assert task.device_memory_bytes == max(math.ceil(1.5 * total / 3), largest)
    # Adam holds two extra values per element: the cap grows with the optimizer's state
    adam = sample_task(ts, num_tables=6, num_devices=3, seed=1, optimizer="adam")
    assert adam.tables == task.tables and adam.device_memory_bytes > task.device_memory_bytes


def test_sample_task_explicit_memory_and_refusals():
    ts = _tableset(5)
    task = sample_task(ts, num_tables=5, num_devices=2, seed=0, device_memory_bytes=10**9)
    assert task.device_memory_bytes == 10**9
    assert sample_task(ts, 3, 2, seed=7) == sample_task(ts, 3, 2, seed=7)
    with pytest.raises(TableSetError, match="num_tables"):
        sample_task(ts, num_tables=6, num_devices=2, seed=0)
    with pytest.raises(TableSetError, match="num_devices"):
        sample_task(ts, num_tables=2, num_devices=0, seed=0)
