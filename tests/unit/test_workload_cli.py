"""`shardwise workload synth|split|task` and `shardwise augment`, run in-process through `main`."""

import json

from shardwise.cli import main
from shardwise.workload import load_tables, load_task, read_dlrm_dataset


def test_synth_split_task_augment(tmp_path, capsys):
    out = tmp_path / "w"
    assert main(["workload", "synth", "--num-tables", "20", "--row-scale", "0.001", "--batch-size", "128",
                 "--seed", "1", "--out", str(out)]) == 0
    tables = load_tables(out / "tables.json")
    assert len(tables.tables) == 20 and tables.batch_size == 128
    data = read_dlrm_dataset(out / "indices.pt")
    assert [t.pooling_factor > 0 for t in data.tables.tables] == [t.pooling_factor > 0 for t in tables.tables]

    assert main(["workload", "split", "--tables", str(out / "tables.json"), "--holdout-fraction", "0.25",
                 "--seed", "0", "--out", str(tmp_path / "split")]) == 0
    train, holdout = load_tables(tmp_path / "split" / "train.json"), load_tables(tmp_path / "split" / "holdout.json")
    assert (len(train.tables), len(holdout.tables)) == (15, 5)

    assert main(["workload", "task", "--tables", str(tmp_path / "split" / "holdout.json"), "--num-tables", "4",
                 "--num-devices", "2", "--device-memory-bytes", "123456789", "--seed", "2",
                 "--out", str(tmp_path / "task.json")]) == 0
    task = load_task(tmp_path / "task.json")
    assert len(task.tables) == 4 and task.num_devices == 2 and task.device_memory_bytes == 123456789

    assert main(["augment", "--tables", str(tmp_path / "split" / "train.json"), "--seed", "0",
                 "--dims", "8", "16", "--out", str(tmp_path / "aug.json")]) == 0
    augmented = load_tables(tmp_path / "aug.json")
    assert len(augmented.tables) > 2 * len(train.tables)
    assert "tables from 15" in capsys.readouterr().out


def test_bad_inputs_exit_2_naming_the_problem(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "shardwise.tables/v1", "batch_size": -1, "tables": []}))
    assert main(["augment", "--tables", str(bad), "--out", str(tmp_path / "x.json")]) == 2
    assert "field 'batch_size'" in capsys.readouterr().err
    assert main(["workload", "task", "--tables", str(tmp_path / "absent.json"), "--num-tables", "1",
                 "--num-devices", "1", "--out", str(tmp_path / "t.json")]) == 2
    assert "no such table file" in capsys.readouterr().err
    assert main(["workload", "synth", "--num-tables", "0", "--out", str(tmp_path / "s")]) == 2
    assert "--num-tables 0: Input should be greater than or equal to 1" in capsys.readouterr().err
