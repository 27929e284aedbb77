"""`shardwise profile`: real measurements into a Parquet dataset, resumed after an interruption (an exception,
SIGTERM, SIGINT during the all-to-alls), appended to an earlier run's dataset; a single file refused as one."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from timing_settings import FLUSH_MIB

from shardwise.cli import main
from shardwise.profiling import runner
from shardwise.profiling.comm import CommTiming
from shardwise.profiling.dataset import append_rows, load_costs, noise_floor, rows_to_table
from shardwise.profiling.kernel import TimingProtocol
from shardwise.profiling.runner import ProfileSettings, profile
from shardwise.workload import TableSpec

pytestmark = pytest.mark.integration

TABLES = [
    TableSpec(name=f"t{i}", rows=500 + 300 * i, dim=4 * (1 + i % 8), pooling_factor=1.0 + i, zipf_alpha=1.05)
    for i in range(8)
]
FAST = TimingProtocol(warmup_iters=1, iters=3, calibration_runs=5, flush_bytes=FLUSH_MIB * 2**20)


def test_interrupted_profile_resumes_without_remeasuring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "costs.parquet"
    settings = ProfileSettings(num_shards=6, max_tables=4, repeats=1, repeat_shards=2, batch_size=64, seed=5,
                               protocol=FAST, chunk_size=2)
    calls: list[list[str]] = []
    real_measure = runner.measure_shards

    def measuring(interrupt_after: int | None):  # type: ignore[no-untyped-def]
        def measure(shards, *args, **kwargs):  # type: ignore[no-untyped-def]
            timings = real_measure(shards, *args, **kwargs)
            for tables in shards:
                if len(calls) == interrupt_after:
                    raise KeyboardInterrupt
                calls.append([t.name for t in tables])
                yield next(timings)
        return measure

    monkeypatch.setattr(runner, "measure_shards", measuring(interrupt_after=4))
    with pytest.raises(KeyboardInterrupt):
        profile(TABLES, out, settings, progress=False)
    stored = load_costs(out)
    assert len(stored) == 4  # what was measured before the interruption was flushed
    reference_ms = stored["reference_ms"].iloc[0]

    calls.clear()
    monkeypatch.setattr(runner, "measure_shards", measuring(interrupt_after=None))
    summary = profile(TABLES, out, settings, progress=False)
    assert summary.measured == len(calls) == 6 + 2 - 4 and summary.skipped == 4
    df = load_costs(out)
    assert len(df) == 8 and df.groupby(["config_id", "repeat"]).size().max() == 1
    assert (df["repeat"] == 1).sum() == 2
    # the resumed session reused the stored calibration instead of re-calibrating
    assert set(df["reference_ms"]) == {reference_ms}
    assert (df["fwd_ms"] > 0).all() and (df["bwd_ms"] > 0).all()
    assert set(df["num_tables"]) <= {1, 2, 3, 4}
    for tables_json, num_tables in zip(df["tables_json"], df["num_tables"]):
        assert len(json.loads(tables_json)) == num_tables

    calls.clear()
    assert profile(TABLES, out, settings, progress=False).measured == 0 and calls == []
    assert noise_floor(df)["configs"] == 2


@pytest.mark.slow
def test_cli_profile_on_a_tiny_table_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps({"format": "shardwise.tables/v1", "batch_size": 64,
                                  "tables": [t.model_dump(mode="json") for t in TABLES]}))
    out = tmp_path / "costs.parquet"
    argv = ["profile", "--tables", str(tables), "--out", str(out), "--num-shards", "3", "--comm-layouts", "1",
            "--max-devices", "2", "--max-tables", "3", "--repeats", "1", "--repeat-shards", "1",
            "--timing-iters", "3", "--warmup-iters", "1", "--seed", "1", "--device", "cpu"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    # 3 shards, 1 repeat, 1 layout (2 rows) and 7 sizes (4 KiB .. 16 MiB) of all-reduce, reduce-scatter, all-gather
    # and all-to-all over 2 processes
    assert "33 measured, 0 already stored, 34 rows" in printed and "noise floor over 1 repeated shards" in printed
    df = load_costs(out)
    assert (df["kind"] == "compute").sum() == 4
    comm = df[df["kind"] == "comm"]
    assert len(comm) == 2 and set(comm["device"]) == {0, 1} and set(comm["backend"]) == {"gloo"}
    reduced = df[df["kind"] == "all_reduce"]
    assert set(reduced["num_devices"]) == {2} and set(reduced["backend"]) == {"gloo"} and (reduced["bwd_ms"] > 0).all()
    for kind, column in (("reduce_scatter", "fwd_ms"), ("all_gather", "bwd_ms"), ("all_to_all", "fwd_ms")):
        rows = df[df["kind"] == kind]
        assert sorted(rows["size_bytes"]) == sorted(reduced["size_bytes"]) and (rows[column] > 0).all(), kind
    assert len(json.loads(comm["widths_json"].iloc[0])) == 2
    for column in ("hardware_kind", "device_name", "torch_version", "fbgemm_version", "timing", "measured_at"):
        assert df[column].notna().all(), column
    assert (df["batch_size"] == 64).all()
    compute = df[df["kind"] == "compute"]
    # what timed each shard (the CPU's clock), and no host launch time on a CPU
    assert set(compute["timer"]) == {"thread"} and compute["launch_ms"].isna().all()

    assert main(argv) == 0
    assert "0 measured, 33 already stored" in capsys.readouterr().out


def test_cli_profile_refuses_a_bad_table_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "tables.json"
    bad.write_text(json.dumps({"format": "shardwise.tables/v1", "batch_size": 64,
                               "tables": [{"name": "t", "rows": 10, "dim": 6, "pooling_factor": 1.0}]}))
    assert main(["profile", "--tables", str(bad), "--out", str(tmp_path / "c.parquet")]) == 2
    assert "dim" in capsys.readouterr().err


def test_cli_profile_refuses_a_single_file_as_its_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps({"format": "shardwise.tables/v1", "batch_size": 64,
                                  "tables": [t.model_dump(mode="json") for t in TABLES[:2]]}))
    single = tmp_path / "costs.parquet"
    pq.write_table(rows_to_table([{"kind": "compute", "config_id": "old", "repeat": 0, "fwd_ms": 1.0,
                                   "bwd_ms": 1.0, "batch_size": 64, "hardware_kind": "cpu-old"}]), single)
    assert main(["profile", "--tables", str(tables), "--out", str(single), "--num-shards", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{single}: a single file, not a cost dataset" in err and len(err.strip().splitlines()) == 1
    assert single.is_file()


def test_interrupted_all_to_alls_keep_every_measured_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "costs.parquet"
    settings = ProfileSettings(num_shards=2, comm_layouts=6, max_tables=3, batch_size=64, seed=3, protocol=FAST,
                               max_devices=8, device="cpu")
    groups: list[int] = []

    def all_to_all(num_devices, layouts, batch_size, collectives, **kwargs):  # type: ignore[no-untyped-def]
        if len(groups) == 1:
            raise KeyboardInterrupt  # during the second device count's group
        groups.append(num_devices)
        return ([[CommTiming(1.0, 2.0, 0, None)] * len(widths) for widths in layouts],
                [(0.5, 0.7, 0.6)] * len(collectives))

    monkeypatch.setattr(runner, "measure_comm_group", all_to_all)
    with pytest.raises(KeyboardInterrupt):
        profile(TABLES, out, settings, progress=False)
    df = load_costs(out)
    comm = df[df["kind"] == "comm"]
    reduced = df[df["kind"] == "all_reduce"]
    assert (df["kind"] == "compute").sum() == 2  # the compute rows pending in the buffer were flushed
    assert set(comm["num_devices"]) == {groups[0]} and len(comm) > 0  # the first group's rows, as measured
    # the group's all-reduces beside its layouts: 4 KiB .. 16 MiB, the median of the timed ones
    assert set(reduced["num_devices"]) == {groups[0]} and sorted(reduced["size_bytes"]) == [4096 * 4**k for k in range(7)]
    assert (reduced["bwd_ms"] == 0.6).all() and (reduced["fwd_ms"] == 0.0).all()

    groups.append(0)  # no more interruptions
    summary = profile(TABLES, out, settings, progress=False)
    stored = comm["config_id"].nunique() + (df["kind"].isin(["all_reduce", "reduce_scatter", "all_gather", "all_to_all"])).sum()
    assert summary.skipped == 2 + stored and summary.total_rows == len(load_costs(out))
    assert groups[0] not in groups[2:]  # the stored group was not measured again
    # every device count the layouts span (2, 4, 8) all-reduced each size once
    reduced = load_costs(out).query("kind == 'all_reduce'")
    assert reduced.groupby("num_devices").size().to_dict() == {2: 7, 4: 7, 8: 7}


#: a profiling process to signal: measures many tiny shards, one part file per shard
_PROFILER = """
import sys
from shardwise.profiling.kernel import TimingProtocol
from shardwise.profiling.runner import ProfileSettings, profile
from shardwise.workload import TableSpec
tables = [TableSpec(name=f"t{i}", rows=200 + 50 * i, dim=4 * (1 + i % 4), pooling_factor=1.0) for i in range(6)]
settings = ProfileSettings(num_shards=200, max_tables=3, batch_size=32, seed=0, device="cpu", chunk_size=1,
                           protocol=TimingProtocol(warmup_iters=1, iters=2, calibration_runs=3))
