"""The DLRM dataset format: write a small file (plain and gzip), read it back into tables and index data."""

import gzip
import io

import numpy as np
import pytest
import torch

from shardwise.workload import DlrmDatasetError, read_dlrm_dataset, read_index_data, write_dlrm_dataset


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
