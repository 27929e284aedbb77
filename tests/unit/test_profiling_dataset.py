"""The cost dataset: appends as part files (concurrent writers, a SIGKILL), loading directories (a single file
refused), parts without the newer columns, and the noise floor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardwise.errors import ShardwiseError
from shardwise.profiling import dataset
from shardwise.profiling.dataset import (
    DatasetError,
    append_rows,
    count_rows,
    load_costs,
    load_stored,
    noise_floor,
    prepare_dataset,
    rows_to_table,
    stored_keys,
)
from shardwise.profiling.schema import COMMON_COLUMNS


def row(config_id: str, repeat: int, fwd_ms: float, bwd_ms: float = 1.0, **extra: object) -> dict:
    return {"kind": "compute", "config_id": config_id, "repeat": repeat, "fwd_ms": fwd_ms, "bwd_ms": bwd_ms,
            "batch_size": 64, "hardware_kind": "cpu-test", **extra}


def test_append_accumulates_and_keeps_every_column(tmp_path: Path) -> None:
    path = tmp_path / "costs.parquet"
    assert append_rows(path, [row("a", 0, 1.0)]) == 1
    assert append_rows(path, [row("b", 0, 2.0), {**row("c", 0, 3.0), "kind": "comm", "device": 1}]) == 3
    df = load_costs(path)
    assert list(df["config_id"]) == ["a", "b", "c"]
    assert set(COMMON_COLUMNS) <= set(df.columns)
    assert df.loc[2, "device"] == 1 and pd.isna(df.loc[0, "device"])
    assert stored_keys(path) == {("a", 0), ("b", 0), ("c", 0)}
    parts = sorted(path.iterdir())
    assert path.is_dir() and len(parts) == 2  # one part per append, nothing rewritten
    assert all(p.name.startswith("part-") and p.suffix == ".parquet" for p in parts)
    assert pq.read_schema(parts[0]).metadata[b"format"] == b"shardwise.costs/v1"
    assert count_rows(path) == 3 and count_rows(tmp_path / "absent") == 0
    assert pd.read_parquet(path)["config_id"].tolist() == ["a", "b", "c"]  # other tools read it as one dataset


def test_a_failed_write_leaves_the_existing_file_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "costs.parquet"
    append_rows(path, [row("a", 0, 1.0)])

    def broken_write(table: object, where: object) -> None:
        Path(str(where)).write_bytes(b"half a parquet file")
        raise OSError("disk full")

    monkeypatch.setattr(dataset.pq, "write_table", broken_write)
    with pytest.raises(DatasetError, match="disk full"):
        append_rows(path, [row("b", 0, 2.0)])
    monkeypatch.undo()
    assert list(load_costs(path)["config_id"]) == ["a"]
    assert [p.name for p in tmp_path.iterdir()] == ["costs.parquet"]
    assert len(list(path.iterdir())) == 1  # no temp file left behind


def test_load_costs_reads_several_datasets(tmp_path: Path) -> None:
    append_rows(tmp_path / "parts" / "p1.parquet", [row("a", 0, 1.0)])
    append_rows(tmp_path / "parts" / "p2.parquet", [row("b", 0, 1.0)])
    append_rows(tmp_path / "other", [row("c", 0, 1.0)])
    df = load_costs([tmp_path / "parts", tmp_path / "other"])
    assert sorted(df["config_id"]) == ["a", "b", "c"]
    with pytest.raises(FileNotFoundError, match="missing.parquet") as missing:
        load_costs(tmp_path / "missing.parquet")
    assert isinstance(missing.value, DatasetError)  # one line from the CLI, not a traceback
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="no .parquet files"):
        load_costs(tmp_path / "empty")


def test_unknown_or_missing_columns_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not_a_column"):
        append_rows(tmp_path / "x.parquet", [{**row("a", 0, 1.0), "not_a_column": 1}])
    (tmp_path / "foreign").mkdir()
    pd.DataFrame({"fwd_ms": [1.0]}).to_parquet(tmp_path / "foreign" / "part-0.parquet")
    with pytest.raises(DatasetError, match="missing columns"):
        load_costs(tmp_path / "foreign")


def test_noise_floor_of_repeated_measurements() -> None:
    # config a: totals 10, 11, 12 (median 11); config b: 20, 20; config c measured once (ignored)
    df = pd.DataFrame(
        [row("a", 0, 9.0), row("a", 1, 10.0), row("a", 2, 11.0), row("b", 0, 19.0), row("b", 1, 19.0),
         row("c", 0, 5.0)]
    )
    floor = noise_floor(df)
    assert floor["configs"] == 2
    assert floor["max_spread"] == pytest.approx(12 / 10 - 1)
    assert floor["median_spread"] == pytest.approx((0.2 + 0.0) / 2)
    # relative deviations: 1/11, 0, 1/11, 0, 0 -> median 0
    assert floor["median_rel_dev"] == pytest.approx(0.0)
    assert floor["max_rel_dev"] == pytest.approx(1 / 11)
    assert noise_floor(df[df.config_id == "c"])["configs"] == 0


def test_a_single_file_is_refused_in_one_line_and_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "costs.parquet"
    pq.write_table(rows_to_table([row("old", 0, 1.0)]), path)
    before = path.read_bytes()
    for call in (load_costs, count_rows, stored_keys, prepare_dataset, lambda p: append_rows(p, [row("new", 0, 2.0)])):
        with pytest.raises(DatasetError, match=r"costs.parquet: a single file, not a cost dataset: shardwise.costs/v1 "
                                               r"is a directory of Parquet part files \(move the file into a directory"):
            call(path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["costs.parquet"]


def test_a_part_without_the_newer_columns_reads_them_as_null_and_its_shards_as_in_hbm(tmp_path: Path) -> None:
    from shardwise.profiling.schema import KERNEL_COLUMNS, PROVENANCE_COLUMNS, TIMER_COLUMNS

    path = tmp_path / "costs"
    path.mkdir()
    table = rows_to_table([row("a", 0, 1.0), {**row("c", 0, 1.0), "kind": "comm", "device": 0}])
    pq.write_table(table.drop_columns([*KERNEL_COLUMNS, *PROVENANCE_COLUMNS, *TIMER_COLUMNS]),
                   path / "part-0.parquet")
    append_rows(path, [row("b", 0, 1.0, kernel="fused_uvm_caching", cache_load_factor=0.2, timer="thread")])
    df = load_costs(path).set_index("config_id")
    assert df.loc["a", "kernel"] == "fused" and df.loc["a", "cache_load_factor"] == 0.0  # schema.COMPUTE_DEFAULTS
    assert pd.isna(df.loc["a", "timer"]) and pd.isna(df.loc["a", "provenance"])
    assert pd.isna(df.loc["c", "kernel"])  # the defaults are a compute row's
    assert df.loc["b", "kernel"] == "fused_uvm_caching" and df.loc["b", "cache_load_factor"] == 0.2


#: one writer process: append chunks of rows tagged by writer; note each chunk once `append_rows` returned
_WRITER = """
import sys
from shardwise.profiling.dataset import append_rows
path, writer, chunk, log, chunks = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
row = dict(kind="compute", repeat=0, fwd_ms=1.0, bwd_ms=1.0, batch_size=64, hardware_kind="cpu-test")
for k in range(chunks):
    append_rows(path, [dict(row, config_id=f"{writer}-{k}-{i}") for i in range(chunk)])
    with open(log, "a") as f:
        f.write(f"{k}\\n")