try:
    profile(tables, sys.argv[1], settings, progress=False)
except KeyboardInterrupt:
    sys.exit(130)
"""


def _wait_for(condition, what: str, timeout_s: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_sigterm_while_measuring_keeps_every_flushed_row(tmp_path: Path) -> None:
    out = tmp_path / "costs.parquet"
    proc = subprocess.Popen([sys.executable, "-c", _PROFILER, str(out)])
    parts = lambda: [p for p in out.iterdir() if p.suffix == ".parquet"] if out.is_dir() else []  # noqa: E731
    _wait_for(lambda: len(parts()) >= 3, "three part files")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 130  # SIGTERM became an interrupt that flushed, not a kill
    df = load_costs(out)
    assert 3 <= len(df) < 200 and len(df) == len(parts())  # one part per row (chunk_size 1), none lost
    assert df.groupby(["config_id", "repeat"]).size().max() == 1
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp part left behind


@pytest.mark.slow
def test_sigint_during_the_all_to_alls_keeps_rows_and_says_so(tmp_path: Path) -> None:
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps({"format": "shardwise.tables/v1", "batch_size": 64,
                                  "tables": [t.model_dump(mode="json") for t in TABLES[:4]]}))
    out = tmp_path / "costs.parquet"
    # the dataset holds an earlier run's part: the run adds its own beside it
    append_rows(out, [{"kind": "compute", "config_id": "old", "repeat": 0, "fwd_ms": 1.0, "bwd_ms": 1.0,
                       "batch_size": 64, "hardware_kind": "cpu-old"}])
    argv = ["profile", "--tables", str(tables), "--out", str(out), "--num-shards", "2", "--comm-layouts", "2",
            "--max-devices", "2", "--max-tables", "2", "--timing-iters", "2", "--warmup-iters", "1",
            "--seed", "1", "--device", "cpu"]
    # Ctrl-C in a terminal: a shell's background job (`make test &`) starts its children with SIGINT ignored, and
    # the profiler rightly leaves an ignored signal ignored, so the child gets the terminal's default handler back
    ctrl_c = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)"
    proc = subprocess.Popen(
        [sys.executable, "-c", f"{ctrl_c}; import sys; from shardwise.cli import main; sys.exit(main(sys.argv[1:]))",
         *argv],
        stderr=subprocess.PIPE, text=True,
    )
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    if not children.parent.exists():
        proc.kill()
        pytest.skip("needs /proc to see when the all-to-all ranks are spawned")
    # the all-to-alls have begun once the profiler has spawned processes (a resource tracker, then the ranks)
    _wait_for(lambda: len(children.read_text().split()) >= 2, "the all-to-all ranks")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)  # a hang guard: the group in flight finishes first
    if proc.returncode == 0 and "waiting for the" not in err:
        # on a slow or busy machine the signal can land after the group ended (the ranks are reaped but still
        # listed): nothing was interrupted, so there is nothing to check here
        pytest.skip("the signal arrived after the all-to-alls had finished (machine too slow for the window)")
    assert proc.returncode == 130, err
    # cutting a group short would leave spawned ranks waiting for a peer: the group in flight finishes first
    assert "waiting for the 2 all-to-all layout(s) and 28 collective(s)" in err
    assert f"interrupted; what was measured is stored in {out}" in err
    df = load_costs(out)
    assert df["config_id"].iloc[0] == "old"  # the earlier run's part sorts first
    # the shards measured before were pending (chunk of 25): flushed with the group's rows
    assert (df["kind"] == "compute").sum() == 1 + 2 and (df["kind"] == "comm").sum() == 2 * 2
    assert (df["kind"] == "all_reduce").sum() == 7  # measured in the same group, kept with it
    assert (df["kind"] == "reduce_scatter").sum() == (df["kind"] == "all_to_all").sum() == 7


def test_data_parallel_shards_are_profiled_as_dense_kernels_at_each_local_batch_and_resumed(tmp_path: Path) -> None:
    out = tmp_path / "costs"
    settings = ProfileSettings(num_shards=4, data_parallel_shards=2, max_tables=3, batch_size=64, seed=3,
                               protocol=FAST, device="cpu")
    first = profile(TABLES, out, settings, progress=False)
    assert first.measured == 4 + 2 * len(runner.DATA_PARALLEL_DEVICE_COUNTS)
    df = load_costs(out)
    dense = df[df["kind"] == "data_parallel"]
    compute = df[df["kind"] == "compute"].set_index("config_id")
    assert sorted(dense["num_devices"].value_counts().items()) == [(2, 2), (4, 2), (8, 2)]
    # the first 2 sampled shards' tables, their rows keeping the profile's batch (the local batch is B / D)
    assert set(dense["tables_json"]) <= set(compute["tables_json"]) and len(set(dense["tables_json"])) == 2
    assert (dense["batch_size"] == 64).all() and (dense["optimizer"] == "sgd").all()
    assert (dense["fwd_ms"] > 0).all() and (dense["bwd_ms"] > 0).all() and dense["config_id"].is_unique
    again = profile(TABLES, out, settings, progress=False)
    assert again.measured == 0 and again.skipped == first.measured


def test_the_first_dense_kernels_are_timed_again_for_their_noise_floor(tmp_path: Path) -> None:
    """With repeats, the first `repeat_shards` dense kernels of each device count are timed again (after the
    shards: their noise floor over the run), pretrain reports it beside the shards', and a resumed run skips them."""
    from shardwise.costmodel.evaluate import noise_floor_table

    out = tmp_path / "costs"
    settings = ProfileSettings(num_shards=3, data_parallel_shards=2, repeats=1, repeat_shards=1, max_tables=3,
                               batch_size=64, seed=3, protocol=FAST, device="cpu")
    first = profile(TABLES, out, settings, progress=False)
    counts = len(runner.DATA_PARALLEL_DEVICE_COUNTS)
    assert first.measured == 3 + 1 + 2 * counts + counts  # shards, a shard's repeat, dense kernels, one's repeat
    dense = load_costs(out).query("kind == 'data_parallel'")
    again = dense[dense["repeat"] == 1]
    assert len(again) == counts and set(again["config_id"]) < set(dense.loc[dense["repeat"] == 0, "config_id"])
    floor = noise_floor_table(dense, split="dense kernel repeats")
    assert set(floor["target"]) == {"fwd", "bwd", "total"} and (floor["n"] == counts).all()
    assert (floor["split"] == "dense kernel repeats").all() and floor["mape_pct"].notna().all()
    assert profile(TABLES, out, settings, progress=False).measured == 0


