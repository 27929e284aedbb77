"""`shardwise profile`: real measurements into a Parquet dataset, resumed after an interruption."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardwise.cli import main
from shardwise.profiling import runner
from shardwise.profiling.dataset import load_costs, noise_floor
from shardwise.profiling.kernel import TimingProtocol
from shardwise.profiling.runner import ProfileSettings, profile
from shardwise.workload import TableSpec

pytestmark = pytest.mark.integration

TABLES = [
    TableSpec(name=f"t{i}", rows=500 + 300 * i, dim=4 * (1 + i % 8), pooling_factor=1.0 + i, zipf_alpha=1.05)
    for i in range(8)
]
FAST = TimingProtocol(warmup_iters=1, iters=3, calibration_runs=5)


def test_interrupted_profile_resumes_without_remeasuring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "costs.parquet"
    settings = ProfileSettings(num_shards=6, max_tables=4, repeats=1, repeat_shards=2, batch_size=64, seed=5,
                               protocol=FAST, chunk_size=2)
    calls: list[list[str]] = []
    real_measure = runner.measure_shard

    def interrupted_after_four(tables, *args, **kwargs):  # type: ignore[no-untyped-def]
        if len(calls) == 4:
            raise KeyboardInterrupt
        calls.append([t.name for t in tables])
        return real_measure(tables, *args, **kwargs)

    monkeypatch.setattr(runner, "measure_shard", interrupted_after_four)
    with pytest.raises(KeyboardInterrupt):
        profile(TABLES, out, settings, progress=False)
    stored = load_costs(out)
    assert len(stored) == 4  # what was measured before the interruption was flushed
    reference_ms = stored["reference_ms"].iloc[0]

    calls.clear()
    monkeypatch.setattr(runner, "measure_shard", lambda tables, *a, **k: (calls.append([t.name for t in tables]),
                                                                           real_measure(tables, *a, **k))[1])
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
    assert "5 measured, 0 already stored, 6 rows" in printed and "noise floor over 1 repeated shards" in printed
    df = load_costs(out)
    assert (df["kind"] == "compute").sum() == 4
    comm = df[df["kind"] == "comm"]
    assert len(comm) == 2 and set(comm["device"]) == {0, 1} and set(comm["backend"]) == {"gloo"}
    assert len(json.loads(comm["widths_json"].iloc[0])) == 2
    for column in ("hardware_kind", "device_name", "torch_version", "fbgemm_version", "timing", "measured_at"):
        assert df[column].notna().all(), column
    assert (df["batch_size"] == 64).all()

    assert main(argv) == 0
    assert "0 measured, 5 already stored" in capsys.readouterr().out


def test_cli_profile_refuses_a_bad_table_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "tables.json"
    bad.write_text(json.dumps({"format": "shardwise.tables/v1", "batch_size": 64,
                               "tables": [{"name": "t", "rows": 10, "dim": 6, "pooling_factor": 1.0}]}))
    assert main(["profile", "--tables", str(bad), "--out", str(tmp_path / "c.parquet")]) == 2
    assert "dim" in capsys.readouterr().err
