"""The DLRM embedding dataset format (facebookresearch/dlrm_datasets): read it, and write it for synthetic data.

A file is `torch.save((indices, offsets, lengths))` for one batch of T tables: `lengths` [T, B] bag sizes,
`offsets` [T*B + 1] into `indices`, table-major (table 0's B bags first), optionally gzip-compressed.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardwise.errors import ShardwiseError

from .tables import TableSpec, reuse_histogram
from .tableset import TableSet

GZIP_MAGIC = b"\x1f\x8b"
#: the dataset has no embedding dims; readers get this unless they say otherwise
DEFAULT_DIM = 64

#: per table: bag sizes [B] and row ids [sum(lengths)], both int64
IndexData = tuple[np.ndarray, np.ndarray]


class DlrmDatasetError(ShardwiseError, ValueError):
    """A file that is not a well-formed DLRM dataset batch; the message names what is wrong."""


@dataclass(frozen=True)
class DlrmDataset:
    """Tables described from a dataset file and their index data, keyed by table name."""

    tables: TableSet
    index_data: dict[str, IndexData]


def read_index_data(path: str | Path) -> list[IndexData]:
    """Per-table (lengths, indices) of one dataset file, plain or gzip-compressed (detected by magic bytes)."""
    path = Path(path)
    import torch  # imported here: `shardwise.workload` stays importable without loading torch

    with path.open("rb") as f:
        compressed = f.read(2) == GZIP_MAGIC
    # torch.load needs a seekable file: decompress to memory (the real files are a few GB at most)
    source: Path | io.BytesIO = io.BytesIO(gzip.decompress(path.read_bytes())) if compressed else path
    try:
        loaded = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for non-checkpoint bytes
        raise DlrmDatasetError(f"{path}: not a torch.save file ({type(err).__name__}: {err})") from None
    if not isinstance(loaded, (tuple, list)) or len(loaded) != 3:
        raise DlrmDatasetError(f"{path}: expected a tuple (indices, offsets, lengths), got {type(loaded).__name__}")
    indices, offsets, lengths = (
        t.numpy().astype(np.int64, copy=False) if isinstance(t, torch.Tensor) else t for t in loaded
    )
    for field, value in (("indices", indices), ("offsets", offsets), ("lengths", lengths)):
        if not isinstance(value, np.ndarray):
            raise DlrmDatasetError(f"{path}: '{field}' is {type(value).__name__}, expected a tensor")
    if lengths.ndim != 2:
        raise DlrmDatasetError(f"{path}: 'lengths' has shape {list(lengths.shape)}, expected [T, B]")
    num_tables, batch_size = lengths.shape
    if offsets.shape != (num_tables * batch_size + 1,):
        raise DlrmDatasetError(
            f"{path}: 'offsets' has shape {list(offsets.shape)}, expected [T*B+1] = [{num_tables * batch_size + 1}]"
        )
    if indices.ndim != 1 or offsets[-1] != indices.size or offsets[0] != 0:
        raise DlrmDatasetError(
            f"{path}: 'offsets' run from {offsets[0]} to {offsets[-1]} but 'indices' holds {indices.size} ids"
        )
    if not np.array_equal(np.diff(offsets), lengths.reshape(-1)):
        raise DlrmDatasetError(f"{path}: 'offsets' do not match 'lengths' (expected table-major bag offsets)")
    if indices.size and indices.min() < 0:
        raise DlrmDatasetError(f"{path}: 'indices' holds negative row ids")
    per_table = offsets[:: batch_size]  # start of each table's segment, plus the end
    return [
        (lengths[t].copy(), indices[per_table[t] : per_table[t + 1]].copy()) for t in range(num_tables)
    ]


def read_dlrm_dataset(
    path: str | Path,
    dim: int | Sequence[int] = DEFAULT_DIM,
    name_prefix: str = "t",
    tables: Sequence[int] | None = None,
) -> DlrmDataset:
    """Tables and index data from a dataset file: rows = max index + 1, pooling = mean bag size, reuse from data."""
    data = read_index_data(path)
    chosen = list(range(len(data))) if tables is None else list(tables)
    for t in chosen:
        if not 0 <= t < len(data):
            raise DlrmDatasetError(f"{path}: table {t} requested, the file holds tables 0..{len(data) - 1}")
    dims = [dim] * len(chosen) if isinstance(dim, int) else list(dim)
    if len(dims) != len(chosen):
        raise DlrmDatasetError(f"dim: {len(dims)} dims given for {len(chosen)} tables")
    specs: list[TableSpec] = []
    index_data: dict[str, IndexData] = {}
    batch_size = int(data[0][0].size)
    for t, d in zip(chosen, dims):
        lengths, indices = data[t]
        name = f"{name_prefix}{t}"
        specs.append(
            TableSpec(
                name=name,
                # the dataset's maintainers advise max index + 1: hash sizes are not recorded
                rows=int(indices.max()) + 1 if indices.size else 1,
                dim=d,
                pooling_factor=float(lengths.mean()),
                reuse_bins=tuple(reuse_histogram(indices).tolist()),
            )
        )
        index_data[name] = (lengths, indices)
    return DlrmDataset(tables=TableSet(batch_size=batch_size, tables=tuple(specs)), index_data=index_data)


def write_dlrm_dataset(path: str | Path, batches: Sequence[IndexData], compress: bool = False) -> Path:
    """Write per-table (lengths, indices) of one batch in the dataset format (gzip when `compress`)."""
    import torch

    if not batches:
        raise DlrmDatasetError("no tables to write")
    batch_size = batches[0][0].size
    for t, (lengths, indices) in enumerate(batches):
        if lengths.shape != (batch_size,):
            raise DlrmDatasetError(f"table {t}: lengths has shape {list(lengths.shape)}, expected [{batch_size}]")
        if int(lengths.sum()) != indices.size:
            raise DlrmDatasetError(f"table {t}: lengths sum to {int(lengths.sum())}, indices hold {indices.size}")
    lengths_t = torch.from_numpy(np.stack([np.asarray(b[0], dtype=np.int64) for b in batches]))
    indices_t = torch.from_numpy(np.concatenate([np.asarray(b[1], dtype=np.int64) for b in batches]))
    offsets_t = torch.zeros(lengths_t.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths_t.reshape(-1), dim=0, out=offsets_t[1:])
    buffer = io.BytesIO()
    torch.save((indices_t, offsets_t, lengths_t), buffer)
    payload = gzip.compress(buffer.getvalue(), compresslevel=1) if compress else buffer.getvalue()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return path
