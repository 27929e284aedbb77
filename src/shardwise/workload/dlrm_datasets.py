"""The DLRM embedding dataset format (facebookresearch/dlrm_datasets): read it, and write it for synthetic data.

A file is `torch.save((indices, offsets, lengths))` for one batch of T tables: `lengths` [T, B] bag sizes,
`offsets` [T*B + 1] into `indices`, table-major (table 0's B bags first), optionally gzip-compressed.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from shardwise.errors import ShardwiseError

from .documents import describe_validation_error
from .tables import TableSpec, reuse_histogram
from .tableset import TableSet

GZIP_MAGIC = b"\x1f\x8b"
#: the dataset has no embedding dims; readers get this unless they say otherwise
DEFAULT_DIM = 64
#: the most bytes a file may hold once decompressed: the published files are a few GB at most
MAX_INDEX_DATA_BYTES = 4 * 2**30
#: A gzip file may inflate to at most this many times its size (and 256 MiB whatever its size): index data
#: compresses 3.6x (synthetic tables at row scale 0.01) to 10x (100-row tables), a gzip bomb 1000x (a 300 KB
#: file inflated to 1 GB before this limit), so a bomb is refused after 256 MiB instead of taking all memory.
MAX_COMPRESSION_RATIO = 64
_MIN_INFLATE_LIMIT_BYTES = 256 * 2**20
_CHUNK_BYTES = 1 << 20

#: per table: bag sizes [B] and row ids [sum(lengths)], both int64
IndexData = tuple[np.ndarray, np.ndarray]


class DlrmDatasetError(ShardwiseError, ValueError):
    """A file that is not a well-formed DLRM dataset batch; the message names what is wrong."""


@dataclass(frozen=True)
class DlrmDataset:
    """Tables described from a dataset file and their index data, keyed by table name."""

    tables: TableSet
    index_data: dict[str, IndexData]


def _decompress(path: Path, max_bytes: int) -> io.BytesIO:
    """The gzip file at `path` inflated in 1 MiB steps, refused as soon as it passes `max_bytes`."""
    out = io.BytesIO()
    try:
        with gzip.open(path, "rb") as f:
            while chunk := f.read(_CHUNK_BYTES):
                if out.tell() + len(chunk) > max_bytes:
                    raise DlrmDatasetError(
                        f"{path}: inflates past {max_bytes} bytes, the limit for this file; refused before "
                        "inflating further (a gzip bomb, or larger than any DLRM dataset batch)"
                    )
                out.write(chunk)
    except EOFError:
        raise DlrmDatasetError(f"{path}: truncated gzip file (it ends before the end of its stream)") from None
    except (OSError, zlib.error) as err:
        raise DlrmDatasetError(f"{path}: corrupt gzip file ({err})") from None
    out.seek(0)
    return out


def read_index_data(path: str | Path, max_bytes: int | None = None) -> list[IndexData]:
    """Per-table (lengths, indices) of one dataset file, plain or gzip-compressed (detected by magic bytes).

    A file holding, or inflating to, more than `max_bytes` is refused before it is read whole (default:
    `MAX_INDEX_DATA_BYTES`; for gzip also `MAX_COMPRESSION_RATIO` x its size, but at least 256 MiB)."""
    path = Path(path)
    import torch  # imported here: `shardwise.workload` stays importable without loading torch

    if path.is_dir():
        raise DlrmDatasetError(f"{path}: is a directory, expected a DLRM dataset file (torch.save, maybe gzip)")
    if path.exists() and not path.is_file():  # a FIFO or a device would block or never end
        raise DlrmDatasetError(f"{path}: not a regular file, expected a DLRM dataset file")
    try:
        with path.open("rb") as f:
            compressed = f.read(2) == GZIP_MAGIC
        size = path.stat().st_size
    except FileNotFoundError:
        raise DlrmDatasetError(f"{path}: no such DLRM dataset file") from None
    except OSError as err:
        raise DlrmDatasetError(f"{path}: cannot read it ({err.strerror or err})") from None
    if max_bytes is None:
        max_bytes = MAX_INDEX_DATA_BYTES
        if compressed:
            max_bytes = min(max_bytes, max(_MIN_INFLATE_LIMIT_BYTES, MAX_COMPRESSION_RATIO * size))
    if not compressed and size > max_bytes:
        raise DlrmDatasetError(f"{path}: {size} bytes, over the limit of {max_bytes} bytes (max_bytes)")
    # torch.load needs a seekable file: decompress to memory
    source: Path | io.BytesIO = _decompress(path, max_bytes) if compressed else path
    try:
        loaded = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for non-checkpoint bytes
        raise DlrmDatasetError(f"{path}: not a torch.save file ({type(err).__name__}: {err})") from None
    if not isinstance(loaded, (tuple, list)) or len(loaded) != 3:
        raise DlrmDatasetError(f"{path}: expected a tuple (indices, offsets, lengths), got {type(loaded).__name__}")
    for field, value in zip(("indices", "offsets", "lengths"), loaded):
        if not isinstance(value, torch.Tensor):
            raise DlrmDatasetError(f"{path}: '{field}' is {type(value).__name__}, expected a tensor")
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise DlrmDatasetError(f"{path}: '{field}' holds {value.dtype}, expected integers (int64)")
    indices, offsets, lengths = (t.numpy().astype(np.int64, copy=False) for t in loaded)
    if lengths.ndim != 2:
        raise DlrmDatasetError(f"{path}: 'lengths' has shape {list(lengths.shape)}, expected [T, B]")
    num_tables, batch_size = lengths.shape
    if num_tables == 0 or batch_size == 0:
        raise DlrmDatasetError(f"{path}: 'lengths' has shape {list(lengths.shape)}: no tables or an empty batch")
    if lengths.min() < 0:
        raise DlrmDatasetError(f"{path}: 'lengths' holds negative bag sizes")
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
    max_bytes: int | None = None,
) -> DlrmDataset:
    """Tables and index data from a dataset file: rows = max index + 1, pooling = mean bag size, reuse from data."""
    data = read_index_data(path, max_bytes)
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
    try:
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
        tableset = TableSet(batch_size=batch_size, tables=tuple(specs))
    except ValidationError as err:  # e.g. row ids past any real table, or a dim that is not a multiple of 4
        where = f"table {chosen[len(specs)]}" if len(specs) < len(chosen) else "tables"
        raise DlrmDatasetError(f"{path}: {where}: {describe_validation_error(err)}") from None
    return DlrmDataset(tables=tableset, index_data=index_data)


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