def test_dense_kernels_added_to_a_profile_reuse_its_reference(tmp_path: Path) -> None:
    """A profile whose shards are all measured, run again for its dense kernels (or resumed after an interrupt in
    the dense repeats, which come last): they are normalised by the dataset's reference, not one calibrated anew."""
    out = tmp_path / "costs"
    settings = ProfileSettings(num_shards=3, max_tables=3, batch_size=64, seed=3, protocol=FAST, device="cpu")
    profile(TABLES, out, settings, progress=False)
    more = profile(TABLES, out, settings.model_copy(update={"data_parallel_shards": 2}), progress=False)
    assert more.measured == 2 * len(runner.DATA_PARALLEL_DEVICE_COUNTS)
    df = load_costs(out)
    assert (df["kind"] == "data_parallel").any() and df["reference_ms"].nunique() == 1


def test_row_wise_shards_are_profiled_as_their_row_blocks_and_resumed(tmp_path: Path) -> None:
    out = tmp_path / "costs"
    settings = ProfileSettings(num_shards=3, row_wise_shards=2, max_tables=3, batch_size=64, seed=3, protocol=FAST,
                               device="cpu")
    first = profile(TABLES, out, settings, progress=False)
    assert first.measured == 3 + 2 * len(runner.ROW_WISE_DEVICE_COUNTS)
    df = load_costs(out)
    assert (df["kind"] == "compute").all() and df["config_id"].is_unique
    shards = [json.loads(doc) for doc in df["tables_json"]]
    whole = [s for s in shards if all(t["name"] in {u.name for u in TABLES} for t in s)]
    blocks = [s for s in shards if s not in whole]
    assert len(whole) == 3 and len(blocks) == 2 * len(runner.ROW_WISE_DEVICE_COUNTS)
    by_name = {t.name: t for t in TABLES}
    for shard in blocks:  # each table's first block: ceil(rows / D) rows, lookups / D, its source the table
        for block in shard:
            table = by_name[block["source"]]
            assert any(block["rows"] == -(-table.rows // d) for d in runner.ROW_WISE_DEVICE_COUNTS)
            assert block["name"] == f"{table.name}[rows 0:{block['rows']}]"
            assert block["pooling_factor"] == pytest.approx(table.pooling_factor * block["rows"] / table.rows)
    # the blocks are of 2 of the sampled shards' tables (the first 2)
    of = {frozenset(t["source"] for t in s) for s in blocks}
    assert len(of) == 2 and of <= {frozenset(t["name"] for t in s) for s in whole}
    again = profile(TABLES, out, settings, progress=False)
    assert again.measured == 0 and again.skipped == first.measured


def test_workers_split_one_run_each_shard_once(tmp_path: Path) -> None:
    """Profiling workers (pods sharing a dataset) each measure their slice of one run: no shard in two slices, and
    their datasets together hold the whole run (it finds nothing left there). The same as processes at once into one
    object-store prefix, with the all-to-alls: tests/integration/test_profiling_object_store.py (make test-all)."""
    run = dict(num_shards=8, max_tables=3, batch_size=64, seed=0, protocol=FAST, device="cpu")
    slices = [tmp_path / f"worker-{k}" for k in (0, 1)]
    for k, out in enumerate(slices):  # apart, so that a slice overlapping another is not hidden by resuming
        assert profile(TABLES, out, ProfileSettings(**run, worker=k, workers=2), progress=False).measured > 0
    ids = [set(load_costs(out)["config_id"]) for out in slices]
    assert not ids[0] & ids[1]
    together = tmp_path / "together"
    together.mkdir()
    for part in (p for out in slices for p in out.glob("*.parquet")):
        shutil.copy(part, together)
    whole = profile(TABLES, together, ProfileSettings(**run), progress=False)
    assert (whole.measured, whole.skipped) == (0, len(ids[0] | ids[1]))
