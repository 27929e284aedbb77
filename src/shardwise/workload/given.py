"""The user's tables as the workload: a population read from a `shardwise.tables/v1` file or from a DLRM dataset
file (`dlrm_datasets`), told apart by their first byte (a JSON object opens with `{`).

A DLRM dataset file holds index data and no embedding dims: its tables get the dims given, else one each drawn
from `DIMS` with the seed, as synthetic tables get theirs. Profiling samples index data from a table's
`zipf_alpha` where it has none, so a table known only by its reuse bins (every table of a dataset file, and
measured tables in a tables file) is given the exponent that best explains them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from .dlrm_datasets import GZIP_MAGIC, DlrmDataset, DlrmDatasetError, read_dlrm_dataset
from .documents import describe_validation_error
from .synthetic import DIMS, fit_zipf_alpha
from .tables import TableSpec
from .tableset import TableSet, load_tables

#: how many bytes of a file are read to tell a tables file from a dataset file
_SNIFF_BYTES = 64
#: how a dataset file opens: gzip, torch.save's zip archive, or its older pickle format
_DATASET_MAGIC = (GZIP_MAGIC, b"PK\x03\x04", b"\x80")


def is_tables_document(path: str | Path) -> bool:
    """Whether `path` holds JSON (a tables file) rather than a DLRM dataset file (torch.save bytes, maybe gzip)."""
    head = _head(path)
    if head is None:
        return Path(path).suffix == ".json"  # the reader that follows names what is wrong with it
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{")


def _head(path: str | Path) -> bytes | None:
    try:
        with Path(path).open("rb") as f:
            return f.read(_SNIFF_BYTES)
    except OSError:
        return None


def with_fitted_skew(tableset: TableSet) -> TableSet:
    """Each table with reuse bins and no `zipf_alpha` given the grid exponent closest to its bins."""
    tables = tuple(
        t.model_copy(update={"zipf_alpha": fit_zipf_alpha(t.rows, t.pooling_factor, tableset.batch_size,
                                                          t.reuse_bins)})
        if t.zipf_alpha is None and t.reuse_bins is not None else t
        for t in tableset.tables
    )
    return tableset.model_copy(update={"tables": tables})


def dataset_dims(path: str | Path, num_tables: int, dims: Sequence[int], seed: int) -> list[int]:
    """The dims of a dataset file's `num_tables` tables: `dims` (one for all, or one per table), else drawn."""
    if not dims:
        return [int(d) for d in np.random.default_rng(seed).choice(np.asarray(DIMS), size=num_tables)]
    if len(dims) == 1:
        return [int(dims[0])] * num_tables
    if len(dims) != num_tables:
        raise DlrmDatasetError(f"{path}: dims lists {len(dims)} dims for the file's {num_tables} tables; give one "
                               "dim (every table gets it), one per table, or none (each drawn from 4..128 with the seed)")
    return [int(d) for d in dims]


def read_given_tables(path: str | Path, *, dims: Sequence[int] = (), seed: int = 0) -> DlrmDataset:
    """The tables of a tables file (no index data) or of a DLRM dataset file (its index data, keyed by table
    name), each with a Zipf exponent where only its reuse bins describe its skew."""
    if is_tables_document(path):
        return DlrmDataset(tables=with_fitted_skew(load_tables(path)), index_data={})
    head = _head(path)
    if head and not head.startswith(_DATASET_MAGIC):
        raise DlrmDatasetError(f"{path}: neither a shardwise.tables/v1 file (JSON) nor a DLRM dataset file "
                               "(torch.save((indices, offsets, lengths)), maybe gzip)")
    data = read_dlrm_dataset(path)
    table_dims = dataset_dims(path, len(data.tables.tables), dims, seed)
    tables: list[TableSpec] = []
    for table, dim in zip(data.tables.tables, table_dims):
        try:
            tables.append(TableSpec.model_validate({**table.model_dump(), "dim": dim}))
        except ValidationError as err:
            raise DlrmDatasetError(f"{path}: table {table.name}: {describe_validation_error(err)} "
                                   "(from dims)") from None
    tableset = data.tables.model_copy(update={"tables": tuple(tables)})
    return DlrmDataset(tables=with_fitted_skew(tableset), index_data=data.index_data)
