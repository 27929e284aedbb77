"""Careless and hostile task and table files: every one refused with the document's error class in one line
that names the file and the field and says what would be right; never a traceback, never a coerced value."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardwise.errors import ShardwiseError
from shardwise.workload import (
    ShardingTask,
    TableSet,
    TableSetError,
    TableSpec,
    TaskError,
    documents,
    load_tables,
    load_task,
    sample_task,
    save_tables,
    save_task,
    shard_memory_bytes,
    task_fits,
    task_from_json,
)

GIB = 2**30


def _task_doc() -> dict:
    return {
        "format": "shardwise.task/v1",
        "num_devices": 4,
        "device_memory_bytes": 4_000_000_000,
        "batch_size": 4096,
        "tables": [
            {"name": "t0", "rows": 100_000, "dim": 64, "pooling_factor": 12.5, "zipf_alpha": 1.05},
            {"name": "t1", "rows": 200, "dim": 8, "pooling_factor": 1.0, "reuse_bins": [0.0] * 16 + [1.0]},
        ],
    }


def _write(tmp_path: Path, text: str, name: str = "task.json") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _one_line(err: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(err.value)
    assert "\n" not in message and isinstance(err.value, ShardwiseError)
    return message


def _set(path: str, value: object):  # type: ignore[no-untyped-def]
    """A mutation that sets the field at a dotted path ('tables.0.rows') of the task document."""

    def mutate(doc: dict) -> None:
        *parents, last = path.split(".")
        target: object = doc
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]  # type: ignore[index]
        target[int(last) if isinstance(target, list) else last] = value  # type: ignore[index]

    return mutate


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        # strict counts: a string or a boolean is not a number of devices
        ("num_devices", "4", "expected an integer, got the string '4'"),
        ("num_devices", True, "expected an integer, got the boolean true"),
        ("num_devices", 4.5, "fractional part"),
        ("num_devices", 10**6, "more than 65536"),
        ("num_devices", -3, "greater than or equal to 1"),
        ("device_memory_bytes", 2**63, "not below 2**50"),
        ("device_memory_bytes", "4000000000", "expected an integer"),
        ("device_memory_bytes", None, "valid integer"),
        ("batch_size", False, "expected an integer, got the boolean false"),
        ("batch_size", 2**40, "less than or equal to 2147483647"),
        ("tables.0.rows", "100", "expected an integer, got the string '100'"),
        ("tables.0.rows", 2**41, "less than or equal to"),
        ("tables.0.dim", True, "expected an integer"),
        ("tables.0.dim", 2**17, "less than or equal to 65536"),
        # finite numbers only: NaN and Infinity pass JSON parsing and used to fail later inside a kernel
        ("tables.0.pooling_factor", math.inf, "expected a finite number, got inf"),
        ("tables.0.pooling_factor", -math.inf, "expected a finite number"),
        ("tables.0.pooling_factor", math.nan, "expected a finite number, got nan"),
        ("tables.0.pooling_factor", "12.5", "expected a finite number, got the string '12.5'"),
        ("tables.0.pooling_factor", 1e9, "less than or equal to"),
        ("tables.0.zipf_alpha", math.inf, "expected a finite number"),
        ("tables.0.zipf_alpha", True, "expected a finite number, got the boolean true"),
        ("tables.1.reuse_bins.3", math.nan, "expected a finite number"),
        ("tables.1.reuse_bins.16", 7.0, "each in [0, 1]"),
        ("tables.0.name", "t0\nforged line", "control characters"),
        ("tables.0.name", "x" * 300, "at most 256 characters"),
        ("tables.0.source", "", "at least 1 character"),
        ("tables", {"name": "t0"}, "valid tuple"),
    ],
)
def test_bad_values_refused_naming_file_and_field(tmp_path: Path, field: str, value: object, says: str) -> None:
    doc = _task_doc()
    _set(field, value)(doc)
    path = _write(tmp_path, json.dumps(doc))
    with pytest.raises(TaskError) as err:
        load_task(path)
    message = _one_line(err)
    assert message.startswith(f"{path}: ")
    # a rule over all 17 bins is the whole field's
    assert f"field '{field.removesuffix('.16') if says.startswith('each') else field}'" in message
    assert says in message


@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN", "1e999"])
def test_non_finite_json_literals_refused(tmp_path: Path, literal: str) -> None:
    text = json.dumps(_task_doc()).replace('"pooling_factor": 12.5', f'"pooling_factor": {literal}')
    with pytest.raises(TaskError, match=r"field 'tables\.0\.pooling_factor': expected a finite number"):
        load_task(_write(tmp_path, text))


def test_integral_numbers_stay_accepted() -> None:
    # 4e9 is how people write bytes; numpy integers come from code that builds tasks
    import numpy as np

    doc = _task_doc()
    doc["device_memory_bytes"] = 4e9
    doc["tables"][0]["rows"] = np.int64(100_000)
    task = task_from_json(doc)
    assert task.device_memory_bytes == 4_000_000_000 and task.tables[0].rows == 100_000


def test_missing_format_tag_refused_naming_the_expected_tag(tmp_path: Path) -> None:
    doc = _task_doc()
    del doc["format"]
    with pytest.raises(TaskError, match=r"field 'format' is missing; expected \"format\": 'shardwise.task/v1'"):
        load_task(_write(tmp_path, json.dumps(doc)))
    tables = {"batch_size": 64, "tables": doc["tables"]}
    with pytest.raises(TableSetError, match=r"field 'format' is missing; expected \"format\": 'shardwise.tables/v1'"):
        load_tables(_write(tmp_path, json.dumps(tables), "tables.json"))
    tables["format"] = "x" * 10_000
    with pytest.raises(TableSetError) as err:
        load_tables(_write(tmp_path, json.dumps(tables), "tables.json"))
    assert len(str(err.value)) < 300  # a huge tag is not echoed whole


def test_table_set_counts_are_strict(tmp_path: Path) -> None:
    doc = {"format": "shardwise.tables/v1", "batch_size": "64", "tables": _task_doc()["tables"]}
    with pytest.raises(TableSetError, match="field 'batch_size': expected an integer, got the string '64'"):
        load_tables(_write(tmp_path, json.dumps(doc), "tables.json"))


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p.write_bytes(b'{"format": "shardwise.task/v1", "name": "\xff\xfe"}'), "not UTF-8 text"),
        (lambda p: p.mkdir(), "is a directory, expected a task file"),
        (lambda p: p.write_text("[" * 100_000 + "]" * 100_000), "nested too deeply"),
        (lambda p: p.write_text('{"num_devices": 4, "num_devices": 1000}'), "'num_devices' appears twice"),
        (lambda p: p.write_text('{"num_devices": ' + "9" * 5000 + "}"), "not a valid task file"),
        (lambda p: p.write_text(""), "not valid JSON"),
        (lambda p: os.mkfifo(p), "not a regular file"),
        (lambda p: None, "no such task file"),
    ],
)
def test_unreadable_task_files_refused_in_one_line(tmp_path: Path, make, says: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "task.json"
    make(path)
    with pytest.raises(TaskError) as err:
        load_task(path)
    assert _one_line(err).startswith(f"{path}: ") and says in str(err.value)


def test_over_large_files_refused_before_reading_them_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(documents, "MAX_DOCUMENT_BYTES", 1000)
    path = _write(tmp_path, json.dumps({**_task_doc(), "padding": "x" * 2000}))
    with pytest.raises(TaskError, match="too large for a task file"):
        load_task(path)
    assert path.stat().st_size > documents.MAX_DOCUMENT_BYTES


def test_writing_refuses_a_directory_and_leaves_no_temp_file(tmp_path: Path) -> None:
    task = task_from_json(_task_doc())
    (tmp_path / "out").mkdir()
    with pytest.raises(TaskError, match="is a directory; give the path of a file"):
        save_task(task, tmp_path / "out")
    (tmp_path / "file").write_text("x")
    with pytest.raises(TaskError, match="cannot write it"):
        save_task(task, tmp_path / "file" / "task.json")
    with pytest.raises(TableSetError, match="is a directory"):
        save_tables(TableSet(batch_size=64, tables=task.tables), tmp_path / "out")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["file", "out"]  # nothing stray, no .tmp
    assert load_task(save_task(task, tmp_path / "ok.json")) == task
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_writing_removes_the_temp_file_when_the_rename_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_replace(self: Path, target: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "replace", broken_replace)
    with pytest.raises(TaskError, match="No space left on device"):
        save_task(task_from_json(_task_doc()), tmp_path / "task.json")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def _task(num_devices: int, device_memory_bytes: int, tables: list[TableSpec], batch_size: int = 1024) -> ShardingTask:
    return ShardingTask(num_devices=num_devices, device_memory_bytes=device_memory_bytes, batch_size=batch_size,
                        tables=tuple(tables))


def test_task_fits_says_how_many_gib_are_missing() -> None:
    big = TableSpec(name="big", rows=10**8, dim=128, pooling_factor=10.0)
    need = shard_memory_bytes([big], 1024)
    assert task_fits(_task(2, need, [big])) is None
    # the case: tens of thousands of GiB asked of devices holding a fraction of one
    huge = [TableSpec(name=f"h{i}", rows=10**9, dim=4096, pooling_factor=1.0) for i in range(4)]
    message = task_fits(_task(4, int(0.37 * GIB), huge))
    assert message is not None and message.startswith("no plan fits: the tables need")
    total = shard_memory_bytes(huge, 1024)
    assert f"{total / GIB:.3f} GiB in all" in message and f"{(total - 4 * int(0.37 * GIB)) / GIB:.3f} GiB missing" in message
    # enough memory in all, but one table's narrowest column split does not fit on one device
    narrow = TableSpec(name="narrow", rows=10**8, dim=4, pooling_factor=1.0)
    small = [TableSpec(name=f"s{i}", rows=10, dim=4, pooling_factor=1.0) for i in range(50)]
    cap = shard_memory_bytes([narrow], 1024) // 2
    message = task_fits(_task(8, cap, [narrow, *small]))
    assert message is not None and "table 'narrow'" in message and "it alone" in message
    # a wide table that no device holds whole still fits split over the devices
    assert task_fits(_task(4, need // 3, [big])) is None
    # two devices hold it all, but each half carries its own per-row optimizer state
    message = task_fits(_task(2, need // 2 + 8, [big]))
    assert message is not None and "narrowest split (64 of 128 columns per device)" in message


def test_sample_task_refuses_non_finite_slack_and_out_of_bounds_devices() -> None:
    ts = TableSet(batch_size=64, tables=tuple(task_from_json(_task_doc()).tables))
    for slack in (math.nan, math.inf, -1.0, 1e300):
        with pytest.raises(TableSetError, match="memory_slack"):
            sample_task(ts, num_tables=2, num_devices=2, seed=0, memory_slack=slack)
    with pytest.raises(TableSetError, match="field 'num_devices': 1000000 devices is more than 65536"):
        sample_task(ts, num_tables=2, num_devices=10**6, seed=0)
    with pytest.raises(TableSetError, match="field 'device_memory_bytes'"):
        sample_task(ts, num_tables=2, num_devices=2, seed=0, device_memory_bytes=2**63)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
_fields = st.sampled_from(
    ["format", "num_devices", "device_memory_bytes", "batch_size", "optimizer", "weights_precision", "tables",
     "tables.0", "tables.0.name", "tables.0.rows", "tables.0.dim", "tables.0.pooling_factor", "tables.0.zipf_alpha",
     "tables.1.reuse_bins", "tables.1.reuse_bins.0", "tables.0.source"]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=_fields, value=_json_values)
def test_fuzzed_fields_are_valid_or_refused_with_a_task_error(field: str, value: object) -> None:
    doc = _task_doc()
    _set(field, value)(doc)
    try:
        task = task_from_json(json.loads(json.dumps(doc)), source="fuzz.json")
    except TaskError as err:
        assert "\n" not in str(err) and str(err).startswith("fuzz.json: ")
        return
    # accepted: then every number in it is finite, every count a real integer, and the memory arithmetic works
    for count in (task.num_devices, task.device_memory_bytes, task.batch_size):
        assert type(count) is int and count >= 1
    for t in task.tables:
        assert type(t.rows) is int and type(t.dim) is int and math.isfinite(t.pooling_factor)
        assert t.zipf_alpha is None or math.isfinite(t.zipf_alpha)
    task_fits(task)
