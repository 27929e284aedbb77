"""A profile's time budget: whole shards (their row blocks with them) until it is spent, never fewer than the floor,
one line where the floor overruns it, and the same settings again measuring what it left; `shardwise profile
--budget-s` and the pipeline's held-out split say what the budget bought."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from timing_settings import FLUSH_MIB

from shardwise.cli import main
from shardwise.jobs import profile as job
from shardwise.profiling import runner
from shardwise.profiling.budget import RATE_PROBE_SHARDS
from shardwise.profiling.dataset import load_costs
from shardwise.profiling.kernel import TimingProtocol
from shardwise.profiling.runner import ProfileSettings, profile
from shardwise.workload import TableSet, TableSpec, save_tables

pytestmark = pytest.mark.integration

TABLES = [TableSpec(name=f"t{i}", rows=400 + 200 * i, dim=4 * (1 + i % 4), pooling_factor=1.0 + i % 3)
          for i in range(10)]
FAST = TimingProtocol(warmup_iters=0, iters=1, calibration_runs=3, flush_bytes=FLUSH_MIB * 2**20)
SPENT_S = 1e-6  # a budget gone before the first shard: the floor alone decides


def _whole_and_blocks(out: Path) -> tuple[list[set[str]], list[set[str]]]:
    shards = [{t["source"] or t["name"] for t in json.loads(doc)} for doc in load_costs(out)["tables_json"]]
    names = [[t["name"] for t in json.loads(doc)] for doc in load_costs(out)["tables_json"]]
    whole = [s for s, n in zip(shards, names) if all("[rows" not in x for x in n)]
    blocks = [s for s, n in zip(shards, names) if any("[rows" in x for x in n)]
    return whole, blocks


def test_a_spent_budget_stops_at_the_floor_with_each_shards_blocks_and_a_rerun_measures_the_rest(tmp_path) -> None:
    out = tmp_path / "costs"
    budgeted = ProfileSettings(num_shards=8, row_wise_shards=8, max_tables=3, batch_size=64, seed=2, protocol=FAST,
                               device="cpu", budget_s=SPENT_S, floor_shards=3)
    first = profile(TABLES, out, budgeted, progress=False)
    assert (first.shards, first.shards_left) == (3, 5)
    whole, blocks = _whole_and_blocks(out)
    # every whole shard measured has its row blocks over each device count beside it, and no other shard's
    assert len(whole) == 3 and len(blocks) == 3 * len(runner.ROW_WISE_DEVICE_COUNTS)
    assert all(b in whole for b in blocks)
    assert first.measured == 3 * (1 + len(runner.ROW_WISE_DEVICE_COUNTS))

    # the same settings again: the floor counts what is stored, so a spent budget adds one shard at a time
    again = profile(TABLES, out, budgeted, progress=False)
    assert (again.shards, again.skipped) == (1, first.measured)
    # without the budget: the rest, nothing twice
    rest = profile(TABLES, out, budgeted.model_copy(update={"budget_s": None}), progress=False)
    assert (rest.shards, rest.shards_left) == (4, 0)
    df = load_costs(out)
    assert df["config_id"].is_unique and len(df) == 8 * (1 + len(runner.ROW_WISE_DEVICE_COUNTS))


def test_a_budget_that_lasts_measures_every_shard(tmp_path) -> None:
    settings = ProfileSettings(num_shards=5, max_tables=3, batch_size=64, seed=4, protocol=FAST, device="cpu",
                               budget_s=600.0, floor_shards=1)
    done = profile(TABLES, tmp_path / "costs", settings, progress=False)
    assert (done.shards, done.shards_left, done.measured) == (5, 0, 5)


def test_a_floor_past_the_budget_is_said_in_one_line(tmp_path, capsys) -> None:
    floor = RATE_PROBE_SHARDS + 2
    settings = ProfileSettings(num_shards=floor + 5, max_tables=4, batch_size=64, seed=1, protocol=FAST,
                               device="cpu", budget_s=SPENT_S, floor_shards=floor)
    done = profile(TABLES, tmp_path / "costs", settings, progress=False)
    assert done.shards == floor and done.shards_left > 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("profile:")]
    assert len(said) == 1 and f"the floor of {floor} shards takes about" in said[0] and "past the budget" in said[0]


def test_profile_budget_flag_keeps_the_floor_share_and_says_what_it_bought(tmp_path, capsys) -> None:
    tables = save_tables(TableSet(batch_size=64, tables=tuple(TABLES)), tmp_path / "tables.json")
    args = ["profile", "--tables", str(tables), "--out", str(tmp_path / "costs"), "--num-shards", "10",
            "--max-tables", "3", "--device", "cpu", "--timing-iters", "1", "--budget-s", str(SPENT_S)]
    assert main(args) == 0
    floor = round(job.BUDGET_FLOOR_SHARE * 10)
    said = capsys.readouterr().out
    # (a shard the sampler draws twice is one configuration: at most 10 - floor are left)
    assert f"\n{floor} shards in " in said and " left by the time budget): the same command again measures them" in said


def test_the_held_out_shards_get_the_budget_the_training_shards_left(tmp_path, capsys) -> None:
    heldout = save_tables(TableSet(batch_size=64, tables=tuple(
        t.model_copy(update={"name": f"h{t.name}"}) for t in TABLES)), tmp_path / "heldout.json")
    tables = save_tables(TableSet(batch_size=64, tables=tuple(TABLES)), tmp_path / "tables.json")
    settings = job.ProfileJobSettings(tables=str(tables), out=str(tmp_path / "costs"), num_shards=60, comm_layouts=0,
                                      max_tables=2, device="cpu", timing_iters=1, budget_s=SPENT_S)
    result = job.run_apart(settings, str(heldout), holdout_shards=60)
    # each part keeps its floor (half its count), and the floor's overrun is said once, by the training part
    assert result.shards == 30 + 30 and result.shards_left > 0
    sources = [{t["source"] or t["name"] for t in json.loads(d)} for d in load_costs(tmp_path / "costs")["tables_json"]]
    assert sum(all(s.startswith("h") for s in shard) for shard in sources) == 30
    assert sum(line.startswith("profile:") for line in capsys.readouterr().out.splitlines()) == 1


def test_each_worker_keeps_its_share_of_the_floor(tmp_path) -> None:
    out = tmp_path / "costs"
    for worker in (0, 1):
        settings = ProfileSettings(num_shards=10, max_tables=3, batch_size=64, seed=6, protocol=FAST, device="cpu",
                                   budget_s=SPENT_S, floor_shards=6, worker=worker, workers=2)
        assert profile(TABLES, out, settings, progress=False).shards == 3
    assert len(load_costs(out)) == 6


def test_a_local_runs_profile_step_resumes_its_store_and_adds_what_the_budget_left(tmp_path) -> None:
    """The pipeline's profile step with a profile store (a local run's): each run's artifact is the store's rows as
    they were then, a rerun of the same settings adds to them, other settings profile apart."""
    from kfp import dsl

    from shardwise.pipelines.components import profile_costs

    tables = save_tables(TableSet(batch_size=64, tables=tuple(TABLES)), tmp_path / "tables.json")
    heldout = save_tables(TableSet(batch_size=64, tables=tuple(
        t.model_copy(update={"name": f"h{t.name}"}) for t in TABLES)), tmp_path / "heldout.json")
    store = tmp_path / "store"

    def step(run: str, budget_s: float, num_shards: int = 8) -> tuple[dict, Path]:
        costs = dsl.Dataset(name="costs", uri=str(tmp_path / run / "costs"))
        profile_costs.python_func(
            tables=dsl.Dataset(uri=str(tables)), holdout_tables=dsl.Dataset(uri=str(heldout)),
            num_shards=num_shards, holdout_shards=4, data_parallel_shards=0, row_wise_shards=0, max_tables=2,
            repeats=0, timing_iters=1, budget_s=budget_s, seed=0, device="cpu", worker=0, workers=1,
            dataset_uri="", profile_store=str(store), costs=costs)
        return costs.metadata, Path(costs.path)

    first, first_rows = step("run-1", SPENT_S)
    assert first["profiled_shards"] == 4 + 2 and first["profile_shards_left"] > 0  # the floor: half of each
    assert len(load_costs(first_rows)) == 6
    # the same settings again: the stored floor is not measured twice, the budget buys the rest
    second, second_rows = step("run-2", 600.0)
    assert (second["profiled_shards"], second["profile_shards_left"]) == (first["profile_shards_left"], 0)
    assert load_costs(second_rows)["config_id"].is_unique
    assert len(load_costs(second_rows)) == 6 + second["profiled_shards"]
    assert len(load_costs(first_rows)) == 6  # the first run's artifact is as that run left it
    # other settings: a dataset of their own in the store, not the rows above
    _, other_rows = step("run-3", 600.0, num_shards=2)
    assert len(load_costs(other_rows)) == 2 + 4 and len(list(store.iterdir())) == 2
