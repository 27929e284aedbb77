"""The user's tables as the workload (`shardwise workload from`, the pipeline's workload step `build`): a tables
file or a DLRM dataset file becomes exactly what the synthetic step hands on (tables.json, indices.pt, the split),
and a file that cannot be a workload is refused in one line naming it and the field."""

import json

import numpy as np
import pytest

from shardwise.cli import main
from shardwise.errors import ShardwiseError
from shardwise.jobs import workload as job
from shardwise.jobs.base import SettingsError, build_settings
from shardwise.pipelines.params import PipelineArgumentError, pipeline_params
from shardwise.workload import (
    DIMS,
    TableSpec,
    derive_reuse_bins,
    load_tables,
    read_dlrm_dataset,
    reuse_histogram,
    sample_batch,
    write_dlrm_dataset,
)
from shardwise.workload.given import read_given_tables

BATCH = 256


def _dataset(path, num_tables=6, seed=0):
    """A DLRM dataset file of `num_tables` Zipf tables of different skew (alpha 0 .. 1.5) at batch BATCH."""
    specs = [TableSpec(name=f"t{i}", rows=500 + 100 * i, dim=8, pooling_factor=2.0 + i, zipf_alpha=0.3 * i)
             for i in range(num_tables)]
    batches = [sample_batch(t, BATCH, seed + i) for i, t in enumerate(specs)]
    return write_dlrm_dataset(path, batches), batches


def _tables_file(path, tables, batch_size=BATCH):
    path.write_text(json.dumps({"format": "shardwise.tables/v1", "batch_size": batch_size,
                                "tables": [t.model_dump(mode="json", exclude_none=True) for t in tables]}))
    return path


def test_a_dataset_file_gives_its_tables_skew_and_index_data(tmp_path):
    path, batches = _dataset(tmp_path / "day0.pt")
    result = job.given(job.GivenSettings(tables=str(path), seed=3, out=str(tmp_path / "w")))
    tables = load_tables(result.tables_path)
    assert result.kind == "DLRM dataset" and tables.batch_size == BATCH and len(tables.tables) == 6
    for table, (lengths, indices) in zip(tables.tables, batches):
        assert table.rows == int(indices.max()) + 1 and table.pooling_factor == pytest.approx(lengths.mean())
        np.testing.assert_allclose(table.reuse_bins, reuse_histogram(indices))
        assert table.dim in DIMS
    # profiling with no index data samples from zipf_alpha: the fitted exponents follow the tables' skew
    alphas = [t.zipf_alpha for t in tables.tables]
    assert alphas == pytest.approx([0.3 * i for i in range(6)], abs=0.35)
    # the file is the index data, names matching, as `profile --indices` reads it
    assert result.indices_path == str(tmp_path / "w" / "indices.pt")
    assert set(read_dlrm_dataset(result.indices_path).index_data) == {t.name for t in tables.tables}
    # dims drawn with the seed: the same seed, the same dims
    again = job.given(job.GivenSettings(tables=str(path), seed=3, out=str(tmp_path / "again")))
    assert [t.dim for t in load_tables(again.tables_path).tables] == [t.dim for t in tables.tables]


def test_dataset_dims_one_for_all_or_one_per_table(tmp_path):
    path, _ = _dataset(tmp_path / "day0.pt", num_tables=3)
    assert {t.dim for t in read_given_tables(path, dims=[16]).tables.tables} == {16}
    assert [t.dim for t in read_given_tables(path, dims=[4, 8, 12]).tables.tables] == [4, 8, 12]


def test_a_tables_file_is_taken_with_skew_fitted_where_only_reuse_bins_describe_it(tmp_path):
    measured = TableSpec(name="m", rows=5000, dim=16, pooling_factor=4.0,
                         reuse_bins=derive_reuse_bins(5000, 4.0, BATCH, 1.2))
    zipf = TableSpec(name="z", rows=800, dim=8, pooling_factor=1.0, zipf_alpha=0.7)
    plain = TableSpec(name="u", rows=300, dim=4, pooling_factor=3.0)
    path = _tables_file(tmp_path / "mine.json", [measured, zipf, plain])
    result = job.given(job.GivenSettings(tables=str(path), out=str(tmp_path / "w")))
    assert result.kind == "tables file" and result.indices_path is None
    assert not (tmp_path / "w" / "indices.pt").exists()
    m, z, u = load_tables(result.tables_path).tables
    assert m.zipf_alpha == pytest.approx(1.2, abs=0.3) and m.reuse_bins == measured.reuse_bins
    assert z == zipf and u == plain  # given skew kept; none given: uniform, as profiling samples it


def test_the_workload_step_splits_given_tables_as_it_splits_synthetic_ones(tmp_path):
    path, _ = _dataset(tmp_path / "day0.pt", num_tables=10)
    given = job.build(job.WorkloadSettings(tables=str(path), holdout_fraction=0.2, out=str(tmp_path / "given")))
    train, holdout = load_tables(given.split.train_path), load_tables(given.split.holdout_path)
    assert (len(train.tables), len(holdout.tables)) == (8, 2)
    assert isinstance(given.population, job.GivenResult) and "from the DLRM dataset" in given.summary()
    synthetic = job.build(job.WorkloadSettings(num_tables=10, row_scale=0.0001, batch_size=64,
                                               out=str(tmp_path / "synth")))
    assert isinstance(synthetic.population, job.SynthResult)
    # the same files, in the same places, for the steps downstream
    for root in (tmp_path / "given", tmp_path / "synth"):
        assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == [
            "indices.pt", "split/holdout.json", "split/train.json", "tables.json"]


