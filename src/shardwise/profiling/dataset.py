"""The cost dataset on disk (Parquet, `shardwise.costs/v1`): a directory of part files, appended to without
rewriting anything, loaded as one table, and its noise floor.

Each append is one new part file with a name no other writer can pick (time, host, process, random), written
under a hidden temp name and renamed into place: readers never see half a part, concurrent writers never
overwrite each other, and an interrupt or a SIGKILL at any moment loses at most the rows not yet written. A single
Parquet file is not a dataset and is refused. Part files' names and their temp files are `parts.py`'s; signals
during a write, `interrupts.py`'s.

A dataset may also live at an object-store prefix (`s3://bucket/prefix`): the same part files, each one PUT (an
object appears whole or not at all), so profiling pods of every run add to one history that pre-training reads
whole. Credentials and endpoint come from the usual AWS variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_ENDPOINT_URL`, else `MLFLOW_S3_ENDPOINT_URL`, the one the manifests set for MLflow's artifacts).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from shardwise.errors import (
    SERVICE_TIMEOUT_ENV,
    ServiceUnauthorisedError,
    ServiceUnreachableError,
    ShardwiseError,
    redacted,
    service_timeout_s,
)

from .interrupts import interrupts_deferred
from .parts import (
    PART_PREFIX,
    STALE_TEMP_PART_S,
    fsync_dir,
    part_name,
    remove_stale_temp_parts,
)
from .schema import (
    ALL_REDUCE_COLUMNS,
    COMM_COLUMNS,
    COMMON_COLUMNS,
    COMPUTE_COLUMNS,
    COMPUTE_DEFAULTS,
    DATASET_FORMAT,
    KERNEL_COLUMNS,
    PROVENANCE_COLUMNS,
    TIMER_COLUMNS,
)

#: the names callers import from here: this module's own, and the part files' and interrupts' they use beside them
__all__ = [
    "ALL_COLUMNS",
    "OBJECT_STORE_SCHEMES",
    "PART_PREFIX",
    "SCHEMA",
    "STALE_TEMP_PART_S",
    "DatasetError",
    "MissingDatasetError",
    "append_rows",
    "count_rows",
    "interrupts_deferred",
    "is_object_store",
    "load_costs",
    "load_stored",
    "noise_floor",
    "object_store",
    "object_store_error",
    "prepare_dataset",
    "remove_stale_temp_parts",
    "rows_to_table",
    "stored_keys",
    "write_part",
]

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
    "launch_ms": _FLOAT,
    "num_tables": _INT,
    "num_devices": _INT,
    "device": _INT,
    "size_bytes": _INT,
    "cache_load_factor": _FLOAT,
    "cache_hit_rate": _FLOAT,
}
ALL_COLUMNS: tuple[str, ...] = (COMMON_COLUMNS + COMPUTE_COLUMNS + COMM_COLUMNS + PROVENANCE_COLUMNS + TIMER_COLUMNS
                                 + ALL_REDUCE_COLUMNS + KERNEL_COLUMNS)
#: every part file has every column with these types (None where a column does not apply to a row's kind)
SCHEMA = pa.schema(
    [pa.field(name, _TYPES.get(name, _STR)) for name in ALL_COLUMNS],
    metadata={b"format": DATASET_FORMAT.encode()},
)
#: the object-store schemes a dataset location may use
OBJECT_STORE_SCHEMES = ("s3://",)


def is_object_store(location: str | Path) -> bool:
    """True for an object-store prefix (`s3://bucket/prefix`), False for a local path."""
    return isinstance(location, str) and location.startswith(OBJECT_STORE_SCHEMES)


def object_store(location: str) -> tuple[Any, str]:
    """A pyarrow filesystem for `location`'s bucket and the prefix path in it ("bucket/prefix")."""
    from pyarrow import fs  # the S3 client loads only for object-store datasets

    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("MLFLOW_S3_ENDPOINT_URL")
    options: dict[str, Any] = {}
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        options = {"endpoint_override": host or scheme, "scheme": scheme if host else "https"}
    region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")
    if region:
        options["region"] = region
    path = location.split("://", 1)[1].strip("/")
    if not path or path.startswith("/"):
        raise DatasetError(f"{location}: an object-store dataset is s3://bucket/prefix")
    # a store that is down is an error within the service timeout, not the SDK's retries and waits
    timeout_s = service_timeout_s()
    options.update(connect_timeout=min(timeout_s, 5.0), request_timeout=timeout_s,
                   retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=3))
    return fs.S3FileSystem(**options), path


#: how the S3 client words a store it could not reach, and one that refused the credentials
_UNREACHABLE = re.compile(r"NETWORK_CONNECTION|curlCode|Could not connect|Couldn't connect|timed out|Timeout",
                          re.IGNORECASE)
