"""The DLRM dataset format: write a small file (plain and gzip), read it back into tables and index data; refuse\ntruncated files, gzip bombs and payloads that are not index data in one line."""

import gzip
import io
import tracemalloc

import numpy as np
import pytest
import torch

from shardwise.workload import (
    DlrmDatasetError,
    dlrm_datasets,
    read_dlrm_dataset,
    read_index_data,
    write_dlrm_dataset,
)


def _batches(num_tables: int = 3, batch_size: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for t in range(num_tables):
        lengths = rng.integers(0, 5, size=batch_size) if t != 1 else np.zeros(batch_size, dtype=np.int64)
        out.append((lengths.astype(np.int64), rng.integers(0, 50 + 10 * t, size=int(lengths.sum()))))
    return out


@pytest.mark.parametrize("compress", [False, True])
def test_round_trip(tmp_path, compress):
    batches = _batches()
    path = write_dlrm_dataset(tmp_path / "batch.pt", batches, compress=compress)
    assert (path.read_bytes()[:2] == b"\x1f\x8b") is compress
    back = read_index_data(path)
    assert len(back) == len(batches)
    for (lengths, indices), (l2, i2) in zip(batches, back):
        np.testing.assert_array_equal(lengths, l2)
        np.testing.assert_array_equal(indices, i2)


def test_layout_is_the_dataset_s(tmp_path):
    """indices, offsets (table-major, T*B+1), lengths [T, B], as the real files hold them."""
    batches = _batches(num_tables=2, batch_size=4)
    path = write_dlrm_dataset(tmp_path / "b.pt", batches)
    indices, offsets, lengths = torch.load(path, weights_only=True)
    assert list(lengths.shape) == [2, 4] and list(offsets.shape) == [9]
    assert offsets[4].item() == int(batches[0][0].sum())
    assert torch.equal(indices[: offsets[4]], torch.from_numpy(batches[0][1]))


def test_tables_from_data(tmp_path):
    batches = _batches()
    path = write_dlrm_dataset(tmp_path / "b.pt.gz", batches, compress=True)
    ds = read_dlrm_dataset(path, dim=[16, 32, 8], name_prefix="f")
    assert ds.tables.batch_size == 8 and [t.name for t in ds.tables.tables] == ["f0", "f1", "f2"]
    t0, t1, t2 = ds.tables.tables
    assert t0.rows == int(batches[0][1].max()) + 1  # max index + 1
    assert t0.pooling_factor == pytest.approx(batches[0][0].mean())
    assert t1.rows == 1 and t1.pooling_factor == 0.0 and sum(t1.reuse_bins) == 0.0
    assert t2.dim == 8 and sum(t2.reuse_bins) == pytest.approx(1.0)
    np.testing.assert_array_equal(ds.index_data["f2"][1], batches[2][1])
    only = read_dlrm_dataset(path, tables=[2])
    assert [t.name for t in only.tables.tables] == ["t2"] and only.tables.tables[0].dim == 64


def test_malformed_files_refused(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(DlrmDatasetError, match="not a torch.save file"):
        read_index_data(garbage)
    lengths = torch.tensor([[1, 2], [0, 1]])
    bad = [
        ((torch.arange(4), torch.tensor([0, 1, 3, 3, 4]), lengths.reshape(-1)), "'lengths' has shape"),
        ((torch.arange(4), torch.tensor([0, 1, 3, 4]), lengths), "'offsets' has shape"),
        ((torch.arange(3), torch.tensor([0, 1, 3, 3, 4]), lengths), "'indices' holds 3 ids"),
        ((torch.arange(4), torch.tensor([0, 2, 3, 3, 4]), lengths), "do not match 'lengths'"),
        ((torch.arange(4), torch.tensor([0, 1, 3, 3, 4])), "expected a tuple"),
    ]
    for i, (payload, message) in enumerate(bad):
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        path = tmp_path / f"bad{i}.pt"
        path.write_bytes(gzip.compress(buffer.getvalue()) if i % 2 else buffer.getvalue())
        with pytest.raises(DlrmDatasetError, match=message):
            read_index_data(path)


def test_writer_refuses_inconsistent_batches(tmp_path):
    with pytest.raises(DlrmDatasetError, match="table 0: lengths sum"):
        write_dlrm_dataset(tmp_path / "x.pt", [(np.array([1, 2]), np.arange(2))])


def _gzip_of_zeros(path, inflated_bytes: int):
    with gzip.open(path, "wb", compresslevel=9) as f:
        zeros = bytes(1 << 20)
        for _ in range(inflated_bytes >> 20):
            f.write(zeros)
    return path


def test_gzip_bomb_refused_before_taking_the_memory(tmp_path):
    bomb = _gzip_of_zeros(tmp_path / "bomb.pt.gz", 64 << 20)  # 64 MiB of zeros in about 64 KB
    tracemalloc.start()
    try:
        with pytest.raises(DlrmDatasetError, match="inflates past 2097152 bytes"):
            read_index_data(bomb, max_bytes=2 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # refused while inflating, not after


def test_default_inflate_limit_follows_the_compressed_size(tmp_path, monkeypatch):
    # by default a gzip file may inflate to MAX_COMPRESSION_RATIO x its size (and never less than a floor)
    monkeypatch.setattr(dlrm_datasets, "_MIN_INFLATE_LIMIT_BYTES", 1 << 20)
    bomb = _gzip_of_zeros(tmp_path / "bomb.pt.gz", 64 << 20)
    limit = dlrm_datasets.MAX_COMPRESSION_RATIO * bomb.stat().st_size
    assert limit < 64 << 20
    with pytest.raises(DlrmDatasetError, match=f"inflates past {max(limit, 1 << 20)} bytes"):
        read_dlrm_dataset(bomb)
    honest = write_dlrm_dataset(tmp_path / "ok.pt.gz", _batches(batch_size=4096), compress=True)
    assert len(read_index_data(honest)) == 3


def test_truncated_and_corrupt_gzip_refused(tmp_path):
    whole = write_dlrm_dataset(tmp_path / "b.pt.gz", _batches(batch_size=512), compress=True).read_bytes()
    truncated = tmp_path / "truncated.pt.gz"
    truncated.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DlrmDatasetError, match="truncated gzip file"):
        read_index_data(truncated)
    corrupt = tmp_path / "corrupt.pt.gz"
    corrupt.write_bytes(whole[:20] + bytes(len(whole) - 20))
    with pytest.raises(DlrmDatasetError, match="corrupt gzip file"):
        read_index_data(corrupt)


def test_paths_and_payloads_that_are_not_index_data_refused(tmp_path):
    with pytest.raises(DlrmDatasetError, match="no such DLRM dataset file"):
        read_index_data(tmp_path / "absent.pt")
    with pytest.raises(DlrmDatasetError, match="is a directory"):
        read_index_data(tmp_path)
    big = tmp_path / "big.pt"
    big.write_bytes(bytes(4096))
    with pytest.raises(DlrmDatasetError, match="4096 bytes, over the limit of 1024"):
        read_index_data(big, max_bytes=1024)
    lengths = torch.tensor([[1, 2], [0, 1]])
    offsets = torch.tensor([0, 1, 3, 3, 4])
    bad = [
        ((torch.arange(4.0), offsets, lengths), "'indices' holds torch.float32, expected integers"),
        ((torch.arange(4), offsets, [[1, 2], [0, 1]]), "'lengths' is list, expected a tensor"),
        ((torch.arange(4), torch.tensor([0, 1, 3, 1, 4]), torch.tensor([[1, 2], [-2, 3]])), "negative bag sizes"),
        ((torch.arange(0), torch.tensor([0]), torch.zeros(0, 2, dtype=torch.int64)), "no tables or an empty batch"),
    ]
    for i, (payload, message) in enumerate(bad):
        path = tmp_path / f"bad{i}.pt"
        torch.save(payload, path)
        with pytest.raises(DlrmDatasetError, match=message):
            read_index_data(path)
    # row ids past any real table: the table it would describe is refused, not a pydantic traceback
    path = tmp_path / "rows.pt"
    torch.save((torch.tensor([2**45]), torch.tensor([0, 1]), torch.tensor([[1]])), path)
    with pytest.raises(DlrmDatasetError, match=r"table 0: field 'rows'"):
        read_dlrm_dataset(path)
    with pytest.raises(DlrmDatasetError, match=r"table 0: field 'dim'"):
        read_dlrm_dataset(write_dlrm_dataset(tmp_path / "ok.pt", _batches()), dim=6)