"""


def test_concurrent_writers_and_a_sigkill_lose_at_most_the_chunk_in_flight(tmp_path: Path) -> None:
    path = tmp_path / "costs.parquet"
    append_rows(path, [row("old", 0, 1.0)])
    chunk, chunks = 5, 20
    logs = {w: tmp_path / f"{w}.log" for w in ("a", "b", "killed")}
    procs = {
        w: subprocess.Popen([sys.executable, "-c", _WRITER, str(path), w, str(chunk), str(logs[w]), str(n)])
        for w, n in (("a", chunks), ("b", chunks), ("killed", 10_000))
    }
    deadline = time.monotonic() + 120
    while not (logs["killed"].exists() and len(logs["killed"].read_text().split()) >= 3):
        assert time.monotonic() < deadline, "the writer to kill never appended"
        time.sleep(0.02)
    procs["killed"].send_signal(signal.SIGKILL)
    codes = {w: p.wait(120) for w, p in procs.items()}
    assert codes == {"a": 0, "b": 0, "killed": -signal.SIGKILL}

    df = load_costs(path)
    ids = df["config_id"].tolist()
    assert len(ids) == len(set(ids))  # nothing duplicated
    for w in ("a", "b"):  # every row of every chunk of the writers that finished
        assert sum(i.startswith(f"{w}-") for i in ids) == chunk * chunks
    assert "old" in ids
    # the killed writer: every chunk it saw stored, and at most the one in flight beyond that
    noted = len(logs["killed"].read_text().split())
    stored = sum(i.startswith("killed-") for i in ids)
    assert stored in (chunk * noted, chunk * (noted + 1))
    assert not [p for p in path.iterdir() if p.name.startswith(".")] or stored == chunk * noted  # a temp part
    assert count_rows(path) == len(df)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: p.write_text("not parquet"), "not a readable Parquet file"),
        (lambda p: pq.write_table(rows_to_table([row("a", 0, 1.0)]).drop_columns(["repeat"])
                                  .append_column("repeat", pa.array(["zero"])), p), "types"),
    ],
)
def test_unreadable_datasets_are_refused_in_one_line(tmp_path: Path, setup, message: str) -> None:
    path = tmp_path / "costs"
    path.mkdir()
    setup(path / "part-0.parquet")
    with pytest.raises(DatasetError, match=message):
        load_costs(path)


def test_a_path_that_cannot_hold_a_dataset_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(DatasetError, match="cannot make it a cost dataset directory") as err:
        append_rows(tmp_path / "file" / "costs.parquet", [row("a", 0, 1.0)])
    assert isinstance(err.value, ShardwiseError)
    with pytest.raises(DatasetError, match="column types"):
        append_rows(tmp_path / "c", [row("a", 0, "slow")])  # type: ignore[arg-type]
    assert load_stored(tmp_path / "absent") is None
    (tmp_path / "empty").mkdir()
    assert load_stored(tmp_path / "empty") is None  # a dataset directory no writer has added to yet


def test_a_killed_writers_temporary_part_is_removed_by_the_next_writer(tmp_path: Path) -> None:
    """A SIGKILL between writing and renaming leaves `.part-*.tmp`: readers skip it, the next writer deletes it
    when its process is dead (or it is old), and leaves a live writer's alone."""
    from shardwise.profiling.dataset import STALE_TEMP_PART_S, prepare_dataset
    from shardwise.profiling.parts import host_name

    data = tmp_path / "costs"
    data.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    orphan = data / f".part-{time.time_ns():020d}-{host_name()}-{dead_pid}-0123456789ab.parquet.tmp"
    live = data / f".part-{time.time_ns():020d}-{host_name()}-{os.getpid()}-0123456789ab.parquet.tmp"
    elsewhere = data / f".part-{time.time_ns():020d}-otherhost-{dead_pid}-0123456789ab.parquet.tmp"
    old = data / f".part-{time.time_ns():020d}-otherhost-1-0123456789ab.parquet.tmp"
    for tmp in (orphan, live, elsewhere, old):
        tmp.write_bytes(b"half a parquet file")
    os.utime(old, (time.time() - 2 * STALE_TEMP_PART_S,) * 2)

    prepare_dataset(data)

    assert not orphan.exists() and not old.exists()
    assert live.exists() and elsewhere.exists()  # a writer that may still be running keeps its file