_UNAUTHORISED = re.compile(r"ACCESS_DENIED|AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|"
                           r"response code: 40[13]\b|UNRECOGNIZED_CLIENT|INVALID_ACCESS_KEY_ID|SIGNATURE_DOES_NOT_MATCH")


def object_store_error(location: str, err: Exception) -> ShardwiseError:
    """One line for an object store's failure: unreachable, not authorised, else what it answered."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("MLFLOW_S3_ENDPOINT_URL") or "AWS S3"
    detail = redacted(str(err).splitlines()[0] if str(err).strip() else type(err).__name__)
    where = f"{redacted(location)}: the object store at {redacted(endpoint)}"
    if _UNREACHABLE.search(detail):
        return ServiceUnreachableError(f"{where} is unreachable ({detail}); is it running? (${SERVICE_TIMEOUT_ENV} "
                                       "raises the wait)")
    if _UNAUTHORISED.search(detail):
        return ServiceUnauthorisedError(f"{where} refused these credentials as not authorised ({detail}); check "
                                        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    return DatasetError(f"{redacted(location)}: the object store refused ({detail})")


def _remote_parts(location: str) -> tuple[Any, list[str]]:
    """The filesystem and the part files under an object-store prefix, in name (time) order."""
    from pyarrow import fs

    store, prefix = object_store(location)
    try:
        infos = store.get_file_info(fs.FileSelector(prefix, recursive=True, allow_not_found=True))
    except (OSError, pa.ArrowException) as err:
        raise object_store_error(location, err) from None
    return store, sorted(i.path for i in infos if i.type == fs.FileType.File and i.path.endswith(".parquet"))


class DatasetError(ShardwiseError, ValueError):
    """A cost dataset that cannot be read or lacks the columns of `shardwise.costs/v1`."""


class MissingDatasetError(DatasetError, FileNotFoundError):
    """A cost dataset path that does not exist."""


def rows_to_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Rows (dicts keyed by schema columns) as an Arrow table with the dataset's schema."""
    for row in rows:
        unknown = set(row) - set(ALL_COLUMNS)
        if unknown:
            raise DatasetError(f"row has columns not in {DATASET_FORMAT}: {sorted(unknown)}")
    try:
        return pa.Table.from_pylist([{c: row.get(c) for c in ALL_COLUMNS} for row in rows], schema=SCHEMA)
    except pa.ArrowException as err:
        raise DatasetError(f"rows do not match the column types of {DATASET_FORMAT} ({err})") from None


