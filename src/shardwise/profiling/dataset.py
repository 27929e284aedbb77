"""The cost dataset on disk (Parquet, `shardwise.costs/v1`): append atomically, load, and its noise floor."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from shardwise.errors import ShardwiseError

from .schema import COMM_COLUMNS, COMMON_COLUMNS, COMPUTE_COLUMNS, DATASET_FORMAT

_INT = pa.int64()
_FLOAT = pa.float64()
_STR = pa.string()
_TYPES: dict[str, pa.DataType] = {
    "repeat": _INT,
    "fwd_ms": _FLOAT,
    "bwd_ms": _FLOAT,
    "batch_size": _INT,
    "measured_at": _FLOAT,
    "num_threads": _INT,
    "cpu_count": _INT,
    "reference_ms": _FLOAT,
    "raw_fwd_ms": _FLOAT,
    "raw_bwd_ms": _FLOAT,
    "num_tables": _INT,
    "num_devices": _INT,
    "device": _INT,
}
ALL_COLUMNS: tuple[str, ...] = COMMON_COLUMNS + COMPUTE_COLUMNS + COMM_COLUMNS
#: every part file has every column with these types (None where a column does not apply to a row's kind)
SCHEMA = pa.schema(
    [pa.field(name, _TYPES.get(name, _STR)) for name in ALL_COLUMNS],
    metadata={b"format": DATASET_FORMAT.encode()},
)


class DatasetError(ShardwiseError, ValueError):
    """A cost dataset that cannot be read or lacks the columns of `shardwise.costs/v1`."""


def rows_to_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Rows (dicts keyed by schema columns) as an Arrow table with the dataset's schema."""
    for row in rows:
        unknown = set(row) - set(ALL_COLUMNS)
        if unknown:
            raise DatasetError(f"row has columns not in {DATASET_FORMAT}: {sorted(unknown)}")
    return pa.Table.from_pylist([{c: row.get(c) for c in ALL_COLUMNS} for row in rows], schema=SCHEMA)


def append_rows(path: str | Path, rows: Sequence[dict[str, Any]]) -> int:
    """Append rows to the Parquet file at `path` atomically (temp file + rename); returns the total row count.

    An interrupted write leaves the previous file intact: the new file replaces it only once complete."""
    path = Path(path)
    new = rows_to_table(rows)
    if path.exists():
        old = pq.read_table(path).select(list(ALL_COLUMNS)).cast(SCHEMA)
        new = pa.concat_tables([old, new])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(new, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return new.num_rows


def _parquet_files(paths: Iterable[str | Path]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.parquet") if not p.name.startswith("."))
            if not found:
                raise DatasetError(f"{path}: directory holds no .parquet files")
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            raise FileNotFoundError(f"cost dataset {path} does not exist")
    return files


def load_costs(paths: str | Path | Iterable[str | Path]) -> pd.DataFrame:
    """One DataFrame of all rows in one or more cost datasets (Parquet files or directories of them)."""
    if isinstance(paths, str | Path):
        paths = [paths]
    frames = []
    for file in _parquet_files(paths):
        try:
            table = pq.read_table(file)
        except (OSError, pa.ArrowInvalid) as err:
            raise DatasetError(f"{file}: not a readable Parquet file ({err})") from err
        missing = [c for c in COMMON_COLUMNS if c not in table.column_names]
        if missing:
            raise DatasetError(f"{file}: missing columns of {DATASET_FORMAT}: {missing}")
        for column in ALL_COLUMNS:  # older files may lack columns added since
            if column not in table.column_names:
                table = table.append_column(column, pa.nulls(table.num_rows, _TYPES.get(column, _STR)))
        frames.append(table.select(list(ALL_COLUMNS)).cast(SCHEMA).to_pandas())
    if not frames:
        return rows_to_table([]).to_pandas()
    return pd.concat(frames, ignore_index=True)


def stored_keys(path: str | Path) -> set[tuple[str, int]]:
    """(config_id, repeat) of every row already in the dataset at `path` (empty when it does not exist)."""
    if not Path(path).exists():
        return set()
    df = load_costs(path)
    return set(zip(df["config_id"].astype(str), df["repeat"].astype(int)))


def noise_floor(df: pd.DataFrame) -> dict[str, float]:
    """Run-to-run spread of repeated measurements of the same config (fwd_ms + bwd_ms).

    `median_rel_dev`: median over measurements of |x - config median| / config median; `median_spread` and
    `max_spread`: max/min - 1 per config, median and max over configs; `configs`: how many had repeats."""
    # an all-to-all config has one row per device: each device is its own series of repeats
    device = df["device"].fillna(-1) if "device" in df else -1
    frame = df.assign(total_ms=df["fwd_ms"] + df["bwd_ms"], device=device)
    keys = ["kind", "config_id", "device"]
    rel_devs: list[float] = []
    spreads: list[float] = []
    for _, group in frame.groupby(keys, dropna=False):
        totals = group["total_ms"].to_numpy(dtype=np.float64)
        if totals.size < 2:
            continue
        median = float(np.median(totals))
        rel_devs.extend(np.abs(totals - median) / median)
        spreads.append(float(totals.max() / totals.min() - 1.0))
    if not spreads:
        nan = float("nan")
        return {"configs": 0.0, "median_rel_dev": nan, "max_rel_dev": nan, "median_spread": nan, "max_spread": nan}
    return {
        "configs": float(len(spreads)),
        "median_rel_dev": float(np.median(rel_devs)),
        "max_rel_dev": float(np.max(rel_devs)),
        "median_spread": float(np.median(spreads)),
        "max_spread": float(np.max(spreads)),
    }