def test_cli_workload_from_then_split(tmp_path, capsys):
    path, _ = _dataset(tmp_path / "day0.pt")
    assert main(["workload", "from", "--tables", str(path), "--dims", "32", "--out", str(tmp_path / "w")]) == 0
    assert "6 tables from the DLRM dataset" in capsys.readouterr().out
    assert main(["workload", "split", "--tables", str(tmp_path / "w" / "tables.json"),
                 "--out", str(tmp_path / "split")]) == 0


@pytest.mark.parametrize("case, expected", [
    ("one-table file", r"one\.json: field 'tables' holds 1 source table\(s\); the workload needs at least 2"),
    ("one-table dataset", r"one\.pt: field 'tables' holds 1 source table"),
    ("dims for a tables file", r"dims \[8\]: .*two\.json is a tables file"),
    ("dims count", r"two\.pt: dims lists 2 dims for the file's 3 tables"),
    ("dim unaligned", r"two\.pt: table t0: field 'dim': dim 10 is not a multiple of 4"),
    ("not index data", r"junk\.bin: neither a shardwise\.tables/v1 file \(JSON\) nor a DLRM dataset file"),
    ("missing file", r"absent\.pt: no such DLRM dataset file"),
    ("other scheme", r"tables 'gs://bucket/tables\.json': an object in the object store is s3://bucket/key"),
])
def test_bad_inputs_are_refused_naming_the_file_and_field(tmp_path, case, expected):
    _tables_file(tmp_path / "one.json", [TableSpec(name="a", rows=10, dim=4, pooling_factor=1.0)])
    _tables_file(tmp_path / "two.json", [TableSpec(name=n, rows=10, dim=4, pooling_factor=1.0) for n in "ab"])
    _dataset(tmp_path / "one.pt", num_tables=1)
    _dataset(tmp_path / "two.pt", num_tables=3)
    (tmp_path / "junk.bin").write_bytes(b"\x00 not a checkpoint" * 10)
    tables, dims = {
        "one-table file": ("one.json", ()), "one-table dataset": ("one.pt", ()),
        "dims for a tables file": ("two.json", (8,)), "dims count": ("two.pt", (8, 16)),
        "dim unaligned": ("two.pt", (10,)), "not index data": ("junk.bin", ()), "missing file": ("absent.pt", ()),
        "other scheme": ("gs://bucket/tables.json", ()),
    }[case]
    location = tables if "://" in tables else str(tmp_path / tables)
    with pytest.raises(ShardwiseError, match=expected) as err:
        job.given(job.GivenSettings(tables=location, dims=dims, out=str(tmp_path / "w")))
    assert "\n" not in str(err.value)


def test_dims_without_a_dataset_file_are_refused():
    with pytest.raises(SettingsError, match="dims \\[8\\] are for a DLRM dataset file's tables"):
        build_settings(job.WorkloadSettings, {"dims": (8,), "out": "w"})


def test_pipeline_parameter_takes_a_path_or_an_object_and_defaults_to_synthetic(tmp_path, monkeypatch):
    assert pipeline_params().workload_tables == ""
    monkeypatch.chdir(tmp_path)
    # the local run's steps start in its work directory: a relative path is made absolute where it is given
    assert pipeline_params({"workload_tables": "mine.json"}).workload_tables == str(tmp_path / "mine.json")
    assert pipeline_params({"workload_tables": "s3://b/k.pt"}).workload_tables == "s3://b/k.pt"
    with pytest.raises(PipelineArgumentError, match="'workload_tables'"):
        pipeline_params({"workload_tables": "https://example.com/t.json"})


def test_given_tables_get_their_extremes_covered_and_their_heaviest_profiled_by_default(tmp_path):
    """Your own tables are marked as such through the split and augmentation, so the augment step covers their
    extremes and the profile step seeds shards with their heaviest without a flag; synthetic ones stay as they were."""
    from shardwise.jobs import profile as profile_job

    path, _ = _dataset(tmp_path / "day0.pt", num_tables=10)
    given = job.build(job.WorkloadSettings(tables=str(path), holdout_fraction=0.2, out=str(tmp_path / "given")))
    synthetic = job.build(job.WorkloadSettings(num_tables=10, row_scale=0.0001, batch_size=64,
                                               out=str(tmp_path / "synth")))
    for name, built, mine in (("given", given, True), ("synth", synthetic, False)):
        train = load_tables(built.split.train_path)
        assert train.given is mine
        out = tmp_path / name / "augmented.json"
        job.augment(job.AugmentSettings(tables=built.split.train_path, out=str(out)))
        augmented = load_tables(out)
        assert augmented.given is mine
        assert any("^" in t.name for t in augmented.tables) is mine  # the heaviest tables' extreme copies
        settings = profile_job.ProfileJobSettings(tables=str(out), out=str(tmp_path / name / "costs"))
        assert profile_job.heavy_share(settings, augmented) == (profile_job.HEAVY_SHARE_GIVEN if mine else 0.0)
        off = settings.model_copy(update={"heavy_share": 0.0})
        assert profile_job.heavy_share(off, augmented) == 0.0
    plain = tmp_path / "given" / "plain.json"
    job.augment(job.AugmentSettings(tables=given.split.train_path, out=str(plain), cover_extremes=False))
    assert not any("^" in t.name for t in load_tables(plain).tables)
