"""The cost dataset: atomic appends, loading files and directories, and the noise floor."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from shardwise.profiling import dataset
from shardwise.profiling.dataset import DatasetError, append_rows, load_costs, noise_floor, stored_keys
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
    assert pq.read_schema(path).metadata[b"format"] == b"shardwise.costs/v1"


def test_a_failed_write_leaves_the_existing_file_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "costs.parquet"
    append_rows(path, [row("a", 0, 1.0)])

    def broken_write(table: object, where: object) -> None:
        Path(str(where)).write_bytes(b"half a parquet file")
        raise OSError("disk full")

    monkeypatch.setattr(dataset.pq, "write_table", broken_write)
    with pytest.raises(OSError, match="disk full"):
        append_rows(path, [row("b", 0, 2.0)])
    monkeypatch.undo()
    assert list(load_costs(path)["config_id"]) == ["a"]
    assert [p.name for p in tmp_path.iterdir()] == ["costs.parquet"]  # no temp file left behind


def test_load_costs_reads_several_files_and_directories(tmp_path: Path) -> None:
    append_rows(tmp_path / "parts" / "p1.parquet", [row("a", 0, 1.0)])
    append_rows(tmp_path / "parts" / "p2.parquet", [row("b", 0, 1.0)])
    append_rows(tmp_path / "other.parquet", [row("c", 0, 1.0)])
    df = load_costs([tmp_path / "parts", tmp_path / "other.parquet"])
    assert sorted(df["config_id"]) == ["a", "b", "c"]
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        load_costs(tmp_path / "missing.parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="no .parquet files"):
        load_costs(tmp_path / "empty")


def test_unknown_or_missing_columns_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not_a_column"):
        append_rows(tmp_path / "x.parquet", [{**row("a", 0, 1.0), "not_a_column": 1}])
    pd.DataFrame({"fwd_ms": [1.0]}).to_parquet(tmp_path / "foreign.parquet")
    with pytest.raises(DatasetError, match="missing columns"):
        load_costs(tmp_path / "foreign.parquet")


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