def prepare_dataset(path: str | Path) -> None:
    """Make `path` a dataset directory, ready for parts: create it, and remove the temp parts killed writers left;
    a file there is refused. An object-store prefix needs nothing made: its bucket is checked now, so a wrong one
    fails before measuring."""
    if is_object_store(path):
        from pyarrow import fs

        store, prefix = object_store(str(path))
        bucket = prefix.split("/", 1)[0]
        try:
            found = store.get_file_info(bucket).type != fs.FileType.NotFound
        except (OSError, pa.ArrowException) as err:
            raise object_store_error(str(path), err) from None
        if not found:
            raise DatasetError(f"{path}: bucket {bucket!r} does not exist (or these credentials cannot see it)")
        return
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise _single_file_error(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        remove_stale_temp_parts(path)
    except FileExistsError:  # another tool made it a file meanwhile
        raise _single_file_error(path) from None
    except OSError as err:
        raise DatasetError(f"{path}: cannot make it a cost dataset directory ({err.strerror or err})") from None


def _single_file_error(path: Path) -> DatasetError:
    return DatasetError(f"{path}: a single file, not a cost dataset: {DATASET_FORMAT} is a directory of Parquet part "
                        f"files (move the file into a directory and pass that)")


def write_part(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path | None:
    """Add `rows` to the dataset directory `path` as one new part file (temp name, fsync, rename); None if no
    rows. Existing parts are never touched, so concurrent writers never lose each other's rows."""
    if not rows:
        return None
    table = rows_to_table(rows)
    if is_object_store(path):
        store, prefix = object_store(str(path))
        key = f"{prefix}/{part_name()}"
        try:  # one object, visible only once whole
            pq.write_table(table, key, filesystem=store)
        except (OSError, pa.ArrowException) as err:
            raise object_store_error(str(path), err) from None
        return Path(key)
    path = Path(path)
    if not path.is_dir():
        prepare_dataset(path)
    final = path / part_name()
    tmp = path / f".{final.name}.tmp"
    try:
        pq.write_table(table, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.rename(tmp, final)
    except OSError as err:
        raise DatasetError(f"{path}: cannot write a part file ({err.strerror or err})") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    fsync_dir(path)
    return final


def append_rows(path: str | Path, rows: Sequence[dict[str, Any]]) -> int:
    """Append rows to the dataset at `path` as one new part file; returns the dataset's row count afterwards.

    An interrupted write leaves the dataset as it was: the part appears only once complete."""
    write_part(path, rows)
    return count_rows(path)


def _dataset_files(path: Path) -> list[Path]:
    """The part files of one dataset directory, in name order: the visible `*.parquet` files under it (hidden temp
    files and hidden directories skipped)."""
    if path.is_dir():
        return sorted(
            p
            for p in path.rglob("*.parquet")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
    if path.exists():
        raise _single_file_error(path)
    raise MissingDatasetError(f"cost dataset {path} does not exist")


def _parquet_files(paths: Iterable[str | Path]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        found = _dataset_files(path)
        if not found:
            raise DatasetError(f"{path}: directory holds no .parquet files")
        files.extend(found)
    return files


def count_rows(path: str | Path) -> int:
    """Rows in the dataset at `path`, from the part files' footers (0 when it does not exist or is empty)."""
    if is_object_store(path):
        store, keys = _remote_parts(str(path))
        try:  # the footers only, as for local parts
            return sum(pq.read_metadata(store.open_input_file(key)).num_rows for key in keys)
        except (OSError, pa.ArrowException) as err:
            raise object_store_error(str(path), err) from None
    path = Path(path)
    if not path.exists():
        return 0
    total = 0
    for file in _dataset_files(path):
        try:
            total += pq.read_metadata(file).num_rows
        except (OSError, pa.ArrowException) as err:
            raise DatasetError(f"{file}: not a readable Parquet file ({err})") from None
    return total


def _remote_frames(location: str) -> list[pd.DataFrame]:
    """Every part under an object-store prefix as a DataFrame, in name (time) order ([] when it holds none)."""
    store, keys = _remote_parts(location)
    frames = []
    for key in keys:
        try:
            table = pq.read_table(key, filesystem=store)
        except (OSError, pa.ArrowException) as err:
            raise DatasetError(f"s3://{key}: not a readable Parquet object in {redacted(location)} ({err})") from None
        frames.append(_read_part((f"s3://{key}", table)))
    return frames


def _read_part(part: Path | tuple[str, pa.Table]) -> pd.DataFrame:
    if isinstance(part, tuple):  # an object-store part, already read: (its s3:// name, its rows)
        file, table = part
    else:
        file = str(part)
        try:
            table = pq.read_table(part)
        except (OSError, pa.ArrowException) as err:
            raise DatasetError(f"{file}: not a readable Parquet file ({err})") from None
    missing = [c for c in COMMON_COLUMNS if c not in table.column_names]
    if missing:
        raise DatasetError(f"{file}: missing columns of {DATASET_FORMAT}: {missing}")
    for column in ALL_COLUMNS:  # a part without a column holds null in it (`schema`: columns are only added)
        if column not in table.column_names:
            table = table.append_column(column, pa.nulls(table.num_rows, _TYPES.get(column, _STR)))
    try:
        frame = table.select(list(ALL_COLUMNS)).cast(SCHEMA).to_pandas()
    except pa.ArrowException as err:
        raise DatasetError(f"{file}: columns do not have the types of {DATASET_FORMAT} ({err})") from None
    return _compute_defaults(frame)


def _compute_defaults(frame: pd.DataFrame) -> pd.DataFrame:
    """Compute rows' null kernel columns read as `schema.COMPUTE_DEFAULTS` (every table in HBM, no cache)."""
    compute = frame["kind"] == "compute"
    for column, value in COMPUTE_DEFAULTS.items():
        unset = compute & frame[column].isna()
        if unset.any():
            frame.loc[unset, column] = value
    return frame


def load_costs(paths: str | Path | Iterable[str | Path]) -> pd.DataFrame:
    """One DataFrame of all rows in one or more cost datasets (directories of part files, or s3:// prefixes)."""
    if isinstance(paths, str | Path):
        paths = [paths]
    local = [p for p in paths if not is_object_store(p)]
    frames = [_read_part(file) for file in _parquet_files(local)] if local else []
    for location in (str(p) for p in paths if is_object_store(p)):
        remote = _remote_frames(location)
        if not remote:
            raise MissingDatasetError(f"cost dataset {location} holds no .parquet part files")
        frames += remote
    if not frames:
        return rows_to_table([]).to_pandas()
    return pd.concat(frames, ignore_index=True)


def load_stored(path: str | Path) -> pd.DataFrame | None:
    """The rows already in the dataset at `path` for resuming; None when it does not exist or holds no parts."""
    if is_object_store(path):
        parts = _remote_frames(str(path))
        return pd.concat(parts, ignore_index=True) if parts else None
    path = Path(path)
    if not path.exists():
        return None
    files = _dataset_files(path)
    if not files:
        return None
    return pd.concat([_read_part(file) for file in files], ignore_index=True)


def stored_keys(path: str | Path) -> set[tuple[str, int]]:
    """(config_id, repeat) of every row already in the dataset at `path` (empty when it does not exist)."""
    df = load_stored(path)
    if df is None:
        return set()
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
